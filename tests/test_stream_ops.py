"""Operating process_keyed_stream through Spark: the merged metrics per micro-batch (the
listener and the aec.stream log line), initial state on the first start only,
read_state of the stream's checkpoint location, and a declaring function whose
micro-batches carry their hot key's records across a replayed micro-batch."""

from __future__ import annotations

import logging
import random
import sys

import cloudpickle
import pytest
from pyspark.errors import StreamingQueryException
from test_stream import IN_DDL, OUT_DDL, RunningCount, Stream, _expected_per_key, _rows

from aec import AecConfig, ValueStateDescriptor
from aec.declare import DeclarationContext, DeclaringKeyedProcessFunction
from aec.keygroups import key_group_for, operator_index_for
from backends import LatencyBackend, MemoryBackend, RocksDBBackend
from spark_glue import process_keyed_stream, read_state

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class SeededCount(RunningCount):
    """RunningCount whose count and total may start from an initial-state row."""

    async def process_initial_state(self, row, ctx):
        await self.count.async_update(row["count"])
        await self.total.async_update(row["total"])


def _skewed(start, n, seed, hot="hot"):
    """Rows where half of the records belong to one key."""
    rng = random.Random(seed)
    return [
        {"k": hot if i % 2 == 0 else f"k{rng.randrange(6)}", "seq": s, "x": 1, "t": float(s)}
        for i, s in enumerate(range(start, start + n))
    ]


@pytest.mark.spark
def test_each_micro_batch_is_merged_for_the_listener_and_logged(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="aec.stream")
    seen: list[tuple[int, dict]] = []
    backend = LatencyBackend(MemoryBackend(), 0.002).spec()  # the hot key's records block
    stream = Stream(spark, tmp_path, backend=backend)
    steps = [_skewed(0, 60, 1), _skewed(60, 40, 2)]
    stream.start(RunningCount(), metrics_listener=lambda b, m: seen.append((b, m)))
    try:
        for step in steps:
            stream.add(step)
    finally:
        stream.stop()
    assert [b for b, _ in seen] == [0, 1]
    for (batch_id, metrics), step in zip(seen, steps, strict=True):
        assert metrics["batch_id"] == batch_id
        assert metrics["rows_in"] == metrics["records_in"] == len(step)  # this micro-batch's
        assert metrics["records_out"] == len(step)
        assert 1 <= metrics["partitions"] <= 3
        assert 0 < metrics["batch_size"]["count"] <= metrics["batches"]
        assert metrics["state_request_latency_s"]["p50"] >= 0.002 * 0.95
        assert metrics["hot_keys"][0][0] == "hot" and metrics["hot_keys"][0][1] > 0
        assert len(metrics["hot_keys"]) <= 10
        assert metrics["num_in_flight_records"] == 0  # a drained micro-batch
        assert metrics["peak_in_flight_records"] >= 1
    lines = [r.getMessage() for r in caplog.records if r.name == "aec.stream"]
    assert [line.split(":")[0] for line in lines] == ["micro-batch 0", "micro-batch 1"]
    assert "hottest key 'hot'" in lines[0]


@pytest.mark.spark
def test_a_kept_operators_hot_keys_and_histograms_are_of_its_micro_batch(spark, tmp_path):
    """A micro-batch of distinct keys after a skewed one has no hot key, and its
    histograms count only its own batches and records, whether a partition kept its
    live operator (MemoryBackend, when Spark runs it in the same Python worker again:
    not certain) or restored one (the kept case alone:
    test_stream_metrics.test_a_kept_operators_micro_batch_reports_its_own_counters)."""
    seen: list[tuple[int, dict]] = []
    stream = Stream(spark, tmp_path)  # the default MemoryBackend
    distinct = [{"k": f"d{s}", "seq": s, "x": 1, "t": float(s)} for s in range(60, 80)]
    stream.start(RunningCount(), metrics_listener=lambda b, m: seen.append((b, m)))
    try:
        stream.add(_skewed(0, 60, 1))
        stream.add(distinct)
    finally:
        stream.stop()
    (_, first), (_, second) = seen
    assert first["kept_operators"] == 0
    assert first["hot_keys"][0][0] == "hot" and first["blocked_requests"] > 0
    assert second["blocked_requests"] == 0 and second["hot_keys"] == []
    assert 0 < second["batch_size"]["count"] <= second["batches"]
    assert second["record_latency_s"]["count"] <= second["records_in"] == len(distinct)


