"""Checkpoints of a ``KeyedProcessOperator``: the on-disk format (docs/semantics.md rule 9).

The operator drains itself (FLIP-425: in-flight records to zero before the
snapshot, like Flink's ``AbstractAsyncStateStreamOperator`` before its
barrier) and hands this module its backend and an ``OperatorState``; this
module plays the part of Flink's ``StreamOperatorStateHandler`` (keyed state
and, as ``InternalTimeServiceManager`` does, the timers of every key): it
stages the files, checksums them and commits them atomically, and on restore
verifies everything before anything is parsed or applied. The layout of
checkpoint ``n`` under ``directory``::

    directory/chk-<n>/
        backend/        what ``backend.snapshot(dir)`` wrote (any files)
        timers.msgpack  event-time and processing-time timer queues (msgpack)
        in-flight.msgpack  records a checkpoint that did not drain carries (only then)
        operator.json   watermark, clock reading, epoch, states, counters, config, ...
        MANIFEST.hmac   HMAC-SHA256 of the manifest (with AEC_CHECKPOINT_KEY set)
        MANIFEST.json   every other file: size and SHA-256; written last (on an
                        object store a backend file may be a reference to where an
                        earlier checkpoint stored it: ``aec.checkpoint.shared``)

Invariants:
- A directory named ``chk-<n>`` exists only complete: files are written into
  a staging directory ``.chk-<n>.staging-<uuid>`` beside it, fsynced, the
  manifest last, then the staging directory is renamed (atomic on POSIX
  within one file system). A failure before the rename removes the staging
  directory, so a failed snapshot leaves nothing that looks like a checkpoint.
- A checkpoint is complete iff its manifest is present and every file it
  lists has the listed size and SHA-256, and it has no unlisted files.
  ``read`` checks all of this before it parses anything, and raises
  ``ValueError`` naming the first bad file; it changes nothing. Every file
  has a digest (none is left to the backend); a file this process wrote or
  verified already is checked by identity (``aec.checkpoint.digests``).
- What is parsed or opened is what was verified: the operator's own files are
  read once, and those bytes hashed and parsed; the backend's files are put
  into a private directory and verified there (``aec.checkpoint.private_copy``),
  and the backend restores from that directory, never from the checkpoint's.
- An existing ``chk-<n>`` is never overwritten (checkpoint ids are unique,
  as in Flink): ``write`` (and ``storage.CheckpointStore.prepare``) raise
  ``FileExistsError``.
- Object stores (no atomic rename) and listing: ``aec.checkpoint.storage``.
- Nothing the engine itself reads from a checkpoint can run code: the
  manifest and ``operator.json`` are JSON, the timers msgpack (plain data
  only, ``aec.state.serialization.SAFE``); state values are decoded with the
  serializer each state is registered with (pickle only where a state opted
  in). Checksums detect corruption; tampering is detected with a signing key
  (``aec.checkpoint.signing``: refused before any byte is decoded).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aec.checkpoint import digests, private_copy, signing
from aec.checkpoint.signing import SIGNATURE
from aec.state.serialization import SAFE

_STAGING = ".staging-"  # ``.chk-<id>.staging-<uuid>``: a checkpoint until its rename commits it
# the staging directory of checkpoint <id> (``commit``); one a killed snapshot left stays
STAGED_CHECKPOINT = re.compile(r"^\.chk-(\d+)\.staging-[0-9a-f]+$")

FORMAT = "aec-checkpoint/2"
MANIFEST = "MANIFEST.json"
METADATA = "operator.json"
TIMERS = "timers.msgpack"
IN_FLIGHT = "in-flight.msgpack"  # records a checkpoint that did not drain carries (optional)
BACKEND_DIR = "backend"
_OWN = frozenset({MANIFEST, SIGNATURE})  # the commit's own files, listed nowhere
# marks manifest entries (in place) and returns more manifest fields
Annotate = Callable[[dict[str, dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class CheckpointHandle:
    """Where a completed checkpoint is: small and picklable, for Spark glue to keep.

    Attributes:
        checkpoint_id: the id given to ``snapshot`` (an int >= 0).
        path: absolute path of the checkpoint directory (``.../chk-<id>``).
    """

    checkpoint_id: int
    path: str


@dataclass
class OperatorState:
    """What the operator itself puts in a checkpoint, besides backend state.

    Attributes:
        watermark: the last watermark that arrived (event-time seconds; -inf if none).
        processing_time: the last clock reading (seconds; -inf if never read).
        poll_clock: whether the clock was being read per input element.
        epoch: sequence number of the epoch open at the checkpoint; it
            continues after restore (timers remember their registering epoch).
        record_sequence: the last sequence number given to a record or timer.
        max_parallelism: key groups; a restore must use the same number.
        event_timers / processing_timers: the timer queues (Flink's
            ``InternalTimeServiceManager`` snapshots them with keyed state).
        state_names: the states the function created in ``open()`` (states made later
            on demand, such as a window trigger's, are left out: they depend on the
            data seen); checkpoints merged by a restore must agree on them.
        states: every state made so far, ``{name: {"type": ..., "serializer": ...,
            "ttl": bool}}`` (``aec.checkpoint.state_meta``): a restore refuses a
            live state of the same name with another type, serializer or TTL.
        config: the operator's ``AecConfig`` as a dict (informational).
        counts: records_in, records_out, timers_fired, ... (informational).
        backend: the backend's class name (informational).
        key_group_range: ``(start, end)`` of the key groups the operator owned
            (inclusive, ``aec.keygroups.KeyGroupRange``); None: every key group
            (and what a checkpoint written before rescaling existed reads as).
        input_watermarks: the last watermark of each input of a two-input operator
            (``KeyedCoProcessOperator``; -inf for an input that sent none), whose
            minimum is ``watermark``; None for a one-input operator.
        in_flight: the records a checkpoint that did not drain carries, as the
            runtime serialized them (``aec.runtime.in_flight``); empty otherwise.
    """

    watermark: float | int  # an int stays an int (compiled code: a float is a C double)
    processing_time: float | int
    poll_clock: bool
    epoch: int
    record_sequence: int
    max_parallelism: int
    event_timers: Any  # a TimerQueue: exported on write, loaded by ``load_timers``
    processing_timers: Any
    state_names: list[str] = field(default_factory=list)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    backend: str = ""
    key_group_range: tuple[int, int] | None = None
    input_watermarks: tuple[float | int, ...] | None = None
    in_flight: bytes = b""


@dataclass
class RestoredCheckpoint:
    """A verified checkpoint, parsed: what ``read`` returns.

    Attributes:
        handle: the checkpoint's handle (its id read from the manifest).
        state: the operator's part, with freshly loaded timer queues.
        backend_dir: the directory to pass to ``backend.restore``: the verified
            private copy of the checkpoint's backend files (``read``'s ``private``).
    """

    handle: CheckpointHandle
    state: OperatorState
    backend_dir: str


def check_checkpoint_id(checkpoint_id: Any) -> int:
    """Return ``checkpoint_id`` if it is an int >= 0; TypeError / ValueError otherwise."""
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int):
        raise TypeError(
            f"checkpoint_id must be an int >= 0, got {checkpoint_id!r} "
            f"({type(checkpoint_id).__name__})"
        )
    if checkpoint_id < 0:
        raise ValueError(f"checkpoint_id must be >= 0, got {checkpoint_id}")
    return checkpoint_id


def checkpoint_path(directory: str | os.PathLike[str], checkpoint_id: int) -> str:
    """The absolute path of checkpoint ``checkpoint_id`` under ``directory``."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path, got {type(directory).__name__}")
    return os.path.join(os.path.abspath(os.fspath(directory)), f"chk-{checkpoint_id}")


