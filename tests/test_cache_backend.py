"""CachedBackend: the backend conformance suite, equality with MemoryBackend on random
batches (also across flushes and evictions), write-back, failures, metrics, and an
engine-level equivalence run over real I/O threads."""

from __future__ import annotations

import os
import pickle
import random
import threading
from collections.abc import Iterator

import pytest
from engine_helpers import Counter, Everything
from hypothesis import given
from hypothesis import strategies as st
from test_backends import (
    KEYS,
    MIXES,
    TestListState,
    TestMapState,
    TestValueState,
    clone_request,
    list_ops,
    map_ops,
    normalized,
    one_op,
    req,
    request_batches,
    run,
    run_in_threads,
    test_list_chunks_concatenate_to_the_list,
    test_map_chunks_concatenate_to_the_map,
    test_restore_from_missing_directory,
    test_restore_is_the_union_of_snapshots_in_the_key_groups,
    test_restore_of_one_snapshot_into_smaller_ranges,
    test_restore_of_two_of_three_snapshots_in_another_order,
    test_restore_refuses_bad_arguments_before_changing_anything,
    test_restore_with_a_missing_snapshot_changes_nothing,
    test_snapshot_then_restore_rolls_back,
    value_ops,
)

from aec import AecConfig, Record, Watermark
from aec.runtime.executor import ThreadPoolStateExecutor
from aec.runtime.run import run_keyed
from aec.state.backend import StateBackend
from aec.state.memory import MemoryBackend
from aec.state.requests import Op
from aec.testing import assert_equivalent
from backends.cache import CachedBackend, CachedSpec
from backends.cache_entries import answer_value_hits
from backends.keycodec import encode_key
from backends.latency import LatencyBackend
from backends.rocksdb import RocksDBBackend

__all__ = [  # the imported conformance tests run here against the fixtures below
    "TestListState",
    "TestMapState",
    "TestValueState",
    "test_list_chunks_concatenate_to_the_list",
    "test_map_chunks_concatenate_to_the_map",
    "test_restore_from_missing_directory",
    "test_restore_is_the_union_of_snapshots_in_the_key_groups",
    "test_restore_of_one_snapshot_into_smaller_ranges",
    "test_restore_of_two_of_three_snapshots_in_another_order",
    "test_restore_refuses_bad_arguments_before_changing_anything",
    "test_restore_with_a_missing_snapshot_changes_nothing",
    "test_snapshot_then_restore_rolls_back",
]

CACHES = {
    "tiny": lambda tmp: CachedBackend(MemoryBackend(), capacity_entries=2),
    "latency": lambda tmp: CachedBackend(
        LatencyBackend(MemoryBackend(), 0.0005), capacity_entries=1000
    ),
    "bytes": lambda tmp: CachedBackend(MemoryBackend(), capacity_bytes=400),
}


@pytest.fixture(params=sorted(CACHES))
def backend(request, tmp_path) -> Iterator[StateBackend]:
    instance = CACHES[request.param](str(tmp_path))
    instance.open()
    yield instance
    instance.close()


SNAPSHOTTING = {
    "tiny-memory": lambda tmp: CachedBackend(MemoryBackend(), capacity_entries=2),
    "rocksdb": lambda tmp: CachedBackend(
        LatencyBackend(RocksDBBackend(os.path.join(tmp, "db")), 0), capacity_entries=3
    ),
}


@pytest.fixture(params=sorted(SNAPSHOTTING))
def snapshotting(request, tmp_path) -> Iterator[StateBackend]:
    instance = SNAPSHOTTING[request.param](str(tmp_path))
    instance.open()
    yield instance
    instance.close()


@pytest.fixture(params=["memory", "rocksdb"])
def rescaling(request, tmp_path):
    """``make(name)``: a new, open CachedBackend (3 entries) over memory or RocksDB."""
    made: list[CachedBackend] = []

    def make(name: str) -> CachedBackend:
        remote = (
            MemoryBackend() if request.param == "memory" else RocksDBBackend(str(tmp_path / name))
        )
        made.append(CachedBackend(remote, capacity_entries=3))
        made[-1].open()
        return made[-1]

    yield make
    for instance in made:
        instance.close()


