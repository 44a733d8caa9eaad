"""TTL cleanup: expired entries are removed without being read (``aec.state.ttl_cleanup``),
so a job writing ever new keys under a TTL keeps a bounded state, on every backend;
removing them never changes an answer (the async run with a sweep in every batch
equals the synchronous run without any sweep).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_time import Expiring

from aec import (
    AecConfig,
    KeyedProcessFunction,
    KeyedProcessOperator,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.clock import ManualClock, ScriptedClock, SystemClock
from aec.runtime.executor import ThreadPoolStateExecutor
from aec.state import ttl_cleanup
from aec.state.ttl_cleanup import TtlCleanup, prune
from aec.testing import assert_equivalent
from backends import MemoryBackend, RocksDBBackend
from backends.sweep_gate import SweepGate

TTL = 10.0


@contextlib.contextmanager
def sweeps(how: str):
    """``"always"``: every batch sweeps every TTL entry it may; ``"never"``: no sweep
    at all (what a backend without cleanup does); ``"default"``: as shipped."""
    with pytest.MonkeyPatch.context() as patch:
        if how == "always":
            patch.setattr(ttl_cleanup, "CLEANUP_SIZE", 1_000_000)
            patch.setattr(ttl_cleanup, "SWEEP_CHUNK", 1)
            patch.setattr(RocksDBBackend, "ttl_sweep_chunk", 0)  # 0: SWEEP_CHUNK
            with contextlib.suppress(ImportError):
                from backends.slatedb import SlateDBBackend

                patch.setattr(SlateDBBackend, "ttl_sweep_chunk", 0)
        elif how == "never":
            patch.setattr(TtlCleanup, "charge", lambda self, requests: 0)
        yield


def make_backend(kind: str, tmp_path, name: str = "db"):
    if kind == "memory":
        return MemoryBackend()
    if kind == "rocksdb":
        return RocksDBBackend(str(tmp_path / name))
    from backends.slatedb import SlateDBBackend

    return SlateDBBackend(f"file://{tmp_path / 'slate'}", name)


# -- the rule --------------------------------------------------------------------------------
def test_prune_keeps_what_is_alive_and_the_same_object_when_nothing_expired():
    pair = ("v", 10.0)
    assert prune("value", pair, 9.9) is pair
    assert prune("value", pair, 10.0) is None  # alive while expiry > now
    stored = [("a", 5.0), ("b", 12.0)]
    assert prune("list", stored, 4.0) is stored
    assert prune("list", stored, 5.0) == [("b", 12.0)]
    assert prune("list", stored, 12.0) is None
    entries = {"x": (1, 5.0), "y": (2, 7.0)}
    assert prune("map", entries, 1.0) is entries
    assert prune("map", entries, 6.0) == {"y": (2, 7.0)}
    assert prune("map", entries, 7.0) is None


def test_a_round_waits_until_time_moves_on_and_budgets_come_from_writes(monkeypatch):
    monkeypatch.setattr(ttl_cleanup, "SWEEP_CHUNK", 8)
    monkeypatch.setattr(ttl_cleanup, "CLEANUP_SIZE", 4)
    cleanup = TtlCleanup()
    assert cleanup.charge(100) == 0  # no TTL state
    cleanup.register("s", 5.0, "value")
    assert cleanup.charge(100) == 0  # no expire() yet: nothing may go
    cleanup.advance(3.0)
    assert cleanup.charge(1) == 0 and cleanup.charge(1) == 8  # 4 entries per write
    calls = []

    def step(state, cursor, limit, now):
        calls.append((state.name, cursor, limit, now))
        return (limit, "more") if cursor is None else (1, None)

    assert cleanup.sweep(8, step) == 8
    assert cleanup.sweep(8, step) == 1  # the rest of the round
    assert cleanup.sweep(8, step) == 0  # the round used now=3: nothing new expired
    cleanup.advance(4.0)
    assert cleanup.sweep(8, step) == 8
    assert calls == [("s", None, 8, 3.0), ("s", "more", 8, 3.0), ("s", None, 8, 4.0)]
    with pytest.raises(ValueError, match="kind"):
        cleanup.register("t", 1.0, "set")
    with pytest.raises(ValueError, match="ttl"):
        cleanup.register("t", 0, "value")


# -- never a different answer ------------------------------------------------------------------
@given(
    rows=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 9)), max_size=30),
    advances=st.lists(st.sampled_from([0, 0, 1, 4, 6, 11]), max_size=30),
    data=st.data(),
)
def test_sweeping_every_batch_never_changes_an_answer(rows, advances, data):
    source = [Record(k, v) for k, v in rows]
    with sweeps("never"):
        reference = run_keyed(source, Expiring(), config=AecConfig(async_state=False),
                              clock=ScriptedClock(advances))  # fmt: skip
    with sweeps("always"):
        swept = run_keyed(source, Expiring(), config=AecConfig(async_state=False),
                          clock=ScriptedClock(advances))  # fmt: skip
        assert swept.outputs == reference.outputs
        assert_equivalent(Expiring, source, data=data, clock_advances=advances)


@pytest.mark.parametrize("kind", ["rocksdb", "slatedb"])
def test_byte_stores_sweeping_every_batch_give_the_sync_answer(kind, tmp_path):
    """Real I/O threads for SlateDB (sweeps and batches kept apart by the gate)."""
    rows = [(f"k{i % 37}", i) for i in range(400)]
    advances = [3.0 if i % 23 == 0 else 0.0 for i in range(400)]
    source = [Record(k, v) for k, v in rows]
    with sweeps("never"):
        reference = run_keyed(source, Expiring(), config=AecConfig(async_state=False),
                              clock=ScriptedClock(advances))  # fmt: skip
    names = iter(range(100))
    with sweeps("always"):
        assert_equivalent(
            Expiring, source, clock_advances=advances, seeds=(0,),
            backend_factory=lambda: make_backend(kind, tmp_path, f"db{next(names)}"),
            executor_factory=(lambda seed: ThreadPoolStateExecutor(4)) if kind == "slatedb" else None,
        )  # fmt: skip
        backend = make_backend(kind, tmp_path, "last")
        swept = run_keyed(source, Expiring(), backend, AecConfig(executor_threads=4),
                          clock=ScriptedClock(advances))  # fmt: skip
    assert swept.outputs == reference.outputs
    assert backend.state_items("map") == reference_state(source, advances, "map")
    backend.close()


def reference_state(source, advances, name):
    backend = MemoryBackend()
    with sweeps("never"):
        run_keyed(source, Expiring(), backend, AecConfig(async_state=False),
                  clock=ScriptedClock(advances))  # fmt: skip
    return backend.state_items(name)


# -- bounded state -----------------------------------------------------------------------------
class Writes(KeyedProcessFunction):
    """Writes each record's key once into a TTL state of ``kind`` (a new key per record)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def open(self, ctx):
        make = {"value": ValueStateDescriptor, "list": ListStateDescriptor,
                "map": MapStateDescriptor}[self.kind]  # fmt: skip
        self.state = ctx.get_state(make("s", ttl=TTL))

    def process_element(self, value, ctx):
        if self.kind == "value":
            return self.state.async_update(value)
        if self.kind == "list":
            return self.state.async_add(value)
        return self.state.async_put(value % 3, value)


