"""RocksDBBackend: keyed state in a local RocksDB (rocksdict, raw mode).

Layout (Flink's RocksDB state backend, simplified):

* one column family per state, named ``"state/" + state name``, created on first use;
  the default column family holds only a format marker;
* DB keys are ``backends.keycodec`` keys: ``key group | len(key bytes) | key bytes``
  for value and list state, followed by the encoded user key for map state, so one
  key's map is one prefix range; values are pickled (highest protocol);
* a batch's requests run over ``backends.overlay``'s op functions (shared with
  SlateDB), against ``_BatchView``: one multi-get per column family, one
  ``WriteBatch`` at the end.

Value state is one entry per key; list state is one entry holding the pickled list
(``LIST_ADD`` reads, appends and rewrites it); map state is one entry per
``(key, user key)``. Map iteration (``MAP_ITER``) yields entries in the byte order
of the encoded user keys, not in insertion order as ``MemoryBackend`` does (ints
order by their decimal text: ``10`` before ``9``). Keys and user keys come back
in canonical form: ``1`` for a key written as ``1.0`` or ``True``.

The live directory is a working copy: writes skip the write-ahead log by default
(as Flink does), so only ``snapshot`` directories are durable; a clean ``close``
flushes, so reopening a closed directory sees its state. The memtable updates values
in place (``inplace_update_support``): state overwrites the same keys, and a version
per write made reads and writes slower as the memtable filled.
"""

from __future__ import annotations

import os
import pickle
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rocksdict import Checkpoint, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import StateRequest
from backends.keycodec import decode_key, encode_key, key_prefix, prefix_end, split_db_key
from backends.overlay import (
    ABSENT,
    APPLY_OPS,
    POINT_READS,
    USER_KEY_OPS,
    BatchView,
    dumps,
    merge_map_overlay,
)

_CF_PREFIX = "state/"
_FORMAT_KEY = b"aec/format"
_FORMAT = b"aec-rocksdb-1"
_SNAPSHOT_SUBDIR = "rocksdb"

OptionsHook = Callable[[Options], None]


# --- storage -----------------------------------------------------------------------


class _Table:
    """One state's column family: ``rdict`` for reads and scans, ``handle`` for writes."""

    __slots__ = ("state", "rdict", "handle")

    def __init__(self, state: str, rdict: Rdict, handle: Any) -> None:
        self.state = state
        self.rdict = rdict
        self.handle = handle


def _scan(
    table: _Table, prefix: bytes, with_values: bool, start: bytes | None = None
) -> Iterator[Any]:
    """The DB keys (or ``(key, raw value)`` pairs) starting with ``prefix``, in order.

    A generator, so the ReadOptions object outlives the iterator: rocksdict keeps
    only a pointer to the upper bound it holds (a temporary ReadOptions silently
    truncates the scan). The bound stops the scan early, skipping tombstones past
    the prefix; the ``startswith`` check is a cheap second guard. ``start`` (a key
    under ``prefix``) resumes a scan.
    """
    from_key = prefix if start is None else start
    read_options = ReadOptions()
    end = prefix_end(prefix)
    if end is not None:
        read_options.set_iterate_upper_bound(end)
    if with_values:
        for pair in table.rdict.items(from_key=from_key, read_opt=read_options):
            if not pair[0].startswith(prefix):
                return
            yield pair
    else:
        for db_key in table.rdict.keys(from_key=from_key, read_opt=read_options):
            if not db_key.startswith(prefix):
                return
            yield db_key


