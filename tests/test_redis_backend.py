"""RedisBackend against a real redis-server (one per module, on a free loopback port).

The backend conformance suite of test_backends runs here against Redis (its
``Test*`` classes and backend-parametrized tests are imported, and this module's
``backend`` fixture feeds them), in both pipeline modes. In CI (``CI`` set) a
missing redis-server fails these tests; locally they skip with a loud reason.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import threading
import time
import uuid

import msgpack
import pytest
import redis
from engine_helpers import Counter, Everything
from hypothesis import given
from redis.connection import AbstractConnection
from test_backends import (
    MIXES,
    TestListState,
    TestMapState,
    TestValueState,
    assert_same_as_memory,
    check_concurrent_batches_of_disjoint_keys,
    drain_chunks,
    req,
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

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.errors import StateReadError
from aec.runtime.executor import ThreadPoolStateExecutor
from aec.runtime.operator import KeyedProcessOperator
from aec.state.memory import MemoryBackend
from aec.state.requests import Op
from aec.testing import assert_equivalent
from backends.redis import RedisBackend, RedisSpec
from backends.redis_server import LocalRedisServer

__all__ = [  # the imported conformance tests, collected here against Redis
    "TestListState", "TestMapState", "TestValueState",
    "test_list_chunks_concatenate_to_the_list", "test_map_chunks_concatenate_to_the_map",
    "test_restore_from_missing_directory", "test_snapshot_then_restore_rolls_back",
    "test_restore_is_the_union_of_snapshots_in_the_key_groups",
    "test_restore_of_one_snapshot_into_smaller_ranges",
    "test_restore_of_two_of_three_snapshots_in_another_order",
    "test_restore_refuses_bad_arguments_before_changing_anything",
    "test_restore_with_a_missing_snapshot_changes_nothing",
]  # fmt: skip


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


def _open(url: str, **kwargs) -> RedisBackend:
    backend = RedisBackend(url, **{"prefix": _prefix(), **kwargs})
    backend.open()
    return backend


@pytest.fixture(params=["multi-resp3", "pipeline-resp2"])
def backend(request, redis_server):
    """A fresh RedisBackend (its own prefix) for the imported conformance tests: MULTI
    transactions over RESP3 (redis-py's default), plain pipelines over RESP2."""
    multi = request.param == "multi-resp3"
    url = f"{redis_server.url}?protocol={3 if multi else 2}"
    instance = _open(url, transaction=multi)
    yield instance
    instance.clear()
    instance.close()


@pytest.fixture
def snapshotting(backend):
    return backend


@pytest.fixture
def rescaling(redis_server):
    """``make(name)``: a new, open RedisBackend with its own prefix."""
    made: list[RedisBackend] = []

    def make(name: str) -> RedisBackend:
        made.append(_open(redis_server.url))
        return made[-1]

    yield make
    for instance in made:
        instance.clear()
        instance.close()


@pytest.fixture
def client(redis_server):
    connection = redis.Redis.from_url(redis_server.url)
    yield connection
    connection.close()


# --- property: Redis == Memory for random batches ----------------------------------------


@pytest.mark.parametrize(
    ("transaction", "protocol"), [(True, 3), (False, 2)], ids=["multi-resp3", "pipeline-resp2"]
)
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_redis_matches_memory_on_random_batches(redis_server, mix, transaction, protocol):
    backend = _open(f"{redis_server.url}?protocol={protocol}", transaction=transaction)

    @given(batches=MIXES[mix])
    def check(batches):
        backend.clear()
        assert_same_as_memory(backend, batches)

    try:
        check()
    finally:
        backend.clear()
        backend.close()


# --- batches: one round trip, folded reads ------------------------------------------------


class _Sends:
    """Counts socket writes of redis-py connections (one per round trip)."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        original = AbstractConnection.send_packed_command

        def counting(connection, command, check_health=True):
            self.count += 1
            return original(connection, command, check_health)

        monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)


def _command_calls(client) -> dict[str, int]:
    return {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in client.info("commandstats").items()
    }


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    changed = {name: after[name] - before.get(name, 0) for name in after}
    return {name: n for name, n in changed.items() if n and name != "info"}


@pytest.mark.parametrize("transaction", [True, False], ids=["multi", "pipeline"])
def test_a_batch_is_one_round_trip(redis_server, client, monkeypatch, transaction):
    backend = _open(redis_server.url, transaction=transaction)
    mixed = []
    for i in range(100):
        mixed += [
            req(Op.VALUE_GET, "v", i),
            req(Op.VALUE_PUT, "v", i, value=i),
            req(Op.LIST_ADD, "l", i, value=i),
            req(Op.MAP_PUT, "m", i, user_key="x", value=i),
            req(Op.MAP_GET, "m", i, user_key="x"),
            req(Op.LIST_GET, "l", i),
        ]
    run(backend, *mixed[:6])  # the pool's connection exists before counting
    before = _command_calls(client)
    sends = _Sends(monkeypatch)  # counts from here to the next INFO
    results = run(backend, *mixed)
    assert sends.count == 1
    delta = _delta(before, _command_calls(client))
    assert delta.get("exec", 0) == (1 if transaction else 0)
    assert results[4::6] == list(range(100)) and results[5::6][1:] == [[i] for i in range(1, 100)]
    # the keyed counter's batch (a read and a write per key): MGET + MSET, whatever its
    # size, after the GET of the fence
    counter = [
        r
        for i in range(500)
        for r in (req(Op.VALUE_GET, "c", i), req(Op.VALUE_PUT, "c", i, value=1))
    ]
    before = _command_calls(client)
    sends.count = 0
    run(backend, *counter)
    assert sends.count == 1
    delta = _delta(before, _command_calls(client))
    expected = {"get": 1, "mget": 1, "mset": 1} | ({"multi": 1, "exec": 1} if transaction else {})
    assert delta == expected
    backend.clear()
    backend.close()


def test_reads_are_folded_only_without_a_write_between(backend, client):
    run(backend, req(Op.MAP_PUT, "m", "a", user_key="x", value=1))
    before = _command_calls(client)
    results = run(
        backend,
        req(Op.MAP_GET, "m", "a", user_key="x"),
        req(Op.MAP_CONTAINS, "m", "a", user_key="x"),  # answered by the HGET
        req(Op.MAP_GET, "m", "a", user_key="x"),
        req(Op.VALUE_GET, "v", "a"),
        req(Op.VALUE_GET, "v", "a"),
        req(Op.MAP_PUT, "m", "a", user_key="x", value=2),
        req(Op.MAP_GET, "m", "a", user_key="x"),  # after a write: read again
        req(Op.MAP_CONTAINS, "m", "a", user_key="y"),
    )
    assert results == [1, True, 1, None, None, None, 2, False]
    delta = _delta(before, _command_calls(client))
    assert delta["hget"] == 2 and delta["hexists"] == 1 and delta["mget"] == 1
    assert delta["get"] == 1 and "exists" not in delta  # one GET: the fence


def test_value_writes_inside_a_batch_keep_their_order(backend):
    results = run(
        backend,
        req(Op.VALUE_PUT, "v", "a", value=1),
        req(Op.VALUE_GET, "v", "a"),
        req(Op.VALUE_PUT, "v", "a", value=None),
        req(Op.VALUE_GET, "v", "a"),
        req(Op.VALUE_PUT, "v", "a", value=3),
        req(Op.VALUE_PUT, "v", "b", value=4),
        req(Op.VALUE_CLEAR, "v", "b"),
    )
    assert results == [None, 1, None, None, None, None, None]
    assert backend.state_items("v") == {"a": 3}


# --- partial loading of large lists and maps ------------------------------------------------


def test_large_list_and_map_chunks(backend):
    run(backend, req(Op.LIST_ADD_ALL, "l", "a", value=list(range(2500))))
    items, chunks = drain_chunks(backend, Op.LIST_GET_CHUNK, "l", "a", 1000)
    assert items == list(range(2500)) and chunks == 3
    entries = {i: str(i) for i in range(3000)}  # a real hash table (not a listpack)
    run(backend, req(Op.MAP_PUT_ALL, "m", "a", value=entries))
    items, chunks = drain_chunks(backend, Op.MAP_ITER_CHUNK, "m", "a", 250)
    assert len(items) == 3000 and dict(items) == entries
    assert 10 <= chunks <= 14  # HSCAN's COUNT is a hint


def test_map_chunks_skip_entries_removed_during_iteration(backend):
    run(backend, req(Op.MAP_PUT_ALL, "m", "a", value={f"k{i}": i for i in range(10)}))
    (first, cursor), *_ = run(backend, req(Op.MAP_ITER_CHUNK, "m", "a", value=(None, 3)))
    assert len(first) == 3 and cursor is not None
    returned = {k for k, _ in first}
    gone = sorted({f"k{i}" for i in range(10)} - returned)[:2]
    rest, more = [], cursor
    run(backend, *[req(Op.MAP_REMOVE, "m", "a", user_key=k) for k in gone])
    run(backend, req(Op.MAP_PUT, "m", "a", user_key=sorted(returned)[0], value=-1))
    while more is not None:
        ((chunk, more),) = run(backend, req(Op.MAP_ITER_CHUNK, "m", "a", value=(more, 3)))
        assert len(chunk) <= 3
        rest += chunk
    assert len(first) + len(rest) == 8
    assert {k for k, _ in rest} == {f"k{i}" for i in range(10)} - returned - set(gone)
    assert all(value == int(k[1:]) for k, value in rest)  # values read when handed out


# --- the engine on Redis --------------------------------------------------------------------


def _stream(records: int, keys: int) -> list:
    elements = []
    for i in range(records):
        elements.append(Record(i % keys if i % 3 else f"k{i % keys}", i % 23, timestamp=i))
        if i % 40 == 39:
            elements.append(Watermark(i - 5))
    return elements


def _factory(url: str, opened: list):
    def make() -> RedisBackend:
        backend = RedisBackend(url, prefix=_prefix())
        opened.append(backend)
        return backend

    return make


SERIAL = [
    AecConfig(),
    AecConfig(buffer_size=3, in_flight_records_limit=25),
    AecConfig(buffer_size=1),
]
PARALLEL = [AecConfig(buffer_size=7, in_flight_records_limit=40, watermark_order="parallel")]


@pytest.mark.parametrize(
    ("function", "configs"),
    [(Counter, SERIAL + PARALLEL), (Everything, SERIAL)],  # Everything's timers read state
    ids=["counter", "list-map-timers"],
)
def test_engine_on_redis_equals_the_sync_run(redis_server, function, configs):
    opened: list[RedisBackend] = []
    try:
        assert_equivalent(
            function,
            _stream(300, 17),
            backend_factory=_factory(redis_server.url, opened),
            configs=configs,
            seeds=(0,),
            executor_factory=lambda _: ThreadPoolStateExecutor(4),
        )
    finally:
        for backend in opened:  # closed by the checker after its run; its keys stay
            cleaner = RedisBackend(redis_server.url, prefix=backend.prefix)
            cleaner.open()
            cleaner.clear()
            cleaner.close()


def test_run_keyed_default_config_matches_memory(redis_server):
    source = _stream(1000, 50)
    backend = RedisBackend(redis_server.url, prefix=_prefix())
    result = run_keyed(source, Everything(), backend=backend, config=AecConfig())
    reference = MemoryBackend()
    expected = run_keyed(
        source, Everything(), backend=reference, config=AecConfig(async_state=False)
    )
    try:
        assert sorted(map(repr, result.outputs)) == sorted(map(repr, expected.outputs))
        for name in expected.state_names:
            assert backend.state_items(name) == reference.state_items(name), name
        assert result.metrics["batches"] < result.metrics["requests"] / 5  # batched
    finally:
        backend.clear()
        backend.close()


class _KillsServer(KeyedProcessFunction):
    """A keyed counter that kills the Redis server at its ``at``-th record."""

    def __init__(self, server: LocalRedisServer, at: int) -> None:
        self.server, self.at, self.seen = server, at, 0

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    async def process_element(self, value, ctx):
        self.seen += 1
        if self.seen == self.at:
            self.server.stop()  # SIGKILL: a crash
        n = (await self.count.async_value() or 0) + 1
        await self.count.async_update(n)
        ctx.output(n)


def _io_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aec-io")]


def test_killing_the_server_mid_run_fails_the_job(redis_server):
    doomed = LocalRedisServer().start()
    backend = RedisBackend(doomed.url, prefix="doomed", socket_timeout=2.0, connect_timeout=1.0)
    function = _KillsServer(doomed, at=500)
    started = time.monotonic()
    try:
        with pytest.raises(JobFailure) as failure:
            run_keyed(
                [Record(i % 50, i) for i in range(20_000)],
                function,
                backend=backend,
                config=AecConfig(buffer_size=50, in_flight_records_limit=200),
            )
        elapsed = time.monotonic() - started
    finally:
        doomed.stop()
        backend.close()
    assert elapsed < 15, elapsed
    assert 500 <= function.seen < 20_000  # killed mid-run, and the run stopped early
    message = str(failure.value)
    assert "state backend failed" in message and "connection" in message.lower(), message
    assert isinstance(failure.value.__cause__, redis.ConnectionError)
    assert _io_threads() == []


# --- fencing: a store that lost this backend's state fails the job ---------------------------


def _count(operator, records) -> None:
    for key, value in records:
        operator.process(Record(key, value))


@pytest.mark.parametrize("how", ["restart", "flush", "another backend"])
def test_a_store_that_lost_the_state_fails_the_next_batch(redis_server, how):
    server = LocalRedisServer().start()  # killed and restarted by PID below
    prefix = _prefix()
    backend = RedisBackend(server.url, prefix=prefix, connect_timeout=2.0)
    operator = KeyedProcessOperator(Counter(), backend, AecConfig(async_state=False))
    try:
        _count(operator, [(i % 3, i) for i in range(9)])
        if how == "restart":
            server.restart()  # empty again, on the same port: clients reconnect silently
        elif how == "flush":
            redis.Redis.from_url(server.url).flushdb()
        else:
            newer = RedisBackend(server.url, prefix=prefix)  # a newer attempt of the task
            newer.open()
            newer.close()
        with pytest.raises(JobFailure) as failure:
            _count(operator, [(i % 3, i) for i in range(9)])
        cause = failure.value.__cause__
        assert isinstance(cause, StateReadError), cause
        assert "lost its state" in str(cause) and f"127.0.0.1:{server.port}" in str(cause)
    finally:
        backend.close()
        server.stop()


def test_run_keyed_fails_when_the_server_restarts_empty_between_records(redis_server):
    server = LocalRedisServer().start()

    def source():
        for i in range(600):
            if i == 300:
                server.restart()
            yield Record(i % 7, i)

    backend = RedisBackend(server.url, prefix=_prefix(), connect_timeout=2.0)
    try:
        with pytest.raises(JobFailure) as failure:
            run_keyed(source(), Counter(), backend, AecConfig(buffer_size=20))
        # a batch in flight at the restart may see the connection drop instead
        assert isinstance(failure.value.__cause__, (StateReadError, redis.ConnectionError))
    finally:
        backend.close()
        server.stop()


def test_no_checkpoint_is_taken_of_a_store_that_lost_the_state(redis_server, tmp_path):
    server = LocalRedisServer().start()
    backend = RedisBackend(server.url, prefix=_prefix(), connect_timeout=2.0)
    operator = KeyedProcessOperator(Counter(), backend, AecConfig(async_state=False))
    try:
        _count(operator, [("a", 1), ("b", 2)])
        server.restart()
        with pytest.raises(JobFailure, match="at checkpoint 1") as failure:
            operator.snapshot(1, tmp_path)
        assert isinstance(failure.value.__cause__, StateReadError)
        assert os.listdir(tmp_path) == []  # nothing committed: no empty state checkpointed
    finally:
        backend.close()
        server.stop()


def test_a_value_planted_in_redis_decodes_as_data_or_fails_and_never_runs(backend, client, tmp_path):
    run(backend, req(Op.VALUE_PUT, "v", "a", value=1))
    planted = tmp_path / "ran"

    class Plant:
        def __reduce__(self):
            return (open, (str(planted), "w"))

    (key,) = client.keys(f"{backend.prefix}:0:*")
    client.set(key, pickle.dumps(Plant()))
    with pytest.raises(ValueError, match="not msgpack state bytes"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    assert not planted.exists()


def test_a_dead_server_fails_fast(redis_server):
    gone = LocalRedisServer().start()
    url = gone.url
    gone.stop()
    backend = RedisBackend(url, connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match="connection to redis://127.0.0.1"):
        backend.open()
    assert time.monotonic() - started < 5
    backend.close()


def test_a_hung_server_times_out(redis_server):
    frozen = LocalRedisServer().start()
    backend = _open(frozen.url, socket_timeout=0.5)
    os.kill(frozen.pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(redis.TimeoutError, match="timed out"):
            run(backend, req(Op.VALUE_GET, "v", 1))
        assert time.monotonic() - started < 3
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        frozen.stop()
        backend.close()


# --- lifecycle, isolation, spec ------------------------------------------------------------


def test_lifecycle(redis_server):
    backend = RedisBackend(redis_server.url, prefix=_prefix())
    with pytest.raises(RuntimeError, match="not open"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    backend.open()
    backend.open()
    assert run(backend, req(Op.VALUE_PUT, "v", "a", value=1), req(Op.VALUE_GET, "v", "a")) == [
        None,
        1,
    ]
    backend.clear()
    backend.close()
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    with pytest.raises(RuntimeError, match="closed"):
        backend.open()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prefix": "a:b"}, "prefix"),
        ({"prefix": ""}, "prefix"),
        ({"prefix": "a*"}, "prefix"),
        ({"partition": -1}, "partition"),
        ({"partition": "0"}, "partition"),
        ({"max_connections": 0}, "max_connections"),
        ({"socket_timeout": 0}, "socket_timeout"),
    ],
)
def test_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RedisBackend(**kwargs)


def test_partitions_and_prefixes_are_isolated(redis_server, client):
    prefix = _prefix()
    zero = _open(redis_server.url, prefix=prefix, partition=0)
    one = _open(redis_server.url, prefix=prefix, partition=1)
    twelve = _open(redis_server.url, prefix=prefix, partition=12)  # "1" prefixes "12"
    other = _open(redis_server.url, prefix=prefix + "x", partition=0)
    tricky = "v:1:x*?[]"  # glob characters and separators in a state name
    backends = (zero, one, twelve, other)
    for n, backend in enumerate(backends):
        run(
            backend,
            req(Op.VALUE_PUT, "v", "a", value=n),
            req(Op.VALUE_PUT, tricky, "a", value=-n),
            req(Op.LIST_ADD, "l", "a", value=n),
            req(Op.MAP_PUT, "m", "a", user_key="x", value=n),
        )
    for n, backend in enumerate(backends):
        assert backend.state_items("v") == {"a": n}
        assert backend.state_items(tricky) == {"a": -n}
        assert backend.state_items("v:1") == {}
    one.clear()
    assert one.state_items("v") == {} and twelve.state_items("v") == {"a": 2}
    assert zero.state_items("l") == {"a": [0]} and other.state_items("m") == {"a": {"x": 3}}
    assert any(key.startswith(f"{prefix}:0:1:v:".encode()) for key in client.keys(f"{prefix}:*"))
    for backend in backends:
        backend.clear()
        backend.close()


def test_concurrent_batches_of_disjoint_keys(redis_server):
    backend = _open(redis_server.url, max_connections=4)
    try:
        check_concurrent_batches_of_disjoint_keys(backend, threads=6)
    finally:
        backend.clear()
        backend.close()


def test_spec_pickles_builds_partitions_and_starts_fresh(redis_server):
    prefix = _prefix()
    original = RedisBackend(redis_server.url, prefix=prefix, socket_timeout=3.0)
    spec = pickle.loads(pickle.dumps(original.spec()))
    assert isinstance(spec, RedisSpec) and spec.url == redis_server.url and spec.prefix == prefix
    zero, three = spec.build(0), spec.build(3)
    assert (zero.partition, three.partition, three.socket_timeout) == (0, 3, 3.0)
    zero.open()
    three.open()
    run(zero, req(Op.VALUE_PUT, "v", "a", value=0))
    run(three, req(Op.VALUE_PUT, "v", "a", value=3))
    assert (zero.state_items("v"), three.state_items("v")) == ({"a": 0}, {"a": 3})
    zero.close()
    retry = spec.build(3)  # a new task attempt starts empty
    retry.open()
    assert retry.state_items("v") == {}
    three.close()
    retry.close()
    with pytest.raises(ValueError, match="partition"):
        spec.build(-1)


# --- snapshots ------------------------------------------------------------------------------


def _fill(backend) -> None:
    run(
        backend,
        req(Op.VALUE_PUT, "v", "a", value={"nested": [1, None]}),
        req(Op.VALUE_PUT, "v", (1, "t"), value=2),
        req(Op.LIST_ADD_ALL, "l", "a", value=[1, 2, 3]),
        req(Op.MAP_PUT_ALL, "m", "a", value={i: i * i for i in range(300)}),
    )


def _all_state(backend) -> dict:
    return {s: backend.state_items(s) for s in ("v", "l", "m")}


def test_snapshot_covers_one_partition_and_restores_elsewhere(redis_server, tmp_path):
    prefix = _prefix()
    zero = _open(redis_server.url, prefix=prefix, partition=0)
    one = _open(redis_server.url, prefix=prefix, partition=1)
    _fill(zero)
    run(one, req(Op.VALUE_PUT, "v", "mine", value=1))
    zero.snapshot(str(tmp_path / "snap"))
    manifest = json.loads((tmp_path / "snap" / "redis-manifest.json").read_text())
    assert manifest["keys"] == 4 and manifest["partition"] == 0
    expected = _all_state(zero)
    run(zero, req(Op.VALUE_PUT, "v", "later", value=1), req(Op.MAP_CLEAR, "m", "a"))
    run(one, req(Op.VALUE_PUT, "v", "mine", value=2))
    zero.restore(str(tmp_path / "snap"))
    assert _all_state(zero) == expected
    assert one.state_items("v") == {"mine": 2}  # untouched
    elsewhere = RedisBackend(redis_server.url, prefix=_prefix(), partition=5)
    elsewhere.restore(str(tmp_path / "snap"))  # opens it
    assert _all_state(elsewhere) == expected
    zero.snapshot(str(tmp_path / "snap"))  # replaces the old data file
    assert len([p for p in os.listdir(tmp_path / "snap") if p.startswith("redis-state-")]) == 1
    for backend in (zero, one, elsewhere):
        backend.clear()
        backend.close()


def test_restore_rejects_invalid_snapshots_and_keeps_live_state(backend, client, tmp_path):
    _fill(backend)
    snap = tmp_path / "snap"
    backend.snapshot(str(snap))
    run(backend, req(Op.VALUE_PUT, "v", "live", value=1))
    live = _all_state(backend)
    manifest_path = snap / "redis-manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data_path = snap / manifest["file"]
    data = data_path.read_bytes()

    data_path.write_bytes(data[:-5] + b"xxxxx")
    with pytest.raises(ValueError, match="checksum"):
        backend.restore(str(snap))
    # checksum right, dumps corrupt: the server rejects them before the switch
    payload = msgpack.unpackb(data)
    payload["entries"] = [(k, dump[:-3] + b"zzz") for k, dump in payload["entries"]]
    bad = msgpack.packb(payload)
    data_path.write_bytes(bad)
    import hashlib

    manifest_path.write_text(json.dumps(manifest | {"sha256": hashlib.sha256(bad).hexdigest()}))
    with pytest.raises(ValueError, match="does not restore"):
        backend.restore(str(snap))
    assert not client.keys(f"{backend.prefix}:0~restore-*")  # staged keys removed
    manifest_path.write_text("{not json")
    with pytest.raises(ValueError, match="manifest"):
        backend.restore(str(snap))
    manifest_path.write_text(json.dumps(manifest | {"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        backend.restore(str(snap))
    data_path.unlink()
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="data file"):
        backend.restore(str(snap))
    assert _all_state(backend) == live


def test_an_empty_page_before_the_end_reads_on(backend):
    entries = {i: i for i in range(1000)}  # a hash table (> 512 entries): small HSCAN pages
    run(backend, req(Op.MAP_PUT_ALL, "m", "a", value=entries))
    ((first, cursor),) = run(backend, req(Op.MAP_ITER_CHUNK, "m", "a", value=(None, 1)))
    assert cursor is not None and cursor[0] != 0
    # a cursor whose carried fields were all removed meanwhile: no entry in that page
    stale = (cursor[0], tuple(b"gone%d" % i for i in range(5)))
    ((chunk, more),) = run(backend, req(Op.MAP_ITER_CHUNK, "m", "a", value=(stale, 5)))
    assert chunk, "an empty chunk before the end of the map"
    seen = first + chunk
    while more is not None:
        ((chunk, more),) = run(backend, req(Op.MAP_ITER_CHUNK, "m", "a", value=(more, 100)))
        assert chunk or more is None
        seen += chunk
    # each entry at most once (no rehash happened); the stale page may have lost a few
    assert len(seen) == len(dict(seen)) and 990 <= len(seen) <= 1000
    assert all(entries[k] == v for k, v in seen)


# a DUMP payload from Redis's own corrupt-dump tests ("listpack too long entry len"):
# decoded unchecked, it makes the server abort
_CRASHING_DUMP = bytes.fromhex(
    "0f011000000000000000020000000000000002405555000000"
    "0f0001010001020188310000000000000009883200000000000000090001000100010001020289310000"
    "000000000009886100000000000000098832000000000000000988620000000000000009"
    "0801ff0a010000090040"
    "63c93703a2e568"
)


def test_the_local_server_refuses_a_crafted_dump_payload_and_keeps_running():
    """A restore sends a checkpoint's DUMP payloads to RESTORE: the server aec starts
    checks them whole (``sanitize-dump-payload yes``) instead of crashing on one."""
    server = LocalRedisServer().start()
    try:
        connection = redis.Redis.from_url(server.url)
        connection.set("other-tenant", "kept")
        with pytest.raises(redis.ResponseError, match="(?i)bad data format|payload"):
            connection.restore("crafted", 0, _CRASHING_DUMP)
        assert connection.get("other-tenant") == b"kept"
        connection.close()
    finally:
        server.stop()
