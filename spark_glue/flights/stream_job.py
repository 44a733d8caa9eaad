"""The flights job as a stream (``aec flights --stream``): the year as files arriving in
order, both operators through ``process_keyed_stream``.

The prepared table, in arrival order (``spark_glue.flights.data``), is cut into Parquet
files of ``file_rows`` rows whose modification times follow that order (Spark's file
source takes new files oldest first), plus one end-of-input file. Each operator runs as
its own query (``trigger availableNow``, ``maxFilesPerTrigger`` files per micro-batch,
the arrival order inside one) whose sink writes ``<dataset>/batch-<id>.parquet`` per
micro-batch, atomically: a replayed micro-batch rewrites the same file. With
``rescale_at = (b, n)`` only the files of micro-batches ``0..b-1`` are there at first;
the rest arrive after both queries stopped, and they restart on ``n`` state partitions.

End of input: a stream never ends, so the windows still open at its end would never
fire (a batch run ends with ``Watermark(inf)``). The last file holds one marker row per
key (``row`` < 0, event time ``END_TIME``): every partition holding keys sees it, its
watermark passes every window of the year, and ``UntilEndOfInput`` drops the row before
the operator's function sees it (Flink's bounded sources end with ``MAX_WATERMARK``).
Decisions: ``docs/cluster.md``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame, SparkSession

from aec import AecConfig, KeyedProcessFunction
from backends import MemoryBackend, RocksDBBackend
from spark_glue.flights import data as flights_data
from spark_glue.flights import job as batch_job
from spark_glue.flights.functions import (
    LATE_SCHEMA,
    NO_TAILNUM_SCHEMA,
    ROTATIONS_SCHEMA,
    ROUTE_HOURLY_SCHEMA,
    Rotations,
    RouteHourly,
)
from spark_glue.keyed import partition_metrics, side_output
from spark_glue.stream import process_keyed_stream

STREAM_BACKENDS = ("memory", "rocksdb")  # state that process_keyed_stream checkpoints
END_TIME = pd.Timestamp("2100-01-01")  # the end-of-input markers' event time
STREAM_DIR = "stream"  # out/stream: the arriving files and the queries' checkpoints
BATCH_DIR = "batch"  # --compare-batch: the batch run's outputs, in out/batch


@dataclass(frozen=True)
class StreamOptions:
    """How the year arrives and is processed.

    Attributes:
        file_rows: rows per arriving file (>= 1).
        files_per_trigger: files per micro-batch (Spark's ``maxFilesPerTrigger``, >= 1).
        rescale_at: ``(micro-batch, partitions)``: from that micro-batch on, run on
            that many state partitions (``process_keyed_stream`` redistributes the
            state by key group); None: never.
        compare_batch: also run the batch job (into ``out/batch``) and compare.
    """

    file_rows: int = 2000
    files_per_trigger: int = 5
    rescale_at: tuple[int, int] | None = None
    compare_batch: bool = False


@dataclass
class QueryStats:
    """One operator's query: its micro-batches and their cost."""

    name: str
    batches: int = 0
    batch_s: list[float] = field(default_factory=list)  # per micro-batch after the first
    wall_s: float = 0.0
    partitions: list[int] = field(default_factory=list)  # num_partitions per phase
    micro_batches: list[dict[str, Any]] = field(default_factory=list)  # merged metrics each


@dataclass
class StreamComparison:
    """The stream run against the batch run of the same rows."""

    batch_run: batch_job.FlightsRun
    mismatches: list[str]  # datasets whose rows differ
    late_stream: int
    late_batch: int
    late_only_stream: int  # late in the stream, in a window in the batch
    late_only_batch: int
    windows_match_with_late: bool  # per route and hour: window flights + late records equal


@dataclass
class StreamNote:
    """What the stream part of ``summary.md`` reports (``FlightsRun.stream``)."""

    options: StreamOptions
    files: int
    marker_rows: int
    queries: list[QueryStats]
    comparison: StreamComparison | None = None


class UntilEndOfInput(KeyedProcessFunction):
    """``function`` on every record but the end-of-input markers (``row`` < 0), which
    only move the watermark."""

    def __init__(self, function: KeyedProcessFunction) -> None:
        self.function = function

    def open(self, ctx: Any) -> None:
        self.function.open(ctx)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        if value["row"] < 0:
            return None
        return self.function.process_element(value, ctx)

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        return self.function.on_timer(timestamp, ctx)


@dataclass(frozen=True)
class _Operator:
    name: str
    function: Callable[[], KeyedProcessFunction]
    key: str
    schema: str
    side: str
    side_schema: str


OPERATORS = (
    _Operator("route_hourly", RouteHourly, "route", ROUTE_HOURLY_SCHEMA, "late", LATE_SCHEMA),
    _Operator(
        "rotations", Rotations, "aircraft", ROTATIONS_SCHEMA, "no_tailnum", NO_TAILNUM_SCHEMA
    ),
)


def validate_stream(options: batch_job.FlightsOptions, stream: StreamOptions) -> None:
    """Raise ValueError for options the stream job cannot run with."""
    batch_job.validate(options)
    if options.backend not in STREAM_BACKENDS:
        raise ValueError(
            f"--stream needs a backend whose state it checkpoints: {', '.join(STREAM_BACKENDS)}; "
            f"got {options.backend!r}"
        )
    for name in ("file_rows", "files_per_trigger"):
        value = getattr(stream, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if stream.rescale_at is not None:
        batch, partitions = stream.rescale_at
        if batch < 1 or partitions < 1:
            raise ValueError(
                f"rescale_at must be (micro-batch >= 1, partitions >= 1), got {stream.rescale_at}"
            )


def run(
    spark: SparkSession,
    options: batch_job.FlightsOptions,
    stream: StreamOptions,
    step: Callable[[str], None] = lambda _: None,
) -> batch_job.FlightsRun:
    """Run both operators over the year as a file stream; write the four datasets into
    ``options.out`` (directories of ``batch-<id>.parquet``) and, with
    ``stream.compare_batch``, the batch run into ``out/batch``.

    Returns the stream run, its ``stream`` attribute a ``StreamNote``.

    Raises:
        ValueError: bad options. ``StreamingQueryException``: a micro-batch failed.
    """
    validate_stream(options, stream)
    started = time.perf_counter()
    root = os.path.join(options.out, STREAM_DIR)
    state_dir = os.path.join(options.out, "state")
    for stale in (root, state_dir, *(os.path.join(options.out, d) for d in _datasets())):
        shutil.rmtree(stale, ignore_errors=True)  # state and outputs are per run
    arrivals = os.path.join(root, "arrivals")
    input_dir = os.path.join(root, "input")
    os.makedirs(input_dir)
    prepared = flights_data.load(options.limit)
    files, markers = write_files(prepared, arrivals, stream.file_rows)
    report = batch_job.FlightsRun(
        options=options,
        input_rows=len(prepared),
        backend_note=_backend_note(options, state_dir),
    )
    report.load_s = time.perf_counter() - started
    step("wrote the arriving files")
    phases = [(files, options.partitions)]
    if stream.rescale_at is not None:
        batch, partitions = stream.rescale_at
        first = min(len(files), batch * stream.files_per_trigger)
        phases = [(files[:first], options.partitions), (files[first:], partitions)]
    queries = [QueryStats(op.name) for op in OPERATORS]
    metrics: dict[str, list[pd.DataFrame]] = {op.name: [] for op in OPERATORS}
    for arriving, partitions in phases:
        for name in arriving:  # the files arrive: moved in, their order kept by mtime
            os.replace(os.path.join(arrivals, name), os.path.join(input_dir, name))
        for op, stats in zip(OPERATORS, queries, strict=True):
            _run_query(spark, options, stream, op, stats, metrics[op.name], partitions, state_dir)
    for op, stats in zip(OPERATORS, queries, strict=True):
        report.stages.append(_stage(options.out, op, stats, metrics[op.name]))
        step(op.name)
    report.wall_s = time.perf_counter() - started
    report.stream = StreamNote(stream, len(files), markers, queries)
    if stream.compare_batch:
        report.stream.comparison = compare_with_batch(spark, report)
        step("batch run")
    return report


def _datasets() -> list[str]:
    return [name for op in OPERATORS for name in (op.name, op.side)]


def write_files(prepared: pd.DataFrame, directory: str, file_rows: int) -> tuple[list[str], int]:
    """Cut ``prepared`` (arrival order) into Parquet files of ``file_rows`` rows in
    ``directory``, then the end-of-input file; modification times one second apart in
    that order. Returns the file names in order and the number of marker rows."""
    os.makedirs(directory)
    ordered = flights_data.in_arrival_order(prepared)
    schema = _arrow_schema()
    slices = [ordered.iloc[i : i + file_rows] for i in range(0, len(ordered), file_rows)]
    markers = end_of_input(ordered)
    names = []
    first_mtime = time.time() - len(slices) - 10  # in the past: nothing is "in the future"
    for index, frame in enumerate([*slices, markers]):
        name = f"part-{index:06d}.parquet"
        path = os.path.join(directory, name)
        pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), path)
        os.utime(path, (first_mtime + index, first_mtime + index))
        names.append(name)
    return names, len(markers)


