"""Event-time session windows with the built-in trigger, in callback style.

The general path (``WindowOperatorFunction._merging_record`` / ``_fire_sessions``) is
``async def`` and keeps a key's session set (ValueState ``window-sessions``) apart from
its sessions' contents (MapState ``window-contents``): a record reads the set, then the
contents of the sessions it touches; a firing the set, then the due contents. For
sessions over an aggregate, a reduce or the list of values, with ``EventTimeTrigger``,
no evictor and a plain process function (if any), records and firings run here as
StateFuture callbacks with the same semantics, on one value per key instead
(ValueState ``window-sessions-contents``, ``STATE``): the key's sessions sorted by start,
each with its contents, as ``(start, end, contents)`` triples. Most keys hold one or two
sessions, so reading them all costs less than a second round trip:

* a record reads the value, places its window (``place``: new, inside a session, or
  merging sessions whose contents fold with ``merge`` together with the record) and
  writes the value once: one read and one write;
* a firing reads the value, fires the due sessions and writes it once if a session was
  cleaned (a clear when none is left).

The property tests compare this path against the synchronous run and the reference
model, like the general one.
"""

from __future__ import annotations

import math
from typing import Any

from aec.windowing.assigners import EventTimeSessionWindows
from aec.windowing.context import Scope
from aec.windowing.merging import add_session
from aec.windowing.windows import TimeWindow

STATE = "window-sessions-contents"
"""The ValueState of this path: a key's sessions with their contents (see the module)."""


def applies(function: Any) -> bool:
    """Whether ``function`` (a ``WindowOperatorFunction`` whose ``open`` set its spec's
    fields, with ``hot_path.plain``'s conditions on its process function) has
    event-time sessions for this path. Asked in ``open`` before the state exists."""
    return (
        function.implied
        and function.event_time
        and type(function.assigner) is EventTimeSessionWindows
        and function.evictor is None
    )


def decode(held: Any) -> tuple[list[Any], dict[tuple[float, float], Any]]:
    """The stored value -> (the sessions sorted by start, ``(start, end)`` -> contents)."""
    if not held:
        return [], {}
    trusted = TimeWindow.trusted
    return [trusted(s, e) for s, e, _ in held], {(s, e): c for s, e, c in held}


def encode(sessions: list[Any], memory: dict[tuple[float, float], Any]) -> Any:
    """Sessions and their contents -> the stored value (None: none left, a clear).
    Plain tuples: pickling them is C work."""
    return tuple((w.start, w.end, memory.get((w.start, w.end))) for w in sessions) or None


def on_record(function: Any, value: Any, ctx: Any) -> Any:
    """``process_element``: one read of the key's sessions, one write."""
    timestamp = ctx.timestamp
    if timestamp is None:
        raise function.missing_timestamp(value, ctx)
    (window,) = function.assigner.assign_windows(value, timestamp)
    state = function.together

    def placed(held: Any) -> None:
        sessions, memory = decode(held)
        watermark = ctx.timer_service.current_watermark()
        if place(function, ctx, sessions, memory, value, timestamp, window, watermark):
            state.async_update(encode(sessions, memory))  # not awaited

    state.async_value().on_complete(placed)
    return None


def place(
    function: Any, ctx: Any, sessions: list[Any], memory: dict[tuple[float, float], Any],
    value: Any, timestamp: float, window: Any, watermark: float, service: Any = None,
) -> bool:  # fmt: skip
    """Add a record's ``window`` to a key's ``sessions`` and the record to the session it
    lands in (``_merging_record``'s steps for the built-in trigger), on the sessions and
    their contents (``memory``) in memory, both changed in place. True when they
    changed (the value is to be written). Timers go to ``service`` (default: the
    key's ``ctx.timer_service``; the bundle passes its ``NetTimers``).

    A new window, and a merge's cover, hold nothing before the record: contents exist
    only with sessions of the set. A late session (Flink's retireWindow) leaves the set
    with its contents (the general path leaves merged contents under the retired cover,
    where nothing reads them; in serial watermark order a session in the set is never
    past its cleanup time, so this does not happen there)."""
    contents = function.contents
    count = len(sessions)
    actual, merged = add_session(sessions, window)
    key = (actual.start, actual.end)
    if merged:
        service = service or ctx.timer_service
        merge_timers(function, service, sessions, actual, merged, watermark)
        present = [memory.pop((w.start, w.end), None) for w in merged]
        present = [v for v in present if v is not None]
        stored = contents.merge(present) if present else None
    else:  # inside (or equal to) a session: its contents; a new one: nothing
        stored = memory.get(key)
    if function.is_late(actual, watermark):
        inside = not merged and len(sessions) == count
        sessions.remove(actual)
        memory.pop(key, None)
        if timestamp + function.lateness <= watermark:
            function._late(ctx, value, timestamp, watermark)
        return bool(merged) or inside
    folded = memory[key] = contents.fold(stored, value, timestamp)
    fresh = bool(merged) or stored is None
    element_fired(function, ctx, actual, folded, fresh, watermark, service)
    return True


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
    function: Any, ctx: Any, actual: Any, folded: Any, fresh: bool, watermark: float,
    service: Any = None,
) -> None:  # fmt: skip
    """After a record folded into session ``actual`` (now ``folded``):
    EventTimeTrigger.on_element (a late firing emits at once, else the end timer), and
    the cleanup timer of a ``fresh`` session (new, or the cover of a merge)."""
    service = service or ctx.timer_service
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
    """The sessions ending (or cleaned) at ``time`` fire (or go), in order of end; a
    merged-away session's timer finds nothing (``_fire_sessions``). One read, and one
    write when a session goes."""
    state = function.together

    def due(held: Any) -> None:
        sessions, memory = decode(held)
        cleanup_time = function.cleanup_time
        windows = sorted(
            (w for w in sessions if w.end == time or cleanup_time(w) == time), key=by_end
        )
        if not windows:
            return
        cleaned = False
        for window in windows:
            key = (window.start, window.end)
            stored = memory.get(key)
            if window.end == time and stored is not None:
                function._emit(Scope(ctx, function), window, stored)
            if cleanup_time(window) == time:
                sessions.remove(window)
                del memory[key]
                cleaned = True
        if cleaned:
            state.async_update(encode(sessions, memory))  # not awaited

    state.async_value().on_complete(due)
    return None


def by_end(window: Any) -> tuple[float, float]:
    return (window.end, window.start)


class NetTimers:
    """A key's event-time timer changes within one fold, applied at its end as their net
    effect: a timer registered and deleted again in the fold (a session that starts and
    fires in one flush) never reaches the timer queue. Per key a timer is one (key,
    time) entry, so the queue ends as if each change had been made in turn."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.before = service._registered("event-time")  # live, unchanged until apply
        self.after = set(self.before)
        self.added: dict[float, None] = {}  # in order of registration

    def register_event_time_timer(self, timestamp: float) -> None:
        self.after.add(timestamp)
        self.added[timestamp] = None

    def delete_event_time_timer(self, timestamp: float) -> None:
        self.after.discard(timestamp)

    def apply(self) -> None:
        """Make the changes: delete the timers gone, then register the new ones."""
        service, before, after = self.service, self.before, self.after
        for timestamp in [t for t in before if t not in after]:
            service.delete_event_time_timer(timestamp)
        for timestamp in self.added:
            if timestamp in after and timestamp not in before:
                service.register_event_time_timer(timestamp)
