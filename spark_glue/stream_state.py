"""The state of ``process_keyed_stream`` on a checkpoint store: layout, history, bases.

Layout under ``<checkpoint_location>/state`` (a local path or a ``pyarrow.fs`` URI)::

    layout.json                          format, key columns, max_parallelism, history
    partition-<p>-of-<n>/chk-<batch id>  aec checkpoints of partition p of n
    partition-<p>-of-<n>/watermarks-<batch id>.json

``history`` is a list of ``[first batch id, num_partitions]``: from that batch on
the state has that many partitions; partition ``p`` of ``n`` owns
``key_group_range_for(max_parallelism, n, p)``.

The state of partition ``p`` of era ``e`` before batch ``b`` (``sources``) is its
newest checkpoint with an id in ``[era start, b)``; if it has none (no rows since
the era began), it is the union of the states, before the era's first batch, of
every partition of the previous era whose key groups overlap ``p``'s (recursively),
each filtered to ``p``'s key groups by ``KeyedProcessOperator.restore``. So a
restart with another ``num_partitions`` redistributes state by key group. In an
era's first micro-batch every partition whose state is inherited takes its own
checkpoint, rows or not (``inherited``), so the next era finds one checkpoint per
old partition: disjoint key-group ranges, as ``restore`` requires.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aec.checkpoint import CheckpointHandle, CheckpointStore
from aec.keygroups import key_group_range_for

_LAYOUT = "layout.json"
_FORMAT = 2
KEEP = 2  # checkpoints kept per partition in the current era: the newest and its replay base


def partition_name(partition: int, partitions: int) -> str:
    return f"partition-{partition}-of-{partitions}"


@dataclass
class Layout:
    """``layout.json``: key columns, max_parallelism and the history of partitioning."""

    keys: list[str]
    max_parallelism: int
    history: list[list[int]] = field(default_factory=list)

    @classmethod
    def load(cls, store: CheckpointStore) -> Layout | None:
        """The stored layout, or None if there is none.

        Raises ValueError for a layout this version cannot continue (the format-1
        layout hashed keys to partitions: its state cannot be split by key group).
        """
        if not store.exists(_LAYOUT):
            return None
        data = json.loads(store.read_bytes(_LAYOUT))
        if data.get("format") != _FORMAT:
            raise ValueError(
                f"{store.name_of(_LAYOUT)} has layout format {data.get('format')}, this "
                f"version writes {_FORMAT} (key-group partitioning); start a new "
                "checkpoint_location"
            )
        return cls(list(data["keys"]), int(data["max_parallelism"]), data["history"])

    def save(self, store: CheckpointStore) -> None:
        data = {
            "format": _FORMAT,
            "keys": self.keys,
            "max_parallelism": self.max_parallelism,
            "history": self.history,
        }
        store.write_bytes(json.dumps(data).encode(), _LAYOUT)

    @property
    def partitions(self) -> int | None:
        """The number of partitions of the newest era (None before the first batch)."""
        return self.history[-1][1] if self.history else None

    def enter(self, batch_id: int, partitions: int) -> bool:
        """Make ``batch_id`` run with ``partitions``: drop eras a failed attempt of this
        batch (or a later one) began, then start a new era if the number changes.
        True if the history changed."""
        kept = [entry for entry in self.history if entry[0] < batch_id]
        if not kept or kept[-1][1] != partitions:
            kept.append([batch_id, partitions])
        changed = kept != self.history
        self.history = kept
        return changed


@dataclass(frozen=True)
class StateStore:
    """The partitions' checkpoints under the state root (picklable: shipped to tasks)."""

    location: str
    max_parallelism: int

    def store(self) -> CheckpointStore:
        return CheckpointStore.at(self.location)

    def partition(self, partition: int, partitions: int) -> CheckpointStore:
        return self.store().child(partition_name(partition, partitions))

    def sources(
        self, history: list[list[int]], era: int, partition: int, before: int
    ) -> list[CheckpointHandle]:
        """The checkpoints whose union, filtered to ``partition``'s key groups, is its
        state before batch ``before`` in era ``era`` (see the module doc)."""
        start, partitions = history[era]
        own = self.partition(partition, partitions)
        ids = [i for i in own.checkpoint_ids() if start <= i < before]
        if ids:
            return [CheckpointHandle(ids[-1], own.name_of(f"chk-{ids[-1]}"))]
        if era == 0:
            return []
        mine = key_group_range_for(self.max_parallelism, partitions, partition)
        previous = history[era - 1][1]
        found: list[CheckpointHandle] = []
        for old in range(previous):
            theirs = key_group_range_for(self.max_parallelism, previous, old)
            if len(mine.intersection(theirs)):
                found += [h for h in self.sources(history, era - 1, old, start) if h not in found]
        return found

    def inherited(self, handles: list[CheckpointHandle], partition: int, partitions: int) -> bool:
        """Whether ``handles`` (from ``sources``) come from an older era, not from the
        partition's own directory: it then materializes them even without rows."""
        own = self.partition(partition, partitions).name_of("")
        return any(not handle.path.startswith(own) for handle in handles)

    def clear_attempt(self, partition: int, partitions: int, batch_id: int) -> None:
        """Make a partition's directory ready for ``batch_id``: delete ``chk-<batch_id>``
        (a failed attempt's), its watermarks file and abandoned staging directories.

        Raises RuntimeError if a checkpoint newer than ``batch_id`` exists: Spark runs
        a batch the state has gone past (its checkpoint was reset or replaced).
        """
        own = self.partition(partition, partitions)
        ids = own.checkpoint_ids(complete=False)
        if ids and ids[-1] > batch_id:
            raise RuntimeError(
                f"{own.location} has checkpoint {ids[-1]} but Spark runs micro-batch "
                f"{batch_id}: Spark's checkpoint is older than the state (reset or "
                "replaced); refusing to rewind the state"
            )
        own.delete(batch_id)
        own.delete_file(watermarks_name(batch_id))
        for name in own.list_names():  # a crashed attempt's staging directory
            if name.startswith(".chk-") and ".staging-" in name:
                own.delete_tree(name)

    def prune(self, partition: int, partitions: int, era_start: int) -> None:
        """Keep the newest ``KEEP`` checkpoints of this era in the partition's directory;
        older eras' checkpoints stay (later eras may still derive from them)."""
        own = self.partition(partition, partitions)
        ids = [i for i in own.checkpoint_ids(complete=False) if i >= era_start]
        for old in ids[:-KEEP]:
            own.delete(old)
            own.delete_file(watermarks_name(old))


