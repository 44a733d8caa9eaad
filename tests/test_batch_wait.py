"""Batched async I/O: ``AsyncBatchFunction``, ``batch_wait`` and ``AsyncBatchWaitOperator``
(FLINK-38825): batch sizes, when a partial batch leaves, watermarks as boundaries, order,
results of the wrong length, per-input timeouts and retries, and the crash property."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from typing import Any

import pytest
from engine_helpers import cyclic_garbage
from hypothesis import given, settings
from hypothesis import strategies as st
from test_async_wait_operator import (
    check_segments,
    crash_runs,
    expected_outputs,
    results_of,
    run_with_crashes,
)

from aec import JobFailure, Watermark
from aec.async_io import AsyncBatchFunction, AsyncBatchWaitOperator, AsyncFunction, batch_wait
from aec.retry import FixedDelay

pytestmark = pytest.mark.timeout(120)
MODES = ["ordered", "unordered"]


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aec-async-io-loop")]


class Recording(AsyncBatchFunction):
    """Records every batch (and when it was sent), sleeps a seeded 0-2 ms, answers
    ``results_of`` per input."""

    def __init__(self, seed: int = 0, calls: collections.Counter[Any] | None = None) -> None:
        self.rng = random.Random(seed)
        self.batches: list[list[Any]] = []
        self.sent: list[float] = []
        self.calls = calls if calls is not None else collections.Counter()

    async def async_invoke_batch(self, values):
        self.batches.append(list(values))
        self.sent.append(time.monotonic())
        for value in values:
            self.calls[value] += 1
        await asyncio.sleep(self.rng.random() * 0.002)
        return [results_of(value) for value in values]


def wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.002)


def numbered(n: int) -> list[tuple[int, int]]:
    return [(i, i % 3) for i in range(n)]


# -- batch sizes, order, watermarks ----------------------------------------------------------
@settings(deadline=None)
@given(
    run=crash_runs(),
    mode=st.sampled_from(MODES),
    max_batch_size=st.integers(1, 6),
    capacity=st.integers(1, 10),
    batch_timeout=st.sampled_from([0.0, 0.001, None]),
    seed=st.integers(0, 2**16),
)
def test_batches_never_exceed_max_size_and_order_and_watermarks_hold(
    run, mode, max_batch_size, capacity, batch_timeout, seed
):
    source, _, _ = run
    function = Recording(seed)
    outputs = list(
        batch_wait(source, function, max_batch_size=max_batch_size, batch_timeout=batch_timeout,
                   timeout=10.0, capacity=capacity, mode=mode)
    )  # fmt: skip
    records = [e for e in source if not isinstance(e, Watermark)]
    assert all(1 <= len(b) <= min(max_batch_size, capacity) for b in function.batches)
    assert sorted(v for b in function.batches for v in b) == sorted(records)  # each once
    check_segments(source, outputs)  # exactly once, nothing crosses a watermark
    if mode == "ordered":
        assert outputs == expected_outputs(source)
    assert not loop_threads()


def test_inputs_share_calls():
    function = Recording()
    outputs = list(
        batch_wait(numbered(200), function, max_batch_size=16, batch_timeout=1.0, timeout=10.0,
                   capacity=64)
    )  # fmt: skip
    assert outputs == expected_outputs(numbered(200))
    assert len(function.batches) <= 200 / 8  # mostly full batches of 16
    assert max(len(b) for b in function.batches) == 16


def test_a_partial_batch_leaves_after_batch_timeout_while_the_source_stalls():
    resumed: list[float] = []

    def source():
        yield from numbered(3)
        time.sleep(0.5)  # the mailbox thread is inside the source: it cannot send
        resumed.append(time.monotonic())
        yield from numbered(6)[3:]

    function = Recording()
    started = time.monotonic()
    out = list(batch_wait(source(), function, max_batch_size=10, batch_timeout=0.05,
                          timeout=10.0, capacity=10))  # fmt: skip
    assert out == expected_outputs(numbered(6))
    assert function.batches[0] == numbered(3)
    assert started + 0.05 <= function.sent[0] < resumed[0]  # not before its timeout


def test_a_partial_batch_leaves_after_batch_timeout_between_pushes():
    function = Recording()
    op = AsyncBatchWaitOperator(function, max_batch_size=10, batch_timeout=0.05, timeout=10.0,
                                capacity=10)  # fmt: skip
    op.process((0, 0))
    op.process((1, 1))
    wait_until(lambda: function.batches)  # sent by the loop thread: no operator call needed
    assert function.batches == [[(0, 0), (1, 1)]]
    op.finish()
    assert op.drain_outputs() == expected_outputs([(0, 0), (1, 1)])


def test_a_watermark_and_a_snapshot_send_the_partial_batch_at_once(tmp_path):
    function = Recording()
    op = AsyncBatchWaitOperator(function, max_batch_size=10, batch_timeout=None, timeout=10.0,
                                capacity=10)  # fmt: skip
    op.process((0, 0))
    op.process((1, 1))
    time.sleep(0.05)
    assert function.batches == []  # no time limit: the batch waits for more inputs
    op.process_watermark(Watermark(5))
    wait_until(lambda: function.batches)
    assert function.batches == [[(0, 0), (1, 1)]]
    op.process((2, 2))
    op.snapshot(1, tmp_path)
    wait_until(lambda: len(function.batches) == 2)
    assert function.batches[1] == [(2, 2)]
    op.finish()
    assert op.drain_outputs() == expected_outputs([(0, 0), (1, 1), Watermark(5), (2, 2)])


@pytest.mark.parametrize("mode", MODES)
def test_inputs_right_behind_a_watermark_never_join_the_batch_before_it(mode):
    # the inputs after the watermark arrive while the loop thread may not yet have
    # taken the flushed batch: they must start a batch of their own all the same
    source = [(0, 0), (1, 1), Watermark(5), (2, 2), (3, 3)]
    for _ in range(20):
        function = Recording()
        out = list(batch_wait(source, function, max_batch_size=10, batch_timeout=10.0,
                              timeout=10.0, capacity=10, mode=mode))  # fmt: skip
        assert function.batches == [[(0, 0), (1, 1)], [(2, 2), (3, 3)]]
        check_segments(source, out)
        function = Recording()
        op = AsyncBatchWaitOperator(function, max_batch_size=10, batch_timeout=10.0,
                                    timeout=10.0, capacity=10, mode=mode)  # fmt: skip
        op.open()
        for e in source:
            op.process_watermark(e) if isinstance(e, Watermark) else op.process(e)
        op.finish()
        assert function.batches == [[(0, 0), (1, 1)], [(2, 2), (3, 3)]]
        check_segments(source, op.drain_outputs())
        op.close()


@pytest.mark.parametrize("mode", MODES)
def test_capacity_reached_sends_the_partial_batch(mode):
    function = Recording()
    source = numbered(25)
    out = list(batch_wait(source, function, max_batch_size=100, batch_timeout=None,
                          timeout=10.0, capacity=4, mode=mode))  # fmt: skip
    assert sorted(out) == sorted(expected_outputs(source))
    assert all(len(b) <= 4 for b in function.batches)
    assert sum(len(b) for b in function.batches) == 25


# -- the wrong length, and other misuse ------------------------------------------------------
class ShortBy(AsyncBatchFunction):
    def __init__(self, missing: int) -> None:
        self.missing = missing
        self.batches = 0

    async def async_invoke_batch(self, values):
        self.batches += 1
        results = [[v] for v in values]
        return results[: len(values) - self.missing] + [[0]] * -self.missing


@pytest.mark.parametrize("missing", [1, -2])
def test_a_result_of_the_wrong_length_fails_at_once_naming_the_function_and_lengths(missing):
    function = ShortBy(missing)
    with pytest.raises(JobFailure) as info:
        list(batch_wait(range(4), function, max_batch_size=4, batch_timeout=None, timeout=5.0,
                        capacity=4, retry=FixedDelay(5, 0.001)))  # fmt: skip
    message = str(info.value)
    assert "test_batch_wait.ShortBy.async_invoke_batch" in message
    assert f"returned {4 - missing} results for a batch of 4 inputs" in message
    assert isinstance(info.value.__cause__, ValueError)
    assert function.batches == 1  # no retry
    assert not loop_threads()


def test_results_that_are_not_a_list_fail_at_once():
    class Nothing(AsyncBatchFunction):
        async def async_invoke_batch(self, values):
            return None

    with pytest.raises(JobFailure, match="Nothing.async_invoke_batch returned None"):
        list(batch_wait([1, 2], Nothing(), max_batch_size=2, batch_timeout=None, timeout=5.0,
                        capacity=2, retry=FixedDelay(3, 0.001)))  # fmt: skip


def test_a_set_of_results_fails_at_once_it_has_no_order_to_pair_them_with_inputs():
    class Unordered(AsyncBatchFunction):
        async def async_invoke_batch(self, values):
            return {(f"row-for-{v}",) for v in values}  # right length, arbitrary order

    with pytest.raises(JobFailure, match="Unordered.async_invoke_batch returned {") as failure:
        list(batch_wait("abcd", Unordered(), max_batch_size=4, batch_timeout=None,
                        timeout=None, capacity=4))  # fmt: skip
    assert type(failure.value.__cause__).__name__ == "BatchResultError"


class Abort(BaseException):
    """Not an Exception: a user's own, like KeyboardInterrupt or SystemExit."""