class _BatchView(BatchView):
    """The state as one batch sees it: the DB plus the batch's own earlier writes.

    ``prefetch`` fills a cache with one multi-get per column family; ``get``/``set``
    read and write through an overlay; ``commit`` writes the overlay as one
    ``WriteBatch``. Map scans merge the DB range with the overlay's entries of that
    map, so the batch never has to write early.
    """

    def __init__(self) -> None:
        self._known: dict[tuple[_Table, bytes], Any] = {}  # current value or ABSENT
        self._dirty: dict[tuple[_Table, bytes], Any] = {}  # written in this batch
        self._dirty_maps: dict[tuple[_Table, bytes], set[bytes]] = {}  # map prefix -> DB keys

    def prefetch(self, table: _Table, db_keys: list[bytes]) -> None:
        known = self._known
        for db_key, raw in zip(db_keys, table.rdict.get(db_keys), strict=True):
            known[table, db_key] = ABSENT if raw is None else pickle.loads(raw)

    def get(self, table: _Table, db_key: bytes) -> Any:
        """The current value of ``db_key``, or ``ABSENT``."""
        slot = (table, db_key)
        value = self._known.get(slot, ABSENT)
        if value is ABSENT and slot not in self._known:  # not prefetched: read it now
            raw = table.rdict.get(db_key)
            value = self._known[slot] = ABSENT if raw is None else pickle.loads(raw)
        return value

    def set(
        self, table: _Table, db_key: bytes, value: Any, map_prefix: bytes | None = None
    ) -> None:
        """Write ``value`` (``ABSENT`` deletes); ``map_prefix`` for map entries."""
        slot = (table, db_key)
        self._known[slot] = self._dirty[slot] = value
        if map_prefix is not None:
            self._dirty_maps.setdefault((table, map_prefix), set()).add(db_key)

    def map_entries(self, table: _Table, prefix: bytes) -> list[tuple[bytes, Any]]:
        """``(DB key, value)`` of every entry under ``prefix``, in DB key order."""
        dirty = {k: self._dirty[table, k] for k in self._dirty_maps.get((table, prefix), ())}
        return merge_map_overlay(_scan(table, prefix, True), dirty)

    def map_chunk(
        self, table: _Table, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, Any]], bytes | None]:
        """Up to ``limit`` ``(DB key, value)`` entries under ``prefix`` with DB key
        greater than ``after`` (None: from the start), and the last one's DB key if
        more follow. Scans only what it returns unless this batch wrote the map."""
        if (table, prefix) in self._dirty_maps:  # merge with this batch's writes
            entries = [e for e in self.map_entries(table, prefix) if after is None or e[0] > after]
        else:
            start = prefix if after is None else after + b"\x00"
            entries = []
            for db_key, raw in _scan(table, prefix, True, start):
                entries.append((db_key, pickle.loads(raw)))
                if len(entries) > limit:
                    break
        if len(entries) > limit:
            return entries[:limit], entries[limit - 1][0]
        return entries, None

    def map_is_empty(self, table: _Table, prefix: bytes) -> bool:
        dirty = self._dirty_maps.get((table, prefix), ())
        if any(self._dirty[table, db_key] is not ABSENT for db_key in dirty):
            return False
        # Every dirty entry is a deletion: the map is empty unless the DB has another.
        return all(db_key in dirty for db_key in _scan(table, prefix, False))

    def map_clear(self, table: _Table, prefix: bytes) -> None:
        keys = set(_scan(table, prefix, False))
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
                batch.put(db_key, dumps(value), table.handle)
        db.write(batch, write_options)


# --- backend -----------------------------------------------------------------------


