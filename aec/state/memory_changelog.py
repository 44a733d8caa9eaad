"""Incremental snapshots of ``MemoryBackend``: a base plus a changelog of deltas.

Flink's changelog state backend (FLIP-158) writes, per checkpoint, only the
changes since the last one, against a periodically materialized base. Here:

- ``Changelog.dirty`` holds every ``(state, key)`` a write touched since the
  previous snapshot (the backend adds them per write request). It is ``None`` while
  no base exists (before the first snapshot, after a reset, with
  ``incremental=False``): the next snapshot then writes a whole base and needs no
  list of changes, so writes cost nothing extra and the set does not grow with
  every key a job without checkpoints writes.
- ``snapshot(tables, directory)`` writes one new immutable file: either a full
  base (``memory-base.msgpack``: every table) or a delta (the current value, or a
  deletion, of each key touched since the previous snapshot), into a private
  directory of this backend, and then puts the whole chain (base, deltas in
  order) into ``directory`` by hard links (a copy where links are impossible)
  plus ``memory-chain.json`` naming the deltas in order. Every checkpoint is
  self-contained: deleting any other checkpoint never breaks it, and a linked
  file costs nothing to write.
- Compaction keeps the chain short and the per-snapshot cost proportional to the
  keys changed: after ``max_deltas`` deltas they are folded into one delta (the
  current values of every key changed since the base); once the keys changed
  since the base exceed ``rebase_ratio`` times the state's keys, the next
  snapshot writes a new base. A base costs O(state), but only after that many
  changed keys, so the amortized cost per changed key is constant.
- Files hold each state's values encoded by the serializer the state is
  registered with (``aec.state.memory_format``); ``load`` decodes a state only
  with its registered serializer.
- The chain's files are immutable: each one's size and mtime are noted when it is
  written or adopted, and a snapshot refuses to link one that changed since
  (``ValueError``: changed in place, so corrupt): corruption of a live file never
  reaches a later checkpoint. A base or delta file carries its body's SHA-256 (a
  header before the body), checked whenever it is read: bytes changed with the size
  and mtime kept are refused at restore too.
- ``load(directory)`` = base + every delta in order. After an unfiltered restore
  of one snapshot the backend ``adopt``s its chain (links it), so the first
  snapshot after a restore is a delta, not a new base.
- A base of more than ``memory_segments.INLINE_ENTRIES`` entries is written
  segmented (``memory-base.segments``, ``aec.state.memory_segments``) instead of
  as one file; ``load(directory, lazy=True)`` then reads only its header and
  applies the deltas, and the backend merges a segment on first access.

The base and the deltas live in the private directory (``aec.state.scratch``:
removed by ``close``, at exit, or after a kill by the next backend's first
snapshot) and, linked, in each checkpoint; the chain survives as long as any
checkpoint that lists it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

from aec.state import memory_format, scratch
from aec.state import memory_segments as segments
from aec.state.memory_segments import LazyBase, SegmentedBase
from aec.state.serialization import StateSerializers

BASE = "memory-base.msgpack"
SEGMENTED_BASE = "memory-base.segments"  # a large base (``aec.state.memory_segments``)
CHAIN = "memory-chain.json"
DELTA_PREFIX = "memory-delta-"
DELTA = DELTA_PREFIX + "{}.msgpack"
SCRATCH = "aec-memory-chain-"  # the private directory's prefix (``aec.state.scratch``)
_FORMAT = "aec-memory-chain/2"
# a base or delta file: this, the body's SHA-256 (32 bytes), the body (memory_format's)
_FRAME = b"aec-memory-sha256\n"


class Changelog:
    """The chain of one ``MemoryBackend`` (mailbox thread only)."""

    def __init__(self, max_deltas: int = 16, rebase_ratio: float = 0.5) -> None:
        self.max_deltas = max_deltas
        self.rebase_ratio = rebase_ratio
        # (state, key) written since the last snapshot; None while there is no base
        self.dirty: set[tuple[str, Any]] | None = None
        self._since_base: set[tuple[str, Any]] = set()
        self._private: str | None = None
        self._base: str | None = None  # private path of the base; None: next snapshot is a base
        self._deltas: list[str] = []
        self._stamps: dict[str, tuple[int, int]] = {}  # chain file -> (size, mtime) when made
        self._written = 0

    def reset(self) -> None:
        """State was replaced wholesale (a restore): the next snapshot is a base."""
        self.dirty = None
        self._since_base = set()
        self._base, self._deltas = None, []

    def adopt(self, directory: str, touched: set[tuple[str, Any]]) -> None:
        """Continue the chain of the snapshot in ``directory`` (just restored, unfiltered):
        link its base and deltas into the private directory, so the next snapshot
        after a restore is a delta too. ``touched``: the keys its deltas change."""
        self.reset()
        names = [_base_name(directory)]
        chain = os.path.join(directory, CHAIN)
        if os.path.exists(chain):
            with open(chain, "rb") as src:
                names += json.loads(src.read())["deltas"]
        paths = []
        for name in names:
            self._written += 1
            if self._private is None:
                self._private = scratch.make(SCRATCH)
            suffix = os.path.splitext(name)[1]  # .msgpack or .segments: the base's format
            paths.append(os.path.join(self._private, f"{self._written}{suffix}"))
            _link(os.path.join(directory, name), paths[-1])
            self._stamp(paths[-1])
        self._base, self._deltas, self._since_base = paths[0], paths[1:], set(touched)
        self.dirty = set()

    def snapshot(
        self,
        tables: dict[str, dict[Any, Any]],
        directory: str,
        serializers: StateSerializers,
        lazy: LazyBase | None = None,
    ) -> None:
        """Write the next link of the chain and put the chain into ``directory``,
        each state's values encoded by its serializer in ``serializers``.
        ``lazy``: segments of a restored base not merged into ``tables`` yet (a new
        base merges them first).

        Raises TypeError naming the state when a value cannot be encoded by its
        state's serializer (nothing is added to the chain then)."""
        os.makedirs(directory, exist_ok=True)
        dirty = self.dirty or set()
        self._since_base |= dirty
        size = sum(len(table) for table in tables.values()) + (lazy.unloaded if lazy else 0)
        if self._base is None or len(self._since_base) > self.rebase_ratio * max(size, 1):
            if lazy is not None:
                lazy.load_all(tables)
            self._base = self._write_base(tables, serializers)
            self._deltas, self._since_base = [], set()
        elif len(self._deltas) >= self.max_deltas:
            delta = memory_format.encode_delta(_delta(tables, self._since_base), serializers)
            self._deltas = [self._write(delta)]
        elif dirty:
            delta = memory_format.encode_delta(_delta(tables, dirty), serializers)
            self._deltas.append(self._write(delta))
        self.dirty = set()  # a base exists now: the next snapshot may be a delta
        self._check_unchanged()
        for name in os.listdir(directory):  # a snapshot into the same directory replaces it
            if name in (BASE, SEGMENTED_BASE, CHAIN) or name.startswith(DELTA_PREFIX):
                os.remove(os.path.join(directory, name))  # a name only: links survive
        large = self._base.endswith(".segments")
        _link(self._base, os.path.join(directory, SEGMENTED_BASE if large else BASE))
        names = []
        for index, path in enumerate(self._deltas):
            names.append(DELTA.format(index))
            _link(path, os.path.join(directory, names[-1]))
        if names:
            data = json.dumps({"format": _FORMAT, "deltas": names}).encode()
            with open(os.path.join(directory, CHAIN), "wb") as out:
                out.write(data)

    def _next_path(self, suffix: str) -> str:
        if self._private is None:
            self._private = scratch.make(SCRATCH)
        self._written += 1
        return os.path.join(self._private, f"{self._written}{suffix}")

    def _write(self, data: bytes) -> str:
        path = self._next_path(".msgpack")
        with open(path, "wb") as out:
            out.write(_FRAME + hashlib.sha256(data).digest() + data)  # read by ``_read``
        return self._stamp(path)

    def _stamp(self, path: str) -> str:
        info = os.stat(path)
        self._stamps[path] = (info.st_size, info.st_mtime_ns)
        return path

    def _check_unchanged(self) -> None:
        """Raise ValueError naming a chain file changed since it was made (it would
        carry corruption into the checkpoint about to link it)."""
        chain = [self._base, *self._deltas] if self._base is not None else []
        for path in chain:
            info = os.stat(path)
            if (info.st_size, info.st_mtime_ns) != self._stamps.get(path):
                raise ValueError(
                    f"{path} changed since it was written (MemoryBackend snapshot files "
                    "never change): refusing to link it into a new checkpoint"
                )
        self._stamps = {path: self._stamps[path] for path in chain}

    def _write_base(self, tables: dict[str, dict[Any, Any]], serializers: StateSerializers) -> str:
        if segments.is_large(tables):
            path = self._next_path(".segments")
            segments.write(tables, path, serializers)
            return self._stamp(path)
        return self._write(memory_format.encode_tables(tables, serializers))

    def close(self) -> None:
        """Remove the private directory (checkpoints keep their links)."""
        private, self._private = self._private, None
        self._base, self._deltas, self.dirty = None, [], None
        scratch.remove(private)


