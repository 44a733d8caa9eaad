"""spark_glue.warm_up: the first query's costs paid in the background."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_glue import warm_up

SCHEMA = T.StructType(
    [
        T.StructField("k", T.StringType(), False),
        T.StructField("t", T.TimestampNTZType(), False),
        T.StructField("x", T.DoubleType()),
        T.StructField("ok", T.BooleanType()),
        T.StructField("seq", T.LongType(), False),
    ]
)


@pytest.mark.spark
def test_the_workers_run_the_imports_and_a_failure_is_kept(spark, tmp_path):
    # the imports run in the Python workers; a marker module proves each task ran them
    marker = tmp_path / "aec_warm_marker.py"
    marker.write_text(
        "import os, pyspark\n"
        "ctx = pyspark.TaskContext.get()\n"
        f"open(os.path.join({str(tmp_path)!r}, f'task-{{ctx.partitionId()}}'), 'w').close()\n"
    )
    spark.sparkContext.addPyFile(str(marker))  # on the workers' path
    done = warm_up.start(spark, SCHEMA, "k", "seq", 3, str(tmp_path / "in"),
                         ("json", "aec_warm_marker"))  # fmt: skip
    done.join()
    assert done.error is None
    assert list(tmp_path.glob("task-*"))  # a module imports once per worker (workers are reused)
    # the synthetic rows reach every partition (an empty one would run no Python task)
    rows = spark.read.parquet(str(tmp_path / "in" / "warm-up.parquet"))
    assert rows.count() == warm_up.ROWS
    ids = rows.repartition(3, "k").select(F.spark_partition_id().alias("p")).distinct().count()
    assert ids == 3
    failed = warm_up.start(spark, SCHEMA, ["k", "seq"], None, 2, str(tmp_path / "in"),
                           ("no_such_module_anywhere",))  # fmt: skip
    failed.join()
    assert failed.error is not None and "no_such_module_anywhere" in str(failed.error)
