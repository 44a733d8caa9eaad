"""Tumbling windows with the built-in trigger in callback style (no coroutine).

The general window logic (``aec.windowing.operator``) is ``async def``; driving a
coroutine costs a frame resumption per awaited state access. For the most common
window, a tumbling one over an aggregate or reduce with the default trigger and no
evictor, records and timers run here as StateFuture chains instead, with the same
semantics (the property tests compare both paths against the synchronous run and
the reference model).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from aec.state.future import StateFuture, combine_all
from aec.windowing.assigners import TumblingEventTimeWindows
from aec.windowing.context import Scope
from aec.windowing.windows import TimeWindow


def plain(function: Any) -> bool:
    """Whether ``function`` (a ``WindowOperatorFunction``, opened) can run in callback
    style: no evictor, a process function (if any) neither ``async def`` nor with a
    ``clear``."""
    process = function.process_fn
    return (
        function.evictor is None
        and not function.clears
        and (process is None or not inspect.iscoroutinefunction(process.process))
    )


def applies(function: Any) -> bool:
    """Whether ``function`` (opened, ``plain``) is a tumbling window with the built-in
    trigger (implicit timers) for this path."""
    return (
        function.fast
        and not function.panes
        and isinstance(function.assigner, TumblingEventTimeWindows)
    )


def on_record(function: Any, value: Any, ctx: Any) -> Any:
    """``process_element`` of a tumbling window: one read and one write (the window
    object is made only when it fires)."""
    service = ctx.timer_service
    watermark = service.current_watermark()
    assigner, lateness = function.assigner, function.lateness
    if function.event_time:
        timestamp = ctx.timestamp
        if timestamp is None:
            raise function.missing_timestamp(value, ctx)
        now = watermark
        start = assigner.offset + assigner.grid_index(timestamp) * assigner.slide
        end = start + assigner.size  # as grid_window computes it: bit-for-bit the same
        if end + lateness <= watermark:
            if timestamp + lateness <= watermark:
                function._late(ctx, value, timestamp, watermark)
            return None
    else:
        now = service.current_processing_time()
        timestamp = ctx.timestamp
        if timestamp is None:
            timestamp = now
        start = assigner.offset + assigner.grid_index(now) * assigner.slide
        end = start + assigner.size
    contents = function.contents
    store, key = contents.store, (start, end)

    def fold(stored: Any) -> None:
        folded = contents.fold(stored, value, timestamp)
        store.async_put(key, folded)
        if stored is not None and end > now:
            return  # timers registered with the window; the trigger continues
        if stored is None and function.event_time and lateness > 0:
            cleanup = end + lateness
            if cleanup != math.inf:
                service.register_event_time_timer(cleanup)
        if end > now or not function.event_time:  # EventTime/ProcessingTimeTrigger: a timer
            if function.event_time:
                service.register_event_time_timer(end)
            else:
                service.register_processing_time_timer(end)
            return
        # a late firing: the window fires at once with what was just stored
        function._emit(Scope(ctx, function), TimeWindow.trusted(start, end), folded)

    # a callback, not then_compose: no derived future per record (the pending read
    # keeps the record in flight; the put is this record's like any request)
    store.async_get(key).on_complete(fold)
    return None


def ending_at(assigner: Any, end: float) -> tuple[float, float] | None:
    """``(start, end)`` of the grid window ending exactly at ``end``, or None."""
    start = assigner.offset + round((end - assigner.size - assigner.offset) / assigner.slide) * (
        assigner.slide
    )
    return (start, end) if start + assigner.size == end else None


def on_timer(function: Any, time: float, ctx: Any) -> Any:
    """``on_timer`` of a tumbling window: the window ending at ``time`` fires; the one
    whose cleanup time (``end + allowed_lateness``) is ``time`` is cleaned."""
    assigner, lateness = function.assigner, function.lateness
    store = function.contents.store
    if function.event_time and 0 < lateness < math.inf:
        if ctx.timer_service.current_watermark() == math.inf:
            return _at_end_of_input(function, time, ctx)
    fires = ending_at(assigner, time)
    if function.event_time and lateness > 0:  # an infinite lateness never cleans
        finite = math.isfinite(time - lateness)
        cleans = ending_at(assigner, time - lateness) if finite else None
    else:
        cleans = fires  # processing time, or no lateness: cleaned when it fires
    if cleans is fires:  # one window fires and goes: a single read, no combining
        if fires is None:
            return None

        def fire(stored: Any) -> None:
            if stored is not None:
                function._emit(Scope(ctx, function), TimeWindow.trusted(*fires), stored)
                store.async_remove(fires)  # the firing's own request: it holds the key

        store.async_get(fires).on_complete(fire)
        return None
    if cleans is not None:  # an absent window's removal is a no-op: no read first
        store.async_remove(cleans)  # the firing's own request: it holds the key
    if fires is not None:

        def fire_only(stored: Any) -> None:
            if stored is not None:
                function._emit(Scope(ctx, function), TimeWindow.trusted(*fires), stored)

        store.async_get(fires).on_complete(fire_only)
    return None


def _at_end_of_input(function: Any, time: float, ctx: Any) -> None:
    """The key's first firing at watermark inf (end of input), with allowed lateness:
    every timer of the key is due now, ``time`` is its earliest. Instead of one firing
    per window end and per cleanup time, this one reads the key's windows (all are
    due: each is cleaned), fires those not fired yet (``end >= time``: an earlier end
    fired at an earlier watermark) in order of end, clears them all and deletes the
    key's later timers. Per key: the outputs and final state of the separate firings."""
    store, lateness = function.contents.store, function.lateness
    service = ctx.timer_service
    found: list[tuple[tuple[float, float], Any]] = []

    def fire(_: Any) -> None:
        found.sort(key=_by_end)
        for (start, end), stored in found:
            if end >= time:
                function._emit(Scope(ctx, function), TimeWindow.trusted(start, end), stored)
                if end > time:
                    service.delete_event_time_timer(end)
            if end + lateness > time:
                service.delete_event_time_timer(end + lateness)
        if found:
            store.async_clear()  # the firing's own request: it holds the key

    store.async_entries().on_complete(
        lambda entries: entries.on_next(found.append).on_complete(fire)
    )


def _by_end(entry: tuple[tuple[float, float], Any]) -> float:
    return entry[0][1]


def emit_at_watermark(
    function: Any, scope: Scope, context: Any, window: Any, stored: Any, watermark: float
) -> None:
    """Emit a window fired by a bundle's flush as its timer's firing would: the flush
    ``context`` (a ``BundleContext``) reports ``watermark``, the flushing one, while the
    process function runs, then its records' watermark again."""
    records_watermark = context.watermark
    context.watermark = watermark
    try:
        function._emit(scope, window, stored)
    finally:
        context.watermark = records_watermark


def when_read(reads: list[StateFuture], fn: Callable[[list[Any]], None]) -> None:
    """Run ``fn(results)`` once every read of ``reads`` (one invocation's, in submission
    order) is done. A record's requests complete in submission order, so the last read's
    callback finds them all done: no combined future per firing (else ``combine_all``)."""

    def run(_: Any) -> None:
        if all(read.is_done() for read in reads):
            fn([read.get() for read in reads])
        else:  # not expected; kept correct whatever the completion order
            combine_all(reads).on_complete(fn)

    reads[-1].on_complete(run)
