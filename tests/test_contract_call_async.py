"""Contract tests: ``Context.call_async`` (external calls
inside keyed functions). Black-box, public names only."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import aec
from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.retry import FixedDelay
from aec.testing import assert_equivalent
from backends import LatencyBackend, MemoryBackend

ASYNC = AecConfig()
SYNC = AecConfig(async_state=False)


def _values(outputs):
    return [o for o in outputs if not isinstance(o, Watermark)]


async def fetch_weather(origin):
    await asyncio.sleep(0.001 * (len(origin) % 3))
    return f"sunny-{origin}"


class Enrich(KeyedProcessFunction):
    """The contract's example, verbatim in substance."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        seen = await self.count.async_value()
        weather = await ctx.call_async(fetch_weather, value["origin"], timeout=2.0)
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, weather, seen + 1))


def _flights(n=40, keys=5):
    return [Record(f"k{i % keys}", {"origin": "ABCDE"[: 1 + i % 5]}) for i in range(n)]


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_contract_example(config):
    source = _flights()
    result = aec.run_keyed(source, Enrich(), config=config)
    out = _values(result.outputs)
    assert len(out) == len(source)
    for key in {r.key for r in source}:
        mine = [o for o in out if o[0] == key]
        origins = [r.value["origin"] for r in source if r.key == key]
        assert mine == [(key, f"sunny-{o}", i + 1) for i, o in enumerate(origins)]


def test_assert_equivalent_applies_to_deterministic_calls():
    assert_equivalent(Enrich, _flights())


def test_fn_runs_on_one_loop_thread_off_the_mailbox_thread():
    threads = {"calls": set(), "mailbox": set()}

    async def where(x):
        threads["calls"].add(threading.get_ident())
        await asyncio.sleep(0)
        return x

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            threads["mailbox"].add(threading.get_ident())
            ctx.output(await ctx.call_async(where, value))

    result = aec.run_keyed([Record(i % 3, i) for i in range(20)], F())
    assert sorted(_values(result.outputs)) == list(range(20))
    assert len(threads["mailbox"]) == 1
    assert len(threads["calls"]) == 1  # one loop per operator
    assert threads["calls"].isdisjoint(threads["mailbox"])


def test_callable_returning_an_awaitable_is_accepted():
    def plain(x):
        return asyncio.sleep(0, result=x * 2)

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(plain, value))

    assert sorted(_values(aec.run_keyed([Record("a", 1), Record("b", 2)], F()).outputs)) == [2, 4]


def test_same_key_order_holds_with_slow_calls():
    async def slow(value):
        await asyncio.sleep(0.02 if value % 2 == 0 else 0.0)
        return value

    class F(KeyedProcessFunction):
        def open(self, ctx):
            self.last = ctx.get_state(ValueStateDescriptor("last", default=-1))

        async def process_element(self, value, ctx):
            previous = await self.last.async_value()
            got = await ctx.call_async(slow, value)
            await self.last.async_update(got)
            ctx.output((ctx.current_key, previous, got))

    source = [Record(i % 3, i) for i in range(30)]
    out = _values(aec.run_keyed(source, F()).outputs)
    for key in range(3):
        mine = [o for o in out if o[0] == key]
        values = [r.value for r in source if r.key == key]
        assert mine == [(key, p, v) for p, v in zip([-1] + values[:-1], values, strict=False)]


class Tracked(KeyedProcessFunction):
    """Outputs ``call_async(tracked, value)``; ``max_running``: most calls at once."""

    def __init__(self, delay):
        self.delay = delay
        self.running = self.max_running = 0
        self.lock = threading.Lock()

    async def tracked(self, value):
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        await asyncio.sleep(self.delay)
        with self.lock:
            self.running -= 1
        return value

    async def process_element(self, value, ctx):
        ctx.output(await ctx.call_async(self.tracked, value))


def test_calls_count_toward_the_in_flight_limit():
    fn = Tracked(0.005)
    config = AecConfig(in_flight_records_limit=3)
    out = _values(aec.run_keyed([Record(i, i) for i in range(30)], fn, config=config).outputs)
    assert sorted(out) == list(range(30))
    assert 1 <= fn.max_running <= 3


def test_calls_are_concurrent_across_keys():
    fn = Tracked(0.02)
    aec.run_keyed([Record(i, i) for i in range(20)], fn)
    assert fn.max_running > 1


