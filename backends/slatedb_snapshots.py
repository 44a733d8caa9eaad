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
from typing import Any

from slatedb import uniffi as sdb

from backends.slatedb_store import FORMAT, FORMAT_KEY, MEMTABLE, STATES, WAL, Writer, stream

SNAPSHOT_FILE = "slatedb-snapshot.json"
SNAPSHOT_FORMAT = "aec-slatedb-snapshot-1"


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


async def restore_checkpoint(db: Any, store: Any, manifest: dict[str, Any]) -> None:
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
        # Merge the sorted live and snapshot streams; write only the differences.
        writer = Writer(db)
        live, wanted = stream(db, STATES), stream(reader, STATES)
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
        await db.flush_with_options(WAL)
    finally:
        await reader.shutdown()


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