class Recording(StateBackend):
    """A MemoryBackend that records the batches it gets and can be made to fail."""

    blocking = False

    def __init__(self) -> None:
        self.memory = MemoryBackend()
        self.batches: list[list[tuple]] = []
        self.fail = False
        self.flushes = 0
        self.closed = False

    def execute_batch(self, requests) -> None:
        if self.fail:
            raise OSError("remote store unavailable")
        self.batches.append([(Op.NAMES[r.op], r.state, r.key) for r in requests])
        self.memory.execute_batch(requests)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True

    def snapshot(self, directory: str) -> None:
        self.memory.snapshot(directory)

    def restore(self, directory: str) -> None:
        self.memory.restore(directory)

    def state_items(self, state: str):
        return self.memory.state_items(state)


# --- property: CachedBackend == MemoryBackend ---------------------------------------------

CHUNK_READS = st.one_of(
    one_op(Op.LIST_GET_CHUNK, "l", KEYS, value=st.tuples(st.none(), st.integers(1, 3))),
    one_op(Op.MAP_ITER_CHUNK, "m", KEYS, value=st.tuples(st.none(), st.integers(1, 3))),
)
CACHE_MIXES = {
    **MIXES,
    "with-chunks": request_batches(st.one_of(value_ops(KEYS), list_ops(KEYS), map_ops(KEYS), CHUNK_READS)),
}  # fmt: skip


def _comparable(request):
    """Results comparable across backends: map order and chunk cursors are the backend's."""
    if request.op == Op.LIST_GET_CHUNK:
        items, cursor = request.result
        return items, cursor is None
    if request.op == Op.MAP_ITER_CHUNK:
        items, cursor = request.result
        return len(items), cursor is None, dict(items) if cursor is None else None
    return normalized(request)


def _check_same(cached: CachedBackend, memory: MemoryBackend, batches, flushes) -> None:
    for batch, flush in zip(batches, flushes, strict=False):
        mine = [clone_request(r) for r in batch]
        memory.execute_batch(batch)
        cached.execute_batch(mine)
        assert [_comparable(r) for r in mine] == [_comparable(r) for r in batch], batch
        if flush:
            cached.flush()
            for state in ("v", "l", "m"):
                assert cached.remote.state_items(state) == memory.state_items(state), state
    cached.flush()
    for state in ("v", "l", "m"):
        assert cached.remote.state_items(state) == memory.state_items(state), state
        assert cached.state_items(state) == memory.state_items(state), state


@pytest.mark.parametrize("mix", sorted(CACHE_MIXES))
def test_cache_matches_memory_on_random_batches(mix):
    @given(
        batches=CACHE_MIXES[mix],
        capacity=st.integers(1, 4),
        flushes=st.lists(st.booleans(), max_size=5),
    )
    def check(batches, capacity, flushes):
        cached = CachedBackend(MemoryBackend(), capacity_entries=capacity)
        _check_same(cached, MemoryBackend(), batches, flushes)

    check()


@given(batches=MIXES["mixed"], capacity=st.integers(1, 2000))
def test_cache_by_bytes_matches_memory_on_random_batches(batches, capacity):
    cached = CachedBackend(MemoryBackend(), capacity_bytes=capacity)
    _check_same(cached, MemoryBackend(), batches, [])


# --- write-back ---------------------------------------------------------------------------


def _write_some(cache: CachedBackend) -> None:
    run(
        cache,
        req(Op.VALUE_PUT, "v", "a", value=1),
        req(Op.LIST_ADD_ALL, "l", "a", value=[1, 2]),
        req(Op.MAP_PUT, "m", "a", user_key="x", value=3),
    )


