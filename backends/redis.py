"""RedisBackend: keyed state in a real Redis server, one pipeline per batch.

Key layout (one Redis serves many operators and partitions)::

    {prefix}:{partition}:{len(state)}:{state}:{key group}:{encoded key}

``prefix`` is restricted to ``[A-Za-z0-9_.-]`` and the state name is
length-prefixed, so no two (prefix, partition, state) triples share a key space
and ``SCAN MATCH {prefix}:{partition}:*`` finds exactly one partition's keys.
Keys (and map user keys) are encoded with ``backends.keycodec.encode_key``:
canonical (``1``, ``1.0`` and ``True`` are one key, as in a dict) and decodable
(``state_items`` and map iteration give them back, in canonical form). Values are
pickled (highest protocol). One Redis key per (state, key):

* value state: a string (``GET``/``SET``/``DEL``; None clears);
* list state: a list of pickled elements (``LRANGE``/``RPUSH``/``DEL``); storing
  ``[]`` deletes the key, so absent and empty are the same, as in MemoryBackend;
* map state: a hash, field = encoded user key (``HGET``/``HSET``/``HDEL``/
  ``HEXISTS``/``HLEN``/``HGETALL``/``HSCAN``); Redis drops a hash with its last
  field, so removing the last entry leaves no key.

Batches. Each ``execute_batch`` is one pipeline, one network round trip: the
requests become native commands queued in request order, so a read sees every
earlier write of its batch (the server runs a pipeline in order). By default the
pipeline is a ``MULTI``/``EXEC`` transaction (``transaction=True``): a batch is
applied all or nothing and no other client sees half of it; ``transaction=False``
sends a plain pipeline (a little less server and parsing work, no atomicity).
Within a batch:

* ``VALUE_GET`` of a key with no earlier write in the batch is hoisted into one
  ``MGET`` at the front; a value write or clear that is the last access of its key
  in the batch is sunk into one ``MSET`` / one ``DEL`` at the end (the keyed
  counter's batch is ``MGET`` + ``MSET``, whatever its size);
* identical reads of one key are folded (one command, the reply fanned out) while
  no write to that key lies between them; ``MAP_CONTAINS`` reuses a folded
  ``HGET`` of the same field.

Partial loading. ``LIST_GET_CHUNK``: cursor = offset, ``LRANGE offset
offset+limit`` (one extra element tells whether more follow), exactly
MemoryBackend's semantics. ``MAP_ITER_CHUNK``: ``HSCAN`` with ``COUNT`` = the
chunk size; Redis may return more than ``COUNT`` (a small hash comes back whole),
so the cursor is ``(Redis cursor, fields returned but not handed out yet)``: the
surplus is carried (fields only, bounded by one HSCAN reply) and re-read with
``HMGET`` by the next chunk, so values are always current and entries removed
meanwhile are skipped. Guarantees are HSCAN's: every entry present for the whole
iteration is returned; an entry added or removed meanwhile may or may not be; an
entry may be returned twice only if Redis shrinks (rehashes) the hash during the
iteration. Map order is Redis's (insertion order for small hashes); ``MAP_ITER``
(``HGETALL``) and chunked iteration agree for small (listpack) hashes only.

Snapshots. ``snapshot(dir)`` ``SCAN``s this partition's keys and ``DUMP``s them
into ``redis-state-<id>.pickle`` (keys relative to ``{prefix}:{partition}:``, so
a snapshot restores into any prefix/partition), then atomically replaces
``redis-manifest.json`` (format, key count, size, SHA-256), then deletes older
data files. ``restore(dir)`` validates manifest and checksum, ``RESTORE``s the
dumps under a staging namespace, then in one ``MULTI`` deletes the partition's
keys and renames the staged keys into place: a failure before the switch leaves
the live state untouched. DUMP payloads restore on the same or a newer Redis.
Neither may overlap ``execute_batch`` (the engine drains before snapshotting).

Failures. Sockets time out (``socket_timeout``, ``connect_timeout``) and redis-py
retries are off: a pipeline is never re-sent (a resent ``RPUSH`` would apply
twice), so a dead server makes ``execute_batch`` raise ``redis.ConnectionError``
(or ``redis.TimeoutError``) naming the server, which the engine turns into
``aec.JobFailure``. Multi-key commands (``MGET``/``MSET``/``DEL``) and
transactions assume a single Redis server, not Redis Cluster.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pickle
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import Op, StateRequest, op_table
from backends.keycodec import decode_key, encode_key

__all__ = ["DEFAULT_URL", "RedisBackend", "RedisSpec"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_FORMAT = "aec-redis-1"
_MANIFEST = "redis-manifest.json"
_DATA_PREFIX = "redis-state-"
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_GLOB_SPECIAL = re.compile(rb"([*?\[\]\\])")
_SCAN_COUNT = 1000  # keys per SCAN step and per DUMP/RESTORE pipeline

_dumps = pickle.dumps
_loads = pickle.loads
_HIGHEST = pickle.HIGHEST_PROTOCOL


class RedisBackend(StateBackend):
    """Keyed state in Redis through redis-py (see the module docstring for the layout).

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` and
            ``unix://`` work as in redis-py).
        prefix: namespace of every key, ``[A-Za-z0-9_.-]+``.
        partition: the partition number (>= 0); one Redis holds many partitions.
        transaction: send each batch as ``MULTI``/``EXEC`` (atomic) instead of a
            plain pipeline.
        max_connections: size of the (blocking, thread-safe) connection pool;
            at least ``AecConfig.executor_threads`` so every I/O thread has one.
        socket_timeout: seconds a reply (and a free pooled connection) may take.
        connect_timeout: seconds a connection attempt may take.
        fresh: on ``open``, delete this partition's keys (``spec()`` builds
            fresh backends: a Spark task attempt starts from empty state).

    Blocking: batches run on the engine's I/O threads, several at once (redis-py's
    pool is thread-safe; concurrent batches never share a key).

    Raises:
        ValueError: a bad prefix or partition.
        RuntimeError: ``execute_batch`` before ``open`` or after ``close``.
    """

    blocking = True

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str = "aec",
        partition: int = 0,
        transaction: bool = True,
        max_connections: int = 8,
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        fresh: bool = False,
    ) -> None:
        if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must match [A-Za-z0-9_.-]+, got {prefix!r}")
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ValueError(f"partition must be an int >= 0, got {partition!r}")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        for name, seconds in (
            ("socket_timeout", socket_timeout),
            ("connect_timeout", connect_timeout),
        ):
            if not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")
        self.url = url
        self.prefix = prefix
        self.partition = partition
        self.transaction = transaction
        self.max_connections = max_connections
        self.socket_timeout = float(socket_timeout)
        self.connect_timeout = float(connect_timeout)
        self.fresh = fresh
        self._base = f"{prefix}:{partition}:".encode()
        self._headers: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._pool: redis.ConnectionPool | None = None
        self._client: redis.Redis | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"RedisBackend({_redact(self.url)!r}, prefix={self.prefix!r}, "
            f"partition={self.partition})"
        )

    # lifecycle

    def open(self) -> None:
        """Connect (and PING, so a dead server fails here); a second call does nothing."""
        with self._lock:
            self._check_not_closed()
            if self._client is not None:
                return
            pool = redis.BlockingConnectionPool.from_url(
                self.url,
                max_connections=self.max_connections,
                timeout=self.socket_timeout,  # waiting for a free pooled connection
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.connect_timeout,
                retry=Retry(NoBackoff(), 0),  # never resend: pipelines are not idempotent
            )
            client = redis.Redis(connection_pool=pool)
            try:
                with self._errors("connecting"):
                    client.ping()
                    if self.fresh:
                        self._delete_keys(client, self._scan(client, self._base))
            except BaseException:
                pool.disconnect()
                raise
            self._pool, self._client = pool, client

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool, self._client = self._pool, None, None
        if pool is not None:
            pool.disconnect()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _live(self) -> redis.Redis:
        client = self._client
        if client is None:
            self._check_not_closed()
            raise RuntimeError(f"{self!r} is not open: call open() first")
        return client

    def _errors(self, doing: str) -> _ConnectionErrors:
        return _ConnectionErrors(self, doing)

    def _header(self, state: str) -> bytes:
        header = self._headers.get(state)
        if header is None:
            name = state.encode("utf-8", "surrogatepass")
            header = self._base + b"%d:" % len(name) + name + b":"
            self._headers[state] = header
        return header

    # batches

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        client = self._live()
        plan = _Plan()
        keys = plan.keys
        cache: dict[tuple[str, Any], bytes] = {}  # a record's requests share its key
        for request in requests:
            slot = (request.state, request.key)
            redis_key = cache.get(slot)
            if redis_key is None:
                redis_key = cache[slot] = (
                    self._header(request.state)
                    + b"%d:" % request.key_group
                    + encode_key(request.key)
                )
            keys.append(redis_key)
        last = {redis_key: index for index, redis_key in enumerate(keys)}
        for index, request in enumerate(requests):
            _PLAN_OPS[request.op](plan, request, keys[index], last[keys[index]] == index)
        commands = plan.finish()
        if not commands:
            return
        pipe = client.pipeline(transaction=self.transaction)
        queue = pipe.execute_command
        for command in commands:
            queue(*command)
        with self._errors("executing a batch"):
            replies = pipe.execute()
        if plan.mget_keys:
            plan.mget_reply = replies[0]
            replies = replies[1:]
        for fill, request, a, b in plan.fills:
            request.result = fill(plan, replies, a, b)
        for request in plan.rescans:
            self._skip_empty_chunks(request)

    def _skip_empty_chunks(self, request: StateRequest) -> None:
        """HSCAN may return an empty page before the end of a sparse hash; read on, so a
        chunk is empty only at the end (``StateIterator.is_empty`` looks at the first)."""
        items, cursor = request.result
        limit = request.value[1]
        while not items and cursor is not None:
            probe = StateRequest(Op.MAP_ITER_CHUNK, request.state, request.key,
                                 request.key_group, None, (cursor, limit))  # fmt: skip
            self.execute_batch([probe])
            items, cursor = probe.result
        request.result = (items, cursor)

    # snapshots

    def snapshot(self, directory: str) -> None:
        """DUMP this partition's keys into ``directory`` (see the module docstring)."""
        client = self._live()
        os.makedirs(directory, exist_ok=True)
        skip = len(self._base)
        entries: list[tuple[bytes, bytes]] = []
        with self._errors("taking a snapshot"):
            for chunk in _chunks(sorted(set(self._scan(client, self._base)))):
                pipe = client.pipeline(transaction=False)
                for key in chunk:
                    pipe.execute_command("DUMP", key)
                for key, dump in zip(chunk, pipe.execute(), strict=True):
                    if dump is not None:  # deleted since the SCAN
                        entries.append((key[skip:], dump))
            server = client.info("server").get("redis_version", "?")
        data = pickle.dumps({"format": _FORMAT, "entries": entries}, protocol=_HIGHEST)
        name = f"{_DATA_PREFIX}{uuid.uuid4().hex}.pickle"
        _write_atomically(os.path.join(directory, name), data)
        manifest = {
            "format": _FORMAT,
            "file": name,
            "keys": len(entries),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "prefix": self.prefix,
            "partition": self.partition,
            "redis_version": server,
        }
        _write_atomically(
            os.path.join(directory, _MANIFEST), json.dumps(manifest, indent=1).encode()
        )
        for old in glob.glob(os.path.join(glob.escape(directory), _DATA_PREFIX + "*")):
            if os.path.basename(old) != name:
                os.remove(old)

    def restore(self, directory: str) -> None:
        """Replace this partition's keys with a ``snapshot``; opens the backend if needed.

        Raises FileNotFoundError when ``directory`` holds no snapshot and ValueError
        when it is invalid (bad manifest, missing or corrupt data, dumps this server
        rejects); the live state is untouched in both cases.
        """
        entries = _read_snapshot(directory)
        self.open()
        client = self._live()
        staging = f"{self.prefix}:{self.partition}~restore-{uuid.uuid4().hex}:".encode()
        with self._errors("restoring a snapshot"):
            try:
                for chunk in _chunks(entries):
                    pipe = client.pipeline(transaction=False)
                    for suffix, dump in chunk:
                        pipe.execute_command("RESTORE", staging + suffix, 0, dump, "REPLACE")
                    pipe.execute()
            except redis.ResponseError as exc:
                self._delete_keys(client, self._scan(client, staging))
                raise ValueError(
                    f"the Redis snapshot in {directory} does not restore on this server: {exc}"
                ) from exc
            pipe = client.pipeline(transaction=True)  # the switch: all or nothing
            live = sorted(set(self._scan(client, self._base)))
            for chunk in _chunks(live):
                pipe.execute_command("UNLINK", *chunk)
            for suffix, _ in entries:
                pipe.execute_command("RENAME", staging + suffix, self._base + suffix)
            pipe.execute()

    def clear(self) -> None:
        """Delete every key of this backend's partition (all its states)."""
        client = self._live()
        with self._errors("clearing"):
            self._delete_keys(client, self._scan(client, self._base))

    # introspection

    def spec(self) -> BackendSpec:
        return RedisSpec(
            self.url,
            prefix=self.prefix,
            transaction=self.transaction,
            max_connections=self.max_connections,
            socket_timeout=self.socket_timeout,
            connect_timeout=self.connect_timeout,
        )

    def state_items(self, state: str) -> dict[Any, Any]:
        """``{key: value | list | dict}`` of state ``state`` in this partition."""
        client = self._live()
        header = self._header(state)
        with self._errors("listing state"):
            found = sorted(set(self._scan(client, header)))
            pipe = client.pipeline(transaction=False)
            for key in found:
                pipe.execute_command("TYPE", key)
            kinds = pipe.execute()
            for key, kind in zip(found, kinds, strict=True):
                kind = kind.decode() if isinstance(kind, bytes) else kind
                if kind == "hash":
                    pipe.execute_command("HGETALL", key)
                elif kind == "list":
                    pipe.execute_command("LRANGE", key, 0, -1)
                else:
                    pipe.execute_command("GET", key)
            replies = pipe.execute()
        items: dict[Any, Any] = {}
        for key, reply in zip(found, replies, strict=True):
            if reply is None:  # deleted meanwhile
                continue
            _, _, encoded = key[len(header) :].partition(b":")  # key group, then the key
            if isinstance(reply, dict):
                value: Any = {decode_key(f): _loads(v) for f, v in reply.items()}
            elif isinstance(reply, list):
                value = [_loads(element) for element in reply]
            else:
                value = _loads(reply)
            items[decode_key(encoded)] = value
        return items

    # helpers

    @staticmethod
    def _scan(client: redis.Redis, prefix: bytes) -> Iterator[bytes]:
        pattern = _GLOB_SPECIAL.sub(rb"\\\1", prefix) + b"*"
        return client.scan_iter(match=pattern, count=_SCAN_COUNT)

    @staticmethod
    def _delete_keys(client: redis.Redis, keys: Iterator[bytes]) -> None:
        for chunk in _chunks(sorted(set(keys))):
            client.unlink(*chunk)


class RedisSpec(BackendSpec):
    """Builds ``RedisBackend(url, prefix=prefix, partition=p, fresh=fresh, ...)``.

    Picklable (plain fields): a Spark executor builds its own backend, and its own
    connection pool, per partition. ``fresh`` (default True) clears the partition's
    keys on ``open``, so a retried task attempt starts from empty state; durable
    state comes back through ``restore``.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str = "aec",
        fresh: bool = True,
        transaction: bool = True,
        max_connections: int = 8,
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.fresh = fresh
        self.transaction = transaction
        self.max_connections = max_connections
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"RedisSpec({_redact(self.url)!r}, prefix={self.prefix!r})"

    def build(self, partition: int) -> StateBackend:
        return RedisBackend(
            self.url,
            prefix=self.prefix,
            partition=partition,
            transaction=self.transaction,
            max_connections=self.max_connections,
            socket_timeout=self.socket_timeout,
            connect_timeout=self.connect_timeout,
            fresh=self.fresh,
        )


class _ConnectionErrors:
    """Re-raises redis-py connection and timeout errors with the backend named."""

    __slots__ = ("backend", "doing")

    def __init__(self, backend: RedisBackend, doing: str) -> None:
        self.backend = backend
        self.doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            timeout = isinstance(exc, redis.TimeoutError)
            what = "timed out" if timeout else "lost its connection"
            raise (redis.TimeoutError if timeout else redis.ConnectionError)(
                f"{self.backend!r} {what} while {self.doing} "
                f"(connection to {_redact(self.backend.url)}): {exc}"
            ) from exc
        return False


# --- the batch plan ------------------------------------------------------------------

Fill = Callable[["_Plan", list, Any, Any], Any]


class _Plan:
    """Commands for one batch, in request order, and how to fill each result.

    ``fills`` holds ``(fill, request, a, b)``: ``request.result = fill(plan,
    replies, a, b)`` once the pipeline returned (``a``/``b`` are reply positions or
    other per-request data).
    """

    __slots__ = ("keys", "commands", "fills", "reads", "written", "mget_keys", "mget_pos",
                 "mget_reply", "mset", "deletes", "rescans")  # fmt: skip

    def __init__(self) -> None:
        self.keys: list[bytes] = []  # the Redis key of each request
        self.commands: list[tuple] = []
        self.fills: list[tuple[Fill, StateRequest, Any, Any]] = []
        self.reads: dict[bytes, dict[tuple, int]] = {}  # foldable reads since the last write
        self.written: set[bytes] = set()
        self.mget_keys: list[bytes] = []
        self.mget_pos: dict[bytes, int] = {}
        self.mget_reply: list = []
        self.mset: dict[bytes, bytes] = {}  # sunk value writes (last access of their key)
        self.deletes: list[bytes] = []  # sunk deletes (last access of their key)
        self.rescans: list[StateRequest] = []  # map chunks that may read on if empty

    def read(self, key: bytes, command: tuple) -> int:
        """The reply position of ``command`` (a read of ``key``), folded if possible."""
        folded = self.reads.get(key)
        if folded is None:
            folded = self.reads[key] = {}
        else:
            position = folded.get(command)
            if position is not None:
                return position
        position = folded[command] = len(self.commands)
        self.commands.append(command)
        return position

    def write(self, key: bytes, command: tuple) -> None:
        self.commands.append(command)
        self.reads.pop(key, None)
        self.written.add(key)

    def delete(self, key: bytes, last: bool) -> None:
        if last:
            self.deletes.append(key)
        else:
            self.write(key, ("DEL", key))

    def finish(self) -> list[tuple]:
        commands = self.commands
        if self.mget_keys:
            commands.insert(0, ("MGET", *self.mget_keys))
        if self.mset:
            commands.append(("MSET", *[part for pair in self.mset.items() for part in pair]))
        if self.deletes:
            commands.append(("DEL", *self.deletes))
        return commands


def _loads_or_none(raw: bytes | None) -> Any:
    return None if raw is None else _loads(raw)


# fills
def _fill_mget(p: _Plan, replies: list, position: int, _: Any) -> Any:
    raw = p.mget_reply[position]
    return None if raw is None else _loads(raw)


def _fill_value(p: _Plan, replies: list, position: int, _: Any) -> Any:
    raw = replies[position]
    return None if raw is None else _loads(raw)


def _fill_none(p: _Plan, replies: list, a: Any, b: Any) -> None:
    return None


def _fill_list(p: _Plan, replies: list, position: int, _: Any) -> list:
    return [_loads(raw) for raw in replies[position]]


def _fill_not_none(p: _Plan, replies: list, position: int, _: Any) -> bool:
    return replies[position] is not None


def _fill_bool(p: _Plan, replies: list, position: int, _: Any) -> bool:
    return bool(replies[position])


def _fill_zero(p: _Plan, replies: list, position: int, _: Any) -> bool:
    return replies[position] == 0


def _fill_entries(p: _Plan, replies: list, position: int, _: Any) -> list:
    return [(decode_key(field), _loads(raw)) for field, raw in replies[position].items()]


def _fill_list_chunk(p: _Plan, replies: list, position: int, window: tuple[int, int]) -> tuple:
    offset, limit = window
    found = replies[position]
    if len(found) > limit:
        return [_loads(raw) for raw in found[:limit]], offset + limit
    return [_loads(raw) for raw in found], None


def _fill_map_chunk(p: _Plan, replies: list, positions: tuple, state: tuple) -> tuple:
    carried_at, scan_at = positions
    carried, scan_cursor, limit = state
    candidates: list[tuple[bytes, bytes]] = []
    seen: set[bytes] = set()
    if carried_at is not None:
        for field, raw in zip(carried, replies[carried_at], strict=True):
            if raw is not None and field not in seen:  # removed since: skipped
                seen.add(field)
                candidates.append((field, raw))
    if scan_at is not None:
        scan_cursor, found = replies[scan_at]
        for field, raw in found.items():
            if field not in seen:
                seen.add(field)
                candidates.append((field, raw))
    items = [(decode_key(field), _loads(raw)) for field, raw in candidates[:limit]]
    surplus = tuple(field for field, _ in candidates[limit:])
    if surplus:
        return items, (scan_cursor, surplus)
    return items, (None if scan_cursor == 0 else (scan_cursor, ()))


# ops: (plan, request, Redis key, last access of that key in the batch)
def _value_get(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if k in p.written:
        p.fills.append((_fill_value, r, p.read(k, ("GET", k)), None))
        return
    position = p.mget_pos.get(k)
    if position is None:
        position = p.mget_pos[k] = len(p.mget_keys)
        p.mget_keys.append(k)
    p.fills.append((_fill_mget, r, position, None))


def _value_put(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if r.value is None:
        p.delete(k, last)
    elif last:
        p.mset[k] = _dumps(r.value, _HIGHEST)
    else:
        p.write(k, ("SET", k, _dumps(r.value, _HIGHEST)))


def _clear(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.delete(k, last)


def _list_get(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_list, r, p.read(k, ("LRANGE", k, 0, -1)), None))


def _list_add(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.write(k, ("RPUSH", k, _dumps(r.value, _HIGHEST)))


def _list_add_all(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if r.value:
        p.write(k, ("RPUSH", k, *[_dumps(element, _HIGHEST) for element in r.value]))


def _list_put(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if not r.value:
        p.delete(k, last)
        return
    p.write(k, ("DEL", k))
    p.write(k, ("RPUSH", k, *[_dumps(element, _HIGHEST) for element in r.value]))


def _list_get_chunk(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    offset, limit = r.value
    offset = offset or 0
    position = p.read(k, ("LRANGE", k, offset, offset + limit))
    p.fills.append((_fill_list_chunk, r, position, (offset, limit)))


def _map_get(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_value, r, p.read(k, ("HGET", k, encode_key(r.user_key))), None))


def _map_put(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.write(k, ("HSET", k, encode_key(r.user_key), _dumps(r.value, _HIGHEST)))


def _map_put_all(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if not r.value:
        return
    fields = []
    for user_key, value in dict(r.value).items():
        fields.append(encode_key(user_key))
        fields.append(_dumps(value, _HIGHEST))
    p.write(k, ("HSET", k, *fields))


def _map_remove(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.write(k, ("HDEL", k, encode_key(r.user_key)))


def _map_contains(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    field = encode_key(r.user_key)
    folded = p.reads.get(k)
    position = None if folded is None else folded.get(("HGET", k, field))
    if position is not None:  # a pickled None is not nil: present iff HGET found it
        p.fills.append((_fill_not_none, r, position, None))
    else:
        p.fills.append((_fill_bool, r, p.read(k, ("HEXISTS", k, field)), None))


def _map_is_empty(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_zero, r, p.read(k, ("HLEN", k)), None))


def _map_iter(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_entries, r, p.read(k, ("HGETALL", k)), None))


def _map_iter_chunk(p: _Plan, r: StateRequest, k: bytes, last: bool) -> None:
    cursor, limit = r.value
    scan_cursor, carried = (0, ()) if cursor is None else cursor
    carried_at = p.read(k, ("HMGET", k, *carried)) if carried else None
    scan_at = None
    if len(carried) < limit and (cursor is None or scan_cursor != 0):
        count = max(limit - len(carried), 1)
        scan_at = p.read(k, ("HSCAN", k, scan_cursor, "COUNT", count))
    p.fills.append((_fill_map_chunk, r, (carried_at, scan_at), (carried, scan_cursor, limit)))
    if last and limit > 0:  # no later write of this map in the batch: may read on after it
        p.rescans.append(r)


_PLAN_OPS = op_table(globals())


# --- snapshot files -------------------------------------------------------------------


def _read_snapshot(directory: str) -> list[tuple[bytes, bytes]]:
    """The ``(key suffix, DUMP payload)`` entries of the snapshot in ``directory``."""
    path = os.path.join(directory, _MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no Redis snapshot in {directory} ({_MANIFEST} is missing)")
    try:
        with open(path, "rb") as src:
            manifest = json.loads(src.read())
        if manifest.get("format") != _FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {_FORMAT!r}")
        name = manifest["file"]
        if os.path.basename(name) != name or not name.startswith(_DATA_PREFIX):
            raise ValueError(f"bad data file name {name!r}")
        expected_sha, expected_keys = manifest["sha256"], manifest["keys"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a valid Redis snapshot manifest: {exc}") from exc
    data_path = os.path.join(directory, name)
    try:
        with open(data_path, "rb") as src:
            data = src.read()
    except FileNotFoundError as exc:
        raise ValueError(f"the Redis snapshot in {directory} lacks its data file {name}") from exc
    if hashlib.sha256(data).hexdigest() != expected_sha:
        raise ValueError(f"{data_path} does not match the checksum in {_MANIFEST}: corrupt")
    try:
        payload = pickle.loads(data)
        entries = payload["entries"]
        if payload.get("format") != _FORMAT or len(entries) != expected_keys:
            raise ValueError("format or key count differs from the manifest")
        entries = [(bytes(suffix), bytes(dump)) for suffix, dump in entries]
    except Exception as exc:
        raise ValueError(f"{data_path} is not a valid Redis snapshot: {exc}") from exc
    return entries


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _chunks(items: list) -> Iterator[list]:
    for start in range(0, len(items), _SCAN_COUNT):
        yield items[start : start + _SCAN_COUNT]


def _redact(url: str) -> str:
    """``url`` without its password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))