def writing(clock: ManualClock, records: int, per_second: int):
    """A new key per record, the clock moving one second every ``per_second`` records."""
    for i in range(records):
        if i and i % per_second == 0:
            clock.advance(1.0)
        yield Record(i, i)


@pytest.mark.parametrize("state_kind", ["value", "list", "map"])
@pytest.mark.parametrize("kind", ["memory", "rocksdb", "slatedb"])
def test_ttl_state_of_ever_new_keys_stays_bounded(kind, state_kind, tmp_path, monkeypatch):
    records, per_second = 6_000, 50  # 120 s; a TTL of 10 s keeps the last 500 keys
    if kind == "slatedb":  # its default chunk (4,096 entries) is most of this state
        from backends.slatedb import SlateDBBackend

        monkeypatch.setattr(SlateDBBackend, "ttl_sweep_chunk", ttl_cleanup.SWEEP_CHUNK)
    live = int(TTL) * per_second
    found = {}
    for how in ("default", "never"):
        clock = ManualClock(0)
        backend = make_backend(kind, tmp_path, how)
        with sweeps(how):
            run_keyed(writing(clock, records, per_second), Writes(state_kind), backend,
                      AecConfig(), clock=clock)  # fmt: skip
        found[how] = backend.stored_entries("s")
        visible = backend.state_items("s")
        backend.close()
        # what a read sees is the same either way: the keys of the last TTL
        assert sorted(visible) == list(range(records - live, records))
    assert found["never"] == records  # without cleanup every key stays
    # c / (c - 1) times the live keys, plus a sweep chunk's worth of slack
    c = ttl_cleanup.CLEANUP_SIZE
    assert found["default"] <= live * c / (c - 1) + ttl_cleanup.SWEEP_CHUNK, found


