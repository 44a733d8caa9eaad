"""``Batcher`` and ``Context.call_batched``: the external calls of every in-flight record of
every key coalesce into batch calls, while same-key order, the in-flight limit,
checkpoints and the synchronous answer hold."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from engine_helpers import cyclic_garbage
from hypothesis import given, settings
from hypothesis import strategies as st

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
from aec.async_io import Batcher
from aec.retry import FixedDelay
from aec.runtime.deadlines import DeadlineFifo
from aec.testing import assert_equivalent
from backends import LatencyBackend, MemoryBackend

pytestmark = pytest.mark.timeout(120)
SYNC = AecConfig(async_state=False)


def call_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aec-call-loop")]


def values_of(outputs: list[Any]) -> list[Any]:
    return [o for o in outputs if not isinstance(o, Watermark)]


class Service:
    """A batch endpoint: records each batch, answers ``arg + 1000`` per argument after
    ``latency`` seconds (a callable of the batch, or a number)."""

    def __init__(self, latency: Any = 0.002) -> None:
        self.latency = latency
        self.batches: list[list[Any]] = []

    async def lookup(self, args: list[Any]) -> list[Any]:
        self.batches.append(list(args))
        delay = self.latency(args) if callable(self.latency) else self.latency
        await asyncio.sleep(delay)
        return [arg + 1000 for arg in args]


class ReadCallWrite(KeyedProcessFunction):
    """Reads a per-key count, looks the value up in a batch, writes the count."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        seen = await self.count.async_value()
        looked_up = await ctx.call_batched(self.batcher, value, timeout=10.0)
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, value, looked_up, seen + 1))


def expected(records: list[Record]) -> dict[Any, list[Any]]:
    per_key: dict[Any, list[Any]] = {}
    for r in records:
        mine = per_key.setdefault(r.key, [])
        mine.append((r.key, r.value, r.value + 1000, len(mine) + 1))
    return per_key


def per_key(outputs: list[Any]) -> dict[Any, list[Any]]:
    grouped: dict[Any, list[Any]] = {}
    for out in values_of(outputs):
        grouped.setdefault(out[0], []).append(out)
    return grouped


def test_calls_of_a_thousand_keys_in_flight_coalesce():
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=32, max_wait=0.05)
    records = [Record(i % 1000, i) for i in range(4000)]
    result = aec.run_keyed(records, ReadCallWrite(batcher))
    assert per_key(result.outputs) == expected(records)
    assert len(service.batches) < len(records) / 16
    assert max(len(b) for b in service.batches) == 32
    assert sorted(a for b in service.batches for a in b) == list(range(4000))
    assert not call_threads()


class Keyed(KeyedProcessFunction):
    """``ReadCallWrite`` made fresh per run by ``assert_equivalent``: deterministic
    results whatever the batches and their completion order."""

    def __init__(self) -> None:
        rng_latency = lambda args: 0.0005 * (sum(args) % 4)  # noqa: E731
        self.inner = ReadCallWrite(
            Batcher(Service(rng_latency).lookup, max_batch_size=8, max_wait=0.001)
        )

    def open(self, ctx):
        self.inner.open(ctx)

    async def process_element(self, value, ctx):
        await self.inner.process_element(value, ctx)


def test_assert_equivalent_holds():
    source = [Record(f"k{i % 7}", i, i) for i in range(80)]
    source.insert(40, Watermark(39))
    assert_equivalent(Keyed, source)


@settings(deadline=None, max_examples=10)
@given(st.data())
def test_assert_equivalent_holds_under_any_completion_order(data):
    keys = data.draw(st.integers(1, 6))
    n = data.draw(st.integers(1, 30))
    source = [Record(i % keys, i, i) for i in range(n)]
    assert_equivalent(Keyed, source, data=data)


