"""Driver of tests/test_standalone.py: process_keyed and process_keyed_stream (with a
restart) on a Spark standalone cluster. Usage:
``python standalone_driver.py MASTER_URL WORKDIR``; writes WORKDIR/result.json.

The session is made before ``spark_glue`` is imported and without PYSPARK_PYTHON
(the test runs this with the virtualenv off the PATH), as a user's script may do:
the glue must still get Python workers that run aec (it adopts this interpreter).
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

ROWS, KEYS = 500, 13
IN_DDL = "k string, seq long, x long"
OUT_DDL = "k string, seq long, count long, total long"


def rows() -> list[dict]:
    return [{"k": f"k{(s * 7919) % KEYS}", "seq": s, "x": (s * 31) % 11} for s in range(ROWS)]


def main(master: str, workdir: str) -> None:
    spark = (
        SparkSession.builder.master(master)
        .appName("aec-tests-standalone")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.shuffle.partitions", "3")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    import spark_glue  # after the session: the workers' Python must not depend on it
    from spark_glue import ensure_workers, process_keyed, process_keyed_stream

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from test_stream import RunningCount  # travels by value (see test_stream)

    found = ensure_workers(spark, "standalone driver")
    result = {
        "default_python": spark_glue.workers.PYSPARK_DEFAULT_PYTHON,
        "worker_python": found.executable,
        "worker_aec": found.modules["aec"],
    }
    data = rows()
    frame = spark.createDataFrame(data, IN_DDL)
    batch = process_keyed(frame, RunningCount(), "k", OUT_DDL, order_by="seq", num_partitions=4)
    result["batch"] = [r.asDict() for r in batch.collect()]

    source = os.path.join(workdir, "input")
    os.makedirs(source)
    calls: list[list] = []

    def sink(batch_df, batch_id):
        calls.append([batch_id, [r.asDict() for r in batch_df.collect()]])

    def run(first: int, files: int) -> None:
        for index in range(first, first + files):
            path = os.path.join(source, f"part-{index}.json")
            with open(path, "w") as handle:
                part = data[index * 100 : (index + 1) * 100]
                handle.writelines(json.dumps(r) + "\n" for r in part)
            os.utime(path, (1_000_000 + index, 1_000_000 + index))
        query = process_keyed_stream(
            spark.readStream.option("maxFilesPerTrigger", 1).schema(IN_DDL).json(source),
            RunningCount(), "k", OUT_DDL,
            checkpoint_location=os.path.join(workdir, "ckpt"),  # a local path: checked
            sink=sink, order_by="seq", num_partitions=3, trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()

    run(0, 3)
    run(3, 2)  # a restart on the same checkpoint location continues every count
    result["stream"] = calls
    with open(os.path.join(workdir, "result.json"), "w") as handle:
        json.dump(result, handle)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
