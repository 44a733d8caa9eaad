"""spark_glue.process_keyed_stream: state across micro-batches, restarts and replays."""

from __future__ import annotations

import json
import os
import random
import sys

import cloudpickle
import pytest
from pyspark.errors import StreamingQueryException

from aec import AecConfig, KeyedProcessFunction, Record, ValueStateDescriptor, Watermark, run_keyed
from backends import RocksDBBackend
from spark_glue import process_keyed_stream
from spark_glue.watermarks import BoundedOutOfOrderness

cloudpickle.register_pickle_by_value(sys.modules[__name__])

IN_DDL = "k string, seq long, x long, t double"
OUT_DDL = "k string, seq long, count long, total long"


class RunningCount(KeyedProcessFunction):
    """Per key: count and sum of ``x``; with ``fire_after``, an event-time timer that
    reports the total (``seq`` -1) that many seconds after each record."""

    def __init__(self, fire_after: float | None = None) -> None:
        self.fire_after = fire_after

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.total = ctx.get_state(ValueStateDescriptor("total"))

    async def process_element(self, value, ctx):
        count = (await self.count.async_value() or 0) + 1
        total = (await self.total.async_value() or 0) + value["x"]
        await self.count.async_update(count)
        await self.total.async_update(total)
        ctx.output({"k": ctx.current_key, "seq": value["seq"], "count": count, "total": total})
        if self.fire_after is not None:
            ctx.timer_service.register_event_time_timer(ctx.timestamp + self.fire_after)

    async def on_timer(self, timestamp, ctx):
        count = await self.count.async_value()
        total = await self.total.async_value()
        ctx.output({"k": ctx.current_key, "seq": -1, "count": count, "total": total})


def _rows(start: int, n: int, seed: int, n_keys: int = 5) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"k": f"k{rng.randrange(n_keys)}", "seq": s, "x": rng.randrange(1, 10), "t": 10.0 * s}
        for s in range(start, start + n)
    ]


class Stream:
    """A file-source stream into process_keyed_stream; the sink keeps every call."""

    def __init__(self, spark, tmp_path, fail_batches=(), **kwargs):
        self.spark = spark
        self.input = tmp_path / "input"
        self.input.mkdir(exist_ok=True)
        self.location = str(tmp_path / "ckpt")
        self.calls: list[tuple[int, list[dict]]] = []
        self.fail = set(fail_batches)
        self.kwargs = {"num_partitions": 3, "order_by": "seq", **kwargs}
        self.files = len(os.listdir(self.input))
        self.query = None

    def sink(self, batch_df, batch_id):
        rows = [r.asDict() for r in batch_df.collect()]
        if batch_id in self.fail:
            self.fail.discard(batch_id)
            raise RuntimeError(f"sink crashed in batch {batch_id}")
        self.calls.append((batch_id, rows))

    def start(self, function, **overrides):
        df = self.spark.readStream.schema(IN_DDL).json(str(self.input))
        self.query = process_keyed_stream(
            df,
            function,
            "k",
            OUT_DDL,
            checkpoint_location=self.location,
            sink=self.sink,
            **{**self.kwargs, **overrides},
        )
        return self.query

    def add(self, rows):
        """Write one JSON file (atomically) and process everything available."""
        staging = self.input.parent / f"file-{self.files}.json.tmp"
        staging.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(staging, self.input / f"file-{self.files}.json")
        self.files += 1
        self.query.processAllAvailable()

    def stop(self):
        self.query.stop()

    def per_key(self):
        got: dict[str, list[tuple]] = {}
        for _, rows in self.calls:
            for r in rows:
                got.setdefault(r["k"], []).append((r["seq"], r["count"], r["total"]))
        return {k: sorted(v) for k, v in got.items()}


def _expected_per_key(rows):
    result = run_keyed([Record(r["k"], r) for r in rows], RunningCount())
    expected: dict[str, list[tuple]] = {}
    for out in result.outputs:
        if not isinstance(out, Watermark):
            expected.setdefault(out["k"], []).append((out["seq"], out["count"], out["total"]))
    return expected


def _checkpoints(location):
    state = os.path.join(location, "state")
    return {
        name: sorted(n for n in os.listdir(os.path.join(state, name)) if n.startswith("chk-"))
        for name in sorted(os.listdir(state))
        if name.startswith("partition-")
    }


