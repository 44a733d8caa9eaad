"""``write_keyed``: several keyed operators over one shuffle and sort, outputs to Parquet.

``process_keyed`` is one operator per shuffle, its outputs handed back to Spark as
a DataFrame. A job that only writes its outputs, with several operators keyed the
same way, pays less with ``write_keyed``:

* one ``arrange`` (repartition by the key, sort within partitions by the arrival
  order) and one ``mapInArrow`` pass for all of them: each partition feeds every
  input batch to each operator in turn (its own columns, its own row filter, its
  own backend, watermark generator and metrics), so each operator sees exactly the
  records, order and watermarks a ``process_keyed`` of its own would give it over
  ``df.filter(...).select(...)`` with the same partitions;
* each partition writes its operators' streams as Parquet itself
  (``spark_glue.parquet_out``: one file per stream and partition, committed by the
  driver after the job): no output row crosses into the JVM, nothing is cached,
  and the row counts come from the partitions' metrics instead of a Spark count.

One Spark job per call: the shuffle's map stage and the pass.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit

import cloudpickle  # type: ignore[import-untyped]  # cloudpickle ships no type hints
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from aec.config import AecConfig
from aec.state.backend import BackendSpec, StateBackend
from spark_glue import parquet_out
from spark_glue.keyed import OrderLike, SchemaLike, arrange, order_list, plan_job
from spark_glue.partition import PartitionJob, PartitionRun
from spark_glue.raw_frame import _METRICS, _STREAM

RowFilter = Callable[[pa.RecordBatch], Any]  # an Arrow batch -> a boolean mask of its rows
_METRICS_SCHEMA = T.StructType(
    [T.StructField(_STREAM, T.StringType()), T.StructField(_METRICS, T.StringType())]
)


@dataclass(frozen=True)
class KeyedOperator:
    """One operator of ``write_keyed``.

    Attributes:
        name: names the operator in the result (unique per call).
        function: the ``aec.KeyedProcessFunction`` (cloudpickled to the executors).
        output_schema: the main output's schema (``StructType`` or DDL).
        output_path: the main output's Parquet directory (overwritten).
        side_outputs: ``{tag: (schema, directory)}`` for ``ctx.side_output(tag, ...)``.
        columns: the fields of each record's value dict (None: every column of
            ``df``, as ``process_keyed`` gives them). The key, the event time and the
            order are read from ``df`` whether listed or not: name only what the
            function reads, since building the dicts costs per field (a timestamp
            field most: a ``datetime`` per row).
        row_filter: picklable ``(pyarrow.RecordBatch) -> boolean mask``: only the rows
            it keeps reach the operator (None: every row). It sees all of ``df``'s
            columns.
        backend: a ``StateBackend`` or ``BackendSpec`` (None: ``MemoryBackend``);
            one per operator and partition, like ``process_keyed``'s.
        config: ``aec.AecConfig`` (None: defaults).
    """

    name: str
    function: Any
    output_schema: SchemaLike
    output_path: str
    side_outputs: Mapping[str, tuple[SchemaLike, str]] = field(default_factory=dict)
    columns: Sequence[str] | None = None
    row_filter: RowFilter | None = None
    backend: StateBackend | BackendSpec | None = None
    config: AecConfig | None = None

    def paths(self) -> dict[str, str]:
        """Stream (``"main"`` or a side output tag) -> its directory."""
        return {"main": self.output_path, **{t: p for t, (_, p) in self.side_outputs.items()}}


@dataclass(frozen=True)
class Written:
    """What ``write_keyed`` did for one operator.

    ``rows``: directory -> rows written (the main output and each side output);
    ``metrics``: one dict per partition, as ``partition_metrics`` rows (``elapsed_s``
    is the operator's own time in the pass: its records, watermarks, ``finish`` and
    writing its files; ``pass_s`` the partition's whole pass, every operator of it).
    """

    name: str
    rows: dict[str, int]
    metrics: list[dict[str, Any]]


def write_keyed(
    df: DataFrame,
    operators: Sequence[KeyedOperator],
    key: str | Sequence[str],
    timestamp: str | None = None,
    watermark_delay: float | dt.timedelta | None = None,
    order_by: OrderLike | None = None,
    watermark_interval: int = 1000,
    num_partitions: int | None = None,
) -> list[Written]:
    """Run ``operators`` over one arrangement of ``df`` and write their outputs.

    ``key``, ``timestamp``, ``watermark_delay``, ``order_by``, ``watermark_interval``
    and ``num_partitions`` are ``process_keyed``'s, shared by every operator (each
    still counts its own records for its watermarks). Runs one Spark job; returns
    a ``Written`` per operator, in order.

    Raises:
        TypeError, ValueError: on the driver, as ``process_keyed`` (per operator), or
            for no operators, duplicate names or directories, a directory inside
            another, a URI instead of a local path. A failing partition fails
            the Spark job (its error carries the ``aec.JobFailure`` message); the
            datasets are then left empty.
    """
    directories = check_outputs(operators, [df])
    order_by = order_list(order_by)
    members = []
    for op in operators:
        unknown = [c for c in op.columns or () if c not in df.columns]
        if unknown:
            raise ValueError(f"{op.name}: columns {unknown} are not in the DataFrame {df.columns}")
        job = plan_job(
            df,
            op.function,
            key,
            op.output_schema,
            timestamp=timestamp,
            watermark_delay=watermark_delay,
            watermark_interval=watermark_interval,
            backend=op.backend,
            config=op.config,
            num_partitions=num_partitions,
            side_outputs={tag: schema for tag, (schema, _) in op.side_outputs.items()},
            name="write_keyed",
            order_by=order_by,
        )
        if op.columns is not None:
            job = replace(job, values=list(op.columns))
        row_filter = None
        if op.row_filter is not None:  # pickled here, like the function (plan_job)
            try:
                row_filter = cloudpickle.dumps(op.row_filter)
            except Exception as exc:
                raise TypeError(f"{op.name}: the row filter cannot be pickled: {exc}") from exc
        members.append(PassMember(op.name, job, row_filter, op.paths()))
    keys = [key] if isinstance(key, str) else list(key)
    return run_pass(arrange(df, keys, order_by, num_partitions), members, directories)


def run_pass(
    arranged: DataFrame, members: list[PassMember], directories: list[str]
) -> list[Written]:
    """One ``mapInArrow`` pass of ``members`` over ``arranged`` (shuffled and sorted in
    the arrival order), each partition writing its streams into ``directories``
    (emptied first, committed after); a ``Written`` per member, in order."""
    plan = arranged.mapInArrow(_PassJob(members, uuid.uuid4().hex).run, _METRICS_SCHEMA)
    parquet_out.prepare(directories)
    try:
        rows = plan.collect()
    except BaseException:
        parquet_out.abort(directories)
        raise
    records = [json.loads(row[_METRICS]) for row in rows]
    files = [path for r in records for path, _ in r["files"].values()]
    parquet_out.commit(directories, files)
    by_operator: dict[str, list[dict[str, Any]]] = {member.name: [] for member in members}
    for record in sorted(records, key=lambda r: r["partition"]):
        by_operator[record.pop("operator")].append(record)
    written = []
    for member in members:
        counts = {path: 0 for path in member.targets.values()}
        for record in by_operator[member.name]:
            for stream, (_, count) in record.pop("files").items():
                counts[member.targets[stream]] += count
        written.append(Written(member.name, counts, by_operator[member.name]))
    return written


def check_outputs(operators: Sequence[KeyedOperator], inputs: Sequence[DataFrame]) -> list[str]:
    """Every output directory of ``operators``, after checking that names and directories
    are unique, local paths, none inside another, and that no input reads from an
    output.

    Raises ValueError otherwise.
    """
    if not operators:
        raise ValueError("write_keyed needs at least one operator")
    names = [op.name for op in operators]
    if len(set(names)) != len(names):
        raise ValueError(f"operator names must be unique, got {names}")
    directories = [path for op in operators for path in op.paths().values()]
    for directory in directories:
        if urlsplit(os.fspath(directory)).scheme:
            raise ValueError(
                f"output directory {directory!r} is a URI: write_keyed writes local paths "
                "(a file system every executor shares); give the path itself"
            )
    if len({os.path.abspath(d) for d in directories}) != len(directories):
        raise ValueError(f"every output needs its own directory, got {directories}")
    roots = [os.path.abspath(d) for d in directories]
    for outer, inner in itertools.permutations(roots, 2):
        if inner.startswith(outer + os.sep):
            raise ValueError(
                f"output directory {inner!r} lies inside output directory {outer!r}: a "
                "reader of the outer dataset would read the inner one's files too"
            )
    for df in inputs:
        read = _read_from(df, directories)
        if read:  # the outputs are emptied before the job: Spark refuses the same overwrite
            raise ValueError(f"{read!r} is an output directory and an input of the DataFrame")
    return directories


def _read_from(df: DataFrame, directories: list[str]) -> str | None:
    """The first of ``directories`` that holds a file ``df`` reads, if any."""
    roots = [os.path.abspath(d) + os.sep for d in directories]
    for uri in df.inputFiles():
        parts = urlsplit(uri)
        if parts.scheme not in ("", "file"):
            continue
        path = os.path.abspath(unquote(parts.path))
        for root in roots:
            if path.startswith(root):
                return root.rstrip(os.sep)
    return None


@dataclass(frozen=True)
class PassMember:
    """One operator as the executors see it."""

    name: str
    job: PartitionJob
    row_filter: bytes | None  # a cloudpickled RowFilter
    targets: dict[str, str]

    def filter(self) -> RowFilter | None:
        return None if self.row_filter is None else cloudpickle.loads(self.row_filter)


@dataclass(frozen=True)
class _PassJob:
    """The ``mapInArrow`` function: every member over the partition's batches."""

    members: list[PassMember]
    write_id: str

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        attempt = f"attempt-{context.taskAttemptId() if context is not None else 0}"
        file_name = f"part-{partition:05d}-{self.write_id}-c000.snappy.parquet"
        records: list[dict[str, Any]] = []
        with ExitStack() as stack:  # leaving it closes every operator and backend
            runs: list[PartitionRun] = []
            writers: list[parquet_out.ParquetStreams] = []
            try:
                for member in self.members:
                    writers.append(parquet_out.ParquetStreams(
                        member.job.layout, member.targets, file_name, attempt
                    ))  # fmt: skip
                    run = PartitionRun(member.job, partition, writer=writers[-1])
                    runs.append(stack.enter_context(run))
                busy, files, pass_s = self._pass(batches, runs, writers)
            except BaseException:
                for writer in writers:
                    writer.abort()
                raise
        for member, run, own, written in zip(self.members, runs, busy, files, strict=True):
            # the operators are closed: their final metrics
            metrics = run.metrics(elapsed_s=own, pass_s=pass_s)
            metrics.update(operator=member.name, files=written)
            records.append(metrics)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(["metrics"] * len(records), pa.string()),
                pa.array([json.dumps(r, default=str) for r in records], pa.string()),
            ],
            names=[_STREAM, _METRICS],
        )

    def _pass(
        self,
        batches: Iterator[pa.RecordBatch],
        runs: list[PartitionRun],
        writers: list[parquet_out.ParquetStreams],
    ) -> tuple[list[float], list[dict[str, tuple[str, int]]], float]:
        """Feed every batch to each operator, finish them, close their files: each
        operator's own seconds, its files, and the whole pass's seconds."""
        started = time.perf_counter()
        busy = [0.0] * len(runs)
        filters = [member.filter() for member in self.members]
        # The operators open at the first input batch, as process_keyed's do: before it
        # the JVM is still reading the shuffle and sorting.
        batches = iter(batches)
        first = next(batches, None)
        for run in runs:
            run.operator.open()
        for batch in itertools.chain([first] if first is not None else [], batches):
            for index, (keep, run) in enumerate(zip(filters, runs, strict=True)):
                began = time.perf_counter()
                view = batch if keep is None else batch.filter(keep(batch))
                if view.num_rows:
                    for _ in run.feed(view):
                        pass  # ParquetStreams writes the outputs; it yields nothing
                busy[index] += time.perf_counter() - began
        files = []
        for index, (run, writer) in enumerate(zip(runs, writers, strict=True)):
            began = time.perf_counter()
            run.operator.finish()
            for _ in run.drain():
                pass
            files.append(writer.close())
            busy[index] += time.perf_counter() - began
        return busy, files, time.perf_counter() - started
