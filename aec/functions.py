"""The user-facing function API: ``KeyedProcessFunction`` and its contexts.

After Flink's ``KeyedProcessFunction`` (DataStream V2 async state variant).
``process_element`` and ``on_timer`` may return None, a ``StateFuture``, or be
``async def`` (awaiting StateFutures only; the engine drives the coroutine on
the mailbox thread, no asyncio). All of them run on the mailbox thread.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Protocol, overload

from aec.config import AecConfig
from aec.elements import check_timestamp
from aec.retry import NoRetry
from aec.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.handles import AggregatingState, ListState, MapState, ReducingState, ValueState

_NO_RETRY = NoRetry()


class _RunningRecord(Protocol):
    key: Any
    timestamp: float | None
    watermark: float
    processing_time: float
    timer: tuple[str, float] | None  # (domain, timestamp) while a timer fires


class OperatorHooks(Protocol):
    """What the contexts need from the operator running the function (implemented by
    ``aec.runtime.operator.KeyedProcessOperator``; a protocol so this module, below
    the runtime, does not import it)."""

    config: AecConfig

    def state_handle(self, descriptor: StateDescriptor) -> Any: ...
    def register_timer(self, domain: str, timestamp: float) -> None: ...
    def delete_timer(self, domain: str, timestamp: float) -> None: ...
    def timer_times(self, domain: str) -> Container[float]: ...
    def due_timers(self, domain: str, until: float) -> list[float]: ...
    def current_context(self) -> _RunningRecord: ...
    def emit(self, value: Any) -> None: ...
    def emit_side(self, tag: Any, value: Any) -> None: ...
    def call_async(self, fn: Any, args: tuple[Any, ...], timeout: Any, retry: Any) -> Any: ...


class KeyedProcessFunction:
    """Subclass and override ``process_element`` (and ``on_timer`` for timers)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Create state handles here: ``self.s = ctx.get_state(descriptor)``."""

    def process_element(self, value: Any, ctx: Context) -> Any:
        """Handle one record of key ``ctx.current_key``."""
        raise NotImplementedError(f"{type(self).__name__} must override process_element")

    def on_timer(self, timestamp: float, ctx: Context) -> Any:
        """A timer of key ``ctx.current_key`` at ``timestamp`` (seconds) fired."""

    def close(self) -> None:
        """Release what ``open`` acquired; called once at the end of the run."""


class RuntimeContext:
    """Given to ``open``: makes state handles bound to the running operator."""

    def __init__(self, operator: OperatorHooks) -> None:
        self._operator = operator

    # one overload per descriptor type, so a type checker knows the handle's methods
    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...
    @overload
    def get_state(self, descriptor: ReducingStateDescriptor) -> ReducingState: ...
    @overload
    def get_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState: ...
    @overload
    def get_state(self, descriptor: StateDescriptor) -> Any: ...

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The handle for ``descriptor`` (ValueState, ListState, MapState,
        ReducingState or AggregatingState). The same name twice returns the same
        handle. Raises TypeError for a non-descriptor, ValueError when the name
        is already used by a different descriptor."""
        return self._operator.state_handle(descriptor)

    @property
    def max_parallelism(self) -> int:
        return self._operator.config.max_parallelism

    @property
    def config(self) -> AecConfig:
        """The running operator's configuration (read it; a function may choose how it
        runs by it, e.g. whether it can hold records in a mini-batch)."""
        return self._operator.config

    def call_async(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Always raises RuntimeError: external calls belong to a record
        (``Context.call_async`` in ``process_element`` / ``on_timer``), not to ``open``."""
        raise RuntimeError(
            "call_async() outside a record: call it on the Context of process_element or "
            "on_timer, not in open()"
        )


class TimerService:
    """Timers of the current key; timestamps in seconds (event or processing time)."""

    __slots__ = ("_operator",)

    def __init__(self, operator: OperatorHooks) -> None:
        self._operator = operator

    def register_event_time_timer(self, timestamp: float) -> None:
        """Fire ``on_timer(timestamp)`` for this key once the watermark reaches
        ``timestamp``; registering the same (key, timestamp) again is a no-op.
        Raises TypeError/ValueError for a timestamp that is not a number."""
        self._operator.register_timer("event-time", _checked(timestamp, "event-time"))

    def delete_event_time_timer(self, timestamp: float) -> None:
        """Forget this key's event-time timer at ``timestamp`` (no-op if absent)."""
        self._operator.delete_timer("event-time", _checked(timestamp, "event-time"))

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Fire ``on_timer(timestamp)`` for this key once the operator's clock reads
        ``timestamp`` or later (checked between input elements; the firing waits
        for the records that arrived before, like a watermark). Pending
        processing-time timers do not fire at end of input (as in Flink)."""
        self._operator.register_timer("processing-time", _checked(timestamp, "processing-time"))

    def delete_processing_time_timer(self, timestamp: float) -> None:
        """Forget this key's processing-time timer at ``timestamp`` (no-op if absent)."""
        self._operator.delete_timer("processing-time", _checked(timestamp, "processing-time"))

    def timer_times(self, domain: str) -> Container[float]:
        """The timestamps of this key's registered timers in ``domain``
        (``"event-time"`` or ``"processing-time"``), for membership tests (aec
        extension: a function deleting many timers skips those it never set). A live
        view, valid until a timer of the key is registered; O(1) per test."""
        return self._operator.timer_times(domain)

    def due_timers(self, domain: str, until: float) -> list[float]:
        """The timestamps of this key's timers in ``domain`` at or before ``until``
        (seconds), ascending, as a new list (aec extension). O(log n + due)."""
        return self._operator.due_timers(domain, until)

    def current_watermark(self) -> float:
        """The watermark the running code sees, in seconds (-inf before the first):
        for a record, the last watermark that arrived before it; for a timer,
        the watermark that fired it (for a processing-time timer, the last one
        before the clock advance that fired it)."""
        return self._operator.current_context().watermark

    def current_processing_time(self) -> float:
        """The operator clock's reading when the running record arrived (or its
        timer fired), in seconds."""
        return self._operator.current_context().processing_time


def _checked(timestamp: Any, domain: str) -> float:
    if type(timestamp) is float and timestamp == timestamp:  # the common case: not NaN
        return timestamp
    if timestamp is None:
        raise TypeError(f"{domain} timer timestamp must be a number, got None")
    check_timestamp(timestamp, f"{domain} timer timestamp")
    checked: float = timestamp  # a real number now (int or float, kept as given)
    return checked


class Context:
    """Given to ``process_element`` and ``on_timer``; reflects the record whose code
    is running (also inside callbacks and after ``await``)."""

    __slots__ = ("_operator", "timer_service")

    def __init__(self, operator: OperatorHooks) -> None:
        self._operator = operator
        self.timer_service = TimerService(operator)

    @property
    def current_key(self) -> Any:
        return self._operator.current_context().key

    @property
    def timestamp(self) -> float | None:
        """The record's event time, or the firing timer's timestamp (seconds)."""
        return self._operator.current_context().timestamp

    @property
    def timer_domain(self) -> str | None:
        """In ``on_timer``: ``"event-time"`` or ``"processing-time"``; None for a record."""
        timer = self._operator.current_context().timer
        return None if timer is None else timer[0]

    def output(self, value: Any) -> None:
        """Emit ``value`` downstream."""
        self._operator.emit(value)

    def side_output(self, tag: str, value: Any) -> None:
        """Emit ``value`` to the side output ``tag``."""
        self._operator.emit_side(tag, value)

    def call_async(
        self, fn: Any, *args: Any, timeout: float | None = None, retry: Any = _NO_RETRY
    ) -> Any:
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
