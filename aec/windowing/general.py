"""The coroutine driver: every window kind, trigger and evictor (Flink's
``WindowOperator`` and ``EvictingWindowOperator``, merging windows included).

Records and timers run as ``async def`` (one coroutine per invocation, suspended at
each awaited state access). Where the path is plain, the callback drivers
(``aec.windowing.tumbling``, ``sliding``, ``sessions``) run the same rules without a
coroutine. The rules themselves are not here: the grid is ``aec.windowing.grid``'s,
the built-in trigger's decisions ``aec.windowing.builtin``'s, the session cover
``aec.windowing.merging``'s; a user trigger decides through its ``TriggerContext``
(timers in the ``window-timers`` index, ``aec.windowing.timers``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import cast

from aec.functions import Context
from aec.windowing.builtin import by_end
from aec.windowing.contents import Contents
from aec.windowing.context import Scope, TriggerContext
from aec.windowing.grid import Grid, Panes
from aec.windowing.merging import add_session, decode_sessions, encode_sessions
from aec.windowing.panes import LivePanes, PaneContents
from aec.windowing.process import ProcessWindowContext
from aec.windowing.protocol import WindowFunction
from aec.windowing.timers import EVENT, PROCESSING
from aec.windowing.triggers import TriggerResult, resolve
from aec.windowing.windows import TimeWindow, Window


async def settle(result: object) -> None:
    """Await what a trigger's ``on_merge``/``clear``, a ``clear`` or an emission
    returned, if it is awaitable."""
    if result is not None and isinstance(result, Awaitable):
        await result


def register(ctx: Context, event_time: bool, times: Iterable[float]) -> None:
    """Register the engine timers ``times`` of the current key in the domain."""
    service = ctx.timer_service
    add = service.register_event_time_timer if event_time else service.register_processing_time_timer
    for time in times:
        add(time)


class GeneralDriver:
    """Records and timers of a window function as coroutines (see the module)."""

    def __init__(self, function: WindowFunction) -> None:
        self.function = function
        self.rules = function.rules
        self.path = function.path
        self.domain = EVENT if function.event_time else PROCESSING

    # -- records -----------------------------------------------------------------------------
    async def on_record(self, value: object, ctx: Context) -> None:
        f, rules = self.function, self.rules
        service = ctx.timer_service
        timestamp = ctx.timestamp
        if f.event_time:
            if timestamp is None:
                raise f.missing_timestamp(value, ctx)
            now = watermark = service.current_watermark()
            at = timestamp
        else:  # windows follow the clock; triggers and evictors still see the record's time
            now = at = service.current_processing_time()
            if timestamp is None:
                timestamp = now
            watermark = service.current_watermark()
        scope = Scope(ctx, f)
        if self.path.sessions is not None:
            accepted = await self._session_record(scope, value, timestamp, at, watermark)
        elif self.path.panes is not None:
            accepted = await self._pane_record(ctx, value, at, now, watermark)
        else:
            contents = cast(Contents, f.contents)  # no panes
            grid = self.path.timers == "grid"
            accepted = False
            for window in f.assigner.assign_windows(value, at):
                if rules.is_late(window.end, watermark):
                    continue
                accepted = True
                existed = await contents.add(window, value, timestamp)
                if not grid:
                    await self._element_trigger(scope, window, value, timestamp)
                    if not existed:
                        self._register_cleanup(scope, window)
                    continue
                fire, timers = rules.on_element(window.end, now, not existed)
                register(ctx, f.event_time, timers)
                if fire:  # a late firing
                    await settle(f.emit(ctx, window, await contents.read(window)))
        pending = scope.pending
        if pending is not None and pending.changes:
            await f.timers.flush(ctx, pending)
        if not accepted and rules.is_late_record(timestamp, watermark):
            f.late(ctx, value, timestamp, watermark)

    async def _pane_record(
        self, ctx: Context, value: object, at: float, now: float, watermark: float
    ) -> bool:
        """A record of a sliding window kept as panes; False if late."""
        f, rules = self.function, self.rules
        panes = cast(Panes, f.panes)
        contents = cast(PaneContents, f.contents)
        j = panes.pane(at)
        first, last = panes.windows_of(j)
        if rules.is_late(panes.end(last), watermark):
            return False  # the pane's latest window is cleaned: so are all the others
        if self.path.chain:  # the key's live panes are one value
            live = contents.live_state()
            held: LivePanes | None = await live.async_value()
            found = dict(held) if held else {}
            stored = found.get(j)
            found[j] = contents.inner.fold(stored, value, 0.0)
            live.async_update(found)  # not awaited (see Contents.add)
            if stored is None:  # no window of the pane fires now: start its chain
                register(ctx, f.event_time, (rules.chain_start(panes, j, watermark),))
            return True
        existed = await contents.add_pane(j, value)
        if existed and panes.end(first) > now:
            return True  # the pane's windows have their timers and none fires yet
        for k in range(last, first - 1, -1):
            window = panes.window(k)
            if rules.is_late(window.end, watermark):
                continue
            fire, timers = rules.on_element(window.end, now, not existed)
            register(ctx, f.event_time, timers)
            if fire:
                await settle(f.emit(ctx, window, await contents.read(window)))
        return True

    async def _session_record(
        self, scope: Scope, value: object, timestamp: float, at: float, watermark: float
    ) -> bool:
        """A record of a merging assigner (the session set apart from the contents)."""
        f = self.function
        trigger = f.trigger
        state = f.sessions
        assert state is not None  # sessions apart: the set is declared
        contents = cast(Contents, f.contents)  # sessions never keep panes
        sessions = decode_sessions(await state.async_value())
        before = list(sessions)
        accepted = False
        for window in f.assigner.assign_windows(value, at):
            # merging assigners make time windows (the session cover is theirs)
            actual, merged = add_session(sessions, cast(TimeWindow, window))
            if merged:
                await settle(trigger.on_merge(actual, TriggerContext(scope, actual, merged)))
                for old in merged:
                    await settle(trigger.clear(old, TriggerContext(scope, old)))
                    self._delete_cleanup(scope, old)
                await contents.merge_windows(actual, merged)
            if self.rules.is_late(actual.end, watermark):
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
        self, scope: Scope, window: Window, value: object, timestamp: float
    ) -> None:
        context = TriggerContext(scope, window)
        result = self.function.trigger.on_element(value, timestamp, window, context)
        await self._act(scope, window, result)

    async def _act(self, scope: Scope, window: Window, result: object) -> None:
        """Carry out a trigger's decision: FIRE emits, PURGE clears the contents."""
        f = self.function
        if type(result) is not TriggerResult:
            result = await resolve(result, f.trigger)
        if result.is_fire():
            await settle(f.emit(scope.ctx, window, await f.contents.read(window)))
        if result.is_purge():
            f.contents.clear(window)

    def _register_cleanup(self, scope: Scope, window: Window) -> None:
        """Flink's ``registerCleanupTimer`` (never for a window cleaned at ``inf``)."""
        time = self.rules.cleanup_time(window.end)
        if time != float("inf"):
            self.function.timers.register(scope.ctx, scope.pending, self.domain, time, window)

    def _delete_cleanup(self, scope: Scope, window: Window) -> None:
        time = self.rules.cleanup_time(window.end)
        self.function.timers.delete(scope.pending, self.domain, time, window)

    # -- timers ------------------------------------------------------------------------------
    async def on_timer(self, time: float, ctx: Context) -> None:
        scope = Scope(ctx, self.function)
        timers = self.path.timers
        if timers == "sessions":
            await self._fire_sessions(scope, time)
        elif timers == "index":
            await self._fire_indexed(scope, cast(str, ctx.timer_domain), time)  # a timer's
        elif self.path.chain:
            await self._fire_chain(scope, time)
        else:
            await self._fire_grid(scope, time)
        pending = scope.pending
        if pending is not None and pending.changes:
            await self.function.timers.flush(ctx, pending)

    async def _fire_grid(self, scope: Scope, time: float) -> None:
        """Grid timers (implied): the window ending at ``time`` fires, the one whose
        cleanup time is ``time`` goes (``BuiltinTrigger.grid_timer``)."""
        f, rules = self.function, self.rules
        grid = cast(Grid, f.grid)
        fires, cleans = rules.grid_timer(grid, time)
        for k in (fires,) if cleans == fires else (cleans, fires):
            if k is None:
                continue
            window = grid.window(k)
            stored = await f.contents.read(window)
            if stored is None:
                continue
            if window.end == time:
                await settle(f.emit(scope.ctx, window, stored))
            if rules.cleanup_time(window.end) == time:
                await settle(self._clear_all(scope, window))

    async def _fire_chain(self, scope: Scope, time: float) -> None:
        """Panes in chain mode: the window ending at ``time`` fires from one read of the
        key's panes and its last-use panes go (one write); the next window holding a pane
        gets the chain's timer (``Panes.chain``)."""
        f = self.function
        panes = cast(Panes, f.panes)
        contents = cast(PaneContents, f.contents)
        k = panes.ending_at(time)
        if k is None:
            return
        live = contents.live_state()
        held: LivePanes | None = await live.async_value()
        found = dict(held) if held else {}
        indexes = sorted(found)
        fired, next_end = panes.chain(indexes, k, time)
        for start, end, lo, hi, cut in fired:
            window = TimeWindow.trusted(start, end)
            merged = contents.merged([found[j] for j in indexes[lo:hi]])
            await settle(f.emit(scope.ctx, window, merged))
            for j in indexes[lo:cut]:  # its last-use panes go (written below)
                del found[j]
            await settle(self._clear_process(scope, window))  # the grid's timers: implied
        if fired and len(found) < len(indexes):
            live.async_update(found or None)  # not awaited (see Contents.add)
        if next_end is not None:
            register(scope.ctx, f.event_time, (next_end,))

    async def _fire_sessions(self, scope: Scope, time: float) -> None:
        """Sessions with the built-in trigger: those ending at ``time`` fire, those whose
        cleanup time is ``time`` go (``BuiltinTrigger.due_sessions``)."""
        f = self.function
        state = f.sessions
        assert state is not None  # implied session timers, sessions apart: the set
        sessions = decode_sessions(await state.async_value())
        cleaned = False
        for window, fires, cleans in self.rules.due_sessions(sessions, time, time):
            if fires:
                await settle(f.emit(scope.ctx, window, await f.contents.read(window)))
            if cleans:
                await settle(self._clear_all(scope, window))
                sessions.remove(window)
                cleaned = True
        if cleaned:
            state.async_update(encode_sessions(sessions))  # not awaited (see add)

    async def _fire_indexed(self, scope: Scope, domain: str, time: float) -> None:
        """A user trigger's timer: the windows indexed at ``(domain, time)``."""
        f = self.function
        windows = sorted(await f.timers.take(domain, time), key=by_end)
        if not windows:
            return
        state, sessions, before = f.sessions, None, None
        if state is not None:  # merging windows: only windows of the set fire
            sessions = decode_sessions(await state.async_value())
            before = list(sessions)
        trigger = f.trigger
        for window in windows:
            if sessions is not None and window not in sessions:
                continue  # merged away or retired (Flink: no state window)
            tctx = TriggerContext(scope, window)
            if domain == EVENT:
                result = trigger.on_event_time(time, window, tctx)
            else:
                result = trigger.on_processing_time(time, window, tctx)
            await self._act(scope, window, result)
            if domain == self.domain and time == self.rules.cleanup_time(window.end):
                await settle(self._clear_all(scope, window))
                if sessions is not None:
                    sessions.remove(window)
        if state is not None and sessions is not None and sessions != before:
            state.async_update(encode_sessions(sessions))  # not awaited (see add)

    # -- cleanup -----------------------------------------------------------------------------
    def _clear_all(self, scope: Scope, window: Window) -> Awaitable[None] | None:
        """Flink's ``clearAllState``: contents, trigger state and timers, function state.
        Returns None, or an awaitable when a ``clear`` is asynchronous."""
        f = self.function
        f.contents.clear(window)  # not awaited: later requests of this key queue after it
        if self.path.timers != "grid":  # the grid's implied timers need no deleting
            cleared = f.trigger.clear(window, TriggerContext(scope, window))
            if cleared is not None and isinstance(cleared, Awaitable):
                return self._clear_after(scope, window, cleared)
        return self._clear_process(scope, window)

    async def _clear_after(self, scope: Scope, window: Window, cleared: Awaitable[object]) -> None:
        await cleared
        await settle(self._clear_process(scope, window))

    def _clear_process(self, scope: Scope, window: Window) -> Awaitable[None] | None:
        process = self.function.process_fn
        if self.path.clears and process is not None:
            cleared = process.clear(ProcessWindowContext(self.function, scope.ctx, window))
            if cleared is not None and isinstance(cleared, Awaitable):
                return cleared
        return None
