"""process_keyed_stream with a declaring function: micro-batches that end without waiting
for the records in flight. The checkpoint carries them, they finish in a later
micro-batch, their outputs go to that micro-batch, the end-of-micro-batch watermark is
held back to the next one, and a replayed micro-batch still gives every output exactly
once and exactly-once state. One partition's micro-batches run here without Spark
(``stream_task``, as the driver plans them); tests/test_stream.py and
tests/test_crash.py run the same through Spark."""

from __future__ import annotations

import json
import random
import sys
import uuid

import cloudpickle
import pyarrow as pa
import pytest

from aec import AecConfig, Record, ValueStateDescriptor, Watermark, run_keyed
from aec.declare import DeclarationContext, DeclaringKeyedProcessFunction
from backends import LatencyBackend, MemoryBackend
from spark_glue import stream_task
from spark_glue.metrics import carries_work
from spark_glue.partition import PartitionJob
from spark_glue.raw_frame import _METRICS, _STREAM, RawLayout
from spark_glue.routing import PARTITION, ROUTE
from spark_glue.state_reader import read_state
from spark_glue.stream_state import StateStore
from spark_glue.stream_task import StreamTask

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LATENCY = 0.02  # seconds per state round trip: a hot key's chain outlasts a micro-batch


class Counting(DeclaringKeyedProcessFunction):
    """Read the count, write count + 1, emit ``(key, seq, count)``; with ``fire_after``
    an event-time timer per record emits ``(key, -1, count at the timer)``."""

    def __init__(self, fire_after: float | None = None) -> None:
        self.fire_after = fire_after

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def declare_process(self, d: DeclarationContext):
        seq = d.declare_variable("seq")

        def read(value, ctx):
            seq.set(value["seq"])
            if self.fire_after is not None:
                ctx.timer_service.register_event_time_timer(ctx.timestamp + self.fire_after)
            return self.count.async_value()

        def write(n, ctx):
            ctx.output({"k": ctx.current_key, "seq": seq.get(), "n": n + 1})
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("write", write))

    def declare_on_timer(self, d: DeclarationContext):
        def read(timestamp, ctx):
            return self.count.async_value()

        def emit(n, ctx):
            ctx.output({"k": ctx.current_key, "seq": -1, "n": n})

        return d.chain(d.declare("timer-read", read), d.declare("timer-emit", emit))


def _layout():
    from pyspark.sql import types as T

    main = T.StructType([
        T.StructField("k", T.StringType()), T.StructField("seq", T.LongType()),
        T.StructField("n", T.LongType()),
    ])  # fmt: skip
    return RawLayout.build(main, {})


class Partition:
    """One state partition's micro-batches, planned as the driver plans them."""

    def __init__(self, tmp_path, function, *, keep=False, timestamp=None):
        # keep: the live operator stays between micro-batches (the glue keeps MemoryBackend
        # operators; one over a modelled slow store behaves alike)
        spec = LatencyBackend(MemoryBackend(), LATENCY).spec()
        job = PartitionJob(
            cloudpickle.dumps(function), spec, AecConfig(), ["k"], timestamp, 0.0, 1000,
            _layout(), partitions=1,
        )  # fmt: skip
        self.state = StateStore(str(tmp_path / "state"), 128)
        self.task = StreamTask(job, self.state, uuid.uuid4().hex, keep=keep)
        self.outputs: dict[int, list[tuple]] = {}  # batch id -> rows (a replay replaces)
        self.metrics: dict[int, dict] = {}
        self.pending = False

    def run(self, batch_id, rows, *, sources=None):
        """Micro-batch ``batch_id`` from the newest checkpoint (or ``sources``)."""
        if sources is None:
            latest = self.state.partition(0, 1).latest()
            sources = [] if latest is None else [latest]
        pending = frozenset({0}) if self.pending else frozenset()
        run = self.task.for_batch(batch_id, 1, 0, {0: sources}, {}, pending)
        out = list(run(iter([_routed(rows)] if rows else [])))
        main, metrics = [], None
        for batch in out:
            for row in batch.to_pylist():
                if row[_STREAM] == "main":
                    main.append((row["k"], row["seq"], row["n"]))
                elif row[_STREAM] == "metrics":
                    metrics = json.loads(row[_METRICS])
        self.outputs[batch_id] = main
        self.metrics[batch_id] = metrics
        self.pending = metrics is not None and carries_work(metrics)
        return metrics

    def every_output(self):
        return sorted(row for rows in self.outputs.values() for row in rows)


def _routed(rows):
    schema = pa.schema([("k", pa.string()), ("seq", pa.int64()), ("t", pa.float64())])
    batch = pa.Table.from_pylist(rows, schema=schema).to_batches()[0]
    column = pa.array([0] * len(rows), pa.int32())
    return batch.append_column(PARTITION, column).append_column(ROUTE, column)


def _steps(batches=3, hot=30, cold=10):
    """Micro-batches of rows: a hot key ``h`` with ``hot`` records and ``cold`` keys with
    one record each, shuffled; ``seq`` numbers every row, ``t`` its event time."""
    steps, seq = [], 0
    for b in range(batches):
        keys = ["h"] * hot + [f"c{b}-{j}" for j in range(cold)]
        random.Random(b).shuffle(keys)
        steps.append([{"k": k, "seq": seq + i, "t": float(seq + i)} for i, k in enumerate(keys)])
        seq += len(keys)
    return steps


