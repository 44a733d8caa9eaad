"""External calls inside keyed functions: ``Context.call_async`` (beyond Flink).

Flink 2.x lets a keyed function await state, not a service; enrichment that needs
per-key state takes an ``AsyncWaitOperator`` and a shuffle. Here a call is one more
thing a record waits for, like a state request (FLIP-425's reference counting):

- ``ExternalCalls.call`` runs ``fn(*args)`` (an ``async def`` or anything returning
  an awaitable) on the operator's one asyncio loop thread (started lazily), with
  retries (``aec.retry``) and a timeout spanning them, and returns a ``CallFuture``.
- The pending call holds one reference on its ``RecordContext``, so same-key order,
  the in-flight limit and the drain before a snapshot hold as for state requests.
- The outcome comes back as a ``CallCompletion`` mail in the controller's mailbox
  (the only cross-thread hand-off); the controller runs it on the mailbox thread.
- In synchronous mode (``async_state=False``) the call runs to completion on the
  loop thread before ``call`` returns a completed future.

Invariants: ``controller.calls_in_flight`` counts calls whose mail has not run; a
timed-out call is cancelled (``asyncio.timeout``); ``close`` cancels what is left
and stops the thread without waiting for abandoned calls to finish.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator
from typing import Any

from aec.errors import describe
from aec.retry import NoRetry, RetryStrategy, check_strategy, check_timeout
from aec.runtime.event_loop import EventLoopThread
from aec.runtime.record_context import RecordContext
from aec.state.future import _PENDING, StateFuture

__all__ = ["CallCompletion", "CallFuture", "ExternalCalls"]

_NO_RETRY = NoRetry()
_CLOSE_GRACE = 0.5  # seconds close() gives cancelled calls to unwind


class CallFuture(StateFuture):
    """The ``StateFuture`` of one external call: it may carry an exception.

    ``await`` raises the call's exception inside the user's coroutine (which may
    catch it); a chained callback (``then_apply``, ...) or ``get()`` re-raises it,
    which fails the job (DESIGN rule 10).
    """

    __slots__ = ("_error",)
    # a pending call holds a reference on its record (released after completion):
    # callbacks ride on it
    callbacks_hold_record = False

    def __init__(self, context: Any = None) -> None:
        super().__init__(context)
        self._error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        """Complete with ``error`` (engine use; mailbox thread)."""
        self._error = error
        self.complete(None)

    def settle(self, outcome: Callable[[], Any]) -> None:
        """Complete with what ``outcome()`` returns, or fail with what it raises
        (engine use: the synchronous mode runs the call to completion here)."""
        try:
            result = outcome()
        except Exception as exc:
            self.fail(exc)
        else:
            self.complete(result)

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return super().get()

    def __await__(self) -> Generator[StateFuture, Any, Any]:
        if self._result is _PENDING:
            yield self
        if self._error is not None:
            raise self._error
        return self._result

    def then_apply(self, fn: Callable[[Any], Any]) -> StateFuture:
        return super().then_apply(self._checked(fn))

    def then_accept(self, fn: Callable[[Any], Any]) -> StateFuture:
        return super().then_accept(self._checked(fn))

    def then_compose(self, fn: Callable[[Any], Any]) -> StateFuture:
        return super().then_compose(self._checked(fn))

    def _checked(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(result: Any) -> Any:
            if self._error is not None:
                raise self._error
            return fn(result)

        return run


class CallCompletion:
    """The mail that hands a call's outcome to the mailbox thread; any thread may
    ``complete`` it (the loop thread does), the first outcome wins."""

    __slots__ = ("future", "record", "result", "error", "_mailbox", "_posted")

    def __init__(self, future: CallFuture, record: RecordContext, mailbox: Any) -> None:
        self.future = future
        self.record = record  # the calling record, which the call holds
        self.result: Any = None
        self.error: BaseException | None = None
        self._mailbox = mailbox
        self._posted = False

    def complete(self, result: Any) -> None:
        if not self._posted:
            self._posted = True
            self.result = result
            self._mailbox.post(self)

    def complete_exceptionally(self, error: BaseException) -> None:
        if not self._posted:
            self._posted = True
            self.error = error
            self._mailbox.post(self)

    def run(self, controller: Any) -> None:
        """On the mailbox thread: complete the future, drop the call's reference."""
        controller.calls_in_flight -= 1
        future, context = self.future, self.record
        controller.current = context
        if self.error is not None:
            future.fail(self.error)
        else:
            future.complete(self.result)
        context.release()
        controller.current = None


