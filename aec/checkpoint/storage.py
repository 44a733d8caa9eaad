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

import contextlib
import functools
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import unquote, urlparse

from aec.checkpoint import files
from aec.checkpoint.files import MANIFEST, CheckpointHandle, OperatorState
from aec.errors import needs_extra
from aec.state import scratch
from aec.timeouts import StoreTimeouts, store_timeouts

if TYPE_CHECKING:
    import pyarrow.fs as pafs  # type: ignore[import-untyped]  # pyarrow ships no type hints

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_CHUNK = 1 << 20  # bytes per upload/download write
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
        with a manifest (the committed ones)."""
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
        complete or not), CheckpointStorageError (the store cannot be reached).
        """
        files.check_checkpoint_id(checkpoint_id)
        target = self.name_of(f"chk-{checkpoint_id}")
        if self.exists(f"chk-{checkpoint_id}"):
            raise FileExistsError(
                f"checkpoint {checkpoint_id} already exists at {target}; checkpoint ids are "
                "never reused (delete it first to take it again)"
            )
        return target

    def write(self, checkpoint_id: int, backend: Any, state: OperatorState) -> CheckpointHandle:
        """Write checkpoint ``checkpoint_id``: locally by ``files.write`` (atomic rename);
        on an object store staged locally, uploaded, manifest last.

        Raises what ``files.write`` raises (backend, pickling, local disk) and
        ``CheckpointStorageError`` when the upload fails (nothing committed).
        """
        return self._write_with(
            checkpoint_id, lambda target: files.write(target, checkpoint_id, backend, state)
        )

    def write_files(self, checkpoint_id: int, contents: dict[str, bytes]) -> CheckpointHandle:
        """Write checkpoint ``checkpoint_id`` made of the given files (``name -> bytes``),
        committed like ``write`` (operators without keyed state: async I/O)."""
        return self._write_with(
            checkpoint_id, lambda target: files.write_files(target, checkpoint_id, contents)
        )

    def _write_with(
        self, checkpoint_id: int, write: Callable[[str], CheckpointHandle]
    ) -> CheckpointHandle:
        """``write(local_target)`` commits locally; on an object store it stages in a
        temporary directory, then the files are uploaded, the manifest last."""
        if self.local:
            return write(files.checkpoint_path(self.location, checkpoint_id))
        name = f"chk-{checkpoint_id}"
        staging = scratch.make("aec-stage-")  # swept after a kill (aec.state.scratch)
        try:
            local = write(os.path.join(staging, name))
            self._upload(local.path, name)
        finally:
            scratch.remove(staging)
        return CheckpointHandle(checkpoint_id, self.name_of(name))

    def _upload(self, source: str, name: str) -> None:
        listed = [f for f in files.list_files(source) if f != MANIFEST]
        try:
            for relative in [*listed, MANIFEST]:  # the manifest last: the commit
                self._put(os.path.join(source, relative), self._path(name, relative))
        except Exception as exc:
            with contextlib.suppress(Exception):
                path = self._path(name)
                self._call("delete", path, functools.partial(self._remote.delete_dir, path))
            raise CheckpointStorageError(
                f"uploading checkpoint {self.name_of(name)} failed, nothing committed: {exc}"
            ) from exc

    def _put(self, source: str, path: str) -> None:
        def put() -> None:
            with open(source, "rb") as src, self._remote.open_output_stream(path) as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)

        self._call("upload", path, put)

    def delete(self, checkpoint_id: int) -> None:
        """Remove ``chk-<id>`` (complete or not) if it exists; the manifest first, so a
        half-deleted checkpoint is never taken for a complete one."""
        name = f"chk-{checkpoint_id}"
        if not self.exists(name):
            return
        self.delete_file(name, MANIFEST)
        self.delete_tree(name)

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

        def write() -> None:
            with self._remote.open_output_stream(path) as out:
                out.write(data)

        self._call("write", path, write)

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

    def download(self, local: str) -> None:
        """Copy every file under this location into the local directory ``local``."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.root, recursive=True)
        for info in self._call("list", self.root, lambda: self._remote.get_file_info(selector)):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(self.root) :].lstrip("/")
            destination = os.path.join(local, *relative.split("/"))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            self._call(
                "download", info.path, functools.partial(self._fetch, info.path, destination)
            )

    def _fetch(self, path: str, destination: str) -> None:
        with self._remote.open_input_stream(path) as src, open(destination, "wb") as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)


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
    target = scratch.make("aec-restore-")  # swept after a kill (aec.state.scratch)
    try:
        local = os.path.join(target, name)
        store.download(local)
        yield local
    finally:
        scratch.remove(target)


def latest_checkpoint(directory: str | os.PathLike[str]) -> CheckpointHandle | None:
    """The committed checkpoint (manifest present) with the highest id under
    ``directory`` (a path or URI), or None. ``restore`` still verifies it."""
    return CheckpointStore.at(directory).latest()