@pytest.mark.spark
def test_running_counts_match_run_keyed_batch_by_batch(spark, tmp_path):
    stream = Stream(spark, tmp_path)
    steps = [_rows(0, 40, 1), _rows(40, 25, 2), _rows(65, 1, 3), _rows(66, 30, 4)]
    stream.start(RunningCount())
    try:
        for step in steps:
            stream.add(step)
    finally:
        stream.stop()
    assert [batch_id for batch_id, _ in stream.calls] == [0, 1, 2, 3]
    for (_, rows), step in zip(stream.calls, steps, strict=True):
        assert sorted(r["seq"] for r in rows) == [r["seq"] for r in step]
    every = [r for step in steps for r in step]
    assert stream.per_key() == _expected_per_key(every)  # running values, so final state too
    # every partition keeps at most two checkpoints; the one-row batch 2 left the
    # partitions without rows alone
    checkpoints = _checkpoints(stream.location)
    # key-group routing: with 5 keys a partition may get none (then it has no directory)
    assert 2 <= len(checkpoints) and set(checkpoints) <= {f"partition-{p}-of-3" for p in range(3)}
    assert all(1 <= len(ids) <= 2 and "chk-3" in ids for ids in checkpoints.values())
    assert sum("chk-2" in ids for ids in checkpoints.values()) == 1


@pytest.mark.spark
def test_restart_continues_state_timers_and_watermarks(spark, tmp_path):
    # one partition, so the emission order is comparable with run_keyed's
    options = {
        "num_partitions": 1,
        "timestamp": "t",
        "watermark_delay": 25,
        "watermark_interval": 4,
    }
    stream = Stream(spark, tmp_path, **options)
    steps = [_rows(0, 10, 5), _rows(10, 7, 6), _rows(17, 9, 7)]
    stream.start(RunningCount(fire_after=30))
    try:
        stream.add(steps[0])
        stream.add(steps[1])
    finally:
        stream.stop()
    with pytest.raises(ValueError, match="max_parallelism"):
        stream.start(RunningCount(fire_after=30), config=AecConfig(max_parallelism=64))
    stream.start(RunningCount(fire_after=30), num_partitions=None)  # the stored number
    try:
        stream.add(steps[2])
    finally:
        stream.stop()
    assert [batch_id for batch_id, _ in stream.calls] == [0, 1, 2]
    # the reference: the same records and watermarks, the generator's progress
    # continuing across micro-batches and a watermark closing each one
    source, generator = [], BoundedOutOfOrderness(25, 4)
    for step in steps:
        fresh = BoundedOutOfOrderness(25, 4)  # the record count restarts per micro-batch
        fresh.max_timestamp, fresh.current = generator.max_timestamp, generator.current
        generator = fresh
        for r in step:
            source.append(Record(r["k"], r, r["t"]))
            mark = generator.on_record(r["t"])
            if mark is not None:
                source.append(Watermark(mark))
        end = generator.max_timestamp - 25
        if end > generator.current:
            generator.current = end
            source.append(Watermark(end))
    reference = run_keyed(source, RunningCount(fire_after=30)).outputs
    # run_keyed ends with Watermark(inf), firing the timers the stream still holds
    last_watermark = max(o.timestamp for o in source if isinstance(o, Watermark))
    expected = [
        (o["k"], o["seq"], o["count"], o["total"])
        for o in reference[: _outputs_before_inf(reference, last_watermark)]
        if isinstance(o, dict)
    ]
    got = [(r["k"], r["seq"], r["count"], r["total"]) for _, rows in stream.calls for r in rows]
    assert got == expected
    assert any(seq == -1 for _, seq, _, _ in got)  # timers restored and fired after a restart
    finals = {k: count for k, seq, count, _ in got if seq >= 0}  # counts kept growing
    assert finals == {k: sum(r["k"] == k for step in steps for r in step) for k in finals}


def _outputs_before_inf(outputs, last_watermark):
    """Index just past the last watermark <= ``last_watermark`` in run_keyed's outputs."""
    end = 0
    for index, out in enumerate(outputs):
        if isinstance(out, Watermark) and out.timestamp <= last_watermark:
            end = index + 1
    return end