def test_writes_reach_the_remote_only_on_flush():
    remote = Recording()
    cache = CachedBackend(remote)
    _write_some(cache)
    assert remote.batches == [[("LIST_GET", "l", "a")]]  # LIST_ADD_ALL reads; no writes
    assert all(remote.memory.state_items(s) == {} for s in ("v", "l", "m"))
    cache.flush()
    assert remote.memory.state_items("v") == {"a": 1}
    assert remote.memory.state_items("l") == {"a": [1, 2]}
    assert remote.memory.state_items("m") == {"a": {"x": 3}}
    assert cache.flushes == 1 and remote.flushes == 1
    sent = len(remote.batches)
    cache.flush()  # nothing dirty: no remote batch
    assert len(remote.batches) == sent and cache.flushes == 2
    # clean entries stay cached: reads hit without a remote call
    assert run(cache, req(Op.VALUE_GET, "v", "a"), req(Op.LIST_GET, "l", "a")) == [1, [1, 2]]
    assert len(remote.batches) == sent


def test_list_add_on_an_uncached_list_reads_it_once():
    remote = Recording()
    run(remote, req(Op.LIST_ADD, "l", "a", value=0))
    cache = CachedBackend(remote)
    results = run(
        cache,
        req(Op.LIST_ADD, "l", "a", value=1),
        req(Op.LIST_ADD, "l", "a", value=2),
        req(Op.LIST_GET, "l", "a"),
    )
    assert results == [None, None, [0, 1, 2]]
    assert remote.batches[-1] == [("LIST_GET", "l", "a")]


def test_a_batch_folds_its_misses_into_one_remote_batch():
    remote = Recording()
    cache = CachedBackend(remote)
    results = run(
        cache,
        req(Op.VALUE_GET, "v", 1),
        req(Op.VALUE_GET, "v", 1),
        req(Op.VALUE_GET, "v", 2),
        req(Op.MAP_GET, "m", 1, user_key="x"),
        req(Op.MAP_CONTAINS, "m", 1, user_key="x"),
        req(Op.MAP_ITER, "m", 2),
        req(Op.MAP_GET, "m", 2, user_key="y"),
    )
    assert results == [None, None, None, None, False, [], None]
    assert remote.batches == [
        [
            ("VALUE_GET", "v", 1),
            ("VALUE_GET", "v", 2),
            ("MAP_CONTAINS", "m", 1),
            ("MAP_GET", "m", 1),
            ("MAP_ITER", "m", 2),
        ]
    ]
    assert cache.fetches == 5 and (cache.hits, cache.misses) == (0, 7)


def test_reads_after_writes_of_the_batch_need_no_remote_call():
    remote = Recording()
    cache = CachedBackend(remote)
    results = run(
        cache,
        req(Op.VALUE_PUT, "v", "new", value=5),
        req(Op.VALUE_GET, "v", "new"),
        req(Op.LIST_PUT, "l", "new", value=[1]),
        req(Op.LIST_ADD, "l", "new", value=2),
        req(Op.LIST_GET, "l", "new"),
        req(Op.MAP_PUT, "m", "new", user_key="x", value=1),
        req(Op.MAP_GET, "m", "new", user_key="x"),
        req(Op.MAP_CLEAR, "m", "other"),
        req(Op.MAP_IS_EMPTY, "m", "other"),
    )
    assert results == [None, 5, None, None, [1, 2], None, 1, None, True]
    assert remote.batches == [] and cache.misses == 0 and cache.hits == 5


def test_a_value_batch_memory_answers_runs_without_a_plan_in_order_and_keeps_lru_order():
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=2)
    run(cache, req(Op.VALUE_PUT, "v", "a", value=1), req(Op.VALUE_PUT, "v", "b", value=2))
    batch = [req(Op.VALUE_GET, "v", "b"), req(Op.VALUE_PUT, "v", "a", value=3),
             req(Op.VALUE_GET, "v", "a"), req(Op.VALUE_CLEAR, "v", "b"),
             req(Op.VALUE_GET, "v", "b")]  # fmt: skip
    with cache._lock:
        assert answer_value_hits(cache._index, cache._dirty, batch) == 3
    assert [r.result for r in batch] == [2, None, 3, None, None]
    assert list(cache._index) == [("v", "b"), ("v", "a")]  # first used first: "b" goes next
    run(cache, req(Op.VALUE_PUT, "v", "c", value=4))  # evicts "b": its clear is written back
    cache.flush()
    assert remote.memory.state_items("v") == {"a": 3, "c": 4} and remote.batches[0][0] == (
        "VALUE_PUT", "v", "b",
    )  # fmt: skip
    # an uncached key or a list request: planned instead
    for other in ([req(Op.VALUE_GET, "v", "z")], [req(Op.LIST_GET, "l", "a")]):
        with cache._lock:
            assert answer_value_hits(cache._index, cache._dirty, other) is None
    assert (cache.hits, cache.misses) == (0, 0)  # counted by the backend, not here


