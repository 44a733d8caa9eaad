"""One RocksDB batch: one multi-get per column family, the requests over an overlay, one
``WriteBatch``; and the prefix scans map state needs.

``Table`` is one state's column family. ``RocksBatchView`` is the state as one batch
sees it (``backends.overlay``'s op functions run on it, shared with SlateDB).

Every read checks RocksDB's status: a multi-get raises on a corrupt block, and a
scan runs RocksDB's own iterator and asks its ``status()`` when it ends
(rocksdict's ``items()`` ends silently at a corrupt block, which read as "no more
entries": an empty map, a missing key). Either way the batch fails with
``aec.errors.StateReadError`` naming the state and the key group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from rocksdict import Rdict, ReadOptions, WriteBatch, WriteOptions

from aec.errors import StateReadError
from aec.state.requests import Op, StateRequest
from aec.state.serialization import SAFE, Serializer
from backends.keycodec import key_group_of, key_prefix, prefix_end
from backends.overlay import ABSENT, BatchView, merge_map_overlay

_VALUE_GET, _VALUE_PUT, _VALUE_CLEAR = Op.VALUE_GET, Op.VALUE_PUT, Op.VALUE_CLEAR


class Table:
    """One state's column family: ``rdict`` for reads and scans, ``handle`` for writes,
    ``dumps``/``loads`` of the state's serializer (``StateBackend.register_state``);
    for a TTL state its expiry index (``backends.ttl_codec``): ``index`` (the index
    column family's handle, None without TTL), ``index_rdict`` and ``index_head``."""

    __slots__ = (
        "state", "rdict", "handle", "serializer", "dumps", "loads",
        "index", "index_rdict", "index_head",
    )  # fmt: skip

    def __init__(self, state: str, rdict: Rdict, handle: Any, serializer: Serializer = SAFE) -> None:
        self.state = state
        self.rdict = rdict
        self.handle = handle
        self.index: Any = None
        self.index_rdict: Rdict | None = None
        self.index_head: Callable[[Any, bytes], bytes] | None = None
        self.use(serializer)

    def index_in(self, rdict: Rdict, handle: Any, head: Callable[[Any, bytes], bytes]) -> None:
        """Index every write by its expiry in column family ``rdict``/``handle``;
        ``head(value, raw)`` is the index key's head (``backends.ttl_codec``)."""
        self.index_rdict, self.index_head, self.index = rdict, head, handle

    def use(self, serializer: Serializer) -> None:
        """Encode and decode this state's values with ``serializer`` from now on."""
        self.serializer = serializer
        self.dumps = serializer.dumps
        self.loads = serializer.loads


def read_error(table: Table, db_key: bytes | None, exc: BaseException) -> StateReadError:
    """The error of a read of ``table`` at ``db_key`` (its key group) that RocksDB refused."""
    where = "" if not db_key or len(db_key) < 2 else f", key group {key_group_of(db_key)}"
    return StateReadError(f"RocksDB cannot read state {table.state!r}{where}: {exc}")


def multi_get(table: Table, db_keys: list[bytes]) -> list[bytes | None]:
    """The raw values of ``db_keys`` (None: absent), one multi-get; StateReadError naming
    the first key group RocksDB cannot read."""
    try:
        return cast("list[bytes | None]", table.rdict.get(cast("list[Any]", db_keys)))
    except Exception as exc:  # rocksdict raises a bare Exception ("Corruption: ...")
        for db_key in db_keys:  # which key: only on this error path
            try:
                table.rdict.get(db_key)
            except Exception as single:
                raise read_error(table, db_key, single) from exc
        raise read_error(table, None, exc) from exc


def get_one(table: Table, db_key: bytes) -> bytes | None:
    """The raw value of ``db_key`` or None; StateReadError naming its key group."""
    try:
        return cast("bytes | None", table.rdict.get(db_key))
    except Exception as exc:
        raise read_error(table, db_key, exc) from exc


def rows(
    table: Table, start: bytes, upper: bytes | None, with_values: bool
) -> Iterator[Any]:
    """The DB keys (or ``(key, raw value)`` pairs) from ``start`` up to ``upper``
    (excluded; None: to the end), in order, by RocksDB's iterator; when it stops
    before ``upper`` its status is checked (StateReadError naming the key group).

    A generator, so the ReadOptions object outlives the iterator: rocksdict keeps
    only a pointer to the upper bound it holds (a temporary ReadOptions silently
    truncates the scan). The bound stops the scan early, skipping tombstones past it.
    """
    read_options = ReadOptions()
    if upper is not None:
        read_options.set_iterate_upper_bound(upper)
    iterator = table.rdict.iter(read_options)
    iterator.seek(start)
    last = start
    while iterator.valid():
        last = iterator.key()
        yield (last, iterator.value()) if with_values else last
        iterator.next()
    try:
        iterator.status()
    except Exception as exc:  # a corrupt block ended the iteration
        raise read_error(table, last, exc) from exc


def scan(
    table: Table, prefix: bytes, with_values: bool, start: bytes | None = None
) -> Iterator[Any]:
    """The DB keys (or ``(key, raw value)`` pairs) starting with ``prefix``, in order
    (``rows`` bounded by the prefix; status checked). ``start`` (a key under
    ``prefix``) resumes a scan."""
    return rows(table, prefix if start is None else start, prefix_end(prefix), with_values)


class RocksBatchView(BatchView):
    """The state as one batch sees it: the DB plus the batch's own earlier writes.

    ``prefetch`` fills a cache with one multi-get per column family; ``get``/``set``
    read and write through an overlay; ``commit`` writes the overlay as one
    ``WriteBatch``. Map scans merge the DB range with the overlay's entries of that
    map, so the batch never has to write early.
    """

    def __init__(self) -> None:
        self._known: dict[tuple[Table, bytes], Any] = {}  # current value or ABSENT
        self._dirty: dict[tuple[Table, bytes], Any] = {}  # written in this batch
        self._dirty_maps: dict[tuple[Table, bytes], set[bytes]] = {}  # map prefix -> DB keys

    def prefetch(self, table: Table, db_keys: list[bytes]) -> None:
        known = self._known
        loads = table.loads
        for db_key, raw in zip(db_keys, multi_get(table, db_keys), strict=True):
            known[table, db_key] = ABSENT if raw is None else loads(raw)

    def get(self, table: Table, db_key: bytes) -> Any:
        """The current value of ``db_key``, or ``ABSENT``."""
        slot = (table, db_key)
        value = self._known.get(slot, ABSENT)
        if value is ABSENT and slot not in self._known:  # not prefetched: read it now
            raw = get_one(table, db_key)
            value = self._known[slot] = ABSENT if raw is None else table.loads(raw)
        return value

    def set(self, table: Table, db_key: bytes, value: Any, map_prefix: bytes | None = None) -> None:
        """Write ``value`` (``ABSENT`` deletes); ``map_prefix`` for map entries."""
        slot = (table, db_key)
        self._known[slot] = self._dirty[slot] = value
        if map_prefix is not None:
            self._dirty_maps.setdefault((table, map_prefix), set()).add(db_key)

    def map_entries(self, table: Table, prefix: bytes) -> list[tuple[bytes, Any]]:
        """``(DB key, value)`` of every entry under ``prefix``, in DB key order."""
        dirty = {k: self._dirty[table, k] for k in self._dirty_maps.get((table, prefix), ())}
        return merge_map_overlay(scan(table, prefix, True), dirty, table.loads)

    def map_chunk(
        self, table: Table, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, Any]], bytes | None]:
        """Up to ``limit`` ``(DB key, value)`` entries under ``prefix`` with DB key
        greater than ``after`` (None: from the start), and the last one's DB key if
        more follow. Scans only what it returns unless this batch wrote the map."""
        if (table, prefix) in self._dirty_maps:  # merge with this batch's writes
            entries = [e for e in self.map_entries(table, prefix) if after is None or e[0] > after]
        else:
            start = prefix if after is None else after + b"\x00"
            entries = []
            for db_key, raw in scan(table, prefix, True, start):
                entries.append((db_key, table.loads(raw)))
                if len(entries) > limit:
                    break
        if len(entries) > limit:
            return entries[:limit], entries[limit - 1][0]
        return entries, None

    def map_is_empty(self, table: Table, prefix: bytes) -> bool:
        dirty = self._dirty_maps.get((table, prefix), ())
        if any(self._dirty[table, db_key] is not ABSENT for db_key in dirty):
            return False
        # Every dirty entry is a deletion: the map is empty unless the DB has another.
        return all(db_key in dirty for db_key in scan(table, prefix, False))

    def map_clear(self, table: Table, prefix: bytes) -> None:
        keys = set(scan(table, prefix, False))
        keys.update(self._dirty_maps.get((table, prefix), ()))
        for db_key in keys:
            self.set(table, db_key, ABSENT, prefix)

    def commit(self, db: Rdict, write_options: WriteOptions) -> None:
        if not self._dirty:
            return
        batch = WriteBatch(raw_mode=True)
        for (table, db_key), value in self._dirty.items():
            if value is ABSENT:
                batch.delete(db_key, table.handle)
            else:
                raw = table.dumps(value)
                batch.put(db_key, raw, table.handle)
                head = table.index_head
                if head is not None:
                    batch.put(head(value, raw) + db_key, b"", table.index)
        db.write(batch, write_options)


