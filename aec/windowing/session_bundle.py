"""Event-time session records in mini-batches: the ``aec.runtime.bundle.Bundle`` of
``session_path`` (asynchronous runs in serial watermark order only).

Unlike a tumbling window's, a session record may touch any session of its key, so
the bundle takes *every* record of the function (but one without a timestamp, whose
own path fails the run) and keeps each key's records in arrival order. Before each
watermark leaves (and before a snapshot, at the end of input and at the size bound)
one derived context per key folds them: it reads the key's sessions with their contents
(``session_path.STATE``, one value), replays the records one by one exactly as
``session_path.on_record`` does (``session_path.place``: the same ``add_session``
steps, merges, folds, late firings, late side outputs, timer registrations and
deletions, in the same order, with the records' watermark: no watermark came since
they arrived), and writes the value once. So per key the outputs, side outputs and
final state are the record-by-record run's; a key's records cost one context, one read
and one write per watermark instead of one context, one read and one write each.

Why nothing can observe a key's records before their fold: every later record of the
key is bundled too (so it cannot run before them), its timers fire only after the
watermark that closes the epoch, and the fold runs before that watermark closes it.

At a watermark, without allowed lateness (a session's cleanup is its firing), the fold
also fires the key's sessions that the watermark makes due, as their end timers would
right after it: in order of end, each emitted (the process function seeing the
flushing watermark, as at the timer), removed, its timer deleted. And a key without
event-time timers stores nothing (each stored session keeps its end timer until it
fires and goes), so its fold reads nothing: most flushes of a key whose sessions end
before the watermark make no request at all.
"""

from __future__ import annotations

import math
from typing import Any

from aec.runtime.bundle import BundleContext
from aec.windowing.context import Scope
from aec.windowing.hot_path import emit_at_watermark
from aec.windowing.session_path import NetTimers, by_end, decode, encode, place


class SessionBundle:
    """A ``Bundle`` of an event-time session function's records (see the module)."""

    def __init__(self, function: Any) -> None:
        self.size = 0
        self.function = function
        self._pending: dict[Any, list[tuple[Any, float]]] = {}  # key -> (value, t), in order
        self._fires = function.lateness == 0  # a watermark's flush fires due sessions

    def offer(self, key: Any, value: Any, timestamp: float | None, watermark: float) -> bool:
        if timestamp is None:
            return False  # the record's own path fails the run, naming the timestamp
        records = self._pending.get(key)
        if records is None:
            self._pending[key] = [(value, timestamp)]
        else:
            records.append((value, timestamp))
        self.size += 1
        return True

    def take(self, watermark: float) -> list[tuple[Any, Any, int]]:
        pending, self._pending = self._pending, {}
        self.size = 0
        until = watermark if self._fires and watermark != math.inf else None
        return [(key, (until, records), len(records)) for key, records in pending.items()]

    def fold(self, taken: Any, context: BundleContext, ctx: Any) -> None:
        until, records = taken
        if until is not None and not ctx.timer_service._registered("event-time"):
            self._replay(records, None, until, context, ctx)  # nothing stored (see module)
            return
        self.function.together.async_value().on_complete(
            lambda held: self._replay(records, held, until, context, ctx)
        )

    def _replay(
        self, records: list[tuple[Any, float]], held: Any, until: float | None,
        context: BundleContext, ctx: Any,
    ) -> None:  # fmt: skip
        """``session_path.place`` per record, on the key's sessions and contents in
        memory; at a watermark ``until`` the due sessions fire; then one write (if
        they changed)."""
        function = self.function
        assigner = function.assigner
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
                if place(
                    function, ctx, sessions, memory, value, timestamp, window, watermark, net
                ):
                    changed = True
            except BaseException:
                context.value = value
                raise
        if net is not None and until is not None:  # (net exists exactly when until does)
            changed = self._fire_due(sessions, memory, until, context, ctx, net) or changed
            net.apply()
        if changed and (held or sessions):  # nothing stored and nothing left: no write
            function.together.async_update(encode(sessions, memory))  # not awaited

    def _fire_due(
        self, sessions: list[Any], memory: dict[tuple[float, float], Any], until: float,
        context: BundleContext, ctx: Any, net: NetTimers,
    ) -> bool:  # fmt: skip
        """Fire and remove the sessions ending at or before ``until``, in order of end
        (``session_path.on_timer`` at each end, lateness 0); True if any went."""
        due = sorted((w for w in sessions if w.end <= until), key=by_end)
        if not due:
            return False
        function = self.function
        for window in due:
            net.delete_event_time_timer(window.end)  # fires here, now
            sessions.remove(window)
            stored = memory.pop((window.start, window.end), None)
            if stored is not None:
                emit_at_watermark(function, Scope(ctx, function), context, window, stored, until)
        return True
