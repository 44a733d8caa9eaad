"""RedisBackend: keyed state in a real Redis server, one pipeline per batch.

Key layout (one Redis serves many operators and partitions)::

    {prefix}:{partition}:{len(state)}:{state}:{key group}:{encoded key}

``prefix`` is restricted to ``[A-Za-z0-9_.-]`` and the state name is
length-prefixed, so no two (prefix, partition, state) triples share a key space
and ``SCAN MATCH {prefix}:{partition}:*`` finds exactly one partition's keys.
Keys (and map user keys) are encoded with ``backends.keycodec.encode_key``:
canonical (``1``, ``1.0`` and ``True`` are one key, as in a dict) and decodable
(``state_items`` and map iteration give them back, in canonical form). Values are
encoded by their state's serializer (``StateBackend.register_state``: msgpack
unless the state opted in to pickle), so a value planted in Redis by anyone else
decodes as data or fails the batch, and never runs code. One Redis key per
(state, key):

* value state: a string (``GET``/``SET``/``DEL``; None clears);
* list state: a list of encoded elements (``LRANGE``/``RPUSH``/``DEL``); storing
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

Fencing. ``open`` (and ``restore``) write a random token under
``{prefix}:{partition}~fence`` (outside the partition's key space); every batch's
pipeline reads it back first, in the same transaction, and so do ``snapshot``
and ``state_items``. A server that restarted empty, a flushed database, or
another backend that opened the same prefix and partition since (a newer task
attempt) changes or removes it: the batch fails with ``StateReadError`` naming the
server, instead of counting from nothing. Redis cannot make a transaction's
writes depend on a read, so the batch that finds the token gone has been applied
(to a store that is no longer this backend's); it is the last one. A server
restarted from its own persistence files with the token is not detected.

Snapshots (``backends.redis_snapshots``). ``snapshot(dir)`` ``SCAN``s this partition's keys and ``DUMP``s them
into ``redis-state-<id>.msgpack`` (keys relative to ``{prefix}:{partition}:``, so
a snapshot restores into any prefix/partition), then atomically replaces
``redis-manifest.json`` (format, key count, size, SHA-256), then deletes older
data files. ``restore(dirs, key_groups)`` validates every manifest and checksum,
keeps the dumps whose key group (in the key name) is in ``key_groups``, ``RESTORE``s
them under a staging namespace, then in one ``MULTI`` deletes the partition's
keys and renames the staged keys into place: a failure before the switch leaves
the live state untouched. DUMP payloads restore on the same or a newer Redis.
Neither may overlap ``execute_batch`` (the engine drains before snapshotting).

Failures. Sockets time out (``socket_timeout``, ``connect_timeout``) and redis-py
retries are off: a pipeline is never re-sent (a resent ``RPUSH`` would apply
twice), so a dead server makes ``execute_batch`` raise ``redis.ConnectionError``
(or ``redis.TimeoutError``) naming the server, which the engine turns into
``aec.JobFailure``. Multi-key commands (``MGET``/``MSET``/``DEL``) and
transactions assume a single Redis server, not Redis Cluster.

TTL state (``aec.state.ttl_cleanup``): the server expires keys itself. Every batch
that writes a key of a TTL state ends with ``PEXPIRE`` of that key, ``TTL_FACTOR``
TTLs on the server's clock (a restore's ``RESTORE`` sets the same; for a TTL state
made after the restore, ``register_ttl`` sets it on the keys restored), so a key that is
never written again leaves the server; the engine still leaves out what expired on
the operator's clock when it reads. A list or map is one key: its entries go with
the key, once no entry was written for that long (Redis 7.0 has no per-field expiry).
"""

from __future__ import annotations

import math
import re
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from aec.errors import StateReadError
from aec.keygroups import KeyGroupRange
from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import Op, StateRequest
from aec.state.ttl_cleanup import TtlCleanup
from aec.timeouts import store_timeouts
from backends.keycodec import decode_key, encode_key
from backends.redis_connection import ConnectionErrors, chunks, delete_keys, redact, scan_keys
from backends.redis_plan import PLAN_OPS, Plan
from backends.redis_snapshots import read_snapshot, restore_entries, union_entries, write_snapshot
from backends.snapshot_sets import checked_key_groups, snapshot_directories

