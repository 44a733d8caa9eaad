"""The session callback driver: event-time sessions with the built-in trigger, plain
(``aec.windowing.path``), as StateFuture callbacks, on one value per key.

ValueState ``window-sessions-contents`` (``STATE``) holds the key's sessions sorted
by start, each with its contents, as ``[start, end, contents]`` triples in a list
(lists: the default ``msgpack`` serializer packs them natively, a tuple is an
extension value costing a Python call each way; a value stored as tuples reads the
same). Most keys hold one or two sessions, so reading them all
costs less than a second round trip:

* a record reads the value, places its window (``place``: new, inside a session, or
  merging sessions whose contents fold with ``merge`` together with the record) and
  writes the value once: one read and one write;
* a firing reads the value, fires the due sessions (``BuiltinTrigger.due_sessions``)
  and writes it once if a session was cleaned (a clear when none is left).

The session cover is ``aec.windowing.merging``'s, the timers the built-in trigger's
(``BuiltinTrigger.on_element``, ``merge_timers``); the same function on the
coroutine driver (the set apart from the contents) gives the same results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from aec.elements import Time
from aec.functions import Context
from aec.state.handles import ValueState
from aec.windowing.assigners import EventTimeSessionWindows
from aec.windowing.contents import Contents
from aec.windowing.merging import add_session
from aec.windowing.protocol import WindowFunction
from aec.windowing.windows import TimeWindow

STATE = "window-sessions-contents"
"""The ValueState of this driver: a key's sessions with their contents (see the module)."""

Held = Sequence[Sequence[Any]] | None
"""The stored value: ``[start, end, contents]`` per session, sorted by start."""
Memory = dict[tuple[Time, Time], object]
"""A key's sessions' contents in memory: ``(start, end) -> contents``."""


class EventTimers(Protocol):
    """Where ``place`` registers and deletes event-time timers: the key's
    ``TimerService``, or a bundle's ``NetTimers``."""

    def register_event_time_timer(self, timestamp: Time) -> None: ...

    def delete_event_time_timer(self, timestamp: Time) -> None: ...


def decode(held: Held) -> tuple[list[TimeWindow], Memory]:
    """The stored value -> (the sessions sorted by start, ``(start, end)`` -> contents)."""
    if not held:
        return [], {}
    trusted = TimeWindow.trusted
    return [trusted(s, e) for s, e, _ in held], {(s, e): c for s, e, c in held}


def encode(sessions: list[TimeWindow], memory: Memory) -> Held:
    """Sessions and their contents -> the stored value (None: none left, a clear)."""
    return [[w.start, w.end, memory.get((w.start, w.end))] for w in sessions] or None


class SessionsDriver:
    """Records and timers of event-time sessions on one value per key (see the module)."""

    def __init__(self, function: WindowFunction) -> None:
        self.function = function
        self.assigner = cast(EventTimeSessionWindows, function.assigner)  # this driver's
        self.rules = function.rules
        self.contents = cast(Contents, function.contents)  # sessions: no panes
        self.state = cast(ValueState, function.session_contents)  # this driver's

    def on_record(self, value: object, ctx: Context) -> None:
        """``process_element``: one read of the key's sessions, one write."""
        timestamp = ctx.timestamp
        if timestamp is None:
            raise self.function.missing_timestamp(value, ctx)
        (window,) = self.assigner.assign_windows(value, timestamp)
        state = self.state

        def placed(held: Held) -> None:
            sessions, memory = decode(held)
            watermark = ctx.timer_service.current_watermark()
            if self.place(ctx, sessions, memory, value, timestamp, window, watermark):
                state.async_update(encode(sessions, memory))  # not awaited

        state.async_value().on_complete(placed)

    def place(
        self, ctx: Context, sessions: list[TimeWindow], memory: Memory, value: object,
        timestamp: Time, window: TimeWindow, watermark: Time, timers: EventTimers | None = None,
    ) -> bool:  # fmt: skip
        """Add a record's ``window`` to a key's ``sessions`` and the record to the session
        it lands in, on the sessions and their contents (``memory``) in memory, both
        changed in place. True when they changed (the value is to be written). Timers go
        to ``timers`` (default: the key's ``ctx.timer_service``; a bundle passes its
        ``NetTimers``).

        A new window, and a merge's cover, hold nothing before the record: contents exist
        only with sessions of the set. A late session (Flink's retireWindow) leaves the
        set with its contents (the coroutine driver leaves merged contents under the
        retired cover, where nothing reads them; in serial watermark order a session in
        the set is never past its cleanup time, so this does not happen there)."""
        function, rules, contents = self.function, self.rules, self.contents
        count = len(sessions)
        actual, merged = add_session(sessions, window)
        key = (actual.start, actual.end)
        service: EventTimers = timers or ctx.timer_service
        stored: object
        if merged:
            register, delete = rules.merge_timers(sessions, actual, merged, watermark)
            if register is not None:
                service.register_event_time_timer(register)
            for time in delete:
                service.delete_event_time_timer(time)
            present = [memory.pop((w.start, w.end), None) for w in merged]
            present = [v for v in present if v is not None]
            stored = contents.merge(present) if present else None
        else:  # inside (or equal to) a session: its contents; a new one: nothing
            stored = memory.get(key)
        if rules.is_late(actual.end, watermark):
            inside = not merged and len(sessions) == count
            sessions.remove(actual)
            memory.pop(key, None)
            if rules.is_late_record(timestamp, watermark):
                function.late(ctx, value, timestamp, watermark)
            return bool(merged) or inside
        folded = memory[key] = contents.fold(stored, value, timestamp)
        fire, times = rules.on_element(actual.end, watermark, bool(merged) or stored is None)
        for time in times:
            service.register_event_time_timer(time)
        if fire:  # a late firing
            function.emit(ctx, actual, folded)
        return True

    def on_timer(self, time: Time, ctx: Context) -> None:
        """The sessions ending (or cleaned) at ``time`` fire (or go), in order of end; a
        merged-away session's timer finds nothing. One read, and one write when a session
        goes."""
        state, function, rules = self.state, self.function, self.rules

        def due(held: Held) -> None:
            sessions, memory = decode(held)
            windows = rules.due_sessions(sessions, time, time)
            if not windows:
                return
            cleaned = False
            for window, fires, cleans in windows:
                key = (window.start, window.end)
                stored = memory.get(key)
                if fires and stored is not None:
                    function.emit(ctx, window, stored)
                if cleans:
                    sessions.remove(window)
                    del memory[key]
                    cleaned = True
            if cleaned:
                state.async_update(encode(sessions, memory))  # not awaited

        state.async_value().on_complete(due)
