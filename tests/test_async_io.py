"""aec.async_io: ordered, unordered and key-ordered waits, retries, timeouts, failure.

Completion order is driven by ``RandomCompleter``: a thread that completes Flink-style
futures in a seeded random order (so completions also cross threads), or by
asyncio-style coroutines with seeded random sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aec import JobFailure, Watermark
from aec.async_io import (
    AsyncFunction,
    AsyncWaitOperator,
    ResultFuture,
    key_ordered_wait,
    ordered_wait,
    unordered_wait,
)
from aec.retry import ExponentialBackoff, FixedDelay, NoRetry, RetryStrategy, empty_result
from aec.retry import exception_type as exception_type_predicate

pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------
def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aec-async-io-loop")]


def results_of(value: int) -> list[Any]:
    """0, 1 or 2 results per input, so empty results are covered."""
    return [(value, i) for i in range(value % 3)]


_STOP = object()


class RandomCompleter:
    """Runs completion callbacks on its own thread, in a seeded random order."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="test-completer", daemon=True)
        self._thread.start()

    def submit(self, complete: Callable[[], None]) -> None:
        self._inbox.put(complete)

    def _run(self) -> None:
        pending: list[Callable[[], None]] = []
        while True:
            try:
                item = self._inbox.get(timeout=0.001) if pending else self._inbox.get()
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if item is not None:
                pending.append(item)
                if self._rng.random() < 0.5:
                    continue  # gather more before completing one
            if pending:
                pending.pop(self._rng.randrange(len(pending)))()

    def close(self) -> None:
        self._inbox.put(_STOP)
        self._thread.join(5)


