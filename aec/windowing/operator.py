"""``window(...)``: windows as a ``KeyedProcessFunction`` (Flink's ``WindowOperator``,
``EvictingWindowOperator`` and ``AsyncWindowOperator``, merging windows included).

All window state is state of the function's backend, per key and window,
reached through the AEC like any state request: contents (``window-contents``),
trigger and ``ProcessWindowFunction`` state (``window-trigger.<name>``,
``window-process.<name>``), the timer index (``window-timers``) and, for
sessions, the merging-window set (``window-sessions``: the key's windows, a
single value; on the session path, ``aec.windowing.session_path``, a key's sessions
and their contents are one value instead). Timers are the engine's per-key timers.
So windows batch, run asynchronously, checkpoint, rescale and pass
``assert_equivalent`` as any keyed function does. See ``docs/windows.md``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol, cast

from aec.functions import KeyedProcessFunction, RuntimeContext
from aec.state.descriptors import MapStateDescriptor, StateDescriptor, ValueStateDescriptor
from aec.state.handles import ValueState
from aec.windowing import bundle_path, hot_path, pane_path, panes, session_path
from aec.windowing.assigners import SlidingEventTimeWindows, WindowAssigner
from aec.windowing.contents import Contents
from aec.windowing.context import (
    ProcessWindowContext,
    ProcessWindowFunction,
    Scope,
    TriggerContext,
    window_handle,
)
from aec.windowing.evictors import Evictor
from aec.windowing.merging import add_session, decode_sessions, encode_sessions
from aec.windowing.panes import PaneContents
from aec.windowing.timers import EVENT, PROCESSING, PendingTimers, WindowTimers
from aec.windowing.triggers import (
    EventTimeTrigger,
    ProcessingTimeTrigger,
    Trigger,
    TriggerResult,
    resolve,
)


class _Window(Protocol):
    """What the operator reads of any window (``TimeWindow``, ``GlobalWindow``, a
    custom assigner's): its end, seconds."""

    @property
    def end(self) -> float: ...


async def _settle(result: Any) -> None:
    """Await what a trigger's ``on_merge``/``clear`` or a ``clear`` returned, if anything."""
    if result is not None and hasattr(result, "__await__"):
        await result


class WindowOperatorFunction(KeyedProcessFunction):
    """The function ``window(...)`` returns; see ``aec.windowing.window``."""

    # from the spec (an ``aec.windowing.spec.WindowSpec``, whose module imports this one)
    assigner: WindowAssigner
    trigger: Trigger
    evictor: Evictor | None
    event_time: bool
    lateness: float

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.late_records_dropped = 0

    # -- set-up ------------------------------------------------------------------------------
    def _configure(self) -> bool:
        """The spec's fields and the choice of paths that need no state; True when the
        session path keeps a key's sessions and their contents as one value."""
        spec = self.spec
        assigner = spec.assigner
        self.assigner, self.trigger, self.evictor = assigner, spec.trigger, spec.evictor
        self.process_fn, self.lateness = spec.process, spec.allowed_lateness
        self.event_time = assigner.event_time
        builtin = EventTimeTrigger if self.event_time else ProcessingTimeTrigger
        # implicit timers: a time grid with the built-in trigger (see aec.windowing.timers)
        self.fast = (
            not assigner.merging
            and type(self.trigger) is builtin
            and isinstance(assigner, SlidingEventTimeWindows)
        )
        # sessions with the built-in trigger imply their timers too: a firing at t finds
        # the sessions ending (or cleaned) at t in the key's session set, read anyway
        self.implied = self.fast or (assigner.merging and type(self.trigger) is builtin)
        process = self.process_fn
        # ProcessWindowFunction.clear is a no-op unless overridden: skip the call then
        self.clears = process is not None and getattr(type(process), "clear", None) not in (
            None,
            ProcessWindowFunction.clear,
        )
        # the session path keeps a key's sessions and their contents as one value (one
        # read and one write per record); every other path, the set apart from the contents
        return hot_path.plain(self) and session_path.applies(self)

    def open(self, ctx: RuntimeContext) -> None:
        spec = self.spec
        assigner = spec.assigner
        self._runtime = ctx
        self._stores: dict[str, Any] = {}
        ctx.get_state(ValueStateDescriptor(self.assigner_marker()))  # a name, never written
        together = self._configure()
        process = self.process_fn
        store = None if together else ctx.get_state(MapStateDescriptor("window-contents"))
        self.contents: Contents | PaneContents = spec.make_contents(store)
        index = None if self.implied else ctx.get_state(MapStateDescriptor("window-timers"))
        self.timers = WindowTimers(index, self.implied)
        self.together: ValueState | None = (
            ctx.get_state(ValueStateDescriptor(session_path.STATE)) if together else None
        )
        merging = assigner.merging and not together
        self.sessions = ctx.get_state(ValueStateDescriptor("window-sessions")) if merging else None
        if self.fast and spec.pane is not None:
            # without lateness a key's live panes are its firing window's and a few ahead:
            # one scan beats a read per pane (see PaneContents.read)
            chain = self.lateness == 0 or not self.event_time
            self.contents = PaneContents(self.contents, assigner, spec.pane, chain)
        self.panes = isinstance(self.contents, PaneContents)
        if process is not None and hasattr(process, "open"):
            process.open(ctx)
        # callback-style paths (no coroutine per record) where they apply
        self.hot: Any = None
        if hot_path.plain(self):
            for path in (hot_path, pane_path, session_path):
                if path.applies(self):
                    self.hot = path
                    break

    def open_bundle(self) -> Any:
        """The operator's hook (``aec.runtime.bundle``): a ``Bundle`` of on-time records
        for the callback paths in event time (``aec.windowing.bundle_path``), or None."""
        return bundle_path.make(self)

    def assigner_marker(self) -> str:
        """A state name naming the assigner: in the checkpoint's state names, so a
        restore into a function with another assigner is refused (``check_restore``)."""
        return f"window-assigner={self.spec.assigner.describe()}"

    def check_restore(self, state_names: list[str]) -> None:
        """Called by the operator's ``restore`` with the checkpoint's state names.

        Raises:
            ValueError: the checkpoint was taken with another window assigner.
        """
        theirs = [n for n in state_names if n.startswith("window-assigner=")]
        mine = self.assigner_marker()
        if theirs and theirs != [mine]:
            raise ValueError(
                f"the checkpoint holds windows of {theirs[0].split('=', 1)[1]}; this "
                f"function's assigner is {self.spec.assigner.describe()}: windows would not match"
            )
        # sessions are kept with their contents on the session path only: the other
        # layout's state would restore unread
        together = session_path.STATE in state_names
        if (together or "window-sessions" in state_names) and together != self._configure():
            layouts = ("apart from", "with")
            raise ValueError(
                f"the checkpoint keeps sessions {layouts[together]} their contents; this "
                f"function keeps them {layouts[not together]} theirs (trigger, evictor or "
                "process function changed, or a checkpoint of an earlier version)"
            )

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
    def is_late(self, window: _Window, watermark: float) -> bool:
        """Flink's ``isWindowLate``: an event-time window cleaned up at this watermark."""
        return self.event_time and window.end + self.lateness <= watermark

    def cleanup_time(self, window: _Window) -> float:
        return window.end + self.lateness if self.event_time else window.end

    def _register_cleanup(self, scope: Scope, window: Any) -> None:
        time = self.cleanup_time(window)
        if self.fast and time == window.end:
            return  # the built-in trigger's timer at ``end`` is the same engine timer
        if time != math.inf:  # a global window is never cleaned (Flink)
            domain = EVENT if self.event_time else PROCESSING
            self.timers.register(scope.ctx, scope.pending, domain, time, window)

    def _delete_cleanup(self, scope: Scope, window: Any) -> None:
        domain = EVENT if self.event_time else PROCESSING
        self.timers.delete(scope.pending, domain, self.cleanup_time(window), window)

    # -- records -----------------------------------------------------------------------------
    def process_element(self, value: Any, ctx: Any) -> Any:
        hot = self.hot
        if hot is not None:
            return hot.on_record(self, value, ctx)
        return self._on_record(value, ctx)

    def missing_timestamp(self, value: Any, ctx: Any) -> ValueError:
        return ValueError(
            f"record {value!r} of key {ctx.current_key!r} has no timestamp: the "
            f"event-time window assigner {self.assigner!r} needs Record(key, value, timestamp)"
        )

    async def _on_record(self, value: Any, ctx: Any) -> None:
        service = ctx.timer_service
        if self.event_time:
            timestamp = ctx.timestamp
            if timestamp is None:
                raise self.missing_timestamp(value, ctx)
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
            accepted = await panes.on_record(self, scope, value, timestamp, now, watermark)
        else:  # inline (not a sub-coroutine): this is the hot path of tumbling windows
            if TYPE_CHECKING:  # not panes: Contents (narrowed for mypy, no runtime check)
                assert isinstance(self.contents, Contents)
            accepted = False
            for window in self.assigner.assign_windows(
                value, now if not self.event_time else timestamp
            ):
                if self.is_late(window, watermark):
                    continue
                accepted = True
                existed = await self.contents.add(window, value, timestamp)
                if not self.fast:
                    await self._element_trigger(scope, window, value, timestamp)
                elif existed and window.end > now:
                    continue  # its timers are registered and the built-in trigger continues
                elif self._builtin_element(scope, window, now):
                    await _settle(self._emit(scope, window, await self.contents.read(window)))
                if not existed:
                    self._register_cleanup(scope, window)
        pending = scope.pending
        if pending is not None and pending.changes:
            await self.timers.flush(ctx, pending)
        if not accepted and self.event_time and timestamp + self.lateness <= watermark:
            self._late(ctx, value, timestamp, watermark)

    def _builtin_element(self, scope: Scope, window: Any, now: float) -> bool:
        """``EventTimeTrigger``/``ProcessingTimeTrigger.on_element`` inlined (fast path):
        True to fire now (a late firing), else the timer at ``end`` is registered."""
        service = scope.ctx.timer_service
        if self.event_time:
            if window.end <= now:
                return True
            service.register_event_time_timer(window.end)
        else:
            service.register_processing_time_timer(window.end)
        return False

    def _late(self, ctx: Any, value: Any, timestamp: float, watermark: float) -> None:
        tag = self.spec.late_data_tag
        if tag is None:
            self.late_records_dropped += 1
            return
        late_output = self.spec.late_output
        ctx.side_output(
            tag, value if late_output is None else late_output(value, timestamp, watermark)
        )

    async def _merging_record(
        self, scope: Scope, value: Any, timestamp: float, now: float, watermark: float
    ) -> bool:
        state = cast(ValueState, self.sessions)  # merging windows: a session set
        contents = cast(Contents, self.contents)  # sessions never keep panes
        sessions = decode_sessions(await state.async_value())
        before = list(sessions)
        accepted = False
        for window in self.assigner.assign_windows(value, timestamp if self.event_time else now):
            actual, merged = add_session(sessions, window)
            if merged:
                await _settle(self.trigger.on_merge(actual, TriggerContext(scope, actual, merged)))
                for old in merged:
                    await _settle(self.trigger.clear(old, TriggerContext(scope, old)))
                    self._delete_cleanup(scope, old)
                await contents.merge_windows(actual, merged)
            if self.is_late(actual, watermark):
                sessions.remove(actual)  # Flink's retireWindow
                continue
            accepted = True
            existed = await contents.add(actual, value, timestamp)
            await self._element_trigger(scope, actual, value, timestamp)
            if merged or not existed:
                self._register_cleanup(scope, actual)
        if sessions != before:
            state.async_update(encode_sessions(sessions))  # not awaited (see add)
        return accepted

    async def _element_trigger(
        self, scope: Scope, window: Any, value: Any, timestamp: float
    ) -> None:
        context = TriggerContext(scope, window)
        await self._act(scope, window, self.trigger.on_element(value, timestamp, window, context))

    async def _act(self, scope: Scope, window: Any, result: Any) -> None:
        """Carry out a trigger's decision: FIRE emits, PURGE clears the contents."""
        if type(result) is not TriggerResult:
            result = await resolve(result, self.trigger)
        if result.is_fire():
            await _settle(self._emit(scope, window, await self.contents.read(window)))
        if result.is_purge():
            self.contents.clear(window)

    # -- firing ------------------------------------------------------------------------------
    def _emit(self, scope: Scope, window: Any, stored: Any) -> Any:
        """Emit a firing window's result (nothing when the window is empty). Returns
        None, or an awaitable when an ``async def`` process function must finish."""
        if stored is None:
            return None
        evictor = self.evictor
        if evictor is not None:
            kept = evictor.evict_before(list(stored), window)
            elements = self.contents.elements(kept)
            remaining = evictor.evict_after(kept, window)
            if remaining != list(stored):
                # evictors keep every element, never panes; not awaited (see Contents.add)
                cast(Contents, self.contents).write(window, remaining)
        else:
            elements = self.contents.elements(stored)
        ctx = scope.ctx
        process = self.process_fn
        if process is not None:
            results = process.process(
                ctx.current_key, ProcessWindowContext(scope, window), elements
            )
            if results is not None and hasattr(results, "__await__"):
                return _output_all(ctx, results)
            for result in results or ():
                ctx.output(result)
        elif self.spec.folds:
            for result in elements:
                ctx.output(result)
        else:
            ctx.output(elements)
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        hot = self.hot
        if hot is not None:
            return hot.on_timer(self, timestamp, ctx)
        return self._on_timer(timestamp, ctx)

    async def _on_timer(self, time: float, ctx: Any) -> None:
        scope = Scope(ctx, self)
        if not self.fast:
            if self.implied:
                await self._fire_sessions(scope, time)
            else:
                await self._fire_indexed(scope, ctx.timer_domain, time)
            pending = cast(PendingTimers, scope.pending)  # not fast: timers are buffered
            if pending.changes:
                await self.timers.flush(ctx, pending)
            return
        if self.panes and cast(PaneContents, self.contents).chain:
            await panes.on_chain_timer(self, scope, time)
            return
        # implied timers: the grid window ending at ``time`` fires, the one whose
        # cleanup time is ``time`` goes
        assigner = cast(SlidingEventTimeWindows, self.assigner)  # fast: a time grid
        lateness = self.lateness
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
                pending = self._emit(scope, window, stored)
                if pending is not None:
                    await pending
            if self.cleanup_time(window) == time:
                pending = self._clear_all(scope, window)
                if pending is not None:
                    await pending

    async def _fire_sessions(self, scope: Scope, time: float) -> None:
        """Sessions with the built-in trigger: those ending at ``time`` fire, those whose
        cleanup time is ``time`` go (a timer of a merged-away session finds nothing)."""
        state = cast(ValueState, self.sessions)  # implied, not fast: sessions
        sessions = decode_sessions(await state.async_value())
        due = [w for w in sessions if w.end == time or self.cleanup_time(w) == time]
        cleaned = False
        for window in sorted(due, key=_by_end):
            if window.end == time:
                await _settle(self._emit(scope, window, await self.contents.read(window)))
            if self.cleanup_time(window) == time:
                await _settle(self._clear_all(scope, window))
                sessions.remove(window)
                cleaned = True
        if cleaned:
            state.async_update(encode_sessions(sessions))  # not awaited (see add)

    async def _fire_indexed(self, scope: Scope, domain: str, time: float) -> None:
        windows = sorted(await self.timers.take(domain, time), key=_by_end)
        if not windows:
            return
        sessions = None
        if self.sessions is not None:
            sessions = decode_sessions(await self.sessions.async_value())
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
            await self._act(scope, window, result)
            if domain == cleanup_domain and time == self.cleanup_time(window):
                await _settle(self._clear_all(scope, window))
                if sessions is not None:
                    sessions.remove(window)
        if sessions is not None and sessions != before:  # sessions: self.sessions is set
            cast(ValueState, self.sessions).async_update(encode_sessions(sessions))  # not awaited

    def _clear_all(self, scope: Scope, window: Any) -> Any:
        """Flink's ``clearAllState``: contents, trigger state and timers, function state.
        Returns None, or an awaitable when a ``clear`` is asynchronous."""
        self.contents.clear(window)  # not awaited: later requests of this key queue after it
        if not self.fast:  # the built-in triggers' implicit timers need no deleting
            cleared = self.trigger.clear(window, TriggerContext(scope, window))
            if cleared is not None and hasattr(cleared, "__await__"):
                return self._clear_after(scope, window, cleared)
        return self._clear_process(scope, window)

    async def _clear_after(self, scope: Scope, window: Any, cleared: Any) -> None:
        await cleared
        await _settle(self._clear_process(scope, window))

    def _clear_process(self, scope: Scope, window: Any) -> Any:
        if self.clears:
            cleared = self.process_fn.clear(ProcessWindowContext(scope, window))
            if cleared is not None and hasattr(cleared, "__await__"):
                return cleared
        return None


async def _output_all(ctx: Any, results: Any) -> None:
    for result in await results or ():
        ctx.output(result)


def _by_end(window: Any) -> tuple[float, float]:
    return (window.end, window.start)
