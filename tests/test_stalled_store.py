"""A stalled store fails in bounded time, naming the store and the operation.

The store is moto's S3 server stopped with SIGSTOP (by its PID): the kernel still
accepts connections, nothing answers, as with a hung server or a black-holed
network. The timeouts come from ``aec.timeouts`` (``AEC_STORE_*`` variables), here
set small so the tests stay short; the defaults bound the same failure at about
``10 s x 3`` attempts.
"""

from __future__ import annotations

import logging
import time

import pytest
from s3_server import S3Server
from test_stream import RunningCount, Stream, _expected_per_key, _rows

from aec import KeyedProcessFunction, KeyedProcessOperator, Record, ValueStateDescriptor
from aec.checkpoint import CheckpointStorageError, CheckpointStore
from aec.state.memory import MemoryBackend
from aec.timeouts import StoreTimeouts, store_timeouts

REQUEST, CONNECT, MARGIN = 2.0, 1.0, 30.0  # seconds; the margin covers a loaded machine


@pytest.fixture(scope="module")
def own_server():
    """A moto server of this module only: pausing it must not stall other tests."""
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def stallable(own_server, monkeypatch):
    for name, value in own_server.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AEC_STORE_REQUEST_TIMEOUT", str(REQUEST))
    monkeypatch.setenv("AEC_STORE_CONNECT_TIMEOUT", str(CONNECT))
    monkeypatch.setenv("AEC_STORE_ATTEMPTS", "1")
    bucket = own_server.create_bucket()
    yield own_server, bucket
    own_server.resume()


class Count(KeyedProcessFunction):
    """Counts records per key."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        await self.count.async_update(await self.count.async_value() + 1)


def test_a_stalled_store_fails_a_listing_within_the_timeout(stallable):
    server, bucket = stallable
    store = CheckpointStore.at(f"s3://{bucket}/x")
    assert store.list_names() == []
    server.pause()
    started = time.monotonic()
    with pytest.raises(CheckpointStorageError) as failure:
        store.list_names()
    elapsed = time.monotonic() - started
    assert REQUEST * 0.5 <= elapsed < REQUEST + MARGIN
    message = str(failure.value)
    assert message.startswith(f"checkpoint store s3://{bucket}/x stalled: list of {bucket}/x")
    assert "got no answer within request timeout 2 s x 1 attempt, connect timeout 1 s" in message


def test_a_checkpoint_to_a_stalled_store_is_declined_and_the_operator_goes_on(stallable):
    server, bucket = stallable
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Count(), backend)
    operator.open()
    operator.process(Record("a", 1))
    uri = f"s3://{bucket}/op"
    server.pause()
    started = time.monotonic()
    with pytest.raises(CheckpointStorageError, match="stalled"):
        operator.snapshot(1, uri)
    assert time.monotonic() - started < 2 * REQUEST + MARGIN
    server.resume()
    operator.process(Record("a", 2))  # still usable; the next checkpoint commits
    handle = operator.snapshot(2, uri)
    restored = MemoryBackend()
    KeyedProcessOperator(Count(), restored).restore(handle)
    assert restored.state_items("count") == {"a": 2}


def test_slow_requests_are_logged(stallable, monkeypatch, caplog):
    _, bucket = stallable
    monkeypatch.setenv("AEC_STORE_SLOW_REQUEST", "1e-9")  # every request is "slow"
    with caplog.at_level(logging.WARNING, logger="aec.checkpoint.storage"):
        CheckpointStore.at(f"s3://{bucket}/x").write_bytes(b"{}", "layout.json")
    assert any(
        r.getMessage().startswith(f"slow checkpoint store request: write of {bucket}/x/layout.json")
        for r in caplog.records
    )


def test_timeouts_come_from_one_place_and_bad_values_are_named(monkeypatch):
    for name in ("CONNECT", "REQUEST", "ATTEMPTS", "SLOW_REQUEST"):
        monkeypatch.delenv(f"AEC_STORE_{name}_TIMEOUT", raising=False)
    monkeypatch.delenv("AEC_STORE_ATTEMPTS", raising=False)
    monkeypatch.delenv("AEC_STORE_SLOW_REQUEST", raising=False)
    assert store_timeouts() == StoreTimeouts(connect=5.0, request=10.0, attempts=3)
    assert store_timeouts().bound == 30.0
    monkeypatch.setenv("AEC_STORE_REQUEST_TIMEOUT", "0.5")
    monkeypatch.setenv("AEC_STORE_ATTEMPTS", "2")
    assert (store_timeouts().request, store_timeouts().attempts) == (0.5, 2)
    monkeypatch.setenv("AEC_STORE_ATTEMPTS", "two")
    with pytest.raises(ValueError, match="AEC_STORE_ATTEMPTS='two' is not a whole number"):
        store_timeouts()
    monkeypatch.setenv("AEC_STORE_ATTEMPTS", "0")
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        store_timeouts()
    with pytest.raises(ValueError, match="request must be > 0"):
        StoreTimeouts(request=0)


def test_redis_and_slatedb_clients_take_the_same_timeouts(monkeypatch):
    from backends.redis import RedisBackend, RedisSpec
    from backends.slatedb_store import client_timeouts

    monkeypatch.setenv("AEC_STORE_REQUEST_TIMEOUT", "7")
    monkeypatch.setenv("AEC_STORE_CONNECT_TIMEOUT", "3")
    backend = RedisBackend("redis://127.0.0.1:1/0")
    assert (backend.socket_timeout, backend.connect_timeout) == (7.0, 3.0)
    built = RedisSpec("redis://127.0.0.1:1/0").build(0)  # resolved where it is built
    assert (built.socket_timeout, built.connect_timeout) == (7.0, 3.0)
    assert RedisBackend("redis://127.0.0.1:1/0", socket_timeout=1.5).socket_timeout == 1.5
    assert client_timeouts() == {"connect_timeout": "3s", "timeout": "7s"}


@pytest.mark.spark
def test_a_stalled_store_fails_the_micro_batch_in_bounded_time_and_the_restart_is_exact(
    spark, tmp_path, stallable
):
    server, bucket = stallable
    from pyspark.errors import StreamingQueryException

    stream = Stream(spark, tmp_path, num_partitions=2,
                    spark_checkpoint_location=str(tmp_path / "spark"))  # fmt: skip
    stream.location = f"s3://{bucket}/job"
    steps = [_rows(0, 30, 1), _rows(30, 30, 2), _rows(60, 20, 3)]
    stream.start(RunningCount())
    try:
        stream.add(steps[0])
        server.pause()
        started = time.monotonic()
        with pytest.raises(StreamingQueryException) as failure:
            stream.add(steps[1])
        elapsed = time.monotonic() - started
    finally:
        server.resume()
        stream.stop()
    assert elapsed < REQUEST + MARGIN, elapsed
    message = str(failure.value)
    assert f"checkpoint store s3://{bucket}/job/state" in message and "stalled" in message
    stream.start(RunningCount())  # the store answers again: the restart is exact
    try:
        stream.query.processAllAvailable()
        stream.add(steps[2])
    finally:
        stream.stop()
    assert stream.per_key() == _expected_per_key([r for step in steps for r in step])
    print(f"stalled store: micro-batch failed after {elapsed:.1f} s: {message.splitlines()[0]}")
