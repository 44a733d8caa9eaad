"""The contexts user code gets while a record runs: ``Context`` and its
``TimerService`` (Flink's ``KeyedProcessFunction.Context`` and ``TimerService``), and
what they need of the operator (``OperatorHooks``, a protocol: this module sits below
the runtime). Re-exported by ``aec.functions``; compiled in the compiled build (user
code calls them per record).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Container, Hashable
from typing import Any, Protocol, SupportsFloat, TypeVar

from aec.config import AecConfig
from aec.elements import Time, check_timestamp
from aec.retry import NoRetry, RetryStrategy
from aec.state.backend import StateBackend
from aec.state.descriptors import StateDescriptor
from aec.state.future import StateFuture
from aec.state.typevars import IN, OUT

__all__ = ["BatchCalls", "Context", "OperatorHooks", "TimerService"]

R = TypeVar("R")  # an external call's result

_NO_RETRY = NoRetry()


class _RunningRecord(Protocol):
    """The running record or timer firing (the runtime's ``RecordContext``)."""

    @property
    def key(self) -> Hashable: ...
    @property
    def timestamp(self) -> Time | None: ...
    @property
    def watermark(self) -> Time: ...
    @property
    def processing_time(self) -> Time: ...
    @property
    def timer(self) -> tuple[str, Time] | None: ...  # (domain, timestamp) while a timer fires


class _Records(Protocol):
    """Where the running record is (the AEC: ``current`` is None between records)."""

    @property
    def current(self) -> _RunningRecord | None: ...


class BatchCalls(Protocol[IN, OUT]):
    """What ``Context.call_batched`` needs of an ``aec.async_io.Batcher``: the batch
    function (one result ``OUT`` per argument ``IN``, in order) and when a batch
    leaves (a protocol so this module, below ``aec.async_io``, does not import it)."""

    @property
    def fn(self) -> Callable[[list[IN]], Awaitable[list[OUT]]]: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_wait(self) -> float | None: ...


class _ExternalCalls(Protocol):
    def call_batched(
        self, batcher: BatchCalls[IN, OUT], arg: IN, timeout: SupportsFloat | None, retry: RetryStrategy
    ) -> StateFuture[OUT]: ...


class OperatorHooks(Protocol):
    """What the contexts need from the operator running the function (implemented by
    ``aec.runtime.operator.KeyedProcessOperator``; a protocol so this module, below
    the runtime, does not import it)."""

    config: AecConfig
    backend: StateBackend

    @property
    def controller(self) -> _Records: ...
    @property
    def external_calls(self) -> _ExternalCalls: ...  # aec.runtime.external_calls.ExternalCalls

    def state_handle(self, descriptor: StateDescriptor) -> object: ...
    def register_timer(self, domain: str, timestamp: Time) -> None: ...
    def delete_timer(self, domain: str, timestamp: Time) -> None: ...
    def timer_times(self, domain: str) -> Container[Time]: ...
    def due_timers(self, domain: str, until: Time) -> list[Time]: ...
    def current_context(self) -> _RunningRecord: ...
    def emit(self, value: object) -> None: ...
    def emit_side(self, tag: Hashable, value: object) -> None: ...
    def call_async(
        self,
        fn: Callable[..., Awaitable[R]],
        args: tuple[object, ...],
        timeout: SupportsFloat | None,
        retry: RetryStrategy,
    ) -> StateFuture[R]: ...


# an int beyond it is refused (check_timestamp); an int, so an int compares exactly
_FLOAT_MAX = int(sys.float_info.max)


class TimerService:
    """Timers of the current key; timestamps in seconds (event or processing time)."""

    __slots__ = ("_operator",)

    def __init__(self, operator: OperatorHooks) -> None:
        self._operator = operator

    def register_event_time_timer(self, timestamp: Time) -> None:
        """Fire ``on_timer(timestamp)`` for this key once the watermark reaches
        ``timestamp``; registering the same (key, timestamp) again is a no-op.
        Raises TypeError/ValueError for a timestamp that is not a number."""
        self._operator.register_timer("event-time", _checked(timestamp, "event-time"))

    def delete_event_time_timer(self, timestamp: Time) -> None:
        """Forget this key's event-time timer at ``timestamp`` (no-op if absent)."""
        self._operator.delete_timer("event-time", _checked(timestamp, "event-time"))

    def register_processing_time_timer(self, timestamp: Time) -> None:
        """Fire ``on_timer(timestamp)`` for this key once the operator's clock reads
        ``timestamp`` or later (checked between input elements, at a reading that
        advances the clock: a timer at or before the current reading fires at the
        next advance; the firing waits for the records that arrived before, like a
        watermark). Pending processing-time timers do not fire at end of input (as
        in Flink)."""
        self._operator.register_timer("processing-time", _checked(timestamp, "processing-time"))

    def delete_processing_time_timer(self, timestamp: Time) -> None:
        """Forget this key's processing-time timer at ``timestamp`` (no-op if absent)."""
        self._operator.delete_timer("processing-time", _checked(timestamp, "processing-time"))

    def timer_times(self, domain: str) -> Container[Time]:
        """The timestamps of this key's registered timers in ``domain``
        (``"event-time"`` or ``"processing-time"``), for membership tests (aec
        extension: a function deleting many timers skips those it never set). A live
        view, valid until a timer of the key is registered; O(1) per test. Raises
        ValueError (TypeError: not a str) for another domain."""
        return self._operator.timer_times(_domain(domain))

    def due_timers(self, domain: str, until: Time) -> list[Time]:
        """The timestamps of this key's timers in ``domain`` at or before ``until``
        (seconds), ascending, as a new list (aec extension). O(log n + due). Raises
        ValueError for another domain or a NaN ``until``, TypeError for a non-number."""
        return self._operator.due_timers(_domain(domain), _checked(until, domain))

    def current_watermark(self) -> Time:
        """The watermark the running code sees, in seconds (-inf before the first):
        for a record, the last watermark that arrived before it; for a timer,
        the watermark that fired it (for a processing-time timer, the last one
        before the clock advance that fired it)."""
        return self._operator.current_context().watermark

    def current_processing_time(self) -> Time:
        """The operator clock's reading when the running record arrived (or its
        timer fired), in seconds."""
        return self._operator.current_context().processing_time


def _domain(domain: str) -> str:
    """``domain`` if it names a timer domain; else ValueError (TypeError: not a str):
    a misspelled one must not be answered from the other domain's queue."""
    if domain == "event-time" or domain == "processing-time":
        return domain
    error = ValueError if isinstance(domain, str) else TypeError
    raise error(f"timer domain must be 'event-time' or 'processing-time', got {domain!r}")


def _checked(timestamp: Time | None, domain: str) -> Time:  # None from untyped callers
    if type(timestamp) is float and timestamp == timestamp:  # the common case: not NaN
        return timestamp
    if type(timestamp) is int and -_FLOAT_MAX <= timestamp <= _FLOAT_MAX:  # a window's end
        return timestamp
    if timestamp is None:
        raise TypeError(f"{domain} timer timestamp must be a number, got None")
    check_timestamp(timestamp, f"{domain} timer timestamp")
    return timestamp  # a real number (int or float, kept as given)


class Context:
    """Given to ``process_element`` and ``on_timer``; reflects the record whose code
    is running (also inside callbacks and after ``await``).

    Attributes:
        output: ``output(value)`` emits ``value`` downstream.
        side_output: ``side_output(tag, value)`` emits ``value`` to the side output
            ``tag``.
        timer_service: the running key's ``TimerService``.
    """

    # output and side_output are the operator's collector methods, bound once: user
    # code calls them per record
    __slots__ = ("_operator", "_records", "timer_service", "output", "side_output")

    def __init__(self, operator: OperatorHooks) -> None:
        self._operator = operator
        self._records = operator.controller
        self.timer_service = TimerService(operator)
        self.output: Callable[[object], None] = operator.emit
        self.side_output: Callable[[Hashable, object], None] = operator.emit_side

    def _running(self) -> _RunningRecord:
        current: _RunningRecord | None = self._records.current
        if current is None:
            raise RuntimeError(
                "no current record: called outside process_element, on_timer or callbacks"
            )
        return current

    @property
    def current_key(self) -> Any:  # Any: each function knows its own keys' type
        """The key of the running record or timer."""
        current = self._records.current
        if current is None:
            return self._running().key  # raises
        return current.key

    @property
    def timestamp(self) -> Time | None:
        """The record's event time, or the firing timer's timestamp (seconds)."""
        return self._running().timestamp

    @property
    def timer_domain(self) -> str | None:
        """In ``on_timer``: ``"event-time"`` or ``"processing-time"``; None for a record."""
        timer = self._running().timer
        return None if timer is None else timer[0]

    def call_async(
        self,
        fn: Callable[..., Awaitable[R]],
        *args: object,
        timeout: SupportsFloat | None = None,
        retry: RetryStrategy = _NO_RETRY,
    ) -> StateFuture[R]:
        """Call an external service for the running record; a ``StateFuture`` of its
        result (beyond Flink: enrichment next to state, in one operator).

        ``fn(*args)`` (an ``async def``, or a function returning an awaitable) runs on
        the operator's asyncio loop thread (one per operator, started at the first
        call); its result completes the future through the mailbox. The call counts
        toward its record like a state request (same-key order, in-flight limit,
        drain before a snapshot). With ``async_state=False`` it runs to completion
        before this returns a completed future.

        Args:
            fn: the async callable; ``args`` its positional arguments.
            timeout: seconds spanning every attempt and backoff (None: none); the
                running attempt is cancelled and the call fails with ``TimeoutError``.
            retry: an ``aec.retry`` strategy; ``retry_on_result`` gets the result.

        Returns:
            A ``StateFuture``: ``await`` it in an ``async def`` (a failed call raises
            its exception there, which the coroutine may catch; uncaught, the job
            fails with ``JobFailure``) or chain it (a failure fails the job).

        Raises:
            TypeError: ``fn`` is not callable (or, when awaited, returned no
                awaitable), a bad ``timeout`` or ``retry``.
            ValueError: ``timeout`` <= 0 or NaN.
            RuntimeError: outside a record (``open()``, after ``finish()``).
        """
        return self._operator.call_async(fn, args, timeout, retry)

    def call_batched(
        self,
        batcher: BatchCalls[IN, OUT],
        arg: IN,
        *,
        timeout: SupportsFloat | None = None,
        retry: RetryStrategy = _NO_RETRY,
    ) -> StateFuture[OUT]:
        """Hand ``arg`` to ``batcher`` (an ``aec.async_io.Batcher``) for the running
        record; a ``StateFuture`` of its result (beyond Flink: the calls of every
        in-flight record of every key share batch calls).

        The argument joins the batcher's pending batch on the operator's asyncio loop
        thread (the one ``call_async`` uses); a batch ``fn(args)`` is sent when it holds
        ``max_batch_size`` arguments, when ``max_wait`` seconds passed since its first,
        or when nothing else can run (the mailbox thread would sleep: a watermark, a
        checkpoint's drain, the end of input, the in-flight limit). The argument's
        result completes the future through the mailbox. The call counts toward its
        record like ``call_async`` (same-key order, in-flight limit, drain before a
        snapshot). With ``async_state=False`` a batch of one is sent and awaited
        before this returns a completed future.

        Args:
            batcher: the ``Batcher`` (made once, e.g. in ``open()``; its batches are
                per operator).
            arg: this call's argument: one element of the list ``fn`` gets.
            timeout: seconds from now spanning every attempt and backoff (None: none);
                the call then fails with ``TimeoutError`` (its batch call is cancelled
                once none of its arguments is waited for).
            retry: an ``aec.retry`` strategy, per argument: a retried argument
                travels in a later batch; ``retry_on_result`` gets its own result.

        Returns:
            A ``StateFuture`` as ``call_async``'s: ``await`` raises the call's exception
            (catchable); uncaught, or on a chained future, the job fails.

        Raises:
            TypeError: ``batcher`` is not a ``Batcher``, a bad ``timeout`` or ``retry``.
            ValueError: ``timeout`` <= 0 or NaN.
            RuntimeError: outside a record.

        A batch result of the wrong length (or not a list, or ``fn`` returning no
        awaitable) fails the job at once, without retries, naming ``fn`` as
        ``module.qualname`` and both lengths (``JobFailure``).
        """
        return self._operator.external_calls.call_batched(batcher, arg, timeout, retry)
