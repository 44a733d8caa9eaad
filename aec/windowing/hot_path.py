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
from typing import Any

from aec.state.future import combine_all
from aec.windowing.assigners import TumblingEventTimeWindows
from aec.windowing.context import Scope
from aec.windowing.windows import window_key


def applies(function: Any) -> bool:
    """Whether ``function`` (a ``WindowOperatorFunction``, opened) can take this path."""
    process = function.process_fn
    return (
        function.fast
        and not function.panes
        and isinstance(function.assigner, TumblingEventTimeWindows)
        and function.evictor is None
        and not function.clears
        and (process is None or not inspect.iscoroutinefunction(process.process))
    )


def on_record(function: Any, value: Any, ctx: Any) -> Any:
    """``process_element`` of a tumbling window: one read and one write."""
    service = ctx.timer_service
    watermark = service.current_watermark()
    assigner = function.assigner
    if function.event_time:
        timestamp = ctx.timestamp
        if timestamp is None:
            raise function.missing_timestamp(value, ctx)
        now = watermark
        window = assigner.grid_window(assigner.grid_index(timestamp))
        if window.end + function.lateness <= watermark:
            if timestamp + function.lateness <= watermark:
                function._late(ctx, value, timestamp, watermark)
            return None
    else:
        now = service.current_processing_time()
        timestamp = ctx.timestamp
        if timestamp is None:
            timestamp = now
        window = assigner.grid_window(assigner.grid_index(now))
    contents = function.contents
    store, key = contents.store, window_key(window)

    def fold(stored: Any) -> Any:
        store.async_put(key, contents.fold(stored, value, timestamp))
        if stored is not None and window.end > now:
            return None  # timers registered with the window; the trigger continues
        scope = Scope(ctx, function)
        if not function._builtin_element(scope, window, now):
            if stored is None:
                function._register_cleanup(scope, window)
            return None
        if stored is None:
            function._register_cleanup(scope, window)
        return store.async_get(key).then_accept(
            lambda now_stored: function._emit(scope, window, now_stored)
        )

    return store.async_get(key).then_compose(fold)


def on_timer(function: Any, time: float, ctx: Any) -> Any:
    """``on_timer`` of a tumbling window: the window ending at ``time`` fires; the one
    whose cleanup time (``end + allowed_lateness``) is ``time`` is cleaned."""
    assigner, lateness = function.assigner, function.lateness
    store = function.contents.store
    fires = assigner.window_ending_at(time)
    if function.event_time and lateness > 0:  # an infinite lateness never cleans
        finite = math.isfinite(time - lateness)
        cleans = assigner.window_ending_at(time - lateness) if finite else None
    else:
        cleans = fires  # processing time, or no lateness: cleaned when it fires
    reads = [store.async_get(window_key(w)) for w in (cleans, fires) if w is not None]
    if not reads:
        return None

    def act(stored: list) -> Any:
        windows = [w for w in (cleans, fires) if w is not None]
        if cleans is fires and fires is not None:
            windows, stored = windows[:1], stored[:1]
        removals = []
        for window, contents in zip(windows, stored, strict=True):
            if contents is None:
                continue
            if window is fires:
                function._emit(Scope(ctx, function), window, contents)
            if window is cleans:
                removals.append(store.async_remove(window_key(window)))
        return combine_all(removals)

    return combine_all(reads).then_compose(act)
