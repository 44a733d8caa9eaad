"""The glue over Spark Connect, as a user reaches a remote Spark: a Connect server in its
own process (``tests/spark_servers.py``), a thin client session in this one.

The server's Python workers run an interpreter that has pyarrow, pandas and the
other third-party packages but not aec (``bare_python``: a cluster where aec was
never installed). So the first test sees the refusal a user gets, and the others run
with ``spark.aec.shipPackage=true``: the glue ships aec's packages to the server as
a Python artifact. Functions defined here travel by value (registered with both
cloudpickles), as functions of a user's ``__main__`` or notebook do.

One server and one client session for the module: each test pays no JVM start.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import defaultdict

import cloudpickle
import pyspark.cloudpickle
import pytest
from driver_helpers import driver_env, flights_differences
from spark_servers import ConnectServer, bare_python

from aec import KeyedProcessFunction, ValueStateDescriptor
from aec.async_io import AsyncFunction

pytestmark = [pytest.mark.spark, pytest.mark.connect]

_module = sys.modules[__name__]
cloudpickle.register_pickle_by_value(_module)  # the user's function (plan_job pickles it)
pyspark.cloudpickle.register_pickle_by_value(_module)  # sinks and UDF bodies (PySpark's)

IN_DDL = "k string, seq long, x long"
OUT_DDL = "k string, seq long, count long, total long"


class RunningCount(KeyedProcessFunction):
    """Per key: count and sum of ``x`` so far; rows with ``x == 0`` also go to the side
    output ``zero``."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    async def process_element(self, value, ctx):
        count = await self.count.async_value() + 1
        total = await self.total.async_value() + value["x"]
        await self.count.async_update(count)
        await self.total.async_update(total)
        ctx.output({"k": ctx.current_key, "seq": value["seq"], "count": count, "total": total})
        if value["x"] == 0:
            ctx.side_output("zero", {"seq": value["seq"]})


def rows(start: int, n: int, keys: int = 7) -> list[dict]:
    return [
        {"k": f"k{(s * 7919) % keys}", "seq": s, "x": (s * 31) % 11} for s in range(start, start + n)
    ]


