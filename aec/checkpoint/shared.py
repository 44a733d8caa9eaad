"""Incremental checkpoints on an object store: a file is uploaded once and referenced.

Flink's incremental checkpoints upload a file that did not change since an earlier
checkpoint (a RocksDB SST) once and let later checkpoints reference it
(``SharedStateRegistry``). Here the candidates are the files a backend wrote (under
``backend/``), recognised by content: a file with the SHA-256 of a file an earlier
committed checkpoint stored is not uploaded again, the new manifest references
where that one is. A checkpoint keeps the local layout (``<location>/chk-<id>/``,
manifest inside); the objects it uploaded stay in its own directory::

    <location>/chk-5/MANIFEST.json   every file's size and SHA-256; a file stored by an
                                     earlier checkpoint has "object": its path, e.g.
                                     "chk-3/backend/rocksdb/000012.sst"; "registry":
                                     how many committed checkpoints reference each object
    <location>/chk-5/...             the checkpoint's own files (operator.json, timers,
                                     the backend files it uploaded)

So RocksDB's SST files and MemoryBackend's base and deltas are uploaded once each.
Local checkpoints do not use this: they hard-link (``aec.checkpoint.files``).

Deleting. A checkpoint stops being committed when its manifest goes; its files go
only when no committed checkpoint references them (``SharedRegistry.garbage``), so
``chk-3/`` may hold objects without a manifest for a while: never restored (no
manifest), and deleted with its last reference. Deletion never trusts the counts a
manifest records: references are read from the manifests present. A crash between
upload and commit leaves files in a directory without a manifest that nothing
references: a restore never reads them and the next garbage collection deletes them.
One writer per location at a time (as one Flink job manager).

Integrity (``docs/security.md``). An object is referenced again only if this process
verified it (uploaded its bytes, or downloaded and hashed them) and the store still
reports the size and modification time it had then (``SharedRegistry.verified``);
otherwise the file is uploaded again, so damage to a stored object never propagates
into a new checkpoint. A restore hashes every object it downloads: a mismatch is
refused (``ValueError`` naming the object), and the copy is then verified as a local
checkpoint. References are in the manifest, so a signed manifest covers them.

``ObjectCache`` keeps verified objects on local disk (hard links where possible):
a restore in the process that wrote or restored a recent checkpoint downloads only
the objects it does not hold yet.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aec.state import scratch

_BACKEND_PREFIX = "backend/"
_OBJECT = re.compile(r"^chk-(\d+)/(?:[^/\\]+/)*[^/\\]+$")  # chk-<id>/<relative path>
_log = logging.getLogger("aec.checkpoint.storage")

# what the store reports of a stored file: (size in bytes, its ETag, a digest of the
# bytes on S3; else the modification time in ns, as text)
Stamp = tuple[int, str]


def is_shared(name: str) -> bool:
    """Whether a checkpoint file (its path relative to ``chk-<id>``) may be shared
    between checkpoints: every file a backend wrote."""
    return name.startswith(_BACKEND_PREFIX)


def is_digest(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def object_of(checkpoint_id: int, name: str, entry: Mapping[str, Any]) -> str:
    """Where the file ``name`` of checkpoint ``checkpoint_id`` is stored, relative to the
    location: its ``"object"`` reference or its own place (``chk-<id>/<name>``).

    Raises ValueError for a reference that is not ``chk-<id>/<path>`` or climbs out."""
    found = entry.get("object")
    if found is None:
        return f"chk-{checkpoint_id}/{name}"
    if not isinstance(found, str) or not _OBJECT.match(found) or ".." in found.split("/"):
        raise ValueError(f"the manifest entry of {name} references {found!r}, not a checkpoint file")
    return found


def backend_objects(checkpoint_id: int, manifest: Mapping[str, Any]) -> dict[str, str]:
    """``{object path: SHA-256}`` of the backend files of a parsed manifest of
    checkpoint ``checkpoint_id``.

    Raises ValueError for a malformed entry."""
    found = backend_files({**manifest, "checkpoint_id": checkpoint_id})
    return {path: sha256 for path, sha256, _ in found.values()}


def backend_files(manifest: Mapping[str, Any]) -> dict[str, tuple[str, str, int]]:
    """``{name: (object path, SHA-256, size)}`` of the backend files of a parsed
    manifest (names relative to its ``chk-<id>``).

    Raises ValueError for a malformed entry or a name that climbs out."""
    checkpoint_id = manifest.get("checkpoint_id")
    files = manifest.get("files")
    if type(checkpoint_id) is not int or not isinstance(files, dict):
        raise ValueError("not a checkpoint manifest")
    found = {}
    for name, entry in files.items():
        if not (isinstance(name, str) and is_shared(name)):
            continue
        sha256 = entry.get("sha256") if isinstance(entry, dict) else None
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(sha256, str) or not is_digest(sha256) or type(size) is not int:
            raise ValueError(f"a malformed manifest entry for {name}")
        if ".." in name.split("/") or name.startswith("/"):
            raise ValueError(f"the manifest lists a file outside the checkpoint: {name}")
        found[name] = (object_of(checkpoint_id, name, entry), sha256, size)
    return found


def checkpoint_of(path: str) -> int | None:
    """The checkpoint id of an object path ``chk-<id>/...`` (None otherwise)."""
    match = _OBJECT.match(path)
    return int(match.group(1)) if match else None


class SharedRegistry:
    """What this process knows of the stored checkpoint files at one location.

    Attributes:
        location: the store location (a URI).
        objects: ``{checkpoint id: {object path: SHA-256}}``, the backend files of every
            committed checkpoint seen at the last ``sync`` (its manifest read once).
        unreadable: ids of committed checkpoints whose manifest could not be read:
            their references are unknown, so nothing is deleted while there are any.
        verified: ``{object path: (SHA-256, Stamp)}`` of objects this process uploaded
            or downloaded and hashed, with the store's stamp at that time.
        lock: held while a checkpoint is written or garbage is collected here.
    """

    def __init__(self, location: str) -> None:
        self.location = location
        self.objects: dict[int, dict[str, str]] = {}
        self.unreadable: set[int] = set()
        self.verified: dict[str, tuple[str, Stamp]] = {}
        self.lock = threading.RLock()  # tasks of one worker may share a location

    def sync(
        self,
        committed: Iterable[int],
        read_manifest: Callable[[int], Mapping[str, Any]],
        fresh: bool = False,
    ) -> None:
        """Follow the store: forget checkpoints no longer ``committed`` (ids with a
        manifest), read the manifests of new ones (``read_manifest(id)`` returns the
        parsed manifest; an error marks the checkpoint unreadable). ``fresh``: read
        every one again (what deletes files must not trust a manifest read before:
        elsewhere a checkpoint may have been deleted and taken again under its id)."""
        ids = set(committed)
        if fresh:
            self.objects.clear()
            self.unreadable.clear()
        for gone in set(self.objects) - ids:
            del self.objects[gone]
        self.unreadable &= ids
        for checkpoint_id in sorted(ids - set(self.objects) - self.unreadable):
            try:
                self.objects[checkpoint_id] = backend_objects(
                    checkpoint_id, read_manifest(checkpoint_id)
                )
            except FileNotFoundError:
                continue  # deleted meanwhile: not committed any more
            except (ValueError, TypeError, AttributeError) as exc:
                _log.warning(
                    "%s/chk-%d: its manifest cannot be read (%s); no checkpoint file of %s "
                    "is deleted while it is there", self.location, checkpoint_id, exc,
                    self.location,
                )  # fmt: skip
                self.unreadable.add(checkpoint_id)

    def counts(self) -> Counter[str]:
        """How many committed checkpoints reference each object (by path)."""
        found: Counter[str] = Counter()
        for paths in self.objects.values():
            found.update(paths.keys())
        return found

    def garbage(self, stored: Iterable[str]) -> list[str]:
        """The paths among ``stored`` (every file under the location) that may be
        deleted: under a ``chk-<id>/`` that is not committed and referenced by no
        committed checkpoint ([] while a committed manifest is unreadable)."""
        if self.unreadable:
            return []
        used = self.counts()
        return sorted(
            path
            for path in stored
            if (owner := checkpoint_of(path)) is not None
            and owner not in self.objects
            and path not in used
        )

    def candidates(self) -> list[str]:
        """Objects a new checkpoint might reference: referenced by a committed
        checkpoint and verified by this process (their stamps are to be checked)."""
        used = self.counts()
        return sorted(path for path in self.verified if path in used)

    def reusable(self, stored: Mapping[str, Stamp | None]) -> dict[str, str]:
        """``{SHA-256: object path}`` of the objects a new checkpoint may reference
        instead of uploading: referenced by a committed checkpoint, verified by this
        process, and ``stored`` (the store's stamps, None: absent) shows the stamp
        they had then."""
        found: dict[str, str] = {}
        for paths in self.objects.values():
            for path, sha256 in paths.items():
                known = self.verified.get(path)
                if known is not None and known == (sha256, stored.get(path)):
                    found.setdefault(sha256, path)
        return found

    def annotate(
        self, checkpoint_id: int, reuse: Mapping[str, str]
    ) -> Callable[[dict[str, dict[str, Any]]], dict[str, Any]]:
        """The manifest annotation of checkpoint ``checkpoint_id``: a backend file whose
        SHA-256 ``reuse`` names gets ``"object"``: that path (it is not uploaded); the
        manifest gets ``"registry"``: ``{object path: count}`` over the committed
        checkpoints and this one."""

        def annotate(entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
            mine: set[str] = set()
            for name, entry in entries.items():
                if not is_shared(name):
                    continue
                path = reuse.get(entry["sha256"])
                if path is not None:
                    entry["object"] = path
                mine.add(object_of(checkpoint_id, name, entry))
            counts = self.counts()
            counts.update(mine)
            return {"registry": dict(sorted(counts.items()))}

        return annotate

    def committed(self, checkpoint_id: int, paths: dict[str, str]) -> None:
        """A checkpoint whose backend files are ``paths`` (path -> SHA-256) committed."""
        self.objects[checkpoint_id] = paths
        self.unreadable.discard(checkpoint_id)

    def forget(self, path: str) -> None:
        """The object at ``path`` was deleted."""
        self.verified.pop(path, None)


_REGISTRIES: dict[str, SharedRegistry] = {}
_REGISTRIES_LOCK = threading.Lock()


def registry(location: str) -> SharedRegistry:
    """This process's registry of ``location`` (made on first use)."""
    with _REGISTRIES_LOCK:
        found = _REGISTRIES.get(location)
        if found is None:
            found = _REGISTRIES[location] = SharedRegistry(location)
        return found


def forget_all() -> None:
    """Forget every registry and cached object: what a new process knows (tests)."""
    with _REGISTRIES_LOCK:
        _REGISTRIES.clear()
    CACHE.clear()


# -- the local copy of verified objects ---------------------------------------------------------
class ObjectCache:
    """Verified shared objects on local disk, by SHA-256, for restores in this process.

    An entry is a hard link to a file whose bytes have that digest: a staged file
    this process uploaded, or an object it downloaded and hashed. Each entry notes
    the size and mtime it had, and is used only while they are unchanged. Entries
    are kept per location for the objects its committed checkpoints reference
    (``retain``); the directory is private (``aec.state.scratch``).
    """

    def __init__(self) -> None:
        self._directory: str | None = None
        self._entries: dict[str, tuple[str, tuple[int, int]]] = {}  # path, (size, mtime)
        self._users: dict[str, set[str]] = {}  # SHA-256 -> locations that keep it
        self._lock = threading.Lock()

    def _path(self, sha256: str) -> str:
        if self._directory is None:
            self._directory = scratch.make("aec-objects-")
        return os.path.join(self._directory, sha256)

    def keep(self, location: str, sha256: str, source: str) -> None:
        """Remember ``source`` (a local file whose SHA-256 is ``sha256``) by a hard link;
        nothing is kept where linking is impossible."""
        with self._lock:
            self._users.setdefault(sha256, set()).add(location)
            if sha256 in self._entries:
                return
            path = self._path(sha256)
            try:
                if os.path.lexists(path):
                    os.remove(path)
                os.link(source, path)
            except OSError:
                return
            self._entries[sha256] = (path, _stamp(path))

    def link(self, location: str, sha256: str, target: str) -> bool:
        """Put the cached object at ``target`` (a hard link, else a copy); False when it
        is not cached or changed since it was cached (then it is dropped)."""
        with self._lock:
            entry = self._entries.get(sha256)
            if entry is None:
                return False
            path, stamp = entry
            try:
                unchanged = _stamp(path) == stamp
            except OSError:
                unchanged = False
            if not unchanged:
                self._drop(sha256)
                return False
            self._users.setdefault(sha256, set()).add(location)
        _link_or_copy(path, target)
        return True

    def fetch(
        self,
        location: str,
        where: str,
        sha256: str,
        size: int,
        read: Callable[[Callable[[bytes], None]], None],
    ) -> str:
        """Download the object ``where`` (its name, for messages) of ``location``:
        ``read(write)`` calls ``write(chunk)`` with its bytes in order; they are hashed
        on the way and kept if they are ``size`` bytes with SHA-256 ``sha256``. Returns
        the cached path.

        Raises ValueError naming the object when they are not."""
        with self._lock:
            path = self._path(sha256)
        partial = f"{path}.part-{threading.get_ident()}"
        digest, written = hashlib.sha256(), 0
        try:
            with open(partial, "wb") as out:

                def write(chunk: bytes) -> None:
                    nonlocal written
                    digest.update(chunk)
                    written += len(chunk)
                    out.write(chunk)

                read(write)
            if written != size or digest.hexdigest() != sha256:
                raise ValueError(
                    f"{where} does not match its SHA-256 in the manifest ({written} bytes, the "
                    f"manifest says {size}): the stored file is corrupt"
                )
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        with self._lock:
            self._entries[sha256] = (path, _stamp(path))
            self._users.setdefault(sha256, set()).add(location)
        return path

    def retain(self, location: str, keep: Iterable[str]) -> None:
        """``location`` needs only the objects ``keep``: drop the others it kept (an
        entry goes when no location keeps it)."""
        wanted = set(keep)
        with self._lock:
            for sha256, users in list(self._users.items()):
                if location in users and sha256 not in wanted:
                    users.discard(location)
                    if not users:
                        self._drop(sha256)

    def _drop(self, sha256: str) -> None:
        entry = self._entries.pop(sha256, None)
        self._users.pop(sha256, None)
        if entry is not None:
            try:
                os.remove(entry[0])
            except OSError:
                pass

    def clear(self) -> None:
        """Drop every entry and the directory."""
        with self._lock:
            self._entries.clear()
            self._users.clear()
            directory, self._directory = self._directory, None
        scratch.remove(directory)

    def __len__(self) -> int:
        return len(self._entries)


CACHE = ObjectCache()


def _stamp(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return (info.st_size, info.st_mtime_ns)


def _link_or_copy(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
