"""Timer queues: per-key timers of one time domain, in timestamp order.

A binary heap (``heapq``) of ``(timestamp, sequence, key)`` entries orders the timers
across keys (docs/semantics.md rule 8). A deleted or fired timer's entry is left in
the heap, dead, and dropped when it comes to the top: a delete is a dict removal, not
a search. Invariants:
- An entry is live iff ``_by_key[key][timestamp]`` holds its sequence; each live timer
  has exactly one entry, in the heap or (taken, below) in ``_taken``. ``_live`` counts
  the live entries, ``_dead`` the others in the heap; once the dead outnumber the live
  by ``_SLACK`` the heap is rebuilt from its live entries (it holds about twice the
  timers at most, however many fired).
- A (key, timestamp) pair is registered at most once (duplicates fire once).
- ``due_keys`` takes each due key's first timer off the heap (``_taken``) instead of
  pushing it back, as ``pop_next_for_key`` fires it next (the firing loop calls it
  for those keys at once, in order); a taken entry is live and counts in ``_live``,
  not in the heap, and ``_sorted`` still sees it.
- ``pop_earliest`` yields timers in (timestamp, registration) order across keys.
- Each timer remembers the epoch that registered it, so a firing can skip
  timers registered by records that arrived after the firing watermark
  (possible only in ``parallel`` watermark order).
- In ``parallel`` order a record may register or delete a timer that, in the
  synchronous run, had already fired before the record arrived (its timestamp
  is at or below the record's arrival watermark). Such a registration is kept
  aside ("re-armed") and added once the old timer fired; such a deletion only
  cancels the re-armed one. So every order fires the same timers.
- Only epochs closed by this queue's own time domain fire its timers (a
  watermark fires event-time timers, a clock tick processing-time ones), so
  "had it fired before the record arrived" asks whether such a boundary lies
  between the registering epoch and the record's (``boundary``), not whether
  the epoch number moved on.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Container, Hashable, Mapping
from heapq import heapify, heappop, heappush
from typing import Any, TypedDict

from aec.elements import Time
from aec.keygroups import plain_key

_NONE: frozenset[Time] = frozenset()
_TIMES = (int, float)  # a restored timestamp's types (bool excluded)
_SLACK = 1024  # dead heap entries tolerated beyond the live ones before a rebuild
Entry = tuple[Time, int, Hashable]  # (timestamp, sequence, key): a heap entry


class ExportedTimers(TypedDict):
    """A ``TimerQueue`` as plain data (``TimerQueue.export``)."""

    timers: list[tuple[Time, int, Hashable, int]]  # (timestamp, sequence, key, epoch)
    sequence: int
    rearmed: list[tuple[Hashable, Time, list[int]]]  # (key, timestamp, epochs)
    boundaries: list[int]


class TimerQueue:
    """The timers of one time domain (event time or processing time)."""

    __slots__ = (
        "_heap", "_live", "_dead", "_by_key", "_times", "_sequence", "_rearmed", "_boundaries",
        "_taken",
    )  # fmt: skip

    def __init__(self) -> None:
        self._heap: list[Entry] = []  # live and dead entries (see the module)
        self._live = 0
        self._dead = 0
        self._by_key: dict[Hashable, dict[Time, tuple[int, int]]] = {}  # key -> t -> (seq, epoch)
        # key -> its timestamps, ascending: a key's next timer without scanning all of
        # them (a window with allowed lateness holds a cleanup timer per open window)
        self._times: dict[Hashable, list[Time]] = {}
        self._sequence = 0
        # (key, t) -> epochs of registrations waiting for the current one to fire
        self._rearmed: dict[tuple[Hashable, Time], list[int]] = {}
        self._boundaries: list[int] = []  # epochs closed by this domain, ascending
        self._taken: dict[Hashable, Entry] = {}  # key -> its due entry off the heap

    def boundary(self, epoch: int) -> None:
        """Epoch ``epoch`` was closed by an element of this queue's time domain (it
        fires this queue's due timers). Called in arrival order."""
        self._boundaries.append(epoch)

    def __len__(self) -> int:
        return self._live

    def register(
        self, key: Hashable, timestamp: Time, epoch: int, arrival_watermark: Time = -math.inf
    ) -> bool:
        """Add a timer registered by code of ``epoch``; ``arrival_watermark`` is the
        registering record's (-inf for timer code). False if it is a duplicate."""
        timers = self._by_key.get(key)
        if timers is None:
            timers = self._by_key[key] = {}
            self._times[key] = [timestamp]
        elif timestamp in timers:
            if self._fired_before(key, timestamp, timers, epoch, arrival_watermark):
                self._rearmed.setdefault((key, timestamp), []).append(epoch)
                return True
            return False
        else:
            insort(self._times[key], timestamp)
        sequence = self._sequence = self._sequence + 1
        timers[timestamp] = (sequence, epoch)
        heappush(self._heap, (timestamp, sequence, key))
        self._live += 1
        return True

    def timestamps(self, key: Hashable) -> Container[Time]:
        """The timestamps of ``key``'s registered timers, for membership tests: a live
        view while the key has timers; an empty container (not live) when it has none."""
        timers = self._by_key.get(key)
        return _NONE if timers is None else timers

    def due(self, key: Hashable, until: Time) -> list[Time]:
        """``key``'s timer timestamps at or before ``until``, ascending (a copy)."""
        times = self._times.get(key)
        if times is None:
            return []
        return times[: bisect_right(times, until)]

    def delete(
        self, key: Hashable, timestamp: Time, epoch: int = 0, arrival_watermark: Time = -math.inf
    ) -> bool:
        """Remove a timer as seen by code of ``epoch`` (see ``register``); False if
        there was none to remove."""
        timers = self._by_key.get(key)
        if not timers or timestamp not in timers:
            return False
        if self._fired_before(key, timestamp, timers, epoch, arrival_watermark):
            return False
        rearmed = self._rearmed.get((key, timestamp))
        if rearmed:
            rearmed.pop()
            if not rearmed:
                del self._rearmed[(key, timestamp)]
        else:
            self._remove(key, timestamp, timers)
        return True

    def _fired_before(
        self,
        key: Hashable,
        timestamp: Time,
        timers: dict[Time, tuple[int, int]],
        epoch: int,
        arrival_watermark: Time,
    ) -> bool:
        """Whether, in the synchronous run, the latest registration of this timer
        had fired before a record of ``epoch`` arrived after ``arrival_watermark``."""
        if timestamp > arrival_watermark:
            return False
        rearmed = self._rearmed.get((key, timestamp))
        latest = rearmed[-1] if rearmed else timers[timestamp][1]
        # fired iff one of this domain's boundaries closed an epoch in [latest, epoch)
        boundaries = self._boundaries
        index = bisect_left(boundaries, latest)
        return index < len(boundaries) and boundaries[index] < epoch

    def _remove(
        self, key: Hashable, timestamp: Time, timers: dict[Time, tuple[int, int]],
        popped: bool = False,
    ) -> None:  # fmt: skip
        """Forget a live timer; its heap entry stays, dead, unless ``popped`` (the
        caller took it off the heap)."""
        del timers[timestamp]
        if not timers:
            del self._by_key[key]
            del self._times[key]
        else:
            times = self._times[key]
            del times[bisect_left(times, timestamp)]
        self._live -= 1
        if not popped:
            dead = self._dead = self._dead + 1
            if dead > self._live + _SLACK:
                self._rebuild()

    def _is_live(self, entry: Entry) -> bool:
        timers = self._by_key.get(entry[2])
        if timers is None:
            return False
        found = timers.get(entry[0])
        return found is not None and found[0] == entry[1]

    def _rebuild(self) -> None:
        """The heap of the live entries only: O(entries), once per ``_live + _SLACK``
        deaths or more, so O(1) per timer."""
        heap = [entry for entry in self._heap if self._is_live(entry)]
        heapify(heap)
        self._heap, self._dead = heap, 0

    def _top(self) -> Entry | None:
        """The earliest live entry (the dead above it dropped), or None."""
        heap = self._heap
        while heap:
            entry = heap[0]
            if self._is_live(entry):
                return entry
            heappop(heap)
            self._dead -= 1
        return None

    def _pop_up_to(self, limit: Time) -> list[Entry]:
        """The live entries with timestamp <= ``limit`` in (timestamp, sequence) order,
        popped off the heap (the dead among them dropped): the caller pushes back those
        it keeps (``_push``)."""
        heap = self._heap
        found: list[Entry] = []
        while heap and heap[0][0] <= limit:
            entry = heappop(heap)
            if self._is_live(entry):
                found.append(entry)
            else:
                self._dead -= 1
        return found

    def _push(self, entries: list[Entry]) -> None:
        heap = self._heap
        for entry in entries:
            heappush(heap, entry)

    def _fired(self, key: Hashable, timestamp: Time, popped: bool = False) -> None:
        self._remove(key, timestamp, self._by_key[key], popped)
        if self._rearmed:
            rearmed = self._rearmed.get((key, timestamp))
            if rearmed:
                epoch = rearmed.pop(0)
                if not rearmed:
                    del self._rearmed[(key, timestamp)]
                self.register(key, timestamp, epoch)

    def peek_time(self) -> Time | None:
        """The earliest registered timestamp, or None."""
        top = self._top()
        return None if top is None else top[0]

    def any_in(self, after: Time, upto: Time) -> bool:
        """Whether a timer is registered at a time in ``(after, upto]``. O(timers at
        or below ``upto``, log n each)."""
        due = self._pop_up_to(upto)
        self._push(due)
        return any(entry[0] > after for entry in due)

    def pop_earliest(self, limit: Time) -> tuple[Time, Hashable] | None:
        """Remove and return the earliest ``(timestamp, key)`` with timestamp <= limit."""
        top = self._top()
        if top is None or top[0] > limit:
            return None
        heappop(self._heap)
        timestamp, _, key = top
        self._fired(key, timestamp, popped=True)
        return timestamp, key

    def due_keys(self, limit: Time, max_epoch: int) -> list[Hashable]:
        """Keys with a timer due at ``limit`` registered in an epoch <= ``max_epoch``,
        in the order of their earliest such timer. The caller fires each key's first
        such timer next (``pop_next_for_key``), before any other use of the queue:
        those entries wait off the heap (``_taken``) rather than being pushed back."""
        keys: dict[Hashable, None] = {}
        by_key = self._by_key
        taken = self._taken
        back: list[Entry] = []
        for entry in self._pop_up_to(limit):
            timestamp, _, key = entry
            if key not in keys and by_key[key][timestamp][1] <= max_epoch:
                keys[key] = None
                if key not in taken:  # (one taken before is the key's first still)
                    taken[key] = entry
                    continue
            back.append(entry)
        self._push(back)
        return list(keys)

    def pop_next_for_key(self, key: Hashable, limit: Time, max_epoch: int) -> Time | None:
        """Remove and return ``key``'s earliest timer <= ``limit`` registered in an
        epoch <= ``max_epoch``; None if it has none."""
        entry = self._taken.pop(key, None) if self._taken else None
        found = self._next_for_key(key, limit, max_epoch)
        popped = False  # whether the fired timer's entry is off the heap (taken)
        if entry is not None and self._is_live(entry):
            if found == entry[0]:
                popped = True
            else:  # not fired after all: back where it was
                heappush(self._heap, entry)
        if found is not None:
            self._fired(key, found, popped)
        return found

    def _next_for_key(self, key: Hashable, limit: Time, max_epoch: int) -> Time | None:
        times = self._times.get(key)
        if times is None:
            return None
        timers = self._by_key[key]
        for timestamp in times:
            if timestamp > limit:
                return None
            if timers[timestamp][1] <= max_epoch:
                return timestamp
        return None

    def items(self) -> list[tuple[Hashable, Time]]:
        """All ``(key, timestamp)`` in timestamp order (for snapshots and tests)."""
        return [(key, timestamp) for timestamp, _, key in self._sorted()]

    def _sorted(self) -> list[Entry]:
        """The live entries in firing order."""
        entries = [*self._heap, *self._taken.values()]
        return sorted(entry for entry in entries if self._is_live(entry))

    # -- checkpoints (aec.checkpoint.files) ------------------------------------------------------------
    def export(self) -> ExportedTimers:
        """The full queue as plain data for a checkpoint (msgpack, with the keys: plain
        data only, ``aec.state.serialization.SAFE``; a key is one of the stable key
        types, ``aec.keygroups``, an enum or named tuple as the plain value it equals:
        ``plain_key``).

        Shape: ``{"timers": [(timestamp, sequence, key, epoch), ...]`` in firing
        order, ``"sequence"``: the registration counter, ``"rearmed"``:
        ``[(key, timestamp, [epoch, ...]), ...]``, ``"boundaries"``: ``[epoch, ...]``}. Registration sequences and
        epochs are kept (not just ``items()``) so a restored queue fires in the
        same order and makes the same duplicate decisions as this one.
        """
        by_key = self._by_key
        plain = plain_key
        return {
            "timers": [(t, seq, plain(key), by_key[key][t][1]) for t, seq, key in self._sorted()],
            "sequence": self._sequence,
            "rearmed": [
                (plain(key), t, list(epochs)) for (key, t), epochs in self._rearmed.items()
            ],
            "boundaries": list(self._boundaries),
        }

    @classmethod
    def from_export(cls, data: Mapping[str, Any]) -> TimerQueue:
        """A new queue holding an ``export()``ed queue's timers (ValueError when malformed:
        ``data`` comes from a checkpoint file, so its shape is checked, not trusted)."""
        queue = cls()
        queue.load(data)
        return queue

    def load(self, data: Mapping[str, Any]) -> None:  # untrusted: checked below
        """Replace every timer with an ``export()``ed queue.

        Raises ValueError (leaving this queue unchanged) when ``data`` is not of
        the shape ``export`` returns.
        """
        order: list[Entry] = []
        by_key: dict[Hashable, dict[Time, tuple[int, int]]] = {}
        try:
            for timestamp, sequence, key, epoch in data["timers"]:
                if type(timestamp) not in _TIMES or type(sequence) is not int or (
                    type(epoch) is not int
                ):
                    raise ValueError(f"timer {(timestamp, sequence, key, epoch)!r}")
                by_key.setdefault(key, {})[timestamp] = (sequence, epoch)
                order.append((timestamp, sequence, key))
            rearmed = {(key, t): list(epochs) for key, t, epochs in data["rearmed"]}
            counter = data["sequence"]
            boundaries = [int(epoch) for epoch in data["boundaries"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an exported timer queue: {exc}") from exc
        if not isinstance(counter, int) or len(order) != sum(map(len, by_key.values())):
            raise ValueError("not an exported timer queue: bad sequence or duplicate timers")
        heapify(order)
        self._heap, self._by_key, self._rearmed, self._sequence = order, by_key, rearmed, counter
        self._live, self._dead = len(order), 0
        self._taken = {}
        self._times = {key: sorted(timers) for key, timers in by_key.items()}
        self._boundaries = boundaries
