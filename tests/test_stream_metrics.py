"""spark_glue.metrics: the partitions' metrics rows, their sampled gauges and the driver's
merge per micro-batch (no Spark: a partition's run and the merge are plain Python)."""

from __future__ import annotations

import json
import sys
import uuid

import cloudpickle
import pyarrow as pa
import pytest

from aec import AecConfig, KeyedProcessFunction, KeyedProcessOperator, Record, ValueStateDescriptor
from aec.testing import ScriptedExecutor
from backends import LatencyBackend, MemoryBackend
from spark_glue.metrics import (
    SAMPLE_FIELDS,
    GaugeSamples,
    json_safe_hot_keys,
    log_line,
    merge,
    per_batch,
)
from spark_glue.partition import PartitionJob
from spark_glue.raw_frame import _METRICS, _STREAM, RawLayout
from spark_glue.routing import PARTITION, ROUTE
from spark_glue.stream_state import StateStore
from spark_glue.stream_task import StreamTask

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        n = await self.count.async_value() + 1
        await self.count.async_update(n)
        ctx.output({"k": ctx.current_key, "n": n})


def _partition(index, *, records, hot, in_flight, samples, latency_count=4):
    summary = {"count": latency_count, "p50": 0.001, "p95": 0.002, "p99": 0.003, "max": 0.004}
    return {
        "partition": index, "records_in": records, "rows_in": records, "records_out": records,
        "batches": 10, "requests": 30, "blocked_requests": 5, "num_in_flight_records": in_flight,
        "num_blocking_keys": 1, "checkpoint_pending_records": in_flight, "max_in_flight": 50,
        "checkpoint_pause_s": 0.01 * (index + 1), "wall_s": 1.0 + index,
        "batch_size": {"count": 10, "p50": 3.0, "p95": 5.0, "p99": 6.0, "max": 7.0},
        "state_request_latency_s": summary, "record_latency_s": summary,
        "hot_keys": hot, "gauge_samples": samples, "kept_operator": index == 0,
    }  # fmt: skip


def test_merge_sums_counters_merges_histograms_and_keeps_the_ten_hottest_keys():
    one = _partition(0, records=100, hot=[["a", 40], ["b", 3]], in_flight=2,
                     samples=[[0.1, 10, 30, 2, 4], [0.2, 20, 45, 3, 9]])  # fmt: skip
    keys = [[f"k{i}", 20 - i] for i in range(12)]
    two = _partition(1, records=50, hot=keys, in_flight=0, samples=[[0.1, 10, 12, 5, 7]])
    merged = merge(7, [one, two])
    assert merged["batch_id"] == 7 and merged["partitions"] == 2
    assert merged["records_in"] == 150 and merged["rows_in"] == 150
    assert merged["num_in_flight_records"] == 2 and merged["checkpoint_pending_records"] == 2
    assert merged["max_in_flight"] == 50 and merged["wall_s"] == 2.0
    assert merged["checkpoint_pause_s"] == 0.02
    assert merged["mean_batch_size"] == 60 / 20
    assert merged["batch_size"]["count"] == 20 and merged["batch_size"]["max"] == 7.0
    assert merged["hot_keys"][0] == ("a", 40)
    assert merged["hot_keys"][1:4] == [("k0", 20), ("k1", 19), ("k2", 18)]
    assert len(merged["hot_keys"]) == 10
    assert merged["peak_in_flight_records"] == 45 + 12  # each partition's own peak
    assert merged["peak_blocking_keys"] == 3 + 5
    assert merged["kept_operators"] == 1
    line = log_line(merged)
    assert line.startswith("micro-batch 7: 2 partition(s), 150 rows in, 150 records out")
    assert "hottest key 'a' (40 blocked)" in line and "carried 2 record(s)" in line


def test_merge_of_nothing_and_of_partitions_without_samples():
    empty = merge(0, [])
    assert empty["records_in"] == 0 and empty["hot_keys"] == [] and empty["peak_in_flight_records"] == 0
    assert empty["batch_size"]["count"] == 0
    lone = _partition(0, records=5, hot=[], in_flight=3, samples=[])
    assert merge(1, [lone])["peak_in_flight_records"] == 3  # the gauge at the end


def test_gauge_samples_are_bounded_and_spread_over_the_run():
    class Gauges:
        def __init__(self):
            self.calls = 0

        @property
        def in_flight_gauges(self):
            self.calls += 1
            return self.calls, 0, 0

    operator = Gauges()
    samples = GaugeSamples(stride=10, limit=8)
    fed = 0
    while fed < 1000:
        step = samples.until_next()
        assert 1 <= step <= samples.stride
        fed += step
        samples.take(operator, step, fed)
    assert len(samples.points) < 8 and samples.stride > 10
    records = [point[SAMPLE_FIELDS.index("records")] for point in samples.points]
    assert records == sorted(records) and records[-1] >= 500  # the later half is there
    assert operator.calls < 1000 / 10  # never per record