class WritesEvery(KeyedProcessFunction):
    """Writes each record's key into ``states`` TTL value states (a new key per record)."""

    def __init__(self, states: int) -> None:
        self.count = states

    def open(self, ctx):
        self.states = [ctx.get_state(ValueStateDescriptor(f"s{i}", ttl=TTL))
                       for i in range(self.count)]  # fmt: skip

    async def process_element(self, value, ctx):
        for state in self.states:
            await state.async_update(value)


@pytest.mark.parametrize("kind", ["memory", "rocksdb", "slatedb"])
def test_every_one_of_several_ttl_states_stays_bounded(kind, tmp_path, monkeypatch):
    # the states take turns: the first ones once re-swept their live entries at every
    # clock tick and spent every sweep's budget, so the last grew with every key written
    if kind == "slatedb":
        from backends.slatedb import SlateDBBackend

        monkeypatch.setattr(SlateDBBackend, "ttl_sweep_chunk", ttl_cleanup.SWEEP_CHUNK)
    records, per_second, states = 8_000, 50, 5  # 160 s; a TTL of 10 s keeps 500 keys
    clock = ManualClock(0)
    backend = make_backend(kind, tmp_path)
    run_keyed(writing(clock, records, per_second), WritesEvery(states), backend, AecConfig(),
              clock=clock)  # fmt: skip
    stored = {f"s{i}": backend.stored_entries(f"s{i}") for i in range(states)}
    backend.close()
    live, c = int(TTL) * per_second, ttl_cleanup.CLEANUP_SIZE
    assert all(n <= live * c / (c - 1) + ttl_cleanup.SWEEP_CHUNK for n in stored.values()), stored


def test_a_restored_memory_base_is_swept_too(tmp_path):
    clock = ManualClock(0)
    from aec import KeyedProcessOperator

    first = KeyedProcessOperator(Writes("value"), MemoryBackend(), AecConfig(), clock=clock)
    for record in writing(clock, 20_000, 1000):  # a segmented base (> 16,384 entries)
        first.process(record)
    handle = first.snapshot(1, tmp_path)
    first.close()
    backend = MemoryBackend()
    restored = KeyedProcessOperator(Writes("value"), backend, AecConfig(), clock=clock)
    restored.restore(handle)
    clock.advance(2 * TTL)  # everything restored has expired
    for record in writing(ManualClock(0), 2_000, 2_000):  # new keys 0..1999 (same time)
        restored.process(Record(record.key + 100_000, 0))
    restored.process_watermark(Watermark(1.0))
    for i in range(5_000):
        restored.process(Record(200_000 + i, 0))
    restored.finish()
    assert backend.stored_entries("s") < 10_000  # of 20,000 restored + 7,000 new
    assert len(backend.state_items("s")) == 7_000


