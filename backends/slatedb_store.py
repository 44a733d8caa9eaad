"""SlateDB object stores and key ranges: URLs -> ``ObjectStore``, state prefixes, scans.

A state key is ``b"s" | len(state name) (2 bytes, big-endian) | state name (UTF-8) |``
``backends.keycodec.key_prefix(key group, key)``; ``b"\\x00aec/format"`` marks a
database aec wrote. See ``backends.slatedb`` for the URLs and their environment.

Replies are checked before they are used (``checked_value``, ``scan``): a point
read gives bytes or None, a scan's rows lie in the range asked, in ascending key
order, no more than the limit. SlateDB verifies its own blocks (it raises on a
corrupt one); these checks turn a reply no correct store gives into
``aec.errors.StateReadError`` naming the state and key group, never a wrong result.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from slatedb import uniffi as sdb

from aec.errors import StateReadError
from aec.timeouts import store_timeouts
from backends.keycodec import key_group_of, prefix_end

FORMAT_KEY = b"\x00aec/format"
FORMAT = b"aec-slatedb-1"
STATES = b"s"  # every state key starts with this byte
_NAME_LEN = struct.Struct(">H")
_SCAN_BATCH = 1024  # rows per DbIterator.next_batch call (one FFI crossing each)
_REWRITE_BATCH = 1000  # operations per WriteBatch when restoring or clearing
_CLOUD = {"s3": "S3", "gs": "GCS", "az": "AZURE"}
WAL = sdb.FlushOptions(flush_type=sdb.FlushType.WAL)
MEMTABLE = sdb.FlushOptions(flush_type=sdb.FlushType.MEM_TABLE)


def parse_url(url: str) -> tuple[str, str, str]:
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


def object_store(url: str, options: Mapping[str, str]) -> tuple[Any, str]:
    """A SlateDB ``ObjectStore`` for ``url`` and the path prefix inside it."""
    scheme, root, prefix = parse_url(url)
    if scheme == "file":
        if options:
            raise ValueError("object_store_options apply to cloud object stores only")
        os.makedirs(root, exist_ok=True)  # the local store must have an existing root
        builder = sdb.ObjectStoreBuilder(sdb.ObjectStoreType.LOCAL)
        builder.with_config("local_path", root)
    else:
        if scheme == "s3":
            _check_plain_http(options)
        builder = sdb.ObjectStoreBuilder.from_env(getattr(sdb.ObjectStoreType, _CLOUD[scheme]))
        builder.with_url(f"{scheme}://{root}")
        for key, value in {**client_timeouts(), **options}.items():
            builder.with_config(key, str(value))
    return builder.build(), prefix


def client_timeouts() -> dict[str, str]:
    """The ``object_store`` crate's client timeouts from ``aec.timeouts.store_timeouts()``:
    ``connect_timeout`` (connect) and ``timeout`` (one whole request, its body
    included). ``object_store_options`` with the same keys win."""
    timeouts = store_timeouts()
    return {"connect_timeout": f"{timeouts.connect:g}s", "timeout": f"{timeouts.request:g}s"}


def s3_endpoint(options: Mapping[str, str]) -> str:
    """The S3 endpoint the ``object_store`` crate will use ("" for AWS itself):
    ``object_store_options`` first, then ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT``."""
    return (
        options.get("endpoint")
        or options.get("aws_endpoint")
        or os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("AWS_ENDPOINT")
        or ""
    )


def _check_plain_http(options: Mapping[str, str]) -> None:
    """Refuse a plain-HTTP S3 endpoint without ``allow_http``: the ``object_store`` crate
    rejects every request to it and SlateDB retries them until ``timeout``, so the
    user would see a bare TimeoutError instead of the cause."""
    endpoint = s3_endpoint(options)
    allow = options.get("allow_http") or options.get("aws_allow_http")
    if allow is None:
        allow = os.environ.get("AWS_ALLOW_HTTP", "")
    if endpoint.lower().startswith("http://") and str(allow).strip().lower() != "true":
        raise ValueError(
            f"the S3 endpoint {endpoint} is plain HTTP: set AWS_ALLOW_HTTP=true (or "
            'object_store_options={"allow_http": "true"}) to use it'
        )


def probe_endpoint(url: str, options: Mapping[str, str], seconds: float) -> None:
    """Connect to an S3 URL's explicit endpoint once (TCP only).

    SlateDB retries an unreachable store until the backend's timeout (minutes), so
    ``open`` probes first. Raises ConnectionError naming the endpoint; does nothing
    for local stores and for AWS itself (no endpoint set)."""
    if parse_url(url)[0] != "s3":
        return
    endpoint = s3_endpoint(options)
    if not endpoint:
        return
    parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
        socket.create_connection((parts.hostname or "", port), timeout=seconds).close()
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"the S3 endpoint {endpoint} of {url} is unreachable: {exc}") from exc


def make_settings(overrides: Mapping[str, Any]) -> Any:
    """SlateDB's default ``Settings`` with ``{dotted key: JSON-able value}`` overrides.

    Raises ValueError naming a bad key or value."""
    settings = sdb.Settings.default()
    for key, value in overrides.items():
        try:
            settings.set(key, json.dumps(value))
        except sdb.Error as exc:
            raise ValueError(f"bad SlateDB setting {key}={value!r}: {exc}") from exc
    return settings


def join_path(*parts: str) -> str:
    """``parts`` joined with single slashes, empty parts dropped."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def state_prefix(state: str) -> bytes:
    """The prefix of every key of state ``state``."""
    name = state.encode("utf-8", "surrogatepass")
    if len(name) > 0xFFFF:
        raise ValueError(f"state name too long ({len(name)} bytes, at most 65535)")
    return STATES + _NAME_LEN.pack(len(name)) + name