class Recorder:
    """Shared bookkeeping of test functions (calls come from several threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: list[Any] = []  # values, in call order
        self.active_keys: set[Any] = set()
        self.overlaps: list[Any] = []
        self.opened = 0
        self.closed = 0

    def start(self, value: Any, key: Any = None) -> None:
        with self.lock:
            self.calls.append(value)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if key is not None:
                if key in self.active_keys:
                    self.overlaps.append(value)
                self.active_keys.add(key)

    def end(self, key: Any = None) -> None:
        with self.lock:
            self.in_flight -= 1
            self.active_keys.discard(key)


class ShuffledFlink(AsyncFunction):
    """Flink style: completes ``results_of(v)`` from a RandomCompleter (sometimes inline)."""

    def __init__(self, completer: RandomCompleter, seed: int, key_of=None) -> None:
        self.completer = completer
        self.rng = random.Random(seed)
        self.key_of = key_of
        self.record = Recorder()

    def open(self) -> None:
        self.record.opened += 1

    def close(self) -> None:
        self.record.closed += 1

    def async_invoke(self, value: int, result_future: ResultFuture) -> None:
        key = self.key_of(value) if self.key_of else None
        self.record.start(value, key)

        def complete() -> None:
            self.record.end(key)
            result_future.complete(results_of(value))

        if self.rng.random() < 0.15:
            complete()  # completed inside async_invoke, on the mailbox thread
        else:
            self.completer.submit(complete)


class ShuffledAsyncio(AsyncFunction):
    """asyncio style: sleeps a seeded random 0-2 ms, returns ``results_of(v)``."""

    def __init__(self, seed: int, key_of=None) -> None:
        self.seed = seed
        self.key_of = key_of
        self.record = Recorder()
        self.threads: set[int] = set()

    def open(self) -> None:
        self.record.opened += 1

    def close(self) -> None:
        self.record.closed += 1

    async def async_invoke(self, value: int):
        key = self.key_of(value) if self.key_of else None
        self.record.start(value, key)
        self.threads.add(threading.get_ident())
        await asyncio.sleep(random.Random(self.seed * 1000 + value).random() * 0.002)
        self.record.end(key)
        return results_of(value)


def make_function(style: str, seed: int, key_of=None):
    if style == "flink":
        completer = RandomCompleter(seed)
        return ShuffledFlink(completer, seed, key_of), completer.close
    return ShuffledAsyncio(seed, key_of), lambda: None


@st.composite
def sources(draw, max_size: int = 25) -> list[Any]:
    """Values (ints, repeats allowed) and monotonic watermarks, in any mix."""
    items = draw(st.lists(st.one_of(st.integers(0, 30), st.just("wm")), max_size=max_size))
    source, stamp = [], 0
    for item in items:
        if item == "wm":
            stamp += draw(st.integers(0, 3))  # equal watermarks are allowed
            source.append(Watermark(stamp))
        else:
            source.append(item)
    return source


def split_at_watermarks(elements: list[Any]) -> tuple[list[list[Any]], list[Watermark]]:
    segments: list[list[Any]] = [[]]
    watermarks = []
    for element in elements:
        if isinstance(element, Watermark):
            watermarks.append(element)
            segments.append([])
        else:
            segments[-1].append(element)
    return segments, watermarks


def expected_outputs(source: list[Any]) -> list[Any]:
    return [
        out
        for element in source
        for out in ([element] if isinstance(element, Watermark) else results_of(element))
    ]


class CountingSource:
    """A source that checks, at each pull, that fewer than ``capacity`` elements are
    admitted and not yet emitted (elements each yield exactly one output here)."""

    def __init__(self, elements: list[Any], capacity: int) -> None:
        self.elements = elements
        self.capacity = capacity
        self.pulled = 0
        self.received = 0
        self.max_ahead = 0

    def __iter__(self):
        for element in self.elements:
            self.max_ahead = max(self.max_ahead, self.pulled - self.received)
            assert self.pulled - self.received < self.capacity
            self.pulled += 1
            yield element


styles = st.sampled_from(["flink", "asyncio"])


# -- ordered ---------------------------------------------------------------------------------
@settings(deadline=None)
@given(source=sources(), capacity=st.integers(1, 6), seed=st.integers(0, 2**16), style=styles)
def test_ordered_wait_emits_in_input_order_for_any_completion_order(source, capacity, seed, style):
    function, stop = make_function(style, seed)
    try:
        out = list(ordered_wait(source, function, 5.0, capacity))
    finally:
        stop()
    assert out == expected_outputs(source)
    assert function.record.max_in_flight <= capacity
    assert sorted(function.record.calls) == sorted(v for v in source if type(v) is int)
    assert (function.record.opened, function.record.closed) == (1, 1)
    assert not loop_threads()


class OneEach(AsyncFunction):
    """Flink style, one result per input, completed from a RandomCompleter."""

    def __init__(self, completer: RandomCompleter) -> None:
        self.completer = completer

    def async_invoke(self, value, result_future):
        self.completer.submit(lambda: result_future.complete([value]))


@settings(deadline=None)
@given(
    source=sources(max_size=30),
    capacity=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["ordered", "unordered", "key_ordered"]),
)
def test_capacity_bounds_elements_admitted_and_not_emitted(source, capacity, seed, mode):
    counting = CountingSource(source, capacity)
    completer = RandomCompleter(seed)
    try:
        if mode == "ordered":
            it = ordered_wait(counting, OneEach(completer), 5.0, capacity)
        elif mode == "unordered":
            it = unordered_wait(counting, OneEach(completer), 5.0, capacity)
        else:
            it = key_ordered_wait(
                counting, OneEach(completer), 5.0, capacity, key_selector=lambda v: v % 3
            )
        outputs = []
        for out in it:
            counting.received += 1
            outputs.append(out)
    finally:
        completer.close()
    assert counting.max_ahead <= capacity - 1
    assert len(outputs) == len(source)


# -- unordered -------------------------------------------------------------------------------
@settings(deadline=None)
@given(source=sources(), capacity=st.integers(1, 6), seed=st.integers(0, 2**16), style=styles)
def test_unordered_wait_keeps_every_result_within_its_watermark_segment(
    source, capacity, seed, style
):
    function, stop = make_function(style, seed)
    try:
        out = list(unordered_wait(source, function, 5.0, capacity))
    finally:
        stop()
    in_segments, in_watermarks = split_at_watermarks(source)
    out_segments, out_watermarks = split_at_watermarks(out)
    assert out_watermarks == in_watermarks
    assert len(out_segments) == len(in_segments)
    for inputs, outputs in zip(in_segments, out_segments, strict=True):
        expected = collections.Counter(r for v in inputs for r in results_of(v))
        assert collections.Counter(outputs) == expected
    assert function.record.max_in_flight <= capacity
    assert not loop_threads()


class Sleepy(AsyncFunction):
    """asyncio style: sleeps ``delays[value]`` seconds, returns [value]."""

    def __init__(self, delays: dict[Any, float]) -> None:
        self.delays = delays
        self.record = Recorder()

    async def async_invoke(self, value):
        self.record.start(value)
        await asyncio.sleep(self.delays.get(value, 0.0))
        self.record.end()
        return [value]


def test_unordered_wait_emits_in_completion_order_but_not_across_watermarks():
    function = Sleepy({"slow": 0.15, "fast": 0.0, "after": 0.0})
    out = list(unordered_wait(["slow", "fast", Watermark(1), "after"], function, 2.0, 10))
    assert out == ["fast", "slow", Watermark(1), "after"]


def test_ordered_wait_holds_a_fast_result_behind_a_slow_one():
    function = Sleepy({"slow": 0.1, "fast": 0.0})
    out = list(ordered_wait(["slow", "fast", Watermark(3)], function, 2.0, 10))
    assert out == ["slow", "fast", Watermark(3)]
    assert function.record.max_in_flight == 2  # both ran at once


# -- key-ordered -----------------------------------------------------------------------------
@settings(deadline=None)
@given(
    source=sources(),
    capacity=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    style=styles,
    keys=st.integers(1, 4),
)
def test_key_ordered_wait_serialises_each_key(source, capacity, seed, style, keys):
    def key_of(value):
        return value % keys

    function, stop = make_function(style, seed, key_of)
    try:
        out = list(key_ordered_wait(source, function, 5.0, capacity, key_selector=key_of))
    finally:
        stop()
    values = [v for v in source if type(v) is int]
    record = function.record
    assert record.overlaps == []  # never two calls of one key at once
    for key in range(keys):
        # calls start in input order per key
        assert [v for v in record.calls if key_of(v) == key] == [
            v for v in values if key_of(v) == key
        ]
        # and results leave in input order per key
        assert [r for r in out if not isinstance(r, Watermark) and key_of(r[0]) == key] == [
            r for v in values if key_of(v) == key for r in results_of(v)
        ]
    in_segments, in_watermarks = split_at_watermarks(source)
    out_segments, out_watermarks = split_at_watermarks(out)
    assert out_watermarks == in_watermarks
    for inputs, outputs in zip(in_segments, out_segments, strict=True):
        assert collections.Counter(outputs) == collections.Counter(
            r for v in inputs for r in results_of(v)
        )
    assert record.max_in_flight <= min(capacity, keys)
    assert not loop_threads()


class WaitForPartner(AsyncFunction):
    """Key "a" waits until a call of key "b" has started: only concurrency lets it finish."""

    def __init__(self) -> None:
        self.b_started: asyncio.Event | None = None

    async def async_invoke(self, value):
        if self.b_started is None:
            self.b_started = asyncio.Event()  # created on the loop thread
        if value.startswith("b"):
            self.b_started.set()
        else:
            await asyncio.wait_for(self.b_started.wait(), 1.0)
        return [value]


def test_key_ordered_wait_runs_different_keys_concurrently():
    out = list(
        key_ordered_wait(["a1", "b1"], WaitForPartner(), 2.0, 4, key_selector=lambda v: v[0])
    )
    assert sorted(out) == ["a1", "b1"]


def test_key_ordered_timeout_starts_with_the_call_not_the_admission():
    # two same-key calls of 0.12 s each with a 0.2 s timeout: the second waits 0.12 s for
    # its key, then runs 0.12 s; only a timeout counted from admission would fire
    function = Sleepy({"x1": 0.12, "x2": 0.12})
    out = list(key_ordered_wait(["x1", "x2"], function, 0.2, 4, key_selector=lambda v: v[0]))
    assert out == ["x1", "x2"]
    assert function.record.max_in_flight == 1


def test_key_selector_errors():
    function = Sleepy({})
    with pytest.raises(JobFailure, match="key_selector failed") as info:
        list(key_ordered_wait([1, 0], function, 1.0, 2, key_selector=lambda v: 1 // v))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.record == 0
    with pytest.raises(TypeError, match="None"):
        list(key_ordered_wait([1], Sleepy({}), 1.0, 2, key_selector=lambda v: None))
    with pytest.raises(TypeError, match="unhashable"):
        list(key_ordered_wait([1], Sleepy({}), 1.0, 2, key_selector=lambda v: [v]))
    assert not loop_threads()


# -- retries ---------------------------------------------------------------------------------
class Flaky(AsyncFunction):
    """Flink style: the first ``failures[v]`` attempts of v fail (by exception, or by an
    empty result), later ones give [v]; completions come from a RandomCompleter."""

    def __init__(self, failures: dict[int, int], how: str, completer: RandomCompleter):
        self.failures = failures
        self.how = how
        self.completer = completer
        self.attempts: collections.Counter[int] = collections.Counter()

    def async_invoke(self, value, result_future):
        self.attempts[value] += 1
        failed = self.attempts[value] <= self.failures[value]
        if not failed:
            self.completer.submit(lambda: result_future.complete([value]))
        elif self.how == "exception":
            error = ConnectionError(value)
            self.completer.submit(lambda: result_future.complete_exceptionally(error))
        else:
            self.completer.submit(lambda: result_future.complete([]))


@settings(deadline=None)
@given(
    failures=st.lists(st.integers(0, 4), min_size=1, max_size=8),
    max_attempts=st.integers(1, 4),
    how=st.sampled_from(["exception", "result"]),
    exponential=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_retries_until_success_or_attempts_run_out(failures, max_attempts, how, exponential, seed):
    plan = dict(enumerate(failures))
    predicates: dict[str, Any] = {"retry_on_result": empty_result} if how == "result" else {}
    if exponential:
        strategy: RetryStrategy = ExponentialBackoff(max_attempts, 0.0, 0.001, **predicates)
    else:
        strategy = FixedDelay(max_attempts, 0.0, **predicates)
    completer = RandomCompleter(seed)
    function = Flaky(plan, how, completer)
    exhausted = {v for v, f in plan.items() if f >= max_attempts}
    try:
        if how == "exception" and exhausted:
            with pytest.raises(JobFailure) as info:
                list(ordered_wait(list(plan), function, 5.0, 3, strategy))
            cause = info.value.__cause__
            assert isinstance(cause, ConnectionError)
            assert cause.args[0] in exhausted
            assert info.value.record == cause.args[0]
            assert function.attempts[cause.args[0]] == max_attempts
        else:
            out = list(ordered_wait(list(plan), function, 5.0, 3, strategy))
            # an input whose retries ran out completes with its last (empty) result
            assert out == [v for v in plan if v not in exhausted]
            for value, fails in plan.items():
                assert function.attempts[value] == min(fails + 1, max_attempts)
    finally:
        completer.close()
    assert all(n <= max_attempts for n in function.attempts.values())


class RecordingBackoff(RetryStrategy):
    """A strategy that records which retry numbers it was asked about."""

    def __init__(self, max_attempts: int, delays: list[float]) -> None:
        self.max_attempts = max_attempts
        self.retry_on_exception = None
        self.retry_on_result = None
        self.delays = delays
        self.asked: list[int] = []

    def backoff(self, n: int) -> float:
        self.asked.append(n)
        return self.delays[n - 1]


class AlwaysFails(AsyncFunction):
    """asyncio style: every call raises at once; records when each call started."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    async def async_invoke(self, value):
        self.starts.append(time.monotonic())
        raise ConnectionError(f"attempt {len(self.starts)}")