def watermarks_name(checkpoint_id: int) -> str:
    return f"watermarks-{checkpoint_id}.json"


def save_watermarks(store: CheckpointStore, batch_id: int, marks: Any) -> None:
    """The generator's progress (``marks.progress()``) beside ``chk-<batch_id>``,
    written before it (the checkpoint's commit covers both; a replay overwrites a
    stale file)."""
    store.write_bytes(json.dumps(marks.progress()).encode(), watermarks_name(batch_id))


def load_watermarks(sources: list[CheckpointHandle], marks: Any) -> None:
    """Continue the generator (``marks.resume``) from its progress saved beside
    ``sources``: the highest event time seen and the lowest watermark emitted (the
    operator restores the minimum watermark too).

    Raises RuntimeError when a watermarks file is missing.
    """
    progress = []
    for handle in sources:
        parent, _, _ = handle.path.rstrip("/").rpartition("/")
        store = CheckpointStore.at(parent)
        try:
            name = watermarks_name(handle.checkpoint_id)
            progress.append(json.loads(store.read_bytes(name)))
        except FileNotFoundError:
            raise RuntimeError(
                f"{store.name_of(watermarks_name(handle.checkpoint_id))} is missing: "
                f"checkpoint {handle.path} cannot continue its watermarks"
            ) from None
    marks.resume(progress)