def test_hit_rate_counts_reads():
    cache = CachedBackend(MemoryBackend())
    assert cache.hit_rate == 0.0
    run(cache, req(Op.VALUE_GET, "v", "a"))  # miss
    run(cache, req(Op.VALUE_GET, "v", "a"), req(Op.VALUE_PUT, "v", "a", value=1))  # hit
    run(cache, req(Op.VALUE_GET, "v", "a"), req(Op.VALUE_GET, "v", "b"))  # hit, miss
    assert (cache.hits, cache.misses) == (2, 2) and cache.hit_rate == 0.5


def test_eviction_writes_back_with_the_next_remote_call():
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=1)
    run(cache, req(Op.VALUE_PUT, "v", "a", value=1))
    run(cache, req(Op.VALUE_PUT, "v", "b", value=2))  # evicts "a" (dirty): queued
    assert cache.evictions == 1 and cache.entries == 1 and remote.batches == []
    assert remote.memory.state_items("v") == {}
    assert run(cache, req(Op.VALUE_GET, "v", "c")) == [None]  # a miss: "a" rides along
    assert remote.batches == [[("VALUE_PUT", "v", "a"), ("VALUE_GET", "v", "c")]]
    assert remote.memory.state_items("v") == {"a": 1}
    assert cache.written_back == 1
    # "a" comes back from the remote; "b" (evicted by "c") was still queued
    assert run(cache, req(Op.VALUE_GET, "v", "a")) == [1]
    assert remote.batches[-1] == [("VALUE_PUT", "v", "b"), ("VALUE_GET", "v", "a")]
    cache.flush()
    assert remote.memory.state_items("v") == {"a": 1, "b": 2}


def test_an_evicted_entry_is_revived_without_a_remote_read():
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=1)
    run(cache, req(Op.MAP_PUT, "m", "a", user_key="x", value=1))
    run(cache, req(Op.VALUE_PUT, "v", "b", value=2))  # evicts map "a" (dirty): queued
    assert run(cache, req(Op.MAP_GET, "m", "a", user_key="x")) == [1]
    assert remote.batches == [] and cache.hits == 1
    cache.flush()
    assert remote.memory.state_items("m") == {"a": {"x": 1}}
    assert remote.memory.state_items("v") == {"b": 2}


def test_a_full_write_back_queue_is_sent_on_its_own(monkeypatch):
    import backends.cache as cache_module

    monkeypatch.setattr(cache_module, "WRITEBACK_QUEUE_LIMIT", 3)
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=1)
    for key in range(4):  # blind writes never read: the queue fills
        run(cache, req(Op.VALUE_PUT, "v", key, value=key))
    assert remote.batches == [[("VALUE_PUT", "v", k) for k in range(3)]]
    assert remote.memory.state_items("v") == {0: 0, 1: 1, 2: 2}


def test_capacity_in_bytes_bounds_the_cache():
    cache = CachedBackend(MemoryBackend(), capacity_bytes=2000)
    for key in range(20):
        run(cache, req(Op.VALUE_PUT, "v", key, value="x" * 300))
        assert cache.bytes <= 2000
    assert cache.evictions > 0 and 0 < cache.entries < 20
    cache.flush()
    assert cache.state_items("v") == {k: "x" * 300 for k in range(20)}


def test_map_chunks_stay_consistent_across_evictions_and_writes():
    remote = MemoryBackend()
    cache = CachedBackend(remote, capacity_entries=2)
    entries = {f"k{i}": i for i in range(9)}
    run(cache, req(Op.MAP_PUT_ALL, "m", "a", value=entries))  # 9 entries: evicted at once
    run(cache, req(Op.VALUE_GET, "v", "z"))  # sends the map back to the remote
    assert remote.state_items("m") == {"a": entries}
    items, cursor = [], None
    while True:
        (chunk, cursor), _ = run(
            cache,
            req(Op.MAP_ITER_CHUNK, "m", "a", value=(cursor, 2)),
            req(Op.VALUE_PUT, "v", len(items), value=1),
        )
        items += chunk
        run(cache, req(Op.VALUE_GET, "v", f"other{len(items)}"))  # evict and reload between
        if cursor is None:
            break
    assert items == sorted(entries.items(), key=lambda kv: encode_key(kv[0]))
    (full,) = run(cache, req(Op.MAP_ITER, "m", "a"))
    assert full == items


