"""Incremental snapshots of ``MemoryBackend``: a base plus a changelog of deltas.

Flink's changelog state backend (FLIP-158) writes, per checkpoint, only the
changes since the last one, against a periodically materialized base. Here:

- ``Changelog.written(state, key)`` records every key a write touched since the
  previous snapshot (the backend calls it per write request).
- ``snapshot(tables, directory)`` writes one new immutable file: either a full
  base (``memory-state.pickle``: every table) or a delta (the current value, or a
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
- ``load(directory)`` = base + every delta in order. After an unfiltered restore
  of one snapshot the backend ``adopt``s its chain (links it), so the first
  snapshot after a restore is a delta, not a new base.
- A base of more than ``memory_segments.INLINE_ENTRIES`` entries is written
  segmented (``memory-base.segments``, ``aec.state.memory_segments``) instead of
  as one pickle; ``load(directory, lazy=True)`` then reads only its header and
  applies the deltas, and the backend merges a segment on first access.

The base and the deltas live in the private directory (``tempfile``, removed by
``close``) and, linked, in each checkpoint; the chain survives as long as any
checkpoint that lists it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from typing import Any

from aec.state import memory_segments as segments
from aec.state.memory_segments import LazyBase, SegmentedBase

BASE = "memory-state.pickle"
SEGMENTED_BASE = "memory-base.segments"  # a large base (``aec.state.memory_segments``)
CHAIN = "memory-chain.json"
_FORMAT = "aec-memory-chain/1"


class Changelog:
    """The chain of one ``MemoryBackend`` (mailbox thread only)."""

    def __init__(self, max_deltas: int = 16, rebase_ratio: float = 0.5) -> None:
        self.max_deltas = max_deltas
        self.rebase_ratio = rebase_ratio
        self.dirty: set[tuple[str, Any]] = set()  # (state, key) written since the last snapshot
        self._since_base: set[tuple[str, Any]] = set()
        self._private: str | None = None
        self._base: str | None = None  # private path of the base; None: next snapshot is a base
        self._deltas: list[str] = []
        self._written = 0

    def reset(self) -> None:
        """State was replaced wholesale (a restore): the next snapshot is a base."""
        self.dirty = set()
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
                self._private = tempfile.mkdtemp(prefix="aec-memory-chain-")
            suffix = os.path.splitext(name)[1]  # .pickle or .segments: the base's format
            paths.append(os.path.join(self._private, f"{self._written}{suffix}"))
            _link(os.path.join(directory, name), paths[-1])
        self._base, self._deltas, self._since_base = paths[0], paths[1:], set(touched)

    def snapshot(
        self, tables: dict[str, dict[Any, Any]], directory: str, lazy: LazyBase | None = None
    ) -> None:
        """Write the next link of the chain and put the chain into ``directory``.
        ``lazy``: segments of a restored base not merged into ``tables`` yet (a new
        base merges them first)."""
        os.makedirs(directory, exist_ok=True)
        self._since_base |= self.dirty
        size = sum(len(table) for table in tables.values()) + (lazy.unloaded if lazy else 0)
        if self._base is None or len(self._since_base) > self.rebase_ratio * max(size, 1):
            if lazy is not None:
                lazy.load_all(tables)
            self._base = self._write_base(tables)
            self._deltas, self._since_base = [], set()
        elif len(self._deltas) >= self.max_deltas:
            self._deltas = [self._write(_delta(tables, self._since_base))]
        elif self.dirty:
            self._deltas.append(self._write(_delta(tables, self.dirty)))
        self.dirty = set()
        for name in os.listdir(directory):  # a snapshot into the same directory replaces it
            if name in (BASE, SEGMENTED_BASE, CHAIN) or name.startswith("memory-delta-"):
                os.remove(os.path.join(directory, name))  # a name only: links survive
        large = self._base.endswith(".segments")
        _link(self._base, os.path.join(directory, SEGMENTED_BASE if large else BASE))
        names = []
        for index, path in enumerate(self._deltas):
            names.append(f"memory-delta-{index}.pickle")
            _link(path, os.path.join(directory, names[-1]))
        if names:
            data = json.dumps({"format": _FORMAT, "deltas": names}).encode()
            with open(os.path.join(directory, CHAIN), "wb") as out:
                out.write(data)

    def _write(self, payload: Any, suffix: str = ".pickle") -> str:
        if self._private is None:
            self._private = tempfile.mkdtemp(prefix="aec-memory-chain-")
        self._written += 1
        path = os.path.join(self._private, f"{self._written}{suffix}")
        if suffix == ".segments":
            segments.write(payload, path)
        else:
            with open(path, "wb") as out:
                pickle.dump(payload, out, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    def _write_base(self, tables: dict[str, dict[Any, Any]]) -> str:
        return self._write(tables, ".segments" if segments.is_large(tables) else ".pickle")

    def close(self) -> None:
        """Remove the private directory (checkpoints keep their links)."""
        private, self._private = self._private, None
        self._base, self._deltas = None, []
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def load(
    directory: str, touched: set[tuple[str, Any]] | None = None, lazy: bool = False
) -> tuple[dict[str, dict[Any, Any]], LazyBase | None]:
    """The tables of a snapshot: its base with every delta applied in order; the
    ``(state, key)`` pairs the deltas change are added to ``touched``. With ``lazy``
    a segmented base is not read: the tables hold the deltas' keys only, and the
    returned ``LazyBase`` (else None) merges the base's segments on demand.

    Raises FileNotFoundError (no base) or ValueError (not a MemoryBackend snapshot).
    """
    name = _base_name(directory)
    pending = None
    if name == SEGMENTED_BASE:
        base = SegmentedBase(os.path.join(directory, name))
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
        tables = _read(os.path.join(directory, BASE))
        if not isinstance(tables, dict):
            raise ValueError(f"{os.path.join(directory, BASE)} is not a MemoryBackend snapshot")
    try:
        _apply_chain(directory, tables, touched if pending is None else pending.skip)
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
    directory: str, tables: dict[str, dict[Any, Any]], touched: set[tuple[str, Any]] | None
) -> None:
    chain = os.path.join(directory, CHAIN)
    if not os.path.exists(chain):
        return
    with open(chain, "rb") as src:
        names = json.loads(src.read()).get("deltas")
    if not isinstance(names, list):
        raise ValueError(f"{chain} is not a MemoryBackend chain")
    for name in names:
        delta = _read(os.path.join(directory, name))
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


def _read(path: str) -> Any:
    with open(path, "rb") as src:
        try:
            return pickle.load(src)
        except Exception as exc:
            raise ValueError(f"{path} is not a MemoryBackend snapshot: {exc}") from exc


def _link(source: str, target: str) -> None:
    """Hard-link ``source`` to ``target``; copy across file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
