"""spark_glue.process_keyed_co (batch) and process_keyed_co_stream (Structured
Streaming): two DataFrames into one ``KeyedCoProcessFunction``, in the contract's
arrival order, with per-input watermarks; exactly-once state, rescaling and S3 state
for the stream; the driver's errors naming the side and the column."""

from __future__ import annotations

import json
import os
import random
import sys

import cloudpickle
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from aec import (
    AecConfig,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed_co,
)
from aec.joins import interval_join
from backends import RocksDBBackend
from spark_glue import partition_metrics, process_keyed_co, process_keyed_co_stream, side_output
from spark_glue.watermarks import BoundedOutOfOrderness

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LEFT_DDL = "k string, id long, t double, a double"
RIGHT_DDL = "key string, name string, ts double, a double"
PAIR_DDL = "k string, id long, name string"


def pair(left, right):
    return {"k": left["k"], "id": left["id"], "name": right["name"]}


def _sides(seed, n_left=60, n_right=40, keys=4):
    """Random rows of both sides; ``a`` (arrival) is the event time plus up to a minute,
    so records arrive out of event-time order."""
    rng = random.Random(seed)
    left, right = [], []
    for i in range(n_left):
        t = float(rng.randrange(0, 200))
        left.append({"k": f"k{rng.randrange(keys)}", "id": i, "t": t, "a": t + rng.randrange(60)})
    for i in range(n_right):
        t = float(rng.randrange(0, 200))
        right.append(
            {"key": f"k{rng.randrange(keys)}", "name": f"r{i}", "ts": t, "a": t + rng.randrange(60)}
        )
    return left, right


def _arrival(left, right, order_left="a", order_right="a"):
    """The contract's arrival order: each side by its order value (ties in row
    order), merged by that value, ties left first."""
    tagged = [(r[order_left], 1, i, r) for i, r in enumerate(left)]
    tagged += [(r[order_right], 2, i, r) for i, r in enumerate(right)]
    return [(input, row) for _, input, _, row in sorted(tagged, key=lambda x: x[:3])]


def _source(arrival, delay, interval):
    """What one partition's operator sees: records and per-input periodic watermarks."""
    generators = {
        1: BoundedOutOfOrderness(delay, interval),
        2: BoundedOutOfOrderness(delay, interval),
    }
    source = []
    for input, row in arrival:
        key, stamp = (row["k"], row["t"]) if input == 1 else (row["key"], row["ts"])
        source.append((input, Record(key, row, stamp)))
        mark = generators[input].on_record(stamp)
        if mark is not None:
            source.append((input, Watermark(mark)))
    return source


@pytest.mark.spark
def test_an_interval_join_in_one_partition_equals_the_local_run(spark):
    left, right = _sides(1)
    function = interval_join(-5, 10, pair, left_late_tag="late_left", right_late_tag="late_right")
    result = process_keyed_co(
        spark.createDataFrame(left, LEFT_DDL), spark.createDataFrame(right, RIGHT_DDL),
        function, ("k", "key"), PAIR_DDL, timestamp=("t", "ts"), watermark_delay=30,
        watermark_interval=7, num_partitions=1, order_by="a",
        side_outputs={"late_left": LEFT_DDL, "late_right": RIGHT_DDL},
    )  # fmt: skip
    local = run_keyed_co(_source(_arrival(left, right), 30, 7), function)
    expected = sorted(tuple(o.values()) for o in local.outputs if not isinstance(o, Watermark))
    assert sorted(tuple(r) for r in result.collect()) == expected
    assert len(expected) > 10
    for tag in ("late_left", "late_right"):
        late = sorted(tuple(r) for r in side_output(result, tag).collect())
        assert late == sorted(tuple(v.values()) for v in local.side_outputs.get(tag, []))
    assert local.side_outputs  # the delay is short enough to make some records late
    metrics = partition_metrics(result).collect()[0]
    assert metrics["records_in"] == len(left) + len(right)
    assert metrics["late_records_dropped"] == 0  # the late went to the side outputs


