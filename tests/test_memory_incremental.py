"""MemoryBackend's incremental snapshots: base + changelog, hard-linked, compacted.

Every checkpoint restores to exactly the state it was taken at, whatever other
checkpoints were deleted; a snapshot after k changed keys writes O(k) new bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from aec import (
    KeyedProcessFunction,
    KeyedProcessOperator,
    ListStateDescriptor,
    Record,
    ValueStateDescriptor,
)
from aec.state import memory_changelog
from backends import MemoryBackend


class Writes(KeyedProcessFunction):
    """value None clears the key; an int updates the value and appends to a list."""

    def open(self, ctx):
        self.value = ctx.get_state(ValueStateDescriptor("value"))
        self.items = ctx.get_state(ListStateDescriptor("items"))

    def process_element(self, value, ctx):
        if value is None:
            self.value.clear()
            self.items.clear()
        else:
            self.value.update(value)
            self.items.add(value)


def state_of(backend):
    return {name: backend.state_items(name) for name in ("value", "items")}


def checkpoints_with_restarts(steps, max_deltas, restarts, directory, reference=None):
    """A checkpoint after every step; before step n in ``restarts`` a new backend
    restores the last one. Returns the handles and the state at each, read from
    ``reference`` (a backend fed the same records by its own operator) or else from
    the live backend. Every backend is closed (the checkpoints keep their links)."""
    backend = MemoryBackend(max_deltas=max_deltas)
    operator = KeyedProcessOperator(Writes(), backend)
    reference_op = None if reference is None else KeyedProcessOperator(Writes(), reference)
    expected, handles, old = [], [], []
    for number, step in enumerate(steps):
        if number in restarts and handles:
            operator.close()
            old.append(backend)
            backend = MemoryBackend(max_deltas=max_deltas)
            operator = KeyedProcessOperator(Writes(), backend)
            operator.restore(handles[-1])
        for key, value in step:
            operator.process(Record(f"k{key}", value))
            if reference_op is not None:
                reference_op.process(Record(f"k{key}", value))
        handles.append(operator.snapshot(number, directory))
        expected.append(state_of(backend if reference is None else reference))
    for previous in old:
        previous.close()
    operator.close()
    backend.close()
    return handles, expected


steps = st.lists(
    st.lists(st.tuples(st.integers(0, 12), st.none() | st.integers(0, 50)), max_size=12),
    min_size=1,
    max_size=12,
)


@given(
    steps=steps,
    max_deltas=st.integers(1, 4),
    deleted=st.sets(st.integers(0, 11)),
    restarts=st.sets(st.integers(1, 11)),
)
def test_every_checkpoint_restores_its_state_after_others_are_deleted(
    steps, max_deltas, deleted, restarts
):
    """With restarts: before step n a new backend restores the last checkpoint and
    continues its chain (adopted), as a Spark task that did not keep the operator."""
    with tempfile.TemporaryDirectory() as directory:
        handles, expected = checkpoints_with_restarts(steps, max_deltas, restarts, directory)
        for number in deleted & set(range(len(steps))):
            shutil.rmtree(handles[number].path)
        for number, handle in enumerate(handles):
            if number in deleted:
                continue
            restored = MemoryBackend()
            KeyedProcessOperator(Writes(), restored).restore(handle)
            assert state_of(restored) == expected[number]


def test_a_snapshot_writes_only_the_changelog_and_links_the_base(tmp_path):
    backend = MemoryBackend(max_deltas=100)
    operator = KeyedProcessOperator(Writes(), backend)
    for key in range(5000):
        operator.process(Record(f"k{key}", key))
    first = operator.snapshot(1, tmp_path)
    operator.process(Record("k7", -1))
    second = operator.snapshot(2, tmp_path)
    base = os.path.join(second.path, "backend", memory_changelog.BASE)
    delta = os.path.join(second.path, "backend", "memory-delta-0.msgpack")
    assert os.stat(base).st_nlink >= 3  # private copy, chk-1 and chk-2: one inode
    assert os.path.samefile(base, os.path.join(first.path, "backend", memory_changelog.BASE))
    assert os.path.getsize(delta) * 100 < os.path.getsize(base)
    restored = MemoryBackend()
    KeyedProcessOperator(Writes(), restored).restore(second)
    assert restored.state_items("value")["k7"] == -1
    assert restored.state_items("items")["k7"] == [7, -1]


def test_many_changes_rebase_and_a_long_changelog_is_folded(tmp_path):
    backend = MemoryBackend(max_deltas=2)
    operator = KeyedProcessOperator(Writes(), backend)
    for key in range(100):
        operator.process(Record(f"k{key}", key))
    operator.snapshot(0, tmp_path)
    listings = []
    for number in range(1, 4):  # one key per snapshot: deltas, folded after 2
        operator.process(Record("k1", number))
        handle = operator.snapshot(number, tmp_path)
        listings.append(sorted(os.listdir(os.path.join(handle.path, "backend"))))
    deltas = [[n for n in names if n.startswith("memory-delta-")] for names in listings]
    assert deltas == [["memory-delta-0.msgpack"], ["memory-delta-0.msgpack", "memory-delta-1.msgpack"],
                      ["memory-delta-0.msgpack"]]  # fmt: skip
    for key in range(60):  # more than half the keys changed: the next snapshot is a base
        operator.process(Record(f"k{key}", None))
    handle = operator.snapshot(9, tmp_path)
    assert os.listdir(os.path.join(handle.path, "backend")) == [memory_changelog.BASE]
    restored = MemoryBackend()
    KeyedProcessOperator(Writes(), restored).restore(handle)
    assert state_of(restored) == state_of(backend)


def test_full_snapshots_when_not_incremental(tmp_path):
    backend = MemoryBackend(incremental=False)
    operator = KeyedProcessOperator(Writes(), backend)
    operator.process(Record("a", 1))
    operator.snapshot(1, tmp_path)
    operator.process(Record("b", 2))
    handle = operator.snapshot(2, tmp_path)
    base = os.path.join(handle.path, "backend", memory_changelog.BASE)
    assert os.listdir(os.path.dirname(base)) == [memory_changelog.BASE]
    assert os.stat(base).st_nlink == 1  # a file of its own, nothing shared
    assert backend.spec().build(0).incremental is False


def test_a_restored_backend_continues_the_chain(tmp_path):
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Writes(), backend)
    for key in range(3000):
        operator.process(Record(f"k{key}", key))
    operator.snapshot(1, tmp_path)
    operator.process(Record("k1", -5))
    first = operator.snapshot(2, tmp_path)
    restored = MemoryBackend()
    again = KeyedProcessOperator(Writes(), restored)
    again.restore(first)
    again.process(Record("k2", -6))
    second = again.snapshot(3, tmp_path)
    names = sorted(os.listdir(os.path.join(second.path, "backend")))
    assert names == sorted([memory_changelog.CHAIN, "memory-delta-0.msgpack",
                            "memory-delta-1.msgpack", memory_changelog.BASE])  # fmt: skip
    assert os.path.samefile(os.path.join(second.path, "backend", memory_changelog.BASE),
                            os.path.join(first.path, "backend", memory_changelog.BASE))  # fmt: skip
    final = MemoryBackend()
    KeyedProcessOperator(Writes(), final).restore(second)
    assert state_of(final) == state_of(restored)
    assert final.state_items("value")["k1"] == -5 and final.state_items("value")["k2"] == -6


def test_writes_are_noted_only_while_a_base_exists(tmp_path):
    """Before the first snapshot (and with ``incremental=False``) the next snapshot is a
    whole base: no list of changed keys is kept, so a job without checkpoints does not
    hold one entry per key it ever wrote."""
    log = memory_changelog.Changelog()
    assert log.dirty is None
    tables = {"value": {k: 1 for k in "abcdefgh"}}  # one change of eight: a delta
    serializers = MemoryBackend().serializers
    log.snapshot(tables, str(tmp_path / "one"), serializers)
    assert log.dirty == set()
    log.dirty.add(("value", "a"))
    tables["value"]["a"] = 2
    log.snapshot(tables, str(tmp_path / "two"), serializers)
    assert memory_changelog.CHAIN in os.listdir(tmp_path / "two")  # a delta
    log.reset()
    assert log.dirty is None
    log.close()
    assert log.dirty is None
    backend = MemoryBackend(incremental=False)
    operator = KeyedProcessOperator(Writes(), backend)
    operator.process(Record("a", 1))
    operator.snapshot(1, tmp_path / "full")
    operator.process(Record("b", 2))
    restored = MemoryBackend()
    KeyedProcessOperator(Writes(), restored).restore(operator.snapshot(2, tmp_path / "full"))
    assert restored.state_items("value") == {"a": 1, "b": 2}
    operator.close()
    backend.close()


def test_a_base_or_delta_changed_in_place_is_refused_by_its_own_digest(tmp_path):
    """Bytes changed with the size and mtime kept (failing media) pass the checkpoint's
    digest this process remembers per inode; the file's own SHA-256 refuses them."""
    import time

    import pytest

    backend = MemoryBackend()
    operator = KeyedProcessOperator(Writes(), backend)
    for key in range(20):
        operator.process(Record(f"k{key}", 1000 + key))
    operator.snapshot(1, tmp_path)
    operator.process(Record("k1", 7001))
    handle = operator.snapshot(2, tmp_path)
    time.sleep(0.15)  # older than the digests' racy window: remembered, then trusted
    KeyedProcessOperator(Writes(), MemoryBackend()).restore(handle)
    for name in (memory_changelog.BASE, "memory-delta-0.msgpack"):
        path = os.path.join(handle.path, "backend", name)
        info = os.stat(path)
        data = bytearray(open(path, "rb").read())
        at = data.rfind((7001 if "delta" in name else 1019).to_bytes(2, "big"))
        data[at : at + 2] = (7002 if "delta" in name else 1018).to_bytes(2, "big")
        with open(path, "r+b") as out:
            out.write(data)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
        with pytest.raises(ValueError, match=f"{name} fails its SHA-256"):
            KeyedProcessOperator(Writes(), MemoryBackend()).restore(handle)
        data[at : at + 2] = (7001 if "delta" in name else 1019).to_bytes(2, "big")
        with open(path, "r+b") as out:
            out.write(data)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    restored = MemoryBackend()
    KeyedProcessOperator(Writes(), restored).restore(handle)
    assert restored.state_items("value")["k1"] == 7001
    operator.close()
    backend.close()