def test_snapshot_drains_calls(tmp_path):
    async def slow(value):
        await asyncio.sleep(0.02)
        return value

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(slow, value))

    op = KeyedProcessOperator(F(), MemoryBackend())
    op.open()
    for i in range(10):
        op.process(Record(i, i))
    op.snapshot(1, tmp_path)
    assert sorted(_values(op.drain_outputs())) == list(range(10))  # all finished by the barrier
    op.close()


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_exception_is_raised_inside_the_coroutine_and_may_be_caught(config):
    async def broken(value):
        raise ConnectionError(f"down {value}")

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            try:
                await ctx.call_async(broken, value)
            except ConnectionError as exc:
                ctx.output(("caught", str(exc)))

    out = _values(aec.run_keyed([Record("a", 1), Record("b", 2)], F(), config=config).outputs)
    assert sorted(out) == [("caught", "down 1"), ("caught", "down 2")]


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_uncaught_exception_fails_the_job(config):
    async def broken(value):
        raise ConnectionError("down")

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(broken, value))

    with pytest.raises(JobFailure) as info:
        aec.run_keyed([Record("a", 1)], F(), config=config)
    assert isinstance(info.value.__cause__, ConnectionError)


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_timeout_raises_timeout_error_and_cancels_the_call(config):
    cancelled = threading.Event()

    async def hangs(value):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return value

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            try:
                await ctx.call_async(hangs, value, timeout=0.05)
            except TimeoutError:
                ctx.output("timed out")

    started = time.monotonic()
    out = _values(aec.run_keyed([Record("a", 1)], F(), config=config).outputs)
    assert out == ["timed out"]
    assert cancelled.wait(5.0)
    assert time.monotonic() - started < 15  # never waited for the 30 s call


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_uncaught_timeout_fails_the_job(config):
    async def hangs(value):
        await asyncio.sleep(30)

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            await ctx.call_async(hangs, value, timeout=0.05)

    with pytest.raises(JobFailure) as info:
        aec.run_keyed([Record("a", 1)], F(), config=config)
    assert isinstance(info.value.__cause__, TimeoutError)


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_retry_then_success(config):
    calls = []

    async def flaky(value):
        calls.append(value)
        if len(calls) < 3:
            raise ConnectionError("flaky")
        return value * 10

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(flaky, value, retry=FixedDelay(3, 0.01)))

    assert _values(aec.run_keyed([Record("a", 4)], F(), config=config).outputs) == [40]
    assert calls == [4, 4, 4]


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_timeout_spans_retries(config):
    calls = []

    async def slow_fail(value):
        calls.append(value)
        await asyncio.sleep(0.04)
        raise ConnectionError("no")

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            try:
                await ctx.call_async(slow_fail, value, timeout=0.1, retry=FixedDelay(50, 0.01))
            except TimeoutError:
                ctx.output("timeout")

    assert _values(aec.run_keyed([Record("a", 1)], F(), config=config).outputs) == ["timeout"]
    assert 1 <= len(calls) < 10


def test_sync_mode_returns_a_completed_future():
    seen = []

    async def quick(value):
        return value + 1

    class F(KeyedProcessFunction):
        def process_element(self, value, ctx):
            future = ctx.call_async(quick, value)
            # completed before call_async returned: the callback runs inline
            future.then_accept(lambda v: seen.append(("inline", v)))
            seen.append("after")

    aec.run_keyed([Record("a", 1)], F(), config=SYNC)
    assert seen == [("inline", 2), "after"]


def test_close_never_waits_for_abandoned_calls():
    async def forever(value):
        await asyncio.sleep(60)

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            try:
                await ctx.call_async(forever, value, timeout=0.05)
            except TimeoutError:
                ctx.output("gave up")

    op = KeyedProcessOperator(F(), MemoryBackend())
    op.open()
    op.process(Record("a", 1))
    op.finish()
    started = time.monotonic()
    op.close()
    assert time.monotonic() - started < 10
    assert _values(op.drain_outputs()) == ["gave up"]


def test_with_a_remote_backend():
    backend = LatencyBackend(MemoryBackend(), 0.002)
    result = aec.run_keyed(_flights(30), Enrich(), backend=backend)
    assert len(_values(result.outputs)) == 30


def test_call_async_in_on_timer():
    async def lookup(t):
        return f"looked-up-{t}"

    class F(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service.register_event_time_timer(ctx.timestamp + 1)

        async def on_timer(self, timestamp, ctx):
            ctx.output((ctx.current_key, await ctx.call_async(lookup, timestamp)))

    source = [Record("a", 1, timestamp=1.0), Record("b", 1, timestamp=3.0), Watermark(2.0)]
    out = aec.run_keyed(source, F()).outputs
    assert out == [("a", "looked-up-2.0"), Watermark(2.0), ("b", "looked-up-4.0"),
                   Watermark(float("inf"))]


def test_retry_on_result_sees_the_result():
    answers = [None, None, 7]

    async def eventually(_):
        return answers.pop(0)

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            strategy = FixedDelay(3, 0.0, retry_on_result=lambda r: r is None)
            ctx.output(await ctx.call_async(eventually, value, retry=strategy))

    assert _values(aec.run_keyed([Record("a", 1)], F()).outputs) == [7]
    assert answers == []


@pytest.mark.parametrize("config", [ASYNC, SYNC], ids=["async", "sync"])
def test_a_failed_call_in_a_chain_fails_the_job(config):
    async def broken(value):
        raise KeyError("gone")

    class F(KeyedProcessFunction):
        def process_element(self, value, ctx):
            return ctx.call_async(broken, value).then_accept(ctx.output)

    with pytest.raises(JobFailure) as info:
        aec.run_keyed([Record("a", 1)], F(), config=config)
    assert isinstance(info.value.__cause__, KeyError)


def test_one_loop_thread_per_operator():
    seen = []

    async def where(value):
        seen.append((value, threading.get_ident()))
        return value

    class F(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(where, value))

    operators = [KeyedProcessOperator(F(), MemoryBackend()) for _ in range(2)]
    for i, op in enumerate(operators):
        op.open()
        for j in range(3):
            op.process(Record(j, (i, j)))
    for op in operators:
        op.finish()
        op.close()
    threads = {i: {t for (op_index, _), t in seen if op_index == i} for i in range(2)}
    assert len(threads[0]) == 1 and len(threads[1]) == 1
    assert threads[0] != threads[1]