@pytest.mark.spark
@pytest.mark.parametrize("store", ["memory", "rocksdb"])
def test_a_replayed_micro_batch_does_not_count_twice(spark, tmp_path, store):
    backend = RocksDBBackend(str(tmp_path / "rocks")).spec() if store == "rocksdb" else None
    stream = Stream(spark, tmp_path, fail_batches={1}, backend=backend)
    steps = [_rows(0, 30, 8), _rows(30, 30, 9), _rows(60, 20, 10)]
    stream.start(RunningCount())
    stream.add(steps[0])
    with pytest.raises(StreamingQueryException, match="sink crashed in batch 1"):
        stream.add(steps[1])
    stream.stop()
    # the crash came after the partitions snapshotted batch 1 and before Spark committed it
    assert any("chk-1" in ids for ids in _checkpoints(stream.location).values())
    assert [batch_id for batch_id, _ in stream.calls] == [0]
    stream.start(RunningCount())
    try:
        stream.query.processAllAvailable()  # Spark runs batch 1 again
        stream.add(steps[2])
    finally:
        stream.stop()
    assert [batch_id for batch_id, _ in stream.calls] == [0, 1, 2]
    every = [r for step in steps for r in step]
    assert stream.per_key() == _expected_per_key(every)


@pytest.mark.spark
def test_bad_arguments_fail_on_the_driver(spark, tmp_path):
    df = spark.readStream.schema(IN_DDL).json(str(tmp_path))
    location = str(tmp_path / "ckpt")

    def sink(batch_df, batch_id):
        pass

    with pytest.raises(TypeError, match="checkpoint_location"):
        process_keyed_stream(df, RunningCount(), "k", OUT_DDL, sink=sink)
    with pytest.raises(ValueError, match="needs checkpoint_location"):
        process_keyed_stream(df, RunningCount(), "k", OUT_DDL, checkpoint_location=None, sink=sink)
    with pytest.raises(ValueError, match="'nosuch'"):
        process_keyed_stream(
            df, RunningCount(), "k", OUT_DDL, checkpoint_location="nosuch://b/x", sink=sink
        )
    with pytest.raises(ValueError, match="exceeds max_parallelism"):
        process_keyed_stream(
            df, RunningCount(), "k", OUT_DDL, checkpoint_location=location, sink=sink,
            num_partitions=5, config=AecConfig(max_parallelism=4),
        )  # fmt: skip
    with pytest.raises(TypeError, match="sink must be callable"):
        process_keyed_stream(
            df, RunningCount(), "k", OUT_DDL, checkpoint_location=location, sink="table"
        )
    with pytest.raises(ValueError, match="column 'nope'"):
        process_keyed_stream(
            df, RunningCount(), "nope", OUT_DDL, checkpoint_location=location, sink=sink
        )
    from aec.joins import interval_join

    with pytest.raises(TypeError, match="KeyedProcessFunction.*KeyedCoProcessFunction"):
        process_keyed_stream(
            df, interval_join(0, 1, max), "k", OUT_DDL, checkpoint_location=location, sink=sink
        )
    with pytest.raises(TypeError, match="streaming DataFrame"):
        process_keyed_stream(
            spark.range(3), RunningCount(), "id", OUT_DDL, checkpoint_location=location, sink=sink
        )
    assert not os.path.exists(location)  # nothing written for refused arguments


@pytest.mark.spark
def test_rescaling_twice_mid_stream_keeps_every_count(spark, tmp_path):
    """3 partitions, then 5 (split), then 2 (merge): each key's running count and
    total continue as one run's; the layout records the history."""
    stream = Stream(spark, tmp_path, num_partitions=3)
    steps = [
        _rows(0, 40, 11, 12),
        _rows(40, 30, 12, 12),
        _rows(70, 30, 13, 12),
        _rows(100, 5, 14, 12),
    ]
    for step, partitions in zip(steps, [3, 5, 2, None], strict=True):
        stream.start(RunningCount(), num_partitions=partitions)
        try:
            stream.add(step)
        finally:
            stream.stop()
    every = [r for step in steps for r in step]
    assert stream.per_key() == _expected_per_key(every)
    with open(os.path.join(stream.location, "state", "layout.json")) as handle:
        layout = json.load(handle)
    assert layout["history"] == [[0, 3], [1, 5], [2, 2]]
    assert {"partition-0-of-5", "partition-4-of-5", "partition-1-of-2"} <= set(
        _checkpoints(stream.location)
    )