def test_synchronous_mode_sends_a_batch_of_one_before_returning():
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=32, max_wait=1.0)
    records = [Record(i % 5, i) for i in range(20)]
    result = aec.run_keyed(records, ReadCallWrite(batcher), config=SYNC)
    assert per_key(result.outputs) == expected(records)
    assert service.batches == [[r.value] for r in records]  # one at a time, in order


def test_same_key_order_holds_with_batches_finishing_out_of_order():
    service = Service(lambda args: 0.02 if args[0] % 2 == 0 else 0.0)
    batcher = Batcher(service.lookup, max_batch_size=2, max_wait=0.0)
    records = [Record(i % 3, i) for i in range(30)]
    result = aec.run_keyed(records, ReadCallWrite(batcher))
    assert per_key(result.outputs) == expected(records)


def test_the_in_flight_limit_bounds_the_batches():
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=32, max_wait=None)
    records = [Record(i, i) for i in range(100)]
    config = AecConfig(in_flight_records_limit=10)
    result = aec.run_keyed(records, ReadCallWrite(batcher), config=config)
    assert per_key(result.outputs) == expected(records)
    assert result.metrics["max_in_flight"] <= 10
    assert max(len(b) for b in service.batches) <= 10  # sent when the limit was reached


def test_a_partial_batch_without_a_time_limit_never_stalls_the_run():
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=1000, max_wait=None)
    records = [Record(i % 3, i) for i in range(5)]
    started = time.monotonic()
    result = aec.run_keyed(records, ReadCallWrite(batcher))
    assert time.monotonic() - started < 5.0
    assert per_key(result.outputs) == expected(records)
    # keys 0, 1, 2 first; 3 and 4 wait for their keys: each batch left when nothing
    # else could run
    assert service.batches == [[0, 1, 2], [3, 4]]


def test_a_partial_batch_leaves_after_max_wait_while_the_operator_is_not_called():
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=100, max_wait=0.05)
    op = KeyedProcessOperator(Guarded(batcher), MemoryBackend())  # calls before any state
    op.open()
    op.process(Record("a", 1))
    op.process(Record("b", 2))
    deadline = time.monotonic() + 5.0
    while not service.batches:  # sent by the loop thread alone
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert service.batches == [[1, 2]]
    op.finish()
    assert sorted(values_of(op.drain_outputs())) == [(1, 1001), (2, 1002)]


def test_a_watermark_and_a_checkpoint_wait_for_the_held_batch(tmp_path):
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=100, max_wait=None)
    backend = MemoryBackend()
    op = KeyedProcessOperator(ReadCallWrite(batcher), backend)
    op.open()
    for i in range(3):
        op.process(Record(i % 2, i))
    op.process_watermark(Watermark(10))  # serial: returns after the watermark left
    out = op.drain_outputs()
    assert out[-1] == Watermark(10) and len(values_of(out)) == 3
    op.process(Record(0, 3))
    handle = op.snapshot(1, tmp_path)  # drains the record, its call included
    assert len(op.drain_outputs()) == 1
    assert service.batches == [[0, 1], [2], [3]]  # record 2 waited for key 0
    op.close()
    restored = KeyedProcessOperator(ReadCallWrite(batcher), MemoryBackend())
    restored.restore(handle)
    restored.process(Record(0, 4))
    restored.finish()
    assert values_of(restored.drain_outputs()) == [(0, 4, 1004, 4)]


def test_a_thread_pool_backend_and_batched_calls_share_the_wait():
    service = Service()
    batcher = Batcher(service.lookup, max_batch_size=16, max_wait=None)
    records = [Record(i % 50, i) for i in range(300)]
    backend = LatencyBackend(MemoryBackend(), latency=0.001)
    result = aec.run_keyed(records, ReadCallWrite(batcher), backend=backend)
    assert per_key(result.outputs) == expected(records)
    assert max(len(b) for b in service.batches) <= 16


