"""Where checkpoints live: a local directory or an object store URI (``pyarrow.fs``).

``CheckpointStore.at(location)`` takes a local path or a URI (``file://``,
``s3://bucket/prefix``, anything ``pyarrow.fs.FileSystem.from_uri`` resolves;
S3 reads ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION`` when the call is made). The layout is the same everywhere,
``<location>/chk-<id>/`` with the manifest inside (``aec.checkpoint.files``).

Commit rule. A local directory commits a checkpoint by renaming its staging
directory (``files.write``). An object store has no atomic rename, so the
checkpoint is staged in a local temporary directory (the backend snapshots
there), every file is uploaded, and the manifest is uploaded last: the
manifest is the commit. A directory without a manifest is incomplete: never
listed by ``latest``, refused by ``local_copy`` with ``ValueError``. A failed
upload removes what it uploaded (best effort; without a manifest a leftover
is inert anyway).

Incremental checkpoints on object stores (``aec.checkpoint.shared``). The files a
backend wrote are content-addressed objects under ``<location>/shared/``: one
already in the store, verified by this process and unchanged since, is
referenced by the new manifest instead of uploaded again. ``delete`` removes a
checkpoint (its manifest first) and then every shared object no committed
checkpoint references (``collect_garbage``); ``retain(n)`` keeps the newest
``n``. ``local_copy`` downloads a checkpoint's own files and the objects it
references (those this process holds already are linked from its object cache).

A location string with a scheme (``name://``) is never taken as a local path:
a scheme ``pyarrow.fs`` cannot resolve raises ``ValueError`` naming it.

Bounded waits. Every object-store call goes through ``CheckpointStore._call``:
an S3 file system gets the connect and request timeouts and the attempts of
``aec.timeouts.store_timeouts()`` (pyarrow's ``S3FileSystem`` options), so a
stalled store fails the call after about ``request * attempts`` seconds with a
``CheckpointStorageError`` naming the store, the operation and the path; a call
slower than ``slow_request`` seconds is logged (logger ``aec.checkpoint.storage``,
WARNING). Other schemes keep their library's own timeouts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import unquote, urlparse

from aec.checkpoint import files, shared
from aec.checkpoint.files import MANIFEST, STAGED_CHECKPOINT, CheckpointHandle, OperatorState
from aec.checkpoint.shared import SharedRegistry, Stamp
from aec.checkpoint.signing import SIGNATURE
from aec.errors import needs_extra
from aec.state import scratch
from aec.timeouts import StoreTimeouts, store_timeouts

if TYPE_CHECKING:
    import pyarrow.fs as pafs  # type: ignore[import-untyped]  # pyarrow ships no type hints

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_CHUNK = 1 << 20  # bytes per upload/download write
_STAGING = ".uploading"  # beside a whole file until it is copied over (``_put_whole``)
# how pyarrow's S3 client (curl under the AWS SDK) reports a request that timed out
_TIMED_OUT = re.compile(r"curlCode: 28|Timeout was reached|timed out", re.IGNORECASE)
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class CheckpointStorageError(OSError):
    """The checkpoint store failed (unreachable, access denied, a write failed).

    The message names the location; the store's own error is ``__cause__``.
    Nothing was committed: no manifest was written.
    """


def is_uri(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` has a URI scheme (``name://...``)."""
    return isinstance(location, str) and _SCHEME.match(location) is not None


def resolve_filesystem(
    uri: str, timeouts: StoreTimeouts | None = None
) -> tuple[pafs.FileSystem, str]:
    """``pyarrow.fs.FileSystem.from_uri(uri)``: the file system and the path in it.

    Read on every call, so the AWS variables of the moment apply. An S3 file
    system gets ``timeouts`` (default ``store_timeouts()``): connect and request
    timeouts and a standard retry strategy of ``attempts`` tries. Tests replace
    it to wrap the file system (fault injection).

    Raises:
        ValueError: the scheme is not one ``pyarrow.fs`` resolves (named), or the
            URI is malformed for it.
    """
    scheme = _SCHEME.match(uri)
    name = scheme.group(1) if scheme else "?"
    with needs_extra("s3", f"checkpoints at {name}:// URIs", "pyarrow"):
        import pyarrow.fs as pafs
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError, TypeError) as exc:  # ArrowInvalid is a ValueError
        raise ValueError(
            f"checkpoint location {uri!r}: the scheme {name!r} cannot be resolved by "
            f"pyarrow.fs ({_first_line(exc)}); use a local path, file://, s3://, gs://, ..."
        ) from exc
    if isinstance(fs, pafs.S3FileSystem):
        fs = _s3_with_timeouts(fs, timeouts or store_timeouts())
    return fs, path