class Aborting(AsyncBatchFunction):
    async def async_invoke_batch(self, values):
        raise Abort("the service told us to stop")


def test_a_base_exception_of_the_batch_function_fails_the_job_and_does_not_hang():
    with pytest.raises(JobFailure, match="the service told us to stop") as failure:
        list(batch_wait([1, 2], Aborting(), max_batch_size=2, batch_timeout=0.01,
                        timeout=None, capacity=2, retry=FixedDelay(3, 0.001)))  # fmt: skip
    assert isinstance(failure.value.__cause__, Abort)
    wait_until(lambda: not loop_threads())


def test_an_input_result_that_is_not_iterable_fails_like_a_single_call():
    class Bare(AsyncBatchFunction):
        async def async_invoke_batch(self, values):
            return [v * 2 for v in values]  # forgot the per-input lists

    with pytest.raises(JobFailure, match="takes an iterable of results"):
        list(batch_wait([1, 2], Bare(), max_batch_size=2, batch_timeout=None, timeout=5.0,
                        capacity=2))  # fmt: skip


def test_bad_arguments_are_named():
    class Single(AsyncFunction):
        async def async_invoke(self, value):
            return [value]

    class NotAsync(AsyncBatchFunction):
        def async_invoke_batch(self, values):  # type: ignore[override]
            return [[v] for v in values]

    ok: dict[str, Any] = dict(max_batch_size=4, batch_timeout=0.1, timeout=1.0, capacity=4)
    with pytest.raises(TypeError, match="AsyncBatchFunction"):
        AsyncBatchWaitOperator(Single(), **ok)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async def"):
        AsyncBatchWaitOperator(NotAsync(), **ok)
    with pytest.raises(TypeError, match="must override"):
        AsyncBatchWaitOperator(AsyncBatchFunction(), **ok)
    for name, bad, error in [
        ("max_batch_size", 0, ValueError),
        ("max_batch_size", 2.0, TypeError),
        ("batch_timeout", -1, ValueError),
        ("batch_timeout", float("nan"), ValueError),
        ("timeout", 0, ValueError),
        ("capacity", 0, ValueError),
    ]:
        with pytest.raises(error, match=name):
            AsyncBatchWaitOperator(Recording(), **{**ok, name: bad})
    with pytest.raises(ValueError, match="mode"):
        AsyncBatchWaitOperator(Recording(), **ok, mode="key_ordered")


