"""Run aec inside Spark partitions: ``process_keyed``, async calls and the ``aec`` CLI.

``process_keyed(df, function, key, output_schema, ...)`` runs a
``KeyedProcessFunction`` per key over a DataFrame (one operator per Spark
partition); ``side_output(result, tag)`` and ``partition_metrics(result)`` read
the other streams of its result. See ``spark_glue.keyed`` for the design.
``process_keyed_stream(stream_df, function, key, output_schema,
checkpoint_location=..., sink=...)`` does the same per micro-batch of a
Structured Streaming query, with exactly-once state (``spark_glue.stream``).
``write_keyed(df, operators, key, ...)`` runs several operators keyed alike over one
shuffle and sort and writes their outputs as Parquet from the partitions
(``spark_glue.keyed_parquet``; what the ``aec flights`` job uses).
``process_keyed_co(left, right, function, key, output_schema, ...)`` and
``process_keyed_co_stream`` run a two-input ``KeyedCoProcessFunction`` (an interval
join, say) over two DataFrames or two streams (``spark_glue.keyed_co``,
``spark_glue.stream_co``).
``async_udf`` turns an ``async def`` into a pandas UDF and ``async_map`` maps rows
through async calls, both with bounded calls in flight per task
(``spark_glue.async_calls``).

Needs the ``spark`` extra (``pip install 'aec[spark]'``: pyspark, pyarrow,
pandas). The names above load on first use, so ``import spark_glue`` (and the
``aec`` console script's ``--version``) work without it; using one without
PySpark raises ``aec.errors.MissingExtraError`` (an ``ImportError``) naming the extra.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from aec.errors import needs_extra

# Spark starts Python workers with ``$PYSPARK_PYTHON`` (default: ``python3`` on
# PATH). They must run this interpreter: it has aec installed and unpickles the
# functions this one pickled. Only a default: an explicit setting wins, and it
# must happen before the SparkContext starts (importing spark_glue first does).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

if TYPE_CHECKING:
    from spark_glue.async_calls import async_map, async_udf
    from spark_glue.keyed import partition_metrics, process_keyed, side_output, unpersist
    from spark_glue.keyed_co import process_keyed_co
    from spark_glue.keyed_parquet import KeyedOperator, write_keyed
    from spark_glue.stream import process_keyed_stream
    from spark_glue.stream_co import process_keyed_co_stream

SPARK_MODULES = ("pyspark", "pyarrow", "pandas", "cloudpickle")  # the 'spark' extra

_EXPORTS = {
    "async_map": "spark_glue.async_calls",
    "async_udf": "spark_glue.async_calls",
    "partition_metrics": "spark_glue.keyed",
    "process_keyed": "spark_glue.keyed",
    "side_output": "spark_glue.keyed",
    "unpersist": "spark_glue.keyed",
    "KeyedOperator": "spark_glue.keyed_parquet",
    "write_keyed": "spark_glue.keyed_parquet",
    "process_keyed_stream": "spark_glue.stream",
    "process_keyed_co": "spark_glue.keyed_co",
    "process_keyed_co_stream": "spark_glue.stream_co",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'spark_glue' has no attribute {name!r}")
    with needs_extra("spark", f"spark_glue.{name}", *SPARK_MODULES):
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this hook
    return value


__all__ = [
    "KeyedOperator",
    "async_map",
    "async_udf",
    "partition_metrics",
    "process_keyed",
    "process_keyed_co",
    "process_keyed_co_stream",
    "process_keyed_stream",
    "side_output",
    "unpersist",
    "write_keyed",
]
