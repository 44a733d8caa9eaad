"""The flights pipeline: runs the job's operators (``spark_glue.flights.functions``)
through Spark and aec and writes their outputs.

The table goes to Spark as one Parquet file (``data.to_spark_parquet``), then two
passes of ``spark_glue.write_keyed``: ``route_hourly`` keyed by route, then
``rotations`` and ``aircraft_sessions`` together over one shuffle by aircraft; the
partitions write the Parquet outputs. State backends (one per operator, built per
partition on the executors): ``spark_glue.flights.state``. ``compare_sync`` runs the
job twice, async then synchronous on fresh state, and checks that both wrote the same
rows.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
from pyspark.sql import DataFrame, SparkSession

from aec import (
    AecConfig,
)
from spark_glue import warm_up as first_query
from spark_glue.flights import data as flights_data
from spark_glue.flights import enrich as flights_enrich
from spark_glue.flights.functions import (
    AIRCRAFT_SESSIONS_SCHEMA,
    HOUR,
    LATE_SCHEMA,
    LATE_SESSIONS_SCHEMA,
    NO_TAILNUM_SCHEMA,
    ROTATIONS_SCHEMA,
    ROUTE_HOURLY_SCHEMA,
    AircraftSessions,
    Rotations,
    RouteHourly,
    has_tailnum,
)
from spark_glue.flights.state import (
    BACKENDS,
    DEFAULT_LATENCY,
    OBJECT_STORE_DIR,
    Backends,
    StateService,
    redact_url,
    slatedb_backend,
    state_service,
)
from spark_glue.keyed_parquet import KeyedOperator, write_keyed

SYNC_DIR = "sync"  # compare_sync: the synchronous run's outputs, in out/sync
WARM_UP_ROWS = 200  # compare_sync's untimed warm-up run
INPUT_DIR = ".input"  # the table as Parquet for the run's Spark jobs, in out; removed after
# What the Python workers import for the job (spark_glue.warm_up imports it in advance).
WORKER_MODULES = ("aec.windowing", "spark_glue.keyed_parquet", "spark_glue.flights.functions")

# What each operator's function reads from a flight (its record's dict): building the dicts
# costs per field, a timestamp most (a datetime per row). The key, the event time and the
# arrival rank reach the glue from the table as well. docs/performance.md ("The Spark
# path") has the measurements.
ROUTE_FIELDS = ["row", "origin", "dest", "dep_delay", "cancelled"]
ROTATION_FIELDS = ["row", "tailnum", "carrier", "flight", "origin", "dest", "dep_delay", "arr_delay"]
SESSION_FIELDS = ["row", "aircraft", "dep_delay", "cancelled"]
# What travels into Spark: the fields, the keys, the event time, the arrival rank.
TABLE_COLUMNS = {*ROUTE_FIELDS, *ROTATION_FIELDS, *SESSION_FIELDS, "route", "aircraft",
                 "event_time", flights_data.ARRIVAL_RANK}  # fmt: skip


# --- the pipeline ---------------------------------------------------------------------


@dataclass(frozen=True)
class FlightsOptions:
    """One run of the flights job.

    Attributes:
        out: output directory (created; Parquet datasets, summary.md, the plot).
        backend: one of ``BACKENDS``: ``"rocksdb"`` (state under
            ``out/state/<operator>``), ``"memory"``, ``"remote-latency"``
            (``LatencyBackend`` over that RocksDB, ``latency`` seconds per batch),
            ``"slatedb"`` (on ``object_store``) or ``"redis"`` (at ``redis_url``).
        partitions: Spark partitions, one operator each, >= 1.
        watermark_delay: bounded out-of-orderness in seconds.
        sync: run with ``AecConfig(async_state=False)`` (the synchronous reference).
        limit: use only the first ``limit`` rows of the table (None: all).
        latency: seconds of modelled round trip per state batch (``remote-latency``).
        object_store: SlateDB's object store URL (``file:///dir``, ``s3://bucket/prefix``);
            None: ``file://<out>/object-store``, emptied at the start of the run.
            Databases go under ``aec-flights/<async|sync>/<operator>/partition-<p>``.
        redis_url: the Redis server (``redis://host:port/db``); None: a throwaway
            ``redis-server`` on a free loopback port, stopped after the run. Keys are
            prefixed ``aec-flights.<async|sync>.<operator>`` (cleared per partition
            when it starts).
    """

    out: str
    backend: str = "rocksdb"
    partitions: int = 2
    watermark_delay: float = 2 * HOUR
    sync: bool = False
    limit: int | None = None
    latency: float = DEFAULT_LATENCY
    object_store: str | None = None
    redis_url: str | None = None
    enrich: bool = False  # --enrich: see spark_glue.flights.enrich
    service_latency: float = 0.005  # seconds per answer of the enrichment service
    service_failure_rate: float = 0.01  # share of its requests answered 503
    enrich_batch_size: int = 32  # lookups per request (batch endpoints); 0: one each


@dataclass
class StageResult:
    """One operator's run: where its outputs went and what it cost."""

    name: str
    outputs: dict[str, str]  # dataset name -> Parquet directory
    rows: dict[str, int]  # dataset name -> row count
    metrics: pd.DataFrame  # partition_metrics, one row per partition
    wall_s: float
    step: str | None = None  # the pass it shared with other operators (None: its own)


@dataclass
class FlightsRun:
    """What ``run`` (or ``compare_sync``) did; ``spark_glue.flights_report`` turns it
    into summary.md.

    ``backend_note`` says where the state lived. After ``compare_sync`` this is the
    async run: ``sync_run`` is the synchronous one (outputs in ``out/sync``) and
    ``sync_mismatches`` lists the datasets whose rows differ between the two
    (empty: identical).
    """

    options: FlightsOptions
    input_rows: int
    stages: list[StageResult] = field(default_factory=list)
    load_s: float = 0.0
    wall_s: float = 0.0
    backend_note: str = ""
    sync_run: FlightsRun | None = None
    sync_mismatches: list[str] = field(default_factory=list)
    enrichment: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> service stats
    stream: Any = None  # --stream: a spark_glue.flights.stream_job.StreamNote


def run(
    spark: SparkSession, options: FlightsOptions, step: Callable[[str], None] = lambda _: None
) -> FlightsRun:
    """Run both operators over the flights table and write their Parquet outputs.

    ``step(description)`` is called as each stage finishes (progress reporting).
    Writes ``out/route_hourly``, ``out/late``, ``out/rotations``, ``out/no_tailnum``,
    ``out/aircraft_sessions``, ``out/late_sessions`` (Parquet directories, overwritten).

    Raises:
        ValueError: bad options. Spark's error (carrying ``aec.JobFailure``'s
        message) when an operator fails. FileNotFoundError / RuntimeError: the
        local redis-server would not start.
    """
    validate(options)
    with state_service(options) as service:
        return _run(spark, options, service, step)


def compare_sync(
    spark: SparkSession, options: FlightsOptions, step: Callable[[str], None] = lambda _: None
) -> FlightsRun:
    """Run the job async (outputs in ``out``), then synchronously on fresh state of the
    same backend kind (outputs in ``out/sync``), and compare the two runs' rows.

    Returns the async run with ``sync_run`` and ``sync_mismatches`` set. A small
    untimed ``warm_up`` run goes first, so neither timed run pays for starting
    Spark's Python workers and loading the backend. ``step`` is called after the warm-up and then as in ``run``, once per stage of each
    run.

    Raises:
        ValueError: bad options, or ``options.sync`` set (this runs both modes).
        Otherwise as ``run``.
    """
    if options.sync:
        raise ValueError("compare_sync runs both modes: options.sync must be False")
    validate(options)
    with state_service(options) as service:
        warm_up(spark, options, service)
        step("warm-up")
        first = _run(spark, options, service, step)
        sync_options = replace(options, out=os.path.join(options.out, SYNC_DIR), sync=True)
        second = _run(spark, sync_options, service, step)
    first.sync_run = second
    first.sync_mismatches = differing_datasets(first, second)
    return first


def warm_up(
    spark: SparkSession, options: FlightsOptions, service: StateService, rows: int = WARM_UP_ROWS
) -> None:
    """Run the whole job, untimed, on the first ``rows`` rows into a temporary
    directory (same backend kind, async): starts Spark's Python workers, loads the
    backend's modules there and runs every Spark code path once, so that neither
    timed run of ``compare_sync`` pays for that."""
    with tempfile.TemporaryDirectory(prefix="aec-flights-warm-up-") as scratch:
        limit = rows if options.limit is None else min(rows, options.limit)
        _run(spark, replace(options, out=scratch, limit=limit), service, lambda _: None)


def validate(options: FlightsOptions) -> None:
    """Raise ValueError for options the job cannot run with."""
    if options.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {options.backend!r}")
    if options.partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {options.partitions}")
    latency = options.latency
    if isinstance(latency, bool) or not isinstance(latency, (int, float)):
        raise ValueError(f"latency must be a number of seconds, got {latency!r}")
    if not (0 <= latency < math.inf):
        raise ValueError(f"latency must be finite and >= 0 seconds, got {latency!r}")
    if options.enrich and not (
        0 <= options.service_latency < math.inf and 0 <= options.service_failure_rate < 1
    ):
        raise ValueError(
            "service_latency must be finite seconds >= 0 and service_failure_rate in [0, 1), "
            f"got {options.service_latency!r} and {options.service_failure_rate!r}"
        )
    size = options.enrich_batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"enrich_batch_size must be an int >= 0 (0: no batches), got {size!r}")
    if options.object_store is not None:
        if options.backend != "slatedb":
            raise ValueError("object_store applies to the slatedb backend only")
        slatedb_backend()(options.object_store, "aec-flights")  # checks the URL
    if options.redis_url is not None:
        if options.backend != "redis":
            raise ValueError("redis_url applies to the redis backend only")
        scheme = urlsplit(options.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"redis_url must be redis://host:port/db (or rediss://, unix://), "
                f"got {redact_url(options.redis_url)!r}"
            )


