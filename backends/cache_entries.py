"""CachedBackend's entries: one cached state entry per ``(state, key)``, and the ops on it.

``Slot`` holds a value, a list or the known part of a map (with a "complete" flag),
its dirty state and the idempotent write-backs that store it; ``SlotPlan`` records
what one batch needs of a slot. ``APPLY`` applies each request op to a slot exactly
as ``MemoryBackend`` applies it to a dict, once the batch's plan made the data it
reads available. Maps iterate in ``backends.keycodec.encode_key`` byte order.
"""

from __future__ import annotations

import bisect
import pickle
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from aec.state.requests import Op, StateRequest, op_table
from backends.keycodec import encode_key

SLOT_OVERHEAD_BYTES = 100  # rough per-entry bookkeeping cost added to pickled sizes

ABSENT = object()  # a map entry known to be absent (None is a legal map value)

VALUE, LIST, MAP = 0, 1, 2
KIND = {
    Op.VALUE_GET: VALUE, Op.VALUE_PUT: VALUE, Op.VALUE_CLEAR: VALUE,
    Op.LIST_GET: LIST, Op.LIST_ADD: LIST, Op.LIST_ADD_ALL: LIST, Op.LIST_PUT: LIST,
    Op.LIST_CLEAR: LIST, Op.LIST_GET_CHUNK: LIST,
    Op.MAP_GET: MAP, Op.MAP_PUT: MAP, Op.MAP_PUT_ALL: MAP, Op.MAP_REMOVE: MAP,
    Op.MAP_CONTAINS: MAP, Op.MAP_IS_EMPTY: MAP, Op.MAP_ITER: MAP, Op.MAP_CLEAR: MAP,
    Op.MAP_ITER_CHUNK: MAP,
}  # fmt: skip
KIND_NAMES = ("value", "list", "map")
OVERWRITES = frozenset({Op.VALUE_PUT, Op.VALUE_CLEAR, Op.LIST_PUT, Op.LIST_CLEAR})
MAP_POINT_READS = frozenset({Op.MAP_GET, Op.MAP_CONTAINS})
MAP_WHOLE_READS = frozenset({Op.MAP_ITER, Op.MAP_ITER_CHUNK, Op.MAP_IS_EMPTY})

# Knowledge of a value or list entry while planning a batch.
UNKNOWN, FETCHED, LOCAL = 0, 1, 2


class Slot:
    """One cached state entry: ``(state, key)`` of value, list or map state.

    ``data``: value state: the value or None (absent); list state: the list ([]
    when absent); map state: ``{user key: value | ABSENT}``, with no ``ABSENT``
    once ``complete``. ``known``: value/list data is loaded (maps use ``complete``
    and per-entry knowledge). Dirty state: ``dirty``; maps also ``cleared`` (the
    remote map must be cleared first) and ``dirty_keys``.
    """

    __slots__ = (
        "sid", "state", "key", "key_group", "kind", "known", "data", "complete",
        "cleared", "dirty_keys", "dirty", "pins", "version", "weight", "nbytes", "order",
    )  # fmt: skip

    def __init__(self, sid: tuple, state: str, key: Any, key_group: int, kind: int) -> None:
        self.sid = sid
        self.state = state
        self.key = key
        self.key_group = key_group
        self.kind = kind
        self.known = False
        self.data: Any = {} if kind == MAP else [] if kind == LIST else None
        self.complete = False
        self.cleared = False
        self.dirty_keys: set[Any] = set()
        self.dirty = False
        self.pins = 0
        self.version = 0  # bumped by every write: flush marks clean only what it wrote
        self.weight = 1
        self.nbytes = 0
        self.order: tuple[list[bytes], list[Any]] | None = None  # sorted map keys, lazily

    def request(self, op: int, user_key: Any = None, value: Any = None) -> StateRequest:
        return StateRequest(op, self.state, self.key, self.key_group, user_key, value)

    def writebacks(self) -> list[StateRequest]:
        """Idempotent remote requests that store this entry's dirty data."""
        if self.kind == VALUE:
            return [self.request(Op.VALUE_PUT, value=self.data)]  # None clears
        if self.kind == LIST:
            return [self.request(Op.LIST_PUT, value=list(self.data))]  # [] clears
        entries = self.data
        requests = []
        if self.cleared:  # complete: no ABSENT entries
            requests.append(self.request(Op.MAP_CLEAR))
            puts = dict(entries)
        else:
            puts = {}
            for user_key in self.dirty_keys:
                value = entries.get(user_key, ABSENT)
                if value is ABSENT:
                    requests.append(self.request(Op.MAP_REMOVE, user_key))
                else:
                    puts[user_key] = value
        if puts:
            requests.append(self.request(Op.MAP_PUT_ALL, value=puts))
        return requests

    def mark_clean(self) -> None:
        self.dirty = self.cleared = False
        if self.dirty_keys:
            self.dirty_keys = set()

    def map_order(self) -> tuple[list[bytes], list[Any]]:
        """The map's user keys sorted by encoded bytes: (encodings, user keys)."""
        if self.order is None:
            pairs = sorted((encode_key(user_key), user_key) for user_key in self.data)
            self.order = ([p[0] for p in pairs], [p[1] for p in pairs])
        return self.order