@pytest.mark.spark
def test_initial_state_is_seen_by_the_first_start_only(spark, tmp_path):
    """The first micro-batch fails in its sink (after the partitions took their
    checkpoints): its replay starts from empty state again and loads the initial state
    again, once. A restart with state ignores another initial state."""
    initial = spark.createDataFrame(
        [("k0", 100, 1000), ("k1", 200, 2000), ("nobody", 7, 7)], "k string, count long, total long"
    )
    stream = Stream(spark, tmp_path, fail_batches={0})
    steps = [_rows(0, 20, 3, n_keys=3), _rows(20, 10, 4, n_keys=3)]
    stream.start(SeededCount(), initial_state=initial)
    with pytest.raises(StreamingQueryException, match="sink crashed in batch 0"):
        stream.add(steps[0])
    stream.stop()
    stream.start(SeededCount(), initial_state=initial)
    try:
        stream.query.processAllAvailable()  # the replay of micro-batch 0
    finally:
        stream.stop()
    other = spark.createDataFrame([("k0", 5, 5)], "k string, count long, total long")
    stream.start(SeededCount(), initial_state=other)  # state exists: not loaded
    try:
        stream.add(steps[1])
    finally:
        stream.stop()
    plain = _expected_per_key([r for step in steps for r in step])
    offsets = {"k0": (100, 1000), "k1": (200, 2000)}
    expected = {
        k: [(seq, c + offsets.get(k, (0, 0))[0], t + offsets.get(k, (0, 0))[1]) for seq, c, t in v]
        for k, v in plain.items()
    }
    assert stream.per_key() == expected
    state = {
        (r.key, r.state): int(r.value) for r in read_state(spark, stream.location).collect()
    }
    assert state[("nobody", "count")] == 7  # a key with initial state and no input
    assert state[("k0", "count")] == 100 + len(plain["k0"])


@pytest.mark.spark
def test_initial_state_that_does_not_fit_fails_on_the_driver(spark, tmp_path):
    df = spark.readStream.schema(IN_DDL).json(str(tmp_path))

    def sink(batch_df, batch_id):
        pass

    common = {"checkpoint_location": str(tmp_path / "ckpt"), "sink": sink}
    good = spark.createDataFrame([("k", 1, 1)], "k string, count long, total long")
    with pytest.raises(TypeError, match="process_initial_state"):
        process_keyed_stream(df, RunningCount(), "k", OUT_DDL, initial_state=good, **common)
    wrong = spark.createDataFrame([(1, 1, 1)], "k long, count long, total long")
    with pytest.raises(TypeError, match="key column 'k' is bigint"):
        process_keyed_stream(df, SeededCount(), "k", OUT_DDL, initial_state=wrong, **common)
    with pytest.raises(ValueError, match="no key column 'k'"):
        process_keyed_stream(
            df, SeededCount(), "k", OUT_DDL, initial_state=good.drop("k"), **common
        )
    with pytest.raises(TypeError, match="metrics_listener"):
        process_keyed_stream(df, RunningCount(), "k", OUT_DDL, metrics_listener=3, **common)


@pytest.mark.spark
@pytest.mark.parametrize("store", ["memory", "rocksdb"])
def test_read_state_of_a_stream_is_its_last_committed_micro_batch(spark, tmp_path, store):
    backend = RocksDBBackend(str(tmp_path / "rocks")).spec() if store == "rocksdb" else None
    stream = Stream(spark, tmp_path, fail_batches={2}, backend=backend)
    steps = [_rows(0, 30, 5), _rows(30, 30, 6), _rows(60, 10, 7)]
    stream.start(RunningCount())
    try:
        stream.add(steps[0])
        stream.add(steps[1])
        with pytest.raises(StreamingQueryException, match="sink crashed in batch 2"):
            stream.add(steps[2])
    finally:
        stream.stop()

    def counts():
        rows = read_state(spark, stream.location).collect()
        assert {r.state for r in rows} == {"count", "total"}
        return {r.key: int(r.value) for r in rows if r.state == "count"}

    # micro-batch 2 snapshotted, then its sink failed: Spark did not commit it
    committed = _expected_per_key(steps[0] + steps[1])
    assert counts() == {k: v[-1][1] for k, v in committed.items()}
    stream.start(RunningCount())
    try:
        stream.query.processAllAvailable()
    finally:
        stream.stop()
    every = _expected_per_key(steps[0] + steps[1] + steps[2])
    assert counts() == {k: v[-1][1] for k, v in every.items()}
    frame = read_state(spark, stream.location)
    assert frame.columns == [
        "key", "key_group", "state", "namespace", "user_key", "value", "value_pickle"
    ]  # fmt: skip