@pytest.mark.spark
def test_state_on_s3_and_a_rescale(spark, tmp_path, s3):
    server, bucket = s3
    location = f"s3://{bucket}/stream"
    stream = Stream(spark, tmp_path, num_partitions=2)
    stream.location = location
    steps = [_rows(0, 30, 21), _rows(30, 20, 22)]
    for step, partitions in zip(steps, [2, 3], strict=True):
        stream.start(RunningCount(), num_partitions=partitions,
                     spark_checkpoint_location=str(tmp_path / "spark"))  # fmt: skip
        try:
            stream.add(step)
        finally:
            stream.stop()
    assert stream.per_key() == _expected_per_key([r for step in steps for r in step])
    keys = server.list_keys(bucket, "stream/state/")
    assert "stream/state/layout.json" in keys
    assert any(k.startswith("stream/state/partition-") and "-of-3/chk-1/" in k for k in keys)
    assert any(k.endswith("chk-1/MANIFEST.json") for k in keys)
    assert not os.path.exists(os.path.join(str(tmp_path), "s3:"))


# -- one partition's micro-batches without Spark (stream_task, stream_state) ----------------------
def _task_rows(batch_id, partition, rows):
    """``rows`` as a routed Arrow batch of ``partition``."""
    import pyarrow as pa

    from spark_glue.routing import PARTITION, ROUTE

    table = pa.Table.from_pylist(rows, schema=pa.schema(
        [("k", pa.string()), ("seq", pa.int64()), ("x", pa.int64()), ("t", pa.float64())]
    ))  # fmt: skip
    batch = table.to_batches()[0]
    column = pa.array([partition] * len(rows), pa.int32())
    return batch.append_column(PARTITION, column).append_column(ROUTE, column)


def _run_task(task, batch_id, rows, sources):
    from spark_glue.raw_frame import _METRICS, _STREAM

    out = list(
        task.for_batch(batch_id, 1, 0, {0: sources}, {})(iter([_task_rows(batch_id, 0, rows)]))
    )
    main, metrics = [], None
    for batch in out:
        for row in batch.to_pylist():
            if row[_STREAM] == "main":
                main.append((row["k"], row["seq"], row["count"], row["total"]))
            elif row[_STREAM] == "metrics":
                metrics = json.loads(row[_METRICS])
    return main, metrics


def test_a_kept_operator_continues_and_a_replay_restores(tmp_path):
    """Batch 1 reuses the live operator batch 0 left (its checkpoint is the planned
    base); a replay of batch 1 must not (its base is chk-0): it restores and yields
    the same rows."""
    import uuid

    from pyspark.sql import types as T

    from aec import AecConfig
    from aec.checkpoint import CheckpointHandle
    from aec.state.memory import MemorySpec
    from spark_glue.partition import PartitionJob
    from spark_glue.raw_frame import RawLayout
    from spark_glue.stream_state import StateStore
    from spark_glue.stream_task import StreamTask

    main = T.StructType(
        [T.StructField("k", T.StringType())]
        + [T.StructField(name, T.LongType()) for name in ("seq", "count", "total")]
    )  # fmt: skip  (OUT_DDL, without a SparkContext)
    layout = RawLayout.build(main, {})
    job = PartitionJob(cloudpickle.dumps(RunningCount()), MemorySpec(), AecConfig(), ["k"],
                       None, 0.0, 1000, layout, partitions=1)  # fmt: skip
    state = StateStore(str(tmp_path / "state"), 128)
    task = StreamTask(job, state, uuid.uuid4().hex, keep=True)
    steps = [_rows(0, 20, 31), _rows(20, 20, 32)]
    first, metrics = _run_task(task, 0, steps[0], [])
    assert metrics["kept_operator"] is False and metrics["restored_from"] is None
    chk0 = state.partition(0, 1).latest()
    second, metrics = _run_task(task, 1, steps[1], [chk0])
    assert metrics["kept_operator"] is True
    assert state.partition(0, 1).latest() == CheckpointHandle(1, chk0.path[:-1] + "1")
    replay, metrics = _run_task(task, 1, steps[1], [chk0])  # Spark runs batch 1 again
    assert metrics["kept_operator"] is False and metrics["restored_from"] == 0
    assert replay == second
    expected = _expected_per_key(steps[0] + steps[1])
    got: dict[str, list[tuple]] = {}
    for k, seq, count, total in first + second:
        got.setdefault(k, []).append((seq, count, total))
    assert got == expected


