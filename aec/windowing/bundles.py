"""On-time records of event-time tumbling windows and of sliding windows' panes in
mini-batches: the function's ``aec.runtime.bundle.Bundle`` (Flink SQL's
``MapBundleFunction``). Sessions have theirs in ``aec.windowing.session_bundle``.

Where it applies: the tumbling and pane callback drivers in event time, in runs that
may bundle (``aec.windowing.path``: asynchronous, serial watermark order).

What it takes: a record whose window (pane) fires nothing yet: its tumbling window
ends after the current watermark (not late, no late firing), or every window of its
pane does. Everything else (no timestamp, late records, late firings) is declined and
runs as a record of its own, as before, in arrival order.

What it keeps: per slot (a tumbling window's ``(start, end)``; a pane index) and key,
the values in arrival order, with the slot's firing time (the window's end; the end of
a pane's first window, ``Panes.due``). Nothing is folded early: a stored value is
folded first, then the values, with the same ``add`` / ``reduce`` calls as record by
record.

When it gives them back (``take``): before a watermark at or after the firing time
leaves (the operator asks before the watermark closes its epoch), before a snapshot,
at the end of input, and at ``BUNDLE_LIMIT`` records. Until then nothing can observe
the slot: no timer of it is due (its end is after every watermark so far), a record of
the same key that runs on its own touches only windows that fire already (other
slots), and in serial order no record after a watermark starts before it left.

How it folds (``fold``, one derived context per key, in the closing epoch): what the
record-by-record driver does for a slot's first record (stored value absent) or its
later ones, with the timers ``BuiltinTrigger.on_element`` (tumbling) or
``chain_start`` (panes) gives, seen from the watermark the records saw (no watermark
at or after their firing time came since). At a watermark, the key's due windows fire
in the fold instead of at their timers (``TumblingBundle._fire_windows``;
``PaneBundle._fold``, without a process function, which could read the
watermark). So the outputs, the side outputs and the final state are the synchronous
run's (the property tests compare them); the records make no requests of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, cast

from aec.elements import Time
from aec.functions import Context
from aec.runtime.bundle import BundleContext
from aec.state.future import StateFuture, combine_all
from aec.windowing.contents import AggregateContents, Contents
from aec.windowing.grid import Grid, Panes
from aec.windowing.panes import LivePanes, PaneContents
from aec.windowing.protocol import WindowFunction
from aec.windowing.sliding import PanesDriver
from aec.windowing.windows import TimeWindow

S = TypeVar("S", bound=Hashable)  # a slot: a tumbling window's (start, end), a pane index
Slot = tuple[Time, Time]  # a tumbling window's (start, end): its contents' map key
Share = list[tuple[S, list[object]]]  # one key's slots and their values, in slot order
Taken = tuple[Time | None, Share[S]]  # (the flushing watermark if the fold fires, share)


def emit_at_watermark(
    function: WindowFunction, context: BundleContext, ctx: Context, window: TimeWindow,
    stored: object, watermark: Time,
) -> None:  # fmt: skip
    """Emit a window fired by a flush as its timer's firing would: the flush ``context``
    reports ``watermark``, the flushing one, while the process function runs, then its
    records' watermark again; a failure names the window's timer (its end)."""
    records_watermark = context.watermark
    context.watermark = watermark
    context.firing = window.end
    try:
        function.emit(ctx, window, stored)
    finally:
        context.watermark = records_watermark
    context.firing = None  # kept by a failure, which names it


def when_read(reads: list[StateFuture], fn: Callable[[list[object]], None]) -> None:
    """Run ``fn(results)`` once every read of ``reads`` (one invocation's, in submission
    order) is done. A record's requests complete in submission order, so the last read's
    callback finds them all done: no combined future per firing (else ``combine_all``)."""

    def run(_: object) -> None:
        if all(read.is_done() for read in reads):
            fn([read.get() for read in reads])
        else:  # not expected; kept correct whatever the completion order
            combine_all(reads).on_complete(fn)

    reads[-1].on_complete(run)


class _SlotBundle(Generic[S]):
    """What both bundles share: the held values per firing time, slot and key."""

    def __init__(self, function: WindowFunction, inner: Contents) -> None:
        self.size = 0
        self.function = function
        self.inner = inner
        self.store = inner.store
        self.aggregate = inner.function if type(inner) is AggregateContents else None
        # key of the pending dict (see offer) -> (slot's firing time, slot, {key: values})
        self.pending: dict[Hashable, tuple[Time, S, dict[Hashable, list[object]]]] = {}

    def hold(self, at: Hashable, due: Time, slot: S, key: Hashable, value: object) -> None:
        """Keep ``value`` of ``key`` in ``slot`` (firing at ``due``), after the key's
        earlier values there."""
        held = self.pending
        pending = held.get(at)
        if pending is None:
            held[at] = (due, slot, {key: [value]})
        else:
            values = pending[2].get(key)
            if values is None:
                pending[2][key] = [value]
            else:
                values.append(value)
        self.size += 1

    def take_due(self, watermark: Time, fires: bool) -> list[tuple[Hashable, Taken[S], int]]:
        """Remove and return what must be in state before ``watermark`` leaves, per key
        in slot order; the fold fires at a finite watermark when ``fires``."""
        pending = self.pending
        due = sorted(at for at, (time, _, _) in pending.items() if time <= watermark)  # type: ignore[type-var]
        shares: dict[Hashable, Share[S]] = {}
        for at in due:
            _, slot, by_key = pending.pop(at)
            for key, values in by_key.items():
                share = shares.get(key)
                if share is None:
                    shares[key] = [(slot, values)]
                else:
                    share.append((slot, values))
        until = watermark if fires and watermark != math.inf else None
        taken = []
        for key, share in shares.items():
            records = sum(len(values) for _, values in share)
            self.size -= records
            taken.append((key, (until, share), records))
        return taken

    def folded(self, stored: object, values: list[object], context: BundleContext) -> object:
        """``stored`` with ``values`` folded in, in arrival order (as record by record).
        A raising ``add``/``reduce`` blames its record (``context.value``)."""
        value = None
        try:
            aggregate = self.aggregate
            if aggregate is not None:  # AggregateContents.fold, inlined
                add, create = aggregate.add, aggregate.create_accumulator
                for value in values:
                    stored = add(value, create() if stored is None else stored)
                return stored
            fold = self.inner.fold
            for value in values:
                stored = fold(stored, value, 0.0)
            return stored
        except BaseException:
            context.value = value
            raise


class TumblingBundle(_SlotBundle[Slot]):
    """A ``Bundle`` of an event-time tumbling window function's on-time records."""

    def __init__(self, function: WindowFunction) -> None:
        super().__init__(function, cast(Contents, function.contents))
        self.grid = cast(Grid, function.grid)
        self.slot_of = self.grid.slot  # bound once: called per record
        self.rules = function.rules
        # see offer; typed Time: compiled, a float attribute would round int times
        self.low: Time = math.inf
        self.high: Time = -math.inf
        self.last: Slot = (math.nan, math.nan)

    def offer(self, key: Hashable, value: object, timestamp: Time | None, watermark: Time) -> bool:
        if timestamp is None:
            return False  # the record's own path fails the run, naming the timestamp
        if self.low <= timestamp <= self.high:  # between two times of the last slot
            slot = self.last
        else:
            try:
                slot = self.slot_of(timestamp)  # the tumbling driver's window
            except (OverflowError, ValueError):  # an infinite timestamp: its own path decides
                return False
            self.remember(slot, timestamp)
        end = slot[1]
        if end <= watermark:
            return False  # late, or a late firing
        self.hold(end, end, slot, key, value)  # one window per firing time
        return True

    def remember(self, slot: Slot, timestamp: Time) -> None:
        """Keep the times that surely have ``slot``: ``Grid.slot`` is monotone in the time,
        so when the window's first and last float times both have it, every time of the
        window does (else only ``timestamp`` is known to)."""
        start, end = slot
        last = math.nextafter(end, -math.inf)
        try:
            whole = self.slot_of(start) == slot and self.slot_of(last) == slot
        except (OverflowError, ValueError):  # a window at the end of the float range
            whole = False
        if whole:
            self.low, self.high = start, last
        else:  # a float boundary of the formula: ask it again for the next time
            self.low = self.high = timestamp
        self.last = slot

    def take(self, watermark: Time) -> list[tuple[Hashable, Taken[Slot], int]]:
        return self.take_due(watermark, True)

    def fold(self, taken: Taken[Slot], context: BundleContext, ctx: Context) -> None:
        until, share = taken
        if until is not None:
            self._fire_windows(share, until, context, ctx)
            return
        store = self.store
        when_read(
            [store.async_get(slot) for slot, _ in share],
            lambda stored: self._write(share, stored, context, ctx),
        )

    def _write(self, share: Share[Slot], stored: list[object], context: BundleContext, ctx: Context) -> None:
        """The share folded onto the stored values and written; a new window's timers."""
        store, rules, service = self.store, self.rules, ctx.timer_service
        for (slot, values), before in zip(share, stored, strict=True):
            store.async_put(slot, self.folded(before, values, context))
            # never fires: a bundled window ends after the records' watermark
            _, timers = rules.on_element(slot[1], service.current_watermark(), before is None)
            for time in timers:
                service.register_event_time_timer(time)

    def _fire_windows(self, share: Share[Slot], until: Time, context: BundleContext, ctx: Context) -> None:
        """At a watermark ``until``: every window of the share ends at or before ``until``
        (``take`` gives back only those), so its end timer would fire at ``until``. The
        key's timers at or before ``until`` fire here instead, in order, with the share
        folded in first: each end fires its window (emitted, the process function seeing
        ``until``), each cleanup time removes its window (``BuiltinTrigger.grid_timer``);
        a share window whose cleanup time is after ``until`` is written and gets its
        cleanup timer, one cleaned by ``until`` is never written. A window is in state
        only while its end or cleanup timer is registered (the first write registers
        both; the cleanup removes both), so only windows ending at a registered timer are
        read; the others start empty."""
        due = ctx.timer_service.due_timers("event-time", until)
        grid, rules = self.grid, self.rules
        slots = {slot[1]: slot for slot, _ in share}  # end -> (start, end)
        reads = []  # windows that may be stored and fire now: their end is a timer
        cleaned = []  # windows whose cleanup timer fires now (absent ones: no-op removes)
        for time in due:
            fires, cleans = rules.grid_timer(grid, time)
            slot = slots.get(time)
            if slot is None and fires is not None:
                slot = (grid.start(fires), grid.end(fires))
            if slot is not None:
                reads.append(slot)
            if cleans is not None and cleans != fires:
                cleaned.append((grid.start(cleans), grid.end(cleans)))
        if not reads:
            self._fire(share, {}, due, cleaned, until, context, ctx)
            return
        store = self.store
        when_read(
            [store.async_get(slot) for slot in reads],
            lambda values: self._fire(
                share, dict(zip(reads, values, strict=True)), due, cleaned, until, context,
                ctx,
            ),
        )  # fmt: skip

    def _fire(
        self, share: Share[Slot], stored: dict[tuple[Time, Time], object], due: list[Time],
        cleaned: list[tuple[Time, Time]], until: Time, context: BundleContext, ctx: Context,
    ) -> None:  # fmt: skip
        """``_fire_windows``' firings: ``stored`` maps the windows ending at a due timer
        to their contents (None: absent), ``cleaned`` the windows whose cleanup timer is
        due."""
        windows = dict(stored)  # the windows that fire now -> contents
        for slot, values in share:
            windows[slot] = self.folded(windows.get(slot), values, context)
        shared = {slot for slot, _ in share}
        function, rules, store = self.function, self.rules, self.store
        service = ctx.timer_service
        for time in due:  # each fires here, now (seen from the records' watermark)
            service.delete_event_time_timer(time)
        gone = set(cleaned)
        for slot in sorted(windows, key=_end):
            value = windows[slot]
            if value is not None:
                window = TimeWindow.trusted(*slot)
                emit_at_watermark(function, context, ctx, window, value, until)
            cleanup = rules.cleanup_time(slot[1])
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


