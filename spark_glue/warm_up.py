"""Spark's first-query costs paid in the background, while the driver does other work.

The first ``mapInArrow`` job of a session pays for things no later job pays again: the
JVM plans and code-generates the scan, shuffle, sort and Python runner for the first
time (class loading, Janino), and Spark forks its Python workers, which import the
engine, the backend and the user's functions (about 5 CPU-seconds together on the
2-core machine, against 0.2 s for the same job again). ``start`` runs a job of the
same shape in a background thread: a Parquet scan of a few synthetic rows with the real
input's schema (distinct values, so that every partition gets some: Spark's adaptive
execution drops the tasks of an empty input, Python workers and all), ``arrange``, and
a ``mapInArrow`` whose tasks import the given modules. The driver meanwhile prepares
the real input (the flights job: its pandas load), and the first real job finds warm
workers (``spark.python.worker.reuse``, Spark's default) and a warm JVM.

The warm-up changes nothing the job computes: it reads only its own rows and writes
nothing but its small input file. A failure in it is kept on the returned handle
(``error``) and otherwise ignored: the real job meets the same problem and reports it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_glue.convert import arrow_schema
from spark_glue.keyed import OrderLike, arrange

ROWS = 64  # synthetic rows: enough distinct keys for every partition of a small job


@dataclass(frozen=True)
class _Importer:
    """The warm-up's ``mapInArrow`` function: import, emit nothing."""

    modules: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for name in self.modules:
            importlib.import_module(name)
        for _ in batches:
            pass
        return iter(())


class WarmUp:
    """A running warm-up; ``join()`` waits for it (it is short)."""

    def __init__(self, job: DataFrame) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(job,), daemon=True,
                                        name="aec-warm-up")  # fmt: skip
        self._thread.start()

    def _run(self, job: DataFrame) -> None:
        try:
            job.collect()
        except BaseException as exc:  # the real job will meet it again and report it
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


def start(
    spark: SparkSession,
    schema: T.StructType,
    key: str | Sequence[str],
    order_by: OrderLike | None,
    num_partitions: int | None,
    directory: str,
    imports: Sequence[str] = (),
) -> WarmUp:
    """Run ``ROWS`` synthetic rows of ``schema`` (a Parquet file written into
    ``directory``, created; the caller removes it) through ``arrange`` and a
    ``mapInArrow`` that imports ``imports`` in each of ``num_partitions`` tasks, in a
    background thread; returns its handle."""
    target = arrow_schema(schema)
    numbers = pa.array(range(ROWS), pa.int64())  # every type below casts from them
    table = pa.table([numbers.cast(field.type) for field in target], schema=target)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "warm-up.parquet")
    pq.write_table(table, path)
    keys: list[Any] = [key] if isinstance(key, str) else list(key)
    rows = spark.read.schema(schema).parquet(path)
    job = arrange(rows, keys, order_by, num_partitions).mapInArrow(
        _Importer(tuple(imports)), "warm_up int"
    )
    return WarmUp(job)