def run_value_batch(
    db: Rdict,
    table_of: Callable[[str], Table],
    requests: Sequence[StateRequest],
    write_options: WriteOptions,
) -> bool:
    """Run a batch of value-state requests only: one multi-get per column family,
    one ``WriteBatch``; False (nothing done) for any other batch.

    The common batch of keyed counters and the like, without ``RocksBatchView``'s
    overlay: reads all go to the DB before the writes, which is the overlay's
    answer too as long as no read follows a write of its key in the batch (then,
    or for any list or map request, this gives up for the general path). Two
    writes of a key keep their order in the ``WriteBatch``.
    """
    gets: dict[Table, tuple[list[bytes], list[StateRequest]]] = {}
    writes: WriteBatch | None = None  # made at the first write: a read-only batch has none
    written: set[bytes] = set()  # DB keys written so far (any table: a clash only gives up)
    last_state: str | None = None
    table: Table  # both bound by the first request (its state is never None)
    table_gets: tuple[list[bytes], list[StateRequest]]
    for request in requests:
        state = request.state
        if state is not last_state:
            table = table_of(state)
            found = gets.get(table)
            if found is None:
                found = gets[table] = ([], [])
            table_gets = found
            last_state = state
        db_key = key_prefix(request.key_group, request.key)
        op = request.op
        if op == _VALUE_GET:
            if written and db_key in written:
                return False
            table_gets[0].append(db_key)
            table_gets[1].append(request)
        elif op == _VALUE_PUT or op == _VALUE_CLEAR:
            value = request.value if op == _VALUE_PUT else None
            if writes is None:
                writes = WriteBatch(raw_mode=True)
            if value is None:
                writes.delete(db_key, table.handle)
            else:
                encoded = table.dumps(value)
                writes.put(db_key, encoded, table.handle)
                head = table.index_head
                if head is not None:
                    writes.put(head(value, encoded) + db_key, b"", table.index)
            written.add(db_key)
        else:
            return False
    for table, (db_keys, readers) in gets.items():
        if db_keys:
            loads = table.loads
            for reader, raw in zip(readers, multi_get(table, db_keys), strict=True):
                reader.result = None if raw is None else loads(raw)
    if writes is not None:
        db.write(writes, write_options)
    return True


def scan_range(table: Table, low: bytes, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """``(DB key, raw value)`` of every key in ``[low, high)`` (``high`` None: to the
    end); status checked as ``rows``."""
    return rows(table, low, high, True)