def load(
    directory: str,
    serializers: StateSerializers,
    touched: set[tuple[str, Any]] | None = None,
    lazy: bool = False,
) -> tuple[dict[str, dict[Any, Any]], LazyBase | None]:
    """The tables of a snapshot: its base with every delta applied in order; the
    ``(state, key)`` pairs the deltas change are added to ``touched``. With ``lazy``
    a segmented base is not read: the tables hold the deltas' keys only, and the
    returned ``LazyBase`` (else None) merges the base's segments on demand. Each
    state is decoded with its serializer in ``serializers``.

    Raises FileNotFoundError (no base) or ValueError (not a MemoryBackend snapshot,
    or a state stored with a serializer other than its registered one).
    """
    name = _base_name(directory)
    pending = None
    if name == SEGMENTED_BASE:
        base = SegmentedBase(os.path.join(directory, name), serializers)
        tables: dict[str, dict[Any, Any]] = {state: {} for state in base.states}
        # lazily, the deltas' keys are also the keys whose base value is stale
        skip = (set() if touched is None else touched) if lazy else set()
        pending = LazyBase(base, skip)
        if not lazy:
            try:
                pending.load_all(tables)
            finally:
                pending.close()
            pending = None
    else:
        path = os.path.join(directory, BASE)
        tables = memory_format.decode_tables(_read(path), serializers, path)
    try:
        _apply_chain(directory, tables, serializers, touched if pending is None else pending.skip)
    except BaseException:
        if pending is not None:
            pending.close()
        raise
    return tables, pending