def test_redis_expires_ttl_keys_on_its_own(redis_server):
    from backends.redis import TTL_FACTOR, RedisBackend

    backend = RedisBackend(redis_server.url, prefix="ttl")
    ttl = 0.3  # the server drops a key TTL_FACTOR * ttl after its last write
    clock = SystemClock(granularity=0.01)

    class Writer(Writes):
        def open(self, ctx):
            self.state = ctx.get_state(ValueStateDescriptor("s", ttl=ttl))

    written = []

    def paced(seconds: float, per_second: int):
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            written.append(len(written))
            yield Record(written[-1], 0)
            time.sleep(1 / per_second)

    seconds = 3.0
    run_keyed(paced(seconds, 400), Writer("value"), backend, AecConfig(), clock=clock)
    stored = backend.stored_entries("s")
    # the keys of the last TTL_FACTOR * ttl = 0.6 s (a fifth of all), with time for
    # Redis's active expiry; without it, every key written
    assert 0 < stored < len(written) * (TTL_FACTOR * ttl + 0.6) / seconds, (stored, len(written))
    time.sleep(TTL_FACTOR * ttl + 1.0)  # Redis's active expiry samples 10 times a second
    assert backend.stored_entries("s") == 0
    backend.clear()
    backend.close()


def _checkpoint_on_redis(url, prefix, function, tmp_path):
    """A RedisBackend on ``prefix`` after ``function`` wrote keys 0-49 (clock at 0),
    and the checkpoint of it."""
    from aec import KeyedProcessOperator
    from backends.redis import RedisBackend

    source = RedisBackend(url, prefix=prefix)
    operator = KeyedProcessOperator(function, source, AecConfig(), clock=ManualClock(0))
    for i in range(50):
        operator.process(Record(i, i))
    handle = operator.snapshot(1, tmp_path)
    operator.close()
    return source, handle


def test_a_redis_restore_sets_the_expiry_of_ttl_keys(redis_server, tmp_path):
    import redis as redis_py

    from aec import KeyedProcessOperator
    from backends.redis import RedisBackend

    clock = ManualClock(0)
    source, handle = _checkpoint_on_redis(redis_server.url, "ttl-src", Writes("value"), tmp_path)
    target = RedisBackend(redis_server.url, prefix="ttl-dst")
    KeyedProcessOperator(Writes("value"), target, AecConfig(), clock=clock).restore(handle)
    client = redis_py.Redis.from_url(redis_server.url)
    keys = list(client.scan_iter(match=b"ttl-dst:*:s:*"))
    assert len(keys) == 50
    limit = math.ceil(TTL * 2 * 1000)
    assert all(0 < client.pttl(key) <= limit for key in keys)
    assert len(target.state_items("s")) == 50
    for backend in (source, target):
        backend.clear()
        backend.close()


class WritesLazily(Writes):
    """``Writes("value")`` whose TTL state is made by its first record, not ``open``."""

    def open(self, ctx):
        self.ctx = ctx
        self.state = None

    def process_element(self, value, ctx):
        if self.state is None:
            self.state = self.ctx.get_state(ValueStateDescriptor("s", ttl=TTL))
        return self.state.async_update(value)


def test_a_redis_ttl_state_made_after_the_restore_sets_the_expiry_of_its_restored_keys(
    redis_server, tmp_path
):
    """The restore cannot know a TTL state its function makes later: the keys it
    restored get their expiry when the state is made, as if restored with it."""
    import redis as redis_py

    from aec import KeyedProcessOperator
    from backends.redis import RedisBackend

    clock = ManualClock(0)
    source, handle = _checkpoint_on_redis(
        redis_server.url, "lazy-src", WritesLazily("value"), tmp_path
    )
    target = RedisBackend(redis_server.url, prefix="lazy-dst")
    restored = KeyedProcessOperator(WritesLazily("value"), target, AecConfig(), clock=clock)
    restored.restore(handle)
    restored.process(Record(1_000, 0))  # makes the state
    restored.finish()
    client = redis_py.Redis.from_url(redis_server.url)
    keys = list(client.scan_iter(match=b"lazy-dst:*:s:*"))
    assert len(keys) == 51
    limit = math.ceil(TTL * 2 * 1000)
    assert all(0 < client.pttl(key) <= limit for key in keys), [client.pttl(k) for k in keys][:5]
    client.close()
    for backend in (source, target):
        backend.clear()
        backend.close()


