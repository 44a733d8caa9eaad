"""MemoryBackend's segmented base: a large base split by key, read on first access.

A base of more than ``INLINE_ENTRIES`` entries (``(state, key)`` pairs) is written
as one file of segments instead of one pickle: the keys are spread over
``entries // SEGMENT_ENTRIES`` segments by ``aec.keygroups.key_group_for(key,
segments)`` (a stable hash, the same in every process), and each segment holds
``{state: {key: value}}`` of its keys (``aec.state.memory_format``: each state's
values by its serializer), with its own SHA-256. Layout::

    MAGIC | segments, len(states) (2 x uint64) | state names (msgpack)
          | index: per segment offset, length, entries (3 x uint64), SHA-256 (32 bytes)
          | SHA-256 of everything above | segment 0 | segment 1 | ...

Restoring one reads the header only (``SegmentedBase``: about 56 bytes per
``SEGMENT_ENTRIES`` entries), so a restore does not grow with the state; a
segment is read, checked against its SHA-256 and merged into the live tables
the first time a request touches one of its keys (``LazyBase``), as Flink 2.0's
disaggregated state restores without downloading state. The price moves to
the first micro-batches after a restore (``perf/bench_checkpoint.py`` measures
both). The checkpoint's manifest holds the file's SHA-256 like any other's
(``aec.checkpoint.digests``: checked at a restore in a process that did not
write it); the header's digest is checked when it is opened, each segment's
when it is read (so a byte that changes later is still caught); a mismatch
raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from typing import Any

from aec.keygroups import key_group_for
from aec.state import memory_format
from aec.state.serialization import SAFE, StateSerializers

MAGIC = b"aec-memory-segments/2\n"
INLINE_ENTRIES = 16_384  # a base up to this size stays one pickle, loaded at restore
SEGMENT_ENTRIES = 1_024  # entries per segment, on average
_COUNTS = struct.Struct(">QQ")
_ENTRY = struct.Struct(">QQQ32s")
_DIGEST = 32


def is_large(tables: dict[str, dict[Any, Any]]) -> bool:
    """Whether a base of ``tables`` is written segmented."""
    return sum(len(table) for table in tables.values()) > INLINE_ENTRIES


def write(tables: dict[str, dict[Any, Any]], path: str, serializers: StateSerializers) -> None:
    """Write ``tables`` to ``path`` as a segmented base (O(state), as any base), each
    state's values by its serializer in ``serializers``."""
    entries = sum(len(table) for table in tables.values())
    count = max(1, entries // SEGMENT_ENTRIES)
    buckets: list[dict[str, dict[Any, Any]]] = [{} for _ in range(count)]
    for state, table in tables.items():
        for key, value in table.items():
            bucket = buckets[key_group_for(key, count)]
            found = bucket.get(state)
            if found is None:
                found = bucket[state] = {}
            found[key] = value
    states = SAFE.dumps([str(name) for name in tables])
    index = bytearray()
    payloads = []
    offset = 0
    for bucket in buckets:
        data = memory_format.encode_tables(bucket, serializers)
        size = sum(len(table) for table in bucket.values())
        index += _ENTRY.pack(offset, len(data), size, hashlib.sha256(data).digest())
        payloads.append(data)
        offset += len(data)
    header = MAGIC + _COUNTS.pack(count, len(states)) + states + bytes(index)
    with open(path, "wb") as out:
        out.write(header + hashlib.sha256(header).digest())
        for data in payloads:
            out.write(data)


class SegmentedBase:
    """An open segmented base: its header read and verified, segments on demand.

    The file stays open until ``close``, so the checkpoint directory it came from
    may go (a downloaded copy is removed after the restore; old checkpoints are
    pruned) while segments are still to be read.

    Raises ValueError (``__init__``, ``read``): not a segmented base, a header or
    segment that does not match its SHA-256, or a state stored with a serializer
    other than the one it is registered with in ``serializers``.
    """

    def __init__(self, path: str, serializers: StateSerializers) -> None:
        self.path = path
        self.serializers = serializers
        self._file = open(path, "rb")  # noqa: SIM115 - kept open until close()
        try:
            self._read_header()
        except BaseException:
            self._file.close()
            raise

    def _read_header(self) -> None:
        head = self._file.read(len(MAGIC) + _COUNTS.size)
        if len(head) < len(MAGIC) + _COUNTS.size or not head.startswith(MAGIC):
            raise ValueError(f"{self.path} is not a MemoryBackend segmented base")
        count, states_size = _COUNTS.unpack_from(head, len(MAGIC))
        rest = self._file.read(states_size + count * _ENTRY.size + _DIGEST)
        header, digest = head + rest[:-_DIGEST], rest[-_DIGEST:]
        if len(rest) != states_size + count * _ENTRY.size + _DIGEST or (
            hashlib.sha256(header).digest() != digest
        ):
            raise ValueError(f"{self.path}: the segment index does not match its SHA-256")
        states = SAFE.loads(rest[:states_size])
        if not isinstance(states, list) or not all(isinstance(s, str) for s in states):
            raise ValueError(f"{self.path}: the segment index names no states")
        self.states: list[str] = states
        self.count: int = count
        self._index = memoryview(rest)[states_size : states_size + count * _ENTRY.size]
        self._data = len(header) + _DIGEST

    def entries(self, segment: int) -> int:
        """How many ``(state, key)`` entries segment ``segment`` holds."""
        return int(_ENTRY.unpack_from(self._index, segment * _ENTRY.size)[2])

    def read(self, segment: int) -> dict[str, dict[Any, Any]]:
        """Segment ``segment``'s ``{state: {key: value}}``, verified."""
        offset, size, _, digest = _ENTRY.unpack_from(self._index, segment * _ENTRY.size)
        self._file.seek(self._data + offset)
        data = self._file.read(size)
        if len(data) != size or hashlib.sha256(data).digest() != digest:
            raise ValueError(f"{self.path}: segment {segment} does not match its SHA-256")
        return memory_format.decode_tables(data, self.serializers, f"{self.path} segment {segment}")

    def close(self) -> None:
        self._file.close()


class LazyBase:
    """The segments of a restored base not yet merged into the live tables.

    ``skip``: the ``(state, key)`` pairs the changelog applied after the base
    changed or deleted, whose base value is stale. A live write to a key happens
    only after its segment was merged (``load_keys`` runs before every batch), so
    merging never overwrites newer state.
    """

    def __init__(self, base: SegmentedBase, skip: set[tuple[str, Any]]) -> None:
        self.base = base
        self.skip = skip
        self.pending = set(range(base.count))
        self.unloaded = sum(base.entries(segment) for segment in self.pending)

    @property
    def done(self) -> bool:
        return not self.pending

    def load_keys(self, keys: Iterable[Any], tables: dict[str, dict[Any, Any]]) -> None:
        """Merge the segments holding ``keys`` into ``tables`` (those not merged yet)."""
        count, pending = self.base.count, self.pending
        for key in keys:
            segment = key_group_for(key, count)
            if segment in pending:
                self._merge(segment, tables)

    def load_some(self, tables: dict[str, dict[Any, Any]], entries: int) -> None:
        """Merge pending segments into ``tables`` until about ``entries`` entries came
        in (at least one segment while any is pending)."""
        for segment in sorted(self.pending):
            if entries <= 0:
                return
            entries -= self.base.entries(segment)
            self._merge(segment, tables)

    def load_all(self, tables: dict[str, dict[Any, Any]]) -> None:
        """Merge every pending segment into ``tables``."""
        for segment in sorted(self.pending):
            self._merge(segment, tables)

    def _merge(self, segment: int, tables: dict[str, dict[Any, Any]]) -> None:
        loaded = self.base.read(segment)
        skip = self.skip
        for state, entries in loaded.items():
            table = tables.get(state)
            if table is None:
                table = tables[state] = {}
            if skip:
                entries = {k: v for k, v in entries.items() if (state, k) not in skip}
            table.update(entries)
        self.pending.discard(segment)
        self.unloaded -= self.base.entries(segment)

    def close(self) -> None:
        self.base.close()
