"""RedisBackend's snapshots: DUMP a partition's keys into files, RESTORE them back.

``write_snapshot`` ``SCAN``s the partition's keys and ``DUMP``s them into
``redis-state-<id>.msgpack`` (keys relative to ``{prefix}:{partition}:``, so a
snapshot restores into any prefix/partition), then atomically replaces
``redis-manifest.json`` (format, key count, size, SHA-256), then deletes older data
files. ``read_snapshot`` validates manifest and checksum; ``restore_entries``
``RESTORE``s the dumps under a staging namespace, then in one ``MULTI`` deletes the
partition's keys and renames the staged keys into place: a failure before the
switch leaves the live state untouched. The data file is msgpack (plain data:
key suffixes and DUMP payloads, both bytes), so reading a snapshot runs no code;
Redis checks each payload's own checksum when it restores it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import redis

from aec.keygroups import KeyGroupRange
from aec.state.serialization import SAFE
from backends.redis_connection import chunks, delete_keys, scan_keys

FORMAT = "aec-redis-2"
MANIFEST = "redis-manifest.json"
DATA_PREFIX = "redis-state-"


def write_snapshot(client: redis.Redis, base: bytes, directory: str, about: dict[str, Any]) -> None:
    """DUMP every key under ``base`` into ``directory``; ``about`` goes into the manifest."""
    os.makedirs(directory, exist_ok=True)
    skip = len(base)
    entries: list[tuple[bytes, bytes]] = []
    for chunk in chunks(sorted(set(scan_keys(client, base)))):
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.execute_command("DUMP", key)
        for key, dump in zip(chunk, pipe.execute(), strict=True):
            if dump is not None:  # deleted since the SCAN
                entries.append((key[skip:], dump))
    server = client.info("server").get("redis_version", "?")
    data = SAFE.dumps({"format": FORMAT, "entries": [list(entry) for entry in entries]})
    name = f"{DATA_PREFIX}{uuid.uuid4().hex}.msgpack"
    write_atomically(os.path.join(directory, name), data)
    manifest = {
        "format": FORMAT,
        "file": name,
        "keys": len(entries),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **about,
        "redis_version": server,
    }
    write_atomically(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1).encode())
    for old in glob.glob(os.path.join(glob.escape(directory), DATA_PREFIX + "*")):
        if os.path.basename(old) != name:
            os.remove(old)


def restore_entries(
    client: redis.Redis,
    base: bytes,
    staging: bytes,
    entries: list[tuple[bytes, bytes]],
    expiry_of: Callable[[bytes], int] = lambda suffix: 0,
) -> None:
    """Make the keys under ``base`` exactly ``entries`` (``(key suffix, DUMP payload)``),
    each expiring after ``expiry_of(suffix)`` ms (0: never; TTL states).

    Raises redis.ResponseError (after removing the staged keys) when the server
    rejects a payload; the live keys are untouched then.
    """
    try:
        for chunk in chunks(entries):
            pipe = client.pipeline(transaction=False)
            for suffix, dump in chunk:
                pipe.execute_command("RESTORE", staging + suffix, expiry_of(suffix), dump, "REPLACE")
            pipe.execute()
    except redis.ResponseError:
        delete_keys(client, scan_keys(client, staging))
        raise
    pipe = client.pipeline(transaction=True)  # the switch: all or nothing
    live = sorted(set(scan_keys(client, base)))
    for chunk in chunks(live):
        pipe.execute_command("UNLINK", *chunk)
    for suffix, _ in entries:
        pipe.execute_command("RENAME", staging + suffix, base + suffix)
    pipe.execute()


def union_entries(
    snapshots: list[list[tuple[bytes, bytes]]], key_groups: KeyGroupRange | None
) -> list[tuple[bytes, bytes]]:
    """The entries of every snapshot whose key group is in ``key_groups`` (None: all);
    a key in several snapshots keeps the last one's payload."""
    union: dict[bytes, bytes] = {}
    for entries in snapshots:
        for suffix, dump in entries:
            if key_groups is None or key_group_of_suffix(suffix) in key_groups:
                union[suffix] = dump
    return list(union.items())


def key_group_of_suffix(suffix: bytes) -> int:
    """The key group of a key relative to the partition:
    ``{len(state)}:{state}:{key group}:{encoded key}``."""
    size, _, rest = suffix.partition(b":")
    tail = rest[int(size) + 1 :]
    return int(tail[: tail.index(b":")])


def read_snapshot(directory: str) -> list[tuple[bytes, bytes]]:
    """The ``(key suffix, DUMP payload)`` entries of the snapshot in ``directory``.

    Raises FileNotFoundError without a manifest, ValueError when the manifest or
    the data file is invalid or corrupt.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no Redis snapshot in {directory} ({MANIFEST} is missing)")
    try:
        with open(path, "rb") as src:
            manifest = json.loads(src.read())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT!r}")
        name = manifest["file"]
        if os.path.basename(name) != name or not name.startswith(DATA_PREFIX):
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
        raise ValueError(f"{data_path} does not match the checksum in {MANIFEST}: corrupt")
    try:
        payload = SAFE.loads(data)
        entries = payload["entries"]
        if payload.get("format") != FORMAT or len(entries) != expected_keys:
            raise ValueError("format or key count differs from the manifest")
        if not all(
            type(suffix) is bytes and type(dump) is bytes for suffix, dump in entries
        ):
            raise ValueError("an entry is not a (key, DUMP payload) pair of bytes")
        entries = [(suffix, dump) for suffix, dump in entries]
    except Exception as exc:
        raise ValueError(f"{data_path} is not a valid Redis snapshot: {exc}") from exc
    return entries


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a fsynced temporary file and a rename."""
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
