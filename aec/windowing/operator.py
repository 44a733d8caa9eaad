"""``window(...)``: windows as a ``KeyedProcessFunction`` (Flink's ``WindowOperator``,
``EvictingWindowOperator`` and ``AsyncWindowOperator``, merging windows included).

All window state is state of the function's backend, per key and window,
reached through the AEC like any state request: contents (``window-contents``),
trigger and ``ProcessWindowFunction`` state (``window-trigger.<name>``,
``window-process.<name>``), the timer index (``window-timers``) and, for
sessions, the merging-window set (``window-sessions``: the key's windows, a
single value). Timers are the engine's per-key timers. So windows batch,
run asynchronously, checkpoint, rescale and pass ``assert_equivalent`` as any
keyed function does. See ``docs/windows.md``.
"""

from __future__ import annotations

import math
from typing import Any

from aec.functions import KeyedProcessFunction
from aec.state.descriptors import MapStateDescriptor, StateDescriptor, ValueStateDescriptor
from aec.windowing.assigners import SlidingEventTimeWindows
from aec.windowing.contents import Contents, PaneContents
from aec.windowing.context import ProcessWindowContext, Scope, TriggerContext, window_handle
from aec.windowing.merging import add_session
from aec.windowing.timers import EVENT, PROCESSING, WindowTimers
from aec.windowing.triggers import EventTimeTrigger, ProcessingTimeTrigger, resolve


async def _settle(result: Any) -> None:
    """Await what a trigger's ``on_merge``/``clear`` or a ``clear`` returned, if anything."""
    if result is not None and hasattr(result, "__await__"):
        await result


