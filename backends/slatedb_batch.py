"""One SlateDB batch: plan its reads, issue them concurrently, apply it over an overlay.

The batch's point reads and map range scans are issued at once (``asyncio.gather``),
its requests are then applied in list order over a per-batch overlay
(``backends.overlay``'s op functions, so reads after a write of the same key in the
batch see the write), and its writes go out as one SlateDB ``WriteBatch``. Values
are encoded by their state's serializer (the ``table`` the op functions get);
every reply is checked (``backends.slatedb_store``: a point read is bytes or
None, a scan's rows lie in its range, in order) before anything is decoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from slatedb import uniffi as sdb

from aec.state.requests import Op, StateRequest
from aec.state.serialization import Serializer
from backends.keycodec import encode_key, key_prefix
from backends.overlay import (
    ABSENT,
    APPLY_OPS,
    POINT_READS,
    USER_KEY_OPS,
    BatchView,
    merge_map_overlay,
)
from backends.slatedb_store import checked_value, scan

_MAP_WRITES = frozenset({Op.MAP_PUT, Op.MAP_PUT_ALL, Op.MAP_REMOVE, Op.MAP_CLEAR})
_MAP_SCANS = frozenset({Op.MAP_ITER, Op.MAP_CLEAR, Op.MAP_IS_EMPTY, Op.MAP_ITER_CHUNK})


class SlateBatchView(BatchView):
    """The state as one batch sees it: what the batch prefetched plus its own writes.

    A ``backends.overlay.BatchView``; the ``table`` argument is the state's
    ``Serializer`` (the state is part of every key), so the shared op functions run
    on it.
    Map reads use prefetched ranges: ``full`` holds whole maps (raw values) read at
    the batch's start, ``ranges`` holds ``(prefix, after) -> rows`` for chunked
    reads and emptiness checks of maps the batch had not written before them.
    """

    def __init__(
        self,
        known: dict[bytes, Any],
        full: dict[bytes, list[tuple[bytes, bytes]]],
        ranges: dict[tuple[bytes, bytes | None], list[tuple[bytes, bytes]]],
    ) -> None:
        self._known = known  # DB key -> current value or ABSENT
        self._full = full
        self._ranges = ranges
        self._dirty: dict[bytes, Any] = {}  # written in this batch (value or ABSENT)
        self._codecs: dict[bytes, Serializer] = {}  # the serializer of each written key
        self._dirty_maps: dict[bytes, set[bytes]] = {}  # map prefix -> DB keys written

    def get(self, table: Any, db_key: bytes) -> Any:
        return self._known[db_key]  # every point read was prefetched

    def set(self, table: Any, db_key: bytes, value: Any, map_prefix: bytes | None = None) -> None:
        self._known[db_key] = self._dirty[db_key] = value
        self._codecs[db_key] = table
        if map_prefix is not None:
            self._dirty_maps.setdefault(map_prefix, set()).add(db_key)

    def map_entries(self, table: Any, prefix: bytes) -> list[tuple[bytes, Any]]:
        dirty = {k: self._dirty[k] for k in self._dirty_maps.get(prefix, ())}
        return merge_map_overlay(self._full[prefix], dirty, table.loads)

    def map_chunk(
        self, table: Any, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, Any]], bytes | None]:
        if prefix in self._full:
            entries = [e for e in self.map_entries(table, prefix) if after is None or e[0] > after]
        else:  # planned as a range: the batch had not written this map before
            rows = self._ranges[prefix, after]
            entries = [(db_key, table.loads(raw)) for db_key, raw in rows[: limit + 1]]
        if len(entries) > limit:
            return entries[:limit], entries[limit - 1][0]
        return entries, None

    def map_is_empty(self, table: Any, prefix: bytes) -> bool:
        if prefix in self._full:
            return not self.map_entries(table, prefix)
        return not self._ranges[prefix, None]

    def map_clear(self, table: Any, prefix: bytes) -> None:
        keys = {db_key for db_key, _ in self._full[prefix]}
        keys.update(self._dirty_maps.get(prefix, ()))
        for db_key in keys:
            self.set(table, db_key, ABSENT, prefix)

    def write_batch(self) -> Any:
        """The batch's writes as one SlateDB ``WriteBatch``, or None."""
        if not self._dirty:
            return None
        batch = sdb.WriteBatch()
        for db_key, value in self._dirty.items():
            if value is ABSENT:
                batch.delete(db_key)
            else:
                batch.put(db_key, self._codecs[db_key].dumps(value))
        return batch


