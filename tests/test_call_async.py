"""Context.call_async: external calls inside keyed functions."""

from __future__ import annotations

import asyncio
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
from engine_helpers import cyclic_garbage
from hypothesis import given, settings
from hypothesis import strategies as st

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.retry import ExponentialBackoff, FixedDelay
from aec.testing import assert_equivalent
from backends import MemoryBackend

SYNC = AecConfig(async_state=False)


def call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aec-call-loop")]


class Service:
    """A fake service: per-value latency, records threads and concurrency."""

    def __init__(self, latency=lambda value: 0.002) -> None:
        self.latency = latency
        self.lock = threading.Lock()
        self.threads: set[int] = set()
        self.running: dict[object, int] = {}
        self.max_running = 0
        self.overlapping_keys: list[object] = []
        self.calls = 0

    async def fetch(self, key, value):
        with self.lock:
            self.calls += 1
            self.threads.add(threading.get_ident())
            if self.running.get(key):
                self.overlapping_keys.append(key)
            self.running[key] = self.running.get(key, 0) + 1
            self.max_running = max(self.max_running, sum(self.running.values()))
        try:
            await asyncio.sleep(self.latency(value))
        finally:
            with self.lock:
                self.running[key] -= 1
        return value * 10


class Enrich(KeyedProcessFunction):
    """The DESIGN example: read state, call, write state, emit."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        seen = await self.count.async_value()
        enriched = await ctx.call_async(self.service.fetch, ctx.current_key, value, timeout=5.0)
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, enriched, seen + 1))


def values(outputs: list) -> list:
    """Outputs without the watermarks (end of input emits Watermark(inf))."""
    return [o for o in outputs if not isinstance(o, Watermark)]


def records(n: int, keys: int) -> list[Record]:
    return [Record(i % keys, i) for i in range(n)]


# -- semantics -------------------------------------------------------------------------------
def test_state_and_call_compose_with_the_sync_answer_and_calls_overlap():
    service = Service()
    source = records(300, 30)
    result = run_keyed(source, Enrich(service), config=AecConfig(in_flight_records_limit=50))
    reference = run_keyed(source, Enrich(Service()), config=SYNC)
    assert sorted(result.outputs, key=str) == sorted(reference.outputs, key=str)
    for key in range(30):  # same-key order: the count goes up in input order
        mine = [o for o in result.outputs if type(o) is tuple and o[0] == key]
        assert [o[2] for o in mine] == list(range(1, 11))
        assert [o[1] for o in mine] == [v * 10 for v in range(key, 300, 30)]
    assert service.overlapping_keys == []  # never two calls of one key at once
    assert 1 < service.max_running <= 50  # keys overlap, within the in-flight limit
    assert len(service.threads) == 1 and threading.get_ident() not in service.threads
    assert not call_threads()


@settings(deadline=None)
@given(
    latencies=st.lists(st.floats(0, 0.003), min_size=1, max_size=20),
    keys=st.integers(1, 4),
    watermark_every=st.integers(2, 6),
)
def test_assert_equivalent_covers_functions_with_calls(latencies, keys, watermark_every):
    source: list = []
    for i, _ in enumerate(latencies):
        source.append(Record(i % keys, i, timestamp=float(i)))
        if i % watermark_every == 0:
            source.append(Watermark(float(i)))

    def factory():
        return Enrich(Service(lambda value: latencies[value]))

    assert_equivalent(factory, source)
    assert not call_threads()


def test_sync_mode_returns_a_completed_future():
    seen = []

    class Check(KeyedProcessFunction):
        def process_element(self, value, ctx):
            future = ctx.call_async(Service().fetch, ctx.current_key, value)
            seen.append(future.is_done())
            future.then_accept(ctx.output)

    assert values(run_keyed(records(4, 2), Check(), config=SYNC).outputs) == [0, 10, 20, 30]
    assert seen == [True] * 4
    assert not call_threads()


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_a_failed_call_raises_inside_the_coroutine_which_may_catch_it(config):
    async def flaky(value):
        if value % 2:
            raise ConnectionError(f"no answer for {value}")
        return value

    class Catching(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            try:
                ctx.output(await ctx.call_async(flaky, value))
            except ConnectionError as exc:
                ctx.output(str(exc))

    out = values(run_keyed(records(4, 2), Catching(), config=config).outputs)
    assert sorted(out, key=str) == sorted([0, "no answer for 1", 2, "no answer for 3"], key=str)


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_an_uncaught_call_failure_fails_the_job_naming_the_record(config):
    async def broken(value):
        raise LookupError("gone")

    class Uncaught(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(broken, value))

    with pytest.raises(JobFailure, match="gone") as info:
        run_keyed([Record("k", 1)], Uncaught(), config=config)
    assert isinstance(info.value.__cause__, LookupError)
    assert info.value.key == "k"
    assert not call_threads()


def test_a_failed_call_in_a_chained_callback_fails_the_job():
    async def broken(value):
        raise LookupError("gone")

    class Chained(KeyedProcessFunction):
        def process_element(self, value, ctx):
            return ctx.call_async(broken, value).then_accept(ctx.output)

    with pytest.raises(JobFailure) as info:
        run_keyed([Record("k", 1)], Chained())
    assert isinstance(info.value.__cause__, LookupError)


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_timeout_spans_retries_and_cancels_the_call(config):
    cancelled = []

    async def slow(value):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(value)
            raise

    class TimesOut(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            started = time.monotonic()
            try:
                await ctx.call_async(slow, value, timeout=0.1, retry=FixedDelay(5, 0.01))
            except TimeoutError:
                ctx.output(("timeout", round(time.monotonic() - started, 1)))

    started = time.monotonic()
    out = values(run_keyed([Record("a", 1)], TimesOut(), config=config).outputs)
    assert out == [("timeout", 0.1)]
    assert time.monotonic() - started < 2.0
    assert cancelled == [1]


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_the_timeout_holds_when_the_call_swallows_its_cancellation_or_blocks(config):
    attempts = []

    async def swallows(value):
        attempts.append(value)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return None  # asks for a retry below, after the deadline
        return value

    async def blocks(value):
        time.sleep(0.3)  # holds the loop past the deadline
        return value

    class Calls(KeyedProcessFunction):
        def __init__(self, fn):
            self.fn = fn

        async def process_element(self, value, ctx):
            retry = FixedDelay(50, 0.01, retry_on_result=lambda result: result is None)
            try:
                ctx.output(await ctx.call_async(self.fn, value, timeout=0.1, retry=retry))
            except TimeoutError:
                ctx.output("timeout")

    for fn in (swallows, blocks):
        started = time.monotonic()
        assert values(run_keyed([Record("a", 1)], Calls(fn), config=config).outputs) == ["timeout"]
        assert time.monotonic() - started < 2.0
    assert attempts == [1]  # no retry starts after the deadline


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_retries_with_backoff_until_success(config):
    attempts = []

    async def flaky(value):
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise ConnectionError("refused")
        return "ok"

    class Retrying(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(flaky, value, retry=ExponentialBackoff(4, 0.02, 1.0)))

    assert values(run_keyed([Record("a", 1)], Retrying(), config=config).outputs) == ["ok"]
    assert len(attempts) == 3
    assert attempts[2] - attempts[1] >= 0.035  # 0.02, then 0.04


def test_snapshot_drains_pending_calls(tmp_path):
    service = Service(lambda value: 0.05)
    op = KeyedProcessOperator(Enrich(service), MemoryBackend())
    op.open()
    for record in records(6, 3):
        op.process(record)
    op.snapshot(1, tmp_path)
    assert sorted(op.drain_outputs()) == sorted([(i % 3, i * 10, i // 3 + 1) for i in range(6)])
    assert op.controller.in_flight == 0 and op.controller.calls_in_flight == 0
    op.finish()
    assert not call_threads()


def test_close_never_waits_for_abandoned_calls():
    service = Service(lambda value: 30.0)

    class CallFirst(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(service.fetch, ctx.current_key, value))

    op = KeyedProcessOperator(CallFirst(), MemoryBackend())
    op.open()
    op.process(Record("a", 1))
    started = time.monotonic()
    while not service.calls and time.monotonic() - started < 5:
        time.sleep(0.001)
    assert service.calls == 1
    op.close()
    assert time.monotonic() - started < 2.0
    assert not call_threads()


# -- bad use ---------------------------------------------------------------------------------
def test_outside_a_record_is_a_runtime_error():
    class InOpen(KeyedProcessFunction):
        def open(self, ctx):
            ctx.call_async(Service().fetch, 1, 2)

        def process_element(self, value, ctx):
            pass

    with pytest.raises(JobFailure) as info:
        run_keyed([Record("a", 1)], InOpen())
    assert isinstance(info.value.__cause__, RuntimeError)
    op = KeyedProcessOperator(Enrich(Service()), MemoryBackend())
    with pytest.raises(RuntimeError, match="outside a record"):
        op.context.call_async(Service().fetch, 1, 2)
    op.open()
    op.process(Record("a", 1))
    op.finish()
    with pytest.raises(RuntimeError, match="outside a record"):
        op.context.call_async(Service().fetch, 1, 2)
    assert not call_threads()


def test_non_callables_and_non_awaitables_are_type_errors_naming_them():
    def plain(value):
        return value

    class NotCallable(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            await ctx.call_async("http://weather", value)

    class NoAwaitable(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            await ctx.call_async(plain, value)

    for function, name in ((NotCallable(), "http://weather"), (NoAwaitable(), "plain")):
        for config in (AecConfig(), SYNC):
            with pytest.raises(JobFailure, match=name) as info:
                run_keyed([Record("a", 1)], function, config=config)
            assert isinstance(info.value.__cause__, TypeError)
    assert not call_threads()


def test_bad_timeout_and_retry_are_refused():
    class Bad(KeyedProcessFunction):
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def process_element(self, value, ctx):
            ctx.call_async(Service().fetch, 1, 2, **self.kwargs)

    cases = (({"timeout": 0}, ValueError, "> 0"), ({"retry": 3}, TypeError, "retry"),
             ({"timeout": "5"}, TypeError, "'5'"), ({"timeout": np.int64(0)}, ValueError, "> 0"),
             ({"timeout": float("nan")}, ValueError, "nan"))  # fmt: skip
    for kwargs, error, text in cases:
        with pytest.raises(JobFailure) as info:
            run_keyed([Record("a", 1)], Bad(**kwargs))
        assert isinstance(info.value.__cause__, error) and text in str(info.value.__cause__)


def test_a_timeout_may_be_any_real_number_of_seconds():
    """numpy scalars and Fractions are seconds like the floats they equal (both builds:
    the compiled one checks nothing before aec's own check)."""

    class Timed(KeyedProcessFunction):
        def __init__(self, timeout):
            self.timeout = timeout

        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_async(Service().fetch, value, 1, timeout=self.timeout))

    for timeout in (np.int64(5), np.float32(5), Fraction(5), 10**400):
        outputs = run_keyed([Record("a", 1)], Timed(timeout)).outputs
        assert outputs[0] == run_keyed([Record("a", 1)], Timed(5.0)).outputs[0]


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_failed_calls_a_function_catches_are_freed_without_the_garbage_collector(config):
    """A call's error, caught by the function (a timeout among them), holds neither its
    future nor its record: no reference cycle per failed call (each held its record's
    objects for the GC)."""
    async def flaky(value):
        if value % 2:
            raise OSError(f"no {value}")
        if value % 4 == 0:
            await asyncio.sleep(1.0)  # times out
        return value

    class Catches(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            try:
                ctx.output(await ctx.call_async(flaky, value, timeout=0.01))
            except (OSError, TimeoutError) as error:
                ctx.output(type(error).__name__)

    def run(n: int) -> None:
        result = run_keyed([Record(i % 20, i) for i in range(n)], Catches(), config=config)
        assert len([o for o in result.outputs if not isinstance(o, Watermark)]) == n

    # a run leaves a fixed number of objects in cycles (its operator, loop thread);
    # more calls must not add some per call (a failed one added 30 or more)
    assert cyclic_garbage(lambda: run(120)) - cyclic_garbage(lambda: run(40)) < 60


async def _down(x):
    if x == 2:
        raise ValueError("service down")
    return x * 10


class ComposesACall(KeyedProcessFunction):
    """A failed call composed into a chain (``then_compose``) or combined
    (``combine_all``), with no further callback: the chain consumed it."""

    def __init__(self, how: str) -> None:
        self.how = how

    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("s"))

    def process_element(self, value, ctx):
        from aec import combine_all

        ctx.output(value)
        if self.how == "compose":
            return self.state.async_value().then_compose(lambda _: ctx.call_async(_down, value))
        try:
            return combine_all([self.state.async_value(), ctx.call_async(_down, value)])
        except Exception:  # a failed call's error is the job's, whenever it shows
            ctx.output("caught")
            return None


@pytest.mark.parametrize("how", ["compose", "combine"])
@pytest.mark.parametrize(
    "config", [SYNC, AecConfig(), AecConfig(buffer_size=1, in_flight_records_limit=1)],
    ids=["sync", "async", "one-by-one"],
)  # fmt: skip
def test_a_failed_call_consumed_by_a_chain_fails_the_job_in_every_mode(how, config):
    source = [Record("a", 1), Record("a", 2), Record("a", 3)]
    with pytest.raises(JobFailure, match="record 2 of key 'a': ValueError: service down"):
        run_keyed(source, ComposesACall(how), config=config)
