"""Event-time session windows with the built-in trigger, in callback style.

The general path (``WindowOperatorFunction._merging_record`` / ``_fire_sessions``) is
``async def`` and reads a record's session set, then its window's contents: two
round trips in a row, and a coroutine suspension each. For sessions over an
aggregate, a reduce or the list of values, with ``EventTimeTrigger``, no evictor and a
plain process function (if any), records and firings run here as StateFuture
callbacks with the same semantics:

* a record reads the key's session set (stored as ``(start, end)`` pairs); a window
  that starts a session needs no contents read (nothing is stored under a window
  outside the set); when it merges, the merged sessions' contents are read next
  and folded with ``merge`` together with the record (one write under the cover);
  when it lies inside (or equals) a session, that session is read;
* a firing reads the session set, then the due sessions' contents, together.

The property tests compare this path against the synchronous run and the reference
model, like the general one.
"""

from __future__ import annotations

import math
from typing import Any

from aec.windowing.assigners import EventTimeSessionWindows
from aec.windowing.contents import EvictingContents
from aec.windowing.context import Scope
from aec.windowing.hot_path import when_read
from aec.windowing.merging import add_session, decode_sessions, encode_sessions
from aec.windowing.windows import window_key


def applies(function: Any) -> bool:
    """Whether ``function`` (a ``WindowOperatorFunction``, opened, with ``hot_path.plain``'s
    conditions on its process function) has event-time sessions for this path."""
    return (
        function.implied
        and function.event_time
        and type(function.assigner) is EventTimeSessionWindows
        and not isinstance(function.contents, EvictingContents)
    )


def on_record(function: Any, value: Any, ctx: Any) -> Any:
    """``process_element``: the session set first; contents only of sessions it touches."""
    timestamp = ctx.timestamp
    if timestamp is None:
        raise function.missing_timestamp(value, ctx)
    (window,) = function.assigner.assign_windows(value, timestamp)
    function.sessions.async_value().on_complete(
        lambda held: _place(function, ctx, value, timestamp, window, held)
    )
    return None


def _place(function: Any, ctx: Any, value: Any, timestamp: float, window: Any, held: Any) -> None:
    """Add the record's window to the key's sessions (``held``), then its value to
    the window it lands in (``_merging_record``'s steps for the built-in trigger).

    Contents exist only under windows of the session set (a session's contents are
    written while it is in the set and removed when it leaves: merged away or
    cleaned; a retired cover never holds merged contents here, since in serial
    watermark order a session in the set is never past its cleanup time, so a
    cover of sessions is never late). So a new window, and a merge's cover, start
    empty: no read; a window inside (or equal to) a session reads that session."""
    service = ctx.timer_service
    watermark = service.current_watermark()
    sessions = decode_sessions(held)
    before = list(sessions)
    actual, merged = add_session(sessions, window)
    contents = function.contents
    store = contents.store

    def finish(stored: Any, moved: bool) -> None:
        """``stored``: ``actual``'s contents before the record (merged ones included)."""
        late = function.is_late(actual, watermark)
        if late:
            sessions.remove(actual)  # Flink's retireWindow; merged contents stay, as there
            if moved:
                store.async_put(window_key(actual), stored)
        else:
            folded = contents.fold(stored, value, timestamp)
            store.async_put(window_key(actual), folded)
            element_fired(function, ctx, actual, folded, bool(merged) or stored is None, watermark)
        if sessions != before:
            function.sessions.async_update(encode_sessions(sessions))  # not awaited
        if late and timestamp + function.lateness <= watermark:
            function._late(ctx, value, timestamp, watermark)

    if merged:
        merge_timers(function, service, sessions, actual, merged, watermark)
        reads = [store.async_get(window_key(w)) for w in merged]  # the cover holds nothing

        def fold_merged(values: list[Any]) -> None:
            for old in merged:
                store.async_remove(window_key(old))
            present = [v for v in values if v is not None]
            finish(contents.merge(present) if present else None, bool(present))

        when_read(reads, fold_merged)
    elif actual in before:  # inside (or equal to) a session: read that one
        store.async_get(window_key(actual)).on_complete(lambda stored: finish(stored, False))
    else:  # a new session: nothing stored under it
        finish(None, False)


def merge_timers(
    function: Any, service: Any, sessions: list[Any], actual: Any, merged: list[Any],
    watermark: float,
) -> None:  # fmt: skip
    """The timers of a merge into ``actual`` (``sessions``: the set after it):
    EventTimeTrigger.on_merge, then EventTimeTrigger.clear and the cleanup timer of the
    merged-away sessions (an engine timer is per (key, time), so one another session
    still uses stays)."""
    if actual.end > watermark:
        service.register_event_time_timer(actual.end)
    cleanup_time = function.cleanup_time
    live = {t for w in sessions for t in (w.end, cleanup_time(w))}
    for old in merged:
        for t in (old.end, cleanup_time(old)):
            if t not in live and t != math.inf:
                service.delete_event_time_timer(t)


def element_fired(
    function: Any, ctx: Any, actual: Any, folded: Any, fresh: bool, watermark: float
) -> None:
    """After a record folded into session ``actual`` (now ``folded``):
    EventTimeTrigger.on_element (a late firing emits at once, else the end timer), and
    the cleanup timer of a ``fresh`` session (new, or the cover of a merge)."""
    service = ctx.timer_service
    if actual.end <= watermark:
        function._emit(Scope(ctx, function), actual, folded)
    else:
        service.register_event_time_timer(actual.end)
    if fresh:
        cleanup = function.cleanup_time(actual)
        # at ``end`` it is the timer just registered; an infinite lateness never cleans
        if cleanup != actual.end and cleanup != math.inf:
            service.register_event_time_timer(cleanup)


def on_timer(function: Any, time: float, ctx: Any) -> Any:
    """The sessions ending (or cleaned) at ``time`` fire (or go); a merged-away
    session's timer finds nothing (``_fire_sessions``)."""
    state = function.sessions

    def due(held: Any) -> None:
        sessions = decode_sessions(held)
        windows = sorted(
            (w for w in sessions if w.end == time or function.cleanup_time(w) == time),
            key=_by_end,
        )
        if not windows:
            return
        store = function.contents.store
        reads = [store.async_get(window_key(w)) for w in windows]

        def fire(values: list[Any]) -> None:
            cleaned = False
            for window, stored in zip(windows, values, strict=True):
                if window.end == time and stored is not None:
                    function._emit(Scope(ctx, function), window, stored)
                if function.cleanup_time(window) == time:
                    store.async_remove(window_key(window))
                    sessions.remove(window)
                    cleaned = True
            if cleaned:
                state.async_update(encode_sessions(sessions))  # not awaited

        when_read(reads, fire)

    state.async_value().on_complete(due)
    return None


def _by_end(window: Any) -> tuple[float, float]:
    return (window.end, window.start)