def differing_datasets(first: FlightsRun, second: FlightsRun) -> list[str]:
    """Datasets whose Parquet rows differ between two runs (as multisets: row order
    within a dataset is Spark's and does not count; values must match exactly)."""
    paths = {name: path for stage in second.stages for name, path in stage.outputs.items()}
    differing = []
    for stage in first.stages:
        for name, path in stage.outputs.items():
            if name not in paths or dataset_rows(path) != dataset_rows(paths[name]):
                differing.append(name)
    return differing


def dataset_rows(path: str) -> tuple[list[str], list[str]]:
    """``(columns, rows)`` of a Parquet dataset, its rows as sorted reprs (a multiset)."""
    frame = pd.read_parquet(path)
    rows = sorted(repr(row) for row in frame.itertuples(index=False, name=None))
    return list(frame.columns), rows  # repr: exact floats, NaN equals NaN, None stays None


def _run(
    spark: SparkSession,
    options: FlightsOptions,
    service: StateService,
    step: Callable[[str], None],
) -> FlightsRun:
    started = time.perf_counter()
    os.makedirs(options.out, exist_ok=True)
    state_dir = os.path.join(options.out, "state")
    shutil.rmtree(state_dir, ignore_errors=True)  # state is per run; stale partitions confuse
    if options.backend == "slatedb" and options.object_store is None:
        shutil.rmtree(os.path.join(options.out, OBJECT_STORE_DIR), ignore_errors=True)
    backends = Backends(options, service, state_dir)

    # Only the columns some operator reads travel (--enrich's SQL reads the others).
    wanted = [*flights_data.SCHEMA.fieldNames(), flights_data.ARRIVAL_RANK]
    if not options.enrich:
        wanted = [name for name in wanted if name in TABLE_COLUMNS]
    input_dir = os.path.join(options.out, INPUT_DIR)
    try:
        return _passes(spark, options, backends, wanted, input_dir, started, step)
    finally:
        shutil.rmtree(input_dir, ignore_errors=True)