# -- timeouts and retries, per input ---------------------------------------------------------
class SlowFor(AsyncBatchFunction):
    """Hangs on a batch holding ``slow`` (recording its cancellation); a fallback per
    input that times out."""

    def __init__(self, slow: Any) -> None:
        self.slow = slow
        self.cancelled = threading.Event()

    async def async_invoke_batch(self, values):
        if self.slow in values:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return [[v] for v in values]

    def timeout(self, value, result_future):
        result_future.complete([("timed out", value)])


def test_inputs_of_a_hanging_batch_time_out_one_by_one_and_the_call_is_cancelled():
    function = SlowFor(slow=5)
    out = list(batch_wait(range(8), function, max_batch_size=2, batch_timeout=0.01,
                          timeout=0.3, capacity=8))  # fmt: skip
    assert out == [0, 1, 2, 3, ("timed out", 4), ("timed out", 5), 6, 7]  # [4, 5] was a batch
    assert function.cancelled.wait(2.0)  # no input waits for it any more


def test_the_timeout_counts_from_admission_not_from_the_batch_call():
    function = Recording()
    op = AsyncBatchWaitOperator(function, max_batch_size=10, batch_timeout=None, timeout=0.1,
                                capacity=10)  # fmt: skip
    op.process((0, 0))
    time.sleep(0.2)  # the batch is still held (no time limit, the operator not sleeping)
    with pytest.raises(JobFailure) as info:
        op.finish()
    assert isinstance(info.value.__cause__, TimeoutError)