class PaneBundle(_SlotBundle[int]):
    """A ``Bundle`` of event-time sliding windows' on-time records, by pane."""

    def __init__(self, function: WindowFunction, driver: PanesDriver) -> None:
        contents = cast(PaneContents, function.contents)
        super().__init__(function, contents.inner)
        self.live = contents.live_state()  # chain mode: the key's panes are one value
        self.panes = cast(Panes, function.panes)
        self.rules = function.rules
        self.driver = driver
        self.low: Time = math.inf  # see offer; Time as TumblingBundle's
        self.high: Time = -math.inf
        self.last: tuple[int, Time] = (0, 0.0)
        # a flush at a watermark also fires the key's due panes (see _fold_and_fire)
        self.fires = function.process_fn is None

    def offer(self, key: Hashable, value: object, timestamp: Time | None, watermark: Time) -> bool:
        if timestamp is None:
            return False  # the record's own path fails the run, naming the timestamp
        if self.low <= timestamp < self.high:  # the last record's pane
            j, due = self.last
        else:
            panes = self.panes
            try:
                j = panes.pane(timestamp)
            except (OverflowError, ValueError):  # an infinite timestamp: its own path decides
                return False
            due = panes.due(j)
            low, high = panes.offset + j * panes.g, panes.offset + (j + 1) * panes.g
            # pane() gives j for every t in [low, high): remember it (not for grids so far
            # out that floor's estimate could be off by two)
            if low <= timestamp < high and -(2**40) < j < 2**40:
                self.low, self.high, self.last = low, high, (j, due)
        if due <= watermark:
            return False  # a pane with a fired window
        # by index: with several panes per slide, panes share a first window (a firing time)
        self.hold(j, due, j, key, value)
        return True

    def take(self, watermark: Time) -> list[tuple[Hashable, Taken[int], int]]:
        return self.take_due(watermark, self.fires)

    def fold(self, taken: Taken[int], context: BundleContext, ctx: Context) -> None:
        until, share = taken
        self.live.async_value().on_complete(
            lambda held: self._fold(share, held, until, context, ctx)
        )

    def _fold(
        self, share: Share[int], held: LivePanes | None, until: Time | None,
        context: BundleContext, ctx: Context,
    ) -> None:  # fmt: skip
        """Fold the share into the key's panes (one read, one write); at a watermark
        ``until``, then fire what the chain's timer would fire at ``until``: every window
        of the key holding a pane, ending after the records' watermark and at or before
        ``until`` (``PanesDriver.fire_due``: their timers are deleted, the next one
        registered). Else a new pane starts the chain, as record by record: only the
        first new one (in order of first window; an earlier pane of the share starts or
        has a chain that reaches a later one's windows)."""
        found = dict(held) if held else {}  # the stored value is never changed in place
        service = ctx.timer_service
        watermark = service.current_watermark()  # the records'
        first = share[0][0]
        new = first not in found  # the share's first pane starts the chain (see below)
        folded = self.folded
        for slot, values in share:
            found[slot] = folded(found.get(slot), values, context)
        panes = self.panes
        if until is not None:
            # the first window not fired yet: its end is after the records' watermark
            k = panes.first_open(panes.first_window(min(found)), watermark)
            self.driver.fire_due(ctx, found, k, until, flush=context)
            context.firing = None  # kept by a failure, which names it
        elif new:
            service.register_event_time_timer(self.rules.chain_start(panes, first, watermark))
        if found or held:  # nothing stored and nothing left: no write
            self.live.async_update(found or None)


def _end(slot: tuple[Time, Time]) -> Time:
    return slot[1]
