"""A ``pyarrow.fs`` file system that counts and fails writes, for checkpoint store tests
and the S3 benchmark: ``StoreFaults(inner, fail_at=k)`` delegates to ``inner`` and
fails its k-th write (opening an output stream, or with ``midway`` its first write
to the stream, which then stores what it got when closed) with ``OSError``, or, with
``crash=True``, with ``Crash``: a ``BaseException`` no cleanup code catches, as a
killed process leaves things. ``install(monkeypatch, ...)`` makes every checkpoint
store use it (``aec.checkpoint.storage.resolve_filesystem``).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs

from aec.checkpoint import storage


class Crash(BaseException):
    """The process died here: nothing after it runs (no ``except Exception``)."""


class StoreFaults(pafs.FileSystemHandler):
    """Delegates to ``inner``; counts writes (``writes``) and bytes written
    (``written``); fails write number ``fail_at`` (1-based; None: never)."""

    def __init__(
        self,
        inner: pafs.FileSystem,
        fail_at: int | None = None,
        crash: bool = False,
        midway: bool = False,
    ):
        self.inner, self.fail_at, self.crash, self.midway = inner, fail_at, crash, midway
        self.writes = 0
        self.written = 0
        self.paths: list[str] = []

    def open_output_stream(self, path, metadata):
        self.writes += 1
        failing = self.writes == self.fail_at
        message = f"injected failure on write {self.writes} ({path})"
        if failing and not self.midway:
            raise Crash(message) if self.crash else OSError(message)
        self.paths.append(path)
        stream = self.inner.open_output_stream(path, metadata=metadata)
        counted = _Counted(self, stream)
        if failing:  # the stream opened, then its first write fails
            counted.failure = Crash(message) if self.crash else OSError(message)
        return pa.PythonFile(counted, mode="w")

    def get_type_name(self):
        return "faults-" + self.inner.type_name

    def get_file_info(self, paths):
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.inner.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path):
        self.inner.delete_file(path)

    def move(self, src, dest):
        self.inner.move(src, dest)

    def copy_file(self, src, dest):
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.inner.open_input_stream(path)

    def open_input_file(self, path):
        return self.inner.open_input_file(path)

    def open_append_stream(self, path, metadata):
        return self.inner.open_append_stream(path, metadata=metadata)

    def normalize_path(self, path):
        return self.inner.normalize_path(path)

    def equals(self, other):
        return self is other


class _Counted:
    """A writable file object over ``stream`` that adds the bytes written to its
    handler's ``written`` (wrapped by ``pyarrow.PythonFile``)."""

    def __init__(self, handler: StoreFaults, stream) -> None:
        self.handler, self.stream = handler, stream
        # raised by the first write; closing still stores what was written (nothing),
        # as an object store's stream closed on the way out of an interrupt does
        self.failure: BaseException | None = None

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def write(self, data) -> int:
        if self.failure is not None:
            raise self.failure
        self.handler.written += len(data)
        return self.stream.write(data)

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        self.stream.close()


def install(
    monkeypatch, fail_at: int | None = None, crash: bool = False, midway: bool = False
) -> list[StoreFaults]:
    """Make every checkpoint store resolve its file system through a new
    ``StoreFaults`` (one per resolution); the handlers made, newest last. ``midway``:
    the failing write opens its stream and fails at its first write instead."""
    real = storage.resolve_filesystem
    made: list[StoreFaults] = []

    def resolve(uri, timeouts=None):
        fs, path = real(uri, timeouts)
        made.append(StoreFaults(fs, fail_at, crash, midway))
        return pafs.PyFileSystem(made[-1]), path

    monkeypatch.setattr(storage, "resolve_filesystem", resolve)
    return made
