"""Initial state (Spark's handleInitialState): KeyedProcessOperator.process_initial runs the
function's process_initial_state as a record of its key before any input; a partition's
first micro-batch hands it the initial rows sorted first (spark_glue.initial_state).
Spark runs of initial_state= are in tests/test_stream_ops.py."""

from __future__ import annotations

import json
import sys
import uuid

import cloudpickle
import pyarrow as pa
import pytest

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    KeyedProcessOperator,
    ListStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.declare import DeclarationContext, DeclaringKeyedProcessFunction
from aec.keygroups import key_group_for, key_group_range_for
from aec.testing import ScriptedExecutor
from backends import LatencyBackend, MemoryBackend
from spark_glue.initial_state import INITIAL, split
from spark_glue.partition import PartitionJob
from spark_glue.raw_frame import _METRICS, _STREAM, RawLayout
from spark_glue.routing import PARTITION, ROUTE
from spark_glue.stream_state import StateStore
from spark_glue.stream_task import StreamTask

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Seeded(KeyedProcessFunction):
    """A running count that may start from an initial row; logs every entry it runs."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.log = ctx.get_state(ListStateDescriptor("log"))

    async def process_initial_state(self, row, ctx):
        assert ctx.timestamp is None
        await self.count.async_update(row["count"])
        await self.log.async_add(("initial", row["count"]))
        ctx.timer_service.register_event_time_timer(100.0)
        ctx.output(("initial", ctx.current_key, row["count"]))

    async def process_element(self, value, ctx):
        n = await self.count.async_value() + 1
        await self.count.async_update(n)
        await self.log.async_add(("record", value))
        ctx.output((ctx.current_key, value, n))

    async def on_timer(self, timestamp, ctx):
        ctx.output(("timer", ctx.current_key, await self.count.async_value()))


def _run(executor=None, backend=None):
    backend = backend or LatencyBackend(MemoryBackend(), 0.002)
    operator = KeyedProcessOperator(Seeded(), backend, AecConfig(), executor)
    return operator, backend


def test_initial_rows_run_first_in_their_keys_order_with_state_and_timers():
    operator, backend = _run()
    operator.process_initial("a", {"count": 10})
    operator.process_initial("b", {"count": 5})
    for value in (1, 2, 3):
        operator.process(Record("a" if value != 2 else "b", value, 1.0))
    operator.process_watermark(Watermark(200.0))
    operator.finish()
    outputs = [o for o in operator.drain_outputs() if not isinstance(o, Watermark)]
    assert outputs[:2] == [("initial", "a", 10), ("initial", "b", 5)]
    assert sorted(outputs[2:5]) == [("a", 1, 11), ("a", 3, 12), ("b", 2, 6)]
    assert sorted(outputs[5:]) == [("timer", "a", 12), ("timer", "b", 6)]
    assert backend.state_items("log")["a"] == [("initial", 10), ("record", 1), ("record", 3)]
    assert operator.metrics["records_in"] == 3  # initial rows are not input records


def test_an_initial_row_waits_for_its_keys_previous_one_and_holds_later_records():
    """With every batch held, a second initial row of a key waits in the blocking buffer,
    and so does the key's first record: same-key order holds for initial rows too."""
    executor = ScriptedExecutor()
    operator, _ = _run(executor, MemoryBackend())
    operator.process_initial("k", {"count": 1})
    operator.process_initial("k", {"count": 7})
    operator.process(Record("k", "x"))
    metrics = operator.metrics
    assert metrics["num_in_flight_records"] == 3 and metrics["blocking_buffer_size"] == 2
    operator.finish()
    outputs = [o for o in operator.drain_outputs() if not isinstance(o, Watermark)]
    assert outputs == [("initial", "k", 1), ("initial", "k", 7), ("k", "x", 8), ("timer", "k", 8)]


def test_initial_rows_are_refused_after_input_and_for_foreign_keys():
    operator, _ = _run()
    operator.process(Record("a", 1))
    with pytest.raises(RuntimeError, match="before any record or watermark"):
        operator.process_initial("a", {"count": 1})
    operator.finish()  # still usable
    mp = 8
    owned = key_group_range_for(mp, 2, 0)
    narrow = KeyedProcessOperator(Seeded(), MemoryBackend(), AecConfig(max_parallelism=mp),
                                  key_group_range=owned)  # fmt: skip
    foreign = next(f"k{i}" for i in range(100) if key_group_for(f"k{i}", mp) not in owned)
    with pytest.raises(ValueError, match="outside this operator's"):
        narrow.process_initial(foreign, {"count": 1})
    with pytest.raises(TypeError):
        narrow.process_initial(None, {"count": 1})
    narrow.close()
    fresh, _ = _run()
    fresh.process_initial("a", {"count": 1})
    with pytest.raises(RuntimeError, match="restore"):  # a restore would drop the row
        fresh.restore("/nonexistent/chk-1")
    fresh.close()