def test_map_order_matches_rocksdb(tmp_path):
    rocks = RocksDBBackend(str(tmp_path / "db"))
    rocks.open()
    cache = CachedBackend(MemoryBackend())
    entries = {9: "a", 10: "b", "x": 1, (1, "t"): 2, 2.5: 3, b"raw": 4}
    for backend in (rocks, cache):
        run(backend, req(Op.MAP_PUT_ALL, "m", "k", value=entries))
    assert run(cache, req(Op.MAP_ITER, "m", "k")) == run(rocks, req(Op.MAP_ITER, "m", "k"))
    rocks.close()


# --- failures ------------------------------------------------------------------------------


def test_a_failed_flush_keeps_every_write_and_raises():
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=2)
    _write_some(cache)
    run(cache, req(Op.VALUE_PUT, "v", "b", value=2))  # evictions: some entries queued
    remote.fail = True
    with pytest.raises(OSError, match="unavailable"):
        cache.flush()
    assert cache.flushes == 0 and remote.flushes == 0
    assert run(cache, req(Op.VALUE_GET, "v", "b")) == [2]  # a hit: still served
    remote.fail = False
    cache.flush()
    assert remote.memory.state_items("v") == {"a": 1, "b": 2}
    assert remote.memory.state_items("l") == {"a": [1, 2]}
    assert remote.memory.state_items("m") == {"a": {"x": 3}}


def test_a_failed_ride_along_write_back_is_kept():
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=1)
    run(cache, req(Op.VALUE_PUT, "v", "a", value=1))
    run(cache, req(Op.VALUE_PUT, "v", "b", value=2))  # "a" queued
    remote.fail = True
    with pytest.raises(OSError):
        run(cache, req(Op.VALUE_GET, "v", "c"))
    remote.fail = False
    assert run(cache, req(Op.VALUE_GET, "v", "a"), req(Op.VALUE_GET, "v", "c")) == [1, None]
    cache.flush()
    assert remote.memory.state_items("v") == {"a": 1, "b": 2}


def test_flush_sends_large_write_sets_in_several_batches(monkeypatch):
    import backends.cache as cache_module

    monkeypatch.setattr(cache_module, "FLUSH_BATCH_REQUESTS", 4)
    remote = Recording()
    cache = CachedBackend(remote)
    run(cache, *[req(Op.VALUE_PUT, "v", key, value=key) for key in range(10)])
    cache.flush()
    assert [len(batch) for batch in remote.batches] == [4, 4, 2]
    assert remote.memory.state_items("v") == {k: k for k in range(10)}


def test_a_flush_failing_halfway_keeps_the_rest_dirty(monkeypatch):
    import backends.cache as cache_module

    monkeypatch.setattr(cache_module, "FLUSH_BATCH_REQUESTS", 4)

    class FailsOnce(Recording):
        fail_at: int | None = 1  # the remote batch (by index) that fails

        def execute_batch(self, requests) -> None:
            if len(self.batches) == self.fail_at:
                self.fail_at = None
                raise OSError("remote store unavailable")
            super().execute_batch(requests)

    remote = FailsOnce()
    cache = CachedBackend(remote)
    run(cache, *[req(Op.VALUE_PUT, "v", key, value=key) for key in range(10)])
    with pytest.raises(OSError):
        cache.flush()
    assert len(remote.memory.state_items("v")) == 4  # the first batch landed
    cache.flush()  # writes only what is still dirty
    assert [len(batch) for batch in remote.batches] == [4, 4, 2]
    assert remote.memory.state_items("v") == {k: k for k in range(10)}