class FailsOnce(AsyncBatchFunction):
    """The first batch holding ``bad`` fails as a whole; every batch is recorded."""

    def __init__(self, bad: Any) -> None:
        self.bad = bad
        self.failed = False
        self.batches: list[list[Any]] = []

    async def async_invoke_batch(self, values):
        self.batches.append(list(values))
        await asyncio.sleep(0.001)
        if self.bad in values and not self.failed:
            self.failed = True
            raise ConnectionError("the service dropped the request")
        return [[v * 10] for v in values]


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_batch_retries_each_input_and_retried_inputs_travel_together(mode):
    function = FailsOnce(bad=2)
    out = list(batch_wait(range(12), function, max_batch_size=4, batch_timeout=0.005,
                          timeout=10.0, capacity=12, mode=mode, retry=FixedDelay(3, 0.05)))  # fmt: skip
    assert sorted(out) == [v * 10 for v in range(12)]
    if mode == "ordered":
        assert out == [v * 10 for v in range(12)]
    calls = collections.Counter(v for b in function.batches for v in b)
    first = function.batches[0]
    assert 2 in first and len(first) > 1
    assert all(calls[v] == (2 if v in first else 1) for v in range(12))
    retried = [b for b in function.batches[1:] if set(b) & set(first)]
    assert any(len(b) > 1 for b in retried)  # a retried input travelled with others


def test_retry_on_result_retries_only_that_input():
    seen: collections.Counter[int] = collections.Counter()

    class EmptyOnce(AsyncBatchFunction):
        async def async_invoke_batch(self, values):
            for v in values:
                seen[v] += 1
            return [[] if v == 3 and seen[v] == 1 else [v] for v in values]

    retry = FixedDelay(3, 0.01, retry_on_result=lambda results: results == [])
    out = list(batch_wait(range(6), EmptyOnce(), max_batch_size=6, batch_timeout=None,
                          timeout=10.0, capacity=6, retry=retry))  # fmt: skip
    assert out == list(range(6))
    assert seen == {0: 1, 1: 1, 2: 1, 3: 2, 4: 1, 5: 1}


def test_retries_exhausted_fail_the_job_naming_the_input():
    class Always(AsyncBatchFunction):
        async def async_invoke_batch(self, values):
            raise ConnectionError("down")

    with pytest.raises(JobFailure, match=r"input 1 after 2 attempt\(s\)") as info:
        list(batch_wait([1], Always(), max_batch_size=2, batch_timeout=0.0, timeout=5.0,
                        capacity=2, retry=FixedDelay(2, 0.001)))  # fmt: skip
    assert isinstance(info.value.__cause__, ConnectionError)