def end_of_input(ordered: pd.DataFrame) -> pd.DataFrame:
    """One marker row per route and per aircraft (both keys cycled over the longer
    list): ``row`` -1, -2, ...; event and arrival time ``END_TIME``."""
    routes = list(dict.fromkeys(ordered["route"]))
    aircraft = list(dict.fromkeys(ordered["aircraft"]))
    n = max(len(routes), len(aircraft), 1)
    route = [routes[i % len(routes)] if routes else "-" for i in range(n)]
    rows = pd.DataFrame(
        {
            "row": [-(i + 1) for i in range(n)],
            "year": END_TIME.year,
            "month": END_TIME.month,
            "day": END_TIME.day,
            "sched_dep_time": 0,
            "dep_time": None,
            "dep_delay": None,
            "arr_delay": None,
            "carrier": None,
            "flight": None,
            "tailnum": None,
            "origin": [r.split("-", 1)[0] for r in route],
            "dest": [r.split("-", 1)[-1] for r in route],
            "event_time": END_TIME,
            "arrival_time": END_TIME,
            "cancelled": False,
            "route": route,
            "aircraft": [aircraft[i % len(aircraft)] if aircraft else "" for i in range(n)],
        }
    )
    return rows[flights_data.SCHEMA.fieldNames()]


