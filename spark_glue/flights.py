"""The flights job's two keyed operators and the pipeline that runs them.

* ``RouteHourly`` (key ``route``, callback-chain style): tumbling one-hour
  event-time windows per route, kept in MapState ``window start -> accumulator``
  and fired by an event-time timer at the window's end. A record whose window
  has already fired (window end <= the watermark it sees) goes to the ``late``
  side output instead.
* ``Rotations`` (key ``aircraft``, ``async def`` style): ValueState holds the
  aircraft's previous flight in arrival order; one output row per flight.
  Rows without a tail number go to the ``no_tailnum`` side output.

Times are float seconds with naive local timestamps read as UTC (see
``spark_glue.flights_data``); the output schemas turn them back into naive
``timestamp_ntz`` values.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from aec import (
    AecConfig,
    KeyedProcessFunction,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from backends import MemoryBackend, RocksDBBackend
from spark_glue import flights_data
from spark_glue.keyed import partition_metrics, process_keyed, side_output, unpersist

HOUR = 3600
DELAYED_MINUTES = 15  # FAA's definition of a delayed flight

ROUTE_HOURLY_SCHEMA = (
    "origin string, dest string, window_start timestamp_ntz, flights long, cancelled long, "
    "mean_dep_delay double, max_dep_delay double"
)
LATE_SCHEMA = (
    "row long, origin string, dest string, event_time timestamp_ntz, dep_delay double, "
    "cancelled boolean, window_start timestamp_ntz, watermark timestamp_ntz"
)
ROTATIONS_SCHEMA = (
    "tailnum string, event_time timestamp_ntz, origin string, dest string, prev_origin string, "
    "prev_dest string, prev_arr_delay double, dep_delay double, gap_minutes double, "
    "propagated boolean, relocated boolean"
)
NO_TAILNUM_SCHEMA = (
    "row long, carrier string, flight long, origin string, dest string, "
    "event_time timestamp_ntz, dep_delay double, arr_delay double"
)


class RouteHourly(KeyedProcessFunction):
    """Hourly departures per route; callback-chain style.

    State: MapState ``windows``: window start (int seconds) -> accumulator
    ``(flights, cancelled, delays counted, delay sum, delay max)`` over non-null
    ``dep_delay`` (minutes). Output dicts match ``ROUTE_HOURLY_SCHEMA``.
    """

    def open(self, ctx: Any) -> None:
        self.windows = ctx.get_state(MapStateDescriptor("windows"))

    def process_element(self, flight: dict[str, Any], ctx: Any) -> Any:
        start = math.floor(ctx.timestamp / HOUR) * HOUR
        end = start + HOUR
        watermark = ctx.timer_service.current_watermark()
        if end <= watermark:  # the window's timer (at end) has already fired
            ctx.side_output("late", _late_row(flight, ctx.timestamp, start, watermark))
            return None
        ctx.timer_service.register_event_time_timer(end)  # once per (route, window)
        delay, cancelled = flight["dep_delay"], flight["cancelled"]
        return self.windows.async_get(start).then_compose(
            lambda acc: self.windows.async_put(start, _accumulate(acc, delay, cancelled))
        )

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        start = int(timestamp) - HOUR
        origin, dest = ctx.current_key.split("-", 1)

        def emit(acc: tuple | None) -> Any:
            if acc is not None:
                ctx.output(_window_row(origin, dest, start, acc))
            return self.windows.async_remove(start)

        return self.windows.async_get(start).then_compose(emit)


def _accumulate(acc: tuple | None, delay: float | None, cancelled: bool) -> tuple:
    flights, n_cancelled, counted, total, worst = acc or (0, 0, 0, 0.0, None)
    flights += 1
    n_cancelled += bool(cancelled)
    if delay is not None and not math.isnan(delay):
        counted += 1
        total += delay
        worst = delay if worst is None else max(worst, delay)
    return flights, n_cancelled, counted, total, worst


def _window_row(origin: str, dest: str, start: int, acc: tuple) -> dict[str, Any]:
    flights, cancelled, counted, total, worst = acc
    return {
        "origin": origin,
        "dest": dest,
        "window_start": start,
        "flights": flights,
        "cancelled": cancelled,
        "mean_dep_delay": total / counted if counted else None,
        "max_dep_delay": worst,
    }


def _late_row(flight: dict[str, Any], event_time: float, start: int, watermark: float) -> dict:
    return {
        "row": flight["row"],
        "origin": flight["origin"],
        "dest": flight["dest"],
        "event_time": event_time,
        "dep_delay": flight["dep_delay"],
        "cancelled": flight["cancelled"],
        "window_start": start,
        "watermark": watermark,
    }


class Rotations(KeyedProcessFunction):
    """Each aircraft's consecutive flights (in arrival order); ``async def`` style.

    State: ValueState ``previous``: ``(event_time s, origin, dest, arr_delay)``
    of the aircraft's last flight. Output dicts match ``ROTATIONS_SCHEMA``: the
    ``prev_*``, ``gap_minutes``, ``propagated`` and ``relocated`` columns are
    null on an aircraft's first flight; ``propagated`` is previous
    ``arr_delay`` > 15 and this ``dep_delay`` > 15 (False when either is
    missing); ``relocated`` is origin != previous destination.
    """

    def open(self, ctx: Any) -> None:
        self.previous = ctx.get_state(ValueStateDescriptor("previous"))

    async def process_element(self, flight: dict[str, Any], ctx: Any) -> None:
        if flight["tailnum"] is None:
            ctx.side_output("no_tailnum", _no_tailnum_row(flight, ctx.timestamp))
            return
        previous = await self.previous.async_value()
        ctx.output(_rotation_row(flight, ctx.timestamp, previous))
        await self.previous.async_update(
            (ctx.timestamp, flight["origin"], flight["dest"], flight["arr_delay"])
        )


def _rotation_row(flight: dict[str, Any], event_time: float, previous: tuple | None) -> dict:
    row = {
        "tailnum": flight["tailnum"],
        "event_time": event_time,
        "origin": flight["origin"],
        "dest": flight["dest"],
        "dep_delay": flight["dep_delay"],
    }
    if previous is None:
        return row
    prev_time, prev_origin, prev_dest, prev_arr_delay = previous
    row.update(
        prev_origin=prev_origin,
        prev_dest=prev_dest,
        prev_arr_delay=prev_arr_delay,
        gap_minutes=(event_time - prev_time) / 60.0,
        propagated=_late_by(prev_arr_delay) and _late_by(flight["dep_delay"]),
        relocated=flight["origin"] != prev_dest,
    )
    return row


def _late_by(minutes: float | None) -> bool:
    return minutes is not None and minutes > DELAYED_MINUTES  # NaN > 15 is False too


def _no_tailnum_row(flight: dict[str, Any], event_time: float) -> dict[str, Any]:
    return {
        "row": flight["row"],
        "carrier": flight["carrier"],
        "flight": flight["flight"],
        "origin": flight["origin"],
        "dest": flight["dest"],
        "event_time": event_time,
        "dep_delay": flight["dep_delay"],
        "arr_delay": flight["arr_delay"],
    }


# --- the pipeline ---------------------------------------------------------------------


@dataclass(frozen=True)
class FlightsOptions:
    """One run of the flights job.

    Attributes:
        out: output directory (created; Parquet datasets, summary.md, the plot).
        backend: ``"rocksdb"`` (state under ``out/state/<operator>``) or ``"memory"``.
        partitions: Spark partitions, one operator each, >= 1.
        watermark_delay: bounded out-of-orderness in seconds.
        sync: run with ``AecConfig(async_state=False)`` (the synchronous reference).
        limit: use only the first ``limit`` rows of the table (None: all).
    """

    out: str
    backend: str = "rocksdb"
    partitions: int = 2
    watermark_delay: float = 2 * HOUR
    sync: bool = False
    limit: int | None = None


@dataclass
class StageResult:
    """One operator's run: where its outputs went and what it cost."""

    name: str
    outputs: dict[str, str]  # dataset name -> Parquet directory
    rows: dict[str, int]  # dataset name -> row count
    metrics: pd.DataFrame  # partition_metrics, one row per partition
    wall_s: float


