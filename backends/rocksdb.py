"""RocksDBBackend: keyed state in a local RocksDB (rocksdict, raw mode).

Layout (Flink's RocksDB state backend, simplified):

* one column family per state, named ``"state/" + state name``, created on first use;
  the default column family holds only a format marker;
* DB keys are ``backends.keycodec`` keys: ``key group | len(key bytes) | key bytes``
  for value and list state, followed by the encoded user key for map state, so one
  key's map is one prefix range; values are encoded by the state's serializer
  (``StateBackend.register_state``: msgpack unless the state opted in to pickle);
* a batch's requests run over ``backends.overlay``'s op functions (shared with
  SlateDB), against ``backends.rocksdb_batch.RocksBatchView``: one multi-get per
  column family, one ``WriteBatch`` at the end.

Value state is one entry per key; list state is one entry holding the encoded list
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

Reads check RocksDB's status (``backends.rocksdb_batch``): a corrupt block fails the
batch with ``StateReadError`` naming the state and key group, never reads as absent.

TTL state (``aec.state.ttl_cleanup``): rocksdict has no compaction filter (Flink's
``cleanupInRocksdbCompactFilter``), so expired entries are removed by an incremental
sweep. Every write of a TTL state also puts ``expiry head | DB key`` into the state's
expiry index, the column family ``"ttl/" + state name`` (``backends.ttl_codec``), in
the same ``WriteBatch``. Before a batch whose writes earned a sweep, the index is
read from where the last sweep stopped up to ``now``: only entries that expired,
never the tombstones of those removed before (a scan of the state passed all of
them every round, so its cost grew with every key the job had ever written). The
rows they name are read (one multi-get) and removed if their stored expiry has
passed (a row written again since stays; a list is rewritten with its live
elements), the index entries read deleted (by one range delete per ``_INDEX_DROP``
of them), all in one ``WriteBatch``. With a thread pool a sweep waits for the
batches running on other I/O threads, and they for it (``backends.sweep_gate``):
else it could delete a value another thread's batch wrote after it read the row
expired. A restore that
merges further snapshots copies their index entries of the key groups kept; a TTL
state found without an index (written before the state had a TTL) is indexed once
when opened.

Snapshots (``backends.rocksdb_snapshots``) are RocksDB checkpoints (hard links); a
restore hard-links the first snapshot into a new live directory, range-deletes keys
outside the key groups kept and range-scans the key groups of any further snapshot:
never a copy of a whole database.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from rocksdict import DBCompactionStyle, Options, Rdict, WriteBatch, WriteOptions

from aec.keygroups import KeyGroupRange
from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import StateRequest
from aec.state.serialization import Serializer
from aec.state.ttl_cleanup import TtlState
from backends.keycodec import decode_key, encode_key, key_group_bounds, key_prefix, split_db_key
from backends.overlay import APPLY_OPS, POINT_READS, USER_KEY_OPS
from backends.rocksdb_batch import (
    RocksBatchView,
    Table,
    multi_get,
    rows,
    run_value_batch,
    scan_range,
)
from backends.rocksdb_snapshots import (
    holds_database,
    linked_copy,
    snapshot_source,
    stamps,
    sweep_leftovers,
    write_checkpoint,
)
from backends.snapshot_sets import checked_key_groups, snapshot_directories
from backends.sweep_gate import SweepGate
from backends.ttl_codec import (
    HEAD_SIZE,
    UNCHANGED,
    head,
    index_head,
    row_head,
    stored_codec,
    swept_row,
)

_CF_PREFIX = "state/"
_INDEX_PREFIX = "ttl/"  # a TTL state's expiry index (``backends.ttl_codec``)
_FORMAT_KEY = b"aec/format"
_FORMAT = b"aec-rocksdb-1"
_PAST_EVERY_KEY = b"\xff" * 8  # above every DB key (the key group is at most 0xffff)
_COPY_BATCH = 10_000  # puts per WriteBatch when merging a snapshot in
_INDEX_DROP = 16_384  # expiry index entries read per range delete of them

OptionsHook = Callable[[Options], None]


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

    Not ``blocking``: batches run on the mailbox thread. rocksdict holds the GIL in
    every call (its DB handle is not ``Sync``, so it never releases it), so an I/O
    thread could only take turns with the mailbox thread and add hand-offs
    (``docs/performance.md``). ``prefers_batches``: a call costs about what two
    requests inside a batch cost, so a hot key's next request joins the batch of
    other records when there is one. Each batch does one multi-get per state it
    reads, applies its requests in order over an overlay, and writes once (one
    ``WriteBatch``). Batches may still come from several threads (a
    ``LatencyBackend`` or ``CachedBackend`` around it serializes them).
    ``snapshot``/``restore``/``close`` must not overlap ``execute_batch``.

    Raises:
        RuntimeError: ``execute_batch`` before ``open`` or after ``close``.
        ValueError: ``open`` on a RocksDB directory aec did not write.
    """

    blocking = False  # rocksdict never releases the GIL: see the class doc
    ttl_sweep_chunk = 1024  # a sweep reads only entries due (its expiry index): batch them
    prefers_batches = True

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
        # a property, though rocksdict's stub declares a method
        self._write_options.disable_wal = disable_wal  # type: ignore[method-assign,assignment]
        self._lock = threading.RLock()  # lifecycle and column-family creation
        self._opened = False
        self._pending_fresh = False  # ``fresh``: destroy and create on first use
        self._db: Rdict | None = None
        self._tables: dict[str, Table] = {}
        self._indexes: set[str] = set()  # states whose expiry index the live DB holds
        self._swept: dict[str, bytes] = {}  # state -> its index holds nothing below this
        # state -> (the first index key read and not deleted yet, how many were read)
        self._read_since: dict[str, tuple[bytes, int]] = {}
        self._gate = SweepGate()  # TTL sweeps never overlap a batch (I/O threads)
        self._stamps: dict[str, tuple[int, int]] = {}  # live tables' (size, mtime) when linked
        self._closed = False

    def __repr__(self) -> str:
        return f"RocksDBBackend({self.path!r})"

    # lifecycle

    def open(self) -> None:
        """Open (or create) the DB at ``path``; a second call does nothing.

        With ``fresh`` the destruction of an old DB and the creation of the new one
        wait for the first use, so that a ``restore`` right after ``open`` (a restarted
        task) replaces the directory once instead of creating a DB to throw away."""
        with self._lock:
            self._check_not_closed()
            if not self._opened:
                sweep_leftovers(self.path)  # what a restore killed midway left beside it
            if self._db is None and not self._pending_fresh:
                if self._fresh and not self._opened:
                    self._pending_fresh = True
                else:
                    self._open_db()
            self._opened = True

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                try:
                    if self._pending_fresh:  # a fresh backend closes empty
                        self._start_fresh()
                finally:
                    self._closed = True
                    self._close_db()

    def _start_fresh(self) -> None:
        if holds_database(self.path):
            Rdict.destroy(self.path, self._make_options())
        self._open_db()
        self._pending_fresh = False

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
        # Universal (tiered) compaction: a micro-batch's small flush merges with other
        # small files, not with the whole state. Level compaction merged every 4 flushes
        # into L1, which holds all state when keys spread over every key group: O(state)
        # per 4 micro-batches, aborted and restarted by each close, until L0 stalled
        # writes (measured: 430 ms flushes at 2M keys). Full merges now come only when
        # the small files add up to the state's size (max_size_amplification_percent).
        # The merges start at 8 sorted runs, not RocksDB's 4: the bulk of a large state
        # is often two or three runs already, so 4 merged every micro-batch's flush with
        # the one before, and each checkpoint stored that file again (on an object
        # store: uploaded again; measured at 2M keys: 10.1 kB per micro-batch, 7.5 kB
        # with 8; 6.8 kB at 2k keys).
        options.set_compaction_style(DBCompactionStyle.universal())
        options.set_level_zero_file_num_compaction_trigger(8)
        # Opening reads no table properties for statistics (per SST file otherwise).
        options.set_skip_stats_update_on_db_open(True)
        if self._options_hook is not None:
            self._options_hook(options)
        return options

    def _open_db(self) -> None:
        existed = holds_database(self.path)
        os.makedirs(self.path, exist_ok=True)
        options = self._make_options()
        # RocksDB refuses to open a DB without naming all its column families.
        names = [n for n in Rdict.list_cf(self.path, options) if n != "default"] if existed else []
        db = Rdict(self.path, options, column_families={n: self._make_options() for n in names})
        tables: dict[str, Table] = {}
        try:  # a failure past here closes the DB: it holds the directory's LOCK
            if not existed:
                db.put(_FORMAT_KEY, _FORMAT)
            elif db.get(_FORMAT_KEY) != _FORMAT:
                raise ValueError(f"{self.path} holds a RocksDB database that aec did not write")
            for name in names:
                if name.startswith(_CF_PREFIX):
                    state = name[len(_CF_PREFIX) :]
                    tables[state] = Table(
                        state,
                        db.get_column_family(name),
                        db.get_column_family_handle(name),
                        self._codec(state),
                    )
        except BaseException:
            for table in tables.values():
                table.rdict.close()
            db.close()
            raise
        self._db = db
        self._tables = tables
        self._indexes = {n[len(_INDEX_PREFIX) :] for n in names if n.startswith(_INDEX_PREFIX)}
        self._swept, self._read_since = {}, {}
        for table in tables.values():
            self._index(table)

    def _close_db(self) -> None:
        # Column-family objects keep the DB (and its LOCK file) alive until closed or freed.
        for table in self._tables.values():
            table.rdict.close()
            if table.index_rdict is not None:
                table.index_rdict.close()
        self._tables = {}
        if self._db is not None:
            self._db.close()
            self._db = None

    def _table(self, state: str) -> Table:
        table = self._tables.get(state)
        if table is None:
            with self._lock:
                table = self._tables.get(state)
                if table is None:
                    name = _CF_PREFIX + state
                    db = self._live_db()
                    rdict = db.create_column_family(name, self._make_options())
                    handle = db.get_column_family_handle(name)
                    table = Table(state, rdict, handle, self._codec(state))
                    self._index(table)
                    self._tables = {**self._tables, state: table}  # readers see old or new
        return table

    def _table_of(self, state: str) -> Table:
        return self._tables.get(state) or self._table(state)

    def _live_db(self) -> Rdict:
        db = self._db
        if db is None:
            with self._lock:
                if self._db is None and self._pending_fresh and not self._closed:
                    self._start_fresh()
                db = self._db
            if db is None:
                self._check_not_closed()
                raise RuntimeError(f"{self!r} is not open: call open() first")
        return db

    def register_state(self, name: str, serializer: Serializer) -> None:
        super().register_state(name, serializer)
        table = self._tables.get(name)
        if table is not None:
            table.use(self._codec(name))

    def register_ttl(self, name: str, ttl: float, kind: str) -> None:
        super().register_ttl(name, ttl, kind)
        table = self._tables.get(name)
        if table is not None:
            table.use(self._codec(name))
            with self._lock:
                self._index(table)

    def _index(self, table: Table) -> None:
        """Give a TTL state's table its expiry index (``backends.ttl_codec``): the
        column family ``ttl/<state>``, made (and filled from the state's rows, if it
        has any) when the database has none yet."""
        kind = self.ttl_cleanup.kind(table.state)
        if kind is None or table.index is not None:
            return
        db = self._live_db()
        rdict, handle, made = self._index_family(table.state)
        table.index_in(rdict, handle, index_head(kind))
        if made:
            batch = WriteBatch(raw_mode=True)
            for db_key, raw in rows(table, b"", None, True):
                batch.put(row_head(kind, table.loads(raw)) + db_key, b"", table.index)
            if not batch.is_empty():
                db.write(batch, self._write_options)

    def _codec(self, state: str) -> Serializer:
        """How ``state``'s values are stored: its serializer, or ``TtlPairs`` over it for
        a TTL state's pairs (``backends.ttl_codec``)."""
        return stored_codec(self.serializers.of(state), self.ttl_cleanup.kind(state))

    # batches

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        # a sweep never overlaps a batch running on another I/O thread
        self._gate.run_batch(self._ttl_cleanup, requests, self._sweep_step, self._execute)

    def _execute(self, requests: Sequence[StateRequest]) -> None:
        db = self._live_db()
        if run_value_batch(db, self._table_of, requests, self._write_options):
            return
        # Plan each request's table and DB key and collect the keys to multi-get per
        # table. Locals and the same-state check keep this loop cheap: it runs per
        # request, on the mailbox thread (or an I/O thread sharing its GIL, wrapped).
        plan_tables: list[Table] = []
        plan_keys: list[bytes] = []
        reads: dict[Table, dict[bytes, None]] = {}  # ordered sets of DB keys to multi-get
        last_state: str | None = None
        table: Table  # both bound by the first request (its state is never None)
        table_reads: dict[bytes, None]
        for request in requests:
            state = request.state
            if state is not last_state:
                table = self._table_of(state)
                found = reads.get(table)
                if found is None:
                    found = reads[table] = {}
                table_reads = found
                last_state = state
            db_key = key_prefix(request.key_group, request.key)
            op = request.op
            if op in POINT_READS:
                if op in USER_KEY_OPS:
                    db_key += encode_key(request.user_key)
                table_reads[db_key] = None
            plan_tables.append(table)
            plan_keys.append(db_key)
        view = RocksBatchView()
        for table, keys in reads.items():
            if keys:
                view.prefetch(table, list(keys))
        apply = APPLY_OPS
        for request, table, db_key in zip(requests, plan_tables, plan_keys, strict=True):
            apply[request.op](view, table, db_key, request)
        view.commit(db, self._write_options)

    def _index_family(self, state: str) -> tuple[Rdict, Any, bool]:
        """The expiry index column family of ``state`` (``rdict``, handle) and whether
        it was made just now."""
        db = self._live_db()
        name = _INDEX_PREFIX + state
        made = state not in self._indexes
        rdict = db.create_column_family(name, self._make_options()) if made else (
            db.get_column_family(name)
        )  # fmt: skip
        self._indexes.add(state)
        return rdict, db.get_column_family_handle(name), made

    def _sweep_step(self, state: TtlState, cursor: Any, limit: int, now: float) -> tuple[int, Any]:
        """``TtlCleanup.sweep``'s step: read ``state``'s expiry index from ``cursor``
        (None: where the last round ended) up to ``now``, at most ``limit`` entries;
        remove (or rewrite, a list) the rows they name that expired (an entry whose
        row was written again since names a row that has not: it stays), and the
        entries read, in one ``WriteBatch``."""
        table = self._tables.get(state.name)
        if table is None or table.index_rdict is None:
            return 0, None
        start = cursor or self._swept.get(state.name, b"")
        due: list[bytes] = []
        bound = head(now)
        for index_key in cast("Iterator[bytes]", table.index_rdict.keys(from_key=start)):
            if index_key[:HEAD_SIZE] > bound or len(due) == limit:
                break
            due.append(index_key)
        if not due:
            self._swept[state.name] = start
            return 0, None
        codec, kind = table.serializer, state.kind
        batch = WriteBatch(raw_mode=True)
        db_keys = list(dict.fromkeys(index_key[HEAD_SIZE:] for index_key in due))
        for db_key, raw in zip(db_keys, multi_get(table, db_keys), strict=True):
            if raw is None:
                continue
            left = swept_row(codec, kind, raw, now, bound)
            if left is None:
                batch.delete(db_key, table.handle)
            elif left is not UNCHANGED:
                batch.put(db_key, left, table.handle)
        following = due[-1] + b"\x00"  # the least key past the last entry read
        # The entries read go by one range delete per _INDEX_DROP of them: a point
        # delete each cost as much as a write, and every range tombstone in a memtable
        # slows each new iterator of it (one per sweep), so they must stay few.
        low, read = self._read_since.get(state.name, (start, 0))
        read += len(due)
        if read >= _INDEX_DROP:
            batch.delete_range(low, following, table.index)
            low, read = following, 0
        self._read_since[state.name] = (low, read)
        self._live_db().write(batch, self._write_options)
        if len(due) == limit:
            return len(due), following
        self._swept[state.name] = following
        return len(due), None

    def stored_entries(self, state: str) -> int:
        """Rows of ``state`` (a map entry is one), expired ones not removed yet included."""
        self._live_db()
        table = self._tables.get(state)
        return 0 if table is None else sum(1 for _ in rows(table, b"", None, False))

    # snapshots

    def snapshot(self, directory: str) -> None:
        """Checkpoint all state into ``directory/rocksdb`` (hard links where possible)."""
        with self._lock:
            self._stamps = write_checkpoint(self._live_db(), directory, self._stamps)

    def scratch_parent(self) -> str:
        """Beside the live directory, where restores stage it: a checkpoint's tables
        are linked there once and linked again into the live directory."""
        return os.path.dirname(os.path.abspath(self.path))

    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        """Replace all state with the union of the snapshots in ``directory`` (one
        snapshot directory or several), keeping only keys of ``key_groups`` (None:
        all); opens the backend if needed.

        The first snapshot becomes the new live database by hard links (no state
        bytes copied) and keys outside ``key_groups`` are dropped with range deletes
        (one tombstone per state and bound), so restoring one snapshot costs the
        same whatever its size. Each further snapshot adds only its keys inside
        ``key_groups`` (a range scan; keys are prefixed by key group). Snapshots
        are expected to hold disjoint key groups; a key in several keeps the value
        of the last one listed. ``max_parallelism`` is only checked (keys carry
        their key group).

        Raises FileNotFoundError when a snapshot is missing and ValueError when one
        is not an aec RocksDB checkpoint or ``key_groups`` is out of range; the live
        state is untouched in all these cases (everything is built beside it and
        swapped in last).
        """
        key_groups = checked_key_groups(key_groups, max_parallelism)
        sources = [snapshot_source(d) for d in snapshot_directories(directory)]
        self.open()
        with self._lock:
            self._check_not_closed()
            staging = f"{self.path}.restore-{uuid.uuid4().hex}"
            scratches: list[str] = []
            others: list[RocksDBBackend] = []
            try:
                linked_copy(sources[0], staging)
                for source in sources[1:]:  # every snapshot opens before anything changes
                    scratches.append(f"{staging}.source-{uuid.uuid4().hex}")
                    linked_copy(source, scratches[-1])
                    others.append(_opened(scratches[-1], self._options_hook))
                self._switch_to(staging, key_groups, others)
                self.ttl_cleanup.restart()
                # the live links (or copies) of the first snapshot's tables; not a
                # compaction's output, which may still be being written
                self._stamps = stamps(self.path, set(stamps(sources[0])))
            finally:
                for other in others:
                    other.close()
                for path in (staging, *scratches):
                    shutil.rmtree(path, ignore_errors=True)

    def _switch_to(
        self, staging: str, key_groups: KeyGroupRange | None, others: list[RocksDBBackend]
    ) -> None:
        """Make ``staging`` the live directory, then filter and merge ``others`` in; on
        any failure put the previous live directory back."""
        was_open = self._db is not None
        self._close_db()
        aside = f"{self.path}.previous-{uuid.uuid4().hex}"
        had_live = os.path.exists(self.path)
        if had_live:
            os.replace(self.path, aside)
        os.replace(staging, self.path)
        try:
            try:
                self._open_db()
            except ValueError:
                raise
            except Exception as exc:  # rocksdict raises bare Exception for corrupt databases
                raise ValueError(f"cannot open the restored RocksDB database: {exc}") from exc
            if key_groups is not None:
                self._drop_outside(key_groups)
            for other in others:
                self._copy_from(other, key_groups)
        except BaseException:
            self._close_db()
            shutil.rmtree(self.path, ignore_errors=True)
            if had_live:
                os.replace(aside, self.path)
            if was_open:
                self._open_db()
            raise
        self._pending_fresh = False
        if had_live:
            shutil.rmtree(aside, ignore_errors=True)

    def _drop_outside(self, key_groups: KeyGroupRange) -> None:
        """Range-delete every state key outside ``key_groups`` (O(1) per state)."""
        low, high = key_group_bounds(key_groups.start, key_groups.end)
        batch = WriteBatch(raw_mode=True)
        for table in self._tables.values():
            if key_groups.start > 0:
                batch.delete_range(b"", low, table.handle)
            if high is not None:
                batch.delete_range(high, _PAST_EVERY_KEY, table.handle)
        if not batch.is_empty():
            self._live_db().write(batch, self._write_options)

    def _copy_from(self, other: RocksDBBackend, key_groups: KeyGroupRange | None) -> None:
        """Write every key of ``other`` inside ``key_groups`` into this database."""
        low, high = (
            (b"", None)
            if key_groups is None
            else key_group_bounds(key_groups.start, key_groups.end)
        )
        db = self._live_db()
        for state, source in other._tables.items():
            table = self._table(state)
            batch = WriteBatch(raw_mode=True)
            for db_key, raw in scan_range(source, low, high):
                batch.put(db_key, raw, table.handle)
                if batch.len() >= _COPY_BATCH:
                    db.write(batch, self._write_options)
                    batch = WriteBatch(raw_mode=True)
            if not batch.is_empty():
                db.write(batch, self._write_options)
        for state in other._indexes:  # their expiry index entries of the rows copied
            entries = other._live_db().get_column_family(_INDEX_PREFIX + state)
            target, handle, _ = self._index_family(state)
            try:
                batch = WriteBatch(raw_mode=True)
                for index_key in cast("Iterator[bytes]", entries.keys()):
                    db_key = index_key[HEAD_SIZE:]
                    if low <= db_key and (high is None or db_key < high):
                        batch.put(index_key, b"", handle)
                db.write(batch, self._write_options)
            finally:
                entries.close()
                target.close()

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
        loads = table.loads
        for db_key, raw in cast("Iterator[tuple[bytes, bytes]]", rows(table, b"", None, True)):
            key, user_key = split_db_key(db_key)
            if user_key:
                items.setdefault(key, {})[decode_key(user_key)] = loads(raw)
            else:
                items[key] = loads(raw)
        return self.ttl_cleanup.visible(state, items)


def _opened(path: str, options: OptionsHook | None) -> RocksDBBackend:
    """An open ``RocksDBBackend`` on ``path``; ValueError unless it is an aec database."""
    backend = RocksDBBackend(path, options=options)
    try:
        backend.open()
    except ValueError:
        backend.close()
        raise
    except Exception as exc:  # rocksdict raises bare Exception for corrupt databases
        backend.close()
        raise ValueError(f"cannot open the RocksDB database at {path}: {exc}") from exc
    return backend


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
