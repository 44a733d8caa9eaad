"""Event-time session records in mini-batches: the ``aec.runtime.bundle.Bundle`` of the
session callback driver (``aec.windowing.sessions``; asynchronous runs in serial
watermark order only).

Unlike a tumbling window's, a session record may touch any session of its key, so
the bundle takes *every* record of the function (but one without a timestamp, whose
own path fails the run) and keeps each key's records in arrival order. Before each
watermark leaves (and before a snapshot, at the end of input and at the size bound)
one derived context per key folds them: it reads the key's sessions with their contents
(one value), replays the records one by one exactly as a record does
(``SessionsDriver.place``: the same merges, folds, late firings, late side outputs,
timer registrations and deletions, in the same order, with the records' watermark: no
watermark came since they arrived), and writes the value once. So per key the outputs,
side outputs and final state are the record-by-record run's; a key's records cost one
context, one read and one write per watermark instead of one context, one read and
one write each.

Why nothing can observe a key's records before their fold: every later record of the
key is bundled too (so it cannot run before them), its timers fire only after the
watermark that closes the epoch, and the fold runs before that watermark closes it.

At a watermark, without allowed lateness (a session's cleanup is its firing), the fold
also fires the key's sessions that the watermark makes due, as their end timers would
right after it (``BuiltinTrigger.due_sessions``): in order of end, each emitted (the
process function seeing the flushing watermark, as at the timer), removed, its timer
deleted. And a key without event-time timers stores nothing (each stored session keeps
its end timer until it fires and goes), so its fold reads nothing: most flushes of a
key whose sessions end before the watermark make no request at all.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Protocol

from aec.elements import Time
from aec.functions import Context
from aec.runtime.bundle import BundleContext
from aec.windowing.bundles import emit_at_watermark
from aec.windowing.protocol import WindowFunction
from aec.windowing.sessions import EventTimers, Held, Memory, SessionsDriver, decode, encode
from aec.windowing.windows import TimeWindow

Records = list[tuple[object, Time]]  # a key's records: (value, timestamp), in arrival order
Taken = tuple[Time | None, Records]  # (the flushing watermark if the fold fires, records)


class KeyTimers(EventTimers, Protocol):
    """What ``NetTimers`` uses of the key's ``TimerService``."""

    def due_timers(self, domain: str, until: Time) -> list[Time]: ...


class NetTimers:
    """A key's event-time timer changes within one fold, applied at its end as their net
    effect: a timer registered and deleted again in the fold (a session that starts and
    fires in one flush) never reaches the timer queue. Per key a timer is one (key,
    time) entry, so the queue ends as if each change had been made in turn."""

    def __init__(self, service: KeyTimers) -> None:
        self.service = service
        # the key's timers now (unchanged until apply: nothing else runs in the fold)
        self.before = set(service.due_timers("event-time", math.inf))
        self.after = set(self.before)
        self.added: dict[Time, None] = {}  # in order of registration

    def register_event_time_timer(self, timestamp: Time) -> None:
        self.after.add(timestamp)
        self.added[timestamp] = None

    def delete_event_time_timer(self, timestamp: Time) -> None:
        self.after.discard(timestamp)

    def apply(self) -> None:
        """Make the changes: delete the timers gone, then register the new ones."""
        service, before, after = self.service, self.before, self.after
        for timestamp in [t for t in before if t not in after]:
            service.delete_event_time_timer(timestamp)
        for timestamp in self.added:
            if timestamp in after and timestamp not in before:
                service.register_event_time_timer(timestamp)


class SessionBundle:
    """A ``Bundle`` of an event-time session function's records (see the module)."""

    def __init__(self, function: WindowFunction, driver: SessionsDriver) -> None:
        self.size = 0
        self.function = function
        self.driver = driver
        self.pending: dict[Hashable, Records] = {}  # key -> (value, t), in arrival order
        self.fires = function.lateness == 0  # a watermark's flush fires due sessions

    def offer(self, key: Hashable, value: object, timestamp: Time | None, watermark: Time) -> bool:
        if timestamp is None:
            return False  # the record's own path fails the run, naming the timestamp
        records = self.pending.get(key)
        if records is None:
            self.pending[key] = [(value, timestamp)]
        else:
            records.append((value, timestamp))
        self.size += 1
        return True

    def take(self, watermark: Time) -> list[tuple[Hashable, Taken, int]]:
        pending, self.pending = self.pending, {}
        self.size = 0
        until = watermark if self.fires and watermark != math.inf else None
        return [(key, (until, records), len(records)) for key, records in pending.items()]

    def fold(self, taken: Taken, context: BundleContext, ctx: Context) -> None:
        until, records = taken
        if until is not None and not ctx.timer_service.timer_times("event-time"):
            self._replay(records, None, until, context, ctx)  # nothing stored (see module)
            return
        state = self.driver.state
        state.async_value().on_complete(
            lambda held: self._replay(records, held, until, context, ctx)
        )

    def _replay(
        self, records: Records, held: Held, until: Time | None, context: BundleContext,
        ctx: Context,
    ) -> None:  # fmt: skip
        """``SessionsDriver.place`` per record, on the key's sessions and contents in
        memory; at a watermark ``until`` the due sessions fire; then one write (if they
        changed)."""
        assigner, driver = self.driver.assigner, self.driver
        windows = []
        for value, timestamp in records:  # all first, as before the replay (gap functions)
            try:
                (window,) = assigner.assign_windows(value, timestamp)
            except BaseException:
                context.value = value
                raise
            windows.append(window)
        sessions, memory = decode(held)
        service = ctx.timer_service
        watermark = service.current_watermark()
        # firing here, a session may start and fire in this fold: its timers need not
        # reach the queue (see NetTimers)
        net = None if until is None else NetTimers(service)
        changed = False
        for (value, timestamp), window in zip(records, windows, strict=True):
            try:
                if driver.place(ctx, sessions, memory, value, timestamp, window, watermark, net):
                    changed = True
            except BaseException:
                context.value = value
                raise
        if net is not None and until is not None:  # (net exists exactly when until does)
            changed = self._fire_due(sessions, memory, until, context, ctx, net) or changed
            net.apply()
        if changed and (held or sessions):  # nothing stored and nothing left: no write
            driver.state.async_update(encode(sessions, memory))  # not awaited

    def _fire_due(
        self, sessions: list[TimeWindow], memory: Memory, until: Time, context: BundleContext,
        ctx: Context, net: NetTimers,
    ) -> bool:  # fmt: skip
        """Fire and remove the sessions the watermark ``until`` makes due, in order of
        end (the driver's firing at each end, lateness 0); True if any went."""
        due = self.driver.rules.due_sessions(sessions, -math.inf, until)
        if not due:
            return False
        for window, _, _ in due:  # lateness 0: each fires and goes
            net.delete_event_time_timer(window.end)  # fires here, now
            sessions.remove(window)
            stored = memory.pop((window.start, window.end), None)
            if stored is not None:
                emit_at_watermark(self.function, context, ctx, window, stored, until)
        return True
