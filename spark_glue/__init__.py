"""Run aec inside Spark partitions: ``process_keyed``, async calls and the ``aec`` CLI.

``process_keyed(df, function, key, output_schema, ...)`` runs a
``KeyedProcessFunction`` per key over a DataFrame (one operator per Spark
partition); ``side_output(result, tag)`` and ``partition_metrics(result)`` read
the other streams of its result. See ``spark_glue.keyed`` for the design.
``process_keyed_stream(stream_df, function, key, output_schema,
checkpoint_location=..., sink=...)`` does the same per micro-batch of a
Structured Streaming query, with exactly-once state (``spark_glue.stream``).
``async_udf`` turns an ``async def`` into a pandas UDF and ``async_map`` maps rows
through async calls, both with bounded calls in flight per task
(``spark_glue.async_calls``).
"""

import os
import sys

# Spark starts Python workers with ``$PYSPARK_PYTHON`` (default: ``python3`` on
# PATH). They must run this interpreter: it has aec installed and unpickles the
# functions this one pickled. Only a default: an explicit setting wins, and it
# must happen before the SparkContext starts (importing spark_glue first does).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from spark_glue.async_calls import async_map, async_udf  # noqa: E402
from spark_glue.keyed import partition_metrics, process_keyed, side_output, unpersist  # noqa: E402
from spark_glue.stream import process_keyed_stream  # noqa: E402

__all__ = [
    "async_map",
    "async_udf",
    "partition_metrics",
    "process_keyed",
    "process_keyed_stream",
    "side_output",
    "unpersist",
]
