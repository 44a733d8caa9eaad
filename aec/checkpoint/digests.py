"""One checkpoint file's manifest entry: described when written, verified on restore.

An entry is ``{"size": bytes, "sha256": hex}``, or ``{"size": bytes, "verify":
"backend"}`` for a file the backend verifies itself whenever it reads it
(``aec.state.backend.StateBackend.verified_by_backend``: RocksDB's SST files carry
a checksum per block, MemoryBackend's segmented base a SHA-256 per segment). Such
a file is never read here, on either side, so neither a checkpoint nor a restore
costs time in proportion to state that is only linked (Flink does not re-read
state files on restore either). Corruption in it fails the run when the backend
reads it (``aec.JobFailure``), not the restore.

A file hard-linked from an earlier checkpoint is the same inode with the same size
and mtime: its entry is remembered by (device, inode, size, mtime), so linking a
large file into every checkpoint costs one ``stat``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Sequence
from typing import Any

BY_BACKEND = "backend"
_CHUNK = 1 << 20  # bytes hashed per read
_CACHE = 4096  # hard-linked files whose entry is remembered
_KNOWN: dict[tuple[int, int, int, int], dict[str, Any]] = {}


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` matches one of the ``fnmatch`` ``patterns``."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def describe(path: str, by_backend: bool = False) -> dict[str, Any]:
    """The manifest entry of the file at ``path``, which is fsynced too (the backend
    wrote it); ``by_backend``: size only, the file is not read."""
    info = os.stat(path)
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    known = _KNOWN.get(identity)
    if (
        known is not None
        and info.st_nlink > 1
        and (known.get("verify") == BY_BACKEND) == by_backend
    ):
        return dict(known)
    if by_backend:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        described: dict[str, Any] = {"size": info.st_size, "verify": BY_BACKEND}
    else:
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
            os.fsync(src.fileno())
        described = {"size": size, "sha256": digest.hexdigest()}
    if info.st_nlink > 1:
        if len(_KNOWN) >= _CACHE:
            _KNOWN.clear()
        _KNOWN[identity] = described
    return dict(described)


def verify(path: str, expected: dict[str, Any], keep: bool) -> bytes | None:
    """Check the file at ``path`` against its manifest entry; its bytes if ``keep``
    (read once, so what was verified is what gets parsed). A ``"verify": "backend"``
    entry is checked for its size only, unless ``keep``.

    Raises ValueError naming the file: a size or SHA-256 mismatch.
    """
    if expected.get("verify") == BY_BACKEND and not keep:
        size = os.path.getsize(path)
        if size != expected.get("size"):
            raise ValueError(f"{path} has {size} bytes, the manifest says {expected.get('size')}")
        return None
    digest = hashlib.sha256()
    size = 0
    parts = []
    with open(path, "rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if keep:
                parts.append(chunk)
    if size != expected.get("size"):
        raise ValueError(f"{path} has {size} bytes, the manifest says {expected.get('size')}")
    if expected.get("verify") != BY_BACKEND and digest.hexdigest() != expected.get("sha256"):
        raise ValueError(f"{path} does not match its SHA-256 checksum in the manifest")
    return b"".join(parts) if keep else None