async def execute(
    db: Any,
    requests: Sequence[StateRequest],
    state_prefix: Callable[[str], bytes],
    serializer_of: Callable[[str], Serializer],
) -> None:
    """Answer ``requests`` on ``db``: reads of the batch at once, then the requests in
    list order over a ``BatchView``, then one ``WriteBatch`` (no durability wait).
    ``state_prefix`` maps a state name to its key prefix, ``serializer_of`` to its
    serializer.

    Raises StateReadError (a reply SlateDB should not give) or what SlateDB raised."""
    # Plan: the DB key of each request, what to read (deduplicated), in list order.
    plan = []
    points: dict[bytes, Serializer] = {}  # DB key -> the serializer decoding its value
    full: dict[bytes, None] = {}  # map prefixes read whole
    ranges: dict[tuple[bytes, bytes | None], int] = {}  # (prefix, after) -> rows to read
    written: set[bytes] = set()  # maps written so far in the batch
    key_prefixes: dict[Any, bytes] = {}
    for request in requests:
        key_bytes = key_prefixes.get(request.key)
        if key_bytes is None:
            key_bytes = key_prefixes[request.key] = key_prefix(request.key_group, request.key)
        db_key = state_prefix(request.state) + key_bytes
        op = request.op
        codec = serializer_of(request.state)
        if op in POINT_READS:
            if op in USER_KEY_OPS:  # MAP_GET, MAP_CONTAINS read one map entry
                db_key += encode_key(request.user_key)
            points[db_key] = codec
        elif op in _MAP_SCANS:
            if db_key in written or op == Op.MAP_ITER or op == Op.MAP_CLEAR:
                full[db_key] = None
            elif op == Op.MAP_IS_EMPTY:
                ranges[db_key, None] = max(ranges.get((db_key, None), 0), 1)
            else:  # MAP_ITER_CHUNK of a map not yet written: read just the chunk
                after, limit = request.value
                slot = (db_key, None if after is None else db_key + after)
                ranges[slot] = max(ranges.get(slot, 0), limit + 1)
        if op in _MAP_WRITES:
            written.add(db_key)
        plan.append((op, db_key, request, codec))
    # Read: every point get and range scan of the batch at once.
    point_keys = list(points)
    full_keys = list(full)
    range_keys = [slot for slot in ranges if slot[0] not in full]
    results = await asyncio.gather(
        *[db.get(key) for key in point_keys],
        *[scan(db, prefix) for prefix in full_keys],
        *[scan(db, prefix, after, ranges[prefix, after]) for prefix, after in range_keys],
    )
    offset = len(point_keys)
    known = {}
    for key, raw in zip(point_keys, results[:offset], strict=True):
        raw = checked_value(key, raw)
        known[key] = ABSENT if raw is None else points[key].loads(raw)
    view = SlateBatchView(
        known,
        dict(zip(full_keys, results[offset : offset + len(full_keys)], strict=True)),
        dict(zip(range_keys, results[offset + len(full_keys) :], strict=True)),
    )
    # Apply in list order over the overlay, then write once, not waiting for durability.
    for op, db_key, request, codec in plan:
        APPLY_OPS[op](view, codec, db_key, request)
    batch = view.write_batch()
    if batch is not None:
        await db.write(batch)
