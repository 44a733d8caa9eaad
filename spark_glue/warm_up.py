"""Spark's first-query costs paid in the background, while the driver does other work.

The first ``mapInArrow`` job of a session pays for things no later job pays again: the
JVM plans and code-generates the scan, shuffle, sort and Python runner for the first
time (class loading, Janino), and Spark forks its Python workers, which import the
engine, the backend and the user's functions (about 5 CPU-seconds together on the
2-core machine, against 0.2 s for the same job again). ``start`` runs a job of the
same shape on a DataFrame with the real input's schema but no rows (a scan of an
empty file, ``arrange``, ``mapInArrow``) in a background thread, each task importing
the given modules; the driver meanwhile prepares the real input (the flights job: its
pandas load), and the first real job finds warm workers (``spark.python.worker.reuse``,
Spark's default) and a warm JVM.

The warm-up changes nothing the job computes: it reads no rows and writes nothing. A
failure in it is kept on the returned handle (``error``) and otherwise ignored: the
real job meets the same problem and reports it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame

from spark_glue.keyed import OrderLike, arrange


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
    df: DataFrame,
    key: str | Sequence[str],
    order_by: OrderLike | None,
    num_partitions: int | None,
    imports: Sequence[str] = (),
) -> WarmUp:
    """Run ``df`` (the real input's schema, no rows) through ``arrange`` and a
    ``mapInArrow`` that imports ``imports`` in each of ``num_partitions`` tasks, in a
    background thread; returns its handle."""
    keys: list[Any] = [key] if isinstance(key, str) else list(key)
    job = arrange(df, keys, order_by, num_partitions).mapInArrow(
        _Importer(tuple(imports)), "warm_up int"
    )
    return WarmUp(job)
