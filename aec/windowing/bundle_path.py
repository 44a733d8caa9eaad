"""On-time records of event-time tumbling windows (and of sliding windows' panes)
in mini-batches: the function's ``aec.runtime.bundle.Bundle``.

Where it applies: the callback paths ``hot_path`` (tumbling) and ``pane_path``
(sliding windows as panes, chain mode) in event time, that is the built-in trigger,
an aggregate, a reduce or the list of values, no evictor, a plain process function;
and the operator bundles only asynchronous runs in serial watermark order.

What it takes: a record whose window (pane) fires nothing yet: its tumbling window
ends after the current watermark (not late, no late firing), or every window of
its pane does. Everything else (no timestamp, late records, late firings) is
declined and runs as a record of its own, as before, in arrival order.

What it keeps: per firing time (the window's end; a pane's first window's end),
the slot (``(start, end)``, the contents' key; or the pane index) and per key the
values in arrival order. Nothing is folded early: a stored accumulator is folded
first, then the values, with the same ``add`` / ``reduce`` calls as record by record.

When it gives them back (``take``): before a watermark at or after the firing time
leaves (the operator asks before the watermark closes its epoch), before a
snapshot, at the end of input, and at ``BUNDLE_LIMIT`` records. Until then nothing
can observe the slot: no timer of it is due (its end is after every watermark so
far), a record of the same key that runs on its own touches only windows that
fire already (other slots), and in serial order no record after a watermark starts
before it left.

How it folds (``fold``, one derived context per key, in the closing epoch): one
read per slot, all sent together; then per slot what the record-by-record path
does for its first record (stored value absent) or its later ones: the fold, one
write, and for a new slot the end timer (and the cleanup timer at ``end +
allowed_lateness``), or for a new pane the chain's timer at its first window's end.
The watermark the fold sees is the one the records saw when they arrived (no
watermark at or after their firing time has come since), so the same timers
result. At a watermark, the key's due timers of tumbling windows (and of panes
without a process function) fire in the fold instead (``_fire_windows``,
``_fold_and_fire``). So the outputs, the side outputs and the final state are the
synchronous run's (the property tests compare them); the records make no requests
of their own (``requests``, ``batches`` and ``blocked_requests`` fall).
"""

from __future__ import annotations

import math
from typing import Any

from aec.runtime.bundle import BundleContext
from aec.windowing import hot_path, pane_path, session_path
from aec.windowing.contents import AggregateContents
from aec.windowing.context import Scope
from aec.windowing.hot_path import when_read
from aec.windowing.session_bundle import SessionBundle
from aec.windowing.windows import TimeWindow


def make(function: Any) -> WindowBundle | SessionBundle | None:
    """The bundle of ``function`` (a ``WindowOperatorFunction``, opened), or None when
    its windows cannot be bundled."""
    if not function.event_time or function.contents.keeps_timestamps:
        return None
    if function.hot is hot_path:
        return WindowBundle(function, panes=False)
    if function.hot is pane_path:
        return WindowBundle(function, panes=True)
    if function.hot is session_path:
        return SessionBundle(function)
    return None