def test_backoff_is_asked_for_retry_numbers_in_order_and_honoured():
    strategy = RecordingBackoff(4, [0.02, 0.04, 0.06])
    function = AlwaysFails()
    with pytest.raises(JobFailure) as info:
        list(ordered_wait(["v"], function, 2.0, 1, strategy))
    assert strategy.asked == [1, 2, 3]
    assert len(function.starts) == 4
    assert str(info.value.__cause__) == "attempt 4"  # the last attempt's outcome
    gaps = [b - a for a, b in zip(function.starts, function.starts[1:], strict=False)]
    for gap, delay in zip(gaps, [0.02, 0.04, 0.06], strict=True):
        assert gap >= delay - 0.002


def test_exponential_backoff_delays_between_calls():
    function = AlwaysFails()
    with pytest.raises(JobFailure):
        list(ordered_wait(["v"], function, 2.0, 1, ExponentialBackoff(4, 0.02, 0.05)))
    gaps = [b - a for a, b in zip(function.starts, function.starts[1:], strict=False)]
    assert len(gaps) == 3
    for gap, delay in zip(gaps, [0.02, 0.04, 0.05], strict=True):
        assert gap >= delay - 0.002


def test_retry_on_exception_predicate_decides():
    function = AlwaysFails()
    strategy = FixedDelay(5, 0.0, retry_on_exception=exception_type_predicate(ValueError))
    with pytest.raises(JobFailure) as info:
        list(ordered_wait(["v"], function, 2.0, 1, strategy))
    assert len(function.starts) == 1  # ConnectionError is not retried
    assert isinstance(info.value.__cause__, ConnectionError)


