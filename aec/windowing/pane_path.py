"""Sliding windows kept as panes, in chain mode, in callback style (no coroutine).

The chain mode of ``aec.windowing.panes`` (no allowed lateness, or processing time;
the built-in trigger; an aggregate or reduce; no evictor) has the same per-record
work as a tumbling window: one read and one write of the record's pane. Run as
``async def`` it paid two coroutines per record (the operator's and the pane's), most
of the sliding cost over tumbling; here records and the chain's firings are
StateFuture callbacks instead, with the same semantics as ``panes.on_record`` and
``panes.on_chain_timer`` (the property tests compare both against the synchronous
run and the reference model).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from aec.windowing.contents import AggregateContents
from aec.windowing.context import Scope
from aec.windowing.panes import PaneContents
from aec.windowing.windows import TimeWindow


def applies(function: Any) -> bool:
    """Whether ``function`` (a ``WindowOperatorFunction``, opened, with the
    conditions of ``hot_path.plain``) keeps panes in chain mode."""
    contents = function.contents
    return function.fast and type(contents) is PaneContents and contents.chain


def on_record(function: Any, value: Any, ctx: Any) -> Any:
    """``process_element``: the record's pane is read and written; a new pane starts
    the chain at the end of its first window not yet fired."""
    service = ctx.timer_service
    watermark = service.current_watermark()
    timestamp = ctx.timestamp
    event_time = function.event_time
    if event_time:
        if timestamp is None:
            raise function.missing_timestamp(value, ctx)
        at = timestamp
    else:  # panes follow the clock; a late side output needs event time
        at = service.current_processing_time()
    panes = function.contents
    j = panes.pane(at)
    first, last = panes.window_range(j)
    offset, slide, size = panes.offset, panes.slide, panes.size
    # as grid_window computes a window's end: bit-for-bit the same
    if event_time and offset + last * slide + size <= watermark:
        # the pane's latest window is cleaned (no lateness): so are all the others
        if timestamp <= watermark:
            function._late(ctx, value, timestamp, watermark)
        return None
    store, inner = panes.store, panes.inner

    def fold(stored: Any) -> None:
        store.async_put(j, inner.fold(stored, value, 0.0))
        if stored is not None:
            return  # the pane's chain runs
        k = first
        if event_time:
            while offset + k * slide + size <= watermark:
                k += 1
            service.register_event_time_timer(offset + k * slide + size)
        else:
            service.register_processing_time_timer(offset + k * slide + size)

    store.async_get(j).on_complete(fold)
    return None


def on_timer(function: Any, time: float, ctx: Any) -> Any:
    """The chain's firing: the window ending at ``time`` fires from one scan of the
    key's panes and its last-use panes go; the next window holding a pane gets its
    timer. In event time, every later window of the key that this firing's watermark
    also makes due fires here too, in order, from the same scan (their timers are
    deleted): what their own firings would emit, in the same order for the key."""
    panes, assigner = function.contents, function.assigner
    window = assigner.window_ending_at(time)
    if window is None:
        return None
    due = ctx.timer_service.current_watermark() if function.event_time else time
    k = round((window.start - assigner.offset) / assigner.slide)
    # callbacks, not a chain of derived futures: the pending scan keeps the firing in
    # flight; the key's panes (index -> accumulator) as they come (``tuple`` of a pair
    # is the pair: no Python call per entry)
    panes.store.async_entries().on_complete(
        lambda entries: entries.on_next(tuple).on_complete(
            lambda pairs: fire_due(function, ctx, dict(pairs), k, due)
        )
    )
    return None


def fire_due(
    function: Any, ctx: Any, found: dict[int, Any], k: int, due: float,
    removed: list[int] | None = None,
) -> None:  # fmt: skip
    """Fire window ``k`` (if it holds a pane) and, in order, every later window holding
    a pane of ``found`` (the key's panes: index -> accumulator) whose end is <= ``due``;
    remove each fired window's last-use panes (from ``found``, and from state, or when
    ``removed`` is a list, appended to it: a flush rewrites the key's panes), delete
    the fired windows' timers (event time), and register
    the timer of the next window holding a pane. No pane of ``found`` lies before
    window ``k`` (earlier windows fired and took their last-use panes)."""
    panes, assigner = function.contents, function.assigner
    n, r = panes.n, panes.r
    offset, slide, size = assigner.offset, assigner.slide, assigner.size
    service = ctx.timer_service
    event_time = function.event_time
    store, inner = panes.store, panes.inner
    plain = function.process_fn is None  # outputs need no window object
    elements, output, merge = inner.elements, ctx.output, inner.merge_fresh
    indexes = sorted(found)
    i, m = 0, len(indexes)
    # an aggregate without a process function: merge_fresh and elements inlined (the
    # same calls in the same order); with no user code holding a context in the loop,
    # the key's timers change only by our deletes, so absent ones are skipped (most
    # fired windows have no timer of their own: one chain timer per key)
    aggregate = inner.function if plain and type(inner) is AggregateContents else None
    if aggregate is not None:
        create, combine = aggregate.create_accumulator, aggregate.merge
        result_of = aggregate.get_result
    timers = service._registered("event-time") if event_time and plain else None
    while True:
        start = offset + k * slide
        end = start + size  # as grid_window computes it: bit-for-bit the same
        if end > due:
            break
        first = k * r
        hi = bisect_left(indexes, first + n, i)
        if hi > i:
            if aggregate is not None:
                accumulator = create()
                for j in indexes[i:hi]:
                    accumulator = combine(accumulator, found[j])
                output(result_of(accumulator))
            elif plain:
                for result in elements(merge([found[j] for j in indexes[i:hi]])):
                    output(result)
            else:
                merged = merge([found[j] for j in indexes[i:hi]])
                function._emit(Scope(ctx, function), TimeWindow.trusted(start, end), merged)
            if event_time and (timers is None or end in timers):
                service.delete_event_time_timer(end)  # fires here, now (a no-op if firing)
            cut = first + r
            while i < m and indexes[i] < cut:  # the window's last-use panes
                j = indexes[i]
                del found[j]
                if removed is None:
                    store.async_remove(j)  # later requests of this key queue after it
                else:
                    removed.append(j)
                i += 1
        if i == m:
            return
        k = max(k + 1, -((n - 1 - indexes[i]) // r))  # the first window of the next pane
    if event_time:
        service.register_event_time_timer(end)
    else:
        service.register_processing_time_timer(end)
