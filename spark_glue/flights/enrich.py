"""``aec flights --enrich``: the flights job calling a real HTTP service.

With ``FlightsOptions.enrich`` the job starts a ``FlightsService`` (aiohttp, on
loopback, ``service_latency`` per answer, ``service_failure_rate`` of 503s) for the
run and uses it twice:

* Spark SQL with ``spark_glue.async_udf`` (FLIP-400's two cases): the UDFs
  ``weather(origin, year, month, day, hour)`` and ``plane(tailnum)`` are registered
  with ``spark.udf.register`` and used in a SELECT (``enriched_flights``: every
  flight with the weather at its origin in its scheduled hour and its plane) and in
  a WHERE clause (``low_visibility``: flights that left in under a mile of
  visibility);
* ``rotations`` calls the planes endpoint with ``ctx.call_async`` between reading
  and writing its state (``EnrichedRotations``): one keyed operator, no extra
  shuffle; its rows gain ``manufacturer``, ``model``, ``seats``, ``plane_year``.

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

from spark_glue.async_calls import async_udf
from spark_glue.flights.functions import (
    ROTATIONS_SCHEMA,
    Rotations,
    _no_tailnum_row,
    _rotation_row,
)
from spark_glue.flights.service import SERVICE_RETRY, FlightsService, ServiceClient

__all__ = ["ENRICHED_ROTATIONS_SCHEMA", "EnrichedRotations", "Enricher", "serving", "summary"]

CALL_TIMEOUT = 120.0  # seconds per call, spanning its retries (a loaded machine queues)
UDF_CAPACITY = 100  # calls in flight per Spark task
LOW_VISIBILITY_MILES = 1.0

PLANE_TYPE = "manufacturer string, model string, seats long, year double"
WEATHER_TYPE = "temp double, wind_speed double, precip double, visib double"
ENRICHED_ROTATIONS_SCHEMA = (
    ROTATIONS_SCHEMA + ", manufacturer string, model string, seats long, plane_year double"
)
_HOUR = "CAST(sched_dep_time DIV 100 AS INT)"


class EnrichedRotations(Rotations):
    """``Rotations`` whose rows also carry the aircraft's plane record, fetched with
    ``ctx.call_async`` between the state read and the state write (beyond Flink:
    state and an external call in one keyed function)."""

    def __init__(self, url: str) -> None:
        self.client = ServiceClient(url)

    async def process_element(self, flight: dict[str, Any], ctx: Any) -> None:
        if flight["tailnum"] is None:
            ctx.side_output("no_tailnum", _no_tailnum_row(flight, ctx.timestamp))
            return
        previous = await self.previous.async_value()
        plane = await ctx.call_async(
            self.client.plane, flight["tailnum"], timeout=CALL_TIMEOUT, retry=SERVICE_RETRY
        )
        row = _rotation_row(flight, ctx.timestamp, previous)
        plane = plane or {}
        row.update(
            manufacturer=plane.get("manufacturer"),
            model=plane.get("model"),
            seats=plane.get("seats"),
            plane_year=plane.get("year"),
        )
        ctx.output(row)
        await self.previous.async_update(
            (ctx.timestamp, flight["origin"], flight["dest"], flight["arr_delay"])
        )


class Enricher:
    """The enrichment of one run: the service and the stages that call it."""

    def __init__(self, service: FlightsService) -> None:
        self.service = service
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
        return EnrichedRotations(self.service.url), ENRICHED_ROTATIONS_SCHEMA

    def rotations_done(self) -> None:
        self.stats["ctx.call_async in rotations"] = {
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
        yield Enricher(service)


def summary(stats: dict[str, dict[str, Any]], latency: float, failure_rate: float) -> list[str]:
    """The ``## Enrichment`` section of summary.md."""
    if not stats:
        return []
    lines = [
        "## Enrichment (HTTP service)",
        "",
        f"The aiohttp service on loopback answered after {latency * 1000:g} ms and failed "
        f"{failure_rate:.1%} of requests with a 503 on purpose; each failure was retried "
        "with exponential backoff. Calls = requests - retried failures; not found = "
        "rows that got nulls. Latency is the service's time per request; concurrency is "
        "requests in flight at the service (mean over the stage, and max).",
        "",
        "| stage | calls | requests | retries | not found | p50 ms | p95 ms | p99 ms | "
        "mean concurrency | max concurrency | stage s | calls/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in stats.items():
        ms = s["latency_ms"]
        rate = s["calls"] / s["stage_s"] if s["stage_s"] else 0.0
        lines.append(
            f"| {name} | {s['calls']:,} | {s['requests']:,} | {s['failures']:,} | "
            f"{s['not_found']:,} | {ms['p50']:.1f} | {ms['p95']:.1f} | {ms['p99']:.1f} | "
            f"{s['mean_concurrency']:.1f} | {s['max_concurrency']} | {s['stage_s']:.1f} | "
            f"{rate:,.0f} |"
        )
    for name, s in stats.items():
        if s.get("rows"):
            written = ", ".join(f"`{k}` {v:,} rows" for k, v in s["rows"].items())
            lines += ["", f"{name} wrote {written}."]
    return lines + [""]
