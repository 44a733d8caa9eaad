"""Driver of tests/test_cluster.py: process_keyed and process_keyed_stream on the master
that ``PYSPARK_SUBMIT_ARGS`` names (``local-cluster[2,1,1024]``: executors in their own
JVM processes). Usage: ``python cluster_driver.py WORKDIR``; writes WORKDIR/result.json.

Runs in its own process because a JVM hosts one SparkContext (the test session's
``local[2]`` one is taken). Functions defined here travel by value (``__main__``).
"""

from __future__ import annotations

import json
import os
import sys
import time

from spark_glue import process_keyed, process_keyed_stream
from spark_glue.session import command_session

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_stream import RunningCount  # noqa: E402  (travels by value: see test_stream)

ROWS, KEYS, FILES = 1200, 30, 3
OUT_DDL = "k string, seq long, count long, total long"


def executor_process(_rows):
    """(pid of the executor JVM above this Python worker, where spark_glue came from)."""
    import spark_glue

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"CoarseGrainedExecutorBackend" in handle.read():
                break
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rsplit(")", 1)[1].split()[1])  # ppid after the name
    yield pid, os.path.dirname(os.path.abspath(spark_glue.__file__))


def rows():
    return [
        {"k": f"k{(seq * 7919) % KEYS}", "seq": seq, "x": (seq * 31) % 11} for seq in range(ROWS)
    ]


def main(workdir: str) -> None:
    spark, _ = command_session(partitions=2)
    sc = spark.sparkContext
    deadline = time.monotonic() + 120
    while sc._jsc.sc().getExecutorIds().size() < 2:  # both executor JVMs registered
        if time.monotonic() > deadline:
            raise RuntimeError("the executors did not register within 120 s")
        time.sleep(0.5)
    # a barrier stage runs its 2 tasks at once: one on each 1-core executor
    probes = sc.parallelize(range(2), 2).barrier().mapPartitions(executor_process).collect()
    result = {
        "master": sc.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "driver_jvm": sc._jvm.java.lang.ProcessHandle.current().pid(),
        "executors": [pid for pid, _ in probes],
        "executor_code": sorted({where for _, where in probes}),
    }
    data = rows()
    frame = spark.createDataFrame(data, "k string, seq long, x long")
    batch = process_keyed(frame, RunningCount(), "k", OUT_DDL, order_by="seq", num_partitions=4)
    result["batch"] = [r.asDict() for r in batch.collect()]

    source = os.path.join(workdir, "input")
    os.makedirs(source)
    size = ROWS // FILES
    for index in range(FILES):
        path = os.path.join(source, f"part-{index}.json")
        with open(path, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in data[index * size : (index + 1) * size])
        os.utime(path, (1_000_000 + index, 1_000_000 + index))  # the source's order: mtime
    stream_rows: list[dict] = []
    batches: list[int] = []

    def sink(batch_df, batch_id):
        batches.append(batch_id)
        stream_rows.extend(r.asDict() for r in batch_df.collect())

    query = process_keyed_stream(
        spark.readStream.option("maxFilesPerTrigger", 1)
        .schema("k string, seq long, x long")
        .json(source),
        RunningCount(),
        "k",
        OUT_DDL,
        checkpoint_location=os.path.join(workdir, "ckpt"),
        sink=sink,
        order_by="seq",
        num_partitions=3,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    result["stream"] = stream_rows
    result["stream_batches"] = batches
    with open(os.path.join(workdir, "result.json"), "w") as handle:
        json.dump(result, handle)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