def test_a_failed_standalone_write_back_is_kept(monkeypatch):
    import backends.cache as cache_module

    monkeypatch.setattr(cache_module, "WRITEBACK_QUEUE_LIMIT", 2)
    remote = Recording()
    cache = CachedBackend(remote, capacity_entries=1)
    run(cache, req(Op.VALUE_PUT, "v", 0, value=0))
    run(cache, req(Op.VALUE_PUT, "v", 1, value=1))
    remote.fail = True
    with pytest.raises(OSError):
        run(cache, req(Op.VALUE_PUT, "v", 2, value=2))  # the queue reaches 2: sent, fails
    remote.fail = False
    assert run(cache, req(Op.VALUE_GET, "v", 0)) == [0]  # revived from the queue
    cache.flush()
    assert remote.memory.state_items("v") == {0: 0, 1: 1, 2: 2}


def test_a_malformed_request_fails_its_batch_but_releases_its_entries():
    cache = CachedBackend(MemoryBackend(), capacity_entries=1)
    run(cache, req(Op.LIST_ADD, "l", "a", value=1))
    with pytest.raises(TypeError):
        run(cache, req(Op.LIST_ADD_ALL, "l", "a", value=5))  # not iterable
    run(cache, req(Op.VALUE_PUT, "v", "b", value=1))
    assert cache.entries == 1  # "a" was unpinned, so it could be evicted
    assert "capacity_entries=1" in repr(cache)
    assert cache.state_items("l") == {"a": [1]}


def test_a_failed_flush_on_close_still_closes_the_remote():
    remote = Recording()
    cache = CachedBackend(remote)
    run(cache, req(Op.VALUE_PUT, "v", "a", value=1))
    remote.fail = True
    with pytest.raises(OSError):
        cache.close()
    assert remote.closed
    cache.close()  # idempotent


def test_a_state_used_as_two_kinds_is_rejected():
    cache = CachedBackend(MemoryBackend())
    run(cache, req(Op.VALUE_PUT, "s", 1, value=1))
    with pytest.raises(ValueError, match="value state"):
        run(cache, req(Op.LIST_GET, "s", 1))
    assert run(cache, req(Op.VALUE_GET, "s", 1)) == [1]  # the failed plan unpinned


# --- concurrency ---------------------------------------------------------------------------


def _random_batch(rng: random.Random, keys: list) -> list:
    ops = []
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(keys)
        kind = rng.randrange(6)
        if kind == 0:
            ops.append(req(Op.VALUE_GET, "v", key))
        elif kind == 1:
            ops.append(req(Op.VALUE_PUT, "v", key, value=rng.randint(0, 9)))
        elif kind == 2:
            ops.append(req(Op.LIST_ADD, "l", key, value=rng.randint(0, 9)))
        elif kind == 3:
            ops.append(req(Op.LIST_GET, "l", key))
        elif kind == 4:
            ops.append(req(Op.MAP_PUT, "m", key, user_key=rng.randint(0, 3), value=1))
        else:
            ops.append(req(Op.MAP_ITER, "m", key))
    return ops


def test_concurrent_batches_of_disjoint_keys_share_a_tiny_cache():
    """Threads evict each other's entries; write-backs ride along other threads' calls."""
    cache = CachedBackend(LatencyBackend(MemoryBackend(), 0.0002), capacity_entries=3)
    reference = MemoryBackend()
    reference_lock = threading.Lock()

    def worker(thread: int) -> None:
        rng = random.Random(thread)
        keys = [(thread, k) for k in range(4)]
        for _ in range(60):
            batch = _random_batch(rng, keys)
            mine = [clone_request(r) for r in batch]
            cache.execute_batch(mine)
            with reference_lock:
                reference.execute_batch(batch)
            assert [normalized(r) for r in mine] == [normalized(r) for r in batch]

    run_in_threads(worker, 4)
    assert cache.evictions > 0 and cache.written_back > 0
    for state in ("v", "l", "m"):
        assert cache.state_items(state) == reference.state_items(state)


# --- lifecycle, spec, arguments ------------------------------------------------------------


