"""Triggers: when a window's contents are emitted (Flink's ``Trigger`` family).

Every method may return a ``TriggerResult``, a ``StateFuture`` of one, or be
``async def``. ``ctx`` is a ``aec.windowing.TriggerContext``: timers of the window,
the watermark and clock, and state per key and window (``get_partitioned_state``; in
``on_merge`` also ``merge_partitioned_state``); ``TriggerServices`` is what of it the
built-in triggers use. The base class types a subclass's arguments as ``Any``, so a
user trigger may annotate its own (its windows, its values).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable
from typing import Any, Protocol

from aec.state.descriptors import ReducingStateDescriptor, StateDescriptor
from aec.state.future import StateFuture
from aec.windowing.builtin import fires_on_element, timer_on_merge
from aec.windowing.windows import Window


class TriggerResult(enum.Enum):
    """What a trigger decides (Flink's ``TriggerResult``): ``FIRE`` emits and keeps
    the contents, ``PURGE`` clears them, ``FIRE_AND_PURGE`` does both."""

    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    def is_fire(self) -> bool:
        """FIRE or FIRE_AND_PURGE (PyFlink's ``TriggerResult.is_fire()``)."""
        return self.value[0]

    def is_purge(self) -> bool:
        """PURGE or FIRE_AND_PURGE (PyFlink's ``TriggerResult.is_purge()``)."""
        return self.value[1]


Decision = TriggerResult | Awaitable[TriggerResult]
"""What a trigger's ``on_element``/``on_event_time``/``on_processing_time`` return: a
``TriggerResult``, or a StateFuture or coroutine of one."""
Done = Awaitable[object] | None
"""What ``on_merge`` and ``clear`` return: None, or something to await."""


class TriggerServices(Protocol):
    """What the built-in triggers use of their ``TriggerContext`` (seconds)."""

    def current_watermark(self) -> float: ...

    def current_processing_time(self) -> float: ...

    def register_event_time_timer(self, time: float) -> None: ...

    def delete_event_time_timer(self, time: float) -> None: ...

    def register_processing_time_timer(self, time: float) -> None: ...

    def delete_processing_time_timer(self, time: float) -> None: ...

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any: ...

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> StateFuture: ...


class Trigger:
    """Base class of triggers; override what you need (defaults: ``CONTINUE``)."""

    def on_element(self, value: Any, timestamp: float, window: Any, ctx: Any) -> Decision:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: float, window: Any, ctx: Any) -> Decision:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: float, window: Any, ctx: Any) -> Decision:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        """Whether the trigger supports merging windows (sessions): by default, whether
        it defines ``on_merge`` (the contract's Trigger methods; Flink's ``canMerge``)."""
        return type(self).on_merge is not Trigger.on_merge

    def on_merge(self, window: Any, ctx: Any) -> Done:
        """Windows merged into ``window``: move state (``ctx.merge_partitioned_state``)
        and register the merged window's timers."""
        raise NotImplementedError(f"{type(self).__name__} does not support merging windows")

    def clear(self, window: Any, ctx: Any) -> Done:
        """The window is cleaned up: delete its timers and state."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EventTimeTrigger(Trigger):
    """Fires once the watermark reaches the window's end (at once for a record in
    a window whose end the watermark has passed: a late firing). Its rule is
    ``aec.windowing.builtin``'s, which runs it without a timer index."""

    def on_element(
        self, value: object, timestamp: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        if fires_on_element(True, window.end, ctx.current_watermark()):
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.end)
        return TriggerResult.CONTINUE

    def on_event_time(
        self, time: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        return TriggerResult.FIRE if time == window.end else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerServices) -> None:
        if timer_on_merge(window.end, ctx.current_watermark()):
            ctx.register_event_time_timer(window.end)

    def clear(self, window: Window, ctx: TriggerServices) -> None:
        ctx.delete_event_time_timer(window.end)


class ProcessingTimeTrigger(Trigger):
    """Fires once the operator's clock reaches the window's end (``aec.windowing.builtin``)."""

    def on_element(
        self, value: object, timestamp: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        if fires_on_element(False, window.end, ctx.current_processing_time()):
            return TriggerResult.FIRE  # never: processing time fires only at its timer
        ctx.register_processing_time_timer(window.end)
        return TriggerResult.CONTINUE

    def on_processing_time(
        self, time: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        return TriggerResult.FIRE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerServices) -> None:
        if timer_on_merge(window.end, ctx.current_processing_time()):
            ctx.register_processing_time_timer(window.end)

    def clear(self, window: Window, ctx: TriggerServices) -> None:
        ctx.delete_processing_time_timer(window.end)


class NeverTrigger(Trigger):
    """``GlobalWindows``' default: never fires."""

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerServices) -> None:
        return None


def _add(a: float, b: float) -> float:
    return a + b