@pytest.mark.spark
def test_read_state_of_a_stream_on_s3(spark, tmp_path, s3):
    _, bucket = s3
    stream = Stream(spark, tmp_path)
    stream.location = f"s3://{bucket}/job"
    steps = [_rows(0, 25, 8)]
    stream.start(RunningCount(), spark_checkpoint_location=str(tmp_path / "spark"))
    try:
        stream.add(steps[0])
    finally:
        stream.stop()
    rows = read_state(
        spark, stream.location, spark_checkpoint_location=str(tmp_path / "spark")
    ).collect()
    expected = _expected_per_key(steps[0])
    assert {r.key: int(r.value) for r in rows if r.state == "count"} == {
        k: v[-1][1] for k, v in expected.items()
    }


class DeclaredCount(DeclaringKeyedProcessFunction):
    """The running count and total, declared: its micro-batches carry its hot key."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def declare_process(self, d: DeclarationContext):
        row = d.declare_variable("row")
        count = d.declare_variable("count")

        def read_count(value, ctx):
            row.set(value)
            return self.count.async_value()

        def write_count(n, ctx):
            count.set(n + 1)
            return self.count.async_update(n + 1)

        def read_total(_, ctx):
            return self.total.async_value()

        def write_total(total, ctx):
            value = row.get()
            ctx.output({"k": ctx.current_key, "seq": value["seq"], "count": count.get(),
                        "total": total + value["x"]})  # fmt: skip
            return self.total.async_update(total + value["x"])

        return d.chain(
            d.declare("read-count", read_count), d.declare("write-count", write_count),
            d.declare("read-total", read_total), d.declare("write-total", write_total),
        )  # fmt: skip


@pytest.mark.spark
def test_carried_records_across_a_replayed_micro_batch_give_each_output_once(spark, tmp_path):
    outputs: dict[int, list[dict]] = {}  # the sink is idempotent by micro-batch id
    carried: dict[int, int] = {}

    class Sink:
        failed = False

        def __call__(self, batch_df, batch_id):
            rows = [r.asDict() for r in batch_df.collect()]
            if batch_id == 1 and not self.failed:
                self.failed = True
                raise RuntimeError("sink crashed in batch 1")
            outputs[batch_id] = rows

    sink = Sink()
    backend = LatencyBackend(MemoryBackend(), 0.02).spec()
    stream = Stream(spark, tmp_path, backend=backend, num_partitions=2)
    listener = {"metrics_listener": lambda b, m: carried.__setitem__(b, m["checkpoint_pending_records"])}
    steps = [_skewed(0, 40, 11), _skewed(40, 40, 12), _skewed(80, 20, 13)]

    def start():
        df = spark.readStream.schema(IN_DDL).json(str(stream.input))
        stream.query = process_keyed_stream(
            df, DeclaredCount(), "k", OUT_DDL, checkpoint_location=stream.location, sink=sink,
            order_by="seq", backend=backend, num_partitions=2, config=AecConfig(), **listener,
        )  # fmt: skip

    start()
    stream.add(steps[0])
    with pytest.raises(StreamingQueryException, match="sink crashed in batch 1"):
        stream.add(steps[1])
    stream.stop()
    # one row of a key of partition 1, then one of partition 0: a partition with carried
    # work and no rows in a micro-batch runs it anyway and finishes that work
    idle = [
        next(f"idle{i}" for i in range(100)
             if operator_index_for(key_group_for(f"idle{i}", 128), 128, 2) == p)
        for p in (1, 0)
    ]  # fmt: skip
    start()
    try:
        stream.query.processAllAvailable()  # micro-batch 1 again, from chk-0 and what it carried
        stream.add(steps[2])
        for i, key in enumerate(idle):
            stream.add([{"k": key, "seq": 10_000 + i, "x": 0, "t": 0.0}])
    finally:
        stream.stop()
    assert max(carried.values()) > 0, "no micro-batch carried a record"
    assert carried[max(carried)] == 0
    got: dict[str, list[tuple]] = {}
    for rows in outputs.values():
        for r in rows:
            if r["k"] not in idle:
                got.setdefault(r["k"], []).append((r["seq"], r["count"], r["total"]))
    every = [r for step in steps for r in step]
    assert {k: sorted(v) for k, v in got.items()} == _expected_per_key(every)
    counts = {
        r.key: int(r.value) for r in read_state(spark, stream.location).collect()
        if r.state == "count" and r.key not in idle
    }
    assert counts == {k: len(v) for k, v in _expected_per_key(every).items()}