def test_no_retry_calls_once():
    function = AlwaysFails()
    with pytest.raises(JobFailure):
        list(ordered_wait(["v"], function, 2.0, 1, NoRetry()))
    assert len(function.starts) == 1


def test_raising_async_invoke_is_a_failed_attempt_and_can_be_retried():
    class RaisesOnce(AsyncFunction):
        calls = 0

        def async_invoke(self, value, result_future):
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("first call")
            result_future.complete([value])

    function = RaisesOnce()
    assert list(ordered_wait([7], function, 1.0, 1, FixedDelay(2, 0.0))) == [7]
    assert function.calls == 2


def test_a_retry_that_would_start_after_the_timeout_is_not_made():
    function = AlwaysFails()
    with pytest.raises(JobFailure) as info:
        list(ordered_wait(["v"], function, 0.2, 1, FixedDelay(5, 0.5)))
    # as in Flink: the backoff waits for the timeout, and the default timeout() fails
    assert isinstance(info.value.__cause__, TimeoutError)
    assert len(function.starts) == 1


def test_a_retry_found_overdue_after_the_deadline_is_not_made():
    # the retry was due before the deadline, but the caller pushed nothing until after
    # it: the retry timer and the timeout are both overdue, and only the timeout counts
    class FailsAtOnce(AsyncFunction):
        def __init__(self) -> None:
            self.calls: list[str] = []

        def async_invoke(self, value, result_future):
            self.calls.append(value)
            if value == "B":
                result_future.complete_exceptionally(ConnectionError("transient"))
            else:
                result_future.complete([value])

        def timeout(self, value, result_future):
            result_future.complete([f"{value}-fallback"])

    function = FailsAtOnce()
    op = AsyncWaitOperator(function, 0.05, 10, retry=FixedDelay(3, 0.01))
    op.process("B")  # fails at once: its retry is due at 0.01 s, its deadline 0.05 s
    time.sleep(0.1)
    op.process("C")
    op.finish()
    assert op.drain_outputs() == ["B-fallback", "C"]
    assert function.calls == ["B", "C"]  # no second call of B after its deadline


