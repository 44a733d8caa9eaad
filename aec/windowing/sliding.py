"""The pane callback driver: sliding windows kept as panes in chain mode, plain
(``aec.windowing.path``), as StateFuture callbacks (no coroutine).

A record is one read and one write of its pane, as for a tumbling window; a new pane
starts the chain at its first window not fired yet (``BuiltinTrigger.chain_start``).
A firing reads the key's live panes with one iteration and fires what
``Panes.chain`` lists: in event time, every window of the key that the firing's
watermark makes due, in order (their own timers are deleted): with a 5-minute slide
and watermarks far apart, a key's windows of one watermark cost one firing and one
read. Per key the outputs and their order are those of one firing per window.
"""

from __future__ import annotations

from typing import cast

from aec.functions import Context
from aec.windowing.contents import AggregateContents
from aec.windowing.grid import Panes
from aec.windowing.panes import PaneContents
from aec.windowing.protocol import WindowFunction
from aec.windowing.windows import TimeWindow


class PanesDriver:
    """Records and timers of sliding windows as panes in chain mode (see the module)."""

    def __init__(self, function: WindowFunction) -> None:
        self.function = function
        self.panes = cast(Panes, function.panes)  # this driver: panes
        self.rules = function.rules
        self.contents = cast(PaneContents, function.contents)
        self.store = self.contents.store
        self.event_time = function.event_time
        inner = self.contents.inner
        # an aggregate without a process function: merge_fresh and elements inlined in
        # the firing (the same calls in the same order)
        plain = function.process_fn is None
        self.aggregate = inner.function if plain and type(inner) is AggregateContents else None

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
            if rules.is_late_record(cast(float, timestamp), watermark):
                self.function.late(ctx, value, cast(float, timestamp), watermark)
            return
        store, fold = self.store, self.contents.inner.fold

        def folded(stored: object) -> None:
            store.async_put(j, fold(stored, value, 0.0))
            if stored is not None:
                return  # the pane's chain runs
            start = rules.chain_start(panes, j, watermark)
            if event_time:
                service.register_event_time_timer(start)
            else:
                service.register_processing_time_timer(start)

        store.async_get(j).on_complete(folded)

    def on_timer(self, time: float, ctx: Context) -> None:
        """The chain's firing: the window ending at ``time`` and, in event time, every
        later window of the key the watermark makes due (``fire_due``)."""
        k = self.panes.ending_at(time)
        if k is None:
            return
        due = ctx.timer_service.current_watermark() if self.event_time else time
        # callbacks, not a chain of derived futures: the pending scan keeps the firing in
        # flight; the key's panes (index -> accumulator) as they come (``tuple`` of a pair
        # is the pair: no Python call per entry)
        self.store.async_entries().on_complete(
            lambda entries: entries.on_next(tuple).on_complete(
                lambda pairs: self.fire_due(ctx, dict(pairs), k, due)
            )
        )

    def fire_due(
        self, ctx: Context, found: dict[int, object], k: int, due: float,
        removed: list[int] | None = None,
    ) -> None:  # fmt: skip
        """Fire what ``Panes.chain`` lists for the key's panes ``found`` (index ->
        accumulator) from window ``k`` up to ``due``: emit each window, delete its timer
        (event time), remove its last-use panes (from ``found``, and from state, or when
        ``removed`` is a list, appended to it: a bundle rewrites the key's panes), and
        register the chain's next timer."""
        indexes = sorted(found)
        fired, next_end = self.panes.chain(indexes, k, due)
        service = ctx.timer_service
        event_time = self.event_time
        function, store, inner = self.function, self.store, self.contents.inner
        output, aggregate = ctx.output, self.aggregate
        plain = function.process_fn is None  # outputs need no window object
        # with no user code holding a context in the loop, the key's timers change only by
        # our deletes, so absent ones are skipped (most fired windows have no timer of
        # their own: one chain timer per key)
        timers = service.timer_times("event-time") if event_time and plain else None
        for start, end, lo, hi, cut in fired:
            if aggregate is not None:
                accumulator = aggregate.create_accumulator()
                for j in indexes[lo:hi]:
                    accumulator = aggregate.merge(accumulator, found[j])
                output(aggregate.get_result(accumulator))
            elif plain:
                for result in inner.elements(inner.merge_fresh([found[j] for j in indexes[lo:hi]])):
                    output(result)
            else:
                merged = inner.merge_fresh([found[j] for j in indexes[lo:hi]])
                function.emit(ctx, TimeWindow.trusted(start, end), merged)
            if event_time and (timers is None or end in timers):
                service.delete_event_time_timer(end)  # fires here, now (a no-op if firing)
            for j in indexes[lo:cut]:  # the window's last-use panes
                del found[j]
                if removed is None:
                    store.async_remove(j)  # later requests of this key queue after it
                else:
                    removed.append(j)
        if next_end is not None:
            if event_time:
                service.register_event_time_timer(next_end)
            else:
                service.register_processing_time_timer(next_end)