@dataclass
class FlightsRun:
    """What ``run`` did; ``spark_glue.flights_report`` turns it into summary.md."""

    options: FlightsOptions
    input_rows: int
    stages: list[StageResult] = field(default_factory=list)
    load_s: float = 0.0
    wall_s: float = 0.0


def run(
    spark: SparkSession, options: FlightsOptions, step: Callable[[str], None] = lambda _: None
) -> FlightsRun:
    """Run both operators over the flights table and write their Parquet outputs.

    ``step(description)`` is called as each stage finishes (progress reporting).
    Writes ``out/route_hourly``, ``out/late``, ``out/rotations``, ``out/no_tailnum``
    (Parquet directories, overwritten).

    Raises:
        ValueError: bad options. Spark's error (carrying ``aec.JobFailure``'s
        message) when an operator fails.
    """
    if options.backend not in ("memory", "rocksdb"):
        raise ValueError(f"backend must be 'memory' or 'rocksdb', got {options.backend!r}")
    if options.partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {options.partitions}")
    started = time.perf_counter()
    os.makedirs(options.out, exist_ok=True)
    state_dir = os.path.join(options.out, "state")
    shutil.rmtree(state_dir, ignore_errors=True)  # state is per run; stale partitions confuse

    prepared = flights_data.load(options.limit)
    source = flights_data.to_spark(spark, prepared).cache()
    source.count()  # materialise the cache now, so the stage timings below are the operators'
    report = FlightsRun(options=options, input_rows=len(prepared))
    report.load_s = time.perf_counter() - started
    step("loaded the flights table")

    common = {
        "timestamp": "event_time",
        "watermark_delay": options.watermark_delay,
        "order_by": flights_data.ARRIVAL_ORDER,
        "config": AecConfig(async_state=not options.sync),
        "num_partitions": options.partitions,
    }
    hourly = process_keyed(
        source,
        RouteHourly(),
        key="route",
        output_schema=ROUTE_HOURLY_SCHEMA,
        backend=_backend(options, state_dir, "route_hourly"),
        side_outputs={"late": LATE_SCHEMA},
        **common,
    )
    report.stages.append(_write_stage(options.out, "route_hourly", hourly, ["late"]))
    step("route_hourly")
    rotations = process_keyed(
        source,
        Rotations(),
        key="aircraft",
        output_schema=ROTATIONS_SCHEMA,
        backend=_backend(options, state_dir, "rotations"),
        side_outputs={"no_tailnum": NO_TAILNUM_SCHEMA},
        **common,
    )
    report.stages.append(_write_stage(options.out, "rotations", rotations, ["no_tailnum"]))
    step("rotations")
    source.unpersist()
    report.wall_s = time.perf_counter() - started
    return report


def _backend(options: FlightsOptions, state_dir: str, name: str) -> Any:
    if options.backend == "memory":
        return MemoryBackend()
    return RocksDBBackend(os.path.join(state_dir, name))


def _write_stage(out: str, name: str, result: DataFrame, sides: list[str]) -> StageResult:
    started = time.perf_counter()
    frames = {name: result, **{tag: side_output(result, tag) for tag in sides}}
    outputs, rows = {}, {}
    for (
        dataset,
        frame,
    ) in frames.items():  # the first write runs the operator; the rest read its cache
        path = os.path.join(out, dataset)
        frame.write.mode("overwrite").parquet(path)
        outputs[dataset] = path
        rows[dataset] = frame.count()
    metrics = partition_metrics(result).toPandas()
    unpersist(result)
    return StageResult(name, outputs, rows, metrics, time.perf_counter() - started)
