"""Driver of tests/test_crash.py: a file-source ``process_keyed_stream`` query that kills
its own process group (driver, JVM, Python workers: SIGKILL) at chosen crash points.

Usage: ``python crash_driver.py WORKDIR BACKEND PARTITIONS POINTS``; ``BACKEND`` is
``memory``, ``rocksdb`` or ``declared`` (the count declared, ``DeclaredCount``, over a
modelled slow store: its micro-batches carry records in flight to the next one); ``POINTS`` is a
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
With ``declared``, a run whose last micro-batch carried records adds a file with one
row of key ``idle-<p>`` for each state partition ``p`` in turn and runs again, so every
partition gets a micro-batch without rows, in which it finishes what it carried.
Functions defined here travel to the executors by value (``__main__``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from aec import KeyedProcessFunction, ValueStateDescriptor
from aec.declare import DeclaringKeyedProcessFunction

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


class DeclaredCount(DeclaringKeyedProcessFunction):
    """``CrashingCount`` declared: read the count, write it, read the total, write it
    and emit; crashes at ``record:<seq>`` points in its first step."""

    def __init__(self, workdir: str, armed: frozenset[str]) -> None:
        self.workdir = workdir
        self.armed = armed

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def declare_process(self, d):
        row = d.declare_variable("row")
        count = d.declare_variable("count")

        def read_count(value, ctx):
            crash(self.workdir, f"record:{value['seq']}", self.armed)
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


def idle_key(partition: int, partitions: int) -> str:
    """A key that state partition ``partition`` of ``partitions`` owns."""
    from aec.keygroups import key_group_for, operator_index_for

    return next(
        f"idle-{i}" for i in range(10_000)
        if operator_index_for(key_group_for(f"idle-{i}", 128), 128, partitions) == partition
    )  # fmt: skip


def main(workdir: str, backend: str, partitions: int, points: str) -> None:
    os.environ["AEC_CRASH_PGID"] = str(os.getpgid(0))  # before the JVM starts: workers see it
    armed = frozenset(p for p in points.split(",") if p)
    os.makedirs(os.path.join(workdir, "fired"), exist_ok=True)
    out = os.path.join(workdir, "out")
    os.makedirs(out, exist_ok=True)

    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    import spark_glue  # noqa: F401  (PYSPARK_PYTHON)
    from backends import LatencyBackend, MemoryBackend, RocksDBBackend
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
    function: KeyedProcessFunction = CrashingCount(workdir, armed)
    if backend == "rocksdb":
        spec = RocksDBBackend(os.path.join(workdir, "rocksdb")).spec()
    elif backend == "declared":
        spec = LatencyBackend(MemoryBackend(), 0.03).spec()
        function = DeclaredCount(workdir, armed)
    input_dir = os.path.join(workdir, "input")
    for attempt in range(partitions + 2):
        query = process_keyed_stream(
            spark.readStream.option("maxFilesPerTrigger", 1).schema(IN_DDL).json(input_dir),
            function,
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
        pending = pending_partitions(os.path.join(workdir, "ckpt", "state"))
        if not pending:
            break
        # a row for a partition without pending work: the pending ones run without rows
        free = [p for p in range(partitions) if p not in pending] or [0]
        name = os.path.join(input_dir, f"idle-{time.time_ns()}.json")  # newest: read last
        with open(name + ".tmp", "w") as out:
            out.write(json.dumps({"k": idle_key(free[0], partitions), "seq": -1 - attempt, "x": 0}))
        os.replace(name + ".tmp", name)
    spark.stop()


def pending_partitions(state: str) -> tuple[int, ...]:
    """The partitions whose newest checkpoint holds carried work (``layout.json``)."""
    from aec.checkpoint import CheckpointStore
    from spark_glue.stream_state import Layout

    layout = Layout.load(CheckpointStore.at(state))
    return () if layout is None or layout.last is None else layout.last.pending_after


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