class ExternalCalls:
    """The external calls of one operator.

    Args:
        controller: the operator's ``AsyncExecutionController`` (its mailbox, the
            current record, ``calls_in_flight``).
    """

    def __init__(self, controller: Any) -> None:
        self._controller = controller
        self._loop: EventLoopThread | None = None
        self.calls = 0  # calls started (metrics)

    def call(
        self,
        fn: Any,
        args: tuple[Any, ...],
        timeout: Any = None,
        retry: RetryStrategy = _NO_RETRY,
    ) -> CallFuture:
        """Start ``fn(*args)`` for the current record; see ``Context.call_async``.

        Raises TypeError (a non-callable ``fn``, a bad timeout or retry) or
        ValueError (a timeout <= 0), RuntimeError outside a record.
        """
        if not callable(fn):
            raise TypeError(f"call_async takes an async function, got {describe(fn)}")
        seconds = check_timeout(timeout)
        check_strategy(retry)
        controller = self._controller
        context = controller.current
        if context is None:
            raise RuntimeError(
                "call_async() outside a record: call it in process_element, on_timer or "
                "their callbacks (not in open() or after finish())"
            )
        if self._loop is None:
            self._loop = EventLoopThread(grace=_CLOSE_GRACE, name="aec-call-loop")
        self.calls += 1
        future = CallFuture(context)
        coroutine = _call(fn, args, seconds, retry)
        if controller.synchronous:
            loop = self._loop
            future.settle(lambda: loop.run(coroutine))
            return future
        context.retain()  # the pending call, like a pending state request
        controller.calls_in_flight += 1
        self._loop.submit(coroutine, CallCompletion(future, context, controller.mailbox))
        return future

    def close(self) -> None:
        """Cancel every running call and stop the loop thread (bounded, ~1 s at most:
        abandoned calls are not waited for). Idempotent."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()


async def _call(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, retry: RetryStrategy
) -> Any:
    """``fn(*args)`` with retries; ``timeout`` spans every attempt and backoff and
    cancels the running attempt (``TimeoutError``)."""
    if timeout is None:
        return await _attempts(fn, args, retry)
    async with asyncio.timeout(timeout):  # no extra task per call, unlike wait_for
        return await _attempts(fn, args, retry)


async def _attempts(fn: Callable[..., Any], args: tuple[Any, ...], retry: RetryStrategy) -> Any:
    attempt = 0
    while True:
        attempt += 1
        awaitable = fn(*args)
        if not inspect.isawaitable(awaitable):
            raise TypeError(
                f"call_async: {_name(fn)} returned {describe(awaitable, 80)}, not an "
                "awaitable: pass an `async def` function (or one returning an awaitable)"
            )
        try:
            result = await awaitable
        except Exception as exc:
            if attempt < retry.max_attempts and retry.should_retry_exception(exc):
                await asyncio.sleep(retry.backoff(attempt))
                continue
            raise
        if attempt < retry.max_attempts and retry.should_retry_result(result):
            await asyncio.sleep(retry.backoff(attempt))
            continue
        return result


def _name(fn: Any) -> str:
    """``module.qualname`` of a function, else its short repr (for messages)."""
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str):
        return f"{getattr(fn, '__module__', '?')}.{qualname}"
    return describe(fn, 80)