def _arrow_schema() -> pa.Schema:
    kinds = {"bigint": pa.int64(), "double": pa.float64(), "string": pa.string()}
    kinds.update(timestamp_ntz=pa.timestamp("us"), boolean=pa.bool_())
    return pa.schema(
        [
            pa.field(f.name, kinds[f.dataType.simpleString()], f.nullable)
            for f in flights_data.SCHEMA.fields
        ]
    )


def _backend_note(options: batch_job.FlightsOptions, state_dir: str) -> str:
    if options.backend == "memory":
        return "in-process dicts, checkpointed per micro-batch"
    return f"RocksDB under {state_dir}, checkpointed per micro-batch"


def _backend(options: batch_job.FlightsOptions, state_dir: str, name: str) -> Any:
    if options.backend == "memory":
        return MemoryBackend()
    return RocksDBBackend(os.path.join(state_dir, name))


def _run_query(
    spark: SparkSession,
    options: batch_job.FlightsOptions,
    stream: StreamOptions,
    op: _Operator,
    stats: QueryStats,
    metrics: list[pd.DataFrame],
    partitions: int,
    state_dir: str,
) -> None:
    """Run ``op`` over everything in the input directory (``availableNow``)."""
    root = os.path.join(options.out, STREAM_DIR)
    source = (
        spark.readStream.schema(flights_data.SCHEMA)
        .option("maxFilesPerTrigger", stream.files_per_trigger)
        .parquet(os.path.join(root, "input"))
    )
    last = [time.perf_counter(), True]  # the previous sink's end, first micro-batch of this run

    def sink(batch_df: DataFrame, batch_id: int) -> None:
        _write_batch(os.path.join(options.out, op.name), batch_id, batch_df)
        _write_batch(os.path.join(options.out, op.side), batch_id, side_output(batch_df, op.side))
        metrics.append(partition_metrics(batch_df).toPandas())
        now = time.perf_counter()
        if not last[1]:  # the first micro-batch of a query also pays its start
            stats.batch_s.append(now - last[0])
        last[0], last[1] = now, False
        stats.batches += 1

    started = time.perf_counter()
    query = process_keyed_stream(
        source,
        UntilEndOfInput(op.function()),
        op.key,
        op.schema,
        checkpoint_location=os.path.join(root, "checkpoint", op.name),
        sink=sink,
        timestamp="event_time",
        watermark_delay=options.watermark_delay,
        order_by=flights_data.ARRIVAL_ORDER,
        backend=_backend(options, state_dir, op.name),
        config=AecConfig(async_state=not options.sync),
        num_partitions=partitions,
        side_outputs={op.side: op.side_schema},
        trigger={"availableNow": True},
        metrics_listener=lambda _, merged: stats.micro_batches.append(merged),
    )
    query.awaitTermination()
    stats.wall_s += time.perf_counter() - started
    stats.partitions.append(partitions)


