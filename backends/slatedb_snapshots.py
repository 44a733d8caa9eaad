"""SlateDBBackend's snapshots: a SlateDB checkpoint (a pinned manifest) plus a small JSON.

``snapshot(dir)`` flushes the memtable to L0 SSTs, creates a SlateDB checkpoint (a
pinned manifest, no data copy) and writes ``dir/slatedb-snapshot.json`` naming it
(atomically). ``restore`` opens a ``DbReader`` pinned to that checkpoint and
rewrites the live database to equal it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from slatedb import uniffi as sdb

from aec.keygroups import KeyGroupRange
from backends.keycodec import key_group_bounds, prefix_end
from backends.slatedb_store import (
    FORMAT,
    FORMAT_KEY,
    MEMTABLE,
    STATES,
    WAL,
    Writer,
    first_key,
    state_prefix_of,
    stream,
)

SNAPSHOT_FILE = "slatedb-snapshot.json"
SNAPSHOT_FORMAT = "aec-slatedb-snapshot-1"
NAME = "aec-snapshot-"  # the name of every checkpoint a snapshot creates


def write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` as ``directory/slatedb-snapshot.json``, atomically."""
    target = os.path.join(directory, SNAPSHOT_FILE)
    staging = f"{target}.tmp-{uuid.uuid4().hex}"
    with open(staging, "w", encoding="utf-8") as out:
        json.dump({"format": SNAPSHOT_FORMAT, **manifest, "created": time.time()}, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(staging, target)


async def create_checkpoint(db: Any, admin: Any, name: str) -> Any:
    """A detached SlateDB checkpoint of ``db`` named ``name`` (its ``id``, ``manifest_id``)."""
    # A checkpoint pins a manifest, which names SSTs only: writes still in the WAL
    # would be missing, so flush the memtable into L0 first.
    await db.flush_with_options(WAL)
    await db.flush_with_options(MEMTABLE)
    options = sdb.CheckpointOptions(lifetime_ms=None, source=None, name=name)
    return await admin.create_detached_checkpoint(options)


async def release_checkpoints(
    admin: Any, newest: str, replaced: str | None, retained: int | None
) -> None:
    """Delete checkpoint ``replaced`` (the one a snapshot directory named before it was
    overwritten) and, with ``retained``, every aec snapshot checkpoint of the database
    but the ``retained`` newest (by manifest id). ``newest`` is never deleted."""
    doomed = set() if replaced is None or replaced == newest else {replaced}
    if retained is not None:
        ours = [c for c in await admin.list_checkpoints(None) if (c.name or "").startswith(NAME)]
        ours.sort(key=lambda c: c.manifest_id, reverse=True)
        doomed.update(c.id for c in ours[retained:] if c.id != newest)
    for checkpoint_id in doomed:
        try:  # a released checkpoint no longer pins its SSTs
            await admin.delete_checkpoint(checkpoint_id)
        except sdb.Error:
            pass  # already gone


async def open_checkpoint(store: Any, manifest: dict[str, Any]) -> Any:
    """A ``DbReader`` pinned to the checkpoint ``manifest`` names.

    Raises ValueError when it cannot be opened or is not an aec database."""
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
        if await reader.get(FORMAT_KEY) != FORMAT:
            raise ValueError(f"checkpoint {manifest['checkpoint']} is not an aec SlateDB database")
    except BaseException:
        await reader.shutdown()
        raise
    return reader


async def restore_union(
    db: Any, sources: list[tuple[Any, dict[str, Any]]], key_groups: KeyGroupRange | None
) -> None:
    """Make ``db``'s state equal the union of the checkpoints ``sources`` names
    (``(object store, manifest)`` each), keeping only keys of ``key_groups``.

    Every checkpoint is opened before ``db`` is touched. The sorted live stream is
    merged with the sorted wanted stream and only the differences are written: puts
    for changed keys, deletes for keys the union lacks."""
    readers: list[Any] = []
    try:
        for store, manifest in sources:
            readers.append(await open_checkpoint(store, manifest))
        wanted = _merged([_in_key_groups(reader, key_groups) for reader in readers])
        writer = Writer(db)
        live = stream(db, STATES)
        have = await anext(live, None)
        want = await anext(wanted, None)
        while have is not None or want is not None:
            if want is None or (have is not None and have[0] < want[0]):
                assert have is not None  # the loop runs while one of them is not None
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
        await db.flush_with_options(WAL)
    finally:
        for reader in readers:
            await reader.shutdown()


async def unchanged_since(
    db: Any, admin: Any, manifest: dict[str, Any], key_groups: KeyGroupRange | None
) -> bool:
    """Whether ``db`` holds exactly the state of the checkpoint ``manifest`` names: it
    is the checkpoint's database (the checkpoint is still in its manifest), nothing
    was written since (the durable sequence number is the one recorded at the
    snapshot, after a WAL flush), and no state key lies outside ``key_groups``."""
    sequence = manifest.get("sequence")
    if not isinstance(sequence, int):
        return False
    await db.flush_with_options(WAL)
    if db.status().durable_seq != sequence:
        return False
    if manifest["checkpoint"] not in {c.id for c in await admin.list_checkpoints(None)}:
        return False
    return key_groups is None or not await _keys_outside(db, key_groups)


async def _keys_outside(db: Any, key_groups: KeyGroupRange) -> bool:
    """Whether some state key of ``db`` lies outside ``key_groups`` (two probes a state)."""
    low, high = key_group_bounds(key_groups.start, key_groups.end)
    prefix = await _next_state(db, STATES)
    while prefix is not None:
        end = prefix_end(prefix)
        if await first_key(db, prefix, prefix + low) is not None:
            return True
        if high is not None and await first_key(db, prefix + high, end) is not None:
            return True
        prefix = await _next_state(db, end)
    return False


async def _in_key_groups(
    reader: Any, key_groups: KeyGroupRange | None
) -> AsyncIterator[tuple[bytes, bytes]]:
    """Every state row of ``reader`` in ``key_groups``, in key order: one range scan
    per state (keys are ``state prefix | key group | ...``)."""
    if key_groups is None:
        async for row in stream(reader, STATES):
            yield row
        return
    low, high = key_group_bounds(key_groups.start, key_groups.end)
    prefix = await _next_state(reader, STATES)
    while prefix is not None:
        end = prefix + high if high is not None else prefix_end(prefix)
        async for row in stream(reader, prefix, (prefix + low, end)):
            yield row
        prefix = await _next_state(reader, prefix_end(prefix))


async def _next_state(reader: Any, low: bytes | None) -> bytes | None:
    """The state prefix of the first state key at or after ``low``, or None."""
    if low is None:
        return None
    key = await first_key(reader, low, prefix_end(STATES))
    return None if key is None else state_prefix_of(key)


async def _merged(
    streams: list[AsyncIterator[tuple[bytes, bytes]]],
) -> AsyncIterator[tuple[bytes, bytes]]:
    """The rows of several sorted streams in key order; on equal keys the last
    stream's row wins (the others are skipped)."""
    heads = [await anext(s, None) for s in streams]
    while True:
        present = [row[0] for row in heads if row is not None]
        if not present:
            return
        key = min(present)
        chosen = None
        for index, row in enumerate(heads):
            if row is not None and row[0] == key:
                chosen = row
                heads[index] = await anext(streams[index], None)
        assert chosen is not None  # ``key`` is one of the heads' keys
        yield chosen


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, SNAPSHOT_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no SlateDB snapshot at {path}")
    try:
        with open(path, encoding="utf-8") as source:
            manifest = json.load(source)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a SlateDB snapshot manifest: {exc}") from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != SNAPSHOT_FORMAT
        or not all(isinstance(manifest.get(k), str) for k in ("url", "db_path", "checkpoint"))
    ):
        raise ValueError(f"{path} is not an aec SlateDB snapshot manifest")
    return manifest