class RocksDBBackend(StateBackend):
    """Keyed state in a RocksDB directory (one per partition in Spark).

    Args:
        path: the DB directory; created if missing. An existing aec DB is reopened
            with its state unless ``fresh``.
        options: optional ``(rocksdict.Options) -> None`` hook that tunes the
            options of the DB and of every column family (compression, block cache,
            ...); it gets ``Options(raw_mode=True)`` and must keep raw mode. Must be
            picklable (a module-level function) for ``spec()`` to pickle.
        disable_wal: skip the write-ahead log (default True, as in Flink); the live
            directory then survives only clean closes; snapshots are always complete.
        fresh: on ``open``, destroy any DB already at ``path`` (``spec()`` builds
            fresh backends, since a Spark task must start from empty state).

    Blocking: batches run on the engine's I/O threads, several at once (they never
    share a key). Each batch does one multi-get per state it reads, applies its
    requests in order over an overlay, and writes once (one ``WriteBatch``).
    ``snapshot``/``restore``/``close`` must not overlap ``execute_batch``.

    Raises:
        RuntimeError: ``execute_batch`` before ``open`` or after ``close``.
        ValueError: ``open`` on a RocksDB directory aec did not write.
    """

    blocking = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        options: OptionsHook | None = None,
        disable_wal: bool = True,
        fresh: bool = False,
    ) -> None:
        if options is not None and not callable(options):
            raise TypeError(
                f"options must be a callable (rocksdict.Options) -> None, got {type(options).__name__}"
            )
        self.path = os.fspath(path)
        self._options_hook = options
        self._disable_wal = disable_wal
        self._fresh = fresh
        self._write_options = WriteOptions()
        self._write_options.disable_wal = disable_wal  # a property, though the stub says method
        self._lock = threading.Lock()  # lifecycle and column-family creation
        self._db: Rdict | None = None
        self._tables: dict[str, _Table] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"RocksDBBackend({self.path!r})"

    # lifecycle

    def open(self) -> None:
        """Open (or create) the DB at ``path``; a second call does nothing."""
        with self._lock:
            self._check_not_closed()
            if self._db is None:
                if self._fresh and _holds_database(self.path):
                    Rdict.destroy(self.path, self._make_options())
                self._open_db()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_db()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _make_options(self) -> Options:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_atomic_flush(True)  # without a WAL, flush all states together
        # State overwrites the same keys (a counter, a running sum): update them in
        # the memtable in place while the new value is no larger, instead of adding a
        # version per write. Measured: a read+write pair stays at ~1.4 us instead of
        # growing to 3.2 us as the memtable fills with versions. Needs serialized
        # memtable writes; RocksDB snapshots (unused here) would see in-place updates.
        options.set_allow_concurrent_memtable_write(False)
        options.set_inplace_update_support(True)
        if self._options_hook is not None:
            self._options_hook(options)
        return options

    def _open_db(self) -> None:
        existed = _holds_database(self.path)
        os.makedirs(self.path, exist_ok=True)
        options = self._make_options()
        # RocksDB refuses to open a DB without naming all its column families.
        names = [n for n in Rdict.list_cf(self.path, options) if n != "default"] if existed else []
        db = Rdict(self.path, options, column_families={n: self._make_options() for n in names})
        if not existed:
            db.put(_FORMAT_KEY, _FORMAT)
        elif db.get(_FORMAT_KEY) != _FORMAT:
            db.close()
            raise ValueError(f"{self.path} holds a RocksDB database that aec did not write")
        self._db = db
        self._tables = {
            name[len(_CF_PREFIX) :]: _Table(
                name[len(_CF_PREFIX) :],
                db.get_column_family(name),
                db.get_column_family_handle(name),
            )
            for name in names
            if name.startswith(_CF_PREFIX)
        }

    def _close_db(self) -> None:
        # Column-family objects keep the DB (and its LOCK file) alive until closed or freed.
        for table in self._tables.values():
            table.rdict.close()
        self._tables = {}
        if self._db is not None:
            self._db.close()
            self._db = None

    def _table(self, state: str) -> _Table:
        table = self._tables.get(state)
        if table is None:
            with self._lock:
                table = self._tables.get(state)
                if table is None:
                    name = _CF_PREFIX + state
                    db = self._live_db()
                    rdict = db.create_column_family(name, self._make_options())
                    table = _Table(state, rdict, db.get_column_family_handle(name))
                    self._tables = {**self._tables, state: table}  # readers see old or new
        return table

    def _live_db(self) -> Rdict:
        db = self._db
        if db is None:
            self._check_not_closed()
            raise RuntimeError(f"{self!r} is not open: call open() first")
        return db

    # batches

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        db = self._live_db()
        # Plan each request's table and DB key and collect the keys to multi-get per
        # table. Locals and the same-state check keep this loop cheap: it runs per
        # request on an I/O thread that shares the GIL with the mailbox thread.
        tables = self._tables
        prefixes: dict[Any, bytes] = {}  # a record's requests share its key: encode it once
        plan_tables: list[_Table] = []
        plan_keys: list[bytes] = []
        reads: dict[_Table, dict[bytes, None]] = {}  # ordered sets of DB keys to multi-get
        last_state, table, table_reads = None, None, None
        for request in requests:
            state = request.state
            if state is not last_state:
                table = tables.get(state) or self._table(state)
                table_reads = reads.get(table)
                if table_reads is None:
                    table_reads = reads[table] = {}
                last_state = state
            key = request.key
            db_key = prefixes.get(key)
            if db_key is None:
                db_key = prefixes[key] = key_prefix(request.key_group, key)
            op = request.op
            if op in POINT_READS:
                if op in USER_KEY_OPS:
                    db_key += encode_key(request.user_key)
                table_reads[db_key] = None
            plan_tables.append(table)
            plan_keys.append(db_key)
        view = _BatchView()
        for table, keys in reads.items():
            if keys:
                view.prefetch(table, list(keys))
        apply = APPLY_OPS
        for request, table, db_key in zip(requests, plan_tables, plan_keys, strict=True):
            apply[request.op](view, table, db_key, request)
        view.commit(db, self._write_options)

    # snapshots

    def snapshot(self, directory: str) -> None:
        """Checkpoint all state into ``directory/rocksdb`` (hard links where possible)."""
        with self._lock:
            db = self._live_db()
            os.makedirs(directory, exist_ok=True)
            target = os.path.join(directory, _SNAPSHOT_SUBDIR)
            staging = f"{target}.tmp-{uuid.uuid4().hex}"  # Checkpoint needs a new directory
            Checkpoint(db).create_checkpoint(staging)  # flushes memtables first
            if os.path.exists(target):
                shutil.rmtree(target)
            os.replace(staging, target)

    def restore(self, directory: str) -> None:
        """Replace all state with ``directory/rocksdb``; opens the backend if needed.

        Raises FileNotFoundError when the snapshot is missing and ValueError when it
        is not an aec RocksDB checkpoint; the live state is untouched in both cases.
        """
        source = os.path.join(directory, _SNAPSHOT_SUBDIR)
        if not os.path.isdir(source):
            raise FileNotFoundError(f"no RocksDB snapshot at {source}")
        if not _holds_database(source):
            raise ValueError(f"{source} is not a RocksDB checkpoint (no CURRENT file)")
        self.open()
        with self._lock:
            self._check_not_closed()
            staging = f"{self.path}.restore-{uuid.uuid4().hex}"
            shutil.copytree(source, staging)  # a copy: opening the DB appends to its MANIFEST
            try:
                _check_database(staging, self._options_hook)
            except Exception:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            self._close_db()
            shutil.rmtree(self.path)
            os.replace(staging, self.path)
            self._open_db()

    # introspection

    def spec(self) -> BackendSpec:
        return RocksDBSpec(self.path, options=self._options_hook, disable_wal=self._disable_wal)

    def state_items(self, state: str) -> dict[Any, Any]:
        """``{key: value | list | dict}``; keys and user keys in canonical form."""
        self._live_db()
        table = self._tables.get(state)
        if table is None:
            return {}
        items: dict[Any, Any] = {}
        for db_key, raw in table.rdict.items():
            key, user_key = split_db_key(db_key)
            if user_key:
                items.setdefault(key, {})[decode_key(user_key)] = pickle.loads(raw)
            else:
                items[key] = pickle.loads(raw)
        return items