def test_a_timeout_during_a_backoff_calls_the_timeout_fallback():
    class FailsWithFallback(AlwaysFails):
        def timeout(self, value, result_future):
            result_future.complete([("fallback", value)])

    function = FailsWithFallback()
    assert list(ordered_wait(["v"], function, 0.2, 1, FixedDelay(5, 0.5))) == [
        ("fallback", "v")
    ]
    assert len(function.starts) == 1


def test_timeout_spans_all_attempts():
    class FailThenHang(AsyncFunction):
        def __init__(self) -> None:
            self.starts: list[float] = []

        async def async_invoke(self, value):
            self.starts.append(time.monotonic())
            if len(self.starts) == 1:
                await asyncio.sleep(0.1)
                raise ConnectionError("first")
            await asyncio.sleep(10)  # the second attempt hangs

    function = FailThenHang()
    started = time.monotonic()
    with pytest.raises(JobFailure) as info:
        list(ordered_wait(["v"], function, 0.3, 1, FixedDelay(5, 0.1)))
    elapsed = time.monotonic() - started
    assert isinstance(info.value.__cause__, TimeoutError)
    assert len(function.starts) == 2
    # 0.3 s from the first call's start; a per-attempt timeout would end near 0.5 s
    assert 0.29 <= elapsed < 0.45
    assert not loop_threads()


@pytest.mark.parametrize("wait", [ordered_wait, unordered_wait])
def test_no_retry_after_timeout_and_a_late_completion_is_dropped(wait):
    class Fallback(AsyncFunction):
        def __init__(self) -> None:
            self.calls: list[Any] = []
            self.timeouts: list[Any] = []
            self.timers: list[threading.Timer] = []

        def async_invoke(self, value, result_future):
            self.calls.append(value)
            if value == "a":  # completes after its 0.2 s timeout, while "b" runs
                later = threading.Timer(0.26, result_future.complete, args=(["a-late"],))
            else:
                later = threading.Timer(0.12, result_future.complete, args=([value],))
            self.timers.append(later)
            later.start()

        def timeout(self, value, result_future):
            self.timeouts.append(value)
            result_future.complete([])  # empty: retried if retries after timeout existed

    function = Fallback()
    strategy = FixedDelay(10, 0.0, retry_on_result=empty_result)
    try:
        # capacity 1: "b" starts when "a" left at 0.2 s and completes at 0.32 s; the
        # late completion of "a" arrives at 0.26 s in between
        out = list(wait(["a", "b"], function, 0.2, 1, strategy))
    finally:
        for timer in function.timers:
            timer.cancel()
    assert out == ["b"]
    assert function.calls == ["a", "b"]
    assert function.timeouts == ["a"]


@settings(deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["ok", "error"]), st.integers(0, 9)), min_size=1, max_size=5
    )
)
def test_only_the_first_completion_counts(calls):
    class Repeats(AsyncFunction):
        def async_invoke(self, value, result_future):
            for kind, n in calls:
                if kind == "ok":
                    result_future.complete([n])
                else:
                    result_future.complete_exceptionally(ValueError(n))

    first_kind, first_n = calls[0]
    if first_kind == "ok":
        assert list(ordered_wait(["v"], Repeats(), 1.0, 1)) == [first_n]
    else:
        with pytest.raises(JobFailure) as info:
            list(ordered_wait(["v"], Repeats(), 1.0, 1))
        assert info.value.__cause__.args == (first_n,)