def test_snapshot_flushes_and_restore_drops_the_cache(tmp_path):
    remote = MemoryBackend()
    cache = CachedBackend(remote)
    run(cache, req(Op.VALUE_PUT, "v", "a", value=1))
    cache.snapshot(str(tmp_path / "snap"))
    assert remote.state_items("v") == {"a": 1}  # flushed first
    run(cache, req(Op.VALUE_PUT, "v", "a", value=2), req(Op.VALUE_PUT, "v", "b", value=3))
    cache.restore(str(tmp_path / "snap"))
    assert cache.entries == 0
    assert run(cache, req(Op.VALUE_GET, "v", "a"), req(Op.VALUE_GET, "v", "b")) == [1, None]
    cache.flush()  # the dropped dirty writes never reach the remote
    assert remote.state_items("v") == {"a": 1}


def test_blocking_follows_the_remote():
    assert CachedBackend(MemoryBackend()).blocking is False
    assert CachedBackend(LatencyBackend(MemoryBackend(), 0)).blocking is True


def test_spec_pickles_and_builds_a_cache_per_partition(tmp_path):
    backend = CachedBackend(
        LatencyBackend(RocksDBBackend(str(tmp_path / "base")), 0.0), capacity_entries=10
    )
    spec = pickle.loads(pickle.dumps(backend.spec()))
    assert isinstance(spec, CachedSpec)
    built = spec.build(1)
    assert isinstance(built, CachedBackend) and built.capacity_entries == 10
    assert built.remote.inner.path == os.path.join(str(tmp_path / "base"), "partition-1")
    built.open()
    assert run(built, req(Op.VALUE_PUT, "v", 1, value=1), req(Op.VALUE_GET, "v", 1)) == [None, 1]
    built.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"capacity_entries": 0}, ValueError, "capacity_entries"),
        ({"capacity_bytes": -5}, ValueError, "capacity_bytes"),
        ({"capacity_entries": 2.5}, TypeError, "capacity_entries"),
        ({"capacity_bytes": "1MB"}, TypeError, "capacity_bytes"),
        ({"policy": "lfu"}, ValueError, "policy"),
        ({"capacity": 0}, ValueError, "capacity_entries"),
        ({"capacity": 5, "capacity_entries": 5}, TypeError, "not both"),
    ],
)
def test_bad_arguments_are_rejected_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        CachedBackend(MemoryBackend(), **kwargs)
    with pytest.raises(TypeError, match="remote"):
        CachedBackend("redis://")


def test_capacity_is_the_contracts_name_for_the_entry_limit():
    cached = CachedBackend(MemoryBackend(), capacity=3)
    assert cached.capacity_entries == 3
    assert cached.spec().build(0).capacity_entries == 3  # what a Spark partition builds
    cached.close()


# --- engine level --------------------------------------------------------------------------


def _stream(seed: int, records: int = 60, keys: int = 12) -> list:
    rng = random.Random(seed)
    elements, watermark = [], 0
    for _ in range(records):
        if rng.random() < 0.1:
            watermark += rng.randint(0, 5)
            elements.append(Watermark(watermark))
        value = rng.randint(0, 40)
        elements.append(Record(rng.randrange(keys), value, timestamp=value))
    return elements


def _slow_small_cache() -> CachedBackend:
    return CachedBackend(LatencyBackend(MemoryBackend(), 0.0005), capacity_entries=5)


@pytest.mark.parametrize("seed", [7, 8, 9])
@pytest.mark.parametrize("function", [Counter, Everything])
def test_async_runs_over_a_small_cache_equal_the_sync_run(function, seed):
    assert_equivalent(
        function,
        _stream(seed),
        backend_factory=_slow_small_cache,
        configs=[AecConfig(buffer_size=3, in_flight_records_limit=10, executor_threads=3)],
        seeds=[0],
        executor_factory=lambda _: ThreadPoolStateExecutor(3),
    )


def test_the_engine_flushes_the_cache_at_end_of_input():
    remote = MemoryBackend()
    backend = CachedBackend(remote, capacity_entries=5)
    source = [Record(k % 7, k) for k in range(50)]
    run_keyed(source, Counter(), backend)
    counts = {k: len(range(k, 50, 7)) for k in range(7)}
    assert remote.state_items("count") == counts  # no explicit flush here
    assert backend.hits > 0 and backend.misses > 0