def _holds_database(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "CURRENT"))  # every RocksDB directory has one


def _check_database(path: str, options: OptionsHook | None) -> None:
    """Raise ValueError unless ``path`` opens as an aec RocksDB database."""
    probe = RocksDBBackend(path, options=options)
    try:
        probe.open()
    except ValueError:
        raise
    except Exception as exc:  # rocksdict raises bare Exception for corrupt databases
        raise ValueError(f"cannot open the RocksDB database at {path}: {exc}") from exc
    finally:
        probe.close()


class RocksDBSpec(BackendSpec):
    """Builds ``RocksDBBackend(os.path.join(base, f"partition-{partition}"), fresh=True)``.

    Each partition gets its own directory under ``base`` and starts empty: durable
    state comes back through ``restore``. ``options`` must be picklable.
    """

    def __init__(
        self, base: str, *, options: OptionsHook | None = None, disable_wal: bool = True
    ) -> None:
        self.base = base
        self.options = options
        self.disable_wal = disable_wal

    def path_for(self, partition: int) -> str:
        if partition < 0:
            raise ValueError(f"partition must be >= 0, got {partition}")
        return os.path.join(self.base, f"partition-{partition}")

    def build(self, partition: int) -> StateBackend:
        return RocksDBBackend(
            self.path_for(partition), options=self.options, disable_wal=self.disable_wal, fresh=True
        )