class WindowBundle:
    """A ``Bundle`` of a window function's on-time records (see the module)."""

    def __init__(self, function: Any, panes: bool) -> None:
        self.size = 0
        self.function = function
        self.panes = panes
        # firing time -> ((start, end), {key: [value, ...]}) for tumbling windows;
        # pane index -> (its first window's end, {key: [value, ...]}) for panes
        self._pending: dict[float, tuple[Any, dict[Any, list[Any]]]] = {}
        assigner = function.assigner
        self._offset, self._slide, self._length = assigner.offset, assigner.slide, assigner.size
        contents = function.contents
        self._inner = contents.inner if panes else contents
        if panes:
            self._g, self._n, self._r = contents.g, contents.n, contents.r
        folder = self._inner
        self._aggregate = folder.function if type(folder) is AggregateContents else None
        self._low, self._high, self._last = math.inf, -math.inf, (0, 0.0)  # see offer
        # a flush at a watermark also fires the key's due panes (see _fold_and_fire), or
        # its due tumbling windows (see _fire_windows)
        self._fires = not panes or function.process_fn is None

    # -- taking records ----------------------------------------------------------------------
    def offer(self, key: Any, value: Any, timestamp: float | None, watermark: float) -> bool:
        if timestamp is None:
            return False  # the record's own path fails the run, naming the timestamp
        offset = self._offset
        slot: Any
        try:
            if self.panes:  # PaneContents.pane and window_range, inlined
                if self._low <= timestamp < self._high:  # the last record's pane
                    slot, due = self._last
                else:
                    g = self._g
                    j = math.floor((timestamp - offset) / g)
                    if offset + j * g > timestamp:
                        j -= 1
                    elif offset + (j + 1) * g <= timestamp:
                        j += 1
                    first = -((self._n - 1 - j) // self._r)
                    due = offset + first * self._slide + self._length  # its first window's end
                    slot = j
                    low, high = offset + j * g, offset + (j + 1) * g
                    # pane() gives j for every t in [low, high): remember it (not for
                    # grids so far out that floor's estimate could be off by two)
                    if low <= timestamp < high and -(2**40) < j < 2**40:
                        self._low, self._high, self._last = low, high, (j, due)
            else:  # hot_path.on_record's window: bit-for-bit the same
                start = offset + math.floor((timestamp - offset) / self._slide) * self._slide
                due = start + self._length
                slot = None
        except (OverflowError, ValueError):  # an infinite timestamp: its own path decides
            return False
        if due <= watermark:
            return False  # late, a late firing, or a pane with a fired window
        # tumbling: by firing time (one window each); panes: by index (with r > 1 panes
        # per slide, several panes share a first window and so a firing time)
        at = slot if self.panes else due
        pending = self._pending.get(at)
        if pending is None:
            self._pending[at] = (due if self.panes else (start, due), {key: [value]})
        else:
            values = pending[1].get(key)
            if values is None:
                pending[1][key] = [value]
            else:
                values.append(value)
        self.size += 1
        return True

    def take(self, watermark: float) -> list[tuple[Any, Any, int]]:
        pending = self._pending
        if self.panes:  # pane index -> (its first window's end, values by key)
            due = sorted(j for j, (time, _) in pending.items() if time <= watermark)
        else:  # window end -> ((start, end), values by key)
            due = sorted(t for t in pending if t <= watermark)
        shares: dict[Any, list[tuple[Any, list[Any]]]] = {}
        for at in due:
            slot, by_key = pending.pop(at)
            if self.panes:
                slot = at
            for key, values in by_key.items():
                share = shares.get(key)
                if share is None:
                    shares[key] = [(slot, values)]
                else:
                    share.append((slot, values))
        # panes fire in the flush when it is a watermark's (see fold)
        until = watermark if self._fires and watermark != math.inf else None
        taken = []
        for key, share in shares.items():
            records = sum(len(values) for _, values in share)
            self.size -= records
            taken.append((key, (until, share), records))
        return taken

    # -- folding -------------------------------------------------------------------------------
    def fold(self, taken: Any, context: BundleContext, ctx: Any) -> None:
        until, share = taken
        store = self._inner.store
        if until is not None and not self.panes:
            self._fire_windows(share, until, context, ctx)
            return
        if until is not None:
            # entries as they come (``tuple`` of a pair is the pair: no Python call each)
            store.async_entries().on_complete(
                lambda entries: entries.on_next(tuple).on_complete(
                    lambda pairs: self._fold_and_fire(share, dict(pairs), until, context, ctx)
                )
            )
            return
        reads = [store.async_get(slot) for slot, _ in share]
        when_read(reads, lambda stored: self._write(share, stored, context, ctx))

    def _fold_and_fire(
        self, share: list[tuple[Any, list[Any]]], found: dict[int, Any], until: float,
        context: BundleContext, ctx: Any,
    ) -> None:  # fmt: skip
        """Panes at a watermark ``until``: fold the share into the key's panes (one scan),
        then fire what the chain's timer would fire at ``until``: every window of the key
        holding a pane, ending after the records' watermark and at or before ``until``
        (``pane_path.fire_due``: its timers are deleted, the next one registered). Only
        without a process function, which could read the watermark (here the records',
        at the timer the firing one's); the outputs and state are the timer's."""
        stored = len(found)  # panes in state before the fold
        for slot, values in share:
            found[slot] = self._folded(found.get(slot), values, context)
        dirty = [slot for slot, _ in share]
        removed: list[int] = []
        if found:
            watermark = ctx.timer_service.current_watermark()
            offset, slide, size = self._offset, self._slide, self._length
            # the first window not fired yet: its end is after the records' watermark
            lowest = -((self._n - 1 - min(found)) // self._r)  # the first pane's first window
            k = lowest
            if watermark != -math.inf:
                k = max(k, math.floor((watermark - offset - size) / slide))
                while offset + k * slide + size <= watermark:
                    k += 1
                while k > lowest and offset + (k - 1) * slide + size > watermark:
                    k -= 1  # float rounding of the estimate
            pane_path.fire_due(self.function, ctx, found, k, until, removed)
        store = self._inner.store
        if removed and stored:
            # the key's live panes are few (chain mode): one clear and one put_all of
            # them instead of a remove per fired-away pane and a put_all of the new ones
            store.async_clear()
            if found:
                store.async_put_all(found)
            return
        written = {slot: found[slot] for slot in dirty if slot in found}  # not fired away
        if len(written) > 1:
            store.async_put_all(written)  # one request
        elif written:
            ((slot, value),) = written.items()
            store.async_put(slot, value)

    def _fire_windows(
        self, share: list[tuple[Any, list[Any]]], until: float, context: BundleContext,
        ctx: Any,
    ) -> None:  # fmt: skip
        """Tumbling windows at a watermark ``until``: every window of the share ends at
        or before ``until`` (``take`` gives back only those), so its end timer would
        fire at ``until``. The key's timers at or before ``until`` fire here instead, in
        order, with the share folded in first: each end fires its window (emitted, the
        process function seeing ``until``), each cleanup time (``end +
        allowed_lateness``) removes its window; a share window whose cleanup time is
        after ``until`` is written and gets its cleanup timer, one cleaned by ``until``
        is never written. A window is in state only while its end or cleanup timer is
        registered (the first write registers both; the cleanup removes both), so only
        windows ending at a registered timer are read; the others start empty."""
        due = ctx.timer_service._due("event-time", until)
        assigner, lateness = self.function.assigner, self.function.lateness
        slots = {slot[1]: slot for slot, _ in share}  # end -> (start, end)
        reads = []  # windows that may be stored and fire now: their end is a timer
        for end in due:
            slot = slots.get(end) or hot_path.ending_at(assigner, end)
            if slot is not None:
                reads.append(slot)
        cleaned = []  # windows whose cleanup timer fires now (absent ones: no-op removes)
        if 0 < lateness < math.inf:  # an infinite lateness never cleans
            for t in due:
                slot = hot_path.ending_at(assigner, t - lateness) if math.isfinite(t) else None
                if slot is not None:
                    cleaned.append(slot)
        if not reads:
            self._fire(share, {}, due, cleaned, until, context, ctx)
            return
        store = self._inner.store
        when_read(
            [store.async_get(slot) for slot in reads],
            lambda values: self._fire(
                share, dict(zip(reads, values, strict=True)), due, cleaned, until, context,
                ctx,
            ),
        )  # fmt: skip

    def _fire(
        self, share: list[tuple[Any, list[Any]]], stored: dict[Any, Any], due: list[float],
        cleaned: list[Any], until: float, context: BundleContext, ctx: Any,
    ) -> None:  # fmt: skip
        """``_fire_windows``' firings: ``stored`` maps the windows ending at a due timer
        to their contents (None: absent), ``cleaned`` the windows whose cleanup timer is
        due."""
        windows = dict(stored)  # the windows that fire now -> contents
        for slot, values in share:
            windows[slot] = self._folded(windows.get(slot), values, context)
        shared = {slot for slot, _ in share}
        function = self.function
        lateness = function.lateness
        service = ctx.timer_service
        store = self._inner.store
        for t in due:  # each fires here, now (seen from the records' watermark)
            service.delete_event_time_timer(t)
        scope = Scope(ctx, function)
        gone = set(cleaned)
        for slot in sorted(windows, key=_end):
            value = windows[slot]
            if value is not None:
                window = TimeWindow.trusted(*slot)
                hot_path.emit_at_watermark(function, scope, context, window, value, until)
            cleanup = slot[1] + lateness
            if cleanup <= until:
                gone.add(slot)  # cleaned by ``until`` too: removed, or never written
            elif slot in shared:
                store.async_put(slot, value)  # kept for late records until its cleanup
                if cleanup != math.inf:
                    service.register_event_time_timer(cleanup)
        for slot in sorted(gone, key=_end):
            # a window stored before (read, or cleaned without a read) is removed; one
            # that only the share filled was never written
            if stored.get(slot) is not None or slot not in windows:
                store.async_remove(slot)

    def _write(
        self, share: list[tuple[Any, list[Any]]], stored: list[Any], context: BundleContext,
        ctx: Any,
    ) -> None:  # fmt: skip
        store = self._inner.store
        service = ctx.timer_service
        function = self.function
        for position, ((slot, values), before) in enumerate(zip(share, stored, strict=True)):
            store.async_put(slot, self._folded(before, values, context))
            if before is not None:
                continue  # the slot's timers are registered; the built-in trigger continues
            if self.panes:  # pane_path.on_record: the chain's timer
                if position:
                    # an earlier pane of the share (in order of first window) starts
                    # or has a chain that reaches this pane's windows: no timer of its own
                    continue
                offset, slide, size = self._offset, self._slide, self._length
                k = -((self._n - 1 - slot) // self._r)
                watermark = service.current_watermark()
                while offset + k * slide + size <= watermark:
                    k += 1
                service.register_event_time_timer(offset + k * slide + size)
                continue
            end = slot[1]  # hot_path.on_record: the cleanup timer, then the trigger's
            if function.lateness > 0:
                cleanup = end + function.lateness
                if cleanup != math.inf:
                    service.register_event_time_timer(cleanup)
            service.register_event_time_timer(end)

    def _folded(self, stored: Any, values: list[Any], context: BundleContext) -> Any:
        """``stored`` with ``values`` folded in, in arrival order (as record by record).
        A raising ``add``/``reduce`` blames its record (``context.value``)."""
        value = None
        try:
            aggregate = self._aggregate
            if aggregate is not None:  # AggregateContents.fold, inlined
                add, create = aggregate.add, aggregate.create_accumulator
                for value in values:
                    stored = add(value, create() if stored is None else stored)
                return stored
            fold = self._inner.fold
            for value in values:
                stored = fold(stored, value, 0.0)
            return stored
        except BaseException:
            context.value = value
            raise


def _end(slot: tuple[float, float]) -> float:
    return slot[1]
