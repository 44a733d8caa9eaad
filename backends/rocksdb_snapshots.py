"""RocksDBBackend's snapshots on disk: RocksDB checkpoints, hard-linked both ways.

``snapshot`` is a RocksDB checkpoint (``rocksdict.Checkpoint``): the memtables are
flushed and every SST file is hard-linked into ``dir/rocksdb``, so a checkpoint
writes only what the last flush produced plus a small MANIFEST, whatever the state
size. ``linked_copy`` goes the other way for ``restore``: SST and blob files are
immutable in RocksDB (compaction writes new files and unlinks old ones), so they
are hard-linked into the new live directory and only the small mutable files
(MANIFEST, CURRENT, OPTIONS, WAL) are copied: opening a database appends to its
MANIFEST, which must never touch the snapshot. Where hard links are impossible (a
snapshot on another file system) files are copied.

SST and blob files never change once written, so ``write_checkpoint`` notes each
one's size and mtime (``Stamps``: taken in a checkpoint directory, where every file is
complete) and refuses to link a file that changed since it was restored or last
checkpointed (``ValueError``): corruption of a live file does not reach a later
checkpoint.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from typing import Any

from rocksdict import Checkpoint

SNAPSHOT_SUBDIR = "rocksdb"
_IMMUTABLE = (".sst", ".blob")
Stamps = dict[str, tuple[int, int]]  # immutable file name -> (size, mtime_ns)


def stamps(directory: str, names: set[str] | None = None) -> Stamps:
    """The size and mtime of every SST and blob file in ``directory`` (of ``names``).
    A file gone between the listing and its ``stat`` (an open database's compaction
    deleted it) is left out."""
    found: Stamps = {}
    for name in os.listdir(directory):
        if name.endswith(_IMMUTABLE) and (names is None or name in names):
            try:
                info = os.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            found[name] = (info.st_size, info.st_mtime_ns)
    return found
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


def sweep_leftovers(path: str) -> list[str]:
    """Remove what a restore killed midway left beside the live directory ``path``:
    staging directories (``<path>.restore-*``, never live state) and, when ``path``
    holds a database again, the previous live directory set aside
    (``<path>.previous-*``). The removed paths."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        siblings = os.listdir(parent)
    except OSError:
        return []
    live = holds_database(path)
    removed = []
    for sibling in siblings:
        if sibling.startswith(f"{name}.restore-") or (
            live and sibling.startswith(f"{name}.previous-")
        ):
            shutil.rmtree(os.path.join(parent, sibling), ignore_errors=True)
            removed.append(os.path.join(parent, sibling))
    return removed


def holds_database(path: str) -> bool:
    """Whether ``path`` holds a RocksDB database (every one has a CURRENT file)."""
    return os.path.isfile(os.path.join(path, "CURRENT"))


def snapshot_source(directory: str) -> str:
    """The RocksDB checkpoint inside snapshot directory ``directory``.

    Raises FileNotFoundError when it is missing, ValueError when it is no database.
    """
    source = os.path.join(directory, SNAPSHOT_SUBDIR)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"no RocksDB snapshot at {source}")
    if not holds_database(source):
        raise ValueError(f"{source} is not a RocksDB checkpoint (no CURRENT file)")
    return source


def write_checkpoint(db: Any, directory: str, known: Stamps) -> Stamps:
    """Checkpoint ``db`` into ``directory/rocksdb`` (replacing one already there); the
    stamps of its immutable files. ``known``: the stamps noted before (at the restore
    or the previous checkpoint).

    Raises ValueError naming a linked file whose size or mtime changed since ``known``
    (the checkpoint is not made).
    """
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, SNAPSHOT_SUBDIR)
    staging = f"{target}.tmp-{uuid.uuid4().hex}"  # Checkpoint needs a new directory
    Checkpoint(db).create_checkpoint(staging)  # flushes memtables first
    linked = stamps(staging)
    changed = sorted(n for n, stamp in linked.items() if known.get(n, stamp) != stamp)
    if changed:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(
            f"{changed[0]} changed since it was written or restored (RocksDB tables never "
            "change): refusing to link it into a new checkpoint"
        )
    if os.path.exists(target):
        shutil.rmtree(target)
    os.replace(staging, target)
    return linked


def linked_copy(source: str, target: str) -> int:
    """Make ``target`` (new) a copy of database ``source``: immutable files hard-linked,
    the rest copied. Returns the bytes copied (not linked)."""
    os.mkdir(target)
    copied = 0
    for name in os.listdir(source):
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if os.path.isdir(src):
            raise ValueError(f"{source} holds a directory {name!r}: not a RocksDB checkpoint")
        if name.endswith(_IMMUTABLE):
            try:
                os.link(src, dst)
                continue
            except OSError as exc:
                if exc.errno not in _NO_LINK:
                    raise
        shutil.copyfile(src, dst)
        copied += os.path.getsize(dst)
    return copied
