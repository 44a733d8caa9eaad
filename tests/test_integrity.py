"""Nothing lost: corrupt state fails the restore or the batch that reads it, never reads
as empty or as another state, and never reaches a later checkpoint.

Real files throughout: bytes flipped in RocksDB SST files and MemoryBackend segments,
databases reopened, processes killed (``docs/security.md``, "What each backend
detects").
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.checkpoint import digests
from aec.checkpoint.files import list_files
from aec.errors import StateReadError
from aec.keygroups import key_group_for, key_group_range_for, operator_index_for
from aec.runtime.operator import KeyedProcessOperator
from aec.state import memory_changelog, memory_segments
from backends import MemoryBackend, RocksDBBackend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Maps(KeyedProcessFunction):
    """Per record: the key's map size and emptiness, read by scans, then one more entry."""

    def open(self, ctx):
        self.entries = ctx.get_state(MapStateDescriptor("entries"))

    async def process_element(self, value, ctx):
        empty = await self.entries.async_is_empty()
        entries = await self.entries.async_entries()
        ctx.output((ctx.current_key, empty, len(list(entries))))
        await self.entries.async_put(value, value)


class Everything(KeyedProcessFunction):
    """Value, list and map state and a timer per record: each output reads all three."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.seen = ctx.get_state(ListStateDescriptor("seen"))
        self.last = ctx.get_state(MapStateDescriptor("last"))

    async def process_element(self, value, ctx):
        count = await self.count.async_value() + 1
        await self.count.async_update(count)
        await self.seen.async_add(value)
        seen = list(await self.seen.async_get())
        await self.last.async_put(value % 3, value)
        last = sorted(await self.last.async_entries())
        ctx.timer_service.register_event_time_timer(float(value))
        ctx.output((ctx.current_key, count, seen, last))

    def on_timer(self, timestamp, ctx):
        ctx.output((ctx.current_key, "timer", timestamp))


def flip(path: str, offset: int, bit: int = 0) -> None:
    """Flip one bit of ``path`` in place (same inode and size)."""
    with open(path, "r+b") as out:
        out.seek(offset)
        byte = out.read(1)
        out.seek(offset)
        out.write(bytes([byte[0] ^ (1 << bit)]))


def replace_flipped(path: str, offset: int) -> None:
    """A corrupt copy of ``path`` in its place (a new inode, as on another disk or store)."""
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x01
    os.remove(path)
    with open(path, "wb") as out:
        out.write(data)


def largest(directory: str, suffix: str) -> str:
    found = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(suffix)]
    return max(found, key=os.path.getsize)


# --- RocksDB: a corrupt block is an error, never the end of the data -------------------------


def maps_checkpoint(tmp_path, keys: int):
    """A RocksDB checkpoint of ``Maps`` over ``keys`` keys (one entry each)."""
    writer = KeyedProcessOperator(Maps(), RocksDBBackend(tmp_path / "db"))
    for key in range(keys):
        writer.process(Record(key, key))
    handle = writer.snapshot(1, tmp_path / "ckpt")
    writer.backend.close()
    return handle


def test_a_corrupt_block_fails_the_map_scan_naming_state_and_key_group(tmp_path):
    handle = maps_checkpoint(tmp_path, 3000)
    backend = RocksDBBackend(tmp_path / "restored")
    operator = KeyedProcessOperator(Maps(), backend)
    operator.restore(handle)  # every file verified
    sst = largest(str(tmp_path / "restored"), ".sst")  # the live copy: a link of the checkpoint's
    flip(sst, os.path.getsize(sst) // 3)
    with pytest.raises(JobFailure) as failure:
        for key in range(3000):
            operator.process(Record(key, key))
        operator.finish()
    cause = failure.value.__cause__
    assert isinstance(cause, StateReadError), cause
    assert "state 'entries'" in str(cause) and "key group" in str(cause)
    assert "Corruption" in str(cause)
    # every output before the failure saw its whole map: a scan never read as empty
    assert all(not empty and size == 1 for _, empty, size in operator.drain_outputs())
    with pytest.raises(StateReadError, match="state 'entries'"):
        backend.state_items("entries")
    backend.close()


def test_a_corrupt_block_fails_value_reads_naming_the_key_group(tmp_path):
    writer = KeyedProcessOperator(Everything(), RocksDBBackend(tmp_path / "db"))
    for key in range(3000):
        writer.process(Record(key, key, float(key)))
    handle = writer.snapshot(1, tmp_path / "ckpt")
    writer.backend.close()
    backend = RocksDBBackend(tmp_path / "restored")
    operator = KeyedProcessOperator(Everything(), backend)
    operator.restore(handle)
    for name in os.listdir(tmp_path / "restored"):
        if name.endswith(".sst"):
            path = os.path.join(tmp_path / "restored", name)
            flip(path, os.path.getsize(path) // 4)
    with pytest.raises(JobFailure) as failure:
        for key in range(3000):
            operator.process(Record(key, key, float(key)))
    assert isinstance(failure.value.__cause__, StateReadError)
    assert "key group" in str(failure.value.__cause__)
    backend.close()


def test_a_rescaled_restore_refuses_a_corrupt_checkpoint_instead_of_dropping_its_keys(tmp_path):
    config = AecConfig(max_parallelism=16)
    handles = []
    for index in range(2):
        own = key_group_range_for(16, 2, index)
        backend = RocksDBBackend(tmp_path / f"db-{index}")
        operator = KeyedProcessOperator(Maps(), backend, config, key_group_range=own)
        for key in range(3000):
            if operator_index_for(key_group_for(key, 16), 16, 2) == index:
                operator.process(Record(key, key))
        handles.append(operator.snapshot(1, tmp_path / f"ckpt-{index}"))
        backend.close()
    sst = largest(os.path.join(handles[1].path, "backend", "rocksdb"), ".sst")
    replace_flipped(sst, os.path.getsize(sst) // 3)
    merged = RocksDBBackend(tmp_path / "merged")
    with pytest.raises(ValueError, match=r"\.sst does not match its SHA-256"):
        KeyedProcessOperator(Maps(), merged, config).restore(handles)
    merged.close()


def test_a_database_that_fails_to_open_is_closed_again(tmp_path):
    path = str(tmp_path / "db")
    operator = KeyedProcessOperator(Maps(), RocksDBBackend(path))
    operator.process(Record("a", 1))
    operator.finish()
    operator.backend.close()
    # the default column family's table holds only aec's format marker: corrupt its block
    for name in os.listdir(path):
        data = open(os.path.join(path, name), "rb").read() if name.endswith(".sst") else b""
        if b"aec/format" in data:
            flip(os.path.join(path, name), data.index(b"aec/format"))
    failures = []  # kept: a live exception keeps its frames (and a DB left open) alive
    for _ in range(2):
        with pytest.raises(Exception) as failure:  # rocksdict raises a bare Exception
            RocksDBBackend(path).open()
        failures.append(failure)
    errors = [str(failure.value) for failure in failures]
    assert all("Corruption" in e for e in errors), errors
    assert not any("lock hold" in e or "lock file" in e for e in errors), errors  # LOCK released


def test_a_killed_restores_directories_are_removed_when_the_database_opens_again(tmp_path):
    path = tmp_path / "db"
    backend = RocksDBBackend(path)
    backend.open()
    backend.close()
    for leftover in ("db.restore-1234", "db.restore-1234.source-5678", "db.previous-99"):
        os.makedirs(tmp_path / leftover / "x")
    other = tmp_path / "dbx.restore-1"  # another database's: not ours
    os.makedirs(other)
    again = RocksDBBackend(path)
    again.open()
    assert sorted(os.listdir(tmp_path)) == ["db", "dbx.restore-1"]
    again.close()


# --- corruption never propagates into later checkpoints --------------------------------------


class Writes(KeyedProcessFunction):
    def open(self, ctx):
        self.value = ctx.get_state(ValueStateDescriptor("value"))

    def process_element(self, value, ctx):
        return self.value.async_update(value)


def test_a_corrupt_segment_is_refused_before_a_later_checkpoint_can_link_it(tmp_path):
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Writes(), backend)
    for key in range(memory_segments.INLINE_ENTRIES + 2000):
        operator.process(Record(f"k{key}", key))
    first = operator.snapshot(1, tmp_path)
    base = os.path.join(first.path, "backend", memory_changelog.SEGMENTED_BASE)
    replace_flipped(base, os.path.getsize(base) - 5)  # inside the last segment
    digests.forget()  # a restarted task: another process
    restored = KeyedProcessOperator(Writes(), MemoryBackend())
    with pytest.raises(ValueError, match="memory-base.segments does not match its SHA-256"):
        restored.restore(first)
    # the live operator's own base is intact: its next checkpoints stay restorable
    operator.process(Record("k1", -1))
    second = operator.snapshot(2, tmp_path)
    fresh = MemoryBackend()
    KeyedProcessOperator(Writes(), fresh).restore(second)
    assert fresh.state_items("value") == backend.state_items("value")


def test_a_corrupt_sst_is_refused_before_a_later_checkpoint_can_link_it(tmp_path):
    handle = maps_checkpoint(tmp_path, 2000)
    sst = largest(os.path.join(handle.path, "backend", "rocksdb"), ".sst")
    replace_flipped(sst, os.path.getsize(sst) // 2)
    digests.forget()
    backend = RocksDBBackend(tmp_path / "next")
    with pytest.raises(ValueError, match=r"\.sst does not match its SHA-256"):
        KeyedProcessOperator(Maps(), backend).restore(handle)
    assert os.listdir(tmp_path / "ckpt") == ["chk-1"]  # nothing new, nothing pruned
    backend.close()


def test_a_live_file_changed_in_place_is_never_linked_into_the_next_checkpoint(tmp_path):
    # a kept operator (the streaming glue keeps MemoryBackend operators between
    # micro-batches): its base is linked into each checkpoint, one inode
    operator = KeyedProcessOperator(Writes(), MemoryBackend())
    for key in range(3000):
        operator.process(Record(f"k{key}", key))
    first = operator.snapshot(1, tmp_path)
    flip(os.path.join(first.path, "backend", memory_changelog.BASE), 40)
    operator.process(Record("k1", -1))
    with pytest.raises(JobFailure, match="at checkpoint 2") as failure:
        operator.snapshot(2, tmp_path)
    assert "changed since it was written" in str(failure.value.__cause__)
    assert sorted(os.listdir(tmp_path)) == ["chk-1"]


def test_a_live_table_changed_in_place_is_never_linked_into_the_next_checkpoint(tmp_path):
    handle = maps_checkpoint(tmp_path, 2000)
    operator = KeyedProcessOperator(Maps(), RocksDBBackend(tmp_path / "restored"))
    operator.restore(handle)
    sst = largest(str(tmp_path / "restored"), ".sst")
    flip(sst, os.path.getsize(sst) // 2)  # not read by any batch before the snapshot
    operator.process(Record("new key", 1))
    with pytest.raises(JobFailure, match="at checkpoint 2") as failure:
        operator.snapshot(2, tmp_path / "ckpt")
    assert "changed since it was written or restored" in str(failure.value.__cause__)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["chk-1"]
    operator.backend.close()


# --- the property: a flipped bit is refused, or fails a batch; never another state ------------

REST = [Record(k % 40, k, float(k)) for k in range(200, 300)] + [Watermark(250.0)]


def _run_all(backend, restore=None):
    operator = KeyedProcessOperator(Everything(), backend)
    if restore is not None:
        operator.restore(restore)
    for element in REST:
        if isinstance(element, Watermark):
            operator.process_watermark(element)
        else:
            operator.process(element)
    operator.finish()
    return operator.drain_outputs(), {s: backend.state_items(s) for s in ("count", "seen", "last")}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Per backend: a checkpoint (MemoryBackend: a base and a delta) and the outputs and
    final state of replaying ``REST`` on it."""
    root = tmp_path_factory.mktemp("written")
    made = {}
    for name in ("memory", "rocksdb"):
        backend = MemoryBackend() if name == "memory" else RocksDBBackend(root / "db")
        operator = KeyedProcessOperator(Everything(), backend)
        for k in range(150):
            operator.process(Record(k % 40, k, float(k)))
        operator.snapshot(1, root / name)
        for k in range(150, 200):
            operator.process(Record(k % 40, k, float(k)))
        handle = operator.snapshot(2, root / name)
        backend.close()
        fresh = MemoryBackend() if name == "memory" else RocksDBBackend(root / "ref")
        made[name] = (handle.path, _run_all(fresh, handle.path))
        fresh.close()
    return made