__all__ = ["DEFAULT_URL", "RedisBackend", "RedisSpec"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.\-]+\Z")
# a TTL state's key expires this many TTLs after its last write (the server's clock):
# later than the engine's own expiry, so a record still in flight past it finds its
# entry there (the engine leaves the expired value out when it reads it)
TTL_FACTOR = 2


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
        socket_timeout: seconds a reply (and a free pooled connection) may take;
            None: ``aec.timeouts.store_timeouts().request`` (``AEC_STORE_REQUEST_TIMEOUT``,
            default 10), read when the backend is made.
        connect_timeout: seconds a connection attempt may take; None:
            ``store_timeouts().connect`` (``AEC_STORE_CONNECT_TIMEOUT``, default 5).
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
        socket_timeout: float | None = None,
        connect_timeout: float | None = None,
        fresh: bool = False,
    ) -> None:
        defaults = store_timeouts()
        socket_timeout = defaults.request if socket_timeout is None else socket_timeout
        connect_timeout = defaults.connect if connect_timeout is None else connect_timeout
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
        self._fence = f"{prefix}:{partition}~fence".encode()  # outside the key space
        self._token = uuid.uuid4().hex.encode()  # this backend's identity in the store
        self._headers: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._pool: redis.ConnectionPool | None = None
        self._client: redis.Redis | None = None
        self._closed = False
        self._restored = False  # keys came from a snapshot (their expiry by known states)

    def __repr__(self) -> str:
        return (
            f"RedisBackend({redact(self.url)!r}, prefix={self.prefix!r}, "
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
                        delete_keys(client, scan_keys(client, self._base))
                    client.set(self._fence, self._token)
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

    def _errors(self, doing: str) -> ConnectionErrors:
        return ConnectionErrors(self, doing)

    def _check_fence(self, found: Any, doing: str) -> None:
        """``found``: the fence key's value read back; StateReadError unless it is ours."""
        if found != self._token:
            what = "is gone" if found is None else f"is {found!r}, another backend's"
            raise StateReadError(
                f"{self!r} lost its state while {doing}: the fence {self._fence!r} it wrote "
                f"({self._token!r}) {what}: the server restarted empty, the database was "
                "flushed, or another backend opened this prefix and partition since"
            )

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
        plan = Plan(self.serializers.of)
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
            PLAN_OPS[request.op](plan, request, keys[index], last[keys[index]] == index)
        commands = plan.finish()
        cleanup = self._ttl_cleanup
        if cleanup is not None and cleanup.states:
            commands += self._expiring(cleanup, requests, keys)
        if not commands:
            return
        pipe = client.pipeline(transaction=self.transaction)
        queue = pipe.execute_command
        queue("GET", self._fence)  # first, in the same transaction
        for command in commands:
            queue(*command)
        with self._errors("executing a batch"):
            replies = pipe.execute()
        self._check_fence(replies[0], "executing a batch")
        replies = replies[1:]
        if plan.mget_keys:
            plan.mget_reply = replies[0]
            replies = replies[1:]
        loads_of = self.serializers.of
        for fill, request, a, b in plan.fills:
            request.result = fill(plan, replies, a, b, loads_of(request.state).loads)
        for request in plan.rescans:
            self._skip_empty_chunks(request)

    @staticmethod
    def _expiring(
        cleanup: TtlCleanup, requests: Sequence[StateRequest], keys: list[bytes]
    ) -> list[tuple]:
        """``PEXPIRE`` of every key of a TTL state the batch writes: last in the
        pipeline (``SET``/``MSET`` drop a key's expiry), ``TTL_FACTOR`` TTLs."""
        expiring: dict[bytes, int] = {}
        states, writes = cleanup.states, Op.WRITES
        for request, redis_key in zip(requests, keys, strict=True):
            if request.op in writes:
                found = states.get(request.state)
                if found is not None:
                    expiring[redis_key] = _expiry_ms(found.ttl)
        return [("PEXPIRE", key, ms) for key, ms in expiring.items()]

    def _expiry_of(self, suffix: bytes) -> int:
        """The ``RESTORE`` TTL (ms; 0: none) of a key relative to the partition
        (``{len(state)}:{state}:...``): ``TTL_FACTOR`` TTLs for a TTL state's key."""
        length, _, rest = suffix.partition(b":")
        state = rest[: int(length)].decode("utf-8", "surrogatepass") if length.isdigit() else ""
        found = self.ttl_cleanup.states.get(state)
        return 0 if found is None else _expiry_ms(found.ttl)

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
        with self._errors("taking a snapshot"):
            self._check_fence(client.get(self._fence), "taking a snapshot")
            write_snapshot(
                client, self._base, directory, {"prefix": self.prefix, "partition": self.partition}
            )
            self._check_fence(client.get(self._fence), "taking a snapshot")

    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        """Replace this partition's keys with the union of the snapshots in
        ``directory`` (one or several), keeping only keys of ``key_groups`` (None:
        all; every Redis key names its key group, so ``max_parallelism`` is only
        checked); opens the backend if needed. A key in several snapshots keeps the
        value of the last one listed (the operator never passes overlapping ones).

        Raises FileNotFoundError when a directory holds no snapshot and ValueError
        when one is invalid (bad manifest, missing or corrupt data, dumps this server
        rejects) or ``key_groups`` is out of range; the live state is untouched in
        all these cases.
        """
        key_groups = checked_key_groups(key_groups, max_parallelism)
        directories = snapshot_directories(directory)
        entries = union_entries([read_snapshot(d) for d in directories], key_groups)
        self.open()
        client = self._live()
        staging = f"{self.prefix}:{self.partition}~restore-{uuid.uuid4().hex}:".encode()
        with self._errors("restoring a snapshot"):
            try:
                restore_entries(client, self._base, staging, entries, self._expiry_of)
            except redis.ResponseError as exc:
                raise ValueError(
                    f"the Redis snapshot in {', '.join(directories)} does not restore on "
                    f"this server: {exc}"
                ) from exc
            client.set(self._fence, self._token)
        self._restored = True

    def register_ttl(self, name: str, ttl: float, kind: str) -> None:
        """As ``StateBackend.register_ttl``; the keys a restore brought for a state it did
        not know as TTL state (made later, by a record) get their expiry now, as the
        restore gives a known one's: without it they would never leave the server."""
        known = name in self.ttl_cleanup.states
        super().register_ttl(name, ttl, kind)
        if known or not self._restored:
            return
        client = self._live()
        ms = _expiry_ms(ttl)
        with self._errors("setting the expiry of restored keys"):
            for chunk in chunks(sorted(set(scan_keys(client, self._header(name))))):
                with client.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.pexpire(key, ms)
                    pipe.execute()

    def clear(self) -> None:
        """Delete every key of this backend's partition (all its states)."""
        client = self._live()
        with self._errors("clearing"):
            delete_keys(client, scan_keys(client, self._base))

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
            self._check_fence(client.get(self._fence), "listing state")
            found = sorted(set(scan_keys(client, header)))
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
        _loads = self.serializers.of(state).loads
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
        return self.ttl_cleanup.visible(state, items)

    def stored_entries(self, state: str) -> int:
        """Redis keys of ``state`` in this partition (a list or map is one key)."""
        client = self._live()
        with self._errors("counting state"):
            return len(set(scan_keys(client, self._header(state))))


def _expiry_ms(ttl: float) -> int:
    return max(1, math.ceil(ttl * TTL_FACTOR * 1000))


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
        socket_timeout: float | None = None,  # None: the executor's store_timeouts()
        connect_timeout: float | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.fresh = fresh
        self.transaction = transaction
        self.max_connections = max_connections
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"RedisSpec({redact(self.url)!r}, prefix={self.prefix!r})"

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
