"""The tumbling callback driver: tumbling windows with the built-in trigger, plain
(``aec.windowing.path``), as StateFuture callbacks (no coroutine).

A record is one read and one write of its window (``(start, end)`` in
``window-contents``): the window object is made only when it fires. A timer at ``t``
fires the window ending at ``t`` and removes the one whose cleanup time is ``t``. The
rules are the grid's (``Grid.slot``) and the built-in trigger's
(``BuiltinTrigger.on_element``, ``grid_timer``); the same function on the coroutine
driver gives the same results (the property tests compare both with the synchronous
run and a reference model).
"""

from __future__ import annotations

import math
from typing import cast

from aec.elements import Time
from aec.functions import Context
from aec.windowing.contents import Contents
from aec.windowing.grid import Grid
from aec.windowing.protocol import WindowFunction
from aec.windowing.windows import TimeWindow


class TumblingDriver:
    """Records and timers of a tumbling window function as callbacks (see the module)."""

    def __init__(self, function: WindowFunction) -> None:
        self.function = function
        self.grid = cast(Grid, function.grid)  # tumbling: a grid
        self.rules = function.rules
        self.contents = cast(Contents, function.contents)  # tumbling: no panes
        self.store = self.contents.store
        self.event_time = function.event_time
        self.lateness = function.lateness

    def on_record(self, value: object, ctx: Context) -> None:
        """``process_element``: the record's window is read and written once."""
        function, rules = self.function, self.rules
        service = ctx.timer_service
        watermark = service.current_watermark()
        event_time = self.event_time
        if event_time:
            timestamp = ctx.timestamp
            if timestamp is None:
                raise function.missing_timestamp(value, ctx)
            now = watermark
            start, end = self.grid.slot(timestamp)
            if rules.is_late(end, watermark):
                if rules.is_late_record(timestamp, watermark):
                    function.late(ctx, value, timestamp, watermark)
                return
        else:
            now = service.current_processing_time()
            timestamp = ctx.timestamp
            if timestamp is None:
                timestamp = now
            start, end = self.grid.slot(now)
        contents, store, key = self.contents, self.store, (start, end)

        def fold(stored: object) -> None:
            folded = contents.fold(stored, value, timestamp)
            store.async_put(key, folded)
            fire, timers = rules.on_element(end, now, stored is None)
            if timers:
                if event_time:
                    for time in timers:
                        service.register_event_time_timer(time)
                else:
                    for time in timers:
                        service.register_processing_time_timer(time)
            if fire:  # a late firing, with what was just stored
                function.emit(ctx, TimeWindow.trusted(start, end), folded)

        # a callback, not then_compose: no derived future per record (the pending read
        # keeps the record in flight; the put is this record's like any request)
        store.async_get(key).on_complete(fold)

    def on_timer(self, time: Time, ctx: Context) -> None:
        """The window ending at ``time`` fires; the one whose cleanup time
        (``end + allowed_lateness``) is ``time`` is removed."""
        lateness = self.lateness
        if self.event_time and 0 < lateness < math.inf:
            if ctx.timer_service.current_watermark() == math.inf:
                self._at_end_of_input(time, ctx)
                return
        grid, store, function = self.grid, self.store, self.function
        fires, cleans = self.rules.grid_timer(grid, time)
        if cleans == fires:  # one window fires and goes: a single read, no combining
            if fires is None:
                return
            slot = (grid.start(fires), grid.end(fires))

            def fire(stored: object) -> None:
                if stored is not None:
                    function.emit(ctx, TimeWindow.trusted(*slot), stored)
                    store.async_remove(slot)  # the firing's own request: it holds the key

            store.async_get(slot).on_complete(fire)
            return
        if cleans is not None:  # an absent window's removal is a no-op: no read first
            store.async_remove((grid.start(cleans), grid.end(cleans)))
        if fires is not None:
            window = grid.window(fires)

            def fire_only(stored: object) -> None:
                if stored is not None:
                    function.emit(ctx, window, stored)

            store.async_get((window.start, window.end)).on_complete(fire_only)

    def _at_end_of_input(self, time: Time, ctx: Context) -> None:
        """The key's first firing at watermark inf (end of input), with allowed lateness:
        every timer of the key is due now, ``time`` is its earliest. Instead of one firing
        per window end and per cleanup time, this one reads the key's windows (all are
        due: each is cleaned), fires those not fired yet (``end >= time``: an earlier end
        fired at an earlier watermark) in order of end, clears them all and deletes the
        key's later timers. Per key: the outputs and final state of the separate firings."""
        store, function, cleanup_time = self.store, self.function, self.rules.cleanup_time
        service = ctx.timer_service
        found: list[tuple[tuple[Time, Time], object]] = []

        def fire(_: object) -> None:
            found.sort(key=_by_end)
            for (start, end), stored in found:
                if end >= time:
                    function.emit(ctx, TimeWindow.trusted(start, end), stored)
                    if end > time:
                        service.delete_event_time_timer(end)
                cleanup = cleanup_time(end)
                if cleanup > time:
                    service.delete_event_time_timer(cleanup)
            if found:
                store.async_clear()  # the firing's own request: it holds the key

        store.async_entries().on_complete(
            lambda entries: entries.on_next(found.append).on_complete(fire)
        )


def _by_end(entry: tuple[tuple[Time, Time], object]) -> Time:
    return entry[0][1]
