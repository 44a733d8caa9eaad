"""SlateDBBackend: keyed state in SlateDB, an LSM tree on object storage.

SlateDB (PyPI ``slatedb``, API in ``slatedb.uniffi``) keeps its write-ahead log,
SSTs and manifest on an object store; this backend is the Python analogue of
Flink's ForSt on DFS. One ``Db`` per backend (one per partition in Spark).

Layout: one keyspace of byte-ordered keys. A state key is
``b"s" | len(state name) (2 bytes, big-endian) | state name (UTF-8) |``
``backends.keycodec.key_prefix(key group, key)``, followed by the encoded user key
for map entries, so one key's map is one prefix range and one state is one prefix
range. Value and list state are one entry per key (a list is one pickled list);
map state is one entry per ``(key, user key)``; values are pickled. ``MAP_ITER``
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

Durability: ``flush()`` (called by the engine at drain) flushes the WAL to the
object store and raises if that fails, so every write acknowledged before it
survives a crash; SlateDB also flushes its WAL on its own every
``flush_interval`` (100 ms by default). ``close()`` flushes before closing.

Snapshots: ``snapshot(dir)`` flushes the memtable to L0 SSTs, creates a SlateDB
checkpoint (a pinned manifest, no data copy) and writes
``dir/slatedb-snapshot.json`` naming it (atomically). ``restore(dir)`` opens a
``DbReader`` pinned to that checkpoint and rewrites the live database to equal it
(a merge of the two sorted key streams: puts for changed keys, deletes for keys
the snapshot lacks), so the live path never changes. Checkpoints never expire;
snapshotting again into the same directory deletes the checkpoint it replaces.

Object stores, by URL:

* ``file:///abs/dir``: a local directory (created if missing); the database is at
  ``dir/<path>``.
* ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``: the
  database is at ``prefix/<path>`` in the bucket. Configuration comes from the
  environment as the Rust ``object_store`` crate reads it (S3:
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT`` for S3-compatible
  servers such as MinIO, ``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint; GCS:
  ``GOOGLE_SERVICE_ACCOUNT``...; Azure: ``AZURE_STORAGE_ACCOUNT_NAME``,
  ``AZURE_STORAGE_ACCOUNT_KEY``...) plus ``object_store_options`` (the crate's
  config keys: ``endpoint``, ``region``, ``access_key_id``, ``allow_http``...).
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any
from urllib.parse import urlsplit

from slatedb import uniffi as sdb

from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import Op, StateRequest
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

_FORMAT_KEY = b"\x00aec/format"
_FORMAT = b"aec-slatedb-1"
_STATES = b"s"  # every state key starts with this byte
_NAME_LEN = struct.Struct(">H")
_SNAPSHOT_FILE = "slatedb-snapshot.json"
_SNAPSHOT_FORMAT = "aec-slatedb-snapshot-1"
_SCAN_BATCH = 1024  # rows per DbIterator.next_batch call (one FFI crossing each)
_REWRITE_BATCH = 1000  # operations per WriteBatch when restoring or clearing
_CLOUD = {"s3": "S3", "gs": "GCS", "az": "AZURE"}
_MAP_WRITES = frozenset({Op.MAP_PUT, Op.MAP_PUT_ALL, Op.MAP_REMOVE, Op.MAP_CLEAR})
_MAP_SCANS = frozenset({Op.MAP_ITER, Op.MAP_CLEAR, Op.MAP_IS_EMPTY, Op.MAP_ITER_CHUNK})
_WAL = sdb.FlushOptions(flush_type=sdb.FlushType.WAL)
_MEMTABLE = sdb.FlushOptions(flush_type=sdb.FlushType.MEM_TABLE)
DEFAULT_BLOCK_CACHE_BYTES = 64 << 20


# --- object stores and keys -----------------------------------------------------------


def _parse_url(url: str) -> tuple[str, str, str]:
    """``(scheme, root, prefix)``: root is the local directory or the bucket."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"a file URL needs an absolute path (file:///dir), got {url!r}")
        return "file", os.path.normpath(parts.path), ""
    if parts.scheme in _CLOUD:
        if not parts.netloc:
            raise ValueError(f"{url!r} names no bucket")
        return parts.scheme, parts.netloc, parts.path.strip("/")
    raise ValueError(f"unsupported object store URL {url!r}: use file:///dir or s3://bucket/prefix")


def _object_store(url: str, options: Mapping[str, str]) -> tuple[Any, str]:
    """A SlateDB ``ObjectStore`` for ``url`` and the path prefix inside it."""
    scheme, root, prefix = _parse_url(url)
    if scheme == "file":
        if options:
            raise ValueError("object_store_options apply to cloud object stores only")
        os.makedirs(root, exist_ok=True)  # the local store must have an existing root
        builder = sdb.ObjectStoreBuilder(sdb.ObjectStoreType.LOCAL)
        builder.with_config("local_path", root)
    else:
        builder = sdb.ObjectStoreBuilder.from_env(getattr(sdb.ObjectStoreType, _CLOUD[scheme]))
        builder.with_url(f"{scheme}://{root}")
        for key, value in options.items():
            builder.with_config(key, str(value))
    return builder.build(), prefix


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def state_prefix(state: str) -> bytes:
    """The prefix of every key of state ``state``."""
    name = state.encode("utf-8", "surrogatepass")
    if len(name) > 0xFFFF:
        raise ValueError(f"state name too long ({len(name)} bytes, at most 65535)")
    return _STATES + _NAME_LEN.pack(len(name)) + name


def _range(prefix: bytes, after: bytes | None = None) -> Any:
    """The keys under ``prefix`` (all keys for b""), past ``after`` when given."""
    return sdb.KeyRange(
        start=(prefix or None) if after is None else after,
        start_inclusive=after is None,
        end=prefix_end(prefix),
        end_inclusive=False,
    )


async def _scan(db: Any, prefix: bytes, after: bytes | None = None, limit: int | None = None):
    """``[(key, raw value)]`` under ``prefix`` past ``after``, at most ``limit`` rows."""
    iterator = await db.scan(_range(prefix, after))
    rows: list[tuple[bytes, bytes]] = []
    while limit is None or len(rows) < limit:
        want = _SCAN_BATCH if limit is None else min(_SCAN_BATCH, limit - len(rows))
        chunk = await iterator.next_batch(want)
        rows.extend((kv.key, kv.value) for kv in chunk)
        if len(chunk) < want:
            break
    return rows


async def _stream(db: Any, prefix: bytes):
    """Every ``(key, raw value)`` under ``prefix``, in key order, read in chunks."""
    iterator = await db.scan(_range(prefix))
    while True:
        chunk = await iterator.next_batch(_SCAN_BATCH)
        for kv in chunk:
            yield kv.key, kv.value
        if len(chunk) < _SCAN_BATCH:
            return


class _Writer:
    """Puts and deletes sent in ``WriteBatch``es of bounded size (no durability wait)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._batch = sdb.WriteBatch()
        self._size = 0

    async def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)
        await self._count()

    async def delete(self, key: bytes) -> None:
        self._batch.delete(key)
        await self._count()

    async def _count(self) -> None:
        self._size += 1
        if self._size >= _REWRITE_BATCH:
            await self.done()

    async def done(self) -> None:
        if self._size:
            batch, self._batch, self._size = self._batch, sdb.WriteBatch(), 0
            await self._db.write(batch)


# --- one batch ---------------------------------------------------------------------------


class _BatchView(BatchView):
    """The state as one batch sees it: what the batch prefetched plus its own writes.

    A ``backends.overlay.BatchView`` (the ``table`` argument is unused: the state is
    part of every key), so the shared op functions run on it.
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
        self._dirty_maps: dict[bytes, set[bytes]] = {}  # map prefix -> DB keys written

    def get(self, table: Any, db_key: bytes) -> Any:
        return self._known[db_key]  # every point read was prefetched

    def set(self, table: Any, db_key: bytes, value: Any, map_prefix: bytes | None = None) -> None:
        self._known[db_key] = self._dirty[db_key] = value
        if map_prefix is not None:
            self._dirty_maps.setdefault(map_prefix, set()).add(db_key)

    def map_entries(self, table: Any, prefix: bytes) -> list[tuple[bytes, Any]]:
        dirty = {k: self._dirty[k] for k in self._dirty_maps.get(prefix, ())}
        return merge_map_overlay(self._full[prefix], dirty)

    def map_chunk(
        self, table: Any, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, Any]], bytes | None]:
        if prefix in self._full:
            entries = [e for e in self.map_entries(table, prefix) if after is None or e[0] > after]
        else:  # planned as a range: the batch had not written this map before
            rows = self._ranges[prefix, after]
            entries = [(db_key, pickle.loads(raw)) for db_key, raw in rows[: limit + 1]]
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
                batch.put(db_key, dumps(value))
        return batch


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

    Blocking: batches run on the engine's I/O threads, several at once; each waits
    for its turn on the backend's event loop. ``snapshot``/``restore``/``close``
    must not overlap ``execute_batch``.

    Raises:
        RuntimeError: ``execute_batch`` before ``open`` or after ``close``.
        ValueError: a bad URL or setting; ``open`` on a database aec did not write.
        slatedb.uniffi.Error: whatever SlateDB raises (the engine fails the job).
    """

    blocking = True

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
    ) -> None:
        _parse_url(url)
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
        self._make_settings()  # validate now, not on an executor
        self._lock = threading.Lock()  # lifecycle
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._db_path = ""
        self._db: Any = None
        self._admin: Any = None
        self._closed = False
        self._state_prefixes: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return f"SlateDBBackend({self.url!r}, {self.path!r})"

    @property
    def db_path(self) -> str:
        """The database's path inside the object store."""
        return _join(_parse_url(self.url)[2], self.path)

    # lifecycle

    def open(self) -> None:
        """Open (or create) the database; a second call does nothing."""
        with self._lock:
            self._check_not_closed()
            if self._db is not None:
                return
            self._store, prefix = _object_store(self.url, self.object_store_options)
            self._db_path = _join(prefix, self.path)
            self._start_loop()
            try:
                self._db = self._call(self._open_db())
                self._admin = sdb.AdminBuilder(self._db_path, self._store).build()
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
                    self._close_db()
            finally:
                self._stop_loop()

    def flush(self) -> None:
        """Make every write so far durable on the object store (a WAL flush).

        Raises whatever SlateDB raised: an acknowledged write may then be lost, so
        the caller (the engine at drain and snapshot) must fail the job."""
        db = self._live_db()
        self._call(db.flush_with_options(_WAL))

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _live_db(self) -> Any:
        db = self._db
        if db is None:
            self._check_not_closed()
            raise RuntimeError(f"{self!r} is not open: call open() first")
        return db

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=_run_loop, args=(loop,), name="aec-slatedb-loop", daemon=True
        )
        thread.start()
        self._loop, self._thread = loop, thread

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _call(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the backend's loop and wait for its result."""
        loop = self._loop
        if loop is None:
            coroutine.close()
            self._check_not_closed()
            raise RuntimeError(f"{self!r} is not open: call open() first")
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(self.timeout)
        except TimeoutError:
            if future.done():  # the operation itself raised TimeoutError
                raise
            future.cancel()
            raise TimeoutError(
                f"{self!r}: a SlateDB operation took over {self.timeout} s"
            ) from None

    def _make_settings(self) -> Any:
        settings = sdb.Settings.default()
        for key, value in self.settings.items():
            try:
                settings.set(key, json.dumps(value))
            except sdb.Error as exc:
                raise ValueError(f"bad SlateDB setting {key}={value!r}: {exc}") from exc
        return settings

    async def _open_db(self) -> Any:
        builder = sdb.DbBuilder(self._db_path, self._store)
        builder.with_settings(self._make_settings())
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
            marker = await db.get(_FORMAT_KEY)
            if marker is None:
                if await _scan(db, b"", limit=1):
                    raise ValueError(
                        f"{self.url} {self._db_path!r} holds a SlateDB database that aec did not write"
                    )
                batch = sdb.WriteBatch()
                batch.put(_FORMAT_KEY, _FORMAT)
                await db.write(batch)
            elif marker != _FORMAT:
                raise ValueError(
                    f"{self._db_path!r} holds aec SlateDB format {marker!r}, not {_FORMAT!r}"
                )
            if self.fresh:
                writer = _Writer(db)
                async for key, _ in _stream(db, _STATES):
                    await writer.delete(key)
                await writer.done()
            await db.flush_with_options(_WAL)
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
        self._call(self._execute(self._live_db(), requests))

    async def _execute(self, db: Any, requests: Sequence[StateRequest]) -> None:
        # Plan: the DB key of each request, what to read (deduplicated), in list order.
        plan = []
        points: dict[bytes, None] = {}
        full: dict[bytes, None] = {}  # map prefixes read whole
        ranges: dict[tuple[bytes, bytes | None], int] = {}  # (prefix, after) -> rows to read
        written: set[bytes] = set()  # maps written so far in the batch
        key_prefixes: dict[Any, bytes] = {}
        for request in requests:
            key_bytes = key_prefixes.get(request.key)
            if key_bytes is None:
                key_bytes = key_prefixes[request.key] = key_prefix(request.key_group, request.key)
            db_key = self._state_prefix(request.state) + key_bytes
            op = request.op
            if op in POINT_READS:
                if op in USER_KEY_OPS:  # MAP_GET, MAP_CONTAINS read one map entry
                    db_key += encode_key(request.user_key)
                points[db_key] = None
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
            plan.append((op, db_key, request))
        # Read: every point get and range scan of the batch at once.
        point_keys = list(points)
        full_keys = list(full)
        range_keys = [slot for slot in ranges if slot[0] not in full]
        results = await asyncio.gather(
            *[db.get(key) for key in point_keys],
            *[_scan(db, prefix) for prefix in full_keys],
            *[_scan(db, prefix, after, ranges[prefix, after]) for prefix, after in range_keys],
        )
        offset = len(point_keys)
        known = {
            key: ABSENT if raw is None else pickle.loads(raw)
            for key, raw in zip(point_keys, results[:offset], strict=True)
        }
        view = _BatchView(
            known,
            dict(zip(full_keys, results[offset : offset + len(full_keys)], strict=True)),
            dict(zip(range_keys, results[offset + len(full_keys) :], strict=True)),
        )
        # Apply in list order over the overlay, then write once, not waiting for durability.
        for op, db_key, request in plan:
            APPLY_OPS[op](view, None, db_key, request)
        batch = view.write_batch()
        if batch is not None:
            await db.write(batch)

    # snapshots

    def snapshot(self, directory: str) -> None:
        """Flush, checkpoint, and name the checkpoint in ``directory/slatedb-snapshot.json``.

        A snapshot lives in the source database (as a SlateDB checkpoint) for as
        long as that database and its checkpoint exist."""
        with self._lock:
            db = self._live_db()
            os.makedirs(directory, exist_ok=True)
            target = os.path.join(directory, _SNAPSHOT_FILE)
            try:
                previous = _read_manifest(directory)
            except (OSError, ValueError):
                previous = None
            name = f"aec-snapshot-{uuid.uuid4().hex}"
            checkpoint = self._call(_checkpoint(db, self._admin, name))
            manifest = {
                "format": _SNAPSHOT_FORMAT,
                "url": self.url,
                "db_path": self._db_path,
                "checkpoint": checkpoint.id,
                "manifest_id": checkpoint.manifest_id,
                "name": name,
                "created": time.time(),
            }
            staging = f"{target}.tmp-{uuid.uuid4().hex}"
            with open(staging, "w", encoding="utf-8") as out:
                json.dump(manifest, out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staging, target)
            if (
                previous is not None
                and previous["url"] == self.url
                and previous["db_path"] == self._db_path
                and previous["checkpoint"] != checkpoint.id
            ):
                try:  # the replaced snapshot's checkpoint would pin its SSTs forever
                    self._call(self._admin.delete_checkpoint(previous["checkpoint"]))
                except sdb.Error:
                    pass  # already gone

    def restore(self, directory: str) -> None:
        """Make the live state equal the snapshot in ``directory``; opens if needed.

        Raises FileNotFoundError when there is no snapshot manifest and ValueError
        when it is invalid or its checkpoint cannot be read; the live state is
        untouched in both cases."""
        manifest = _read_manifest(directory)
        self.open()
        with self._lock:
            db = self._live_db()
            if manifest["url"] == self.url:
                store = self._store
            else:
                store, _ = _object_store(manifest["url"], self.object_store_options)
            self._call(_restore(db, store, manifest))

    # introspection

    def spec(self) -> BackendSpec:
        return SlateDBSpec(
            self.url,
            self.path,
            block_cache_bytes=self.block_cache_bytes,
            settings=self.settings,
            object_store_options=self.object_store_options,
            timeout=self.timeout,
        )

    def state_items(self, state: str) -> dict[Any, Any]:
        """``{key: value | list | dict}``; keys and user keys in canonical form."""
        prefix = self._state_prefix(state)
        rows = self._call(_scan(self._live_db(), prefix))
        items: dict[Any, Any] = {}
        skip = len(prefix)
        for db_key, raw in rows:
            key, user_key = split_db_key(db_key[skip:])
            if user_key:
                items.setdefault(key, {})[decode_key(user_key)] = pickle.loads(raw)
            else:
                items[key] = pickle.loads(raw)
        return items


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())


