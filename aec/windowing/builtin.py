"""The built-in triggers' decisions, as pure functions of times: when a window fires,
which engine timers are set and deleted, when its state is cleaned.

The built-in trigger of a time assigner (Flink's ``EventTimeTrigger`` or
``ProcessingTimeTrigger``) with ``WindowOperator``'s cleanup timer at
``end + allowed_lateness``: the only timers are at a window's end and its cleanup time,
so a firing can rebuild its windows from its time (on the grid, or from the key's
session set) and no window keeps a timer index: these timers are *implied*. Every
path (the coroutine driver, the callback drivers, the bundles) asks ``BuiltinTrigger``;
none restates it, and ``EventTimeTrigger``/``ProcessingTimeTrigger`` (the trigger
objects a user may wrap) call ``fires_on_element`` too.

Times are seconds: event time (the watermark) or processing time (the operator's clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

from aec.elements import Time
from aec.windowing.grid import Grid, Panes
from aec.windowing.windows import Window


def fires_on_element(event_time: bool, end: Time, now: Time) -> bool:
    """The built-in trigger's ``on_element``: True to fire at once (an event-time window
    whose end the watermark ``now`` reached: a late firing), False to register the
    trigger's timer at ``end`` (processing time always)."""
    return bool(event_time and end <= now)  # numpy times compare to numpy.bool


def timer_on_merge(end: Time, now: Time) -> bool:
    """The built-in trigger's ``on_merge``: whether the merged window registers its timer
    at ``end`` (not when ``now``, the watermark or the clock, passed it already)."""
    return bool(end > now)


NO_TIMERS: tuple[Time, ...] = ()
W = TypeVar("W", bound=Window)


class BuiltinTrigger:
    """The built-in trigger of one time domain with ``lateness`` seconds of allowed
    lateness (event time; processing time ignores it, as Flink does). Immutable."""

    __slots__ = ("event_time", "lateness")

    def __init__(self, event_time: bool, lateness: Time) -> None:
        self.event_time = event_time
        self.lateness = lateness

    # -- cleanup ----------------------------------------------------------------------------
    def cleanup_time(self, end: Time) -> Time:
        """Flink's ``cleanupTime``: ``end + lateness`` in event time (``inf`` for a window
        never cleaned: the global window, an infinite lateness; sums above the float range
        saturate to ``inf`` like Flink's ``Long.MAX_VALUE`` guard), ``end`` in processing
        time."""
        return end + self.lateness if self.event_time else end

    def cleanup_timer(self, end: Time) -> Time | None:
        """The cleanup timer a new window registers besides the trigger's at ``end``: its
        cleanup time, or None when that is ``end`` itself (the same engine timer) or
        ``inf`` (never cleaned)."""
        cleanup = self.cleanup_time(end)
        return None if cleanup == end or cleanup == math.inf else cleanup

    def is_late(self, end: Time, watermark: Time) -> bool:
        """Flink's ``isWindowLate``: an event-time window cleaned by ``watermark``."""
        return bool(self.event_time and end + self.lateness <= watermark)

    def is_late_record(self, timestamp: Time, watermark: Time) -> bool:
        """Flink's ``isElementLate``, asked of a record no window accepted: it goes to the
        late side output (or is counted dropped). Processing time has no late records."""
        return bool(self.event_time and timestamp + self.lateness <= watermark)

    # -- records ----------------------------------------------------------------------------
    def on_element(self, end: Time, now: Time, fresh: bool) -> tuple[bool, tuple[Time, ...]]:
        """A record was added to a window ending at ``end``; ``fresh``: the window held
        nothing before. Returns ``(fire, timers)``: fire now (a late firing, see
        ``fires_on_element``), and the engine timers to register: the trigger's at
        ``end`` (unless it fires now) and a fresh window's ``cleanup_timer``. A window
        that held records and ends after ``now`` needs nothing: its timers are set."""
        if not fresh and end > now:
            return False, NO_TIMERS
        fire = fires_on_element(self.event_time, end, now)
        cleanup = self.cleanup_timer(end) if fresh else None
        if cleanup is None:
            return fire, (NO_TIMERS if fire else (end,))
        return fire, ((cleanup,) if fire else (end, cleanup))

    def chain_start(self, panes: Panes, j: int, now: Time) -> Time:
        """The timer a new pane ``j`` registers in chain mode: the end of its first window
        the trigger has not fired yet (event time: the first ending after the watermark
        ``now``, as no lateness keeps a fired window; processing time: its first, which
        ends after the clock), where the chain of firings (``Panes.chain``) starts."""
        first = panes.first_window(j)
        return panes.end(panes.first_open(first, now) if self.event_time else first)

    # -- firings ----------------------------------------------------------------------------
    def grid_timer(self, grid: Grid, time: Time) -> tuple[int | None, int | None]:
        """A timer at ``time`` of a grid's windows: ``(k fired, k cleaned)``, the index of
        the window ending at ``time`` (fires, if it holds anything) and of the one whose
        cleanup time is ``time`` (goes); either None when no window has that time."""
        fires = grid.ending_at(time)
        if not self.event_time or self.lateness == 0:
            return fires, fires  # cleaned when it fires
        since = time - self.lateness
        if not math.isfinite(since):
            return fires, None
        # time - lateness may round off the end it was added to (4.1 - 0.1 < 4): the
        # window is the neighbour of the nearest end whose cleanup time is exactly ``time``
        near = grid.ending_near(since)
        for k in (near, near - 1, near + 1):
            if self.cleanup_time(grid.end(k)) == time:
                return fires, k
        return fires, None

    def due_sessions(
        self, sessions: Iterable[W], low: Time, high: Time
    ) -> list[tuple[W, bool, bool]]:
        """The sessions with a timer in ``[low, high]`` (a timer at ``t``: ``low = high =
        t``), in order of end: ``(window, fires, cleaned)``. A timer of a session merged
        away finds nothing (its time belongs to no session of the set)."""
        due = []
        for window in sessions:
            end = window.end
            cleanup = self.cleanup_time(end)
            # bool: numpy times compare to numpy.bool
            fires, cleaned = bool(low <= end <= high), bool(low <= cleanup <= high)
            if fires or cleaned:
                due.append((window, fires, cleaned))
        due.sort(key=_by_end)
        return due

    def merge_timers(
        self, sessions: Sequence[Window], actual: Window, merged: Sequence[Window], watermark: Time
    ) -> tuple[Time | None, list[Time]]:
        """The engine timers of sessions ``merged`` into ``actual`` (``sessions``: the set
        after the merge), event time: ``(register, delete)``. The trigger's ``on_merge``
        registers ``actual``'s end unless the watermark passed it; the sessions merged
        away lose their trigger and cleanup timers (``clear``), except a time another
        session of the key still uses (an engine timer is per key and time)."""
        register = actual.end if timer_on_merge(actual.end, watermark) else None
        cleanup = self.cleanup_time
        live = {t for w in sessions for t in (w.end, cleanup(w.end))}
        delete = []
        for old in merged:
            for t in (old.end, cleanup(old.end)):
                if t not in live and t != math.inf:
                    delete.append(t)
        return register, delete


def _by_end(entry: tuple[W, bool, bool]) -> tuple[Time, Time]:
    window = entry[0]
    return (window.end, window.start)


def by_end(window: Window) -> tuple[Time, Time]:
    """Sort key: windows in order of end (then start), the order they fire in."""
    return (window.end, window.start)