def test_hot_keys_travel_as_json_values():
    pairs = [("route", 3), (7, 2), (("a", 1), 1), (None, 1)]
    safe = json_safe_hot_keys(pairs)
    assert safe == [["route", 3], [7, 2], ["('a', 1)", 1], [None, 1]]
    assert json.loads(json.dumps(safe)) == safe


def test_per_batch_counters_of_a_kept_operator():
    before = {"records_in": 100, "requests": 300, "batches": 100, "max_in_flight": 9}
    after = {"records_in": 130, "requests": 360, "batches": 110, "max_in_flight": 12,
             "num_in_flight_records": 4}  # fmt: skip
    got = per_batch(after, before)
    assert got["records_in"] == 30 and got["requests"] == 60 and got["batches"] == 10
    assert got["mean_batch_size"] == 6.0
    assert got["max_in_flight"] == 12 and got["num_in_flight_records"] == 4


@pytest.mark.parametrize("state_ordered", [False, True])
def test_the_operator_gauges_in_a_scripted_run_are_what_the_engine_holds(state_ordered):
    """A ScriptedExecutor holds every batch: three records of one key and one of another
    are in flight, two of them waiting for their key (in state order: their requests
    wait, in Flink's blocking buffer of requests)."""
    executor = ScriptedExecutor()
    config = AecConfig(state_ordered=state_ordered)
    operator = KeyedProcessOperator(Count(), MemoryBackend(), config, executor)
    operator.open()
    for key in ["h", "h", "h", "c"]:
        operator.process(Record(key, {}))
    metrics = operator.metrics
    assert metrics["num_in_flight_records"] == 4
    assert metrics["blocking_buffer_size"] == 2 and metrics["num_blocking_keys"] == 1
    samples = GaugeSamples(stride=1)
    samples.sample(operator, 4)
    assert samples.points[0][2:] == [4, 1, 2]
    assert metrics["hot_keys"] == [("h", 2)] and metrics["blocked_requests"] == 2
    operator.close()


def _routed(rows, partition=0):
    batch = pa.Table.from_pylist(rows, schema=pa.schema([("k", pa.string())])).to_batches()[0]
    column = pa.array([partition] * len(rows), pa.int32())
    return batch.append_column(PARTITION, column).append_column(ROUTE, column)


def test_a_kept_operators_micro_batch_reports_its_own_counters(tmp_path, monkeypatch):
    from pyspark.sql import types as T

    from spark_glue import stream_task

    monkeypatch.setattr(stream_task, "_KEPT", {})
    main = T.StructType([T.StructField("k", T.StringType()), T.StructField("n", T.LongType())])
    job = PartitionJob(
        cloudpickle.dumps(Count()), MemoryBackend().spec(), AecConfig(), ["k"], None, 0.0,
        1000, RawLayout.build(main, {}), partitions=1,
    )  # fmt: skip
    state = StateStore(str(tmp_path / "state"), 128)
    task = StreamTask(job, state, uuid.uuid4().hex, keep=True)
    got = []
    for batch_id, rows in enumerate([[{"k": "a"}] * 30, [{"k": "b"}] * 12]):
        sources = [] if batch_id == 0 else [state.partition(0, 1).latest()]
        for batch in task.for_batch(batch_id, 1, 0, {0: sources}, {})(iter([_routed(rows)])):
            for row in batch.to_pylist():
                if row[_STREAM] == "metrics":
                    got.append(json.loads(row[_METRICS]))
    assert got[1]["kept_operator"] is True
    assert [m["records_in"] for m in got] == [30, 12]
    assert [m["records_out"] for m in got] == [30, 12]
    assert got[0]["gauge_samples"] and got[0]["gauge_samples"][-1][1] == 30
    # its hot keys and histograms are of its own micro-batch, not since it opened
    assert got[0]["hot_keys"][0][0] == "a" and got[0]["blocked_requests"] > 0
    assert [key for key, _ in got[1]["hot_keys"]] == ["b"]  # "a" waited in the one before
    assert got[1]["hot_keys"][0][1] <= 11 and got[1]["blocked_requests"] <= 11
    assert 0 < got[1]["batch_size"]["count"] <= got[1]["batches"]
    assert got[1]["record_latency_s"]["count"] <= got[1]["records_in"]


def test_a_skewed_runs_hot_key_is_named_in_its_partitions_metrics():
    backend = LatencyBackend(MemoryBackend(), 0.002)
    operator = KeyedProcessOperator(Count(), backend, AecConfig())
    for i in range(200):
        operator.process(Record("hot" if i % 2 else f"c{i % 17}", {}))
    operator.finish()
    hot = json_safe_hot_keys(operator.metrics["hot_keys"])
    assert hot[0][0] == "hot" and hot[0][1] > 10