def test_the_sweep_gate_lets_a_sweep_run_alone():
    gate = SweepGate()
    inside = threading.Event()
    release = threading.Event()
    order = []

    def batch():
        gate.enter_batch()
        try:
            inside.set()
            release.wait(5)
            order.append("batch")
        finally:
            gate.leave_batch()

    worker = threading.Thread(target=batch)
    worker.start()
    inside.wait(5)
    sweeper_done = threading.Event()

    def sweep():
        with gate.sweep() as alone:
            order.append(("sweep", alone))
        sweeper_done.set()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    time.sleep(0.1)
    assert order == []  # the sweep waits for the batch inside
    with gate.sweep() as alone:  # a second sweep while one waits: nothing to do
        assert alone is False
    release.set()
    worker.join(5)
    sweeper.join(5)
    assert order == ["batch", ("sweep", True)]



def test_a_backend_makes_one_ttl_cleanup_when_two_threads_ask_first(monkeypatch):
    """An I/O thread's first table asks for it while the mailbox thread registers a TTL
    state: both get the same one (a second would lose the registration)."""
    import aec.state.backend as backend_module

    class Slow(TtlCleanup):
        def __init__(self, chunk=0):
            time.sleep(0.05)  # both threads inside at once, without the lock
            super().__init__(chunk)

    monkeypatch.setattr(backend_module, "TtlCleanup", Slow)
    backend = MemoryBackend()
    got = []
    threads = [threading.Thread(target=lambda: got.append(backend.ttl_cleanup)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(got) == 2 and got[0] is got[1] is backend.ttl_cleanup

def _batch_on_another_thread(gate, cleanup):
    """``gate.run_batch`` of a batch of ``cleanup``'s backend, started on a thread:
    the thread, and an event set when the batch ran."""
    ran = threading.Event()
    worker = threading.Thread(
        target=gate.run_batch, args=(cleanup, [], None, lambda requests: ran.set())
    )
    worker.start()
    return worker, ran


@pytest.mark.parametrize("cleanup", [None, TtlCleanup()], ids=["no cleanup", "no TTL state"])
def test_a_batch_without_ttl_states_passes_no_gate(cleanup):
    """Without a TTL state no sweep can touch a batch's keys: the batch runs at once,
    even while a sweep holds the gate (no lock taken per batch)."""
    gate = SweepGate()
    with gate.sweep() as alone:
        assert alone
        worker, ran = _batch_on_another_thread(gate, cleanup)
        assert ran.wait(5)
    worker.join(5)


def test_a_batch_of_a_backend_with_ttl_states_waits_for_the_sweep_inside():
    cleanup = TtlCleanup()
    cleanup.register("s", 60.0, "value")
    gate = SweepGate()
    with gate.sweep() as alone:
        assert alone
        worker, ran = _batch_on_another_thread(gate, cleanup)
        assert not ran.wait(0.2)  # behind the sweep
    assert ran.wait(5)  # let in when it ended
    worker.join(5)
    with gate.sweep() as alone:  # and the batch left the gate
        assert alone


# -- the byte stores' expiry index (backends.ttl_codec) ----------------------------------------
def test_the_index_head_sorts_as_the_expiry_does():
    from aec.state.serialization import SAFE
    from backends.ttl_codec import TtlPairs, head, pair_head

    times = [-1e9, -2.5, -1.0, -0.0, 0.0, 1e-9, 1.0, 59.5, 60.0, 3600.0, 1.8e9, math.inf]
    heads = [head(t) for t in times]
    assert heads == sorted(set(heads))  # strictly increasing (-0.0 just below 0.0)
    pairs = TtlPairs(SAFE)
    for t in times:  # the write path's slice of the stored pair is the same head
        assert pair_head(("v", t), pairs.dumps(("v", t))) == head(t)


def _groups(keys, first, last):
    """The keys of ``keys`` in key groups ``first..last``."""
    from aec.keygroups import key_group_for

    groups = AecConfig().max_parallelism
    return [key for key in keys if first <= key_group_for(key, groups) <= last]


def _written(kind, tmp_path, name, keys, at, groups):
    """An operator of key groups ``groups`` (a ``KeyGroupRange``) on a RocksDB (or
    SlateDB) backend that wrote ``keys`` into TTL state ``s`` at time ``at``; its
    checkpoint handle."""
    from aec import KeyedProcessOperator

    clock = ManualClock(at)
    backend = make_backend(kind, tmp_path, name)
    operator = KeyedProcessOperator(Writes("value"), backend, AecConfig(), clock=clock,
                                    key_group_range=groups)  # fmt: skip
    for key in keys:
        operator.process(Record(key, key))
    handle = operator.snapshot(1, tmp_path / f"chk-{name}")
    operator.close()
    backend.close()
    return handle


@pytest.mark.parametrize("kind", ["rocksdb", "slatedb"])
def test_rescaled_ttl_state_is_swept_from_every_snapshot(kind, tmp_path, monkeypatch):
    """Two snapshots merged into one backend (a rescale): the rows of both are swept
    once they expire, those still alive stay. RocksDB links the first snapshot listed
    and copies the others in, their expiry index with them."""
    from aec import KeyedProcessOperator
    from aec.keygroups import KeyGroupRange

    low, high = _groups(range(2000), 0, 63), _groups(range(2000), 64, 127)
    first = _written(kind, tmp_path, "a", low, 0.0, KeyGroupRange(0, 63))  # expire at 10
    second = _written(kind, tmp_path, "b", high, 5.0, KeyGroupRange(64, 127))  # at 15
    backend = make_backend(kind, tmp_path, "merged")
    clock = ManualClock(12.0)
    operator = KeyedProcessOperator(Writes("value"), backend, AecConfig(), clock=clock)
    operator.restore([second, first])  # the expired rows are the ones copied in
    assert backend.stored_entries("s") == len(low) + len(high)
    operator.process_watermark(Watermark(1.0))  # an epoch ends: entries expired at 12 may go
    with sweeps("always"):
        for key in range(5000, 5010):  # writes earn sweeps
            operator.process(Record(key, key))
        operator.finish()
    assert backend.stored_entries("s") == len(high) + 10  # the first snapshot's rows went
    assert sorted(backend.state_items("s")) == sorted([*high, *range(5000, 5010)])
    operator.close()
    backend.close()


@pytest.mark.parametrize("state_kind", ["value", "list", "map"])
def test_a_rocksdb_ttl_state_without_an_index_gets_one_on_open(state_kind, tmp_path):
    """TTL rows written without an expiry index (a state first opened without TTL, or
    a database from before the index) are indexed when the state is opened with its
    TTL, and then swept like the rest."""
    from aec import KeyedProcessOperator

    path = tmp_path / "db"
    backend = RocksDBBackend(str(path))
    backend.open()
    with pytest.MonkeyPatch.context() as patch:  # rows stored as without the index
        patch.setattr(RocksDBBackend, "_index", lambda self, table: None)
        clock = ManualClock(0.0)
        operator = KeyedProcessOperator(Writes(state_kind), backend, AecConfig(), clock=clock)
        for key in range(300):
            operator.process(Record(key, key))
        operator.finish()
        operator.close()
    backend.close()
    reopened = RocksDBBackend(str(path))
    clock = ManualClock(20.0)  # all 300 expired
    operator = KeyedProcessOperator(Writes(state_kind), reopened, AecConfig(), clock=clock)
    operator.open()
    assert reopened.stored_entries("s") == 300
    operator.process_watermark(Watermark(1.0))
    with sweeps("always"):
        for key in range(1000, 1005):
            operator.process(Record(key, key))
        operator.finish()
    assert reopened.stored_entries("s") == 5
    operator.close()
    reopened.close()


@pytest.mark.parametrize("state_kind", ["value", "list", "map"])
def test_rocksdb_index_entries_read_go_by_range_also_across_a_restore(
    state_kind, tmp_path, monkeypatch
):
    """The expiry index entries a sweep read go by a range delete every few of them
    (``_INDEX_DROP``); those read and not deleted yet when a checkpoint is taken come
    back with the restore, and the sweeps after it pass them harmlessly."""
    import itertools

    import backends.rocksdb as rocksdb_module
    from aec import KeyedProcessOperator

    monkeypatch.setattr(rocksdb_module, "_INDEX_DROP", 7)
    records, per_second = 3_000, 50  # 60 s; a TTL of 10 s keeps the last 500 keys
    clock = ManualClock(0)
    source = writing(clock, records, per_second)
    first = RocksDBBackend(str(tmp_path / "a"))
    operator = KeyedProcessOperator(Writes(state_kind), first, AecConfig(), clock=clock)
    for record in itertools.islice(source, records // 2):
        operator.process(record)
    handle = operator.snapshot(1, tmp_path / "chk")
    operator.close()
    first.close()
    backend = RocksDBBackend(str(tmp_path / "b"))
    operator = KeyedProcessOperator(Writes(state_kind), backend, AecConfig(), clock=clock)
    operator.restore(handle)
    for record in source:
        operator.process(record)
    operator.finish()
    live = int(TTL) * per_second
    assert sorted(backend.state_items("s")) == list(range(records - live, records))
    chunk = RocksDBBackend.ttl_sweep_chunk // ttl_cleanup.CLEANUP_SIZE  # writes per sweep
    assert backend.stored_entries("s") <= live + chunk + per_second
    backend.close()


class HandMovedWallClock(ManualClock):
    """A clock moved by the test but not deterministic (like ``SystemClock``): only due
    timers, and TTL, close epochs at its advances."""

    deterministic = False


class WritesUnderTtl(KeyedProcessFunction):
    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("s", ttl=10.0))

    def process_element(self, value, ctx):
        return self.state.async_update(value)


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@pytest.mark.parametrize("async_state", [True, False], ids=["async", "sync"])
def test_ttl_state_stays_bounded_on_a_wall_clock_without_watermarks(kind, async_state, tmp_path):
    clock = HandMovedWallClock(1000.0)
    backend = MemoryBackend() if kind == "memory" else RocksDBBackend(str(tmp_path / "db"))
    config = AecConfig(async_state=async_state, buffer_size=10)
    operator = KeyedProcessOperator(WritesUnderTtl(), backend, config, clock=clock)
    operator.open()
    per_second, seconds = 50, 120
    for i in range(per_second * seconds):  # ever new keys, one second of clock per 50
        if i and i % per_second == 0:
            clock.advance(1.0)
        operator.process(Record(i, i))
    stored = backend.stored_entries("s")
    operator.finish()
    alive = 10 * per_second  # the keys of the last TTL
    assert stored <= 3 * alive, f"{stored} entries stored of {per_second * seconds} written"


def test_a_rocksdb_sweep_never_deletes_a_value_another_io_thread_just_wrote(
    monkeypatch, tmp_path
):
    """With a thread pool a sweep (on one I/O thread) read a row expired; another
    thread's batch wrote the key again; the sweep's write deleted the fresh value. The
    sweep now runs alone (``backends.sweep_gate``). Here it stalls once between its
    read and its write, which made the loss certain."""
    import backends.rocksdb as rocksdb_module

    monkeypatch.setattr(RocksDBBackend, "ttl_sweep_chunk", 3)  # a sweep at almost every write
    read_expired = rocksdb_module.swept_row
    stalled = []

    def stalling(*args):
        if not stalled:
            stalled.append(True)
            time.sleep(0.05)
        return read_expired(*args)

    monkeypatch.setattr(rocksdb_module, "swept_row", stalling)

    class WriteOrRead(KeyedProcessFunction):
        def open(self, ctx):
            self.value = ctx.get_state(ValueStateDescriptor("v", ttl=10))

        async def process_element(self, value, ctx):
            op, arg = value
            if op == "write":
                await self.value.async_update(arg)
            else:
                ctx.output((ctx.current_key, await self.value.async_value()))

    clock = ManualClock(0)
    keys = [f"k{k}" for k in range(200)]

    def source():
        yield from (Record(k, ("write", 1)) for k in keys)
        clock.set(20)  # every first write expired (at 10)
        yield from (Record(k, ("write", 2)) for k in keys)  # fresh until 30
        clock.set(25)
        yield from (Record(k, ("read", 0)) for k in keys)

    backend = RocksDBBackend(str(tmp_path / "db"))
    result = run_keyed(source(), WriteOrRead(), backend, AecConfig(buffer_size=8),
                       executor=ThreadPoolStateExecutor(4), clock=clock)  # fmt: skip
    backend.close()
    assert stalled
    read = [out for out in result.outputs if not isinstance(out, Watermark)]
    assert sorted(read) == [(k, 2) for k in sorted(keys)]