# -- timeouts, retries, errors ---------------------------------------------------------------
class Guarded(KeyedProcessFunction):
    """Catches the call's error and outputs it."""

    def __init__(self, batcher: Batcher, **options: Any) -> None:
        self.batcher = batcher
        self.options = options

    async def process_element(self, value, ctx):
        try:
            ctx.output((value, await ctx.call_batched(self.batcher, value, **self.options)))
        except Exception as exc:
            ctx.output((value, type(exc).__name__))


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_an_argument_times_out_alone_and_its_batch_call_is_cancelled(config):
    cancelled = threading.Event()

    async def lookup(args):
        if "slow" in args:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return [f"got {a}" for a in args]

    batcher = Batcher(lookup, max_batch_size=1, max_wait=0.0)
    source = [Record(1, "a"), Record(2, "slow"), Record(3, "b")]
    started = time.monotonic()
    result = aec.run_keyed(source, Guarded(batcher, timeout=0.2), config=config)
    assert time.monotonic() - started < 5.0
    assert sorted(values_of(result.outputs)) == [
        ("a", "got a"), ("b", "got b"), ("slow", "TimeoutError")
    ]  # fmt: skip
    assert cancelled.wait(2.0)


def test_a_failed_batch_retries_each_argument_possibly_with_others():
    batches: list[list[int]] = []
    failed = []

    async def lookup(args):
        batches.append(list(args))
        await asyncio.sleep(0.001)
        if 3 in args and not failed:
            failed.append(True)
            raise ConnectionError("dropped")
        return [a * 2 for a in args]

    batcher = Batcher(lookup, max_batch_size=4, max_wait=0.005)
    source = [Record(i % 5, i) for i in range(20)]
    result = aec.run_keyed(source, Guarded(batcher, retry=FixedDelay(3, 0.03)))
    assert sorted(values_of(result.outputs)) == [(i, i * 2) for i in range(20)]
    first = next(b for b in batches if 3 in b)
    assert len(first) > 1
    later = [b for b in batches[batches.index(first) + 1 :] if set(b) & set(first)]
    assert sorted(a for b in later for a in b if a in first) == sorted(first)  # each once more
    assert any(len(b) > 1 for b in later)


def test_retry_on_result_gets_the_arguments_own_result():
    seen: dict[int, int] = {}

    async def lookup(args):
        for a in args:
            seen[a] = seen.get(a, 0) + 1
        return [None if a == 2 and seen[a] == 1 else a for a in args]

    batcher = Batcher(lookup, max_batch_size=8, max_wait=0.0)
    retry = FixedDelay(3, 0.001, retry_on_result=lambda result: result is None)
    result = aec.run_keyed([Record(i, i) for i in range(5)], Guarded(batcher, retry=retry))
    assert sorted(values_of(result.outputs)) == [(i, i) for i in range(5)]
    assert seen == {0: 1, 1: 1, 2: 2, 3: 1, 4: 1}


def test_an_uncaught_call_error_fails_the_job_naming_the_record():
    async def lookup(args):
        raise LookupError("no such row")

    class Uncaught(KeyedProcessFunction):
        def __init__(self) -> None:
            self.batcher = Batcher(lookup, max_batch_size=4, max_wait=0.0)

        async def process_element(self, value, ctx):
            ctx.output(await ctx.call_batched(self.batcher, value))

    with pytest.raises(JobFailure, match="no such row") as info:
        aec.run_keyed([Record("k", 7)], Uncaught())
    assert info.value.key == "k" and info.value.record == 7
    assert isinstance(info.value.__cause__, LookupError)
    assert not call_threads()


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_a_result_of_the_wrong_length_fails_at_once_even_if_caught(config):
    calls = []

    async def short(args):
        calls.append(list(args))
        return args[:-1]

    batcher = Batcher(short, max_batch_size=4, max_wait=None)
    with pytest.raises(JobFailure) as info:
        aec.run_keyed([Record(i, i) for i in range(4)],
                      Guarded(batcher, retry=FixedDelay(5, 0.001)), config=config)  # fmt: skip
    message = str(info.value)
    assert (
        "test_call_batched.test_a_result_of_the_wrong_length_fails_at_once_even_if_caught"
        in message
    )
    size = len(calls[0])
    assert f"returned {size - 1} results for a batch of {size} inputs" in message
    assert len(calls) == 1  # not retried
    assert not call_threads()


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_a_caught_wrong_length_fails_the_last_record_too(config):
    """Nothing after the record: the failure is not left for a next one to raise."""

    async def empty(args):
        return []

    batcher = Batcher(empty, max_batch_size=4, max_wait=None)
    with pytest.raises(JobFailure, match="record 1 of key 'a'.*returned 0 results"):
        aec.run_keyed([Record("a", 1), Watermark(5.0)], Guarded(batcher), config=config)
    assert not call_threads()


