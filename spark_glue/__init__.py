"""Run aec inside Spark partitions: ``process_keyed``, async calls and the ``aec`` CLI.

``process_keyed(df, function, key, output_schema, ...)`` runs a
``KeyedProcessFunction`` per key over a DataFrame (one operator per Spark
partition); ``side_output(result, tag)`` and ``partition_metrics(result)`` read
the other streams of its result. See ``spark_glue.keyed`` for the design.
``process_keyed_stream(stream_df, function, key, output_schema,
checkpoint_location=..., sink=...)`` does the same per micro-batch of a
Structured Streaming query, with exactly-once state (``spark_glue.stream``);
``read_state(spark, checkpoint)`` reads a committed checkpoint's state as a
DataFrame (``spark_glue.state_reader``).
``write_keyed(df, operators, key, ...)`` runs several operators keyed alike over one
shuffle and sort and writes their outputs as Parquet from the partitions
(``spark_glue.keyed_parquet``; what the ``aec flights`` job uses).
``async_udf`` turns an ``async def`` into a pandas UDF and ``async_map`` maps rows
through async calls, both with bounded calls in flight per task
(``spark_glue.async_calls``). Each works on a classic and a Spark Connect session;
before its first job on a session it checks that the session's Python workers
can import aec (``ensure_workers``; ``ship_package`` sends aec's own packages to
workers that lack them; ``spark_glue.workers``, docs/cluster.md).

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

# A convenience, not a rule: a session (or a local Connect server) started after
# this import runs its Python workers with this interpreter, which has aec. The
# glue does not rely on it: before its first job on a session it probes the
# workers (``spark_glue.workers``), adopts this interpreter for a classic session
# left on PySpark's default, and otherwise fails naming the fixes.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

if TYPE_CHECKING:
    from spark_glue.async_calls import async_map, async_udf
    from spark_glue.keyed import partition_metrics, process_keyed, side_output, unpersist
    from spark_glue.keyed_parquet import KeyedOperator, write_keyed
    from spark_glue.state_reader import read_state
    from spark_glue.stream import process_keyed_stream
    from spark_glue.stream_state import StateHistoryError
    from spark_glue.workers import WorkerEnvironmentError, ensure_workers, ship_package

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
    "read_state": "spark_glue.state_reader",
    "StateHistoryError": "spark_glue.stream_state",
    "WorkerEnvironmentError": "spark_glue.workers",
    "ensure_workers": "spark_glue.workers",
    "ship_package": "spark_glue.workers",
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
    "StateHistoryError",
    "WorkerEnvironmentError",
    "async_map",
    "async_udf",
    "ensure_workers",
    "partition_metrics",
    "process_keyed",
    "process_keyed_stream",
    "read_state",
    "ship_package",
    "side_output",
    "unpersist",
    "write_keyed",
]
