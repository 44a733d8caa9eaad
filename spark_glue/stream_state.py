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

History. ``layout.json`` also records, after every micro-batch's partitions have
snapshotted (before the sink, so before Spark commits the batch), which
checkpoints make up the state before and after it (``HistoryRecord``). When a
query starts and before every micro-batch's restore, ``verify_history`` compares
that record with what Spark says was committed and with the checkpoints actually
there: state missing where Spark's log says it was committed (an emptied bucket,
a deleted prefix or directory, a store restored from an older copy) raises
``StateHistoryError`` naming the location and the last committed micro-batch,
instead of a silent start from empty state.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aec.checkpoint import CheckpointHandle, CheckpointStore, signing
from aec.keygroups import key_group_range_for

_LAYOUT = "layout.json"
_FORMAT = 2
KEEP = 2  # the fewest checkpoints kept per partition and era: the newest and its replay base


def partition_name(partition: int, partitions: int) -> str:
    return f"partition-{partition}-of-{partitions}"


class StateHistoryError(RuntimeError):
    """The state location does not hold the state Spark's checkpoint says was committed
    (lost or replaced), or holds state newer than Spark's checkpoint. The message
    names the location, the last committed micro-batch and what to do."""


@dataclass(frozen=True)
class HistoryRecord:
    """The state around one finished micro-batch: ``before`` and ``after`` list the
    checkpoints (``partition-<p>-of-<n>/chk-<id>``, relative to the state root)
    whose union was the state before and after micro-batch ``batch``;
    ``pending_before`` and ``pending_after`` the partitions whose checkpoint then
    held work for the next micro-batch (records in flight a declaring function's
    checkpoint carried, or an end-of-micro-batch watermark held back): they run
    the next micro-batch even without rows."""

    batch: int
    before: tuple[str, ...]
    after: tuple[str, ...]
    pending_before: tuple[int, ...] = ()
    pending_after: tuple[int, ...] = ()

    def expected_before(self, batch_id: int) -> tuple[str, ...] | None:
        """The state micro-batch ``batch_id`` must start from, if this record says
        (``batch_id`` is this batch again, a replay, or the next one); else None."""
        if batch_id == self.batch:
            return self.before
        if batch_id == self.batch + 1:
            return self.after
        return None

    def pending_for(self, batch_id: int) -> tuple[int, ...]:
        """The partitions with pending work as micro-batch ``batch_id`` starts (as
        ``expected_before``; none when this record does not say)."""
        if batch_id == self.batch:
            return self.pending_before
        if batch_id == self.batch + 1:
            return self.pending_after
        return ()