def key_range(prefix: bytes, after: bytes | None = None) -> Any:
    """The keys under ``prefix`` (all keys for b""), past ``after`` when given."""
    return sdb.KeyRange(
        start=(prefix or None) if after is None else after,
        start_inclusive=after is None,
        end=prefix_end(prefix),
        end_inclusive=False,
    )


def reply_error(db_key: bytes, what: str) -> StateReadError:
    """A SlateDB reply about ``db_key`` no correct store gives (``what``)."""
    where = _describe(db_key)
    return StateReadError(f"SlateDB gave a reply it cannot have stored for {where}: {what}")


def _describe(db_key: bytes) -> str:
    if not db_key.startswith(STATES) or len(db_key) < len(STATES) + _NAME_LEN.size:
        return f"key {db_key[:40]!r}"
    (size,) = _NAME_LEN.unpack_from(db_key, len(STATES))
    start = len(STATES) + _NAME_LEN.size
    name = db_key[start : start + size].decode("utf-8", "replace")
    rest = db_key[start + size :]
    group = f", key group {key_group_of(rest)}" if len(rest) >= 2 else ""
    return f"state {name!r}{group}"


def checked_value(db_key: bytes, raw: Any) -> bytes | None:
    """A point read's reply: bytes or None, else StateReadError."""
    if raw is None or type(raw) is bytes:
        return raw
    raise reply_error(db_key, f"a {type(raw).__name__} instead of bytes")


async def scan(db: Any, prefix: bytes, after: bytes | None = None, limit: int | None = None):
    """``[(key, raw value)]`` under ``prefix`` past ``after``, at most ``limit`` rows;
    StateReadError for rows out of that range or order."""
    iterator = await db.scan(key_range(prefix, after))
    rows: list[tuple[bytes, bytes]] = []
    while limit is None or len(rows) < limit:
        want = _SCAN_BATCH if limit is None else min(_SCAN_BATCH, limit - len(rows))
        chunk = await iterator.next_batch(want)
        if len(chunk) > want:
            raise reply_error(prefix, f"{len(chunk)} rows where at most {want} were asked")
        rows.extend((kv.key, kv.value) for kv in chunk)
        if len(chunk) < want:
            break
    _check_rows(rows, prefix, after)
    return rows


def _check_rows(rows: list[tuple[bytes, bytes]], prefix: bytes, after: bytes | None) -> None:
    previous = after
    for key, value in rows:
        if type(key) is not bytes or type(value) is not bytes or not key.startswith(prefix):
            raise reply_error(prefix, f"a row outside the range scanned ({key[:40]!r})")
        if previous is not None and key <= previous:
            raise reply_error(key, "rows out of key order")
        previous = key


async def stream(db: Any, prefix: bytes, bounds: tuple[bytes, bytes | None] | None = None):
    """Every ``(key, raw value)`` under ``prefix`` (or in ``[low, high)`` when ``bounds``
    is given), in key order, read in chunks."""
    if bounds is None:
        iterator = await db.scan(key_range(prefix))
    else:
        iterator = await db.scan(
            sdb.KeyRange(start=bounds[0], start_inclusive=True, end=bounds[1], end_inclusive=False)
        )
    while True:
        chunk = await iterator.next_batch(_SCAN_BATCH)
        for kv in chunk:
            yield kv.key, kv.value
        if len(chunk) < _SCAN_BATCH:
            return


async def first_key(db: Any, low: bytes, high: bytes | None) -> bytes | None:
    """The smallest key in ``[low, high)``, or None."""
    iterator = await db.scan(
        sdb.KeyRange(start=low, start_inclusive=True, end=high, end_inclusive=False)
    )
    found = await iterator.next_batch(1)
    return found[0].key if found else None


def state_prefix_of(db_key: bytes) -> bytes:
    """The ``state_prefix`` a state key starts with."""
    (size,) = _NAME_LEN.unpack_from(db_key, len(STATES))
    return db_key[: len(STATES) + _NAME_LEN.size + size]


async def wipe_states(db: Any) -> None:
    """Delete every state entry of ``db`` (durably); the format marker stays."""
    writer = Writer(db)
    async for key, _ in stream(db, STATES):
        await writer.delete(key)
    await writer.done()
    await db.flush_with_options(WAL)


class Writer:
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
