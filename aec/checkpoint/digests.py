"""One checkpoint file's manifest entry: described when written, verified on restore.

An entry is ``{"size": bytes, "sha256": hex}`` for every file, whoever reads it
later: no file of a checkpoint is exempt from its digest, so a manifest cannot
let any byte through unchecked (an old ``"verify": "backend"`` entry, without a
digest, is refused).

Verified once per process. Hashing every file at every restore would cost time
in proportion to the state a checkpoint only links (RocksDB SST files, a
MemoryBackend base: a RocksDB micro-batch, which restores the newest checkpoint,
paid 18 ms at 2M keys). So the digest of a file this process wrote or verified
is remembered by the file's identity, (device, inode, size, mtime), for files
with more than one link (hard-linked between a live store and its checkpoints;
a single-link file's inode may be reused once it is deleted): describing or
verifying the same unchanged inode again costs one ``stat``. A file another
process wrote (a restarted task, a download from an object store, which is a new
inode) is hashed in full at its first restore, so corruption is refused there,
before the backend reads a byte and before a new checkpoint could link it
(corruption never propagates into later checkpoints). A file changed in place
while this process runs changes its mtime, so it is hashed again; bytes that
change without an mtime update (failing media) are caught when the backend reads
them (RocksDB's block checksums, MemoryBackend's SHA-256 per file and per segment),
not here.
File systems keep mtimes with a coarse clock (a few milliseconds), so a file
changed right after it was hashed may keep its mtime: as git does with "racily
clean" files, a digest is trusted only if it was taken ``_RACY_NS`` after the
file's mtime; a younger one is hashed again (each file at most twice).
``forget()`` empties the memory (what a new process sees).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import time
from collections.abc import Mapping
from typing import Any, BinaryIO

_CHUNK = 1 << 20  # bytes hashed per read
_CACHE = 8192  # remembered files; cleared when full
_RACY_NS = 100_000_000  # a digest taken sooner after the file's mtime is not trusted
# identity -> (SHA-256 hex, when the hashing started, in time.time_ns())
_KNOWN: dict[tuple[int, int, int, int], tuple[str, int]] = {}


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _remember(info: os.stat_result, sha256: str, hashed_at: int, own_links: int = 0) -> None:
    # ``own_links``: links a restore made itself (a private copy's), not counted
    if info.st_nlink - own_links > 1:
        if len(_KNOWN) >= _CACHE:
            _KNOWN.clear()
        _KNOWN[_identity(info)] = (sha256, hashed_at)


def _trusted(info: os.stat_result, own_links: int = 0) -> str | None:
    """The remembered digest of an unchanged multi-link file, if it is not racy."""
    if info.st_nlink - own_links < 2:
        return None
    known = _KNOWN.get(_identity(info))
    if known is None or known[1] - info.st_mtime_ns < _RACY_NS:
        return None
    return known[0]


def forget() -> None:
    """Forget every remembered digest: the next restore hashes every file again, as
    a new process would."""
    _KNOWN.clear()


def describe(path: str) -> dict[str, object]:
    """The manifest entry of the file at ``path``, which is fsynced too (the backend
    wrote it). A file this process described or verified before, unchanged, is not
    read again."""
    info = os.stat(path)
    known = _trusted(info)
    if known is not None:
        return {"size": info.st_size, "sha256": known}
    hashed_at = time.time_ns()
    seen = info.st_nlink > 1 and _identity(info) in _KNOWN  # racy: hashed, and fsynced, before
    digest, size = _hash(path, fsync=not seen)
    _remember(info, digest.hexdigest(), hashed_at)
    return {"size": size, "sha256": digest.hexdigest()}


def verify(
    path: str,
    expected: Mapping[str, object],
    keep: bool,
    name: str | None = None,
    own_links: int = 0,
) -> bytes | None:
    """Check the file at ``path`` against its manifest entry; its bytes if ``keep``
    (read once, so what was verified is what gets parsed). A file this process
    wrote or verified with that digest, unchanged since, is checked by ``stat``
    only (unless ``keep``). The file is opened once: the identity remembered is the
    open file's, whatever the path names meanwhile. ``name``: the file as messages
    name it (default ``path``). ``own_links``: links to the file the caller made
    itself (a private copy's link), which do not make a single-link file one whose
    identity may be trusted (its inode could be reused once it is deleted).

    Raises ValueError naming the file: an entry without a SHA-256, not a regular
    file, or a size or SHA-256 mismatch.
    """
    where = path if name is None else name
    sha256 = _expected_sha256(where, expected)
    with open_regular(path, where) as src:
        info = os.fstat(src.fileno())
        _check_size(where, info.st_size, expected)
        if not keep and _trusted(info, own_links) == sha256:
            return None
        parts: list[bytes] | None = [] if keep else None
        hashed_at = time.time_ns()
        digest, size = _hash_open(src, parts=parts)
    _check_digest(where, digest.hexdigest(), size, expected)
    _remember(info, sha256, hashed_at, own_links)
    return b"".join(parts) if parts is not None else None


def copy_verified(source: str, target: str, expected: Mapping[str, object]) -> None:
    """Copy the file at ``source`` to ``target`` (new, mode 0600), checking the bytes
    copied against ``source``'s manifest entry on the way: ``target`` holds exactly
    what was verified, whatever ``source`` holds later. Bytes of an open file this
    process wrote or verified, unchanged, owned by this user and writable by no one
    else, are copied without hashing them again.

    Raises ValueError naming ``source`` as ``verify`` does (``target`` is removed).
    """
    sha256 = _expected_sha256(source, expected)
    with open_regular(source) as src:
        info = os.fstat(src.fileno())
        _check_size(source, info.st_size, expected)
        known = _trusted(info) == sha256 and only_mine(info)
        digest, written = hashlib.sha256(), 0
        try:
            with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                while chunk := src.read(_CHUNK):
                    if not known:
                        digest.update(chunk)
                    written += len(chunk)
                    out.write(chunk)
            if known:
                _check_size(source, written, expected)
            else:
                _check_digest(source, digest.hexdigest(), written, expected)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(target)
            raise


def only_mine(info: os.stat_result) -> bool:
    """Whether the file of ``info`` is a regular file owned by this user that no one
    else may write: its bytes change only by this user's hand."""
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _expected_sha256(path: str, expected: Mapping[str, object]) -> str:
    sha256 = expected.get("sha256")
    if not isinstance(sha256, str):
        raise ValueError(
            f"the manifest entry of {path} has no SHA-256: every checkpoint file must "
            "carry one (a checkpoint written by an older aec, or edited)"
        )
    return sha256


def _check_size(path: str, size: int, expected: Mapping[str, object]) -> None:
    if size != expected.get("size"):
        raise ValueError(f"{path} has {size} bytes, the manifest says {expected.get('size')}")


def _check_digest(path: str, sha256: str, size: int, expected: Mapping[str, object]) -> None:
    _check_size(path, size, expected)  # changed while being read
    if sha256 != expected.get("sha256"):
        raise ValueError(f"{path} does not match its SHA-256 checksum in the manifest")


def open_regular(path: str, where: str | None = None) -> BinaryIO:
    """``path`` open for reading: a regular file, not a symbolic link (a FIFO put in a
    file's place must not block the restore). Raises ValueError naming ``where`` (default
    ``path``) for anything else, OSError (FileNotFoundError...) as ``open`` does."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a symbolic link
            raise ValueError(f"{where or path} is a symbolic link, not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{where or path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def _hash(path: str, fsync: bool = False) -> tuple[Any, int]:
    with open(path, "rb") as src:
        found = _hash_open(src)
        if fsync:
            os.fsync(src.fileno())
    return found


def _hash_open(src: BinaryIO, parts: list[bytes] | None = None) -> tuple[Any, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if parts is not None:
            parts.append(chunk)
    return digest, size