def running_counts(data: list[dict]) -> list[tuple]:
    count, total, out = defaultdict(int), defaultdict(int), []
    for r in sorted(data, key=lambda r: r["seq"]):
        count[r["k"]] += 1
        total[r["k"]] += r["x"]
        out.append((r["k"], r["seq"], count[r["k"]], total[r["k"]]))
    return sorted(out)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("connect")
    server = ConnectServer(bare_python(str(work / "python")), str(work)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def connect(connect_server, spark):
    """A Connect client session shipping aec to the server's workers. Creating it turns
    this process's PySpark into Connect mode (``SPARK_CONNECT_MODE_ENABLED``), which is
    put back afterwards so the classic tests of the run are not affected (the classic
    session fixture is made first, while PySpark is still classic)."""
    from pyspark.sql import SparkSession

    had_mode = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    session = SparkSession.builder.remote(connect_server.url).create()
    session.conf.set("spark.aec.shipPackage", "true")
    yield session
    session.stop()
    if not had_mode:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def test_a_server_without_aec_is_refused_before_any_job(connect_server, connect):
    from pyspark.sql import SparkSession

    from spark_glue import WorkerEnvironmentError, process_keyed

    bare = SparkSession.builder.remote(connect_server.url).create()  # no shipPackage
    try:
        frame = bare.createDataFrame(rows(0, 10), IN_DDL)
        with pytest.raises(WorkerEnvironmentError) as failure:
            process_keyed(frame, RunningCount(), "k", OUT_DDL)
    finally:
        bare.stop()
    message = str(failure.value)
    assert message.startswith("process_keyed: the Spark Connect session's Python workers")
    assert connect_server.python in message
    assert "module 'aec' is missing (ModuleNotFoundError: No module named 'aec')" in message
    assert "PYSPARK_PYTHON=<python>" in message and "spark.aec.shipPackage" in message


def test_process_keyed_with_side_outputs_and_metrics(connect):
    from spark_glue import partition_metrics, process_keyed, side_output

    data = rows(0, 600)
    frame = connect.createDataFrame(data, IN_DDL)
    result = process_keyed(
        frame, RunningCount(), "k", OUT_DDL, order_by="seq", num_partitions=3,
        side_outputs={"zero": "seq long"},
    )  # fmt: skip
    got = sorted(tuple(r) for r in result.collect())
    assert got == running_counts(data)
    zeros = sorted(r["seq"] for r in side_output(result, "zero").collect())
    assert zeros == [r["seq"] for r in data if r["x"] == 0]
    metrics = partition_metrics(result).collect()
    assert sum(m["records_in"] for m in metrics) == len(data)


def _parquet_sink(directory: str):
    def sink(batch_df, batch_id):
        batch_df.write.mode("overwrite").parquet(os.path.join(directory, f"batch-{batch_id}"))

    return sink


def _write_file(directory, index: int, data: list[dict]) -> None:
    staging = directory.parent / f".file-{index}.json"
    staging.write_text("".join(json.dumps(r) + "\n" for r in data))
    os.replace(staging, directory / f"file-{index}.json")
    os.utime(directory / f"file-{index}.json", (1_000_000 + index, 1_000_000 + index))


def test_stream_restarts_exactly_and_refuses_lost_state(connect, tmp_path):
    import pandas as pd
    from pyspark.errors import StreamingQueryException

    from spark_glue import process_keyed_stream

    source, out = tmp_path / "input", tmp_path / "out"
    source.mkdir()
    location = str(tmp_path / "ckpt")

    def run() -> None:
        query = process_keyed_stream(
            connect.readStream.option("maxFilesPerTrigger", 1).schema(IN_DDL).json(str(source)),
            RunningCount(), "k", OUT_DDL, checkpoint_location=location,
            sink=_parquet_sink(str(out)), order_by="seq", num_partitions=2,
            side_outputs={"zero": "seq long"}, trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()

    data = rows(0, 400)
    for index in range(2):
        _write_file(source, index, data[index * 100 : (index + 1) * 100])
    run()
    for index in range(2, 4):  # the restart continues every count
        _write_file(source, index, data[index * 100 : (index + 1) * 100])
    run()
    batches = sorted(os.listdir(out))
    assert batches == [f"batch-{b}" for b in range(4)]
    got = pd.concat(pd.read_parquet(out / b) for b in batches)
    assert sorted(got.itertuples(index=False, name=None)) == running_counts(data)

    # the state location loses its contents while Spark's checkpoint survives: the next
    # micro-batch (run by the server's foreachBatch process) refuses, naming both
    state = os.path.join(location, "state")
    for name in os.listdir(state):
        path = os.path.join(state, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    _write_file(source, 4, rows(400, 50))
    with pytest.raises(StreamingQueryException) as failure:
        run()
    message = str(failure.value)
    assert f"the state at {state} has lost its history" in message
    assert "committed micro-batches up to 3" in message
    assert "no layout.json" in message and "new checkpoint_location" in message


class SeededCount(RunningCount):
    async def process_initial_state(self, row, ctx):
        await self.count.async_update(row["count"])


def _json_lines(path: str):
    """A metrics listener (it runs in the server's foreachBatch process) appending each
    micro-batch's merged metrics to ``path``."""

    def listen(batch_id, metrics):
        with open(path, "a") as out:
            out.write(json.dumps({"batch": batch_id, **metrics}, default=str) + "\n")

    return listen


def test_stream_metrics_initial_state_and_read_state(connect, tmp_path):
    import pandas as pd

    from spark_glue import process_keyed_stream, read_state

    source, out = tmp_path / "input", tmp_path / "out"
    source.mkdir()
    location, log = str(tmp_path / "ckpt"), str(tmp_path / "metrics.jsonl")
    initial = connect.createDataFrame([("k0", 1000), ("k3", 3000)], "k string, count long")
    data = rows(0, 120)
    for index in range(2):
        _write_file(source, index, data[index * 60 : (index + 1) * 60])
    query = process_keyed_stream(
        connect.readStream.option("maxFilesPerTrigger", 1).schema(IN_DDL).json(str(source)),
        SeededCount(), "k", OUT_DDL, checkpoint_location=location,
        sink=_parquet_sink(str(out)), order_by="seq", num_partitions=2,
        side_outputs={"zero": "seq long"}, trigger={"availableNow": True},
        metrics_listener=_json_lines(log), initial_state=initial,
    )  # fmt: skip
    query.awaitTermination()
    with open(log) as lines:
        metrics = [json.loads(line) for line in lines]
    assert [m["batch"] for m in metrics] == [0, 1]
    assert [m["rows_in"] for m in metrics] == [60, 60]
    assert metrics[0]["initial_rows"] == 2 and metrics[1]["initial_rows"] == 0
    got = pd.concat(pd.read_parquet(out / b) for b in sorted(os.listdir(out)))
    offset = {"k0": 1000, "k3": 3000}
    expected = sorted((k, s, c + offset.get(k, 0), t) for k, s, c, t in running_counts(data))
    assert sorted(got.itertuples(index=False, name=None)) == expected
    state = read_state(connect, location)
    assert type(state).__module__.startswith("pyspark.sql.connect")
    counts = {r.key: int(r.value) for r in state.collect() if r.state == "count"}
    assert counts == {k: max(c for kk, _, c, _ in expected if kk == k) for k in counts}
    assert counts["k0"] > 1000


class _Square(AsyncFunction):
    async def async_invoke(self, value):
        return [{"seq": value["seq"], "square": value["x"] * value["x"]}]


def test_async_udf_and_async_map(connect):
    from pyspark.sql import functions as F

    from spark_glue import async_map, async_udf

    @async_udf("long", capacity=4, timeout=30.0)
    async def double(x):
        return None if x is None else 2 * x

    data = rows(0, 120)
    frame = connect.createDataFrame(data, IN_DDL)
    doubled = frame.select("seq", double(F.col("x")).alias("y")).collect()
    assert sorted((r["seq"], r["y"]) for r in doubled) == [(r["seq"], 2 * r["x"]) for r in data]
    squares = async_map(frame, _Square(), "seq long, square long", capacity=8).collect()
    assert sorted((r["seq"], r["square"]) for r in squares) == [
        (r["seq"], r["x"] ** 2) for r in data
    ]


def test_aec_flights_remote_writes_what_the_classic_run_writes(
    spark, connect_server, connect, tmp_path, monkeypatch
):
    from driver_helpers import aec_command

    from spark_glue.flights.job import FlightsOptions, run

    remote_out, local_out = tmp_path / "remote", tmp_path / "local"
    common = ["--limit", "1000", "--backend", "memory", "--partitions", "2"]
    env = driver_env(SPARK_REMOTE=connect_server.url)  # SPARK_REMOTE names the server
    done = aec_command("flights", "--out", str(remote_out), "--ship-package", *common, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # the classic reference on the test session (PySpark back in classic mode for it)
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    run(spark, FlightsOptions(out=str(local_out), backend="memory", partitions=2, limit=1000))
    assert flights_differences(remote_out, local_out) == []
