"""An external call inside a keyed function: state read, HTTP call, state write in one
``async def`` (beyond Flink, whose keyed functions cannot await a service).

Needs the engine and aiohttp (``pip install 'aec[http]'``). Run:
``python examples/external_call.py``. It starts a small weather service on
127.0.0.1 (a free port), then enriches each flight with its origin's temperature.

``ctx.call_async(fn, *args, timeout=..., retry=...)`` runs ``fn`` on the operator's
asyncio loop thread and returns a StateFuture; the call counts toward its record
like a state request, so records of one key still run one after another and the
answer equals the synchronous run's (``AecConfig(async_state=False)``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
from aiohttp import web

from aec import (
    AecConfig,
    Context,
    KeyedProcessFunction,
    Record,
    RuntimeContext,
    ValueStateDescriptor,
    run_keyed,
)
from aec.retry import ExponentialBackoff, exception_type

TEMPERATURES = {"JFK": 4.5, "EWR": 3.9, "LGA": 4.1}


class WeatherService:
    """``GET /temp/<origin>`` -> the temperature as text, after 5 ms (a thread of its own)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _temperature(self, request: web.Request) -> web.Response:
        await asyncio.sleep(0.005)
        return web.Response(text=str(TEMPERATURES[request.match_info["origin"]]))

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/temp/{origin}", self._temperature)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> WeatherService:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def fetch_temperature(url: str) -> float:
    """Runs on the operator's asyncio loop thread (never on the mailbox thread)."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        response.raise_for_status()
        return float(await response.text())


class Enrich(KeyedProcessFunction):
    """Per aircraft: how many flights so far, and the origin's temperature."""

    def __init__(self, service_url: str) -> None:
        self.service_url = service_url

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("flights", default=0))

    async def process_element(self, value: Any, ctx: Context) -> None:
        seen = await self.count.async_value()
        temperature = await ctx.call_async(
            fetch_temperature,
            f"{self.service_url}/temp/{value['origin']}",
            timeout=5.0,  # seconds, spanning retries
            retry=ExponentialBackoff(3, 0.05, 0.5, retry_on_exception=exception_type(OSError)),
        )
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, value["origin"], temperature, seen + 1))


def main() -> None:
    flights = [("N14228", "EWR"), ("N24211", "LGA"), ("N14228", "JFK"), ("N619AA", "JFK")] * 25
    source = [Record(tail, {"origin": origin}) for tail, origin in flights]
    with WeatherService() as service:
        run = run_keyed(source, Enrich(service.url))
        reference = run_keyed(source, Enrich(service.url), config=AecConfig(async_state=False))
    outputs = run.outputs[:-1]  # the last element is the final Watermark(inf)
    print("first of N14228:", [o for o in outputs if o[0] == "N14228"][:2])
    # keys interleave in the async run; per key, the outputs are the synchronous ones
    same = all(
        [o for o in outputs if o[0] == key] == [o for o in reference.outputs[:-1] if o[0] == key]
        for key in {tail for tail, _ in flights}
    )
    print("records:", len(outputs), "per key same as sync:", same)


if __name__ == "__main__":
    main()
