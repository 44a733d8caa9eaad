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
from typing import Any

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
    """``on_timer`` of a tumbling window without allowed lateness: fire and clean."""
    window = function.assigner.window_ending_at(time)
    if window is None:
        return None
    store, key = function.contents.store, window_key(window)

    def fire(stored: Any) -> Any:
        if stored is None:
            return None
        function._emit(Scope(ctx, function), window, stored)
        return store.async_remove(key)

    return store.async_get(key).then_compose(fire)