def _base_name(directory: str) -> str:
    """The base's file name in ``directory`` (segmented or one pickle)."""
    large = os.path.exists(os.path.join(directory, SEGMENTED_BASE))
    return SEGMENTED_BASE if large else BASE


def _apply_chain(
    directory: str,
    tables: dict[str, dict[Any, Any]],
    serializers: StateSerializers,
    touched: set[tuple[str, Any]] | None,
) -> None:
    chain = os.path.join(directory, CHAIN)
    if not os.path.exists(chain):
        return
    with open(chain, "rb") as src:
        try:
            listed = json.loads(src.read())
        except ValueError as exc:
            raise ValueError(f"{chain} is not a MemoryBackend chain: {exc}") from exc
    names = listed.get("deltas") if isinstance(listed, dict) else None
    if (
        not isinstance(listed, dict)
        or listed.get("format") != _FORMAT
        or not isinstance(names, list)
        or not all(isinstance(n, str) and os.path.basename(n) == n for n in names)
    ):
        raise ValueError(f"{chain} is not a MemoryBackend chain of format {_FORMAT}")
    for name in names:
        path = os.path.join(directory, name)
        delta = memory_format.decode_delta(_read(path), serializers, path)
        for state, (updates, deletions) in delta.items():
            if touched is not None:
                touched.update((state, key) for key in deletions)
                touched.update((state, key) for key in updates)
            table = tables.setdefault(state, {})
            for key in deletions:
                table.pop(key, None)
            table.update(updates)


def _delta(tables: dict[str, dict[Any, Any]], keys: set[tuple[str, Any]]) -> dict[str, Any]:
    """``{state: (updates, deletions)}`` for ``keys``: current values, or deleted.
    Containers are copied (values are stored by reference and mutated in place)."""
    delta: dict[str, tuple[dict[Any, Any], list[Any]]] = {}
    for state, key in keys:
        updates, deletions = delta.setdefault(state, ({}, []))
        table = tables.get(state)
        if table is not None and key in table:
            updates[key] = table[key]
        else:
            deletions.append(key)
    return delta


def _read(path: str) -> bytes:
    """The body of a base or delta file, checked against the SHA-256 it carries.

    Raises ValueError naming the file when the body is not the one written (bytes
    changed in place, even with the size and mtime kept: failing media, which the
    checkpoint's digests, remembered per inode in this process, would not see)."""
    with open(path, "rb") as src:
        data = src.read()
    if not data.startswith(_FRAME):
        return data  # a file written before files carried their digest
    digest, body = data[len(_FRAME) : len(_FRAME) + 32], data[len(_FRAME) + 32 :]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError(f"{path} fails its SHA-256: its bytes changed since it was written")
    return body


def _link(source: str, target: str) -> None:
    """Hard-link ``source`` to ``target``; copy across file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