# -- writing -----------------------------------------------------------------------------------
def write(
    target: str,
    checkpoint_id: int,
    backend: Any,
    state: OperatorState,
    annotate: Annotate | None = None,
) -> CheckpointHandle:
    """Write a complete checkpoint to ``target`` (from ``prepare``) atomically.

    Calls ``backend.snapshot(<staging>/backend)``, writes the timers (msgpack)
    and ``operator.json``, then the manifest (signed with a key set), then
    renames the staging directory to ``target``. The caller has drained the
    operator and flushed the backend. ``annotate``: see ``commit``.

    Raises whatever the backend, encoding (a timer key that is not plain data)
    or the file system raised (and
    ``FileExistsError`` if ``target`` appeared meanwhile), after removing the
    staging directory: no ``target`` is left behind.
    """

    def fill(staging: str) -> None:
        backend_dir = os.path.join(staging, BACKEND_DIR)
        os.mkdir(backend_dir)
        backend.snapshot(backend_dir)
        timers = {
            "event": state.event_timers.export(),
            "processing": state.processing_timers.export(),
        }
        _write_file(staging, TIMERS, SAFE.dumps(timers))
        if state.in_flight:
            _write_file(staging, IN_FLIGHT, state.in_flight)
        _write_file(staging, METADATA, _json_bytes(_metadata(checkpoint_id, state)))

    return commit(target, checkpoint_id, fill, annotate)


