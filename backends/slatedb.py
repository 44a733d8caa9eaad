"""SlateDBBackend: keyed state in SlateDB, an LSM tree on object storage.

SlateDB (PyPI ``slatedb``, API in ``slatedb.uniffi``) keeps its write-ahead log,
SSTs and manifest on an object store; this backend is the Python analogue of
Flink's ForSt on DFS. One ``Db`` per backend (one per partition in Spark).

Layout: one keyspace of byte-ordered keys. A state key is
``b"s" | len(state name) (2 bytes, big-endian) | state name (UTF-8) |``
``backends.keycodec.key_prefix(key group, key)``, followed by the encoded user key
for map entries, so one key's map is one prefix range and one state is one prefix
range. Value and list state are one entry per key (a list is one encoded list);
map state is one entry per ``(key, user key)``; values are encoded by their state's
serializer (``StateBackend.register_state``; msgpack unless a state opted in). ``MAP_ITER``
yields entries in the byte order of the encoded user keys, as ``RocksDBBackend``
does. The key ``b"\\x00aec/format"`` marks a database aec wrote.

Execution: the backend owns an asyncio event loop running in one thread
(``aec-slatedb-loop``); every SlateDB call is a coroutine run on it.
``execute_batch`` (blocking, on the engine's I/O threads) hands the batch to that
loop and waits: the batch's point reads and map range scans are issued
concurrently (``asyncio.gather``), its requests are then applied in list order
over a per-batch overlay (``backends.overlay``'s op functions, so reads after a
write of the same key in the batch see the write), and its writes go out as one
SlateDB ``WriteBatch`` without waiting for durability. Batches of concurrent I/O
threads interleave on the loop (they never share a key).

TTL state (``aec.state.ttl_cleanup``): SlateDB's own TTL runs on the wall clock, not
on the operator's processing time, so expired entries are removed by a sweep: a
batch whose writes earned one first scans each TTL state on from a cursor key and
deletes (or rewrites, a list) the expired rows in one ``WriteBatch``, alone
(``backends.sweep_gate``: concurrent batches wait, and it waits for them).

Durability: ``flush()`` (called by the engine at drain) flushes the WAL to the
object store and raises if that fails, so every write acknowledged before it
survives a crash; SlateDB also flushes its WAL on its own every
``flush_interval`` (100 ms by default). ``close()`` flushes before closing.

Snapshots (``backends.slatedb_snapshots``): ``snapshot(dir)`` flushes the memtable to
L0 SSTs, creates a SlateDB checkpoint (a pinned manifest, no data copy) and writes
``dir/slatedb-snapshot.json`` naming it and the durable sequence number (atomically).
``restore(dirs, key_groups)`` is a no-op when the one snapshot is this database's own
and nothing was written since (a restarted task); otherwise it opens a ``DbReader``
pinned to each checkpoint, range-scans their key-group ranges and rewrites the live
database to equal the union (a merge of the sorted key streams: puts for changed
keys, deletes for keys the union lacks), so the live path never changes. A ``fresh``
open defers its wipe to the first use other than ``restore``. Checkpoints never
expire; snapshotting again into the same directory deletes the checkpoint it replaces.

Object stores, by URL:

* ``file:///abs/dir``: a local directory (created if missing); the database is at
  ``dir/<path>``.
* ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``: the
  database is at ``prefix/<path>`` in the bucket. Configuration comes from the
  environment as the Rust ``object_store`` crate reads it (S3:
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT`` for
  S3-compatible servers such as MinIO or moto, ``AWS_ALLOW_HTTP=true`` for a
  plain-HTTP endpoint, refused with ValueError without it; GCS:
  ``GOOGLE_SERVICE_ACCOUNT``...; Azure: ``AZURE_STORAGE_ACCOUNT_NAME``,
  ``AZURE_STORAGE_ACCOUNT_KEY``...) plus ``object_store_options`` (the crate's
  config keys: ``endpoint``, ``region``, ``access_key_id``, ``allow_http``...).
  A cloud store's client gets ``connect_timeout`` and ``timeout`` (one request)
  from ``aec.timeouts.store_timeouts()`` unless ``object_store_options`` set them.
"""

from __future__ import annotations

import os
import threading
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from slatedb import uniffi as sdb