def _brute_force(left, right, lower, upper):
    return sorted(
        (one["k"], one["id"], other["name"])
        for one in left
        for other in right
        if one["k"] == other["key"] and one["t"] + lower <= other["ts"] <= one["t"] + upper
    )


@pytest.mark.spark
def test_with_a_generous_delay_every_pair_inside_the_interval_leaves(spark):
    left, right = _sides(2, 200, 150, keys=9)
    result = process_keyed_co(
        spark.createDataFrame(left, LEFT_DDL), spark.createDataFrame(right, RIGHT_DDL),
        interval_join(-3, 4, pair), ("k", "key"), PAIR_DDL, timestamp=("t", "ts"),
        watermark_delay=1000, watermark_interval=5, num_partitions=3,
        backend=RocksDBBackend("/tmp/aec-co-test-rocksdb").spec(),
    )  # fmt: skip
    assert sorted(tuple(r) for r in result.collect()) == _brute_force(left, right, -3, 4)


class Arrivals(KeyedCoProcessFunction):
    """Emits each record's input and id with the watermark it saw, in arrival order."""

    def process_element1(self, value, ctx):
        ctx.output({"k": ctx.current_key, "input": 1, "id": value["id"]})

    def process_element2(self, value, ctx):
        ctx.output({"k": ctx.current_key, "input": 2, "id": value["id"]})


@pytest.mark.spark
def test_arrival_order_each_side_by_its_order_merged_ties_left_first(spark):
    left = [{"k": "a", "id": i, "o": o} for i, o in enumerate([3, 1, 2, 2, 5])]
    right = [{"k2": "a", "id": 100 + i, "o2": o} for i, o in enumerate([2, 4, 1, 2])]
    result = process_keyed_co(
        spark.createDataFrame(left, "k string, id long, o long"),
        spark.createDataFrame(right, "k2 string, id long, o2 long"),
        Arrivals(), ("k", "k2"), "k string, input int, id long", order_by=("o", "o2"),
        num_partitions=2, config=AecConfig(async_state=False),
    )  # fmt: skip
    ids = [row["id"] for row in result.collect()]
    # order 1: left 1, right 102; order 2: left 2, left 3 (row order), right 100, right 103
    assert ids == [1, 102, 2, 3, 100, 103, 0, 101, 4]


@pytest.mark.spark
def test_driver_errors_name_the_side_and_the_column(spark):
    left = spark.createDataFrame([("a", 1, 1.0, 1.0)], LEFT_DDL)
    right = spark.createDataFrame([("a", "x", 1.0, 1.0)], RIGHT_DDL)
    join = interval_join(0, 1, pair)
    with pytest.raises(ValueError, match="the right side has no column 'k'"):
        process_keyed_co(left, right, join, "k", PAIR_DDL)
    with pytest.raises(ValueError, match="the left side has no column 'key'"):
        process_keyed_co(left, right, join, "key", PAIR_DDL)
    with pytest.raises(ValueError, match="the right side has no column 't'"):
        process_keyed_co(left, right, join, ("k", "key"), PAIR_DDL, timestamp="t")
    with pytest.raises(ValueError, match="the left side has no column 'when'"):
        process_keyed_co(left, right, join, ("k", "key"), PAIR_DDL, order_by=("when", "ts"))
    with pytest.raises(ValueError, match="key column 'id' of the left side is bigint"):
        process_keyed_co(left, right, join, ("id", "key"), PAIR_DDL)
    with pytest.raises(TypeError, match="KeyedProcessFunction.*KeyedCoProcessFunction"):

        class One(KeyedProcessFunction):
            def process_element(self, value, ctx):
                pass

        process_keyed_co(left, right, One(), ("k", "key"), PAIR_DDL)
    with pytest.raises(TypeError, match="key must be a column name"):
        process_keyed_co(left, right, join, ("k", "key", "x"), PAIR_DDL)
    with pytest.raises(ValueError, match="watermark_delay needs a timestamp"):
        process_keyed_co(left, right, join, ("k", "key"), PAIR_DDL, watermark_delay=5)
    with pytest.raises(ValueError, match=r"the right side has column\(s\) \['__aec_k0'\]"):
        process_keyed_co(left, right.withColumnRenamed("name", "__aec_k0"), join, ("k", "key"),
                         PAIR_DDL)  # fmt: skip
    structs = [frame.withColumn("s", F.struct(F.lit(1).alias("one"))) for frame in (left, right)]
    with pytest.raises(TypeError, match="key column 's' of the left side is struct"):
        process_keyed_co(*structs, join, "s", PAIR_DDL)