@given(data=st.data())
def test_a_flipped_bit_is_refused_at_restore_or_fails_a_batch_never_another_state(
    written, tmp_path_factory, data
):
    name = data.draw(st.sampled_from(sorted(written)), label="backend")
    source, expected = written[name]
    files = [f for f in list_files(source) if os.path.getsize(os.path.join(source, f))]
    file = data.draw(st.sampled_from(files), label="file")  # an empty file has no bit to flip
    size = os.path.getsize(os.path.join(source, file))
    offset = data.draw(st.integers(0, size - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    copy = str(tmp_path_factory.mktemp("flipped") / "chk-2")
    shutil.copytree(source, copy)
    flip(os.path.join(copy, file), offset, bit)
    directory = tmp_path_factory.mktemp("live")
    backend = MemoryBackend() if name == "memory" else RocksDBBackend(directory / "db")
    try:
        try:
            outcome = _run_all(backend, copy)
        except ValueError as refused:  # at restore, naming what is wrong
            assert "chk-2" in str(refused) or "checkpoint" in str(refused)
            return
        except (JobFailure, StateReadError):  # the first batch that read the damage
            return
        assert outcome == expected  # nothing that matters changed (an unused manifest field)
    finally:
        backend.close()
        shutil.rmtree(copy, ignore_errors=True)


# --- temporary directories do not outlive their process -------------------------------------

_LEAVE = textwrap.dedent(
    """
    import os, signal, sys
    from aec import KeyedProcessFunction, Record, ValueStateDescriptor
    from aec.runtime.operator import KeyedProcessOperator
    from backends import MemoryBackend

    class Writes(KeyedProcessFunction):
        def open(self, ctx):
            self.value = ctx.get_state(ValueStateDescriptor("value"))

        def process_element(self, value, ctx):
            return self.value.async_update(value)

    operator = KeyedProcessOperator(Writes(), MemoryBackend())
    operator.process(Record("a", 1))
    operator.snapshot(1, sys.argv[1])
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    """  # never closes the backend
)


def _leave(tmp_path, how: str, checkpoint: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-c", _LEAVE, str(tmp_path / checkpoint), how],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _chains(tmp_path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path / "tmp") if n.startswith("aec-memory-chain-"))


def test_memory_backend_directories_go_at_exit_and_after_a_kill(tmp_path):
    os.makedirs(tmp_path / "tmp")
    done = _leave(tmp_path, "exit", "one")
    assert done.returncode == 0, done.stderr
    assert _chains(tmp_path) == []  # removed at exit although close() was never called
    killed = _leave(tmp_path, "kill", "two")
    assert killed.returncode == -signal.SIGKILL
    assert len(_chains(tmp_path)) == 1  # a kill leaves it...
    done = _leave(tmp_path, "exit", "three")
    assert done.returncode == 0, done.stderr
    assert _chains(tmp_path) == []  # ...until the next backend on this host sweeps it