def test_racing_completions_from_threads_emit_exactly_one():
    class Racing(AsyncFunction):
        def async_invoke(self, value, result_future):
            barrier = threading.Barrier(4)

            def complete(i: int) -> None:
                barrier.wait()
                result_future.complete([(value, i)])

            for i in range(4):
                threading.Thread(target=complete, args=(i,)).start()

    out = list(unordered_wait(range(20), Racing(), 2.0, 5))
    assert sorted(v for v, _ in out) == list(range(20))


# -- timeouts --------------------------------------------------------------------------------
class Hangs(AsyncFunction):
    """asyncio style: never finishes (until cancelled); records cancellations."""

    def __init__(self) -> None:
        self.cancelled: list[Any] = []
        self.closed = False

    async def async_invoke(self, value):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.append(value)
            raise
        return [value]

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("wait", [ordered_wait, unordered_wait])
def test_default_timeout_fails_the_job_with_timeout_error(wait):
    function = Hangs()
    started = time.monotonic()
    with pytest.raises(JobFailure) as info:
        list(wait([1, 2, 3], function, 0.1, 3))
    assert time.monotonic() - started < 1.0
    assert isinstance(info.value.__cause__, TimeoutError)
    assert info.value.record in (1, 2, 3)
    assert "timed out" in str(info.value)
    assert function.closed
    assert sorted(function.cancelled) == [1, 2, 3]  # stopping the loop cancelled them
    assert not loop_threads()


def test_timeout_override_gives_a_fallback_and_cancels_the_coroutine():
    class WithFallback(Hangs):
        def timeout(self, value, result_future):
            result_future.complete([("fallback", value)])

    function = WithFallback()
    out = list(ordered_wait([1, Watermark(1), 2], function, 0.05, 4))
    assert out == [("fallback", 1), Watermark(1), ("fallback", 2)]
    assert sorted(function.cancelled) == [1, 2]


def test_timeout_that_does_not_complete_fails_clearly():
    class Forgets(Hangs):
        def timeout(self, value, result_future):
            pass

    with pytest.raises(JobFailure, match="without completing") as info:
        list(ordered_wait([1], Forgets(), 0.05, 1))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_timeout_that_raises_fails_the_job():
    class Raises(Hangs):
        def timeout(self, value, result_future):
            raise KeyError("no fallback")

    with pytest.raises(JobFailure) as info:
        list(ordered_wait([1], Raises(), 0.05, 1))
    assert isinstance(info.value.__cause__, KeyError)