# -- the stream ------------------------------------------------------------------------------------
class RunningCounts(KeyedCoProcessFunction):
    """Per key: how many records of each input so far; one output per record."""

    def open(self, ctx):
        self.counts = ctx.get_state(ValueStateDescriptor("counts", default=(0, 0)))

    async def process_element1(self, value, ctx):
        await self.count(value, ctx, 0)

    async def process_element2(self, value, ctx):
        await self.count(value, ctx, 1)

    async def count(self, value, ctx, side):
        counts = list(await self.counts.async_value())
        counts[side] += 1
        await self.counts.async_update(tuple(counts))
        ctx.output(
            {"k": ctx.current_key, "seq": value["seq"], "ones": counts[0], "twos": counts[1]}
        )


COUNT_DDL = "k string, seq long, ones long, twos long"
SIDE_DDL = {"left": "k string, seq long, t double", "right": "who string, seq long, t double"}


class TwoStreams:
    """Two file-source streams into process_keyed_co_stream; the sink keeps every call."""

    def __init__(self, spark, tmp_path, fail_batches=(), **kwargs):
        self.spark = spark
        self.dirs = {side: tmp_path / side for side in ("left", "right")}
        for directory in self.dirs.values():
            directory.mkdir(exist_ok=True)
        self.location = str(tmp_path / "ckpt")
        self.calls: list[tuple[int, list[dict]]] = []
        self.fail = set(fail_batches)
        self.kwargs = {"num_partitions": 3, "order_by": "seq", **kwargs}
        self.files = 0
        self.query = None

    def sink(self, batch_df, batch_id):
        rows = [r.asDict() for r in batch_df.collect()]
        if batch_id in self.fail:
            self.fail.discard(batch_id)
            raise RuntimeError(f"sink crashed in batch {batch_id}")
        self.calls.append((batch_id, rows))

    def start(self, **overrides):
        left = self.spark.readStream.schema(SIDE_DDL["left"]).json(str(self.dirs["left"]))
        right = self.spark.readStream.schema(SIDE_DDL["right"]).json(str(self.dirs["right"]))
        self.query = process_keyed_co_stream(
            left, right, RunningCounts(), ("k", "who"), COUNT_DDL,
            checkpoint_location=self.location, sink=self.sink, **{**self.kwargs, **overrides},
        )  # fmt: skip
        return self.query

    def add(self, rows):
        """One file per side (atomically), then process everything available."""
        for side, key in (("left", "k"), ("right", "who")):
            staging = self.dirs[side].parent / f"{side}-{self.files}.json.tmp"
            mine = [{key: r["k"], "seq": r["seq"], "t": r["t"]} for r in rows if r["side"] == side]
            staging.write_text("".join(json.dumps(r) + "\n" for r in mine))
            os.replace(staging, self.dirs[side] / f"file-{self.files}.json")
        self.files += 1
        self.query.processAllAvailable()

    def stop(self):
        self.query.stop()

    def per_key(self):
        got: dict = {}
        for _, rows in self.calls:
            for r in rows:
                got.setdefault(r["k"], []).append((r["seq"], r["ones"], r["twos"]))
        return {k: sorted(v) for k, v in got.items()}


def _stream_rows(start, n, seed, keys=6):
    rng = random.Random(seed)
    return [
        {
            "side": rng.choice(["left", "right"]),
            "k": f"k{rng.randrange(keys)}",
            "seq": s,
            "t": 1.0 * s,
        }
        for s in range(start, start + n)
    ]