def _passes(
    spark: SparkSession,
    options: FlightsOptions,
    backends: Backends,
    wanted: list[str],
    input_dir: str,
    started: float,
    step: Callable[[str], None],
) -> FlightsRun:
    """Load the table into Spark, then run the two passes (the operators keyed by route,
    then those keyed by aircraft)."""
    # Spark's first-query costs (planning, code generation, forking and importing the
    # Python workers) run in the background while the driver loads the table.
    imports = (*WORKER_MODULES, type(backends.build("route_hourly")).__module__)
    warming = first_query.start(
        spark, flights_data.schema_of(wanted), "route", flights_data.ARRIVAL_RANK,
        options.partitions, os.path.join(input_dir, "warm-up"), imports,
    )  # fmt: skip
    prepared = flights_data.load(options.limit)
    prepared[flights_data.ARRIVAL_RANK] = flights_data.arrival_ranks(prepared)
    source = flights_data.to_spark_parquet(spark, prepared, wanted, input_dir)
    warming.join()
    report = FlightsRun(options=options, input_rows=len(prepared), backend_note=backends.note)
    report.load_s = time.perf_counter() - started
    step("loaded the flights table")

    common: dict[str, Any] = {
        "timestamp": "event_time",
        "watermark_delay": options.watermark_delay,
        "order_by": flights_data.ARRIVAL_RANK,  # the same order as ARRIVAL_ORDER
        "num_partitions": options.partitions,
    }
    config = AecConfig(async_state=not options.sync)
    out = options.out
    hourly = KeyedOperator(
        "route_hourly", RouteHourly(), ROUTE_HOURLY_SCHEMA, os.path.join(out, "route_hourly"),
        side_outputs={"late": (LATE_SCHEMA, os.path.join(out, "late"))},
        columns=ROUTE_FIELDS, backend=backends.build("route_hourly"), config=config,
    )  # fmt: skip
    report.stages += _stages(source, [hourly], "route", common)
    step("route_hourly")
    with flights_enrich.serving(options) as enricher:
        rotations_function, rotations_schema = Rotations(), ROTATIONS_SCHEMA
        rotation_columns: list[str] | None = ROTATION_FIELDS
        if enricher is not None:
            enricher.enrich_sql(spark, source, out)
            step("enrich")
            rotations_function, rotations_schema = enricher.rotations()
            rotation_columns = None  # its function reads the enrichment's columns too
        # rotations and aircraft_sessions are keyed and ordered alike: one shuffle and
        # sort, one pass feeding each partition's rows to both operators. The sessions
        # see only rows with a tail number, in the same order: the records of a
        # separate process_keyed over the filtered table, with the same partitions.
        rotations = KeyedOperator(
            "rotations", rotations_function, rotations_schema, os.path.join(out, "rotations"),
            side_outputs={"no_tailnum": (NO_TAILNUM_SCHEMA, os.path.join(out, "no_tailnum"))},
            columns=rotation_columns, backend=backends.build("rotations"), config=config,
        )  # fmt: skip
        sessions = KeyedOperator(
            "aircraft_sessions", AircraftSessions(), AIRCRAFT_SESSIONS_SCHEMA,
            os.path.join(out, "aircraft_sessions"),
            side_outputs={"late_sessions": (LATE_SESSIONS_SCHEMA,
                                            os.path.join(out, "late_sessions"))},
            columns=SESSION_FIELDS, row_filter=has_tailnum,
            backend=backends.build("aircraft_sessions"), config=config,
        )  # fmt: skip
        report.stages += _stages(source, [rotations, sessions], "aircraft", common)
        if enricher is not None:
            enricher.rotations_done()
            report.enrichment = enricher.stats
    step("rotations")
    step("aircraft_sessions")
    report.wall_s = time.perf_counter() - started
    return report


def _stages(
    source: DataFrame, operators: list[KeyedOperator], key: str, common: dict[str, Any]
) -> list[StageResult]:
    """One ``write_keyed`` pass over ``source`` keyed by ``key``: a StageResult per
    operator, each with the pass's wall time."""
    started = time.perf_counter()
    written = write_keyed(source, operators, key, **common)
    wall_s = time.perf_counter() - started
    step = " and ".join(op.name for op in operators) if len(operators) > 1 else None
    stages = []
    for op, done in zip(operators, written, strict=True):
        outputs = _datasets(op)
        rows = {os.path.basename(path): count for path, count in done.rows.items()}
        stages.append(StageResult(op.name, outputs, rows, pd.DataFrame(done.metrics), wall_s, step))
    return stages


def _datasets(op: KeyedOperator) -> dict[str, str]:
    """Dataset name (its directory's name) -> directory, main output first."""
    return {os.path.basename(path): path for path in op.paths().values()}