def write_files(target: str, checkpoint_id: int, contents: dict[str, bytes]) -> CheckpointHandle:
    """Write a checkpoint made of the given files (``name -> bytes``) to ``target``
    atomically, with the same manifest and commit as ``write`` (used by operators
    without keyed state: ``aec.async_io.AsyncWaitOperator``)."""

    def fill(staging: str) -> None:
        for name, data in contents.items():
            _write_file(staging, name, data)

    return commit(target, checkpoint_id, fill)


def commit(
    target: str,
    checkpoint_id: int,
    fill: Callable[[str], None],
    annotate: Annotate | None = None,
) -> CheckpointHandle:
    """Stage a checkpoint: ``fill(staging_dir)`` writes its files, then the manifest
    (size and SHA-256 of every file) is written last, after its signature when
    ``AEC_CHECKPOINT_KEY`` is set (``aec.checkpoint.signing``), and the staging
    directory is renamed to ``target``. ``annotate(entries)`` may mark manifest
    entries and returns more manifest fields (an object store's shared files,
    ``aec.checkpoint.shared``): the signature covers them too.

    Raises what ``fill`` or the file system raised (``FileExistsError`` if
    ``target`` appeared meanwhile), after removing the staging directory.
    """
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(target)}{_STAGING}{uuid.uuid4().hex}")
    os.mkdir(staging)
    try:
        fill(staging)
        files = {
            name: digests.describe(os.path.join(staging, name)) for name in list_files(staging)
        }
        fields: dict[str, Any] = {"format": FORMAT, "checkpoint_id": checkpoint_id, "files": files}
        if annotate is not None:
            fields.update(annotate(files))
        manifest = _json_bytes(fields)
        key = signing.current_key()
        if key is not None:
            _write_file(staging, SIGNATURE, signing.sign(manifest, key))
        _write_file(staging, MANIFEST, manifest)  # last: the commit record
        _fsync_directory(staging)
        if os.path.lexists(target):  # another writer won the id meanwhile
            raise FileExistsError(f"checkpoint {checkpoint_id} appeared at {target} meanwhile")
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        _fsync_directory(parent)  # the rename is durable once its directory is
    except BaseException:
        # not known to be durable: undone, so a snapshot that fails commits nothing
        shutil.rmtree(target, ignore_errors=True)
        raise
    return CheckpointHandle(checkpoint_id, target)


def _metadata(checkpoint_id: int, state: OperatorState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "checkpoint_id": checkpoint_id,
        "created": time.time(),
        "watermark": _encode_time(state.watermark),
        "processing_time": _encode_time(state.processing_time),
        "poll_clock": state.poll_clock,
        "epoch": state.epoch,
        "record_sequence": state.record_sequence,
        "max_parallelism": state.max_parallelism,
        "state_names": list(state.state_names),
        "states": state.states,
        "config": {k: _encode_time(v) if type(v) is float else v for k, v in state.config.items()},
        "counts": {**state.counts, "event_timers": len(state.event_timers),
                   "processing_timers": len(state.processing_timers)},
        "backend": state.backend,
        "key_group_range": None if state.key_group_range is None else list(state.key_group_range),
        **({} if state.input_watermarks is None
           else {"input_watermarks": [_encode_time(w) for w in state.input_watermarks]}),
    }  # fmt: skip


