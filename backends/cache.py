"""CachedBackend: a local write-back tier in front of a remote backend (FLIP-429 style).

Disaggregated state pays a round trip per miss; a local cache of hot state turns
most accesses into dictionary lookups. ``CachedBackend`` keeps state entries in
memory, keyed by ``(state, key)``:

* value state: the value (or known absence);
* list state: the whole list (or known absence, an empty list);
* map state: the known user-key entries (present values and known absences) plus a
  "complete" flag when the whole map is in memory, so ``MAP_ITER``,
  ``MAP_ITER_CHUNK`` and ``MAP_IS_EMPTY`` are answered locally only when the map
  is complete.

A batch is answered in three steps:

1. plan (under the lock): walk the batch in order and find what it cannot answer
   from memory, taking into account its own earlier writes (a ``VALUE_PUT``
   followed by a ``VALUE_GET`` needs no remote read); pin the entries it touches so
   no other thread evicts them;
2. one remote ``execute_batch`` (outside the lock) with every missing read of the
   batch, duplicates folded (one ``VALUE_GET``/``LIST_GET`` per key, one
   ``MAP_ITER`` per map that must be complete, one ``MAP_CONTAINS`` + ``MAP_GET``
   per missing map entry), preceded by the write-backs of dirty entries evicted
   earlier (they ride along instead of costing a round trip of their own);
3. merge and answer (under the lock): fetched data fills only what memory did
   not know (memory is never older than the remote), then the requests are
   applied in list order, exactly as ``MemoryBackend`` applies them.

A batch whose reads all hit makes no remote call at all. Writes are write-back: applied in memory and marked dirty, never sent per batch.
``flush()`` writes every dirty entry to the remote (a few large batches) and is
called by the engine at the end of input, before snapshots (``snapshot`` flushes)
and on ``close``. Every write-back is idempotent (whole values and lists, map
puts/removes, a cleared map as ``MAP_CLEAR`` + ``MAP_PUT_ALL``), so a failed
flush leaves its entries dirty, raises, and can be retried. Evicting a dirty
entry moves it to a write-back queue that stays readable (a later access revives
it without a remote read); the queue rides along with the next remote call, or
is sent on its own once it holds ``WRITEBACK_QUEUE_LIMIT`` entries, or at flush.
An entry whose write-back is in flight blocks a batch of its key until the
write-back landed (so a read never overtakes a write).

Map iteration order (``MAP_ITER`` and ``MAP_ITER_CHUNK``) is the byte order of
``backends.keycodec.encode_key`` of the user keys, the same order as ``RocksDBBackend``:
it does not depend on which entries were evicted and loaded again, so a chunk cursor
(the encoded last user key) stays valid across evictions, and writes between chunks
behave as on RocksDB.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from aec.keygroups import KeyGroupRange
from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import Op, StateRequest
from aec.state.serialization import Serializer
from backends.cache_entries import (
    APPLY,
    KIND,
    KIND_NAMES,
    MAP,
    SLOT_OVERHEAD_BYTES,
    Slot,
    SlotPlan,
    answer_value_hits,
    approx_bytes,
    merge_fetched,
)

WRITEBACK_QUEUE_LIMIT = 256  # evicted dirty entries held before they are sent on their own
FLUSH_BATCH_REQUESTS = 1000  # remote requests per flush batch (a flush may send several)


class CachedBackend(StateBackend):
    """A local LRU write-back cache in front of ``remote`` (FLIP-429's local tier).

    Args:
        remote: the backend holding the state (opened, closed, snapshotted and
            restored through this one).
        capacity_entries: at most about this many state entries in memory (a value
            or a list counts 1, a map counts its entries); None: unbounded.
        capacity_bytes: at most about this many bytes of state in memory (pickled
            sizes plus a per-entry overhead); None: unbounded.
        policy: the eviction policy; only ``"lru"``.
        capacity: ``capacity_entries`` by the contract's name (keyword; not both).

    Answers every sequence of batches exactly as ``MemoryBackend`` does, except
    that maps iterate in encoded-key order (see the module docstring).
    ``blocking`` is ``remote.blocking``: misses block on the remote, so a cache
    over a remote store runs on I/O threads. Concurrent batches (of different
    keys) share the cache under one lock, never held during a remote call; calls
    into a non-blocking remote are serialized. ``flush``, ``snapshot``,
    ``restore``, ``state_items`` and ``close`` must not overlap ``execute_batch``.
    Entries pinned by running batches are not evicted, so the cache may exceed
    its capacity by what the running batches touch.

    Metrics: ``hits`` and ``misses`` (reads and read-modify-writes answered from
    memory, or needing this batch's remote read), ``hit_rate``, ``evictions``,
    ``flushes`` (successful ``flush`` calls), ``fetches`` (remote read requests
    sent), ``written_back`` (entries written to the remote), ``entries`` and
    ``bytes`` (the current size).

    Raises:
        TypeError: ``remote`` is not a StateBackend, a capacity is not an int, or both
            ``capacity`` and ``capacity_entries`` are given.
        ValueError: a capacity < 1, or an unknown ``policy``.
    """

    def __init__(
        self,
        remote: StateBackend,
        capacity_entries: int | None = None,
        capacity_bytes: int | None = None,
        policy: str = "lru",
        *,
        capacity: int | None = None,
    ) -> None:
        if not isinstance(remote, StateBackend):
            raise TypeError(f"remote must be a StateBackend, got {type(remote).__name__}")
        if capacity is not None:  # the contract's name: CachedBackend(remote, capacity)
            if capacity_entries is not None:
                raise TypeError("give capacity or capacity_entries, not both (the same limit)")
            capacity_entries = capacity
        self.capacity_entries = _check_capacity("capacity_entries", capacity_entries)
        self.capacity_bytes = _check_capacity("capacity_bytes", capacity_bytes)
        if policy != "lru":
            raise ValueError(f"policy must be 'lru' (the only policy so far), got {policy!r}")
        self.policy = policy
        self.remote = remote
        self.blocking = remote.blocking
        self._lock = threading.Lock()
        self._landed = threading.Condition(self._lock)  # in-flight write-backs finished
        self._remote_lock = None if remote.blocking else threading.Lock()
        self._index: OrderedDict[tuple, Slot] = OrderedDict()  # LRU first
        self._dirty: dict[tuple, Slot] = {}  # dirty slots of the index
        self._queue: OrderedDict[tuple, Slot] = OrderedDict()  # evicted, not yet sent
        self._in_flight: dict[tuple, Slot] = {}  # evicted, being written back
        self._closed = False
        self.entries = 0
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.flushes = 0
        self.fetches = 0
        self.written_back = 0

    def __repr__(self) -> str:
        return (
            f"CachedBackend({self.remote!r}, capacity_entries={self.capacity_entries}, "
            f"capacity_bytes={self.capacity_bytes})"
        )

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``; 0.0 before any read."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    # lifecycle

    def register_state(self, name: str, serializer: Serializer) -> None:
        super().register_state(name, serializer)  # and on the remote, which stores them
        self.remote.register_state(name, serializer)

    def register_ttl(self, name: str, ttl: float, kind: str) -> None:
        super().register_ttl(name, ttl, kind)
        self.remote.register_ttl(name, ttl, kind)

    def expire(self, now: float) -> None:
        """The remote removes expired entries (cached ones are evicted as usual; a
        read leaves expired values out wherever they come from)."""
        self.remote.expire(now)

    def open(self) -> None:
        self.remote.open()

    def close(self) -> None:
        """Flush, then close the remote (also when the flush raised). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self.remote.close()

    # batches

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        if not requests:
            return
        if self.execute_batch_now(requests):  # value requests memory answers: no plan
            return
        with self._lock:
            while self._in_flight and any((r.state, r.key) in self._in_flight for r in requests):
                self._landed.wait()  # a write-back of one of our keys is on its way
            plans, slots = self._plan(requests)
            fetches = self._fetch_requests(plans)
            if fetches:  # queued write-backs ride along with the one remote call
                sending = self._take_queue(0)
            else:  # every read hits: answer now, no remote call
                self._answer(requests, slots, plans)
                sending = self._take_queue(WRITEBACK_QUEUE_LIMIT)
        if fetches:
            # in-flight slots are this thread's alone: build their requests unlocked
            remote = [w for slot in sending for w in slot.writebacks()]
            remote.extend(f for _, _, group in fetches for f in group)
            try:
                self._call_remote(remote)
            except BaseException:
                with self._lock:
                    self._requeue(sending)
                    for plan in plans.values():
                        plan.slot.pins -= 1
                raise
            with self._lock:
                self._landed_ok(sending)
                self._answer(requests, slots, plans, fetches)
                sending = self._take_queue(WRITEBACK_QUEUE_LIMIT)
        if sending:
            self._send_writebacks(sending)

    def execute_batch_now(self, requests: Sequence[StateRequest]) -> bool:
        """A batch of value requests memory answers whole runs at once, without a plan
        (``answer_value_hits``; no remote call, and no write-back to send: such a batch
        adds no entry, so evicts nothing); any other batch, or with a write-back in
        flight or a capacity in bytes (sizes to measure): False."""
        with self._lock:
            if self._in_flight or self.capacity_bytes is not None:
                return False
            hits = answer_value_hits(self._index, self._dirty, requests)
            if hits is None:
                return False
            self.hits += hits
            return True

    def _plan(self, requests: Sequence[StateRequest]) -> tuple[dict[tuple, SlotPlan], list[Slot]]:
        """Pin the batch's slots (creating or reviving them) and decide the fetches.

        Walks the batch in order, so a read after a write of the batch needs no fetch.
        """
        plans: dict[tuple, SlotPlan] = {}
        slots: list[Slot] = []
        hits = misses = 0
        try:
            for request in requests:
                sid = (request.state, request.key)
                plan = plans.get(sid)
                op = request.op
                if plan is None:
                    slot = self._pin(sid, request, KIND[op])
                    plan = plans[sid] = SlotPlan(slot)
                slot = plan.slot
                if slot.kind != KIND[op]:
                    raise ValueError(
                        f"state {request.state!r} of key {request.key!r} is {KIND_NAMES[slot.kind]} "
                        f"state; {Op.NAMES[op]} is a {KIND_NAMES[KIND[op]]} state request"
                    )
                slots.append(slot)
                found = plan.note(request)
                if found > 0:
                    hits += 1
                elif found < 0:
                    misses += 1
        except BaseException:
            for plan in plans.values():
                plan.slot.pins -= 1
            raise
        self.hits += hits
        self.misses += misses
        return plans, slots

    def _pin(self, sid: tuple, request: StateRequest, kind: int) -> Slot:
        slot = self._index.get(sid)
        if slot is None:
            slot = self._queue.pop(sid, None)
            if slot is None:
                slot = Slot(sid, request.state, request.key, request.key_group, kind)
                if self.capacity_bytes is not None:
                    slot.nbytes = SLOT_OVERHEAD_BYTES
            else:  # evicted but not yet written back: still dirty, still ours
                self._dirty[sid] = slot
            self._index[sid] = slot
            self.entries += slot.weight
            self.bytes += slot.nbytes
        slot.pins += 1
        return slot

    def _fetch_requests(self, plans: dict[tuple, SlotPlan]) -> list[tuple]:
        """``(slot, kind of fetch, [remote requests])`` for every slot needing data."""
        fetches = [fetch for plan in plans.values() if (fetch := plan.fetch_requests())]
        self.fetches += sum(len(group) for _, _, group in fetches)
        return fetches

    def _answer(
        self,
        requests: Sequence[StateRequest],
        slots: list[Slot],
        plans: dict[tuple, SlotPlan],
        fetches: list[tuple] | None = None,
    ) -> None:
        """Merge ``fetches``, apply the batch in order; unpin, account and touch its
        slots; evict.

        A request that raises (a malformed payload) stops the batch there, as on
        ``MemoryBackend``; the slots are released all the same.
        """
        try:
            if fetches:
                merge_fetched(fetches)
            for request, slot in zip(requests, slots, strict=True):
                APPLY[request.op](slot, request)
        finally:
            self._release(plans)
        self._evict()

    def _release(self, plans: dict[tuple, SlotPlan]) -> None:
        measure = self.capacity_bytes is not None
        index, dirty = self._index, self._dirty
        for sid, plan in plans.items():
            slot = plan.slot
            slot.pins -= 1
            if slot.kind == MAP:
                weight = len(slot.data) or 1
                self.entries += weight - slot.weight
                slot.weight = weight
            if measure:
                nbytes = approx_bytes(slot)
                self.bytes += nbytes - slot.nbytes
                slot.nbytes = nbytes
            if slot.dirty:
                dirty[sid] = slot
            index.move_to_end(sid)

    def _evict(self) -> None:
        over_entries = 0 if self.capacity_entries is None else self.entries - self.capacity_entries
        over_bytes = 0 if self.capacity_bytes is None else self.bytes - self.capacity_bytes
        if over_entries <= 0 and over_bytes <= 0:
            return
        victims = []
        for slot in self._index.values():  # least recently used first
            if slot.pins:
                continue
            victims.append(slot)
            over_entries -= slot.weight
            over_bytes -= slot.nbytes
            if over_entries <= 0 and over_bytes <= 0:
                break
        for slot in victims:
            del self._index[slot.sid]
            self.entries -= slot.weight
            self.bytes -= slot.nbytes
            if slot.dirty:
                del self._dirty[slot.sid]
                self._queue[slot.sid] = slot
        self.evictions += len(victims)

    # write-backs

    def _take_queue(self, limit: int) -> list[Slot]:
        """Move the write-back queue in flight when it holds at least ``limit`` entries
        (and at least one)."""
        queue = self._queue
        if not queue or len(queue) < limit:
            return []
        sending = list(queue.values())
        queue.clear()
        for slot in sending:
            self._in_flight[slot.sid] = slot
        return sending

    def _landed_ok(self, sending: list[Slot]) -> None:
        if sending:
            for slot in sending:
                del self._in_flight[slot.sid]
            self.written_back += len(sending)
            self._landed.notify_all()

    def _requeue(self, sending: list[Slot]) -> None:
        """A write-back failed: its entries stay dirty in the queue, readable."""
        if sending:
            for slot in sending:
                del self._in_flight[slot.sid]
                self._queue[slot.sid] = slot
            self._landed.notify_all()

    def _send_writebacks(self, sending: list[Slot]) -> None:
        try:
            self._call_remote([w for slot in sending for w in slot.writebacks()])
        except BaseException:
            with self._lock:
                self._requeue(sending)
            raise
        with self._lock:
            self._landed_ok(sending)

    def _call_remote(self, requests: list[StateRequest]) -> None:
        if self._remote_lock is None:
            self.remote.execute_batch(requests)
        else:
            with self._remote_lock:
                self.remote.execute_batch(requests)

    def flush(self) -> None:
        """Write every dirty entry to the remote, then ``remote.flush()``.

        Sends batches of about ``FLUSH_BATCH_REQUESTS`` requests; entries are
        marked clean batch by batch. Raises what the remote raised; the entries
        not yet written stay dirty (and a later flush writes them).
        """
        with self._lock:
            while self._in_flight:
                self._landed.wait()
            queued = self._take_queue(0)  # in flight: a stray batch waits for them
            dirty = list(self._dirty.values())
        groups: list[tuple[list[tuple[Slot, int]], list[StateRequest]]] = []
        members: list[tuple[Slot, int]] = []
        requests: list[StateRequest] = []
        for slot in queued + dirty:
            members.append((slot, slot.version))
            requests.extend(slot.writebacks())
            if len(requests) >= FLUSH_BATCH_REQUESTS:
                groups.append((members, requests))
                members, requests = [], []
        if requests:
            groups.append((members, requests))
        queued_ids = {id(slot) for slot in queued}
        try:
            for members, requests in groups:
                self._call_remote(requests)
                with self._lock:
                    for slot, version in members:
                        if id(slot) in queued_ids:
                            del self._in_flight[slot.sid]
                        elif slot.version == version:
                            slot.mark_clean()
                            self._dirty.pop(slot.sid, None)
                    self.written_back += len(members)
                    self._landed.notify_all()
        except BaseException:
            with self._lock:
                self._requeue([s for s in queued if s.sid in self._in_flight])
            raise
        self.remote.flush()
        self.flushes += 1

    # snapshots and introspection

    def snapshot(self, directory: str) -> None:
        """Flush, then ``remote.snapshot(directory)``."""
        self.flush()
        self.remote.snapshot(directory)

    def scratch_parent(self) -> str | None:
        return self.remote.scratch_parent()

    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        """``remote.restore(directory, key_groups, max_parallelism)``, then drop the
        cache (dirty entries too).

        When the remote raises, the cache is left as it was.
        """
        if key_groups is None and max_parallelism is None:  # also a backend of the old contract
            self.remote.restore(directory)
        else:
            self.remote.restore(directory, key_groups, max_parallelism)
        with self._lock:
            self._index.clear()
            self._dirty.clear()
            self._queue.clear()
            self.entries = self.bytes = 0

    def spec(self) -> BackendSpec:
        return CachedSpec(
            self.remote.spec(), self.capacity_entries, self.capacity_bytes, self.policy
        )

    def state_items(self, state: str) -> dict[Any, Any]:
        """Flush, then ``remote.state_items(state)``."""
        self.flush()
        return self.remote.state_items(state)

    def stored_entries(self, state: str) -> int:
        """Flush, then ``remote.stored_entries(state)``."""
        self.flush()
        return self.remote.stored_entries(state)


class CachedSpec(BackendSpec):
    """Builds ``CachedBackend(remote.build(p), capacity_entries, capacity_bytes, policy)``."""

    def __init__(
        self,
        remote: BackendSpec,
        capacity_entries: int | None = None,
        capacity_bytes: int | None = None,
        policy: str = "lru",
    ) -> None:
        self.remote = remote
        self.capacity_entries = capacity_entries
        self.capacity_bytes = capacity_bytes
        self.policy = policy

    def build(self, partition: int) -> StateBackend:
        return CachedBackend(
            self.remote.build(partition), self.capacity_entries, self.capacity_bytes, self.policy
        )


def _check_capacity(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 or None, got {value!r}")
    return value