# -- checkpoints -----------------------------------------------------------------------------
class Hanging(AsyncBatchFunction):
    async def async_invoke_batch(self, values):
        await asyncio.sleep(30)
        return [[v] for v in values]


def test_restore_re_invokes_the_stored_inputs_in_batches(tmp_path):
    op = AsyncBatchWaitOperator(Hanging(), max_batch_size=3, batch_timeout=0.0, timeout=None,
                                capacity=20)  # fmt: skip
    for element in [*numbered(5), Watermark(1), *numbered(8)[5:]]:
        op.process(element)
    handle = op.snapshot(1, tmp_path)
    op.close()
    function = Recording()
    restored = AsyncBatchWaitOperator(function, max_batch_size=3, batch_timeout=0.0,
                                      timeout=None, capacity=20)  # fmt: skip
    restored.restore(handle)
    restored.finish()
    assert restored.drain_outputs() == expected_outputs([*numbered(5), Watermark(1),
                                                         *numbered(8)[5:]])  # fmt: skip
    assert sorted(v for b in function.batches for v in b) == numbered(8)
    assert max(len(b) for b in function.batches) == 3  # in batches, not one by one
    assert restored.metrics["restored_inputs"] == 8
    assert restored.metrics["batches"] == len(function.batches)


def test_restored_inputs_on_either_side_of_a_watermark_never_share_a_batch(tmp_path):
    op = AsyncBatchWaitOperator(Hanging(), max_batch_size=10, batch_timeout=None,
                                timeout=None, capacity=20)  # fmt: skip
    a, b, c, d = numbered(4)
    for element in [a, b, Watermark(5), c, Watermark(6), d]:
        op.process(element)
    handle = op.snapshot(1, tmp_path)
    op.close()
    function = Recording()
    restored = AsyncBatchWaitOperator(function, max_batch_size=10, batch_timeout=None,
                                      timeout=None, capacity=20)  # fmt: skip
    restored.restore(handle)
    restored.finish()
    assert function.batches == [[a, b], [c], [d]]


class SlowToUnwind(AsyncBatchFunction):
    """Its first batch takes 0.2 s to unwind when cancelled; logs every batch call."""

    def __init__(self) -> None:
        self.log: list[tuple[str, list[Any]]] = []

    async def async_invoke_batch(self, values):
        self.log.append(("start", list(values)))
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if values == [1, 2]:
                await asyncio.sleep(0.2)
            raise
        finally:
            self.log.append(("end", list(values)))
        return [[v] for v in values]


def test_close_starts_no_batch_call_while_the_running_ones_unwind():
    """A partial batch whose batch_timeout falls due while close() waits for a
    cancelled call is not sent: no call starts after close() began."""
    function = SlowToUnwind()
    op = AsyncBatchWaitOperator(function, max_batch_size=2, batch_timeout=0.05, timeout=None,
                                capacity=10, mode="unordered")  # fmt: skip
    op.process(1)
    op.process(2)  # a full batch: sent
    op.process(3)  # a partial batch: its batch_timeout runs
    wait_until(lambda: function.log)
    op.close()
    assert function.log == [("start", [1, 2]), ("end", [1, 2])]
    assert not loop_threads()


def batch_operator(seed: int, calls: Any, mode: str, capacity: int) -> AsyncBatchWaitOperator:
    size = 1 + seed % 3
    return AsyncBatchWaitOperator(Recording(seed, calls), max_batch_size=size,
                                  batch_timeout=0.001, timeout=5.0, capacity=capacity,
                                  mode=mode)  # fmt: skip