def test_bad_use_is_refused():
    async def lookup(args):
        return args

    with pytest.raises(TypeError, match="callable|async function"):
        Batcher(42, max_batch_size=2, max_wait=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_batch_size"):
        Batcher(lookup, max_batch_size=0, max_wait=0.1)
    with pytest.raises(ValueError, match="max_wait"):
        Batcher(lookup, max_batch_size=2, max_wait=-0.1)
    with pytest.raises(TypeError):
        Batcher(lookup, 2, 0.1)  # type: ignore[misc]  # keywords only

    class Misuse(KeyedProcessFunction):
        def __init__(self, what: str) -> None:
            self.what = what

        def open(self, ctx):
            if self.what == "open":
                ctx.call_batched(Batcher(lookup, max_batch_size=2, max_wait=0.1), 1)

        def process_element(self, value, ctx):
            if self.what == "not a batcher":
                ctx.call_batched(lookup, value)
            elif self.what == "timeout":
                ctx.call_batched(Batcher(lookup, max_batch_size=2, max_wait=0.1), 1, timeout=0)

    for what, error in [
        ("open", RuntimeError),
        ("not a batcher", TypeError),
        ("timeout", ValueError),
    ]:
        with pytest.raises((error, JobFailure)) as info:
            aec.run_keyed([Record("k", 1)], Misuse(what))
        cause = info.value if isinstance(info.value, error) else info.value.__cause__
        assert isinstance(cause, error), (what, info.value)


# -- edges: a second partial batch, a watermark in parallel order, CancelledError -----
def _wait_until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _recording_batcher(max_wait: float | None) -> tuple[Batcher, list[list[int]]]:
    batches: list[list[int]] = []

    async def lookup(args: list[int]) -> list[int]:
        batches.append(list(args))
        return [a + 1000 for a in args]

    return Batcher(lookup, max_batch_size=100, max_wait=max_wait), batches


class CallsBatched(KeyedProcessFunction):
    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher

    async def process_element(self, value: Any, ctx: Any) -> None:
        ctx.output((value, await ctx.call_batched(self.batcher, value)))


def test_every_partial_batch_leaves_after_max_wait_not_only_the_first():
    batcher, batches = _recording_batcher(0.05)
    operator = KeyedProcessOperator(CallsBatched(batcher), MemoryBackend())
    operator.open()
    for n, key in enumerate("abc", start=1):
        operator.process(Record(key, n))  # the first call of its batch; then left alone
        assert _wait_until(lambda n=n: len(batches) == n, 5.0), batches
    operator.finish()
    assert batches == [[1], [2], [3]]


def test_a_watermark_sends_the_partial_batch_in_parallel_order():
    batcher, batches = _recording_batcher(None)  # only full batches or progress send
    operator = KeyedProcessOperator(
        CallsBatched(batcher), MemoryBackend(), AecConfig(watermark_order="parallel")
    )
    operator.open()
    operator.process(Record("a", 1))
    operator.process(Record("b", 2))
    operator.process_watermark(Watermark(10))  # returns at once in parallel order
    assert _wait_until(lambda: batches == [[1, 2]], 5.0), batches
    operator.finish()
    assert sorted(o for o in operator.drain_outputs() if isinstance(o, tuple)) == [
        (1, 1001), (2, 1002)
    ]  # fmt: skip


@pytest.mark.parametrize("async_state", [True, False], ids=["async", "sync"])
def test_a_batch_functions_own_cancelled_error_fails_the_job(async_state):
    async def lookup(args: list[int]) -> list[int]:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # CancelledError, though nobody cancelled this call
        return args

    batcher = Batcher(lookup, max_batch_size=3, max_wait=0.0)
    with pytest.raises(JobFailure, match="CancelledError"):
        aec.run_keyed(
            [Record(i, i) for i in range(3)], CallsBatched(batcher),
            config=AecConfig(async_state=async_state),
        )  # fmt: skip


# -- timeouts: one deadline FIFO per batcher (aec.runtime.deadlines) -------------------------
class TimedCalls(KeyedProcessFunction):
    """``call_batched`` with the record's own timeout (``value = (arg, timeout)``); a
    failure is output as ``"Type: message"``."""

    def __init__(self, batcher: Batcher, **options: Any) -> None:
        self.batcher = batcher
        self.options = options

    async def process_element(self, value, ctx):
        arg, timeout = value
        try:
            result = await ctx.call_batched(self.batcher, arg, timeout=timeout, **self.options)
        except Exception as exc:
            result = f"{type(exc).__name__}: {exc}"
        ctx.output((arg, result))


def _hold_until(released: threading.Event, cancelled: dict[Any, float], args: list[Any]):
    """A batch call that answers when ``released`` is set, noting when it is cancelled."""

    async def held() -> list[Any]:
        try:
            while not released.is_set():
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            for arg in args:
                cancelled[arg] = time.monotonic()
            raise
        return [f"got {arg}" for arg in args]

    return held()


def test_of_many_calls_with_one_timeout_only_the_late_ones_time_out():
    async def lookup(args: list[Any]) -> list[Any]:
        if any(isinstance(arg, str) for arg in args):
            await asyncio.sleep(30)  # "slow-i": never answers, cancelled when all time out
        await asyncio.sleep(0.7)  # the others: in flight when the slow ones time out
        return [arg + 1000 for arg in args]

    batcher = Batcher(lookup, max_batch_size=8, max_wait=0.0)
    op = KeyedProcessOperator(TimedCalls(batcher), MemoryBackend())
    op.open()
    started = time.monotonic()
    for i in range(10):
        op.process(Record(f"s{i}", (f"slow-{i}", 1.0)))  # time out at about 1.0 s
    time.sleep(0.5)
    for i in range(90):
        op.process(Record(i, (i, 1.0)))  # answered at about 1.2 s, deadlines at 1.5 s
    op.finish()
    assert time.monotonic() - started < 10.0
    outputs = dict(values_of(op.drain_outputs()))
    assert len(outputs) == 100
    for i in range(10):
        message = outputs.pop(f"slow-{i}")
        assert message.startswith(f"TimeoutError: call_batched('slow-{i}') of ")
        assert message.endswith("timed out after 1 s")
    assert outputs == {i: i + 1000 for i in range(90)}  # no spurious timeout
    assert op.external_calls.deadline_entries == 0


def test_a_shorter_timeout_given_after_longer_ones_times_out_at_its_own_deadline():
    released = threading.Event()
    cancelled: dict[Any, float] = {}

    def lookup(args: list[Any]) -> Any:
        return _hold_until(released, cancelled, args)

    batcher = Batcher(lookup, max_batch_size=1, max_wait=0.0)  # a batch call per argument
    op = KeyedProcessOperator(TimedCalls(batcher), MemoryBackend())
    op.open()
    try:
        for i in range(20):
            op.process(Record(i, (f"long-{i}", 30.0)))
        called = time.monotonic()
        op.process(Record("s", ("short", 0.3)))
        op.process(Record(99, ("long-99", 30.0)))  # after the short one: in order again
        assert _wait_until(lambda: "short" in cancelled, 5.0)
        assert 0.3 <= cancelled["short"] - called < 3.0
        assert list(cancelled) == ["short"]  # the longer timeouts still run
    finally:
        released.set()
    op.finish()
    outputs = dict(values_of(op.drain_outputs()))
    assert outputs.pop("short") == (
        f"TimeoutError: call_batched('short') of {__name__}."
        "test_a_shorter_timeout_given_after_longer_ones_times_out_at_its_own_deadline."
        "<locals>.lookup timed out after 0.3 s"
    )
    assert outputs == {f"long-{i}": f"got long-{i}" for i in [*range(20), 99]}


def test_finished_calls_do_not_keep_the_timeouts_growing():
    # 10,000 calls answered at once behind one that stays in flight (the FIFO's head):
    # their finished timeouts cannot leave from the head, yet stay bounded
    held_entries: list[int] = []
    answered = [0]

    async def lookup(args: list[Any]) -> list[Any]:
        held_entries.append(op.external_calls.deadline_entries)  # on the loop thread
        if "first" in args:
            while answered[0] < 10_000:
                await asyncio.sleep(0.005)
        answered[0] += len(args)
        return [f"got {arg}" for arg in args]

    batcher = Batcher(lookup, max_batch_size=20, max_wait=0.001)
    config = AecConfig(in_flight_records_limit=100)
    op = KeyedProcessOperator(TimedCalls(batcher), MemoryBackend(), config)
    op.open()
    op.process(Record("first", ("first", 60.0)))
    assert _wait_until(lambda: held_entries, 5.0)  # its batch call is its own
    for i in range(10_000):
        op.process(Record(i, (i, 60.0)))
    op.finish()
    outputs = dict(values_of(op.drain_outputs()))
    assert outputs == {arg: f"got {arg}" for arg in ["first", *range(10_000)]}
    assert len(held_entries) > 100
    # live timeouts <= 100 (the in-flight limit): at most 2 * 100 + a margin of 64 held
    assert max(held_entries) <= 2 * 100 + 64 + 1, max(held_entries)
    assert op.external_calls.deadline_entries == 0  # the last one out took the rest


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
@pytest.mark.parametrize("delay", [10.0, 0.02], ids=["backoff-past-deadline", "many-retries"])
def test_a_retried_call_times_out_during_its_backoff(config, delay):
    calls: list[Any] = []

    async def lookup(args: list[Any]) -> list[Any]:
        calls.extend(args)
        raise ConnectionError("down")

    batcher = Batcher(lookup, max_batch_size=4, max_wait=0.0)
    source = [Record(i, (i, 0.3)) for i in range(3)]
    started = time.monotonic()
    result = aec.run_keyed(source, TimedCalls(batcher, retry=FixedDelay(100, delay)), config=config)
    assert 0.3 <= time.monotonic() - started < 5.0
    outputs = dict(values_of(result.outputs))
    assert sorted(outputs) == [0, 1, 2]
    assert all(o.startswith("TimeoutError: call_batched(") for o in outputs.values()), outputs
    if delay > 1:  # a backoff that would reach the deadline: no retry, the timeout ends it
        assert sorted(calls) == [0, 1, 2]
    else:
        assert 3 < len(calls) < 3 * 100


def test_the_deadline_fifo_expires_in_deadline_order_behind_one_timer():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fifo = DeadlineFifo()
        fired: list[tuple[str, float]] = []

        class Owner:
            def __init__(self, name: str) -> None:
                self.name = name

            def time_out(self) -> None:
                fired.append((self.name, loop.time()))

        armed: list[float] = []  # the asyncio timers armed, by their times
        call_at = loop.call_at

        def counted(when: float, *args: object, **kwargs: object) -> asyncio.TimerHandle:
            armed.append(when)
            return call_at(when, *args, **kwargs)  # type: ignore[arg-type]

        loop.call_at = counted  # type: ignore[method-assign]
        now = loop.time()
        due = {"a": now + 0.05, "b": now + 0.1, "c": now + 0.15, "early": now + 0.02}
        deadlines = {name: fifo.add(when, Owner(name)) for name, when in due.items()}
        assert len(fifo) == 3 and fifo.live == 3  # "early" came out of order: own timer
        assert armed == [due["a"], due["early"]]  # the FIFO's timer and early's
        fifo.discard(deadlines["b"])
        fifo.discard(deadlines["b"])  # again: nothing
        assert len(fifo) == 3 and fifo.live == 2  # dead, not at the head: stays
        await asyncio.sleep(0.3)
        assert [name for name, _ in fired] == ["early", "a", "c"]
        assert all(at >= due[name] for name, at in fired)
        assert len(fifo) == 0 and fifo.live == 0
        fifo.discard(deadlines["a"])  # after it fired: nothing

        armed.clear()
        head = fifo.add(loop.time() + 60, Owner("head"))
        for i in range(10_000):
            fifo.discard(fifo.add(loop.time() + 60, Owner(str(i))))
            assert len(fifo) <= 2 * fifo.live + 64
        assert len(armed) == 1  # the head's: no timer per deadline
        fifo.discard(head)
        assert len(fifo) == 0

    asyncio.run(main())


def test_a_bad_timeout_or_retry_is_refused_after_good_calls_of_the_same_batcher():
    async def lookup(args):
        return args

    batcher = Batcher(lookup, max_batch_size=4, max_wait=0.01)

    class Later(KeyedProcessFunction):
        def __init__(self, bad: dict[str, Any]) -> None:
            self.bad = bad

        async def process_element(self, value, ctx):
            good = value < 3
            kwargs = {"timeout": 5.0} if good else self.bad
            ctx.output(await ctx.call_batched(batcher, value, **kwargs))

    records = [Record("k", i) for i in range(4)]
    for bad, error in [({"timeout": -1.0}, ValueError), ({"retry": 3}, TypeError)]:
        with pytest.raises(JobFailure) as info:
            aec.run_keyed(records, Later(bad))
        assert isinstance(info.value.__cause__, error), (bad, info.value)


def test_finished_batched_calls_are_freed_without_the_garbage_collector():
    """A record's objects (its context, future, completion, batch entry) are freed when
    its call's batch finishes, by reference counting: no reference cycle per call."""
    async def lookup(args):
        return [a + 1 for a in args]

    def run(n: int) -> None:
        batcher = Batcher(lookup, max_batch_size=16, max_wait=0.01)
        result = aec.run_keyed([Record(i % 50, i) for i in range(n)], ReadCallWrite(batcher))
        assert len(values_of(result.outputs)) == n

    # a run leaves a fixed number of objects in cycles (its operator, loop thread);
    # 2,000 more records must not add one per record (they added 5 or more each)
    assert cyclic_garbage(lambda: run(3000)) - cyclic_garbage(lambda: run(1000)) < 200


@pytest.mark.parametrize("config", [AecConfig(), SYNC], ids=["async", "sync"])
def test_batched_calls_failing_or_synchronous_are_freed_without_the_garbage_collector(config):
    """A batch call's error the function catches, and a synchronous run's batches of
    one, leave no reference cycle per call."""
    async def lookup(args):
        if args[0] % 3 == 0:
            raise OSError(f"no {args}")
        return [a + 1 for a in args]

    class Catches(KeyedProcessFunction):
        def __init__(self) -> None:
            self.batcher = Batcher(lookup, max_batch_size=4, max_wait=0.001)

        async def process_element(self, value, ctx):
            try:
                ctx.output(await ctx.call_batched(self.batcher, value, timeout=5.0))
            except OSError:
                ctx.output("failed")

    def run(n: int) -> None:
        result = aec.run_keyed([Record(i % 20, i) for i in range(n)], Catches(), config=config)
        assert len(values_of(result.outputs)) == n

    assert cyclic_garbage(lambda: run(600)) - cyclic_garbage(lambda: run(200)) < 100
