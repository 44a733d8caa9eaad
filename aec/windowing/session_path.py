"""Event-time session windows with the built-in trigger, in callback style.

The general path (``WindowOperatorFunction._merging_record`` / ``_fire_sessions``) is
``async def`` and reads a record's session set, then its window's contents: two
round trips in a row, and a coroutine suspension each. For sessions over an
aggregate, a reduce or the list of values, with ``EventTimeTrigger``, no evictor and a
plain process function (if any), records and firings run here as StateFuture
callbacks with the same semantics:

* a record reads the key's session set *and* the contents of its own new window
  ``[t, t + gap)`` in one round trip: when the window starts a session (the common
  case) or equals one, that read is its contents; when it merges, the merged
  windows' contents are read next and folded with ``merge`` together with the
  record (one write); when it lies inside a session, that session is read;
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
from aec.windowing.merging import add_session
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
    """``process_element``: the session set and the new window's contents in one round trip."""
    timestamp = ctx.timestamp
    if timestamp is None:
        raise function.missing_timestamp(value, ctx)
    (window,) = function.assigner.assign_windows(value, timestamp)
    sessions_read = function.sessions.async_value()
    own_read = function.contents.store.async_get(window_key(window))
    when_read(
        [sessions_read, own_read],
        lambda read: _place(function, ctx, value, timestamp, window, read[0], read[1]),
    )
    return None


def _place(
    function: Any, ctx: Any, value: Any, timestamp: float, window: Any, held: Any, own: Any
) -> None:
    """Add the record's window to the key's sessions (``held``), then its value to
    the window it lands in (``_merging_record``'s steps for the built-in trigger)."""
    service = ctx.timer_service
    watermark = service.current_watermark()
    sessions = list(held or ())
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
            if actual.end <= watermark:  # EventTimeTrigger.on_element: a late firing
                function._emit(Scope(ctx, function), actual, folded)
            else:
                service.register_event_time_timer(actual.end)
            if merged or stored is None:
                cleanup = function.cleanup_time(actual)
                # at ``end`` it is the timer just registered; an infinite lateness never cleans
                if cleanup != actual.end and cleanup != math.inf:
                    service.register_event_time_timer(cleanup)
        if sessions != before:
            function.sessions.async_update(tuple(sessions) or None)  # not awaited
        if late and timestamp + function.lateness <= watermark:
            function._late(ctx, value, timestamp, watermark)

    if merged:
        if actual.end > watermark:  # EventTimeTrigger.on_merge
            service.register_event_time_timer(actual.end)
        # EventTimeTrigger.clear and the cleanup timer of the merged-away sessions: an
        # engine timer is per (key, time), so one another session still uses stays
        cleanup_time = function.cleanup_time
        live = {t for w in sessions for t in (w.end, cleanup_time(w))}
        for old in merged:
            for t in (old.end, cleanup_time(old)):
                if t not in live and t != math.inf:
                    service.delete_event_time_timer(t)
        reads = [store.async_get(window_key(w)) for w in (actual, *merged)]

        def fold_merged(values: list[Any]) -> None:
            for old in merged:
                store.async_remove(window_key(old))
            present = [v for v in values if v is not None]
            finish(contents.merge(present) if present else None, bool(present))

        when_read(reads, fold_merged)
    elif actual == window:  # a new session, or one equal to it: ``own`` is its contents
        finish(own, False)
    else:  # inside a session: read that one
        store.async_get(window_key(actual)).on_complete(lambda stored: finish(stored, False))


def on_timer(function: Any, time: float, ctx: Any) -> Any:
    """The sessions ending (or cleaned) at ``time`` fire (or go); a merged-away
    session's timer finds nothing (``_fire_sessions``)."""
    state = function.sessions

    def due(held: Any) -> None:
        sessions = list(held or ())
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
                state.async_update(tuple(sessions) or None)  # not awaited

        when_read(reads, fire)

    state.async_value().on_complete(due)
    return None


def _by_end(window: Any) -> tuple[float, float]:
    return (window.end, window.start)