@dataclass
class Layout:
    """``layout.json``: key columns, max_parallelism, the history of partitioning and
    the record of the last finished micro-batch (None before the first, or in a
    layout written before records existed)."""

    keys: list[str]
    max_parallelism: int
    history: list[list[int]] = field(default_factory=list)
    last: HistoryRecord | None = None
    # each key column's kind (``stream.key_kind``); None in a layout written before kinds
    kinds: list[str] | None = None

    @classmethod
    def load(cls, store: CheckpointStore) -> Layout | None:
        """The stored layout, or None if there is none.

        Raises ValueError for a layout this version cannot continue (the format-1
        layout hashed keys to partitions: its state cannot be split by key group), or
        one that is not a layout at all (corrupt: the message names the file).
        """
        if not store.exists(_LAYOUT):
            return None
        name = store.name_of(_LAYOUT)
        try:
            data = json.loads(store.read_bytes(_LAYOUT))
        except ValueError as exc:  # not JSON, or not UTF-8
            raise ValueError(f"{name} is not JSON (corrupt?): {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{name} holds a JSON {type(data).__name__}, not a layout (corrupt?)")
        if data.get("format") != _FORMAT:
            raise ValueError(
                f"{name} has layout format {data.get('format')}, this "
                f"version writes {_FORMAT} (key-group partitioning); start a new "
                "checkpoint_location"
            )
        try:
            last = data.get("last")
            record = None
            if last is not None:
                record = HistoryRecord(
                    int(last["batch"]), tuple(last["before"]), tuple(last["after"]),
                    tuple(int(p) for p in last.get("pending_before", ())),
                    tuple(int(p) for p in last.get("pending_after", ())),
                )  # fmt: skip
            kinds = data.get("key_kinds")
            return cls(
                list(data["keys"]), int(data["max_parallelism"]), data["history"], record,
                None if kinds is None else [str(k) for k in kinds],
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"{name} is not a complete layout (corrupt?): {type(exc).__name__} {exc}"
            ) from exc

    def save(self, store: CheckpointStore) -> None:
        data: dict[str, Any] = {
            "format": _FORMAT,
            "keys": self.keys,
            "max_parallelism": self.max_parallelism,
            "history": self.history,
        }
        if self.kinds is not None:
            data["key_kinds"] = self.kinds
        if self.last is not None:
            data["last"] = {
                "batch": self.last.batch,
                "before": list(self.last.before),
                "after": list(self.last.after),
                "pending_before": list(self.last.pending_before),
                "pending_after": list(self.last.pending_after),
            }
        store.write_bytes(json.dumps(data).encode(), _LAYOUT)

    def finish(
        self,
        store: CheckpointStore,
        batch_id: int,
        before: Mapping[int, list[str]],
        snapshotted: Mapping[int, bool],
        pending: Iterable[int] = (),
    ) -> None:
        """Record micro-batch ``batch_id`` as finished and save the layout: it started
        from ``before`` (partition -> checkpoint names, as planned) with work pending
        in the partitions ``pending``; the partitions ``snapshotted`` took
        ``chk-<batch_id>``, each True when that checkpoint holds pending work."""
        partitions = self.history[-1][1]
        after = {p: list(names) for p, names in before.items()}
        for partition in snapshotted:
            after[partition] = [f"{partition_name(partition, partitions)}/chk-{batch_id}"]
        waiting = {p for p in pending if p not in snapshotted}
        waiting |= {p for p, holds in snapshotted.items() if holds}
        self.last = HistoryRecord(
            batch_id, _union(before.values()), _union(after.values()),
            tuple(sorted(set(pending))), tuple(sorted(waiting)),
        )  # fmt: skip
        self.save(store)

    def may_start_empty(self) -> bool:
        """Whether the next micro-batch Spark runs may start from empty state: no
        micro-batch finished yet, or the last finished one started from none (Spark may
        run it again: its sink failed before the commit)."""
        return self.last is None or not self.last.before

    def pending(self, batch_id: int) -> set[int]:
        """The partitions that run micro-batch ``batch_id`` even without rows: their
        checkpoint holds pending work. None in an era's first micro-batch (every
        partition with state from the previous era runs it anyway)."""
        if self.last is None or self.history[-1][0] == batch_id:
            return set()
        return set(self.last.pending_for(batch_id))

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

    def prune(self, partition: int, partitions: int, era_start: int, keep: int = KEEP) -> None:
        """Keep the newest ``keep`` committed checkpoints of this era in the partition's
        directory (``AecConfig.checkpoints_retained``); older eras' checkpoints stay
        (later eras may still derive from them). Then the files no committed
        checkpoint references go (``CheckpointStore.collect_garbage``: on an object
        store a kept checkpoint may reference files an older one uploaded)."""
        own = self.partition(partition, partitions)
        committed = [i for i in own.checkpoint_ids() if i >= era_start]
        if len(committed) <= keep:
            return
        for old in committed[:-keep]:
            own.delete(old, collect=False)
            own.delete_file(watermarks_name(old))
        own.collect_garbage()


def verify_history(
    location: str,
    layout: Layout | None,
    batch_id: int,
    planned: Mapping[int, list[str]] | None,
    spark_checkpoint: str,
) -> None:
    """Check that the state Spark is about to run micro-batch ``batch_id`` on is the
    state its checkpoint committed (Spark runs ``batch_id`` only after committing
    every earlier one): the layout exists once a micro-batch was committed, its
    record is of ``batch_id - 1`` (or of ``batch_id``, a replay), and the planned
    checkpoints (``planned``: partition -> names; None skips this part, at query
    start) are those the record lists. ``layout`` is the stored one (None or a new,
    empty one when none is stored).

    Raises:
        StateHistoryError: any of these fails (lost, replaced or older state), or
            the record is newer than ``batch_id`` (Spark's checkpoint is older than
            the state).
    """
    committed = batch_id - 1

    def lost(what: str) -> StateHistoryError:
        return StateHistoryError(
            f"the state at {location} has lost its history: Spark's checkpoint "
            f"{spark_checkpoint} has committed micro-batches up to {committed}, but {what}. "
            "Refusing to continue from empty or older state. Restore the state location's "
            f"contents as of micro-batch {committed} (from a backup or the store's object "
            "versioning), or start a new query with a new checkpoint_location (and a new "
            "Spark checkpoint location)."
        )

    if committed < 0:
        return
    if layout is None or not layout.history:  # none stored, or a new one not saved yet
        raise lost("the state location holds no layout.json (emptied, deleted or replaced)")
    record = layout.last
    if record is None:
        return  # a layout written before history records: nothing to compare with
    if record.batch > batch_id:
        raise StateHistoryError(
            f"the state at {location} has finished micro-batch {record.batch}, but Spark's "
            f"checkpoint {spark_checkpoint} runs micro-batch {batch_id}: Spark's checkpoint "
            "is older than the state (reset or replaced); refusing to rewind the state. "
            "Restore Spark's checkpoint, or start a new query with a new checkpoint_location."
        )
    expected = record.expected_before(batch_id)
    if expected is None:
        raise lost(f"the state's newest finished micro-batch is {record.batch}")
    if planned is None:
        return
    found = _union(planned.values())
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("these checkpoints are missing: " + ", ".join(missing))
        if unexpected:
            parts.append("these were not committed with it: " + ", ".join(unexpected))
        raise lost("; ".join(parts))