from aec.keygroups import KeyGroupRange
from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import StateRequest
from aec.state.serialization import Serializer
from aec.state.ttl_cleanup import TtlState
from aec.timeouts import store_timeouts
from backends.keycodec import decode_key, split_db_key
from backends.slatedb_batch import execute
from backends.slatedb_loop import LoopThread
from backends.slatedb_snapshots import (
    NAME,
    create_checkpoint,
    read_manifest,
    release_checkpoints,
    restore_union,
    unchanged_since,
    write_manifest,
)
from backends.slatedb_store import (
    FORMAT,
    FORMAT_KEY,
    WAL,
    join_path,
    make_settings,
    object_store,
    parse_url,
    probe_endpoint,
    scan,
    state_prefix,
    wipe_states,
)
from backends.snapshot_sets import checked_key_groups, snapshot_directories
from backends.sweep_gate import SweepGate
from backends.ttl_codec import UNCHANGED, head, stored_codec, swept_row

__all__ = ["DEFAULT_BLOCK_CACHE_BYTES", "SlateDBBackend", "SlateDBSpec", "state_prefix"]

DEFAULT_BLOCK_CACHE_BYTES = 64 << 20


# --- backend -----------------------------------------------------------------------------


class SlateDBBackend(StateBackend):
    """Keyed state in SlateDB on an object store (one database per partition).

    Args:
        url: the object store: ``file:///abs/dir`` (default ``file:///tmp/aec-slatedb``)
            or ``s3://bucket/prefix`` (also ``gs://``, ``az://``); see the module doc
            for the environment variables cloud stores read.
        path: the database's path inside the store (``partition-<p>`` is appended
            by the spec).
        block_cache_bytes: SlateDB's in-memory block cache (a Moka cache of this many
            bytes); 0 disables it, None keeps SlateDB's default.
        settings: SlateDB settings overrides, ``{dotted key: JSON-able value}``, e.g.
            ``{"flush_interval": "10ms", "l0_sst_size_bytes": 16 << 20}``
            (``slatedb.uniffi.Settings.default().to_json_string()`` lists them).
        object_store_options: config entries for a cloud object store builder
            (``{"endpoint": "http://127.0.0.1:9000", "allow_http": "true"}``).
        fresh: on ``open``, delete every state entry already in the database (the
            spec builds fresh backends: a Spark task starts from empty state).
            Checkpoints, and so snapshots, survive.
        timeout: seconds any one SlateDB operation (a batch, a flush, a snapshot)
            may take before it fails with TimeoutError; None waits forever.
        retained: keep at most this many snapshots' SlateDB checkpoints in the
            database (the newest; older ones are released at each ``snapshot``, so
            their SSTs can be garbage-collected); None keeps all. A pruned snapshot
            can no longer be restored: use at least the number of checkpoints the
            caller keeps (``process_keyed_stream`` keeps the newest two).

    Blocking: batches run on the engine's I/O threads, several at once; each waits
    for its turn on the backend's event loop. ``snapshot``/``restore``/``close``
    must not overlap ``execute_batch``.

    Raises:
        RuntimeError: ``execute_batch`` before ``open`` or after ``close``.
        ValueError: a bad URL or setting (a plain-HTTP S3 endpoint without
            ``AWS_ALLOW_HTTP``); ``open`` on a database aec did not write.
        ConnectionError: ``open`` cannot connect to the S3 endpoint set for the URL.
        TimeoutError: a SlateDB operation took over ``timeout`` seconds.
        slatedb.uniffi.Error: whatever SlateDB raises (the engine fails the job).
    """

    blocking = True
    ttl_sweep_chunk = 4096  # a sweep's scan and write are loop round trips, and it waits for batches

    def __init__(
        self,
        url: str = "file:///tmp/aec-slatedb",
        path: str = "aec",
        *,
        block_cache_bytes: int | None = DEFAULT_BLOCK_CACHE_BYTES,
        settings: Mapping[str, Any] | None = None,
        object_store_options: Mapping[str, str] | None = None,
        fresh: bool = False,
        timeout: float | None = 300.0,
        retained: int | None = None,
    ) -> None:
        parse_url(url)
        if retained is not None and (not isinstance(retained, int) or retained < 1):
            raise ValueError(f"retained must be an int >= 1 or None, got {retained!r}")
        if block_cache_bytes is not None and (
            not isinstance(block_cache_bytes, int) or block_cache_bytes < 0
        ):
            raise ValueError(
                f"block_cache_bytes must be an int >= 0 or None, got {block_cache_bytes!r}"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        self.url = url
        self.path = path
        self.block_cache_bytes = block_cache_bytes
        self.settings = dict(settings or {})
        self.object_store_options = dict(object_store_options or {})
        self.fresh = fresh
        self.timeout = timeout
        self.retained = retained
        make_settings(self.settings)  # validate now, not on an executor
        self._lock = threading.Lock()  # lifecycle
        self._loop: LoopThread | None = None
        self._store: Any = None
        self._db_path = ""
        self._db: Any = None
        self._admin: Any = None
        self._closed = False
        self._state_prefixes: dict[str, bytes] = {}
        self._wipe_pending = False  # ``fresh``: the wipe waits for the first use
        self._wipe_lock = threading.Lock()
        self._gate = SweepGate()  # TTL sweeps never overlap a batch
        self._codecs: dict[str, Serializer] = {}  # state -> how its values are stored

    def __repr__(self) -> str:
        return f"SlateDBBackend({self.url!r}, {self.path!r})"

    @property
    def db_path(self) -> str:
        """The database's path inside the object store."""
        return join_path(parse_url(self.url)[2], self.path)

    # lifecycle

    def open(self) -> None:
        """Open (or create) the database; a second call does nothing."""
        with self._lock:
            self._check_not_closed()
            if self._db is not None:
                return
            self._store, prefix = object_store(self.url, self.object_store_options)
            probe_endpoint(self.url, self.object_store_options, store_timeouts().connect)
            self._db_path = join_path(prefix, self.path)
            self._start_loop()
            try:
                self._db = self._call(self._open_db())
                self._admin = sdb.AdminBuilder(self._db_path, self._store).build()
                self._wipe_pending = self.fresh
            except BaseException:
                if self._db is not None:
                    self._close_db()
                self._stop_loop()
                raise

    def close(self) -> None:
        """Flush durably, close the database and stop the loop thread. Idempotent;
        raises if the final flush failed (after releasing everything)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._db is not None:
                    try:
                        self._ready_db()  # a fresh database closes empty
                    finally:
                        self._close_db()
            finally:
                self._stop_loop()

    def flush(self) -> None:
        """Make every write so far durable on the object store (a WAL flush).

        Raises whatever SlateDB raised: an acknowledged write may then be lost, so
        the caller (the engine at drain and snapshot) must fail the job."""
        db = self._ready_db()
        self._call(db.flush_with_options(WAL))

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _live_db(self) -> Any:
        db = self._db
        if db is None:
            self._check_not_closed()
            raise RuntimeError(f"{self!r} is not open: call open() first")
        return db

    def _ready_db(self) -> Any:
        """The live database, once the wipe a ``fresh`` open deferred has run.

        Deferred so that ``restore`` right after a fresh ``open`` (a restarted task)
        need not delete the state it is about to restore."""
        db = self._live_db()
        if self._wipe_pending:
            with self._wipe_lock:
                if self._wipe_pending:
                    self._call(wipe_states(db))
                    self._wipe_pending = False
        return db

    def _start_loop(self) -> None:
        self._loop = LoopThread(repr(self), self.timeout)

    def _stop_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()

    def _call(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the backend's loop and wait for its result."""
        loop = self._loop
        if loop is None:
            coroutine.close()
            self._check_not_closed()
            raise RuntimeError(f"{self!r} is not open: call open() first")
        return loop.call(coroutine)

    async def _open_db(self) -> Any:
        builder = sdb.DbBuilder(self._db_path, self._store)
        builder.with_settings(make_settings(self.settings))
        if self.block_cache_bytes == 0:
            builder.with_db_cache_disabled()
        elif self.block_cache_bytes is not None:
            options = sdb.MokaCacheOptions(
                max_capacity=self.block_cache_bytes, time_to_live=None, time_to_idle=None
            )
            cache_id = zlib.crc32(self._db_path.encode())  # stable across reopens
            builder.with_db_cache(sdb.DbCache.new_moka_cache(options), cache_id)
        db = await builder.build()
        try:
            marker = await db.get(FORMAT_KEY)
            if marker is None:
                if await scan(db, b"", limit=1):
                    raise ValueError(
                        f"{self.url} {self._db_path!r} holds a SlateDB database that aec did not write"
                    )
                batch = sdb.WriteBatch()
                batch.put(FORMAT_KEY, FORMAT)
                await db.write(batch)
            elif marker != FORMAT:
                raise ValueError(
                    f"{self._db_path!r} holds aec SlateDB format {marker!r}, not {FORMAT!r}"
                )
            await db.flush_with_options(WAL)
        except BaseException:
            await db.shutdown()
            raise
        return db

    def _close_db(self) -> None:
        db, self._db, self._admin = self._db, None, None
        self._call(_shutdown(db))

    # batches

    def _state_prefix(self, state: str) -> bytes:
        prefix = self._state_prefixes.get(state)
        if prefix is None:
            prefix = self._state_prefixes[state] = state_prefix(state)
        return prefix

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        db = self._ready_db()
        self._gate.run_batch(
            self._ttl_cleanup, requests, self._sweep_step,
            lambda batch: self._call(execute(db, batch, self._state_prefix, self._codec)),
        )  # fmt: skip

    def _codec(self, state: str) -> Serializer:
        """How ``state``'s values are stored: its serializer, or ``TtlPairs`` over it for
        a TTL state's pairs (``backends.ttl_codec``); remembered per state."""
        codec = self._codecs.get(state)
        if codec is None:
            codec = stored_codec(self.serializers.of(state), self.ttl_cleanup.kind(state))
            self._codecs[state] = codec
        return codec

    def register_state(self, name: str, serializer: Serializer) -> None:
        super().register_state(name, serializer)
        self._codecs.pop(name, None)

    def register_ttl(self, name: str, ttl: float, kind: str) -> None:
        super().register_ttl(name, ttl, kind)
        self._codecs.pop(name, None)

    def _sweep_step(self, state: TtlState, cursor: Any, limit: int, now: float) -> tuple[int, Any]:
        """``TtlCleanup.sweep``'s step: scan ``state`` past the key ``cursor`` (None:
        from its start), up to ``limit`` rows, and remove (or rewrite, a list) what
        expired, in one ``WriteBatch``. A map entry is a row of its own."""
        db = self._ready_db()
        rows = self._call(scan(db, self._state_prefix(state.name), cursor, limit))
        codec, kind, bound = self._codec(state.name), state.kind, head(now)
        batch, changed = sdb.WriteBatch(), False
        for db_key, raw in rows:
            left = swept_row(codec, kind, raw, now, bound)
            if left is None:
                batch.delete(db_key)
            elif left is not UNCHANGED:
                batch.put(db_key, left)
            else:
                continue
            changed = True
        if changed:
            self._call(_write(db, batch))
        return len(rows), (rows[-1][0] if len(rows) == limit else None)

    def stored_entries(self, state: str) -> int:
        """Rows of ``state`` (a map entry is one), expired ones not removed yet included."""
        return len(self._call(scan(self._ready_db(), self._state_prefix(state))))

    # snapshots

    def snapshot(self, directory: str) -> None:
        """Flush, checkpoint, and name the checkpoint in ``directory/slatedb-snapshot.json``.

        A snapshot lives in the source database (as a SlateDB checkpoint) for as
        long as that database and its checkpoint exist."""
        with self._lock:
            db = self._ready_db()
            os.makedirs(directory, exist_ok=True)
            try:
                previous = read_manifest(directory)
            except (OSError, ValueError):
                previous = None
            name = f"{NAME}{uuid.uuid4().hex}"
            checkpoint = self._call(create_checkpoint(db, self._admin, name))
            manifest = {
                "url": self.url,
                "db_path": self._db_path,
                "checkpoint": checkpoint.id,
                "manifest_id": checkpoint.manifest_id,
                "sequence": db.status().durable_seq,  # what restore's fast path compares
                "name": name,
            }
            write_manifest(directory, manifest)
            replaced = None
            if previous is not None and (previous["url"], previous["db_path"]) == (
                self.url,
                self._db_path,
            ):
                replaced = previous["checkpoint"]
            self._call(release_checkpoints(self._admin, checkpoint.id, replaced, self.retained))

    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        """Make the live state equal the union of the snapshots in ``directory`` (one
        or several), keeping only keys of ``key_groups`` (None: all); opens if needed.

        Each snapshot's checkpoint is read by range scans of its key-group range (one
        per state; keys carry their key group, so ``max_parallelism`` is only checked),
        and only the differences are written to the live database. A key in several
        snapshots keeps the value of the last one listed.

        Raises FileNotFoundError when a snapshot manifest is missing and ValueError
        when one is invalid, its checkpoint cannot be read, or ``key_groups`` is out
        of range; the live state is untouched in all these cases."""
        key_groups = checked_key_groups(key_groups, max_parallelism)
        manifests = [read_manifest(d) for d in snapshot_directories(directory)]
        self.open()
        with self._lock:
            db = self._live_db()
            sources = [
                (
                    self._store
                    if manifest["url"] == self.url
                    else object_store(manifest["url"], self.object_store_options)[0],
                    manifest,
                )
                for manifest in manifests
            ]
            if self._at_checkpoint(db, manifests, key_groups):
                self._wipe_pending = False
                return
            self._call(restore_union(db, sources, key_groups))
            self._wipe_pending = False
            self.ttl_cleanup.restart()

    def _at_checkpoint(
        self, db: Any, manifests: list[dict[str, Any]], key_groups: KeyGroupRange | None
    ) -> bool:
        """Whether the live database is the one snapshot's own database, unchanged since
        (a task restarting on its partition's path): then restore has nothing to do."""
        if len(manifests) != 1:
            return False
        manifest = manifests[0]
        if manifest["url"] != self.url or manifest["db_path"] != self._db_path:
            return False
        return self._call(unchanged_since(db, self._admin, manifest, key_groups))

    # introspection

    def spec(self) -> BackendSpec:
        return SlateDBSpec(
            self.url,
            self.path,
            block_cache_bytes=self.block_cache_bytes,
            settings=self.settings,
            object_store_options=self.object_store_options,
            timeout=self.timeout,
            retained=self.retained,
        )

    def state_items(self, state: str) -> dict[Any, Any]:
        """``{key: value | list | dict}``; keys and user keys in canonical form."""
        prefix = self._state_prefix(state)
        rows = self._call(scan(self._ready_db(), prefix))
        items: dict[Any, Any] = {}
        skip = len(prefix)
        loads = self._codec(state).loads
        for db_key, raw in rows:
            key, user_key = split_db_key(db_key[skip:])
            if user_key:
                items.setdefault(key, {})[decode_key(user_key)] = loads(raw)
            else:
                items[key] = loads(raw)
        return self.ttl_cleanup.visible(state, items)


async def _write(db: Any, batch: Any) -> None:
    await db.write(batch)


async def _shutdown(db: Any) -> None:
    try:
        await db.flush_with_options(WAL)
    finally:
        await db.shutdown()


class SlateDBSpec(BackendSpec):
    """Builds ``SlateDBBackend(url, f"{path}/partition-{partition}", fresh=True, ...)``.

    Each partition gets its own database under ``path`` and starts empty: durable
    state comes back through ``restore``. Settings and options must be picklable
    (they are plain dicts).
    """

    def __init__(
        self,
        url: str,
        path: str,
        *,
        block_cache_bytes: int | None = DEFAULT_BLOCK_CACHE_BYTES,
        settings: Mapping[str, Any] | None = None,
        object_store_options: Mapping[str, str] | None = None,
        timeout: float | None = 300.0,
        retained: int | None = None,
    ) -> None:
        self.url = url
        self.path = path
        self.block_cache_bytes = block_cache_bytes
        self.settings = dict(settings or {})
        self.object_store_options = dict(object_store_options or {})
        self.timeout = timeout
        self.retained = retained

    def path_for(self, partition: int) -> str:
        if partition < 0:
            raise ValueError(f"partition must be >= 0, got {partition}")
        return join_path(self.path, f"partition-{partition}")

    def build(self, partition: int) -> StateBackend:
        return SlateDBBackend(
            self.url,
            self.path_for(partition),
            block_cache_bytes=self.block_cache_bytes,
            settings=self.settings,
            object_store_options=self.object_store_options,
            fresh=True,
            timeout=self.timeout,
            retained=self.retained,
        )
