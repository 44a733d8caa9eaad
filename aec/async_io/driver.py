"""Calls of async I/O entries: admission into the queue, calls, retries, timeouts.

Follows Flink's ``AsyncWaitOperator`` (with its ``RetryableResultHandlerDelegator``
for FLIP-232 retries) and FLIP-519's key-ordered mode, on aec's mailbox model:

- ``CallDriver`` runs on the operator's caller thread (the mailbox thread).
  Flink-style ``async_invoke``, ``timeout``, the key selector and the retry
  predicates run there.
- Completions come from any thread as mails in one ``Mailbox`` (deque + Event).
  Mails run before new input is admitted (docs/semantics.md rule 6).
- Timeouts wait in a FIFO (they fall due in admission order), retry delays in a
  ``SortedList`` (``Timers``); the driver sleeps on the mailbox until the next mail
  or the next timer.
- asyncio-style functions run on one ``EventLoopThread``, started at the first
  call and stopped when the operator ends.

Invariants:
- Per entry, at most one ResultFuture is accepted at a time (``entry.future``); a
  completion of any other future (duplicate, earlier attempt, after timeout) is
  dropped.
- ``entry.timers`` holds exactly the entry's live retry timers, and
  ``entry.timeout_sequence >= 0`` says its timeout is live (``Timers`` may still hold
  the entry of a cancelled timeout, dead, until it reaches the FIFO's head).
- Retry n starts ``backoff(n)`` seconds after attempt n completed, only if that is
  before the entry's deadline (first call's start + timeout) and n < max_attempts;
  a wanted retry that would start at or after the deadline waits for the timeout,
  which calls ``timeout()`` (Flink's ``AsyncWaitOperator`` does the same).
- A final exception (user code, retries exhausted, timeout) raises ``JobFailure``
  from it; the operator then stops the loop thread and closes the function.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from time import monotonic
from typing import Any, cast

from sortedcontainers import SortedList

from aec.async_io.function import AsyncFunction, AsyncFunctionBase, ResultFuture
from aec.async_io.queue import (
    BACKOFF,
    DONE,
    RUNNING,
    TIMED_OUT,
    AsyncEntry,
    KeyGate,
    OrderedQueue,
    Timer,
    UnorderedQueue,
)
from aec.elements import Watermark, check_key, check_timestamp
from aec.errors import JobFailure, describe
from aec.retry import RetryStrategy
from aec.runtime.event_loop import Call, EventLoopThread
from aec.runtime.mailbox import Mailbox

__all__ = ["CallDriver", "Timers", "is_asyncio_style"]

_TIMEOUT = 0
_RETRY = 1


class Timers:
    """Pending timeouts and retries, earliest first.

    A retry timer is ``(due, sequence, kind, entry, attempt)``: ``due`` in monotonic
    seconds, ``sequence`` breaks ties in creation order (and keeps tuples from ever
    comparing entries); retries are few and wait in a ``SortedList``, removed when
    cancelled. An entry has at most one timeout, kept on the entry itself
    (``timeout_due``, ``timeout_sequence``; a cancelled or fired one has sequence -1),
    the entry waiting in a FIFO: every timeout has the operator's one length and starts
    on the monotonic clock, so they fall due in the order they are added (one that would
    not is put in its place). A cancelled timeout's entry stays in the FIFO, dead, until
    it reaches the head or the FIFO is compacted (when dead timeouts outnumber live
    ones), so removal costs nothing per input and the FIFO stays within twice the live
    timeouts.

    ``due`` is a lower bound of the earliest live timer's due time (``math.inf``: no
    timer), for a caller to skip ``pop_due`` until then: cheaper than asking.
    """

    __slots__ = ("_timeouts", "_live_timeouts", "_others", "_sequence", "due")

    def __init__(self) -> None:
        self._timeouts: deque[AsyncEntry] = deque()  # by timeout_due, live or dead
        self._live_timeouts = 0
        self._others = SortedList()
        self._sequence = itertools.count()
        self.due = math.inf

    def __len__(self) -> int:
        """Live timers."""
        return self._live_timeouts + len(self._others)

    def add(self, due: float, kind: int, entry: AsyncEntry, attempt: int = 0) -> None:
        """A timer of ``kind`` for ``entry`` at ``due``; a timeout only for an entry that
        never had one (the driver starts each entry's timeout once: its first call)."""
        sequence = next(self._sequence)
        if due < self.due:
            self.due = due
        if kind != _TIMEOUT:
            timer = (due, sequence, kind, entry, attempt)
            entry.timers.append(timer)
            self._others.add(timer)
            return
        entry.timeout_due = due
        entry.timeout_sequence = sequence
        timeouts = self._timeouts
        self._live_timeouts += 1
        if not timeouts or timeouts[-1].timeout_due <= due:
            timeouts.append(entry)
            return
        place = len(timeouts) - 1  # a timeout due before the last one: find its place
        while place > 0 and timeouts[place - 1].timeout_due > due:
            place -= 1
        timeouts.insert(place, entry)

    def cancel_all(self, entry: AsyncEntry) -> None:
        """Remove every timer of ``entry`` (its timeout's entry is left dead in the FIFO)."""
        if entry.timeout_sequence >= 0:
            entry.timeout_sequence = -1
            self._live_timeouts -= 1
        retries = entry.timers
        if retries:
            for timer in retries:
                self._others.remove(timer)
            retries.clear()
        timeouts = self._timeouts
        if len(timeouts) > 2 * self._live_timeouts + 64:
            self._timeouts = deque(e for e in timeouts if e.timeout_sequence >= 0)

    def _first_timeout(self) -> AsyncEntry | None:
        """The entry of the earliest live timeout (dead ones before it are dropped)."""
        timeouts = self._timeouts
        while timeouts:
            entry = timeouts[0]
            if entry.timeout_sequence >= 0:
                return entry
            timeouts.popleft()
        return None

    def _first(self) -> Timer | None:
        """The earliest live timer; ``due`` becomes its due time."""
        entry = self._first_timeout()
        first: Timer | None = None
        if entry is not None:
            first = (entry.timeout_due, entry.timeout_sequence, _TIMEOUT, entry, 0)
        if self._others:
            other: Timer = self._others[0]  # SortedList is untyped
            if first is None or other < first:
                first = other
        self.due = math.inf if first is None else first[0]
        return first

    def pop_due(self, now: float) -> tuple[int, AsyncEntry, int] | None:
        """Remove and return ``(kind, entry, attempt)`` of the earliest timer due at
        ``now``, or None."""
        timer = self._first()
        if timer is None or timer[0] > now:
            return None
        _, _, kind, entry, attempt = timer
        if kind == _TIMEOUT:
            self._timeouts.popleft()
            self._live_timeouts -= 1
            entry.timeout_sequence = -1
        else:
            self._others.pop(0)
            entry.timers.remove(timer)
        return kind, entry, attempt

    def next_delay(self, now: float) -> float | None:
        """Seconds until the earliest timer (0 if overdue), None if there is none."""
        timer = self._first()
        return None if timer is None else max(0.0, timer[0] - now)

    def clear(self) -> None:
        for entry in self._timeouts:
            entry.timeout_sequence = -1
        for timer in self._others:
            timer[3].timers.clear()
        self._timeouts.clear()
        self._live_timeouts = 0
        self._others.clear()
        self.due = math.inf


def is_asyncio_style(function: object) -> bool:
    """True if ``function.async_invoke`` is an ``async def`` (asyncio style).

    Raises:
        TypeError: ``async_invoke`` is missing, or does not take the style's arguments
            (``(value)`` for asyncio style, ``(value, result_future)`` for Flink style).
    """
    invoke = getattr(function, "async_invoke", None)
    if not callable(invoke):
        raise TypeError(
            f"function must be an aec.async_io.waits.AsyncFunction (or have async_invoke), "
            f"got {type(function).__name__}"
        )
    asyncio_style = inspect.iscoroutinefunction(invoke)
    arguments = (None,) if asyncio_style else (None, None)
    try:
        signature = inspect.signature(invoke)
    except (TypeError, ValueError):  # builtins without a signature: trust the caller
        return asyncio_style
    try:
        signature.bind(*arguments)
    except TypeError:
        if asyncio_style:
            expected = "async def async_invoke(self, value)"
        else:
            expected = "def async_invoke(self, value, result_future)"
        raise TypeError(
            f"{type(function).__name__}.async_invoke{signature} does not match the "
            f"{'asyncio' if asyncio_style else 'Flink'} style: expected {expected}"
        ) from None
    return asyncio_style


class CallDriver:
    """Calls, retries, timeouts and failures of async I/O entries, on the mailbox thread.

    The base of ``aec.async_io.operator.AsyncWaitOperator``, which admits inputs and
    emits what the queue releases; this class starts each admitted entry's calls and
    moves it to DONE in its queue.

    Args (validated by ``aec.async_io.operator``):
        function: an ``AsyncFunction`` (either style), or an ``AsyncBatchFunction``
            for a subclass that overrides ``_call``.
        timeout: seconds from an input's first call to its timeout, or None.
        retry: the ``RetryStrategy``.
        queue: ``OrderedQueue`` or ``UnorderedQueue`` (emission order).
        key_selector: for key-ordered mode, ``value -> key``; None otherwise.
        asyncio_style: whether ``function.async_invoke`` is an ``async def``.
    """

    def __init__(
        self,
        function: AsyncFunctionBase,
        timeout: float | None,
        retry: RetryStrategy,
        queue: OrderedQueue | UnorderedQueue,
        key_selector: Callable[[Any], Hashable] | None = None,  # takes the function's IN
        *,
        asyncio_style: bool,
    ) -> None:
        self._function = function
        self._asyncio = asyncio_style
        self._timeout = timeout
        self._retry = retry
        self._max_attempts = retry.max_attempts
        self._queue = queue
        self._key_selector = key_selector
        self._gate = KeyGate() if key_selector is not None else None
        self._mailbox = Mailbox()
        self._timers = Timers()
        self._loop: EventLoopThread | None = None
        self._watermark = -float("inf")

    # -- admission -----------------------------------------------------------------------
    def _admit(self, element: object, attempts: int = 0) -> AsyncEntry | Watermark:
        """Queue ``element`` and start its call (if its key is free); ``attempts``
        are calls made before a restore (they count against ``max_attempts``, but
        at least one call is made)."""
        if isinstance(element, Watermark):
            self._before_watermark()
            self._check_watermark(element)
            self._queue.add_watermark(element)
            return element
        key = None
        if self._key_selector is not None:
            try:
                key = self._key_selector(element)
            except Exception as exc:
                raise JobFailure(
                    f"key_selector failed for input {describe(element)}: "
                    f"{type(exc).__name__}: {exc}",
                    record=element,
                ) from exc
            try:
                check_key(key)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"key_selector({describe(element)}): {exc}") from None
        entry = AsyncEntry(element, key)
        entry.attempts = min(attempts, self._max_attempts - 1)
        self._queue.add_record(entry)
        if self._gate is None or self._gate.acquire(entry):
            self._start(entry)
        return entry

    def _before_watermark(self) -> None:
        """A watermark is about to be admitted (a batched operator sends its partial
        batch: nothing may wait behind a boundary)."""

    def _check_watermark(self, watermark: Watermark) -> None:
        timestamp = watermark.timestamp
        if timestamp is None:
            raise TypeError("watermark timestamp must be a number, got None")
        check_timestamp(timestamp, "watermark timestamp")
        if timestamp < self._watermark:
            raise ValueError(
                f"watermark {timestamp!r} arrived after {self._watermark!r}: "
                "watermarks must not go backwards"
            )
        self._watermark = timestamp

    # -- calls ---------------------------------------------------------------------------
    def _start(self, entry: AsyncEntry) -> None:
        """First call of ``entry``: its timeout starts now."""
        if self._timeout is not None:
            entry.deadline = monotonic() + self._timeout
            self._timers.add(entry.deadline, _TIMEOUT, entry)
        self._invoke(entry)

    def _invoke(self, entry: AsyncEntry) -> None:
        """Attempt ``entry.attempts + 1``: a fresh ResultFuture, then the call."""
        entry.attempts += 1
        entry.state = RUNNING
        future = ResultFuture(self._mailbox, entry)
        entry.future = future
        self._call(entry, future)

    def _call(self, entry: AsyncEntry, future: ResultFuture) -> None:
        """Start one call of ``async_invoke`` for ``entry``, completing ``future``;
        ``entry.task`` is what a timeout cancels (``cancel()``), if anything."""
        function = cast(AsyncFunction, self._function)
        if self._asyncio:
            try:
                # the asyncio style: async def async_invoke(self, value) -> results
                coroutine: Call[Iterable[object]]
                coroutine = function.async_invoke(entry.value)  # type: ignore[call-arg, assignment]
            except Exception as exc:  # raised before the coroutine existed
                future.complete_exceptionally(exc)
                return
            if self._loop is None:
                self._loop = EventLoopThread()
            entry.task = self._loop.submit(coroutine, future)
        else:
            try:
                returned = function.async_invoke(entry.value, future)
            except Exception as exc:  # a raising call is a failed attempt
                future.complete_exceptionally(exc)
                return
            if inspect.iscoroutine(returned):  # a plain def returning a coroutine
                returned.close()
                error = TypeError(
                    f"{type(self._function).__name__}.async_invoke returned a coroutine: "
                    "declare it `async def async_invoke(self, value)` (asyncio style)"
                )
                raise self._failure(entry, error) from error

    # -- completions ---------------------------------------------------------------------
    def _run_mails(self) -> None:
        take = self._mailbox.take
        while (mail := take()) is not None:
            self._on_completion(*mail)

    def _on_completion(
        self,
        future: ResultFuture,
        results: list[object] | None,
        error: BaseException | None,
        fatal: bool,
    ) -> None:
        entry = future.entry
        if entry.future is not future:
            return  # a repeated completion, or one of an attempt that no longer counts
        entry.future = None
        entry.task = None
        if fatal:
            raise self._failure(entry, error) from error
        if entry.state == RUNNING and self._schedule_retry(entry, results, error):
            return
        self._finish(entry, results, error)

    def _schedule_retry(
        self, entry: AsyncEntry, results: list[object] | None, error: BaseException | None
    ) -> bool:
        """Start the backoff of a retry if the strategy, the attempt budget and the
        deadline all allow it; True if a retry is scheduled."""
        if entry.attempts >= self._max_attempts:
            return False
        try:
            if error is not None:
                wanted = self._retry.should_retry_exception(error)
            else:
                wanted = self._retry.should_retry_result(results)
            if not wanted:
                return False
            delay = self._retry.backoff(entry.attempts)
        except Exception as exc:
            raise self._failure(entry, exc, "the retry strategy failed") from exc
        due = monotonic() + delay
        entry.state = BACKOFF
        if entry.deadline is not None and due >= entry.deadline:
            # as in Flink: the retry cannot start in time, so the timeout ends the
            # backoff and timeout() decides the outcome (a fallback, or TimeoutError)
            return True
        self._timers.add(due, _RETRY, entry, entry.attempts)
        return True

    def _finish(
        self, entry: AsyncEntry, results: list[object] | None, error: BaseException | None
    ) -> None:
        if error is not None:
            raise self._failure(entry, error) from error
        self._timers.cancel_all(entry)
        entry.results = results
        entry.state = DONE
        self._queue.completed(entry)
        if self._gate is not None:
            following = self._gate.release(entry)
            if following is not None:
                self._start(following)

    # -- timers --------------------------------------------------------------------------
    def _fire_timers(self) -> None:
        now = monotonic()
        while (timer := self._timers.pop_due(now)) is not None:
            kind, entry, attempt = timer
            if kind == _RETRY:
                # a retry timer exists only in BACKOFF, for the attempt that asked for it;
                # one found overdue at or after the deadline is not made (the mailbox
                # thread was busy past both): the entry's timeout, due too, decides
                if entry.deadline is None or now < entry.deadline:
                    self._invoke(entry)
            else:
                self._time_out(entry)

    def _time_out(self, entry: AsyncEntry) -> None:
        """The deadline passed during an attempt: no retry any more; the outcome is
        whatever ``timeout()`` completes its own future with."""
        self._timers.cancel_all(entry)
        if entry.task is not None:
            entry.task.cancel()  # the loop's coroutine is abandoned anyway
            entry.task = None
        entry.state = TIMED_OUT
        future = ResultFuture(self._mailbox, entry)
        entry.future = future
        try:
            self._function.timeout(entry.value, future)
        except Exception as exc:
            raise self._failure(entry, exc, "timeout() failed") from exc
        if not future.done:
            error = RuntimeError(
                f"{type(self._function).__name__}.timeout() returned without completing "
                "its result_future (complete it with a fallback or an exception)"
            )
            raise self._failure(entry, error) from error

    # -- failure -------------------------------------------------------------------------
    def _failure(
        self, entry: AsyncEntry, error: BaseException | None, what: str | None = None
    ) -> JobFailure:
        if what is None:
            what = "timed out" if entry.state == TIMED_OUT else "failed"
        key = f" (key {describe(entry.key)})" if self._key_selector is not None else ""
        timeout = f", timeout {self._timeout} s" if entry.state == TIMED_OUT else ""
        return JobFailure(
            f"async I/O {what} for input {describe(entry.value)}{key} after "
            f"{entry.attempts} attempt(s){timeout}: {type(error).__name__}: {error}",
            key=entry.key,
            record=entry.value,
        )

    def _stop_calls(self) -> None:
        """Forget every timer and stop the loop thread (cancelling its coroutines)."""
        self._timers.clear()
        if self._loop is not None:
            loop, self._loop = self._loop, None
            loop.stop()
