"""SlateDBBackend: the backend conformance suite, engine runs, durability and snapshots.

Everything runs on ``file://`` object stores under ``tmp_path`` (the only kind
reachable here); the S3 path is checked up to building its object store.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import tempfile
import threading

import pytest
from engine_helpers import AsyncCounter, Counter, Everything
from hypothesis import given
from hypothesis import strategies as st
from slatedb import uniffi as sdb
from test_backends import (  # noqa: F401  (pytest collects the imported tests here)
    KEYS,
    MIXES,
    USER_KEYS,
    TestListState,
    TestMapState,
    TestValueState,
    assert_same_as_memory,
    check_concurrent_batches_of_disjoint_keys,
    clone_request,
    map_ops,
    normalized,
    one_op,
    req,
    request_batches,
    run,
    test_list_chunks_concatenate_to_the_list,
    test_map_chunks_concatenate_to_the_map,
    test_restore_from_missing_directory,
    test_restore_is_the_union_of_snapshots_in_the_key_groups,
    test_restore_of_one_snapshot_into_smaller_ranges,
    test_restore_of_two_of_three_snapshots_in_another_order,
    test_restore_refuses_bad_arguments_before_changing_anything,
    test_restore_with_a_missing_snapshot_changes_nothing,
    test_snapshot_then_restore_rolls_back,
)

from aec import AecConfig, JobFailure, KeyedProcessOperator, Record, Watermark
from aec.keygroups import KeyGroupRange, key_group_for
from aec.runtime.executor import ThreadPoolStateExecutor
from aec.state.requests import Op
from aec.testing import assert_equivalent
from backends.keycodec import encode_key
from backends.rocksdb import RocksDBBackend
from backends.slatedb import SlateDBBackend, SlateDBSpec
from backends.slatedb_store import object_store

LOOP_THREAD = "aec-slatedb-loop"


def url_of(path) -> str:
    return f"file://{path}"


def make(path, name: str = "db", **kwargs) -> SlateDBBackend:
    backend = SlateDBBackend(url_of(path), name, **kwargs)
    backend.open()
    return backend


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == LOOP_THREAD]


@pytest.fixture
def backend(tmp_path):
    instance = make(tmp_path)
    yield instance
    instance.close()


@pytest.fixture
def snapshotting(backend):
    return backend


@pytest.fixture
def rescaling(tmp_path):
    """``make(name)``: a new, open SlateDBBackend (database ``name`` in one store)."""
    made: list[SlateDBBackend] = []

    def build(name: str) -> SlateDBBackend:
        made.append(make(tmp_path, name))
        return made[-1]

    yield build
    for instance in made:
        instance.close()


@pytest.fixture(autouse=True)
def no_threads_left_behind():
    before = set(loop_threads())
    yield
    assert set(loop_threads()) <= before, "a SlateDB loop thread outlived its test"


# --- randomized conformance against MemoryBackend -------------------------------------


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_matches_memory_on_random_batches(mix):
    @given(batches=MIXES[mix])
    def check(batches):
        with tempfile.TemporaryDirectory(prefix="aec-slate-prop-") as directory:
            slate = make(directory)
            try:
                assert_same_as_memory(slate, batches)
            finally:
                slate.close()

    check()


# Chunked reads mixed with writes: RocksDB shares SlateDB's cursors (encoded user
# keys) and map order, so the two must agree exactly, chunk by chunk.
CURSORS = st.one_of(st.none(), USER_KEYS.map(encode_key))
CHUNKED = request_batches(
    st.one_of(
        map_ops(KEYS),
        one_op(Op.MAP_ITER_CHUNK, "m", KEYS, value=st.tuples(CURSORS, st.integers(1, 3))),
        one_op(Op.LIST_GET_CHUNK, "l", KEYS, value=st.tuples(st.integers(0, 3), st.integers(1, 3))),
        one_op(Op.LIST_ADD_ALL, "l", KEYS, value=st.lists(st.integers(), max_size=3)),
    )
)


@given(batches=CHUNKED)
def test_chunked_reads_match_rocksdb_on_random_batches(batches):
    with tempfile.TemporaryDirectory(prefix="aec-slate-chunks-") as directory:
        rocks, slate = RocksDBBackend(os.path.join(directory, "rocks")), make(directory)
        rocks.open()
        try:
            for batch in batches:
                mine = [clone_request(r) for r in batch]
                rocks.execute_batch(batch)
                slate.execute_batch(mine)
                assert [r.result for r in mine] == [r.result for r in batch], batch
            for state in ("l", "m"):
                assert slate.state_items(state) == rocks.state_items(state), state
        finally:
            slate.close()
            rocks.close()


def test_map_chunks_after_writes_and_emptiness_in_one_batch(backend):
    run(backend, req(Op.MAP_PUT_ALL, "m", "a", value={f"k{i}": i for i in range(5)}))
    first = run(
        backend,
        req(Op.MAP_IS_EMPTY, "m", "a"),  # a one-row probe
        req(Op.MAP_ITER_CHUNK, "m", "a", value=(None, 2)),  # a two-row range read
        req(Op.MAP_CLEAR, "m", "a"),
        req(Op.MAP_IS_EMPTY, "m", "a"),  # after a write: the whole map, merged
        req(Op.MAP_PUT, "m", "a", user_key="z", value=1),
        req(Op.MAP_ITER_CHUNK, "m", "a", value=(None, 2)),
        req(Op.MAP_IS_EMPTY, "m", "nobody"),
    )
    assert first[0] is False and first[3] is True and first[6] is True
    assert first[1] == ([("k0", 0), ("k1", 1)], first[1][1]) and first[1][1] is not None
    assert first[5] == ([("z", 1)], None)


def test_concurrent_batches_of_disjoint_keys(backend):
    check_concurrent_batches_of_disjoint_keys(backend, rounds=30)


# --- engine ---------------------------------------------------------------------------


class Backends:
    """A backend factory for ``assert_equivalent`` that closes what it made."""

    def __init__(self, directory) -> None:
        self.directory = directory
        self.made: list[SlateDBBackend] = []

    def __call__(self) -> SlateDBBackend:
        backend = SlateDBBackend(url_of(self.directory), f"run-{len(self.made)}")
        self.made.append(backend)
        return backend

    def close(self) -> None:
        for backend in self.made:
            backend.close()


def stream(n: int, keys=("a", "b", "c", 1, (2, "x"))) -> list:
    elements: list = []
    for i in range(n):
        elements.append(Record(keys[i * 7 % len(keys)], i % 13, timestamp=i))
        if i % 9 == 8:
            elements.append(Watermark(i - 3))
    return elements


SERIAL = AecConfig(buffer_size=4, in_flight_records_limit=12)
PARALLEL = AecConfig(buffer_size=3, in_flight_records_limit=25, watermark_order="parallel")


# Everything's timers read state later records write: equivalent in serial mode only.
@pytest.mark.parametrize(
    ("function", "configs"),
    [(Counter, [SERIAL, PARALLEL]), (AsyncCounter, [SERIAL, PARALLEL]), (Everything, [SERIAL])],
)
def test_engine_runs_equal_the_sync_run(function, configs, tmp_path):
    factory = Backends(tmp_path)
    try:
        assert_equivalent(
            function,
            stream(40),
            backend_factory=factory,
            configs=configs,
            seeds=(0,),
            executor_factory=lambda _: ThreadPoolStateExecutor(2),
        )
    finally:
        factory.close()


def run_engine(backend, elements, function=Counter) -> list:
    operator = KeyedProcessOperator(
        function(), backend, AecConfig(buffer_size=8), ThreadPoolStateExecutor(2)
    )
    operator.open()
    try:
        for element in elements:
            if type(element) is Watermark:
                operator.process_watermark(element)
            else:
                operator.process(element)
        operator.finish()  # drains, then backend.flush()
    finally:
        operator.close()
    return operator.drain_outputs()


# --- durability -----------------------------------------------------------------------


NO_TIMED_FLUSH = {"flush_interval": "3600s"}  # only explicit flushes reach the store


def test_engine_drain_makes_writes_durable(tmp_path):
    """finish() drains and calls backend.flush(): a successor writer (as after a
    crash of the first, which never closes cleanly) sees every write."""
    first = make(tmp_path, settings=NO_TIMED_FLUSH)
    run_engine(first, stream(30))
    expected = first.state_items("count")
    assert sum(expected.values()) == 30
    successor = make(tmp_path)  # fences the first writer
    assert successor.state_items("count") == expected
    with pytest.raises(sdb.Error):
        first.close()  # fenced: its final flush fails
    successor.close()
    reopened = make(tmp_path)  # and a clean close/reopen keeps it too
    try:
        assert reopened.state_items("count") == expected
    finally:
        reopened.close()


def test_flushed_writes_survive_a_writer_that_never_closed(tmp_path):
    """flush() alone makes writes durable: a second writer (as after a crash) sees
    them; it fences the first, whose next flush then fails."""
    crashed = make(tmp_path, settings=NO_TIMED_FLUSH)
    run(
        crashed,
        req(Op.VALUE_PUT, "v", "a", value=1),
        req(Op.MAP_PUT_ALL, "m", "a", value={"x": 1, "y": 2}),
        req(Op.LIST_ADD_ALL, "l", "a", value=[1, 2]),
    )
    crashed.flush()
    successor = make(tmp_path)
    try:
        assert successor.state_items("v") == {"a": 1}
        assert successor.state_items("m") == {"a": {"x": 1, "y": 2}}
        assert successor.state_items("l") == {"a": [1, 2]}
        # Fenced: a write still lands in its memtable, but the flush that would make
        # it durable fails, and so does an engine run on it (JobFailure).
        run(crashed, req(Op.VALUE_PUT, "v", "b", value=2))
        with pytest.raises(sdb.Error, match="FENCED|newer"):
            crashed.flush()
        with pytest.raises(JobFailure) as failure:
            run_engine(crashed, stream(3))
        assert isinstance(failure.value.__cause__, sdb.Error)
        with pytest.raises(sdb.Error):
            crashed.close()  # its final flush fails, yet it releases everything
        crashed.close()
    finally:
        successor.close()
    assert not loop_threads()


def test_close_is_idempotent_final_and_stops_the_loop_thread(tmp_path):
    backend = SlateDBBackend(url_of(tmp_path), "db")
    with pytest.raises(RuntimeError, match="not open"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    with pytest.raises(RuntimeError, match="not open"):
        backend.flush()
    backend.open()
    backend.open()
    assert len(loop_threads()) == 1
    backend.close()
    backend.close()
    assert not loop_threads()
    with pytest.raises(RuntimeError, match="closed"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    with pytest.raises(RuntimeError, match="closed"):
        backend.open()


def test_rejects_a_database_aec_did_not_write(tmp_path):
    async def foreign() -> None:
        store, _ = object_store(url_of(tmp_path), {})
        db = await sdb.DbBuilder("foreign", store).build()
        await db.put(b"k", b"v")
        await db.shutdown()

    asyncio.run(foreign())
    with pytest.raises(ValueError, match="did not write"):
        make(tmp_path, "foreign")


def test_configuration_is_validated_and_applied(tmp_path):
    with pytest.raises(ValueError, match="absolute path"):
        SlateDBBackend("file://relative/dir")
    with pytest.raises(ValueError, match="unsupported"):
        SlateDBBackend("ftp://host/dir")
    with pytest.raises(ValueError, match="block_cache_bytes"):
        SlateDBBackend(url_of(tmp_path), block_cache_bytes=-1)
    with pytest.raises(ValueError, match="setting"):
        SlateDBBackend(url_of(tmp_path), settings={"flush_interval": "soon"})
    for cache in (0, None, 1 << 20):
        backend = make(
            tmp_path, f"cache-{cache}", block_cache_bytes=cache, settings={"flush_interval": "5ms"}
        )
        assert run(backend, req(Op.VALUE_PUT, "v", 1, value=2), req(Op.VALUE_GET, "v", 1)) == [
            None,
            2,
        ]
        backend.close()


def test_s3_url_builds_an_object_store_without_touching_the_network():
    backend = SlateDBBackend("s3://bucket/some/prefix", "job", object_store_options={"region": "x"})
    assert backend.db_path == "some/prefix/job"
    store, prefix = object_store(
        "s3://bucket/some/prefix",
        {"endpoint": "http://127.0.0.1:9", "allow_http": "true", "region": "us-east-1"},
    )
    assert store is not None and prefix == "some/prefix"
    spec = pickle.loads(pickle.dumps(backend.spec()))
    assert spec.build(2).db_path == "some/prefix/job/partition-2"


# --- snapshots ------------------------------------------------------------------------


def test_snapshot_of_an_engine_run_restores_after_more_writes(tmp_path):
    backend = make(tmp_path)
    try:
        run_engine(backend, stream(20), Everything)
        names = ("last", "items", "by_parity", "total", "mean")
        expected = {name: backend.state_items(name) for name in names}
        snap = str(tmp_path / "snap")
        backend.snapshot(snap)
        manifest = json.loads((tmp_path / "snap" / "slatedb-snapshot.json").read_text())
        assert manifest["db_path"] == "db" and manifest["checkpoint"]
        run_engine(backend, stream(25)[5:], Everything)
        assert {name: backend.state_items(name) for name in names} != expected
        backend.restore(snap)
        assert {name: backend.state_items(name) for name in names} == expected
    finally:
        backend.close()


def test_restore_into_another_backend_and_after_a_fresh_rebuild(tmp_path):
    spec = SlateDBSpec(url_of(tmp_path), "job")
    source = spec.build(0)
    source.open()
    run(source, req(Op.MAP_PUT, "m", "k", user_key=1, value="one"))
    source.snapshot(str(tmp_path / "snap"))
    run(source, req(Op.MAP_PUT, "m", "k", user_key=2, value="two"))
    source.close()
    # A task retry rebuilds the partition fresh (empty); the checkpoint survives.
    retry = spec.build(0)
    retry.open()
    assert retry.state_items("m") == {}
    retry.restore(str(tmp_path / "snap"))
    assert run(retry, req(Op.MAP_ITER, "m", "k")) == [[(1, "one")]]
    retry.close()
    other = SlateDBBackend(url_of(tmp_path / "elsewhere"), "copy")
    other.restore(str(tmp_path / "snap"))  # opens it; reads another object store
    assert other.state_items("m") == {"k": {1: "one"}}
    other.close()


def test_restore_rejects_invalid_snapshots_and_leaves_state_alone(backend, tmp_path):
    run(backend, req(Op.VALUE_PUT, "v", "a", value=1))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "slatedb-snapshot.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a SlateDB snapshot"):
        backend.restore(str(bad))
    (bad / "slatedb-snapshot.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not an aec SlateDB snapshot"):
        backend.restore(str(bad))
    snap = tmp_path / "snap"
    backend.snapshot(str(snap))
    manifest = json.loads((snap / "slatedb-snapshot.json").read_text())
    manifest["checkpoint"] = "00000000-0000-0000-0000-000000000000"
    (bad / "slatedb-snapshot.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="cannot open checkpoint"):
        backend.restore(str(bad))
    assert backend.state_items("v") == {"a": 1}


def test_snapshotting_again_into_a_directory_drops_the_replaced_checkpoint(backend, tmp_path):
    snap = str(tmp_path / "snap")
    run(backend, req(Op.VALUE_PUT, "v", "a", value=1))
    backend.snapshot(snap)
    backend.snapshot(str(tmp_path / "other"))
    run(backend, req(Op.VALUE_PUT, "v", "a", value=2))
    backend.snapshot(snap)

    async def checkpoints() -> list[str]:
        store, _ = object_store(url_of(tmp_path), {})
        return [c.id for c in await sdb.AdminBuilder("db", store).build().list_checkpoints(None)]

    live = asyncio.run(checkpoints())
    manifests = [
        json.loads(open(os.path.join(d, "slatedb-snapshot.json")).read())
        for d in (snap, str(tmp_path / "other"))
    ]
    assert sorted(live) == sorted(m["checkpoint"] for m in manifests)
    backend.restore(str(tmp_path / "other"))
    assert backend.state_items("v") == {"a": 1}


# --- specs ----------------------------------------------------------------------------


def test_spec_pickles_and_separates_partitions(tmp_path):
    backend = SlateDBBackend(url_of(tmp_path), "base", block_cache_bytes=1 << 20)
    spec = pickle.loads(pickle.dumps(backend.spec()))
    zero, one = spec.build(0), spec.build(1)
    assert (zero.path, one.path) == ("base/partition-0", "base/partition-1")
    assert zero.block_cache_bytes == 1 << 20
    zero.open()
    one.open()
    run(zero, req(Op.VALUE_PUT, "v", "a", value=0))
    run(one, req(Op.VALUE_PUT, "v", "a", value=1))
    assert (zero.state_items("v"), one.state_items("v")) == ({"a": 0}, {"a": 1})
    zero.close()
    one.close()
    assert not loop_threads()
    with pytest.raises(ValueError, match="partition"):
        spec.build(-1)


# --- on a real S3 API server (moto, the `s3` fixture) -----------------------------------------


def test_s3_state_snapshot_and_restore_end_to_end(s3, tmp_path):
    server, bucket = s3
    url = f"s3://{bucket}/jobs"
    backend = SlateDBBackend(url, "partition-0", timeout=60)
    backend.open()
    try:
        run(
            backend,
            *[req(Op.VALUE_PUT, "v", key, value=key * 10) for key in range(50)],
            req(Op.LIST_ADD_ALL, "l", "a", value=[1, 2]),
            req(Op.MAP_PUT_ALL, "m", "a", value={"x": 1, 2: "y"}),
        )
        snap = tmp_path / "snap"
        before = set(server.list_keys(bucket, "jobs/partition-0/"))
        backend.snapshot(str(snap))
        after = set(server.list_keys(bucket, "jobs/partition-0/"))
        # The checkpoint is a pin of SlateDB's manifest plus a small local JSON: no
        # state bytes copied, only SlateDB's own flush of the memtable.
        assert os.listdir(snap) == ["slatedb-snapshot.json"]
        assert (snap / "slatedb-snapshot.json").stat().st_size < 1024
        assert any(key.startswith("jobs/partition-0/manifest/") for key in after)
        assert not any("snapshot" in key for key in after - before)
        expected = {state: backend.state_items(state) for state in ("v", "l", "m")}
        run(backend, req(Op.VALUE_PUT, "v", 0, value=-1), req(Op.MAP_CLEAR, "m", "a"))
        backend.restore(str(snap))
        assert {state: backend.state_items(state) for state in ("v", "l", "m")} == expected
    finally:
        backend.close()
    # Another database (another partition after rescaling) restores half the key groups.
    half = KeyGroupRange(0, 63)
    other = SlateDBBackend(url, "partition-1", timeout=60)
    try:
        other.restore(str(snap), half, 128)
        assert other.state_items("v") == {
            key: value for key, value in expected["v"].items() if key_group_for(key, 128) in half
        }
    finally:
        other.close()


def test_s3_plain_http_endpoint_without_allow_http_is_refused(s3, monkeypatch):
    _, bucket = s3
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    backend = SlateDBBackend(f"s3://{bucket}/jobs", "db", timeout=60)
    with pytest.raises(ValueError, match="AWS_ALLOW_HTTP"):
        backend.open()  # at once, not after the timeout of SlateDB's retries
    backend.close()


def test_a_restarted_task_restores_its_own_unchanged_checkpoint_without_rewriting(tmp_path):
    spec = SlateDBSpec(url_of(tmp_path), "job")
    first = spec.build(0)
    first.open()
    run(first, *[req(Op.VALUE_PUT, "v", key, value=key) for key in range(300)])
    first.snapshot(str(tmp_path / "snap"))
    first.close()
    again = spec.build(0)  # fresh=True, the same database: a restarted task
    again.open()
    sequence = again._db.status().durable_seq
    again.restore(str(tmp_path / "snap"))
    assert again._db.status().durable_seq == sequence  # nothing deleted, nothing rewritten
    assert again.state_items("v") == {key: key for key in range(300)}
    # Restoring a narrower key-group range must still drop the other keys.
    half = KeyGroupRange(0, 63)
    again.restore(str(tmp_path / "snap"), half, 128)
    assert again.state_items("v") == {k: k for k in range(300) if key_group_for(k, 128) in half}
    again.close()


def test_a_fresh_backend_without_restore_starts_empty_and_stays_empty(tmp_path):
    spec = SlateDBSpec(url_of(tmp_path), "job")
    first = spec.build(0)
    first.open()
    run(first, req(Op.VALUE_PUT, "v", "a", value=1))
    first.close()
    fresh = spec.build(0)
    fresh.open()
    fresh.close()  # never used: the deferred wipe still runs
    reopened = SlateDBBackend(url_of(tmp_path), spec.path_for(0))
    reopened.open()
    assert reopened.state_items("v") == {}
    reopened.close()


def test_s3_operator_checkpoint_and_restart(s3, tmp_path):
    """The operator on SlateDB in S3: a checkpoint, a restart from it on the same
    database (as a restarted task does), then the rest of the input."""
    _, bucket = s3
    spec = SlateDBBackend(f"s3://{bucket}/jobs", "counter", timeout=60).spec()
    keys = ["a", "b", 3]
    backend = spec.build(0)
    first = KeyedProcessOperator(Counter(), backend, AecConfig(buffer_size=4))
    try:
        first.open()
        for i in range(12):
            first.process(Record(keys[i % 3], i, timestamp=i))
        handle = first.snapshot(1, str(tmp_path / "checkpoints"))
        before = first.drain_outputs()
        first.close()
    finally:
        backend.close()
    backend = spec.build(0)
    second = KeyedProcessOperator(Counter(), backend, AecConfig(buffer_size=4))
    try:
        second.restore(handle)
        for i in range(12, 15):
            second.process(Record(keys[i % 3], i, timestamp=i))
        second.finish()
        after = [out for out in second.drain_outputs() if type(out) is not Watermark]
        second.close()
    finally:
        backend.close()
    assert sorted(before, key=repr) == sorted(
        [(key, n) for key in keys for n in range(1, 5)], key=repr
    )
    assert sorted(after, key=repr) == sorted([(key, 5) for key in keys], key=repr)


def test_s3_unreachable_endpoint_fails_open_at_once(s3, monkeypatch):
    _, bucket = s3
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed}")
    backend = SlateDBBackend(f"s3://{bucket}/jobs", "db", timeout=120)
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{closed}"):
        backend.open()  # not after 120 s of SlateDB's retries
    backend.close()


def test_retained_snapshots_release_older_checkpoints(tmp_path):
    backend = SlateDBBackend(url_of(tmp_path), "db", retained=2)
    backend.open()
    try:
        for n in range(4):
            run(backend, req(Op.VALUE_PUT, "v", "a", value=n))
            backend.snapshot(str(tmp_path / f"snap-{n}"))
        admin = backend._admin
        names = [c.name for c in backend._call(admin.list_checkpoints(None))]
        assert len([name for name in names if name and name.startswith("aec-snapshot-")]) == 2
        backend.restore(str(tmp_path / "snap-2"))  # the two newest restore
        assert backend.state_items("v") == {"a": 2}
        with pytest.raises(ValueError, match="checkpoint"):
            backend.restore(str(tmp_path / "snap-0"))  # released: a clear error
        assert backend.state_items("v") == {"a": 2}
    finally:
        backend.close()
    with pytest.raises(ValueError, match="retained"):
        SlateDBBackend(url_of(tmp_path), "db", retained=0)
    assert (
        pickle.loads(pickle.dumps(SlateDBSpec(url_of(tmp_path), "j", retained=3))).build(0).retained
        == 3
    )