class WindowOperatorFunction(KeyedProcessFunction):
    """The function ``window(...)`` returns; see ``aec.windowing.window``."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.late_records_dropped = 0

    # -- set-up ------------------------------------------------------------------------------
    def open(self, ctx: Any) -> None:
        spec = self.spec
        assigner = spec.assigner
        self._runtime = ctx
        self._stores: dict[str, Any] = {}
        self.assigner, self.trigger, self.evictor = assigner, spec.trigger, spec.evictor
        self.process_fn, self.lateness = spec.process, spec.allowed_lateness
        self.event_time = assigner.event_time
        store = ctx.get_state(MapStateDescriptor("window-contents"))
        self.contents: Contents | PaneContents = spec.make_contents(store)
        builtin = EventTimeTrigger if self.event_time else ProcessingTimeTrigger
        # implicit timers: a time grid with the built-in trigger (see aec.windowing.timers)
        self.fast = (
            not assigner.merging
            and type(self.trigger) is builtin
            and isinstance(assigner, SlidingEventTimeWindows)
        )
        index = None if self.fast else ctx.get_state(MapStateDescriptor("window-timers"))
        self.timers = WindowTimers(index, self.fast)
        self.sessions = (
            ctx.get_state(ValueStateDescriptor("window-sessions")) if assigner.merging else None
        )
        if self.fast and spec.pane is not None:
            self.contents = PaneContents(self.contents, assigner, spec.pane)
        self.panes = isinstance(self.contents, PaneContents)
        if self.process_fn is not None and hasattr(self.process_fn, "open"):
            self.process_fn.open(ctx)

    def close(self) -> None:
        if self.process_fn is not None and hasattr(self.process_fn, "close"):
            self.process_fn.close()

    def metric_counters(self) -> dict[str, int]:
        """Added to the run's metrics: ``late_records_dropped``."""
        return {"late_records_dropped": self.late_records_dropped}

    # -- state per key and window -----------------------------------------------------------
    def window_store(self, descriptor: StateDescriptor, kind: str) -> Any:
        name = f"window-{kind}.{descriptor.name}"
        store = self._stores.get(name)
        if store is None:
            store = self._stores[name] = self._runtime.get_state(MapStateDescriptor(name))
        return store

    def window_state(self, descriptor: StateDescriptor, window: Any, kind: str) -> Any:
        return window_handle(descriptor, self.window_store(descriptor, kind), window)

    def global_state(self, descriptor: StateDescriptor) -> Any:
        return self._runtime.get_state(descriptor)

    # -- time --------------------------------------------------------------------------------
    def is_late(self, window: Any, watermark: float) -> bool:
        """Flink's ``isWindowLate``: an event-time window cleaned up at this watermark."""
        return self.event_time and window.end + self.lateness <= watermark

    def cleanup_time(self, window: Any) -> float:
        return window.end + self.lateness if self.event_time else window.end

    def _register_cleanup(self, scope: Scope, window: Any) -> None:
        time = self.cleanup_time(window)
        if time != math.inf:  # a global window is never cleaned (Flink)
            domain = EVENT if self.event_time else PROCESSING
            self.timers.register(scope.ctx, scope.pending, domain, time, window)

    def _delete_cleanup(self, scope: Scope, window: Any) -> None:
        domain = EVENT if self.event_time else PROCESSING
        self.timers.delete(scope.pending, domain, self.cleanup_time(window), window)

    # -- records -----------------------------------------------------------------------------
    def process_element(self, value: Any, ctx: Any) -> Any:
        return self._on_record(value, ctx)

    async def _on_record(self, value: Any, ctx: Any) -> None:
        service = ctx.timer_service
        if self.event_time:
            timestamp = ctx.timestamp
            if timestamp is None:
                raise ValueError(
                    f"record {value!r} of key {ctx.current_key!r} has no timestamp: the "
                    f"event-time window assigner {self.assigner!r} needs Record(key, value, timestamp)"
                )
            now = watermark = service.current_watermark()
        else:  # windows follow the clock; triggers and evictors still see the record's time
            timestamp = ctx.timestamp
            now = service.current_processing_time()
            if timestamp is None:
                timestamp = now
            watermark = service.current_watermark()
        scope = Scope(ctx, self)
        if self.sessions is not None:
            accepted = await self._merging_record(scope, value, timestamp, now, watermark)
        elif self.panes:
            accepted = await self._pane_record(scope, value, timestamp, now)
        else:
            accepted = await self._plain_record(scope, value, timestamp, now)
        if scope.pending.changes:
            await self.timers.flush(ctx, scope.pending)
        if not accepted and self.event_time and timestamp + self.lateness <= watermark:
            self._late(ctx, value, timestamp, watermark)

    def _late(self, ctx: Any, value: Any, timestamp: float, watermark: float) -> None:
        tag = self.spec.late_data_tag
        if tag is None:
            self.late_records_dropped += 1
            return
        late_output = self.spec.late_output
        ctx.side_output(
            tag, value if late_output is None else late_output(value, timestamp, watermark)
        )

    async def _plain_record(self, scope: Scope, value: Any, timestamp: float, now: float) -> bool:
        accepted = False
        watermark = scope.ctx.timer_service.current_watermark()
        for window in self.assigner.assign_windows(
            value, now if not self.event_time else timestamp
        ):
            if self.is_late(window, watermark):
                continue
            accepted = True
            existed = await self.contents.add(window, value, timestamp)
            if self.fast and existed and window.end > now:
                continue  # its timers are registered and the built-in trigger would continue
            await self._element_trigger(scope, window, value, timestamp)
            if not existed:
                self._register_cleanup(scope, window)
        return accepted

    async def _pane_record(self, scope: Scope, value: Any, timestamp: float, now: float) -> bool:
        panes = self.contents
        pane = panes.pane(timestamp if self.event_time else now)
        watermark = scope.ctx.timer_service.current_watermark()
        live = [w for w in panes.windows_of_pane(pane) if not self.is_late(w, watermark)]
        if not live:
            return False
        existed = await panes.add_pane(pane, value)
        for window in live:
            if existed and window.end > now:
                continue  # registered when the pane was made; nothing fires yet
            await self._element_trigger(scope, window, value, timestamp)
            if not existed:
                self._register_cleanup(scope, window)
        return True

    async def _merging_record(
        self, scope: Scope, value: Any, timestamp: float, now: float, watermark: float
    ) -> bool:
        sessions = list(await self.sessions.async_value() or ())
        before = list(sessions)
        accepted = False
        for window in self.assigner.assign_windows(value, timestamp if self.event_time else now):
            actual, merged = add_session(sessions, window)
            if merged:
                await _settle(self.trigger.on_merge(actual, TriggerContext(scope, actual, merged)))
                for old in merged:
                    await _settle(self.trigger.clear(old, TriggerContext(scope, old)))
                    self._delete_cleanup(scope, old)
                await self.contents.merge_windows(actual, merged)
            if self.is_late(actual, watermark):
                sessions.remove(actual)  # Flink's retireWindow
                continue
            accepted = True
            existed = await self.contents.add(actual, value, timestamp)
            await self._element_trigger(scope, actual, value, timestamp)
            if merged or not existed:
                self._register_cleanup(scope, actual)
        if sessions != before:
            await self.sessions.async_update(tuple(sessions) or None)
        return accepted

    async def _element_trigger(self, scope: Scope, window: Any, value: Any, timestamp: float):
        trigger = self.trigger
        result = await resolve(
            trigger.on_element(value, timestamp, window, TriggerContext(scope, window)), trigger
        )
        if result.is_fire:
            await self._emit(scope, window, await self.contents.read(window))
        if result.is_purge:
            await self.contents.clear(window)

    # -- firing ------------------------------------------------------------------------------
    async def _emit(self, scope: Scope, window: Any, stored: Any) -> None:
        """Emit a firing window's result (nothing when the window is empty)."""
        if stored is None:
            return
        evictor = self.evictor
        if evictor is not None:
            kept = evictor.evict_before(list(stored), window)
            elements = self.contents.elements(kept)
        else:
            elements = self.contents.elements(stored)
        ctx = scope.ctx
        process = self.process_fn
        if process is not None:
            results = process.process(
                ctx.current_key, ProcessWindowContext(scope, window), elements
            )
            if results is not None and hasattr(results, "__await__"):
                results = await results
            for result in results or ():
                ctx.output(result)
        elif self.spec.folds:
            for result in elements:
                ctx.output(result)
        else:
            ctx.output(elements)
        if evictor is not None:
            remaining = evictor.evict_after(kept, window)
            if remaining != list(stored):
                await self.contents.write(window, remaining)

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        return self._on_timer(timestamp, ctx)

    async def _on_timer(self, time: float, ctx: Any) -> None:
        scope = Scope(ctx, self)
        if self.fast:
            await self._fire_implied(scope, time)
        else:
            await self._fire_indexed(scope, ctx.timer_domain, time)
        if scope.pending.changes:
            await self.timers.flush(ctx, scope.pending)

    async def _fire_implied(self, scope: Scope, time: float) -> None:
        """A grid window ending at ``time`` fires; one whose cleanup time is ``time`` goes."""
        assigner, lateness = self.assigner, self.lateness
        candidates = [assigner.window_ending_at(time)]
        if self.event_time and lateness > 0 and math.isfinite(time - lateness):
            candidates.insert(0, assigner.window_ending_at(time - lateness))
        for window in candidates:
            if window is None:
                continue
            stored = await self.contents.read(window)
            if stored is None:
                continue
            if window.end == time:
                await self._emit(scope, window, stored)
            if self.cleanup_time(window) == time:
                await self._clear_all(scope, window)

    async def _fire_indexed(self, scope: Scope, domain: str, time: float) -> None:
        windows = sorted(await self.timers.take(domain, time), key=_by_end)
        if not windows:
            return
        sessions = None
        if self.sessions is not None:
            sessions = list(await self.sessions.async_value() or ())
            before = list(sessions)
        trigger = self.trigger
        cleanup_domain = EVENT if self.event_time else PROCESSING
        for window in windows:
            if sessions is not None and window not in sessions:
                continue  # merged away or retired (Flink: no state window)
            tctx = TriggerContext(scope, window)
            if domain == EVENT:
                result = trigger.on_event_time(time, window, tctx)
            else:
                result = trigger.on_processing_time(time, window, tctx)
            result = await resolve(result, trigger)
            if result.is_fire:
                await self._emit(scope, window, await self.contents.read(window))
            if result.is_purge:
                await self.contents.clear(window)
            if domain == cleanup_domain and time == self.cleanup_time(window):
                await self._clear_all(scope, window)
                if sessions is not None:
                    sessions.remove(window)
        if sessions is not None and sessions != before:
            await self.sessions.async_update(tuple(sessions) or None)

    async def _clear_all(self, scope: Scope, window: Any) -> None:
        """Flink's ``clearAllState``: contents, trigger state and timers, function state."""
        await self.contents.clear(window)
        await _settle(self.trigger.clear(window, TriggerContext(scope, window)))
        process = self.process_fn
        if process is not None and hasattr(process, "clear"):
            await _settle(process.clear(ProcessWindowContext(scope, window)))


def _by_end(window: Any) -> tuple[float, float]:
    return (window.end, window.start)