def _s3_with_timeouts(fs: pafs.S3FileSystem, timeouts: StoreTimeouts) -> pafs.S3FileSystem:
    """The same S3 file system (endpoint, region, credentials as ``from_uri`` found
    them) with bounded waits. ``from_uri`` takes no timeouts, so the options it
    resolved (its pickling arguments) are passed to a new ``S3FileSystem``."""
    import pyarrow.fs as pafs

    options = dict(fs.__reduce__()[1][0])
    proxy = options.pop("proxy_options", None) or {}
    if proxy.get("host"):
        options["proxy_options"] = proxy
    for name in ("region", "role_arn", "session_name", "external_id", "tls_ca_file_path"):
        if not options.get(name):
            options.pop(name, None)  # unset: the SDK's own resolution
    options.update(
        connect_timeout=timeouts.connect,
        request_timeout=timeouts.request,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=timeouts.attempts),
    )
    return pafs.S3FileSystem(**options)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


class CheckpointStore:
    """The checkpoints under one location: list, write, delete, small side files.

    Attributes:
        location: the location as a string (an absolute path, or the URI given).
        local: True for a local directory (atomic-rename commits).
    """

    def __init__(
        self,
        location: str,
        fs: pafs.FileSystem | None,
        root: str,
        local: bool,
        timeouts: StoreTimeouts | None = None,
    ) -> None:
        # a local directory is read and written with os (no pyarrow: the engine-only
        # install checkpoints locally); ``fs`` is the object store's file system
        self.location = location
        self.fs = fs
        self.root = root
        self.local = local
        self.timeouts = timeouts or StoreTimeouts()  # what ``fs`` was built with

    @property
    def _remote(self) -> pafs.FileSystem:
        """``fs`` of an object store (not ``local``: never None)."""
        return cast("pafs.FileSystem", self.fs)

    @classmethod
    def at(cls, location: str | os.PathLike[str]) -> CheckpointStore:
        """The store at ``location`` (a path, ``file://`` or another URI).

        Raises:
            TypeError: ``location`` is not a str or path.
            ValueError: an unresolvable scheme or an empty location.
        """
        if not isinstance(location, (str, os.PathLike)):
            raise TypeError(f"directory must be a path or URI, got {type(location).__name__}")
        text = os.fspath(location)
        if not isinstance(text, str) or not text:
            raise ValueError(f"directory must be a non-empty path or URI, got {location!r}")
        if is_uri(text):
            if text.lower().startswith("file://"):
                path = os.path.abspath(unquote(urlparse(text).path))
                return cls(path, None, path, True)
            timeouts = store_timeouts()
            fs, root = resolve_filesystem(text, timeouts)
            if type(fs).__name__ == "LocalFileSystem":
                return cls(os.path.abspath(root), None, os.path.abspath(root), True)
            return cls(text.rstrip("/"), fs, root.rstrip("/"), False, timeouts)
        path = os.path.abspath(text)
        return cls(path, None, path, True)

    # -- names ------------------------------------------------------------------------------
    def name_of(self, *parts: str) -> str:
        """The location (path or URI) of ``parts`` under this store."""
        if self.local:
            return os.path.join(self.location, *parts)
        return "/".join([self.location, *parts])

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def child(self, *parts: str) -> CheckpointStore:
        """The store at a sub-directory."""
        return CheckpointStore(
            self.name_of(*parts), self.fs, self._path(*parts), self.local, self.timeouts
        )

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint_ids(self, complete: bool = True) -> list[int]:
        """Ids of the ``chk-<id>`` directories, ascending; with ``complete`` only those
        with a manifest (the committed ones). An object store answers with one listing."""
        if complete and not self.local:
            found = {
                int(path[4 : -len(MANIFEST) - 1])
                for path in self.stored_files()
                if path.startswith("chk-")
                and path.endswith(f"/{MANIFEST}")
                and path[4 : -len(MANIFEST) - 1].isdigit()
            }
            return sorted(found)
        ids = []
        for name in self.list_names():
            number = name[4:] if name.startswith("chk-") else ""
            if number.isdigit() and (not complete or self.exists(name, MANIFEST)):
                ids.append(int(number))
        return sorted(ids)

    def latest(self) -> CheckpointHandle | None:
        """The committed checkpoint (manifest present) with the highest id, or None."""
        ids = self.checkpoint_ids()
        return CheckpointHandle(ids[-1], self.name_of(f"chk-{ids[-1]}")) if ids else None

    def prepare(self, checkpoint_id: Any) -> str:
        """Check a snapshot's arguments before anything runs; the target location.

        Raises TypeError/ValueError (a bad id), FileExistsError (``chk-<id>`` exists,
        complete or not), NotADirectoryError (a local location that is a file),
        CheckpointStorageError (the store cannot be reached).
        """
        files.check_checkpoint_id(checkpoint_id)
        if self.local and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(
                f"checkpoint directory {self.root} is a file, not a directory"
            )
        target = self.name_of(f"chk-{checkpoint_id}")
        if self.exists(f"chk-{checkpoint_id}"):
            raise FileExistsError(
                f"checkpoint {checkpoint_id} already exists at {target}; checkpoint ids are "
                "never reused (delete it first to take it again; on an object store its "
                "files stay while a later checkpoint references them: take another id)"
            )
        return target

    def write(self, checkpoint_id: int, backend: Any, state: OperatorState) -> CheckpointHandle:
        """Write checkpoint ``checkpoint_id``: locally by ``files.write`` (atomic rename);
        on an object store staged locally, uploaded, manifest last.

        Raises what ``files.write`` raises (backend, pickling, local disk) and
        ``CheckpointStorageError`` when the upload fails (nothing committed).
        """
        return self._write_with(
            checkpoint_id,
            lambda target, annotate: files.write(target, checkpoint_id, backend, state, annotate),
        )

    def write_files(self, checkpoint_id: int, contents: dict[str, bytes]) -> CheckpointHandle:
        """Write checkpoint ``checkpoint_id`` made of the given files (``name -> bytes``),
        committed like ``write`` (operators without keyed state: async I/O)."""
        return self._write_with(
            checkpoint_id,
            lambda target, _: files.write_files(target, checkpoint_id, contents),
        )

    def _write_with(
        self,
        checkpoint_id: int,
        write: Callable[[str, files.Annotate | None], CheckpointHandle],
    ) -> CheckpointHandle:
        """``write(local_target, annotate)`` commits locally; on an object store it
        stages in a temporary directory, backend files that committed checkpoints
        stored already referenced instead of uploaded (``aec.checkpoint.shared``), then
        the rest is uploaded, the manifest last."""
        if self.local:
            return write(files.checkpoint_path(self.location, checkpoint_id), None)
        name = f"chk-{checkpoint_id}"
        registry = self.registry()
        with registry.lock:
            self._sync(registry)
            reuse = registry.reusable(self.stamps(registry.candidates()))
            staging = scratch.make("aec-stage-")  # swept after a kill (aec.state.scratch)
            try:
                local = write(
                    os.path.join(staging, name), registry.annotate(checkpoint_id, reuse)
                )
                self._upload(local.path, name, checkpoint_id, registry)
            finally:
                scratch.remove(staging)
        return CheckpointHandle(checkpoint_id, self.name_of(name))

    def _upload(self, source: str, name: str, checkpoint_id: int, registry: SharedRegistry) -> None:
        """Upload a staged checkpoint: its own files (but those its manifest references
        elsewhere), the signature, then the manifest (the commit); the stamps of its
        backend files are noted before the commit (``SharedRegistry.verified``). A
        failure deletes what was uploaded and raises ``CheckpointStorageError``."""
        with open(os.path.join(source, MANIFEST), "rb") as src:
            manifest = json.loads(src.read())
        entries = manifest["files"]
        listed = [n for n in files.list_files(source) if n not in (MANIFEST, SIGNATURE)]
        own = [n for n in listed if "object" not in entries.get(n, {})]
        signature = [SIGNATURE] if os.path.exists(os.path.join(source, SIGNATURE)) else []
        objects = shared.backend_objects(checkpoint_id, manifest)
        uploads = {p: sha for p, sha in objects.items() if p.startswith(f"{name}/")}
        try:
            for relative in own:
                self._put(os.path.join(source, relative), self._path(name, relative))
            stamps = self.stamps(list(uploads))
            gone = sorted(path for path in uploads if stamps.get(path) is None)
            if gone:  # deleted since their upload (another writer's garbage collection)
                raise FileNotFoundError(f"uploaded files vanished before the commit: {gone}")
            for relative in signature:
                self._put(os.path.join(source, relative), self._path(name, relative))
            # the manifest last, whole or not at all: the commit
            with open(os.path.join(source, MANIFEST), "rb") as src:
                self._put_whole(self._path(name, MANIFEST), src.read())
        except Exception as exc:
            with contextlib.suppress(Exception):
                path = self._path(name)
                self._call("delete", path, functools.partial(self._remote.delete_dir, path))
            raise CheckpointStorageError(
                f"uploading checkpoint {self.name_of(name)} failed, nothing committed: {exc}"
            ) from exc
        registry.committed(checkpoint_id, objects)
        for path, sha256 in uploads.items():
            stamp = stamps.get(path)
            if stamp is not None:
                registry.verified[path] = (sha256, stamp)
                local = os.path.join(source, *path[len(name) + 1 :].split("/"))
                shared.CACHE.keep(self.location, sha256, local)

    def _put(self, source: str, path: str) -> None:
        def put() -> None:
            with open(source, "rb") as src, self._remote.open_output_stream(path) as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)

        self._call("upload", path, put)

    def _put_whole(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` on the object store so that ``path`` holds all of
        it or nothing: uploaded beside it, then copied over (one server-side copy). An
        output stream cannot be abandoned: closed on the way out of an interrupt (or by
        its destructor), it stores what was written so far, under its name."""
        staging = f"{path}{_STAGING}"

        def upload() -> None:
            with self._remote.open_output_stream(staging) as out:
                out.write(data)

        self._call("write", staging, upload)
        self._call("commit", path, functools.partial(self._remote.copy_file, staging, path))
        self._call("delete", staging, functools.partial(self._remote.delete_file, staging))

    # -- incremental checkpoints (aec.checkpoint.shared) -----------------------------------------
    def registry(self) -> SharedRegistry:
        """This process's registry of the checkpoint files stored at this location."""
        return shared.registry(self.location)

    def _sync(self, registry: SharedRegistry) -> None:
        """Bring ``registry`` up to the committed checkpoints now in the store."""
        registry.sync(self.checkpoint_ids(), self._manifest_of)

    def _manifest_of(self, checkpoint_id: int) -> dict[str, Any]:
        data = self.read_bytes(f"chk-{checkpoint_id}", MANIFEST)
        try:
            manifest = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if not isinstance(manifest, dict):
            raise ValueError("not a manifest")
        return manifest

    def stored_files(self) -> dict[str, tuple[int, int]]:
        """``{relative path: (size, mtime_ns)}`` of every file under this location, as
        the store reports them (one recursive listing; {} when there is none)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.root, recursive=True, allow_not_found=True)
        infos = self._call("list", self.root, lambda: self._remote.get_file_info(selector))
        return {
            info.path[len(self.root) :].lstrip("/"): (info.size, info.mtime_ns)
            for info in infos
            if info.type == pafs.FileType.File
        }

    def collect_garbage(self) -> list[str]:
        """Delete every file under a ``chk-<id>`` that is not committed (no manifest)
        unless a committed checkpoint references it: what deleted checkpoints leave
        and what an upload that never committed left. The paths deleted (relative).
        Nothing is deleted while a committed manifest cannot be read (its references
        are unknown). Local stores hold no references (they hard-link): [].
        One writer per location at a time: an upload in progress elsewhere would lose
        its files.

        Raises CheckpointStorageError when the store fails.
        """
        return self._collect_garbage(fresh=True)

    def _collect_garbage(self, fresh: bool) -> list[str]:
        """``collect_garbage``; ``fresh``: read every committed manifest again (False
        right after a caller read them all: ``retain``)."""
        if self.local:
            return []
        registry = self.registry()
        with registry.lock:
            registry.sync(self.checkpoint_ids(), self._manifest_of, fresh=fresh)
            doomed = registry.garbage(self.stored_files())
            for relative in doomed:
                path = self._path(relative)
                self._call("delete", path, functools.partial(self._remote.delete_file, path))
                registry.forget(relative)
            for checkpoint_id in {shared.checkpoint_of(p) for p in doomed}:
                name = f"chk-{checkpoint_id}"
                if not self.child(name).stored_files():  # nothing left: no empty marker
                    self.delete_tree(name)
            used = {sha for paths in registry.objects.values() for sha in paths.values()}
            shared.CACHE.retain(self.location, used)
        return doomed

    def retain(self, keep: int) -> list[int]:
        """Keep the ``keep`` committed checkpoints of the highest ids (the newest, as ids
        increase: ``latest`` is the highest too): delete the others, then
        what no kept checkpoint references (``collect_garbage``: on an object store
        also the leftovers of uploads that never committed; locally, directories
        without a manifest, and the staging directories of killed snapshots, older than
        the oldest kept). Flink's
        ``state.checkpoints.num-retained``. The ids of the committed checkpoints deleted.

        Raises ValueError for ``keep < 1``; CheckpointStorageError when the store fails.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        committed = self.checkpoint_ids()
        if len(committed) <= keep:
            return []
        doomed = committed[:-keep]
        if not self.local:
            registry = self.registry()
            with registry.lock:
                registry.sync(committed, self._manifest_of, fresh=True)
                unreadable = sorted(registry.unreadable & set(committed[-keep:]))
            if unreadable:  # the older ones may be the only checkpoints that restore
                _log.warning(
                    "%s: the manifest of checkpoint(s) %s cannot be read; retain deletes "
                    "nothing while a kept checkpoint may not restore", self.location, unreadable,
                )  # fmt: skip
                return []
        for checkpoint_id in doomed:
            self.delete(checkpoint_id, collect=False)
        if self.local:
            for checkpoint_id in self.checkpoint_ids(complete=False):
                if checkpoint_id < committed[-keep]:
                    self.delete(checkpoint_id)
            self._remove_stale_staging(committed[-keep])
        self._collect_garbage(fresh=False)  # the manifests kept were read just now
        return doomed

    def _remove_stale_staging(self, oldest_kept: int) -> None:
        """Remove the staging directories (``.chk-<id>.staging-<uuid>``, local stores) of
        ids below ``oldest_kept``: a snapshot killed before its rename left them, and
        none of them can commit any more (a later checkpoint did)."""
        for name in self.list_names():
            match = STAGED_CHECKPOINT.match(name)
            if match and int(match.group(1)) < oldest_kept:
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def delete(self, checkpoint_id: int, collect: bool = True) -> None:
        """Remove ``chk-<id>`` (complete or not) if it exists; the manifest first, so a
        half-deleted checkpoint is never taken for a complete one. On an object store
        its files go then, but those a committed checkpoint references (they go with
        their last reference: ``collect_garbage``, run here unless ``collect`` is
        False: call it after a series of deletes)."""
        name = f"chk-{checkpoint_id}"
        if not self.exists(name):
            return
        self.delete_file(name, MANIFEST)
        if self.local:
            self.delete_tree(name)
        elif collect:
            self.collect_garbage()

    def delete_tree(self, *parts: str) -> None:
        """Remove a directory and everything under it (a no-op when absent)."""
        if self.local:
            shutil.rmtree(self._path(*parts), ignore_errors=True)
        elif self.exists(*parts):
            path = self._path(*parts)
            self._call("delete", path, lambda: self._remote.delete_dir(path))

    # -- small files and listing --------------------------------------------------------------
    def list_names(self) -> list[str]:
        """Names directly under this location ([] if it does not exist)."""
        if self.local:
            return sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.root, allow_not_found=True)
        infos = self._call("list", self.root, lambda: self._remote.get_file_info(selector))
        return sorted(info.base_name for info in infos)

    def exists(self, *parts: str) -> bool:
        if self.local:
            return os.path.exists(self._path(*parts))
        import pyarrow.fs as pafs

        path = self._path(*parts)
        found = self._call("check", path, lambda: self._remote.get_file_info(path).type)
        return cast(bool, found != pafs.FileType.NotFound)

    def read_bytes(self, *parts: str) -> bytes:
        """A whole file; FileNotFoundError naming it when absent."""
        if not self.exists(*parts):
            raise FileNotFoundError(f"{self.name_of(*parts)} does not exist")
        if self.local:
            with open(self._path(*parts), "rb") as local:
                return local.read()
        path = self._path(*parts)

        def read() -> bytes:
            with self._remote.open_input_stream(path) as src:
                data: bytes = src.read()
                return data

        return self._call("read", path, read)

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Write a whole file, replacing it atomically (a rename locally, one PUT on
        an object store)."""
        path = self._path(*parts)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            staging = f"{path}.tmp"
            with open(staging, "wb") as out:
                out.write(data)
            os.replace(staging, path)
            return

        self._put_whole(path, data)

    def delete_file(self, *parts: str) -> None:
        """Remove a file if present."""
        if not self.exists(*parts):
            return
        if self.local:
            os.remove(self._path(*parts))
        else:
            path = self._path(*parts)
            self._call("delete", path, lambda: self._remote.delete_file(path))

    def _call(self, operation: str, path: str, call: Callable[[], _T]) -> _T:
        """One object-store request: timed (logged above ``timeouts.slow_request``),
        its failure raised as ``CheckpointStorageError`` naming the store, the
        operation and the path (a stalled store: "got no answer within ...").
        ``FileNotFoundError`` passes through (absent is an answer)."""
        started = time.monotonic()
        try:
            return call()
        except FileNotFoundError:
            raise
        except OSError as exc:
            elapsed = time.monotonic() - started
            if _TIMED_OUT.search(str(exc)):
                raise CheckpointStorageError(
                    f"checkpoint store {self.location} stalled: {operation} of {path} got no "
                    f"answer within {self.timeouts.describe()} ({elapsed:.1f} s; "
                    f"{_first_line(exc)})"
                ) from exc
            raise CheckpointStorageError(
                f"checkpoint store {self.location} is unreachable or refused access "
                f"({operation} {path}): {exc}"
            ) from exc
        finally:
            elapsed = time.monotonic() - started
            if elapsed > self.timeouts.slow_request:
                _log.warning(
                    "slow checkpoint store request: %s of %s on %s took %.2f s (threshold %g s)",
                    operation, path, self.location, elapsed, self.timeouts.slow_request,
                )  # fmt: skip

    def download(self, local: str, skip: tuple[str, ...] = ()) -> None:
        """Copy every file under this location into the local directory ``local``
        (but those named in ``skip``, relative paths)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.root, recursive=True)
        for info in self._call("list", self.root, lambda: self._remote.get_file_info(selector)):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(self.root) :].lstrip("/")
            if relative in skip or relative.endswith(_STAGING):  # a whole file's upload
                continue
            destination = os.path.join(local, *relative.split("/"))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            self._call(
                "download", info.path, functools.partial(self._fetch, info.path, destination)
            )

    def _fetch(self, path: str, destination: str) -> None:
        with self._remote.open_input_stream(path) as src, open(destination, "wb") as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)

    def fetch_object(self, path: str, sha256: str, size: int, destination: str) -> None:
        """Put the stored file ``path`` (relative to this location; ``size`` bytes with
        SHA-256 ``sha256``) at the local path ``destination``: from this process's
        object cache when it holds those bytes unchanged, else downloaded, hashed on
        the way and cached (the registry notes it verified).

        Raises ValueError naming the file when it is missing or does not match its
        SHA-256 and size; CheckpointStorageError when the store fails.
        """
        if shared.CACHE.link(self.location, sha256, destination):
            return
        where, full = self.name_of(*path.split("/")), self._path(path)
        stamp = self._stamp(full)
        if stamp is None:
            raise ValueError(f"{where} is missing: a file the checkpoint references was deleted")

        def read(write: Callable[[bytes], None]) -> None:
            with self._remote.open_input_stream(full) as src:
                while chunk := src.read(_CHUNK):
                    write(chunk)

        shared.CACHE.fetch(
            self.location, where, sha256, size,
            lambda write: self._call("download", full, lambda: read(write)),
        )  # fmt: skip
        self.registry().verified[path] = (sha256, stamp)
        if not shared.CACHE.link(self.location, sha256, destination):
            raise CheckpointStorageError(f"{where}: keeping a local copy failed")

    def _stamp(self, path: str) -> Stamp | None:
        """A stored file's ``Stamp``: its size and ETag (S3: a digest of its bytes, so
        any change of content changes it), or its mtime where the store has no ETag;
        None when it is absent. One request (a HEAD on S3)."""
        import pyarrow.fs as pafs

        def head() -> Stamp | None:
            try:
                with self._remote.open_input_file(path) as src:
                    size, metadata = src.size(), src.metadata()
            except FileNotFoundError:
                return None
            etag = metadata.get("ETag") if metadata is not None else None
            if etag:
                return (size, etag.decode() if isinstance(etag, bytes) else str(etag))
            info = self._remote.get_file_info(path)
            if info.type != pafs.FileType.File:
                return None
            return (info.size, f"mtime:{info.mtime_ns}")

        return self._call("check", path, head)

    def stamps(self, paths: list[str]) -> dict[str, Stamp | None]:
        """``{path: Stamp or None}`` of stored files (relative to this location), asked
        concurrently (one request each)."""
        if not paths:
            return {}
        with concurrent.futures.ThreadPoolExecutor(min(8, len(paths))) as pool:
            found = pool.map(lambda p: self._stamp(self._path(*p.split("/"))), paths)
            return dict(zip(paths, found, strict=True))


@contextlib.contextmanager
def local_copy(handle: CheckpointHandle | str | os.PathLike[str]) -> Iterator[str]:
    """A local directory holding checkpoint ``handle`` (a handle, path or URI of a
    ``chk-<id>`` directory), for ``files.read``. Local checkpoints are used in place;
    remote ones are downloaded to a temporary directory, removed on exit.

    Raises:
        TypeError: ``handle`` is not a handle, path or URI.
        FileNotFoundError: nothing at a remote location.
        ValueError: a remote ``chk-<id>`` without manifest (incomplete), or an
            unresolvable scheme.
        CheckpointStorageError: the store cannot be reached or read.
    """
    location = handle.path if isinstance(handle, CheckpointHandle) else handle
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(
            f"restore takes a CheckpointHandle or a checkpoint path, got {type(handle).__name__}"
        )
    text = os.fspath(location)
    if not is_uri(text):
        yield text
        return
    parent, _, name = text.rstrip("/").rpartition("/")
    store = CheckpointStore.at(parent).child(name)
    if store.local:
        yield store.location
        return
    if not store.exists(MANIFEST):
        if not store.list_names():
            raise FileNotFoundError(f"no checkpoint at {store.location}")
        raise ValueError(
            f"{store.name_of(MANIFEST)} is missing: {store.location} is an incomplete "
            "checkpoint (not committed)"
        )
    data = store.read_bytes(MANIFEST)
    signature = store.read_bytes(SIGNATURE) if store.exists(SIGNATURE) else None
    manifest = files.parse_manifest(store.location, data, signature)  # signature first
    parent_store = CheckpointStore.at(parent)
    target = scratch.make("aec-restore-")  # swept after a kill (aec.state.scratch)
    try:
        local = os.path.join(target, name)
        try:
            objects = shared.backend_files(manifest)
        except ValueError as exc:
            raise ValueError(f"{store.name_of(MANIFEST)}: {exc}") from None
        # a backend file (its own or another checkpoint's) through the object cache,
        # hashed on the way; the rest downloaded as is; all verified by ``files.read``
        store.download(local, skip=(MANIFEST, *objects))
        with open(os.path.join(local, MANIFEST), "wb") as out:
            out.write(data)  # the bytes checked above are the ones verified and parsed
        for relative, (path, sha256, size) in objects.items():
            parent_store.fetch_object(path, sha256, size, os.path.join(local, *relative.split("/")))
        yield local
    finally:
        scratch.remove(target)


def latest_checkpoint(directory: str | os.PathLike[str]) -> CheckpointHandle | None:
    """The committed checkpoint (manifest present) with the highest id under
    ``directory`` (a path or URI), or None. ``restore`` still verifies it."""
    return CheckpointStore.at(directory).latest()