class CountTrigger(Trigger):
    """Fires (without purging) every ``n``-th record of the window (Flink's
    ``CountTrigger``); the count is state per key and window.

    Raises:
        ValueError: ``n < 1``.
    """

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"CountTrigger.of: n must be an int, got {n!r}")
        if n < 1:
            raise ValueError(f"CountTrigger.of: n must be >= 1, got {n!r}")
        self.n = n
        self.count = ReducingStateDescriptor("count", _add)

    @classmethod
    def of(cls, n: int) -> CountTrigger:
        return cls(n)

    async def on_element(
        self, value: object, timestamp: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        count = ctx.get_partitioned_state(self.count)
        await count.async_add(1)
        if await count.async_get() >= self.n:
            await count.async_clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerServices) -> StateFuture:
        return ctx.merge_partitioned_state(self.count)

    def clear(self, window: Window, ctx: TriggerServices) -> StateFuture:
        result: StateFuture = ctx.get_partitioned_state(self.count).async_clear()
        return result

    def __repr__(self) -> str:
        return f"CountTrigger.of({self.n})"


class PurgingTrigger(Trigger):
    """Wraps a trigger and turns its ``FIRE`` into ``FIRE_AND_PURGE`` (Flink's
    ``PurgingTrigger``)."""

    def __init__(self, trigger: Trigger) -> None:
        if not isinstance(trigger, Trigger):
            raise TypeError(f"PurgingTrigger.of takes a Trigger, got {trigger!r}")
        self.trigger = trigger

    @classmethod
    def of(cls, trigger: Trigger) -> PurgingTrigger:
        return cls(trigger)

    async def _purging(self, decision: Decision) -> TriggerResult:
        result = await resolve(decision, self.trigger)
        return TriggerResult.FIRE_AND_PURGE if result.is_fire() else result

    def on_element(
        self, value: object, timestamp: float, window: Window, ctx: TriggerServices
    ) -> Decision:
        return self._purging(self.trigger.on_element(value, timestamp, window, ctx))

    def on_event_time(self, time: float, window: Window, ctx: TriggerServices) -> Decision:
        return self._purging(self.trigger.on_event_time(time, window, ctx))

    def on_processing_time(self, time: float, window: Window, ctx: TriggerServices) -> Decision:
        return self._purging(self.trigger.on_processing_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.trigger.can_merge()

    def on_merge(self, window: Window, ctx: TriggerServices) -> Done:
        return self.trigger.on_merge(window, ctx)

    def clear(self, window: Window, ctx: TriggerServices) -> Done:
        return self.trigger.clear(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger.of({self.trigger!r})"


class ContinuousEventTimeTrigger(Trigger):
    """Fires every ``interval`` seconds of event time inside the window, on the grid
    ``floor(t / interval) * interval``, and at the window's end (Flink's
    ``ContinuousEventTimeTrigger``); the next firing time is state per window.

    Raises:
        ValueError: ``interval`` <= 0.
    """

    def __init__(self, interval: float) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(
                f"ContinuousEventTimeTrigger.of: interval must be seconds, got {interval!r}"
            )
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(
                f"ContinuousEventTimeTrigger.of: interval must be > 0 seconds, got {interval!r}"
            )
        self.interval = interval
        self.fire_time = ReducingStateDescriptor("fire-time", min)

    @classmethod
    def of(cls, interval: float) -> ContinuousEventTimeTrigger:
        return cls(interval)

    async def on_element(
        self, value: object, timestamp: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        if fires_on_element(True, window.end, ctx.current_watermark()):  # as EventTimeTrigger
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.end)
        state = ctx.get_partitioned_state(self.fire_time)
        if await state.async_get() is None:
            start = math.floor(timestamp / self.interval) * self.interval
            await self._register_next(start, window, ctx, state)
        return TriggerResult.CONTINUE

    async def _register_next(
        self, time: float, window: Window, ctx: TriggerServices, state: Any
    ) -> None:
        next_time = min(time + self.interval, window.end)
        if next_time < window.end and ctx.current_watermark() == math.inf:
            return  # end of input: the window's own end firing comes next (no endless chain)
        await state.async_add(next_time)
        ctx.register_event_time_timer(next_time)

    async def on_event_time(
        self, time: float, window: Window, ctx: TriggerServices
    ) -> TriggerResult:
        if time == window.end:
            return TriggerResult.FIRE
        state = ctx.get_partitioned_state(self.fire_time)
        if await state.async_get() == time:
            await state.async_clear()
            await self._register_next(time, window, ctx, state)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    async def on_merge(self, window: Window, ctx: TriggerServices) -> None:
        await ctx.merge_partitioned_state(self.fire_time)
        next_time = await ctx.get_partitioned_state(self.fire_time).async_get()
        if next_time is not None:
            ctx.register_event_time_timer(next_time)

    async def clear(self, window: Window, ctx: TriggerServices) -> None:
        state = ctx.get_partitioned_state(self.fire_time)
        next_time = await state.async_get()
        if next_time is not None:
            ctx.delete_event_time_timer(next_time)
        await state.async_clear()

    def __repr__(self) -> str:
        return f"ContinuousEventTimeTrigger.of({self.interval!r})"


async def resolve(result: object, trigger: Trigger) -> TriggerResult:
    """A trigger method's result as a ``TriggerResult``: awaits a StateFuture or a
    coroutine. Raises TypeError naming the trigger and the value otherwise."""
    if type(result) is not TriggerResult and isinstance(result, Awaitable):
        result = await result
    if not isinstance(result, TriggerResult):
        raise TypeError(
            f"trigger {trigger!r} returned {result!r} ({type(result).__name__}); "
            "a trigger must return a TriggerResult or a StateFuture of one"
        )
    return result
