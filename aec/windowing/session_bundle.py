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
"""

from __future__ import annotations

from typing import Any

from aec.runtime.bundle import BundleContext
from aec.windowing.session_path import decode, encode, place


class SessionBundle:
    """A ``Bundle`` of an event-time session function's records (see the module)."""

    def __init__(self, function: Any) -> None:
        self.size = 0
        self.function = function
        self._pending: dict[Any, list[tuple[Any, float]]] = {}  # key -> (value, t), in order

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
        return [(key, records, len(records)) for key, records in pending.items()]

    def fold(self, records: list[tuple[Any, float]], context: BundleContext, ctx: Any) -> None:
        self.function.together.async_value().on_complete(
            lambda held: self._replay(records, held, context, ctx)
        )

    def _replay(
        self, records: list[tuple[Any, float]], held: Any, context: BundleContext, ctx: Any
    ) -> None:
        """``session_path.place`` per record, on the key's sessions and contents in
        memory; then one write (if they changed)."""
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
        watermark = ctx.timer_service.current_watermark()
        changed = False
        for (value, timestamp), window in zip(records, windows, strict=True):
            try:
                if place(function, ctx, sessions, memory, value, timestamp, window, watermark):
                    changed = True
            except BaseException:
                context.value = value
                raise
        if changed:
            function.together.async_update(encode(sessions, memory))  # not awaited