def test_clear_attempt_removes_abandoned_staging_directories_in_a_local_store(tmp_path):
    from spark_glue.stream_state import StateStore, partition_name

    state = StateStore(str(tmp_path), 8)
    own = tmp_path / partition_name(0, 1)
    staging = own / ".chk-3.staging-0123abcd"
    (staging / "backend").mkdir(parents=True)
    (staging / "backend" / "data").write_bytes(b"x")
    (own / "keep").write_text("not staging")
    state.clear_attempt(0, 1, 3)  # a local store has no pyarrow file system (fs is None)
    assert sorted(os.listdir(own)) == ["keep"]


def test_layout_history_replaces_a_failed_attempts_era_and_sources_follow_key_groups(tmp_path):
    from aec import KeyedProcessOperator
    from aec.keygroups import key_group_range_for
    from backends import MemoryBackend
    from spark_glue.stream_state import Layout, StateStore

    layout = Layout(["k"], 8)
    assert layout.enter(0, 2) and layout.history == [[0, 2]]
    assert not layout.enter(1, 2)
    assert layout.enter(3, 4) and layout.history == [[0, 2], [3, 4]]
    assert layout.enter(3, 3) and layout.history == [[0, 2], [3, 3]]  # batch 3 replayed
    state = StateStore(str(tmp_path), 8)
    for old in range(2):  # era 0: both partitions checkpoint batch 1
        operator = KeyedProcessOperator(RunningCount(), MemoryBackend(), AecConfig(max_parallelism=8),
                                        key_group_range=key_group_range_for(8, 2, old))  # fmt: skip
        operator.snapshot(1, state.partition(old, 2).location)
    # era 1 (3 partitions from batch 3): partition 1 (groups 3..5) overlaps both old ones
    sources = state.sources(layout.history, 1, 1, 3)
    assert [h.path for h in sources] == [
        state.partition(0, 2).name_of("chk-1"), state.partition(1, 2).name_of("chk-1")
    ]  # fmt: skip
    assert state.inherited(sources, 1, 3)
    assert [h.path for h in state.sources(layout.history, 1, 0, 3)] == [
        state.partition(0, 2).name_of("chk-1")
    ]
    assert state.sources(layout.history, 0, 0, 1) == []  # before batch 1: nothing yet


def test_a_checkpoint_location_that_is_a_file_is_refused(tmp_path):
    from spark_glue.stream_state import locations

    path = tmp_path / "ckpt"
    path.write_text("")
    with pytest.raises(ValueError, match="is a file"):
        locations(str(path), None)
    assert locations(str(tmp_path / "dir"), None)[0].endswith("state")


def test_a_restart_keyed_by_another_kind_of_value_is_refused(tmp_path):
    """A key column cast from string to int keys other key groups: the state would not
    be found, so the restart is refused; int to bigint, or to double, is one kind."""
    from pyspark.sql import types as T

    from spark_glue.stream import _open_layout, key_kind
    from spark_glue.stream_state import Layout, StateStore

    state = StateStore(str(tmp_path), 8)
    strings = [key_kind(T.StringType())]
    layout = _open_layout(state, None, ["k"], strings, None)
    layout.save(state.store())
    stored = Layout.load(state.store())
    assert stored is not None and stored.kinds == ["string"]
    _open_layout(state, stored, ["k"], strings, None)
    with pytest.raises(ValueError, match=r"kinds \['number'\] .* keyed by kinds \['string'\]"):
        _open_layout(state, stored, ["k"], [key_kind(T.IntegerType())], None)
    numbers = Layout(["k"], 8, kinds=[key_kind(T.IntegerType())])
    for kind in (T.LongType(), T.DoubleType(), T.DecimalType(10, 2), T.BooleanType()):
        _open_layout(state, numbers, ["k"], [key_kind(kind)], None)
    older = Layout(["k"], 8)  # a layout written before kinds were: not checked
    _open_layout(state, older, ["k"], [key_kind(T.IntegerType())], None)