def relative_names(store: StateStore, handles: list[CheckpointHandle]) -> list[str]:
    """``partition-<p>-of-<n>/chk-<id>`` of each handle (relative to the state root)."""
    root = store.store().name_of("")
    return [handle.path[len(root) :].strip("/").replace("\\", "/") for handle in handles]


def _union(groups: Iterable[Iterable[str]]) -> tuple[str, ...]:
    return tuple(sorted({name for group in groups for name in group}))


def watermarks_name(checkpoint_id: int) -> str:
    return f"watermarks-{checkpoint_id}.json"


def _signed_watermarks(checkpoint_id: int, data: bytes) -> bytes:
    """What a watermarks file's signature covers: its bytes and its checkpoint's id (a
    signed file of another checkpoint put in its place does not verify)."""
    return f"{watermarks_name(checkpoint_id)}\n".encode() + data


def save_watermarks(store: CheckpointStore, batch_id: int, marks: Any) -> None:
    """The generator's progress (``marks.progress()``) beside ``chk-<batch_id>``,
    written before it (the checkpoint's commit covers both; a replay overwrites a
    stale file); signed beside it (``<name>.hmac``) when ``AEC_CHECKPOINT_KEY`` is set,
    as the checkpoint's manifest is."""
    data = json.dumps(marks.progress()).encode()
    key = signing.current_key()
    if key is not None:
        signature = signing.sign(_signed_watermarks(batch_id, data), key)
        store.write_bytes(signature, watermarks_name(batch_id) + ".hmac")
    store.write_bytes(data, watermarks_name(batch_id))


def load_watermarks(sources: list[CheckpointHandle], marks: Any) -> None:
    """Continue the generator (``marks.resume``) from its progress saved beside
    ``sources``: the highest event time seen and the lowest watermark emitted (the
    operator restores the minimum watermark too).

    Raises RuntimeError when a watermarks file is missing; ValueError when
    ``AEC_CHECKPOINT_KEY`` is set and the file is unsigned or its signature does not
    match (before it is parsed).
    """
    progress = []
    key = signing.current_key()
    for handle in sources:
        parent, _, _ = handle.path.rstrip("/").rpartition("/")
        store = CheckpointStore.at(parent)
        name = watermarks_name(handle.checkpoint_id)
        try:
            data = store.read_bytes(name)
        except FileNotFoundError:
            raise RuntimeError(
                f"{store.name_of(name)} is missing: "
                f"checkpoint {handle.path} cannot continue its watermarks"
            ) from None
        if key is not None:
            try:
                signature: bytes | None = store.read_bytes(name + ".hmac")
            except FileNotFoundError:
                signature = None
            signed = _signed_watermarks(handle.checkpoint_id, data)
            signing.check(store.name_of(name), signed, signature, key, name + ".hmac")
        progress.append(json.loads(data))
    marks.resume(progress)


def locations(location: Any, spark_location: Any) -> tuple[str, str]:
    """The state location (path or URI) and Spark's checkpoint location of a
    ``process_keyed_stream`` at ``location`` (``spark_location``: the one given, if any).

    Raises ValueError for a missing location, a local one that is a file, or an
    unresolvable URI scheme.
    """
    if location is None or not isinstance(location, (str, os.PathLike)) or not os.fspath(location):
        raise ValueError(
            "process_keyed_stream needs checkpoint_location: a directory or object-store URI "
            f"for the partitions' state, got {location!r}"
        )
    text = os.fspath(location)
    root = CheckpointStore.at(text)  # ValueError for a scheme pyarrow.fs cannot resolve
    if root.local and os.path.isfile(root.location):
        raise ValueError(
            f"checkpoint_location {text!r} is a file: process_keyed_stream keeps the "
            "partitions' state and Spark's checkpoint in a directory there"
        )
    state = root.child("state").location
    if spark_location is not None:
        return state, os.fspath(spark_location)
    if root.local:
        return state, root.name_of("spark")
    digest = hashlib.sha256(root.location.encode()).hexdigest()[:16]
    return state, os.path.join(tempfile.gettempdir(), "aec-spark-checkpoints", digest)


def batch_ids(directory: str) -> list[int]:
    """The micro-batch ids logged in a local Spark checkpoint log directory (``offsets``,
    ``commits``), ascending; none if it does not exist."""
    try:
        return sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    except FileNotFoundError:
        return []