async def _shutdown(db: Any) -> None:
    try:
        await db.flush_with_options(_WAL)
    finally:
        await db.shutdown()


async def _checkpoint(db: Any, admin: Any, name: str) -> Any:
    # A checkpoint pins a manifest, which names SSTs only: writes still in the WAL
    # would be missing, so flush the memtable into L0 first.
    await db.flush_with_options(_WAL)
    await db.flush_with_options(_MEMTABLE)
    options = sdb.CheckpointOptions(lifetime_ms=None, source=None, name=name)
    return await admin.create_detached_checkpoint(options)


async def _restore(db: Any, store: Any, manifest: dict[str, Any]) -> None:
    builder = sdb.DbReaderBuilder(manifest["db_path"], store)
    builder.with_reader_mode(sdb.ReaderMode.CHECKPOINT(manifest["checkpoint"]))
    builder.with_db_cache_disabled()
    try:
        reader = await builder.build()
    except sdb.Error as exc:
        raise ValueError(
            f"cannot open checkpoint {manifest['checkpoint']} of {manifest['url']} "
            f"{manifest['db_path']!r}: {exc}"
        ) from exc
    try:
        if await reader.get(_FORMAT_KEY) != _FORMAT:
            raise ValueError(f"checkpoint {manifest['checkpoint']} is not an aec SlateDB database")
        # Merge the sorted live and snapshot streams; write only the differences.
        writer = _Writer(db)
        live, wanted = _stream(db, _STATES), _stream(reader, _STATES)
        have = await anext(live, None)
        want = await anext(wanted, None)
        while have is not None or want is not None:
            if want is None or (have is not None and have[0] < want[0]):
                await writer.delete(have[0])
                have = await anext(live, None)
            elif have is None or want[0] < have[0]:
                await writer.put(*want)
                want = await anext(wanted, None)
            else:
                if have[1] != want[1]:
                    await writer.put(*want)
                have = await anext(live, None)
                want = await anext(wanted, None)
        await writer.done()
        await db.flush_with_options(_WAL)
    finally:
        await reader.shutdown()


def _read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, _SNAPSHOT_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no SlateDB snapshot at {path}")
    try:
        with open(path, encoding="utf-8") as source:
            manifest = json.load(source)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a SlateDB snapshot manifest: {exc}") from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != _SNAPSHOT_FORMAT
        or not all(isinstance(manifest.get(k), str) for k in ("url", "db_path", "checkpoint"))
    ):
        raise ValueError(f"{path} is not an aec SlateDB snapshot manifest")
    return manifest


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
    ) -> None:
        self.url = url
        self.path = path
        self.block_cache_bytes = block_cache_bytes
        self.settings = dict(settings or {})
        self.object_store_options = dict(object_store_options or {})
        self.timeout = timeout

    def path_for(self, partition: int) -> str:
        if partition < 0:
            raise ValueError(f"partition must be >= 0, got {partition}")
        return _join(self.path, f"partition-{partition}")

    def build(self, partition: int) -> StateBackend:
        return SlateDBBackend(
            self.url,
            self.path_for(partition),
            block_cache_bytes=self.block_cache_bytes,
            settings=self.settings,
            object_store_options=self.object_store_options,
            fresh=True,
            timeout=self.timeout,
        )