@settings(deadline=None)
@given(
    run=crash_runs(),
    mode=st.sampled_from(MODES),
    capacity=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_crash_restore_replay_emits_each_output_once(run, mode, capacity, seed, tmp_path_factory):
    source, snapshots, crashes = run
    directory = tmp_path_factory.mktemp("chk")
    outputs, calls = run_with_crashes(
        source, snapshots, crashes, mode, capacity, seed, directory, build=batch_operator
    )
    records = [e for e in source if not isinstance(e, Watermark)]
    assert set(calls) == set(records)  # every input called at least once
    check_segments(source, outputs)  # exactly once, nothing crosses a watermark
    if mode == "ordered":
        assert outputs == expected_outputs(source)
    assert not loop_threads()


def test_a_per_input_checkpoint_restores_into_the_batch_operator(tmp_path):
    from test_async_wait_operator import Held, make

    held = Held()
    op = make(held, "unordered", capacity=8)
    for element in numbered(4):
        op.process(element)
    handle = op.snapshot(1, tmp_path)
    op.close()
    function = Recording()
    restored = AsyncBatchWaitOperator(function, max_batch_size=4, batch_timeout=0.0,
                                      timeout=5.0, capacity=8, mode="unordered")  # fmt: skip
    restored.restore(handle)
    restored.finish()
    assert sorted(restored.drain_outputs()) == sorted(expected_outputs(numbered(4)))
    assert function.batches == [numbered(4)]


# -- edges: a second partial batch, a consumed list, a function's own CancelledError --
def test_every_partial_batch_leaves_after_batch_timeout_not_only_the_first():
    function = Recording()
    operator = AsyncBatchWaitOperator(
        function, max_batch_size=10, batch_timeout=0.05, timeout=None, capacity=100
    )
    operator.open()
    inputs = numbered(3)
    for n, value in enumerate(inputs, start=1):
        operator.process(value)  # each the first input of its batch; nothing else happens
        wait_until(lambda n=n: len(function.batches) == n)
    assert function.batches == [[value] for value in inputs]
    operator.finish()
    assert operator.drain_outputs() == expected_outputs(inputs)


class Consuming(AsyncBatchFunction):
    async def async_invoke_batch(self, values: list[int]) -> list[list[int]]:
        results = []
        while values:  # consumes the list it was given
            results.append([values.pop(0) * 10])
        return results


def test_a_function_may_consume_its_values_list():
    out = list(batch_wait([1, 2, 3], Consuming(), max_batch_size=3, batch_timeout=None,
                          timeout=None, capacity=3))  # fmt: skip
    assert out == [10, 20, 30]


class AwaitsACancelledFuture(AsyncBatchFunction):
    async def async_invoke_batch(self, values: list[int]) -> list[list[int]]:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # CancelledError, though nobody cancelled this call
        return [[v] for v in values]


def test_a_functions_own_cancelled_error_fails_the_job_as_a_single_calls_does():
    with pytest.raises(JobFailure, match="CancelledError"):
        list(batch_wait([1, 2], AwaitsACancelledFuture(), max_batch_size=2,
                        batch_timeout=None, timeout=None, capacity=2))  # fmt: skip


@pytest.mark.parametrize("slow", [False, True], ids=["answered", "timed-out"])
@pytest.mark.parametrize("mode", MODES)
def test_finished_inputs_are_freed_without_the_garbage_collector(mode, slow):
    """An input's objects (its entry, future, batch entry) are freed when its batch call
    finishes, or is cancelled as all its inputs timed out, by reference counting: no
    reference cycle per input."""
    class Plus(AsyncBatchFunction):
        async def async_invoke_batch(self, values):
            if slow and values[0] % 32 == 0:  # some batches never answer in time
                await asyncio.sleep(5)
            return [[v + 1] for v in values]

        def timeout(self, value, result_future):
            result_future.complete([value + 1])

    def run(n: int) -> None:
        outputs = list(batch_wait(range(n), Plus(), max_batch_size=16, batch_timeout=0.01,
                                  timeout=0.05 if slow else 10.0, capacity=256, mode=mode))  # fmt: skip
        assert sorted(outputs) == list(range(1, n + 1))

    # a run leaves a fixed number of objects in cycles (its operator, loop thread);
    # 2,000 more inputs must not add one per input (they added 5 each)
    assert cyclic_garbage(lambda: run(3000)) - cyclic_garbage(lambda: run(1000)) < 200