class SlotPlan:
    """What one batch needs of one slot: the fetches to send and how to count hits."""

    __slots__ = ("slot", "state", "fetch", "complete", "full", "local_keys", "points")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.state = LOCAL if slot.known else UNKNOWN  # value and list
        self.fetch = False  # value and list: one VALUE_GET / LIST_GET
        self.complete = slot.complete  # map: complete without this batch's fetch
        self.full = False  # map: fetch the whole map (MAP_ITER)
        self.local_keys: set[Any] | None = None  # map: user keys this batch wrote
        self.points: dict[Any, None] | None = None  # map: user keys to fetch, in order

    def note(self, request: StateRequest) -> int:
        """Account ``request`` (walked in batch order, so a read after a write of the
        batch needs no fetch): 1 if memory answers it, -1 if it needs this batch's
        fetch, 0 if it reads nothing."""
        op = request.op
        slot = self.slot
        if slot.kind != MAP:
            if op in OVERWRITES:
                self.state = LOCAL
            elif op == Op.LIST_ADD_ALL and not request.value:
                pass  # a no-op: reads nothing
            elif self.state == LOCAL:
                return 1
            else:  # a read (or LIST_ADD, a read-modify-write) needing remote data
                self.state = FETCHED
                self.fetch = True
                return -1
        elif op in MAP_POINT_READS:
            user_key = request.user_key
            if (
                self.complete
                or (self.local_keys is not None and user_key in self.local_keys)
                or user_key in slot.data
            ):
                return 1
            if not self.full:
                if self.points is None:
                    self.points = {}
                self.points[user_key] = None
            return -1
        elif op in MAP_WHOLE_READS:
            if self.complete:
                return 1
            self.full = True
            self.points = None
            return -1
        elif op == Op.MAP_CLEAR:
            self.complete = True
        else:  # MAP_PUT, MAP_PUT_ALL, MAP_REMOVE: blind writes
            if self.local_keys is None:
                self.local_keys = set()
            if op == Op.MAP_PUT_ALL:
                if request.value:
                    self.local_keys.update(dict(request.value))
            else:
                self.local_keys.add(request.user_key)
        return 0

    def fetch_requests(self) -> tuple | None:
        """``(slot, user keys or None, [remote requests])`` if the slot needs data."""
        slot = self.slot
        if slot.kind != MAP:
            if self.fetch:
                op = Op.VALUE_GET if slot.kind == VALUE else Op.LIST_GET
                return slot, None, [slot.request(op)]
        elif self.full:
            return slot, None, [slot.request(Op.MAP_ITER)]
        elif self.points:
            group = []
            for user_key in self.points:
                group.append(slot.request(Op.MAP_CONTAINS, user_key))
                group.append(slot.request(Op.MAP_GET, user_key))
            return slot, list(self.points), group
        return None


_VALUE_GET = Op.VALUE_GET
_VALUE_OPS = frozenset({Op.VALUE_GET, Op.VALUE_PUT, Op.VALUE_CLEAR})


def answer_value_hits(
    index: OrderedDict[tuple, Slot], dirty: dict[tuple, Slot], requests: Sequence[StateRequest]
) -> int | None:
    """Apply a batch of value requests that memory answers whole; the reads it answered.

    Every request must be a value op on a cached value slot, and every read must find
    its slot loaded or written earlier in the batch; otherwise None, with nothing
    done (the caller plans the batch). Requests apply in order, as ``APPLY`` applies
    them; the touched slots become dirty entries where written and move to the most
    recently used end of ``index`` in order of first use, as ``CachedBackend`` does
    after a planned batch. No plan, pin or fetch: the common all-hit batch of keyed
    value state. Call under the cache's lock, with no write-back in flight.
    """
    touched: dict[tuple, Slot] = {}
    slots: list[Slot] = []
    written: set[tuple] | None = None
    for request in requests:
        op = request.op
        if op not in _VALUE_OPS:
            return None
        sid = (request.state, request.key)
        slot = touched.get(sid)
        if slot is None:
            slot = index.get(sid)
            if slot is None or slot.kind != VALUE:
                return None
            touched[sid] = slot
        if op == _VALUE_GET:
            if not slot.known and (written is None or sid not in written):
                return None
        elif written is None:
            written = {sid}
        else:
            written.add(sid)
        slots.append(slot)
    reads = 0
    for request, slot in zip(requests, slots, strict=True):
        op = request.op
        APPLY[op](slot, request)
        if op == _VALUE_GET:
            reads += 1
    move_to_end = index.move_to_end
    for sid, slot in touched.items():
        if slot.dirty:
            dirty[sid] = slot
        move_to_end(sid)
    return reads