def _write_file(directory: str, name: str, data: bytes) -> None:
    with open(os.path.join(directory, name), "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _fsync_directory(path: str) -> None:
    """Make a rename or new entries in ``path`` durable.

    File systems that cannot fsync a directory (EINVAL, ENOTSUP, EBADF: some network
    and FUSE mounts) are skipped; any other error (EIO: the data may be lost) raises.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


# -- reading -----------------------------------------------------------------------------------
def read(
    handle: CheckpointHandle | str | os.PathLike[str],
    load_timers: Callable[[Any], Any],
    private: str,
) -> RestoredCheckpoint:
    """Verify and parse a checkpoint; changes nothing but ``private``.

    Args:
        handle: a ``CheckpointHandle`` or the path of a ``chk-<id>`` directory.
        load_timers: builds a timer queue from its exported data (the runtime's
            ``TimerQueue.from_export``); may raise on malformed data.
        private: an empty private directory (``private_copy.directory``) that holds
            the backend's files, verified there (``private_copy.place``), until the
            backend restored from them: what the backend opens is what was verified.

    Raises:
        TypeError: ``handle`` is neither.
        FileNotFoundError: there is no directory at the path.
        ValueError: naming the file: no manifest (an incomplete checkpoint), a
            missing or wrong signature (with ``AEC_CHECKPOINT_KEY`` set), a listed
            file missing, an unlisted file, a size or checksum mismatch, a
            manifest or metadata of another format (an older aec's checkpoint), a
            handle whose id differs from the manifest's, or timers that do not load.
    """
    handle, contents = read_files(handle, (METADATA, TIMERS), (IN_FLIGHT,), private)
    path, checkpoint_id = handle.path, handle.checkpoint_id
    metadata = _parse(path, METADATA, contents[METADATA], json.loads)
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{os.path.join(path, METADATA)} is not {FORMAT} operator metadata")
    timers = _parse(path, TIMERS, contents[TIMERS], SAFE.loads)
    try:
        state = OperatorState(
            watermark=_decode_time(metadata["watermark"]),
            processing_time=_decode_time(metadata["processing_time"]),
            poll_clock=bool(metadata["poll_clock"]),
            epoch=int(metadata["epoch"]),
            record_sequence=int(metadata["record_sequence"]),
            max_parallelism=int(metadata["max_parallelism"]),
            event_timers=load_timers(timers["event"]),
            processing_timers=load_timers(timers["processing"]),
            state_names=list(metadata["state_names"]),
            states=_states(metadata["states"]),
            config=dict(metadata["config"]),
            counts=dict(metadata["counts"]),
            backend=str(metadata["backend"]),
            key_group_range=_key_group_range(metadata.get("key_group_range")),
            input_watermarks=_input_watermarks(metadata.get("input_watermarks")),
            in_flight=contents.get(IN_FLIGHT, b""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: operator metadata or timers are malformed: {exc}") from exc
    backend_dir = os.path.join(private, BACKEND_DIR)
    os.makedirs(backend_dir, mode=0o700, exist_ok=True)  # a backend that wrote no file
    return RestoredCheckpoint(CheckpointHandle(checkpoint_id, path), state, backend_dir)


def read_files(
    handle: CheckpointHandle | str | os.PathLike[str],
    wanted: tuple[str, ...],
    optional: tuple[str, ...] = (),
    private: str | None = None,
) -> tuple[CheckpointHandle, dict[str, bytes]]:
    """Verify a checkpoint (manifest, sizes, SHA-256, no unlisted file) and return its
    handle and the contents of the ``wanted`` files, which it must list, and of the
    ``optional`` ones it lists (read once: what was verified is what gets parsed).
    With ``private`` (a private directory) every other file is put there, at its
    relative path, and verified there (``private_copy.place``), for a reader that
    opens them later; without it they are verified in place, and must not be
    opened again.

    Raises TypeError, FileNotFoundError or ValueError as ``read`` does.
    """
    if isinstance(handle, CheckpointHandle):
        path, expected_id = handle.path, handle.checkpoint_id
    elif isinstance(handle, (str, os.PathLike)):
        path, expected_id = os.path.abspath(os.fspath(handle)), None
    else:
        raise TypeError(
            f"restore takes a CheckpointHandle or a checkpoint path, got {type(handle).__name__}"
        )
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    manifest = _read_manifest(path, wanted)
    checkpoint_id = manifest["checkpoint_id"]
    if expected_id is not None and checkpoint_id != expected_id:
        raise ValueError(
            f"{os.path.join(path, MANIFEST)} is checkpoint {checkpoint_id}, "
            f"the handle says {expected_id}"
        )
    contents = _verify_files(path, manifest["files"], wanted + optional, private)
    return CheckpointHandle(checkpoint_id, path), contents


def _read_manifest(path: str, wanted: tuple[str, ...]) -> dict[str, Any]:
    file = os.path.join(path, MANIFEST)
    try:
        with digests.open_regular(file) as src:  # not a FIFO's or a link's target
            data = src.read()
    except FileNotFoundError:
        raise ValueError(
            f"{file} is missing: {path} is an incomplete checkpoint (not committed)"
        ) from None
    signature = None
    if signing.current_key() is not None:
        try:
            with digests.open_regular(os.path.join(path, SIGNATURE)) as src:
                signature = src.read()
        except FileNotFoundError:
            pass
    return parse_manifest(path, data, signature, wanted)


def parse_manifest(
    where: str, data: bytes, signature: bytes | None, wanted: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The manifest of the checkpoint at ``where`` from its bytes, checked: with
    ``AEC_CHECKPOINT_KEY`` set, its ``signature`` (the bytes of ``MANIFEST.hmac``,
    None when absent) first, before a byte is parsed; then its format, and that it
    lists every file of ``wanted``.

    Raises ValueError naming the checkpoint (unsigned, wrongly signed, not a
    manifest of this format, a wanted file unlisted).
    """
    file = f"{where.rstrip('/')}/{MANIFEST}" if "://" in where else os.path.join(where, MANIFEST)
    signing.check(where, data, signature, signing.current_key())  # before parsing
    manifest = _parse(where, MANIFEST, data, json.loads)
    if not isinstance(manifest, dict):
        raise ValueError(f"{file} is not an {FORMAT} manifest")
    files = manifest.get("files")
    if (
        manifest.get("format") != FORMAT
        or not isinstance(files, dict)
        or type(manifest.get("checkpoint_id")) is not int
        or not set(wanted) <= set(files)
    ):
        missing = sorted(set(wanted) - set(files or ()))
        raise ValueError(
            f"{file} is not an {FORMAT} manifest of this kind of operator"
            + (f" (it lists no {', '.join(missing)})" if missing else "")
        )
    return manifest


def _verify_files(
    path: str, listed: dict[str, Any], wanted: tuple[str, ...], private: str | None
) -> dict[str, bytes]:
    """Check every listed file's size and SHA-256 and that none is unlisted; return
    the contents of the small operator files (read once, so what was verified is
    what gets parsed); put the others into ``private`` (if given) and verify them
    there; a file this process wrote or verified, unchanged, by identity only
    (``aec.checkpoint.digests``)."""
    present = set(list_files(path)) - _OWN
    unlisted = sorted(present - set(listed))
    if unlisted:
        file = os.path.join(path, unlisted[0])
        raise ValueError(f"{file} is not listed in the checkpoint manifest")
    contents: dict[str, bytes] = {}
    for name, expected in sorted(listed.items()):
        file = os.path.join(path, name)
        if name not in present:
            raise ValueError(f"{file} is missing from the checkpoint")
        if not isinstance(expected, dict):
            raise ValueError(f"the manifest entry of {file} is malformed")
        if name in wanted:
            contents[name] = digests.verify(file, expected, keep=True) or b""
        elif private is not None:  # a listed name is a walked one: no "..", not absolute
            private_copy.place(file, os.path.join(private, *name.split("/")), expected)
        else:
            digests.verify(file, expected, keep=False)
    return contents


def _parse(path: str, name: str, data: bytes, loads: Any) -> Any:
    try:
        return loads(data)
    except Exception as exc:  # json, msgpack and their many error types
        raise ValueError(f"{os.path.join(path, name)} cannot be read: {exc}") from exc


# -- helpers -----------------------------------------------------------------------------------
def list_files(root: str) -> list[str]:
    """Relative paths ('/'-separated) of every file under ``root``, sorted."""
    found = []
    for folder, _, names in os.walk(root):
        relative = os.path.relpath(folder, root)
        for name in names:
            path = name if relative == "." else os.path.join(relative, name)
            found.append(path.replace(os.sep, "/"))
    return sorted(found)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, allow_nan=False).encode()


def _encode_time(value: float) -> float | str:
    """Strict JSON has no infinities: -inf/inf are stored as strings."""
    return value if math.isfinite(value) else str(value)


def _states(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(
        isinstance(name, str) and isinstance(about, dict) for name, about in value.items()
    ):
        raise ValueError(f"not a state description: {value!r}")
    return value


def _key_group_range(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    start, end = value
    if not (type(start) is int and type(end) is int and 0 <= start <= end + 1):
        raise ValueError(f"not a key-group range: {value!r}")
    return start, end


def _input_watermarks(value: Any) -> tuple[float | int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"not the watermarks of two inputs: {value!r}")
    return tuple(_decode_time(w) for w in value)


def _decode_time(value: Any) -> float | int:
    if isinstance(value, str):
        if value not in ("inf", "-inf"):
            raise ValueError(f"not a time: {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a time: {value!r}")
    return value