# -- failure and lifecycle -------------------------------------------------------------------
class Boom(AsyncFunction):
    """asyncio style: value "boom" raises, others take ``delay`` seconds."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.events: list[str] = []

    def open(self) -> None:
        self.events.append("open")

    def close(self) -> None:
        self.events.append("close")

    async def async_invoke(self, value):
        self.events.append(f"call {value}")
        if value == "boom":
            raise ValueError("bad value")
        await asyncio.sleep(self.delay)
        return [value]


@pytest.mark.parametrize(
    "wait",
    [
        ordered_wait,
        unordered_wait,
        lambda *args: key_ordered_wait(*args, key_selector=lambda v: v),
    ],
)
def test_failure_raises_job_failure_quickly_and_stops_everything(wait):
    function = Boom(delay=20.0)  # the other calls would take 20 s
    started = time.monotonic()
    with pytest.raises(JobFailure) as info:
        list(wait(["a", "boom", "c"], function, 30.0, 5))
    assert time.monotonic() - started < 2.0
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.record == "boom"
    assert "'boom'" in str(info.value)
    assert function.events[0] == "open" and function.events[-1] == "close"
    assert not loop_threads()


def test_flink_style_exception_fails_the_job():
    class Completes(AsyncFunction):
        def async_invoke(self, value, result_future):
            if value == 2:
                raise RuntimeError("client down")
            result_future.complete([value])

    outputs = []
    with pytest.raises(JobFailure) as info:
        for out in ordered_wait([1, 2, 3], Completes(), 1.0, 1):
            outputs.append(out)
    assert outputs == [1]
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.record == 2


@pytest.mark.parametrize(
    "bad", [None, "abc", b"abc", 42], ids=["none", "str", "bytes", "not-iterable"]
)
def test_completing_with_a_non_iterable_fails_without_retry(bad):
    class Bad(AsyncFunction):
        calls = 0

        async def async_invoke(self, value):
            self.calls += 1
            return bad

    function = Bad()
    with pytest.raises(JobFailure, match="iterable of results") as info:
        list(ordered_wait([1], function, 1.0, 1, FixedDelay(3, 0.0)))
    assert isinstance(info.value.__cause__, TypeError)
    assert function.calls == 1


def test_complete_exceptionally_with_a_non_exception_fails_clearly():
    class Bad(AsyncFunction):
        def async_invoke(self, value, result_future):
            result_future.complete_exceptionally("oops")

    with pytest.raises(JobFailure, match="exception instance"):
        list(ordered_wait([1], Bad(), 1.0, 1))


def test_open_and_close_order_and_lazy_start():
    function = Boom()
    it = ordered_wait(["x", "y"], function, 1.0, 2)
    assert function.events == []  # nothing runs before the first next()
    assert list(it) == ["x", "y"]
    assert function.events[0] == "open"
    assert function.events[-1] == "close"
    assert sorted(function.events[1:-1]) == ["call x", "call y"]


def test_open_failure_fails_the_job_and_still_closes():
    class BadOpen(Boom):
        def open(self) -> None:
            raise OSError("no connection")

    function = BadOpen()
    with pytest.raises(JobFailure, match="open") as info:
        list(ordered_wait([1], function, 1.0, 1))
    assert isinstance(info.value.__cause__, OSError)
    assert function.events == ["close"]


def test_close_failure_fails_the_job():
    class BadClose(Boom):
        def close(self) -> None:
            raise OSError("close failed")

    with pytest.raises(JobFailure, match="close") as info:
        list(ordered_wait(["a"], BadClose(), 1.0, 1))
    assert isinstance(info.value.__cause__, OSError)


def test_abandoning_the_iterator_closes_the_function_and_stops_the_loop():
    class Mixed(Boom):
        async def async_invoke(self, value):
            await asyncio.sleep(0 if value == "fast" else 10)
            return [value]

    function = Mixed()
    it = unordered_wait(["fast", "x", "y"], function, 20.0, 3)
    started = time.monotonic()
    assert next(it) == "fast"
    it.close()
    assert time.monotonic() - started < 2.0
    assert function.events == ["open", "close"]
    assert not loop_threads()
    function = Boom()
    it = ordered_wait(["a", "b"], function, 1.0, 2)
    assert next(it) == "a"
    del it  # garbage collection closes the generator too
    assert function.events[-1] == "close"
    assert not loop_threads()


def test_source_errors_propagate_after_cleanup():
    def source():
        yield "a"
        raise LookupError("source broke")

    function = Boom()
    with pytest.raises(LookupError, match="source broke"):
        list(ordered_wait(source(), function, 1.0, 2))
    assert function.events[-1] == "close"
    assert not loop_threads()


def test_regressing_watermark_is_rejected():
    with pytest.raises(ValueError, match="backwards"):
        list(ordered_wait([Watermark(5), 1, Watermark(4)], Boom(), 1.0, 4))
    with pytest.raises(TypeError, match="watermark timestamp"):
        list(ordered_wait([Watermark("x")], Boom(), 1.0, 4))


# -- output shape and threads ----------------------------------------------------------------
def test_end_of_input_emits_no_extra_watermark_and_empty_source_works():
    assert list(ordered_wait([1, 2], Boom(), 1.0, 2)) == [1, 2]
    assert list(unordered_wait([], Boom(), 1.0, 2)) == []
    assert list(ordered_wait([Watermark(1)], Boom(), 1.0, 1)) == [Watermark(1)]


def test_flink_style_runs_on_the_caller_thread_and_starts_no_loop():
    seen = []

    class Inline(AsyncFunction):
        def async_invoke(self, value, result_future):
            seen.append((threading.get_ident(), [t.name for t in loop_threads()]))
            result_future.complete([value])

    assert list(unordered_wait(range(5), Inline(), 1.0, 2)) == list(range(5))
    assert {ident for ident, _ in seen} == {threading.get_ident()}
    assert all(names == [] for _, names in seen)


def test_asyncio_style_runs_on_one_loop_thread_off_the_caller_thread():
    function = ShuffledAsyncio(seed=1)
    during = []
    for _ in ordered_wait(range(1, 30), function, 2.0, 8):
        during.append(len(loop_threads()))
    assert len(function.threads) == 1
    assert threading.get_ident() not in function.threads
    assert max(during) == 1
    assert not loop_threads()


def test_results_are_copied_when_completed():
    class Mutates(AsyncFunction):
        def async_invoke(self, value, result_future):
            results = [value]
            result_future.complete(results)
            results.append("changed later")

    assert list(ordered_wait([1, 2], Mutates(), 1.0, 1)) == [1, 2]


def test_generators_as_results():
    class Gen(AsyncFunction):
        def async_invoke(self, value, result_future):
            result_future.complete(x for x in range(value))

    assert list(ordered_wait([3, 0, 2], Gen(), 1.0, 2)) == [0, 1, 2, 0, 1]


# -- argument validation ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"capacity": 0}, ValueError, "capacity must be >= 1"),
        ({"capacity": 2.5}, TypeError, "capacity must be an int"),
        ({"capacity": True}, TypeError, "capacity"),
        ({"timeout": 0}, ValueError, "timeout must be > 0"),
        ({"timeout": -1.0}, ValueError, "timeout"),
        ({"timeout": float("nan")}, ValueError, "timeout"),
        ({"timeout": "1s"}, TypeError, "timeout must be a number"),
        ({"retry": 3}, TypeError, "retry must be an aec.retry strategy"),
    ],
)
def test_bad_arguments_are_rejected_at_the_call(kwargs, error, match):
    arguments = {"timeout": 1.0, "capacity": 2} | kwargs
    for wait in (ordered_wait, unordered_wait):
        with pytest.raises(error, match=match):
            wait([1], Boom(), **arguments)
    with pytest.raises(error, match=match):
        key_ordered_wait([1], Boom(), **arguments, key_selector=lambda v: v)


@pytest.mark.parametrize("source", [5, None])
def test_a_source_that_is_no_iterable_is_rejected_at_the_call(source):
    for wait in (ordered_wait, unordered_wait):
        with pytest.raises(TypeError, match="source must be an iterable"):
            wait(source, Boom(), 1.0, 2)
    with pytest.raises(TypeError, match="source must be an iterable"):
        key_ordered_wait(source, Boom(), 1.0, 2, key_selector=lambda v: v)
    assert not loop_threads()


def test_bad_functions_and_selectors_are_rejected_at_the_call():
    with pytest.raises(TypeError, match="AsyncFunction"):
        ordered_wait([1], object(), 1.0, 1)

    class WrongFlink(AsyncFunction):
        def async_invoke(self, value):  # Flink style needs result_future
            pass

    class WrongAsyncio(AsyncFunction):
        async def async_invoke(self, value, result_future):
            pass

    with pytest.raises(TypeError, match="Flink style"):
        ordered_wait([1], WrongFlink(), 1.0, 1)
    with pytest.raises(TypeError, match="asyncio style"):
        unordered_wait([1], WrongAsyncio(), 1.0, 1)
    with pytest.raises(TypeError, match="key_selector"):
        key_ordered_wait([1], Boom(), 1.0, 1, key_selector=None)
    with pytest.raises(TypeError):
        key_ordered_wait([1], Boom(), 1.0, 1)  # key_selector is required


def test_flink_style_returning_a_coroutine_is_rejected():
    class Confused(AsyncFunction):
        def async_invoke(self, value, result_future):
            return self.go(value, result_future)

        async def go(self, value, result_future):
            result_future.complete([value])

    with pytest.raises(JobFailure, match="returned a coroutine") as info:
        list(ordered_wait([1], Confused(), 1.0, 1))
    assert isinstance(info.value.__cause__, TypeError)


def test_no_timeout_and_infinite_timeout_mean_none():
    assert list(ordered_wait([1], Boom(), None, 1)) == [1]
    assert list(ordered_wait([1], Boom(), float("inf"), 1)) == [1]


def test_default_async_invoke_is_not_implemented():
    with pytest.raises(JobFailure) as info:
        list(ordered_wait([1], AsyncFunction(), 1.0, 1))
    assert isinstance(info.value.__cause__, NotImplementedError)


class SeesInterpreterSettings(AsyncFunction):
    """Records the GC threshold and GIL switch interval its calls run under."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.seen: list[tuple[int, float]] = []
        self.fail_at = fail_at

    async def async_invoke(self, value: int) -> list[int]:
        import gc
        import sys

        self.seen.append((gc.get_threshold()[0], sys.getswitchinterval()))
        if value == self.fail_at:
            raise RuntimeError(f"call {value} fails")
        return [value]


def test_async_io_runs_under_the_keyed_operators_interpreter_settings(
    default_interpreter_settings,
):
    import gc
    import sys

    interpreter_tuning = default_interpreter_settings
    function = SeesInterpreterSettings()
    assert list(unordered_wait(range(20), function, timeout=10, capacity=4)) != []
    assert function.seen and all(
        threshold == interpreter_tuning.YOUNG_THRESHOLD
        and interval == pytest.approx(interpreter_tuning.SWITCH_INTERVAL)
        for threshold, interval in function.seen
    )
    assert gc.get_threshold()[0] == 700  # restored after the run
    assert sys.getswitchinterval() == pytest.approx(0.005)
    failing = SeesInterpreterSettings(fail_at=3)
    with pytest.raises(JobFailure, match="call 3 fails"):
        list(ordered_wait(range(20), failing, timeout=10, capacity=4))
    assert failing.seen[0][0] == interpreter_tuning.YOUNG_THRESHOLD
    assert gc.get_threshold()[0] == 700  # restored after a failed run too
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert interpreter_tuning._users == 0