def _expected(steps, function, with_watermarks=False):
    """What one uninterrupted operator emits for the same rows (the micro-batches'
    end-of-batch watermarks included when ``with_watermarks``)."""
    source = []
    for rows in steps:
        source += [Record(r["k"], r, r["t"]) for r in rows]
        if with_watermarks:
            source.append(Watermark(max(r["t"] for r in rows)))
    result = run_keyed(source, function, config=AecConfig())
    return sorted(
        (o["k"], o["seq"], o["n"]) for o in result.outputs if not isinstance(o, Watermark)
    )


class _Task:
    """TaskContext.get() for a task without rows (it names its partition)."""

    @staticmethod
    def get():
        return _Task()

    def partitionId(self):
        return 0


def _finish(partition, batch_id):
    """Run empty micro-batches while the partition has pending work (as the driver
    does: a pending partition runs without rows and drains)."""
    while partition.pending:
        partition.run(batch_id, [])
        batch_id += 1
    return batch_id


@pytest.mark.parametrize("keep", [False, True], ids=["restored", "kept-operator"])
def test_records_in_flight_are_carried_and_every_output_appears_once(tmp_path, monkeypatch, keep):
    monkeypatch.setattr(stream_task, "TaskContext", _Task)
    monkeypatch.setattr(stream_task, "_KEPT", {})
    partition = Partition(tmp_path, Counting(), keep=keep)
    steps = _steps()
    carried = []
    for batch_id, rows in enumerate(steps):
        metrics = partition.run(batch_id, rows)
        carried.append(metrics["checkpoint_pending_records"])
        assert metrics["rows_in"] == len(rows)
        assert metrics["kept_operator"] is (keep and batch_id > 0)
    assert max(carried) > 0, "the hot key's records never outlasted a micro-batch"
    # a micro-batch ended before its hot key's records finished: their outputs come later
    assert sum(len(partition.outputs[b]) for b in range(len(steps))) < sum(map(len, steps))
    _finish(partition, len(steps))
    assert partition.every_output() == _expected(steps, Counting())
    # exactly-once state: the newest checkpoint holds each key's count
    state = read_state(_TableSession(), partition.state.partition(0, 1).latest())
    counts = {r["key"]: int(r["value"]) for r in state.to_pylist() if r["state"] == "count"}
    hot = sum(1 for rows in steps for r in rows if r["k"] == "h")
    assert counts["h"] == hot and all(n == 1 for k, n in counts.items() if k != "h")


def test_a_replayed_micro_batch_with_carried_records_gives_each_output_once(tmp_path, monkeypatch):
    """Micro-batch 1 runs, its sink fails (Spark did not commit it), it runs again from
    chk-0 with the records chk-0 carried: its outputs replace the failed attempt's, and
    the union of every micro-batch's outputs is each output once."""
    monkeypatch.setattr(stream_task, "TaskContext", _Task)
    partition = Partition(tmp_path, Counting())
    steps = _steps(batches=3)
    first = partition.run(0, steps[0])
    assert first["checkpoint_pending_records"] > 0
    chk0 = partition.state.partition(0, 1).latest()
    pending_after_0 = partition.pending
    partition.run(1, steps[1])
    partition.pending = pending_after_0  # the driver plans the replay from batch 0's record
    replay = partition.run(1, steps[1], sources=[chk0])  # clear_attempt drops the first chk-1
    assert replay["restored_from"] == 0
    partition.run(2, steps[2])
    _finish(partition, 3)
    assert partition.every_output() == _expected(steps, Counting())


def test_the_end_of_micro_batch_watermark_is_held_back_one_micro_batch(tmp_path, monkeypatch):
    """Timers fire at the watermark of the micro-batch's end, one micro-batch later; the
    outputs per key are those of one operator given the same records and watermarks."""
    monkeypatch.setattr(stream_task, "TaskContext", _Task)
    function = Counting(fire_after=0.0)
    partition = Partition(tmp_path, function, timestamp="t")
    steps = _steps(batches=3, hot=10, cold=6)
    for batch_id, rows in enumerate(steps):
        metrics = partition.run(batch_id, rows)
        assert metrics["held_watermark"] is True
        # the timers of this micro-batch's watermark have not fired yet
        fired = [row for row in partition.outputs[batch_id] if row[1] == -1]
        if batch_id == 0:
            assert fired == []
    last = _finish(partition, len(steps))
    assert last > len(steps)  # the held watermark needed a micro-batch without rows
    assert partition.every_output() == _expected(steps, Counting(0.0), with_watermarks=True)


def test_a_function_that_does_not_declare_drains_and_applies_its_watermark(tmp_path, monkeypatch):
    from aec import KeyedProcessFunction

    class Plain(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        async def process_element(self, value, ctx):
            n = await self.count.async_value() + 1
            await self.count.async_update(n)
            ctx.output({"k": ctx.current_key, "seq": value["seq"], "n": n})

    monkeypatch.setattr(stream_task, "TaskContext", _Task)
    partition = Partition(tmp_path, Plain(), timestamp="t")
    steps = _steps(batches=2, hot=10, cold=4)
    for batch_id, rows in enumerate(steps):
        metrics = partition.run(batch_id, rows)
        assert metrics["checkpoint_pending_records"] == 0
        assert metrics["held_watermark"] is False and not partition.pending
        assert len(partition.outputs[batch_id]) == len(rows)


class _TableSession:
    """``read_state``'s session without Spark: the Arrow table it would hand to Spark."""

    def createDataFrame(self, table, schema):  # noqa: N802  (Spark's name)
        return table
