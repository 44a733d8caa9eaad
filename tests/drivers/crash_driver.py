"""Driver of tests/test_crash.py: a file-source ``process_keyed_stream`` query that kills
its own process group (driver, JVM, Python workers: SIGKILL) at chosen crash points.

Usage: ``python crash_driver.py WORKDIR BACKEND PARTITIONS POINTS``; ``POINTS`` is a
comma-separated list of crash points, each firing at most once per WORKDIR (a marker
file in ``WORKDIR/fired`` is created, exclusively, before the kill):

* ``record:<seq>``: in the keyed function, on the record with that ``seq``
  (mid-batch: the partitions of that micro-batch have not all snapshotted).
* ``sink-before:<batch>``: first thing in the sink (every partition snapshotted the
  batch; Spark has not committed it).
* ``sink-after:<batch>``: after the sink wrote ``batch-<id>.parquet`` (not committed).
* ``committed:<batch>``: in a query listener once Spark reports the batch's progress
  (after its commit).

The query runs with ``trigger availableNow`` over ``WORKDIR/input`` (one file per
micro-batch) and exits 0 when everything there is processed; its sink writes each
micro-batch to ``WORKDIR/out/batch-<id>.parquet`` atomically (idempotent by batch id).
Functions defined here travel to the executors by value (``__main__``).
"""

from __future__ import annotations

import os
import signal
import sys

from aec import KeyedProcessFunction, ValueStateDescriptor

IN_DDL = "k string, seq long, x long"
OUT_DDL = "k string, seq long, count long, total long"


def crash(workdir: str, point: str, armed: frozenset[str]) -> None:
    """Kill this driver's whole process group at ``point`` if armed and not yet fired."""
    if point not in armed:
        return
    try:
        fd = os.open(os.path.join(workdir, "fired", point), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.fsync(fd)
    os.close(fd)
    os.killpg(int(os.environ["AEC_CRASH_PGID"]), signal.SIGKILL)


class CrashingCount(KeyedProcessFunction):
    """Per key: running count and sum of ``x``; crashes at ``record:<seq>`` points."""

    def __init__(self, workdir: str, armed: frozenset[str]) -> None:
        self.workdir = workdir
        self.armed = armed

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.total = ctx.get_state(ValueStateDescriptor("total"))

    async def process_element(self, value, ctx):
        crash(self.workdir, f"record:{value['seq']}", self.armed)
        count = (await self.count.async_value() or 0) + 1
        total = (await self.total.async_value() or 0) + value["x"]
        await self.count.async_update(count)
        await self.total.async_update(total)
        ctx.output({"k": ctx.current_key, "seq": value["seq"], "count": count, "total": total})


def main(workdir: str, backend: str, partitions: int, points: str) -> None:
    os.environ["AEC_CRASH_PGID"] = str(os.getpgid(0))  # before the JVM starts: workers see it
    armed = frozenset(p for p in points.split(",") if p)
    os.makedirs(os.path.join(workdir, "fired"), exist_ok=True)
    out = os.path.join(workdir, "out")
    os.makedirs(out, exist_ok=True)

    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    import spark_glue  # noqa: F401  (PYSPARK_PYTHON)
    from backends import RocksDBBackend
    from spark_glue import process_keyed_stream

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    class CommitCrash(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            crash(workdir, f"committed:{event.progress.batchId}", armed)

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    spark.streams.addListener(CommitCrash())

    def sink(batch_df, batch_id):
        crash(workdir, f"sink-before:{batch_id}", armed)
        frame = batch_df.toPandas()
        frame["batch_id"] = batch_id
        final = os.path.join(out, f"batch-{batch_id}.parquet")
        frame.to_parquet(final + ".tmp", index=False)
        os.replace(final + ".tmp", final)  # a replay overwrites it with the same rows
        crash(workdir, f"sink-after:{batch_id}", armed)

    spec = None
    if backend == "rocksdb":
        spec = RocksDBBackend(os.path.join(workdir, "rocksdb")).spec()
    query = process_keyed_stream(
        spark.readStream.option("maxFilesPerTrigger", 1)
        .schema(IN_DDL)
        .json(os.path.join(workdir, "input")),
        CrashingCount(workdir, armed),
        "k",
        OUT_DDL,
        checkpoint_location=os.path.join(workdir, "ckpt"),
        sink=sink,
        order_by="seq",
        backend=spec,
        num_partitions=partitions,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
