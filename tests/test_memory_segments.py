"""MemoryBackend's segmented base: a large base is restored without being read, and
merged segment by segment on first access; the result equals an eager restore.

The thresholds are lowered (``INLINE_ENTRIES``, ``SEGMENT_ENTRIES``) so small runs
take the segmented path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_memory_incremental import Writes, checkpoints_with_restarts, state_of

from aec import JobFailure, KeyedProcessOperator, Record
from aec.keygroups import KeyGroupRange
from aec.state import memory_changelog, memory_segments
from backends import MemoryBackend


@pytest.fixture(autouse=True)
def small_segments(monkeypatch):
    monkeypatch.setattr(memory_segments, "INLINE_ENTRIES", 8)
    monkeypatch.setattr(memory_segments, "SEGMENT_ENTRIES", 4)


def filled(tmp_path, keys=200):
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Writes(), backend)
    for key in range(keys):
        operator.process(Record(f"k{key}", key))
    handle = operator.snapshot(1, tmp_path)
    expected = state_of(backend)
    operator.close()
    return handle, expected


def reads(monkeypatch):
    """The segments read from now on (a list the test inspects)."""
    seen = []
    original = memory_segments.SegmentedBase.read

    def read(self, segment):
        seen.append(segment)
        return original(self, segment)

    monkeypatch.setattr(memory_segments.SegmentedBase, "read", read)
    return seen


def test_a_large_base_is_segmented_and_listed_with_its_digest(tmp_path):
    handle, _ = filled(tmp_path)
    backend_dir = os.path.join(handle.path, "backend")
    assert os.listdir(backend_dir) == [memory_changelog.SEGMENTED_BASE]
    manifest = json.loads(open(os.path.join(handle.path, "MANIFEST.json")).read())
    entry = manifest["files"][f"backend/{memory_changelog.SEGMENTED_BASE}"]
    path = os.path.join(backend_dir, memory_changelog.SEGMENTED_BASE)
    assert entry == {"size": os.path.getsize(path),
                     "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}  # fmt: skip
    assert len(manifest["files"]["timers.msgpack"]["sha256"]) == 64


def test_restore_reads_no_segment_and_a_record_reads_only_its_own(tmp_path, monkeypatch):
    handle, expected = filled(tmp_path)
    seen = reads(monkeypatch)
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Writes(), backend)
    operator.restore(handle)
    assert seen == [] and sum(len(t) for t in backend._tables.values()) == 0
    operator.process(Record("k7", -1))
    assert len(seen) == 1  # the segment of k7, nothing else
    expected["value"]["k7"] = -1
    expected["items"]["k7"] = [7, -1]
    assert state_of(backend) == expected  # reads every segment back
    assert len(set(seen)) == len(seen) == 200 * 2 // 4  # each segment read once
    operator.close()


def test_segments_outlive_the_restored_directory(tmp_path):
    handle, expected = filled(tmp_path)
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Writes(), backend)
    operator.restore(handle)
    shutil.rmtree(handle.path)  # pruned (or a downloaded copy removed) after the restore
    operator.process(Record("k3", 9))
    second = operator.snapshot(2, tmp_path)  # a delta against the adopted base
    expected["value"]["k3"] = 9
    expected["items"]["k3"] = [3, 9]
    assert state_of(backend) == expected
    restored = MemoryBackend()
    KeyedProcessOperator(Writes(), restored).restore(second)
    assert state_of(restored) == expected


def flip(path, offset):
    """Flip one bit of ``path`` in place (same inode and size, a new mtime)."""
    with open(path, "r+b") as out:
        out.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
        byte = out.read(1)
        out.seek(-1, os.SEEK_CUR)
        out.write(bytes([byte[0] ^ 0x01]))


def test_a_corrupt_segment_is_refused_at_restore(tmp_path):
    handle, _ = filled(tmp_path)
    path = os.path.join(handle.path, "backend", memory_changelog.SEGMENTED_BASE)
    flip(path, -3)  # inside the last segment
    backend = MemoryBackend()
    with pytest.raises(ValueError, match="memory-base.segments does not match its SHA-256"):
        KeyedProcessOperator(Writes(), backend).restore(handle)
    assert backend._tables == {} and backend._lazy is None


def test_a_segment_corrupted_after_the_restore_fails_the_batch_that_reads_it(tmp_path):
    handle, _ = filled(tmp_path)
    operator = KeyedProcessOperator(Writes(), MemoryBackend())
    operator.restore(handle)  # verified; the base is linked, not read
    flip(os.path.join(handle.path, "backend", memory_changelog.SEGMENTED_BASE), -3)
    with pytest.raises(JobFailure) as failure:
        for key in range(200):
            operator.process(Record(f"k{key}", 0))
    assert "SHA-256" in str(failure.value.__cause__)


def test_a_corrupt_segment_index_fails_the_restore(tmp_path):
    handle, _ = filled(tmp_path)
    path = os.path.join(handle.path, "backend", memory_changelog.SEGMENTED_BASE)
    data = bytearray(open(path, "rb").read())
    data[len(memory_segments.MAGIC) + 20] ^= 0x01  # the state names / index
    with open(path, "wb") as out:
        out.write(data)
    backend = MemoryBackend()
    with pytest.raises(ValueError, match="SHA-256|segmented base"):
        KeyedProcessOperator(Writes(), backend).restore(handle)
    assert backend._tables == {} and backend._lazy is None


steps = st.lists(
    st.lists(st.tuples(st.integers(0, 30), st.none() | st.integers(0, 50)), max_size=20),
    min_size=1,
    max_size=10,
)


@given(steps=steps, max_deltas=st.integers(1, 3), restarts=st.sets(st.integers(1, 9)),
       rescaled=st.booleans())  # fmt: skip
def test_lazy_restores_equal_an_uninterrupted_run(steps, max_deltas, restarts, rescaled):
    """Restarts restore the last checkpoint lazily (some segments never read before
    the next snapshot, deltas, folds and rebases included); every checkpoint then
    restores to the reference, lazily or eagerly (a restore filtered to every key group)."""
    with tempfile.TemporaryDirectory() as directory:
        handles, expected = checkpoints_with_restarts(
            steps, max_deltas, restarts, directory, reference=MemoryBackend()
        )
        for number, handle in enumerate(handles):
            restored = MemoryBackend()
            if rescaled:
                restored.restore([os.path.join(handle.path, "backend")], KeyGroupRange(0, 127), 128)
            else:
                KeyedProcessOperator(Writes(), restored).restore(handle)
            assert state_of(restored) == expected[number]
