"""``aec flights --enrich``: the flights job calling a real HTTP service.

With ``FlightsOptions.enrich`` the job starts a ``FlightsService`` (aiohttp, on
loopback, ``service_latency`` per request plus a small cost per lookup,
``service_failure_rate`` of 503s) for the run and uses it twice:

* Spark SQL with ``spark_glue.async_udf`` (FLIP-400's two cases): the UDFs
  ``weather(origin, year, month, day, hour)`` and ``plane(tailnum)`` are registered
  with ``spark.udf.register`` and used in a SELECT (``enriched_flights``: every
  flight with the weather at its origin in its scheduled hour and its plane) and in
  a WHERE clause (``low_visibility``: flights that left in under a mile of
  visibility);
* ``rotations`` looks the plane up between reading and writing its state
  (``EnrichedRotations``): one keyed operator, no extra shuffle; its rows gain
  ``manufacturer``, ``model``, ``seats``, ``plane_year``.

With ``FlightsOptions.enrich_batch_size`` n > 0 (default 32) both go through the
service's batch endpoints, up to n lookups per HTTP request: the UDFs as
``async_udf(batch_size=n)`` over ``async def f(values: list) -> list``, rotations with
``ctx.call_batched`` and one ``Batcher`` (the lookups of records of every aircraft in
flight share requests). With 0, one request per lookup (``async_udf`` per row,
``ctx.call_async``).

Calls retry with exponential backoff on connection errors and 5xx answers
(``SERVICE_RETRY``); a row without a match gets nulls; retries exhausted fail the
job. The service's counters (requests, injected failures, not found, latency
percentiles, concurrency) go to summary.md per stage.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from aec.async_io import Batcher
from spark_glue.async_calls import async_udf
from spark_glue.flights.functions import (
    ROTATIONS_SCHEMA,
    Rotations,
    _no_tailnum_row,
    rotation_row,
    rotation_state,
)
from spark_glue.flights.service import (
    DEFAULT_ITEM_LATENCY,
    SERVICE_RETRY,
    FlightsService,
    ServiceClient,
)

__all__ = ["ENRICHED_ROTATIONS_SCHEMA", "EnrichedRotations", "Enricher", "serving", "summary"]

CALL_TIMEOUT = 120.0  # seconds per call, spanning its retries (a loaded machine queues)
UDF_CAPACITY = 100  # calls in flight per Spark task
BATCH_SIZE = 32  # lookups per request on the batch endpoints (FlightsOptions default)
BATCH_WAIT = 0.01  # seconds a partial batch waits for more lookups
BATCHES_IN_FLIGHT = 8  # a batched UDF's capacity: this many full batches per Spark task
LOW_VISIBILITY_MILES = 1.0

PLANE_TYPE = "manufacturer string, model string, seats long, year double"
WEATHER_TYPE = "temp double, wind_speed double, precip double, visib double"
ENRICHED_ROTATIONS_SCHEMA = (
    ROTATIONS_SCHEMA + ", manufacturer string, model string, seats long, plane_year double"
)
_HOUR = "CAST(sched_dep_time DIV 100 AS INT)"


class EnrichedRotations(Rotations):
    """``Rotations`` whose rows also carry the aircraft's plane record, fetched between
    the state read and the state write (beyond Flink: state and an external call in
    one keyed function): with ``ctx.call_batched`` through the batch endpoint (up to
    ``batch_size`` lookups per request, across aircraft), or with ``ctx.call_async``
    (one request per lookup) when ``batch_size`` is 0."""

    def __init__(self, url: str, batch_size: int = BATCH_SIZE) -> None:
        self.client = ServiceClient(url)
        self.planes = (
            Batcher(self.client.planes, max_batch_size=batch_size, max_wait=BATCH_WAIT)
            if batch_size
            else None
        )

    async def process_element(self, flight: dict[str, Any], ctx: Any) -> None:
        if flight["tailnum"] is None:
            ctx.side_output("no_tailnum", _no_tailnum_row(flight, ctx.timestamp))
            return
        previous = await self.previous.async_value()
        if self.planes is not None:
            plane = await ctx.call_batched(
                self.planes, flight["tailnum"], timeout=CALL_TIMEOUT, retry=SERVICE_RETRY
            )
        else:
            plane = await ctx.call_async(
                self.client.plane, flight["tailnum"], timeout=CALL_TIMEOUT, retry=SERVICE_RETRY
            )
        row = rotation_row(flight, ctx.timestamp, previous)
        plane = plane or {}
        row.update(
            manufacturer=plane.get("manufacturer"),
            model=plane.get("model"),
            seats=plane.get("seats"),
            plane_year=plane.get("year"),
        )
        ctx.output(row)
        await self.previous.async_update(rotation_state(flight, ctx.timestamp))


class Enricher:
    """The enrichment of one run: the service and the stages that call it."""

    def __init__(self, service: FlightsService, batch_size: int = BATCH_SIZE) -> None:
        self.service = service
        self.batch_size = batch_size  # lookups per request; 0: one request per lookup
        self.stats: dict[str, dict[str, Any]] = {}
        self._rotations_started = 0.0

    def enrich_sql(self, spark: SparkSession, source: DataFrame, out: str) -> dict[str, int]:
        """Register the async UDFs, run the SELECT and the WHERE query, write
        ``out/enriched_flights`` and ``out/low_visibility``; their row counts."""
        client = ServiceClient(self.service.url)
        options: dict[str, Any] = {
            "capacity": UDF_CAPACITY,
            "timeout": CALL_TIMEOUT,
            "retry": SERVICE_RETRY,
        }
        if self.batch_size:
            options.update(
                batch_size=self.batch_size,
                batch_timeout=BATCH_WAIT,
                capacity=BATCHES_IN_FLIGHT * self.batch_size,
            )

            @async_udf(WEATHER_TYPE, **options)
            async def weather(keys: list[Any]) -> list[Any]:  # (origin, y, m, d, hour) each
                return await client.weathers(keys)

            @async_udf(PLANE_TYPE, **options)
            async def plane(tailnums: list[Any]) -> list[Any]:
                return await client.planes(tailnums)

        else:

            @async_udf(WEATHER_TYPE, **options)
            async def weather(origin: str, year: int, month: int, day: int, hour: int) -> Any:
                return await client.weather(origin, year, month, day, hour)

            @async_udf(PLANE_TYPE, **options)
            async def plane(tailnum: str | None) -> Any:
                return await client.plane(tailnum)

        spark.udf.register("weather", weather)
        spark.udf.register("plane", plane)
        source.createOrReplaceTempView("flights")
        queries = {
            "enriched_flights": "SELECT row, carrier, flight, tailnum, origin, dest, event_time, "
            f"dep_delay, arr_delay, weather(origin, year, month, day, {_HOUR}) AS weather, "
            "plane(tailnum) AS plane FROM flights",
            "low_visibility": "SELECT row, carrier, flight, origin, event_time, dep_delay "
            f"FROM flights WHERE weather(origin, year, month, day, {_HOUR}).visib "
            f"< {LOW_VISIBILITY_MILES}",
        }
        rows = {}
        self.service.reset_stats()
        started = time.perf_counter()
        for name, query in queries.items():
            path = os.path.join(out, name)
            spark.sql(query).write.mode("overwrite").parquet(path)
            rows[name] = spark.read.parquet(path).count()
        self.stats["async_udf in Spark SQL"] = {
            **self.service.stats(),
            "stage_s": time.perf_counter() - started,
            "rows": rows,
        }
        return rows

    def rotations(self) -> tuple[EnrichedRotations, str]:
        """The enriched rotations function and its output schema; counters restart."""
        self.service.reset_stats()
        self._rotations_started = time.perf_counter()
        function = EnrichedRotations(self.service.url, self.batch_size)
        return function, ENRICHED_ROTATIONS_SCHEMA

    def rotations_done(self) -> None:
        how = "ctx.call_batched" if self.batch_size else "ctx.call_async"
        self.stats[f"{how} in rotations"] = {
            **self.service.stats(),
            "stage_s": time.perf_counter() - self._rotations_started,
        }


@contextlib.contextmanager
def serving(options: Any) -> Iterator[Enricher | None]:
    """An ``Enricher`` with its service running for the block (None without
    ``options.enrich``); the service is stopped at the end, also after a failure."""
    if not getattr(options, "enrich", False):
        yield None
        return
    with FlightsService(options.service_latency, options.service_failure_rate) as service:
        yield Enricher(service, getattr(options, "enrich_batch_size", BATCH_SIZE))


def summary(stats: dict[str, dict[str, Any]], latency: float, failure_rate: float) -> list[str]:
    """The ``## Enrichment`` section of summary.md."""
    if not stats:
        return []
    lines = [
        "## Enrichment (HTTP service)",
        "",
        f"The aiohttp service on loopback answered after {latency * 1000:g} ms per request "
        f"plus {DEFAULT_ITEM_LATENCY * 1000:g} ms per lookup in it and failed "
        f"{failure_rate:.1%} of requests with a 503 on purpose; each failure was retried "
        "with exponential backoff (a failed batch's lookups travel again in later batches). "
        "Calls = requests - retried failures; items = lookups answered (items per call > 1: "
        "batched calls); not found = lookups that got nulls. Latency is the service's time "
        "per request; concurrency is requests in flight at the service (mean over the "
        "stage, and max).",
        "",
        "| stage | calls | items | items/call | requests | retries | not found | p50 ms | "
        "p95 ms | p99 ms | mean concurrency | max concurrency | stage s | items/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in stats.items():
        ms = s["latency_ms"]
        rate = s["items"] / s["stage_s"] if s["stage_s"] else 0.0
        lines.append(
            f"| {name} | {s['calls']:,} | {s['items']:,} | {s['items_per_call']:.1f} | "
            f"{s['requests']:,} | {s['failures']:,} | {s['not_found']:,} | {ms['p50']:.1f} | "
            f"{ms['p95']:.1f} | {ms['p99']:.1f} | {s['mean_concurrency']:.1f} | "
            f"{s['max_concurrency']} | {s['stage_s']:.1f} | {rate:,.0f} |"
        )
    for name, s in stats.items():
        if s.get("rows"):
            written = ", ".join(f"`{k}` {v:,} rows" for k, v in s["rows"].items())
            lines += ["", f"{name} wrote {written}."]
    return lines + [""]