def _expected(rows):
    """run_keyed_co over the rows in seq order (the stream's arrival order)."""
    source = [
        (1 if r["side"] == "left" else 2, Record(r["k"], {"seq": r["seq"]}, r["t"]))
        for r in sorted(rows, key=lambda r: r["seq"])
    ]
    expected: dict = {}
    for out in run_keyed_co(source, RunningCounts()).outputs:
        if not isinstance(out, Watermark):
            expected.setdefault(out["k"], []).append((out["seq"], out["ones"], out["twos"]))
    return {k: sorted(v) for k, v in expected.items()}


@pytest.mark.spark
def test_a_co_stream_counts_once_across_a_replay_and_a_rescale(spark, tmp_path):
    stream = TwoStreams(spark, tmp_path, fail_batches={1}, timestamp="t", watermark_delay=5)
    steps = [_stream_rows(0, 30, 1), _stream_rows(30, 30, 2), _stream_rows(60, 25, 3)]
    stream.start()
    stream.add(steps[0])
    with pytest.raises(StreamingQueryException, match="sink crashed in batch 1"):
        stream.add(steps[1])
    stream.stop()
    assert [batch_id for batch_id, _ in stream.calls] == [0]
    stream.start(num_partitions=2)  # batch 1 again, now on 2 partitions (a rescale)
    try:
        stream.query.processAllAvailable()
        stream.add(steps[2])
    finally:
        stream.stop()
    assert [batch_id for batch_id, _ in stream.calls] == [0, 1, 2]
    assert stream.per_key() == _expected([r for step in steps for r in step])
    with open(os.path.join(stream.location, "state", "layout.json")) as handle:
        layout = json.load(handle)
    assert layout["keys"] == ["left:k", "right:who"]
    assert layout["history"] == [[0, 3], [1, 2]]
    watermark_files = [
        name
        for folder, _, names in os.walk(os.path.join(stream.location, "state"))
        for name in names
        if name.startswith("watermarks-")
    ]
    saved = json.loads(open(next(
        os.path.join(folder, name)
        for folder, _, names in os.walk(os.path.join(stream.location, "state"))
        for name in names if name.startswith("watermarks-")
    )).read())  # fmt: skip
    assert watermark_files and len(saved["inputs"]) == 2


@pytest.mark.spark
def test_a_co_stream_keeps_its_state_on_s3(spark, tmp_path, s3):
    server, bucket = s3
    stream = TwoStreams(spark, tmp_path, backend=RocksDBBackend(str(tmp_path / "rocks")).spec())
    stream.location = f"s3://{bucket}/co"
    steps = [_stream_rows(0, 25, 4), _stream_rows(25, 20, 5)]
    for step, partitions in zip(steps, [2, 3], strict=True):
        stream.start(num_partitions=partitions, spark_checkpoint_location=str(tmp_path / "spark"))
        try:
            stream.add(step)
        finally:
            stream.stop()
    assert stream.per_key() == _expected([r for step in steps for r in step])
    keys = server.list_keys(bucket, "co/state/")
    assert any("-of-3/chk-1/MANIFEST.json" in k for k in keys)


@pytest.mark.spark
def test_co_stream_driver_errors(spark, tmp_path):
    left = spark.readStream.schema(SIDE_DDL["left"]).json(str(tmp_path))
    right = spark.readStream.schema(SIDE_DDL["right"]).json(str(tmp_path))
    location = str(tmp_path / "ckpt")

    def sink(batch_df, batch_id):
        pass

    with pytest.raises(TypeError, match="streaming DataFrame as right_stream"):
        process_keyed_co_stream(
            left, spark.range(3), RunningCounts(), ("k", "id"), COUNT_DDL,
            checkpoint_location=location, sink=sink,
        )  # fmt: skip
    with pytest.raises(ValueError, match="the right side has no column 'k'"):
        process_keyed_co_stream(
            left, right, RunningCounts(), "k", COUNT_DDL, checkpoint_location=location, sink=sink
        )
    with pytest.raises(ValueError, match="needs checkpoint_location"):
        process_keyed_co_stream(
            left, right, RunningCounts(), ("k", "who"), COUNT_DDL, checkpoint_location=None,
            sink=sink,
        )  # fmt: skip
    assert not os.path.exists(location)
