"""A keyed function over a Structured Streaming query with ``spark_glue.process_keyed_stream``.

Needs ``pip install 'aec[spark]'`` and Java 17+. Run: ``python examples/spark_streaming.py``.

Each micro-batch runs through ``foreachBatch``: one aec operator per state
partition, whose state is kept as aec checkpoints under
``checkpoint_location/state/partition-<p>/chk-<batch id>`` (Spark's own checkpoint
is ``checkpoint_location/spark``). Restarting the query with the same location
continues from the last state; a micro-batch Spark replays after a failure starts
from the state before it (exactly-once state; the sink sees the batch again, so
make it idempotent by ``batch_id``). Here the query runs twice over a file
source, and the counts of the second run continue those of the first.

On a cluster (``SparkSession.builder.master("spark://...")`` or ``spark-submit``):
every executor needs aec installed (``pip install 'aec[spark]'`` in the executors'
Python, or a packed venv shipped with ``spark.archives``), and
``checkpoint_location`` must be a place every executor and the driver reach: a
shared mount, or an object store URI such as ``s3://bucket/prefix`` once
checkpoint storage on object stores is installed (``pip install 'aec[s3]'``; the
endpoint and credentials come from ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``). See the docs' Operations page.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from aec import Context, KeyedProcessFunction, RuntimeContext, ValueStateDescriptor
from spark_glue import process_keyed_stream


class ClickCount(KeyedProcessFunction):
    """Per user: the running number of clicks."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value: dict[str, Any], ctx: Context) -> None:
        count = await self.count.async_value() + 1
        await self.count.async_update(count)
        ctx.output({"user": ctx.current_key, "seq": value["seq"], "count": count})


def run_once(spark: SparkSession, source: pathlib.Path, checkpoints: str) -> list[tuple[Any, ...]]:
    """Process every file now in ``source``, then stop; returns the sink's rows."""
    received: list[tuple[Any, ...]] = []

    def sink(batch: DataFrame, batch_id: int) -> None:
        # called on the driver once per micro-batch; write to your store here
        received.extend((r["user"], r["seq"], r["count"]) for r in batch.collect())

    stream = spark.readStream.schema("user string, seq long").json(str(source))
    query = process_keyed_stream(
        stream,
        ClickCount(),
        key="user",
        output_schema="user string, seq long, count long",
        checkpoint_location=checkpoints,  # local here; a shared mount or s3:// on a cluster
        sink=sink,
        order_by="seq",  # the arrival order inside a micro-batch
        num_partitions=2,  # state partitions: fixed by the first run's checkpoint
        trigger={"availableNow": True},  # process what is there, then stop
    )
    query.awaitTermination()
    return sorted(received, key=lambda row: row[1])


def write_clicks(directory: pathlib.Path, name: str, clicks: list[tuple[str, int]]) -> None:
    lines = "".join(json.dumps({"user": user, "seq": seq}) + "\n" for user, seq in clicks)
    (directory / name).write_text(lines)


def main() -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("aec-example-stream")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        source, checkpoints = pathlib.Path(tmp, "clicks"), str(pathlib.Path(tmp, "checkpoints"))
        source.mkdir()
        write_clicks(source, "1.json", [("ann", 1), ("bob", 2), ("ann", 3)])
        print("first run: ", run_once(spark, source, checkpoints))
        write_clicks(source, "2.json", [("bob", 4), ("ann", 5)])
        print("second run:", run_once(spark, source, checkpoints))  # counts continue


if __name__ == "__main__":
    main()
