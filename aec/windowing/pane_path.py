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

from typing import Any

from aec.windowing.context import Scope
from aec.windowing.panes import PaneContents


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
    service = ctx.timer_service
    event_time = function.event_time
    due = service.current_watermark() if event_time else time
    n, r = panes.n, panes.r
    found: dict[int, Any] = {}  # the key's panes: index -> accumulator

    def collect(entry: tuple[int, Any]) -> None:
        found[entry[0]] = entry[1]

    def fire(_: Any) -> None:
        store = panes.store
        k, current = round((window.start - assigner.offset) / assigner.slide), window
        while True:
            first = k * r
            present = [found[j] for j in range(first, first + n) if j in found]
            if present:
                function._emit(Scope(ctx, function), current, panes._merged(present))
                for j in range(first, first + r):  # its last-use panes
                    if found.pop(j, _ABSENT) is not _ABSENT:
                        store.async_remove(j)  # later requests of this key queue after it
            later = min((j for j in found if j >= first + r), default=None)
            if later is None:
                return
            k = max(k + 1, panes.window_range(later)[0])
            current = assigner.grid_window(k)
            if current.end > due:
                break
            service.delete_event_time_timer(current.end)  # fires here, now
        if event_time:
            service.register_event_time_timer(current.end)
        else:
            service.register_processing_time_timer(current.end)

    # callbacks, not a chain of derived futures: the pending scan keeps the firing in flight
    panes.store.async_entries().on_complete(
        lambda entries: entries.on_next(collect).on_complete(fire)
    )
    return None


_ABSENT = object()
