"""The pane callback driver: sliding windows kept as panes in chain mode, plain
(``aec.windowing.path``), as StateFuture callbacks (no coroutine).

A key's live panes are one value (``window-panes``, see ``aec.windowing.panes``). A
record is one read and one write of it, as for a tumbling window; a new pane starts
the chain at its first window not fired yet (``BuiltinTrigger.chain_start``). A
firing reads it once, fires what ``Panes.chain`` lists (in event time, every window
of the key that the firing's watermark makes due, in order; their own timers are
deleted) and writes it once if panes went: with a 5-minute slide and watermarks far
apart, a key's windows of one watermark cost one firing, one read and one write. Per
key the outputs and their order are those of one firing per window.
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import cast

from aec.elements import Time
from aec.functions import Context
from aec.runtime.bundle import BundleContext
from aec.windowing.contents import AggregateContents
from aec.windowing.grid import Panes
from aec.windowing.panes import LivePanes, PaneContents
from aec.windowing.protocol import WindowFunction
from aec.windowing.windows import TimeWindow


class PanesDriver:
    """Records and timers of sliding windows as panes in chain mode (see the module)."""

    def __init__(self, function: WindowFunction) -> None:
        self.function = function
        self.panes = cast(Panes, function.panes)  # this driver: panes
        self.rules = function.rules
        self.contents = cast(PaneContents, function.contents)
        self.live = self.contents.live_state()  # chain mode: the key's panes are one value
        self.event_time = function.event_time
        inner = self.contents.inner
        # an aggregate without a process function: merge_fresh and elements inlined in
        # the firing (the same calls in the same order)
        plain = function.process_fn is None
        self.aggregate = inner.function if plain and type(inner) is AggregateContents else None
        if self.aggregate is not None:  # bound once: the firing's inner loop
            self.create = self.aggregate.create_accumulator
            self.merge = self.aggregate.merge
            self.result = self.aggregate.get_result

    def on_record(self, value: object, ctx: Context) -> None:
        """``process_element``: the record's pane is read and written; a new pane starts
        the chain."""
        service = ctx.timer_service
        watermark = service.current_watermark()
        timestamp = ctx.timestamp
        event_time = self.event_time
        if event_time:
            if timestamp is None:
                raise self.function.missing_timestamp(value, ctx)
            at = timestamp
        else:  # panes follow the clock; a late side output needs event time
            at = service.current_processing_time()
        panes, rules = self.panes, self.rules
        j = panes.pane(at)
        if rules.is_late(panes.end(j // panes.r), watermark):
            # the pane's latest window is cleaned (no lateness): so are all the others
            if rules.is_late_record(timestamp, watermark):
                self.function.late(ctx, value, timestamp, watermark)
            return
        live, fold = self.live, self.contents.inner.fold

        def folded(held: LivePanes | None) -> None:
            found = dict(held) if held else {}  # the stored value is never changed in place
            stored = found.get(j)
            found[j] = fold(stored, value, 0.0)
            live.async_update(found)
            if stored is not None:
                return  # the pane's chain runs
            start = rules.chain_start(panes, j, watermark)
            if event_time:
                service.register_event_time_timer(start)
            else:
                service.register_processing_time_timer(start)

        live.async_value().on_complete(folded)

    def on_timer(self, time: Time, ctx: Context) -> None:
        """The chain's firing: the window ending at ``time`` and, in event time, every
        later window of the key the watermark makes due (``fire_due``); one read of the
        key's panes, one write if panes went."""
        k = self.panes.ending_at(time)
        if k is None:
            return
        due = ctx.timer_service.current_watermark() if self.event_time else time
        live = self.live

        def fire(held: LivePanes | None) -> None:
            if not held:
                return  # no pane left: no window to fire, no chain to continue
            found = dict(held)
            if self.fire_due(ctx, found, k, due, time):
                live.async_update(found or None)  # the firing's own request: it holds the key

        # a callback, not a chain of derived futures: the pending read keeps the firing
        # in flight
        live.async_value().on_complete(fire)

    def fire_due(
        self, ctx: Context, found: LivePanes, k: int, due: Time, firing: Time = math.nan,
        flush: BundleContext | None = None,
    ) -> bool:  # fmt: skip
        """Fire what ``Panes.chain`` lists for the key's panes ``found`` (index ->
        accumulator, changed in place) from window ``k`` up to ``due``: emit each window,
        delete its timer (event time; none at ``firing``, the firing timer's time), drop
        its last-use panes from ``found``, and register the chain's next timer. True when
        panes went (``found`` is to be written). A bundle's ``flush`` firing them
        instead of the chain's timer names that timer (the first window's end)."""
        indexes = sorted(found)
        fired, next_end = self.panes.chain(indexes, k, due)
        service = ctx.timer_service
        event_time = self.event_time
        output, aggregate = ctx.output, self.aggregate
        plain = self.function.process_fn is None  # outputs need no window object
        # with no user code holding a context in the loop, the key's timers change only by
        # our deletes, so absent ones are skipped (most fired windows have no timer of
        # their own: one chain timer per key); asked once, when a window needs it
        timers: Container[Time] | None = None
        if flush is not None and fired:
            flush.firing = fired[0][1]  # the chain's timer, which fires them all at once
        for start, end, lo, hi, cut in fired:
            if aggregate is not None:  # merge_fresh and elements, inlined
                accumulator = self.create()
                merge = self.merge
                for j in indexes[lo:hi]:
                    accumulator = merge(accumulator, found[j])
                output(self.result(accumulator))
            else:
                inner = self.contents.inner
                merged = inner.merge_fresh([found[j] for j in indexes[lo:hi]])
                if plain:
                    for result in inner.elements(merged):
                        output(result)
                else:
                    self.function.emit(ctx, TimeWindow.trusted(start, end), merged)
            if event_time and end != firing:
                if not plain:
                    service.delete_event_time_timer(end)  # a no-op when absent
                else:
                    if timers is None:
                        timers = service.timer_times("event-time")
                    if end in timers:
                        service.delete_event_time_timer(end)  # fires here, now
            for j in indexes[lo:cut]:  # the window's last-use panes
                del found[j]
        if next_end is not None:
            if event_time:
                service.register_event_time_timer(next_end)
            else:
                service.register_processing_time_timer(next_end)
        return len(found) < len(indexes)
