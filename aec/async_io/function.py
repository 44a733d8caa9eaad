"""The user side of async I/O: ``AsyncFunction`` and the ``ResultFuture`` it completes.

Follows Flink's ``AsyncFunction`` / ``RichAsyncFunction`` and ``ResultFuture``
(``org.apache.flink.streaming.api.functions.async``). Both names are public through
``aec.async_io.waits``.

Invariants:
- A ``ResultFuture`` belongs to one attempt (one call of ``async_invoke``, or one
  call of ``timeout``) of one input. Any thread may complete it; each completion
  becomes one mail in the wait call's ``Mailbox`` (the only cross-thread hand-off).
- Only the first completion counts. The ``_done`` flag skips later calls cheaply;
  it is not atomic, so two threads racing may both post, and the driver keeps the
  first mail it takes for an attempt (the mailbox is FIFO) and drops the rest.
- Results are copied into a list on the completing thread, so a generator or a
  caller's list that changes later cannot change what is emitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic

from aec.async_io.queue import AsyncEntry
from aec.errors import describe
from aec.runtime.mailbox import Mailbox
from aec.state.typevars import IN, OUT

__all__ = ["AsyncFunction", "AsyncFunctionBase", "Outcome", "ResultFuture"]

# an attempt's outcome: (results, error, fatal); fatal skips retries
Outcome = tuple[list[Any] | None, BaseException | None, bool]


class ResultFuture(Generic[OUT]):
    """Where one call of ``AsyncFunction.async_invoke`` (or ``timeout``) delivers its
    outcome, outputs ``OUT``. Thread-safe; the first ``complete``/``complete_exceptionally`` wins, later
    ones are ignored.

    Created by the wait call, never by users.
    """

    __slots__ = ("_mailbox", "_entry", "_done")

    def __init__(self, mailbox: Mailbox, entry: AsyncEntry) -> None:
        self._mailbox = mailbox
        self._entry = entry
        self._done = False

    @property
    def entry(self) -> AsyncEntry:
        """The queue entry whose attempt this future completes (the wait call reads it
        back on the mailbox thread; users need not)."""
        return self._entry

    @property
    def done(self) -> bool:
        """True once ``complete`` or ``complete_exceptionally`` was called."""
        return self._done

    def complete(self, results: Iterable[OUT]) -> None:
        """Complete with ``results``: an iterable whose elements are emitted as outputs,
        in its order (an empty iterable emits nothing for this input).

        Never raises: a ``None``, a ``str``/``bytes`` (almost always a forgotten
        ``[...]``) or a non-iterable fails the job with a ``TypeError`` as the cause,
        without retries; an exception raised while iterating ``results`` completes
        the attempt exceptionally with it.
        """
        outcome = self.settle(results)
        if outcome is not None:
            self._post(*outcome)

    def settle(self, results: Iterable[OUT]) -> Outcome | None:
        """``complete`` on the mailbox thread without a mail: returns the outcome
        ``(results, error, fatal)`` that ``complete`` posts (None if this future was
        already completed), for the driver to handle as that mail at once (the
        inputs of one batch call)."""
        if self._done:
            return None
        self._done = True
        if results is None or isinstance(results, (str, bytes, bytearray)):
            return None, _bad_results(results), True
        try:
            collected = list(results)
        except TypeError as exc:
            if not hasattr(results, "__iter__"):  # not iterable at all: a programming error
                return None, _bad_results(results), True
            return None, exc, False
        except Exception as exc:  # the user's generator failed: this attempt failed
            return None, exc, False
        return collected, None, False

    def complete_exceptionally(self, error: BaseException) -> None:
        """Complete with ``error`` (an exception instance). The retry strategy may retry
        it; otherwise the job fails with ``JobFailure`` whose ``__cause__`` is ``error``.

        Never raises: a non-exception argument fails the job with a ``TypeError``.
        """
        if self._done:
            return
        self._done = True
        if not isinstance(error, BaseException):  # untyped callers pass anything
            self._post(  # type: ignore[unreachable]
                None,
                TypeError(
                    f"complete_exceptionally() takes an exception instance, got {describe(error)}"
                ),
                True,
            )
            return
        self._post(None, error, False)

    def _post(self, results: list[OUT] | None, error: BaseException | None, fatal: bool) -> None:
        # the mail the driver reads: (future, results, error, fatal); fatal skips retries
        self._mailbox.post((self, results, error, fatal))

    def __repr__(self) -> str:
        return f"<ResultFuture {'done' if self._done else 'pending'}>"


def _bad_results(results: object) -> TypeError:
    return TypeError(
        f"ResultFuture.complete() takes an iterable of results, got {describe(results)} "
        f"({type(results).__name__}); wrap a single result in a list: complete([result])"
    )


class AsyncFunctionBase(Generic[IN, OUT]):
    """What every async I/O function has: ``open``, ``close`` and ``timeout`` (the base
    of ``AsyncFunction`` and ``aec.async_io.AsyncBatchFunction``; Flink's
    ``RichAsyncFunction`` without the call). ``IN`` is the input values' type, ``OUT``
    the outputs' (untyped when not given)."""

    def open(self) -> None:
        """Set up clients before the first call (mailbox thread)."""

    def close(self) -> None:
        """Release clients at the end of the wait call, also after a failure."""

    def timeout(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        """Called once when ``value``'s timeout (seconds since its first call started,
        spanning retries) expires. The default completes ``result_future``
        exceptionally with ``TimeoutError``, so the job fails with ``JobFailure``
        whose ``__cause__`` is that ``TimeoutError``. Override to complete with a
        fallback, e.g. ``result_future.complete([])``.
        """
        result_future.complete_exceptionally(
            TimeoutError(f"async call for input {describe(value)} timed out")
        )


class AsyncFunction(AsyncFunctionBase[IN, OUT]):
    """A function that looks up or computes each input asynchronously.

    Override ``async_invoke`` in one of two styles:

    - Flink style: ``def async_invoke(self, value, result_future) -> None`` runs on the
      mailbox thread (the thread iterating the wait call's result); it starts the work
      and returns at once; the work calls ``result_future.complete(results)`` or
      ``result_future.complete_exceptionally(exc)`` later, from any thread. Raising
      from ``async_invoke`` counts as an exceptional completion of that attempt.
    - asyncio style: ``async def async_invoke(self, value) -> Iterable`` runs on the
      wait call's one event-loop thread; its return value is the results, an
      exception completes the attempt exceptionally.

    ``open()`` runs before the first call and ``close()`` at the end (also after a
    failure), both on the mailbox thread. ``timeout(value, result_future)`` runs on
    the mailbox thread when an input's timeout expires and must complete
    ``result_future`` before it returns (a fallback result, or an exception).

    Follows Flink's ``RichAsyncFunction``.
    """

    def async_invoke(self, value: IN, result_future: ResultFuture[OUT]) -> object:
        """Start the call for ``value``; see the class docstring for both styles."""
        raise NotImplementedError(f"{type(self).__name__} must override async_invoke")
