"""A checkpoint's files made this process's own before a backend opens them.

A restore verifies each file against the manifest (``aec.checkpoint.digests``),
then a backend opens it by path: rocksdict opens tables itself, MemoryBackend
reads its base and deltas. In a checkpoint directory someone else can write, the
file at a path can be swapped between the two. So every file a backend will open
is first put into a private directory (``aec.state.scratch``: mode 0700, this
user's) and verified there, and the backend is given that directory:

- a hard link, where the file system allows it and the file is this user's and
  writable by no one else: the link names the inode that was verified, whatever
  the checkpoint directory names later, and no one else can change its bytes. The
  link keeps the file's identity, so a file this process wrote or verified is
  still checked by ``stat`` only, and a backend that links it again (RocksDB's
  live directory) copies nothing;
- else a copy, hashed on the way (``digests.copy_verified``): the checkpoint is on
  another file system, or the file is another user's or writable by others.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Mapping

from aec.checkpoint import digests
from aec.state import scratch

PREFIX = "aec-verified-"  # the private directories' prefix (swept after a kill)
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


@contextlib.contextmanager
def directory(parent: str | None = None) -> Iterator[str]:
    """A new private directory under ``parent`` (created if missing; None: the
    system's temporary directory), removed on exit. ``parent`` should be on the
    file system the backend keeps its files on, and written by this user only
    (``StateBackend.scratch_parent``)."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    private = scratch.make(PREFIX, parent)
    try:
        yield private
    finally:
        scratch.remove(private)


def place(source: str, target: str, expected: Mapping[str, object]) -> None:
    """Put the checkpoint file ``source`` at ``target`` (new, in a private directory),
    verified there against its manifest entry ``expected``.

    Raises ValueError naming ``source``: not a regular file, or its size or SHA-256
    differs from ``expected`` (``digests.verify``).
    """
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    else:
        if digests.only_mine(os.lstat(target)):
            digests.verify(target, expected, keep=False, name=source, own_links=1)
            return
        os.remove(target)  # another user's file, or one others may write: copied
    digests.copy_verified(source, target, expected)