def _write_batch(directory: str, batch_id: int, frame: DataFrame) -> None:
    """``directory/batch-<id>.parquet``, atomically (a replay rewrites the same file)."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"batch-{batch_id:06d}.parquet")
    staging = os.path.join(directory, f".batch-{batch_id:06d}.parquet.tmp")  # hidden: unread
    pq.write_table(frame.toArrow(), staging)
    os.replace(staging, final)


def _stage(
    out: str, op: _Operator, stats: QueryStats, metrics: list[pd.DataFrame]
) -> batch_job.StageResult:
    outputs = {name: os.path.join(out, name) for name in (op.name, op.side)}
    rows = {name: len(pd.read_parquet(path)) for name, path in outputs.items()}
    return batch_job.StageResult(op.name, outputs, rows, per_partition(metrics), stats.wall_s)


def per_partition(metrics: list[pd.DataFrame]) -> pd.DataFrame:
    """The micro-batches' metrics rows summed per partition (maxima for the ``max_*``
    columns), the shape ``partition_metrics`` has for a batch run."""
    frames = [m for m in metrics if len(m)]
    if not frames:
        return pd.DataFrame()
    every = pd.concat(frames, ignore_index=True)
    numeric = every.select_dtypes("number").drop(
        columns=["batch_id", "restored_from"], errors="ignore"
    )
    how = {c: ("max" if c.startswith("max_") or c == "partition" else "sum") for c in numeric}
    return numeric.groupby(every["partition"]).agg(how).reset_index(drop=True)


def compare_with_batch(spark: SparkSession, run: batch_job.FlightsRun) -> StreamComparison:
    """Run the batch job on the same rows into ``out/batch`` and compare."""
    options = replace(run.options, out=os.path.join(run.options.out, BATCH_DIR))
    batch = batch_job.run(spark, options)
    late_s = pd.read_parquet(os.path.join(run.options.out, "late"))
    late_b = pd.read_parquet(os.path.join(options.out, "late"))
    only_s = set(late_s["row"]) - set(late_b["row"])
    only_b = set(late_b["row"]) - set(late_s["row"])
    return StreamComparison(
        batch_run=batch,
        mismatches=batch_job.differing_datasets(run, batch),
        late_stream=len(late_s),
        late_batch=len(late_b),
        late_only_stream=len(only_s),
        late_only_batch=len(only_b),
        windows_match_with_late=_with_late(run.options.out).equals(_with_late(options.out)),
    )


def _with_late(out: str) -> pd.Series:
    """Per (origin, dest, window start): flights in the window plus late records of it."""
    hourly = pd.read_parquet(os.path.join(out, "route_hourly"))
    late = pd.read_parquet(os.path.join(out, "late"))
    keys = ["origin", "dest", "window_start"]
    windows = hourly.groupby(keys)["flights"].sum()
    stragglers = late.groupby(keys).size()
    return windows.add(stragglers, fill_value=0).astype("int64").sort_index()
