"""``read_state``: the state of a committed checkpoint as a DataFrame (Spark's
``statestore`` reader, Flink's State Processor API), without running the job.

What it reads:

* a ``process_keyed_stream`` checkpoint location (or its ``state`` directory): the
  state as of its latest committed micro-batch, every partition. ``layout.json``'s
  history record names the checkpoints whose union was the state before and after
  the last micro-batch the partitions finished (``spark_glue.stream_state``); when
  Spark's checkpoint can be read here and has not committed that micro-batch (its
  sink failed, Spark will run it again), the state before it is read;
* one ``KeyedProcessOperator`` checkpoint: a ``CheckpointHandle``, the path or URI of a
  ``chk-<id>`` directory, or a directory of them (its newest committed one); or a
  list of those (the checkpoints of several operators, as ``restore`` takes them).

How: each checkpoint is verified and parsed like a restore does (``aec.checkpoint``:
manifest, sizes, SHA-256, signature with ``AEC_CHECKPOINT_KEY``; an object store's is
downloaded first), then restored into a scratch backend of the kind that wrote it
(found by the files its snapshot holds: MemoryBackend, RocksDB, SlateDB, Redis; a
``LatencyBackend`` or ``CachedBackend`` snapshot is its inner backend's), each state
registered with the serializer the checkpoint records for it (``aec.checkpoint.
state_meta``: pickle only for a state that opted in), and listed with
``state_items``. A Redis snapshot holds Redis ``DUMP`` payloads, which only a Redis
server decodes: a private ``redis-server`` (``backends.LocalRedisServer``) is started
for the read. Rows are built on the driver and handed to Spark as one Arrow table, so
this works on classic and Connect sessions and the state read is the one at the call
(a checkpoint pruned later does not matter); the state passes through the driver's
memory.

Rows: one per stored value: value, reducing and aggregating state one per key, list
state one per key (the whole list), map state one per entry. Window state (a checkpoint
of a ``aec.windowing`` function: its states ``window-contents``, ``window-timers``,
``window-trigger.<name>``, ``window-process.<name>``, and its sessions and panes) has
one row per key and window with the window in ``namespace``; a session window kept
with its contents (``window-sessions-contents``) one row per session; a sliding window
kept as panes of ``gcd(size, slide)`` seconds (each window merges its panes when it
fires) one row per pane, the pane's slice of time in ``namespace``. State with a TTL
shows the values still alive at the checkpoint's processing time, without their
expiry. Rows come in key group, key, state, namespace and user key order across every
checkpoint read.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from fractions import Fraction
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame

from aec.checkpoint import CheckpointHandle, CheckpointStore, private_copy
from aec.checkpoint import files as checkpoint_files
from aec.checkpoint.files import RestoredCheckpoint
from aec.checkpoint.storage import local_copy
from aec.keygroups import KeyGroupRange, key_group_for
from aec.runtime.operator_rescale import merge
from aec.runtime.timers import TimerQueue
from aec.state.backend import StateBackend
from aec.state.serialization import PICKLE, Serializer, resolve
from aec.windowing.grid import pane_size
from aec.windowing.operator import ASSIGNER_MARKER, CONTENTS, SCOPED_PREFIXES, TIMERS
from aec.windowing.panes import LIVE_PANES
from aec.windowing.sessions import STATE as SESSIONS
from aec.windowing.windows import GlobalWindow, TimeWindow
from spark_glue.stream_state import Layout, StateStore, batch_ids, locations

SCHEMA = (
    "key string, key_group int, state string, namespace string, user_key string, "
    "value string, value_pickle binary"
)
_ARROW = pa.schema([
    ("key", pa.string()), ("key_group", pa.int32()), ("state", pa.string()),
    ("namespace", pa.string()), ("user_key", pa.string()), ("value", pa.string()),
    ("value_pickle", pa.binary()),
])  # fmt: skip
_CHECKPOINT_NAME = re.compile(r"chk-(\d+)$")
# aec.windowing's states (only in a checkpoint of a window function, which declares its
# assigner as a state named ASSIGNER_MARKER + its description): maps keyed by window
# (or, for sliding windows kept as panes, by pane index), and values holding a key's
# sessions or panes
_SLIDING = re.compile(r"Sliding(?:EventTime|ProcessingTime)Windows\.of\((.+), (.+), (.+)\)$")

# The file (or directory) each backend's snapshot writes, and the backend that reads it:
# aec.state.memory_changelog.BASE / SEGMENTED_BASE, backends.rocksdb_snapshots.
# SNAPSHOT_SUBDIR, backends.slatedb_snapshots.SNAPSHOT_FILE, backends.redis_snapshots.
# MANIFEST (tests/test_state_reader.py checks they agree).
SNAPSHOT_MARKERS = (
    ("memory", ("memory-base.msgpack", "memory-base.segments")),
    ("rocksdb", ("rocksdb",)),
    ("slatedb", ("slatedb-snapshot.json",)),
    ("redis", ("redis-manifest.json",)),
)


def read_state(
    spark: Any,
    checkpoint: Any,
    *,
    spark_checkpoint_location: str | os.PathLike[str] | None = None,
    serializers: Mapping[str, Serializer] | None = None,
) -> DataFrame:
    """The state of a committed checkpoint as a DataFrame, without running the job.

    Args:
        spark: the SparkSession (classic or Connect) the DataFrame belongs to.
        checkpoint: a ``process_keyed_stream`` checkpoint location (a path or URI:
            its latest committed micro-batch, all partitions), or a
            ``KeyedProcessOperator`` checkpoint: a ``CheckpointHandle``, the path or
            URI of a ``chk-<id>`` directory or of a directory of them (the newest
            committed), or a list of handles, paths or URIs.
        spark_checkpoint_location: the stream's Spark checkpoint, when it was not the
            default (``process_keyed_stream``'s argument of that name); it tells
            whether the last micro-batch was committed.
        serializers: ``{recorded name: Serializer}`` for states stored with a custom
            ``aec.state.serialization.Serializer``, and ``{"pickle":
            aec.state.serialization.PICKLE}`` to read states stored with pickle (its
            bytes name code to run: trust the location first); ``"msgpack"`` needs none.

    Returns:
        Columns ``key`` (string: a ``str`` key as it is, any other its ``repr``),
        ``key_group`` (int), ``state`` (the descriptor's name), ``namespace`` (string
        or null: the window, for window state), ``user_key`` (string or null: the map
        key, for map state), ``value`` (string: the value's ``repr``), ``value_pickle``
        (binary: the value pickled, ``pickle.loads`` gives it back). Rows in key
        group, key, state, namespace and user key order.

    Raises:
        TypeError: ``checkpoint`` is none of these.
        FileNotFoundError: nothing at the location.
        ValueError: a file at the location; no committed checkpoint there; a
            checkpoint that does not verify (named); a backend snapshot of an unknown
            kind; a state whose recorded serializer this process does not know, or
            pickle not opted in to.
        CheckpointStorageError: the object store could not be read.
    """
    read: list[RestoredCheckpoint] = []
    found = [
        row
        for handle in checkpoints_of(checkpoint, spark_checkpoint_location)
        for row in _rows(handle, serializers or {}, read)
    ]
    _check_fit(read)
    found.sort(key=_order)  # across checkpoints: each holds some key groups
    columns = [list(c) for c in zip(*found, strict=True)] if found else [[]] * len(_ARROW.names)
    table = pa.table(dict(zip(_ARROW.names, columns, strict=True)), schema=_ARROW)
    return spark.createDataFrame(table, schema=SCHEMA)


def checkpoints_of(checkpoint: Any, spark_checkpoint_location: Any = None) -> list[Any]:
    """The checkpoints (handles, paths or URIs) whose union is the state ``checkpoint``
    names (see ``read_state``)."""
    if isinstance(checkpoint, CheckpointHandle):
        return [checkpoint]
    if isinstance(checkpoint, (list, tuple)):
        found = []
        for item in checkpoint:
            found += checkpoints_of(item)
        return found
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(
            "read_state takes a checkpoint location, a CheckpointHandle, the path or URI of a "
            f"checkpoint, or a list of them; got {type(checkpoint).__name__}"
        )
    text = os.fspath(checkpoint).rstrip("/")
    if _CHECKPOINT_NAME.search(text):
        return [text]
    store = CheckpointStore.at(text)
    if store.exists("state", "layout.json"):
        return stream_checkpoints(text, spark_checkpoint_location)
    if store.exists("layout.json") and text.endswith("state"):
        parent = text[: -len("state")].rstrip("/")
        return stream_checkpoints(parent, spark_checkpoint_location)
    latest = store.latest()
    if latest is None:
        if store.local and os.path.isfile(store.location):
            raise ValueError(
                f"{store.location} is a file: read_state takes a checkpoint directory "
                "(chk-<id>), a location holding them, or a process_keyed_stream location"
            )
        if not store.list_names():
            raise FileNotFoundError(f"nothing at {store.location}")
        raise ValueError(
            f"{store.location} holds no committed checkpoint (no chk-<id> with a manifest) "
            "and no process_keyed_stream state (state/layout.json)"
        )
    return [latest]


def stream_checkpoints(location: str, spark_location: Any = None) -> list[CheckpointHandle]:
    """The checkpoints of a ``process_keyed_stream`` location's latest committed
    micro-batch, every partition (the module doc says how it is chosen)."""
    state_location, spark_root = locations(location, spark_location)
    store = CheckpointStore.at(state_location)
    layout = Layout.load(store)
    if layout is None or not layout.history:
        return []  # the query never finished a micro-batch: empty state
    record = layout.last
    if record is None:  # a layout written before history records: the newest per partition
        state = StateStore(state_location, layout.max_parallelism)
        era = len(layout.history) - 1
        return [
            handle
            for partition in range(layout.history[-1][1])
            for handle in state.sources(layout.history, era, partition, 1 << 62)
        ]
    names = record.after
    commits = _commits(spark_root)
    if commits is not None and (not commits or commits[-1] < record.batch):
        names = record.before  # Spark will run that micro-batch again: not committed
    return [CheckpointHandle(_checkpoint_id(name), store.name_of(*name.split("/"))) for name in names]


def _commits(spark_root: str) -> list[int] | None:
    """The micro-batches Spark's checkpoint committed, or None when it cannot be read
    here (a URI, or a directory this process does not have)."""
    if "://" in spark_root or not os.path.isdir(spark_root):
        return None
    return batch_ids(os.path.join(spark_root, "commits"))


def _checkpoint_id(name: str) -> int:
    match = _CHECKPOINT_NAME.search(name)
    if match is None:
        raise ValueError(f"layout.json names {name!r}, not a chk-<id> checkpoint")
    return int(match.group(1))


def _order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return row[1], row[0], row[2], row[3] or "", row[4] or ""


def _check_fit(read: list[RestoredCheckpoint]) -> None:
    """Checkpoints read together fit together as ``restore`` requires them to (one
    ``max_parallelism``, the same states and inputs, disjoint key-group ranges), else
    ValueError naming them: overlapping ones would give two values of a key."""
    if len(read) > 1:
        first = read[0].state
        inputs = 1 if first.input_watermarks is None else len(first.input_watermarks)
        everything = KeyGroupRange(0, first.max_parallelism - 1)
        merge(read, first.max_parallelism, everything, inputs)


def _rows(
    handle: Any, serializers: Mapping[str, Serializer], read: list[RestoredCheckpoint]
) -> Iterator[tuple[Any, ...]]:
    """The rows of one checkpoint (verified, restored into a scratch backend); its
    metadata is appended to ``read`` (named as the caller named it)."""
    # the scratch backend lives in the temporary directory: its private copy there too
    with local_copy(handle) as local, private_copy.directory() as private:
        target: CheckpointHandle | str = local
        if isinstance(handle, CheckpointHandle):  # its id is checked against the manifest
            target = CheckpointHandle(handle.checkpoint_id, local)
        restored = checkpoint_files.read(target, TimerQueue.from_export, private)
        named = handle if isinstance(handle, CheckpointHandle) else os.fspath(handle)
        if not isinstance(named, CheckpointHandle):
            named = CheckpointHandle(restored.handle.checkpoint_id, named)
        read.append(dataclasses.replace(restored, handle=named))
        state = restored.state
        with _restored_backend(restored.backend_dir, state.states, serializers) as backend:
            now = state.processing_time
            windows = _Windows(list(state.states))
            for name, about in sorted(state.states.items()):
                for key, stored in backend.state_items(name).items():
                    yield from _state_rows(
                        name, about, key, stored, now, state.max_parallelism, windows
                    )


def _state_rows(
    name: str, about: dict[str, Any], key: Any, stored: Any, now: float, max_parallelism: int,
    windows: _Windows,
) -> Iterator[tuple[Any, ...]]:  # fmt: skip
    kind, ttl = about.get("type"), bool(about.get("ttl"))
    base = (text(key), key_group_for(key, max_parallelism), name)
    if windows.per_window(name, kind):
        for namespace, value in windows.split(name, stored):
            yield (*base, namespace, None, *_value(value))
        return
    if kind == "map":
        for user_key, value in stored.items():
            if ttl:
                if not _alive(value, now):
                    continue
                value = value[0]
            yield (*base, None, text(user_key), *_value(value))
        return
    if ttl:
        if kind == "list":
            stored = [element[0] for element in stored if _alive(element, now)]
            if not stored:
                return  # every element expired: no row, as for an expired value
        elif not _alive(stored, now):
            return
        else:
            stored = stored[0]
    yield (*base, None, None, *_value(stored))


def _alive(pair: Any, now: float) -> bool:
    """A TTL pair ``(value, expires_at)`` is alive after ``now`` (``aec.state.ttl``)."""
    return pair is not None and pair[1] > now


def _value(value: Any) -> tuple[str, bytes]:
    return repr(value), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def text(key: Any) -> str:
    """A key (or map key) as text: a ``str`` as it is, anything else its ``repr``."""
    return key if isinstance(key, str) else repr(key)


class _Windows:
    """How a checkpoint's window state names its windows: none unless the checkpoint
    declares a window assigner (``ASSIGNER_MARKER``), so a user's own state named
    ``window-...`` stays what it is."""

    def __init__(self, state_names: list[str]) -> None:
        marker = ASSIGNER_MARKER
        assigner = next((n[len(marker) :] for n in state_names if n.startswith(marker)), None)
        self.present = assigner is not None
        # a sliding assigner's panes: (offset, width) as exact fractions
        self.panes: tuple[Fraction, Fraction] | None = None
        match = None if assigner is None else _SLIDING.match(assigner)
        if match is not None:
            size, slide, offset = (ast.literal_eval(part) for part in match.groups())
            g = pane_size(size, slide)
            if g is not None:
                self.panes = Fraction(offset), g

    def per_window(self, name: str, kind: Any) -> bool:
        """Whether state ``name`` (of ``kind``) holds values per window (or pane)."""
        if not self.present:
            return False
        if kind == "map":
            return name in (CONTENTS, TIMERS) or name.startswith(SCOPED_PREFIXES)
        return name in (SESSIONS, LIVE_PANES)

    def split(self, name: str, stored: Any) -> Iterator[tuple[str, Any]]:
        """``(namespace, value)`` per window (or pane) of one key's stored value."""
        if name == SESSIONS:  # [[start, end, contents], ...] (tuples if written so)
            for start, end, contents in stored or ():
                yield repr(TimeWindow(start, end)), contents
            return
        for window_key, value in stored.items():  # a map, or the live panes' dict
            yield self.window_text(window_key), value

    def window_text(self, window_key: Any) -> str:
        """The window a map key names (``aec.windowing.windows.window_key``), or the
        slice of time of a pane index."""
        if window_key == "global":
            return repr(GlobalWindow())
        if isinstance(window_key, tuple) and len(window_key) == 2:
            return repr(TimeWindow(*window_key))
        if type(window_key) is int and self.panes is not None:
            offset, g = self.panes
            start, end = offset + window_key * g, offset + (window_key + 1) * g
            return repr(TimeWindow(_number(start), _number(end)))
        return repr(window_key)


def _number(value: Fraction) -> int | float:
    """An exact time as the windows' own bounds print: an int when whole."""
    return value.numerator if value.denominator == 1 else float(value)


def snapshot_kind(backend_dir: str) -> str:
    """``"memory"``, ``"rocksdb"``, ``"slatedb"`` or ``"redis"``: which backend wrote the
    snapshot in ``backend_dir``. Raises ValueError for none of them."""
    for kind, markers in SNAPSHOT_MARKERS:
        if any(os.path.exists(os.path.join(backend_dir, marker)) for marker in markers):
            return kind
    raise ValueError(
        f"{backend_dir} holds no snapshot of a known backend (MemoryBackend, RocksDB, "
        f"SlateDB, Redis): {sorted(os.listdir(backend_dir))}"
    )


_YEAR = 365 * 86400.0  # seconds


@contextmanager
def _restored_backend(
    backend_dir: str, states: dict[str, dict[str, Any]], serializers: Mapping[str, Serializer]
) -> Iterator[StateBackend]:
    """A scratch backend of the kind that wrote ``backend_dir``, restored from it, each
    state registered with its recorded serializer; closed and removed on exit."""
    kind = snapshot_kind(backend_dir)
    with ExitStack() as stack:
        scratch = tempfile.mkdtemp(prefix="aec-read-state-")
        stack.callback(shutil.rmtree, scratch, True)
        backend = _scratch_backend(kind, scratch, stack)
        stack.callback(backend.close)
        for name, about in states.items():
            backend.register_state(name, _serializer(name, about, serializers))
            if about.get("ttl"):  # byte stores keep a TTL state's pairs in their own layout
                shape = about.get("type")  # the reader filters by expiry itself: any TTL serves
                backend.register_ttl(name, _YEAR, shape if shape in ("list", "map") else "value")
        backend.restore(backend_dir)
        yield backend


def _scratch_backend(kind: str, scratch: str, stack: ExitStack) -> StateBackend:
    if kind == "memory":
        from aec.state.memory import MemoryBackend

        return MemoryBackend(incremental=False)
    if kind == "rocksdb":
        from backends import RocksDBBackend

        return RocksDBBackend(os.path.join(scratch, "rocksdb"))
    if kind == "slatedb":
        from backends import SlateDBBackend

        return SlateDBBackend(f"file://{scratch}", "read-state")
    from backends import LocalRedisServer, RedisBackend

    server = stack.enter_context(LocalRedisServer())
    return RedisBackend(server.url, prefix="aec-read-state")


def _serializer(
    name: str, about: dict[str, Any], serializers: Mapping[str, Serializer]
) -> Serializer:
    """The serializer state ``name`` was stored with (by the name its checkpoint records):
    one ``serializers`` gives, else a built-in one, except pickle: the checkpoint's bytes
    name it, and unpickling runs code they name, so the caller opts in."""
    recorded = about.get("serializer")
    if isinstance(recorded, str) and recorded in serializers:
        return serializers[recorded]
    if recorded == PICKLE.name:
        raise ValueError(
            f"state {name!r} was stored with pickle, and unpickling runs code its bytes "
            "name: read it only from a checkpoint location no one else writes, with "
            "read_state(..., serializers={'pickle': aec.state.serialization.PICKLE})"
        )
    try:
        return resolve(recorded)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"state {name!r} was stored with the serializer {recorded!r}, which this process "
            f"does not know: pass read_state(..., serializers={{{recorded!r}: ...}}) ({exc})"
        ) from exc