def merge_fetched(fetches: list[tuple]) -> None:
    """Fill what memory did not know with the remote's answers (memory is never older)."""
    for slot, user_keys, group in fetches:
        if slot.kind == VALUE:
            if not slot.known:
                slot.data, slot.known = group[0].result, True
        elif slot.kind == LIST:
            if not slot.known:
                slot.data, slot.known = list(group[0].result), True
        elif user_keys is None:  # the whole map
            if not slot.complete:
                entries = dict(group[0].result)
                for user_key, value in slot.data.items():  # memory is never older
                    if value is ABSENT:
                        entries.pop(user_key, None)
                    else:
                        entries[user_key] = value
                slot.data, slot.complete, slot.order = entries, True, None
        elif not slot.complete:
            entries = slot.data
            for index, user_key in enumerate(user_keys):
                if user_key not in entries:
                    contains, get = group[2 * index], group[2 * index + 1]
                    entries[user_key] = get.result if contains.result else ABSENT


def approx_bytes(slot: Slot) -> int:
    data = slot.data
    if slot.kind == MAP and not slot.complete:
        data = {k: v for k, v in data.items() if v is not ABSENT}
    try:
        size = len(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # an unpicklable value: the remote will complain; estimate here
        size = sys.getsizeof(data)
    return size + SLOT_OVERHEAD_BYTES


# --- ops: (slot, request), after the plan made the data each one reads available -----


def _value_get(s: Slot, r: StateRequest) -> None:
    r.result = s.data


def _value_put(s: Slot, r: StateRequest) -> None:
    s.data, s.known, s.dirty = r.value, True, True  # None clears
    s.version += 1


def _value_clear(s: Slot, r: StateRequest) -> None:
    s.data, s.known, s.dirty = None, True, True
    s.version += 1


def _list_get(s: Slot, r: StateRequest) -> None:
    r.result = list(s.data)


def _list_add(s: Slot, r: StateRequest) -> None:
    s.data.append(r.value)
    s.dirty = True
    s.version += 1


def _list_add_all(s: Slot, r: StateRequest) -> None:
    if r.value:
        s.data.extend(r.value)
        s.dirty = True
        s.version += 1


def _list_put(s: Slot, r: StateRequest) -> None:
    s.data, s.known, s.dirty = (list(r.value) if r.value else []), True, True
    s.version += 1


def _list_clear(s: Slot, r: StateRequest) -> None:
    s.data, s.known, s.dirty = [], True, True
    s.version += 1


def _list_get_chunk(s: Slot, r: StateRequest) -> None:
    offset, limit = r.value
    offset = offset or 0
    stored = s.data
    end = offset + limit
    r.result = (stored[offset:end], end if end < len(stored) else None)


def _map_get(s: Slot, r: StateRequest) -> None:
    value = s.data.get(r.user_key, ABSENT)
    r.result = None if value is ABSENT else value


def _map_contains(s: Slot, r: StateRequest) -> None:
    r.result = s.data.get(r.user_key, ABSENT) is not ABSENT


def _map_put(s: Slot, r: StateRequest) -> None:
    s.data[r.user_key] = r.value
    s.dirty_keys.add(r.user_key)
    s.dirty, s.order = True, None
    s.version += 1


def _map_put_all(s: Slot, r: StateRequest) -> None:
    if r.value:
        entries = dict(r.value)
        s.data.update(entries)
        s.dirty_keys.update(entries)
        s.dirty, s.order = True, None
        s.version += 1


def _map_remove(s: Slot, r: StateRequest) -> None:
    if s.complete:
        s.data.pop(r.user_key, None)
    else:
        s.data[r.user_key] = ABSENT
    s.dirty_keys.add(r.user_key)
    s.dirty, s.order = True, None
    s.version += 1


def _map_is_empty(s: Slot, r: StateRequest) -> None:
    r.result = not s.data  # complete: no ABSENT entries


def _map_iter(s: Slot, r: StateRequest) -> None:
    entries = s.data
    r.result = [(user_key, entries[user_key]) for user_key in s.map_order()[1]]


def _map_clear(s: Slot, r: StateRequest) -> None:
    s.data, s.complete, s.cleared, s.dirty, s.order = {}, True, True, True, None
    s.dirty_keys = set()
    s.version += 1


def _map_iter_chunk(s: Slot, r: StateRequest) -> None:
    after, limit = r.value  # after: the encoded user key the last chunk ended with
    encoded, user_keys = s.map_order()
    start = 0 if after is None else bisect.bisect_right(encoded, after)
    end = start + limit
    entries = s.data
    items = [(user_key, entries[user_key]) for user_key in user_keys[start:end]]
    r.result = (items, encoded[end - 1] if end < len(encoded) else None)


APPLY = op_table(globals())
