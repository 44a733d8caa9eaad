"""Event-time session records in mini-batches: the ``aec.runtime.bundle.Bundle`` of
``session_path`` (asynchronous runs in serial watermark order only).

Unlike a tumbling window's, a session record may touch any session of its key, so
the bundle takes *every* record of the function (but one without a timestamp, whose
own path fails the run) and keeps each key's records in arrival order. Before each
watermark leaves (and before a snapshot, at the end of input and at the size bound)
one derived context per key folds them: it reads the key's session set, then, in one
round trip, the contents of the stored sessions its records' windows touch, replays
the records one by one exactly as ``session_path._place`` does (the same
``add_session`` steps, merges, folds, late firings, late side outputs, timer
registrations and deletions, in the same order, with the records' watermark: no
watermark came since they arrived), and writes each touched session once and the set
once. So per key the outputs, side outputs and final state are the record-by-record
run's; a key's records cost one context and two or three round trips per watermark
instead of one context and two round trips each.

Why nothing can observe a key's records before their fold: every later record of the
key is bundled too (so it cannot run before them), its timers fire only after the
watermark that closes the epoch, and the fold runs before that watermark closes it.
"""

from __future__ import annotations

from typing import Any

from aec.runtime.bundle import BundleContext
from aec.windowing.hot_path import when_read
from aec.windowing.merging import add_session, decode_sessions, encode_sessions
from aec.windowing.session_path import element_fired, merge_timers
from aec.windowing.windows import window_key


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
        self.function.sessions.async_value().on_complete(
            lambda held: self._load(records, decode_sessions(held), context, ctx)
        )

    def _load(
        self, records: list[tuple[Any, float]], held: list[Any], context: BundleContext,
        ctx: Any,
    ) -> None:  # fmt: skip
        """Read the stored sessions the records' windows touch (a record merges with, or
        lies inside, only sessions its own window intersects), then replay."""
        assigner = self.function.assigner
        windows = []
        for value, timestamp in records:
            try:
                (window,) = assigner.assign_windows(value, timestamp)
            except BaseException:
                context.value = value
                raise
            windows.append(window)
        touched = [s for s in held if any(s.intersects(w) for w in windows)]
        if not touched:
            self._replay(records, windows, held, {}, context, ctx)
            return
        store = self.function.contents.store
        keys = [window_key(s) for s in touched]
        when_read(
            [store.async_get(k) for k in keys],
            lambda values: self._replay(
                records, windows, held, dict(zip(keys, values, strict=True)), context, ctx
            ),
        )

    def _replay(
        self, records: list[tuple[Any, float]], windows: list[Any], held: list[Any],
        stored: dict[Any, Any], context: BundleContext, ctx: Any,
    ) -> None:  # fmt: skip
        """``session_path._place`` per record, on the set and contents in memory."""
        function = self.function
        contents = function.contents
        service = ctx.timer_service
        watermark = service.current_watermark()
        sessions = list(held)
        memory = dict(stored)  # window key -> contents now (absent: nothing stored)
        for (value, timestamp), window in zip(records, windows, strict=True):
            try:
                before = set(sessions)
                actual, merged = add_session(sessions, window)
                moved = False
                if merged:
                    merge_timers(function, service, sessions, actual, merged, watermark)
                    present = [memory.pop(window_key(w), None) for w in merged]
                    present = [v for v in present if v is not None]
                    current = contents.merge(present) if present else None
                    moved = bool(present)
                elif actual in before:  # inside (or equal to) a session
                    current = memory.get(window_key(actual))
                else:  # a new session
                    current = None
                key = window_key(actual)
                if function.is_late(actual, watermark):
                    sessions.remove(actual)  # Flink's retireWindow
                    if moved:
                        memory[key] = current
                    if timestamp + function.lateness <= watermark:
                        function._late(ctx, value, timestamp, watermark)
                    continue
                folded = contents.fold(current, value, timestamp)
                memory[key] = folded
                element_fired(
                    function, ctx, actual, folded, bool(merged) or current is None, watermark
                )
            except BaseException:
                context.value = value
                raise
        store = contents.store
        for key, value in memory.items():  # each touched session once
            if stored.get(key, _UNSET) is not value:
                store.async_put(key, value)
        for key in stored:
            if key not in memory:  # merged away
                store.async_remove(key)
        if sessions != held:
            function.sessions.async_update(encode_sessions(sessions))  # not awaited


_UNSET = object()