class Failing(Seeded):
    async def process_initial_state(self, row, ctx):
        raise KeyError("no count")


def test_a_failing_initial_row_fails_the_job_naming_it():
    operator = KeyedProcessOperator(Failing(), MemoryBackend(), AecConfig())
    with pytest.raises(JobFailure, match="initial state record") as raised:
        operator.process_initial("a", {"n": 1})
        operator.finish()
    assert isinstance(raised.value.__cause__, KeyError)


class DeclaredSeeded(DeclaringKeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_initial_state(self, row, ctx):
        await self.count.async_update(row["count"])

    def declare_process(self, d: DeclarationContext):
        def read(value, ctx):
            return self.count.async_value()

        def write(n, ctx):
            ctx.output((ctx.current_key, n + 1))
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("write", write))


def test_a_declaring_functions_checkpoint_drains_an_initial_row_in_flight(tmp_path):
    backend = LatencyBackend(MemoryBackend(), 0.005)
    operator = KeyedProcessOperator(DeclaredSeeded(), backend, AecConfig())
    operator.process_initial("a", {"count": 41})
    handle = operator.snapshot(1, str(tmp_path))
    assert operator.metrics["checkpoint_pending_records"] == 0  # not declared: drained
    operator.close()
    restored = KeyedProcessOperator(DeclaredSeeded(), LatencyBackend(MemoryBackend(), 0.0))
    restored.restore(handle)
    restored.process(Record("a", None))
    restored.finish()
    assert [o for o in restored.drain_outputs() if not isinstance(o, Watermark)] == [("a", 42)]


def test_split_takes_the_initial_rows_and_leaves_the_input():
    rows = pa.Table.from_pylist(
        [
            {"k": "a", "x": None, INITIAL: {"k": "a", "count": 3}},
            {"k": "b", "x": 1, INITIAL: None},
            {"k": "c", "x": 2, INITIAL: None},
        ],
        schema=pa.schema([("k", pa.string()), ("x", pa.int64()),
                          (INITIAL, pa.struct([("k", pa.string()), ("count", pa.int64())]))]),
    ).to_batches()[0]  # fmt: skip
    initial, rest = split(rows, ["k"])
    assert initial == [("a", {"k": "a", "count": 3})]
    assert rest.schema.names == ["k", "x"] and rest.column("k").to_pylist() == ["b", "c"]
    plain = rest
    assert split(plain, ["k"]) == ([], plain)


def test_a_first_micro_batch_feeds_the_initial_rows_before_its_input(tmp_path, monkeypatch):
    from pyspark.sql import types as T

    from spark_glue import stream_task

    monkeypatch.setattr(stream_task, "_KEPT", {})
    main = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.StringType()),
                         T.StructField("n", T.LongType())])  # fmt: skip

    class Rows(Seeded):
        async def process_initial_state(self, row, ctx):
            await self.count.async_update(row["count"])
            ctx.output({"k": ctx.current_key, "v": "initial", "n": row["count"]})

        async def process_element(self, value, ctx):
            n = await self.count.async_value() + 1
            await self.count.async_update(n)
            ctx.output({"k": ctx.current_key, "v": value["v"], "n": n})

    job = PartitionJob(cloudpickle.dumps(Rows()), MemoryBackend().spec(), AecConfig(), ["k"],
                       None, 0.0, 1000, RawLayout.build(main, {}), partitions=1)  # fmt: skip
    task = StreamTask(job, StateStore(str(tmp_path / "state"), 128), uuid.uuid4().hex, keep=False)
    schema = pa.schema([("k", pa.string()), ("v", pa.string()),
                        (INITIAL, pa.struct([("k", pa.string()), ("count", pa.int64())]))])  # fmt: skip
    batch = pa.Table.from_pylist([
        {"k": "a", "v": None, INITIAL: {"k": "a", "count": 100}},
        {"k": "a", "v": "first", INITIAL: None},
        {"k": "b", "v": "second", INITIAL: None},
    ], schema=schema).to_batches()[0]  # fmt: skip
    zero = pa.array([0] * 3, pa.int32())
    batch = batch.append_column(PARTITION, zero).append_column(ROUTE, zero)
    main_rows, metrics = [], None
    for out in task.for_batch(0, 1, 0, {0: []}, {})(iter([batch])):
        for row in out.to_pylist():
            if row[_STREAM] == "main":
                main_rows.append((row["k"], row["v"], row["n"]))
            elif row[_STREAM] == "metrics":
                metrics = json.loads(row[_METRICS])
    assert main_rows[0] == ("a", "initial", 100)  # keys interleave; key a's order holds
    assert sorted(main_rows) == [("a", "first", 101), ("a", "initial", 100), ("b", "second", 1)]
    assert metrics["initial_rows"] == 1 and metrics["rows_in"] == 2
