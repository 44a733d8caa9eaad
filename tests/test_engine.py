"""The AEC's mechanisms, one scenario each."""

from __future__ import annotations

import math
import threading
import time

import pytest
from engine_helpers import AsyncCounter, Counter, Logged, ManualExecutor

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    Watermark,
    completed_future,
    run_keyed,
)
from aec.testing import ScriptedExecutor, run_sync
from backends import LatencyBackend, MemoryBackend, RocksDBBackend


def operator(function, executor=None, **config):
    op = KeyedProcessOperator(function, MemoryBackend(), AecConfig(**config), executor)
    op.open()
    return op


def values(outputs):
    return [o for o in outputs if not isinstance(o, Watermark)]


def test_same_key_waits_in_blocking_buffer_until_first_record_finishes():
    log, executor = [], ManualExecutor()
    op = operator(Logged(log), executor, buffer_size=100)
    op.process(Record("a", "a1"))
    op.process(Record("a", "a2"))
    op.process(Record("b", "b1"))
    assert [e for e in log if e[0] == "start"] == [("start", "a", "a1"), ("start", "b", "b1")]
    controller = op.controller
    assert controller.blocking.keys() == ["a"]
    first = controller.keys.holder("a")
    assert first.value == "a1" and first.ref_count > 0
    # a1's read, then its write: only after a1 is fully done may a2 start
    controller.flush()
    executor.complete_all()
    controller.run_available()
    assert ("start", "a", "a2") not in log  # a1's write is buffered, not yet complete
    controller.flush()
    executor.complete_all()
    controller.run_available()
    assert first.ref_count == 0
    assert log.index(("done", "a", "a1")) < log.index(("start", "a", "a2"))
    op.finish()
    outputs = values(op.drain_outputs())
    assert [o for o in outputs if o[0] == "a"] == [("a", "a1"), ("a", "a2")]
    assert ("b", "b1") in outputs
    assert op.controller.in_flight == 0 and not len(op.controller.keys)


def test_different_keys_interleave():
    log, executor = [], ManualExecutor()
    op = operator(Logged(log), executor, buffer_size=100)
    for key in "abcd":
        op.process(Record(key, key + "1"))
    # all four started before any state request completed
    assert [e[1] for e in log if e[0] == "start"] == list("abcd")
    assert not any(e[0] == "done" for e in log)
    assert op.controller.in_flight == 4
    op.finish()
    assert op.controller.in_flight == 0


@pytest.mark.parametrize("limit", [1, 3, 17])
def test_in_flight_limit_holds(limit):
    executor = ManualExecutor()
    op = operator(Counter(), executor, in_flight_records_limit=limit, buffer_size=4)
    seen = []
    for i in range(200):
        op.process(Record(i % 13, i))
        seen.append(op.controller.in_flight)
    op.finish()
    assert max(seen) <= limit
    assert op.metrics["max_in_flight"] <= limit
    assert op.metrics["records_out"] == 200


def test_hot_key_degrades_to_batch_of_one_without_deadlock():
    result = run_keyed(
        [Record("hot", i) for i in range(300)],
        Counter(),
        config=AecConfig(in_flight_records_limit=50, buffer_size=20),
    )
    assert values(result.outputs) == [("hot", n) for n in range(1, 301)]
    assert result.metrics["max_batch_size"] == 1
    assert result.metrics["mean_batch_size"] == 1.0
    assert result.metrics["blocked_requests"] > 0


def test_partial_batch_flushes_after_buffer_timeout():
    executor = ManualExecutor()
    op = operator(Counter(), executor, buffer_size=100, buffer_timeout=0.05)
    op.process(Record("a", 1))
    assert executor.submitted == []  # one request buffered, below buffer_size
    time.sleep(0.08)
    op.process(Record("b", 2))  # the next input finds the buffer timed out
    assert executor.submitted == [1]
    op.finish()


class CallbackTiming(KeyedProcessFunction):
    """Registers callbacks on a future both before and after it completed."""

    def __init__(self, contexts):
        self.contexts = contexts

    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("v"))

    def process_element(self, value, ctx):
        self.contexts.append(self.operator_context())
        future = self.state.async_value()
        future.then_accept(lambda v: ctx.output(("before", v)))  # registered while pending
        done = completed_future(value)
        done.then_accept(lambda v: ctx.output(("inline", v)))  # already complete: runs inline

        def later(v):
            # now `future` is complete: a callback registered now runs inline
            future.then_accept(lambda w: ctx.output(("after", w)))
            return self.state.async_update(value)

        return future.then_compose(later)

    def operator_context(self):
        return self.op.controller.current


@pytest.mark.parametrize("async_state", [True, False])
def test_callbacks_before_and_after_completion_end_at_ref_count_zero(async_state):
    contexts = []
    function = CallbackTiming(contexts)
    op = operator(function, ManualExecutor() if async_state else None, async_state=async_state)
    function.op = op
    op.process(Record("k", 1))
    op.process(Record("k", 2))
    op.finish()
    assert [c.ref_count for c in contexts] == [0, 0]
    if async_state:  # the read is pending at registration: "before" runs on completion
        want = [("inline", 1), ("before", None), ("after", None),
                ("inline", 2), ("before", 1), ("after", 1)]  # fmt: skip
    else:  # synchronous: every future is complete at once, all callbacks run inline
        want = [("before", None), ("inline", 1), ("after", None),
                ("before", 1), ("inline", 2), ("after", 1)]  # fmt: skip
    assert values(op.drain_outputs()) == want
    assert not len(op.controller.keys)


def test_watermark_waits_for_earlier_records_and_its_timers():
    log, executor = [], ManualExecutor()
    op = operator(Logged(log), executor, buffer_size=100, watermark_order="parallel")
    op.process(Record("a", 5))
    op.process_watermark(Watermark(10))  # parallel: returns at once
    assert Watermark(10) not in op.drain_outputs()
    op.controller.flush()
    executor.complete_all()  # a's read
    op.controller.run_available()
    op.controller.flush()
    executor.complete_all()  # a's write: record done, the timer at 5 fires
    op.controller.run_available()
    assert ("timer", "a", 5) in log
    out = op.drain_outputs()
    assert Watermark(10) not in out  # its timer's state read is still pending
    op.controller.flush()
    executor.complete_all()
    op.controller.run_available()
    out += op.drain_outputs()
    assert out[-1] == Watermark(10)
    assert out.index(("timer", "a", 5, [5])) < out.index(Watermark(10))
    op.finish()


def test_serial_mode_holds_later_records_until_watermark_left():
    log = []
    result = run_keyed(
        [Record("a", 1), Record("b", 2), Watermark(3), Record("c", 4), Record("a", 9)],
        Logged(log),
        config=AecConfig(buffer_size=10, watermark_order="serial"),
    )
    outputs = result.outputs
    w = outputs.index(Watermark(3))
    assert set(map(str, outputs[:w])) == set(
        map(str, [("a", 1), ("b", 2), ("timer", "a", 1, [1]), ("timer", "b", 2, [2])])
    )
    assert log.index(("timer-done", "b", 2)) < log.index(("start", "c", 4))
    assert outputs[-1] == Watermark(math.inf)


def test_timer_waits_for_in_flight_record_of_its_key():
    log, executor = [], ManualExecutor()
    op = operator(Logged(log), executor, buffer_size=100, watermark_order="parallel")
    op.process(Record("a", 1))  # registers a timer at 1
    op.process_watermark(Watermark(2))
    op.process(Record("a", 100))  # after the watermark, same key: queued behind a/1
    op.finish()  # drains: a/1 done -> key to a/100 -> the timer waits for it
    assert log.index(("done", "a", 100)) < log.index(("timer", "a", 1))
    assert log.index(("done", "a", 1)) < log.index(("start", "a", 100))


class Boom(Exception):
    pass


class Failing(KeyedProcessFunction):
    def __init__(self, where):
        self.where = where

    def open(self, ctx):
        if self.where == "open":
            raise Boom("in open")
        self.state = ctx.get_state(ValueStateDescriptor("v"))

    def process_element(self, value, ctx):
        if value == "bad" and self.where == "process_element":
            raise Boom("in process_element")
        if value == "bad" and self.where == "callback":
            return self.state.async_value().then_accept(lambda v: 1 / 0)
        if value == "bad" and self.where == "coroutine":
            return self._coroutine()
        ctx.timer_service.register_event_time_timer(1)
        return self.state.async_update(value)

    async def _coroutine(self):
        await self.state.async_value()
        raise Boom("in coroutine")

    def on_timer(self, timestamp, ctx):
        if self.where == "on_timer":
            raise Boom("in on_timer")


@pytest.mark.parametrize("where", ["process_element", "callback", "coroutine", "on_timer", "open"])
@pytest.mark.parametrize("async_state", [True, False])
def test_user_exception_becomes_job_failure(where, async_state):
    source = [Record("good-key", "ok"), Record("bad-key", "bad"), Watermark(5)]
    with pytest.raises(JobFailure) as info:
        run_keyed(source, Failing(where), config=AecConfig(async_state=async_state))
    failure = info.value
    if where == "open":
        assert isinstance(failure.__cause__, Boom)
        return
    assert isinstance(failure.__cause__, (Boom, ZeroDivisionError))
    if where == "on_timer":
        assert "timer@1" in str(failure)
        assert failure.key in ("good-key", "bad-key")
    else:
        assert "'bad-key'" in str(failure) and "'bad'" in str(failure)
        assert failure.key == "bad-key" and failure.record == "bad"


class Closing(KeyedProcessFunction):
    """Counts its close() calls; ``fail`` raises in process_element, ``close_error`` in
    close()."""

    def __init__(self, fail: bool, close_error: bool) -> None:
        self.fail, self.close_error, self.closed = fail, close_error, 0

    def process_element(self, value, ctx):
        if self.fail:
            raise Boom("in process_element")

    def close(self) -> None:
        self.closed += 1
        if self.close_error:
            raise Boom("in close")


@pytest.mark.parametrize("async_state", [True, False])
def test_close_runs_once_at_the_end_of_every_run_and_its_error_fails_a_clean_one(async_state):
    config = AecConfig(async_state=async_state)
    source = [Record("k", 1), Watermark(5)]
    clean = Closing(fail=False, close_error=True)
    with pytest.raises(JobFailure, match=r"Closing.close\(\) failed: Boom: in close") as info:
        run_keyed(source, clean, config=config)
    assert isinstance(info.value.__cause__, Boom) and clean.closed == 1
    # a failed run closes the function too (what open() acquired is released), once; an
    # error of close() then is a note on the run's failure, which stays the one raised
    failed = Closing(fail=True, close_error=True)
    with pytest.raises(JobFailure, match="in process_element") as info:
        run_keyed(source, failed, config=config)
    assert failed.closed == 1
    assert any("Closing.close() also failed: Boom: in close" in n for n in info.value.__notes__)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class RaisesUnprintable(KeyedProcessFunction):
    def process_element(self, value, ctx):
        raise Unprintable()


@pytest.mark.parametrize("async_state", [True, False])
def test_an_error_whose_str_raises_still_fails_the_run_naming_the_record(async_state):
    error_config = AecConfig(async_state=async_state)
    with pytest.raises(JobFailure, match="record 'v' of key 'k'") as info:
        run_keyed([Record("k", "v")], RaisesUnprintable(), config=error_config)
    assert isinstance(info.value.__cause__, Unprintable)
    assert info.value.key == "k" and info.value.record == "v"


class RunsAnotherJob(KeyedProcessFunction):
    def process_element(self, value, ctx):
        run_keyed([Record("inner-key", "inner")], RaisesUnprintable())  # fails: JobFailure


def test_a_job_failure_raised_by_user_code_is_the_error_of_its_record():
    with pytest.raises(JobFailure, match="record 'outer' of key 'outer-key'") as info:
        run_keyed([Record("outer-key", "outer")], RunsAnotherJob())
    assert info.value.key == "outer-key" and info.value.record == "outer"
    inner = info.value.__cause__
    assert isinstance(inner, JobFailure) and inner.key == "inner-key"


class BrokenBackend(MemoryBackend):
    blocking = True  # runs on the I/O thread pool

    def execute_batch(self, requests):
        if any(r.value == "poison" for r in requests):
            raise OSError("disk on fire")
        super().execute_batch(requests)


def engine_threads():
    return [t for t in threading.enumerate() if t.name.startswith("aec-io")]


def test_backend_failure_on_io_thread_fails_job_and_stops_threads():
    source = [Record(i, i) for i in range(50)] + [Record("p", "poison")]
    with pytest.raises(JobFailure) as info:
        run_keyed(source, Failing("none"), backend=BrokenBackend(), config=AecConfig(buffer_size=7))
    assert isinstance(info.value.__cause__, OSError)
    assert "state backend failed" in str(info.value)
    assert engine_threads() == []


class _CatchesBackendErrors(KeyedProcessFunction):
    """Writes with the blocking API and catches whatever it raises."""

    def open(self, ctx):
        self.value = ctx.get_state(ValueStateDescriptor("v"))

    def process_element(self, value, ctx):
        try:
            self.value.update(value)
        except Exception as exc:  # noqa: BLE001 - what the test is about
            ctx.output(("caught", type(exc).__name__))
        ctx.output(("after", value))


@pytest.mark.parametrize("async_state", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("blocking", [True, False], ids=["io-thread", "inline"])
def test_a_backend_failure_user_code_catches_still_fails_the_run_naming_its_record(
    async_state, blocking
):
    # rule 10 whatever user code does with the error: the same failure in both modes,
    # naming the record whose request failed, the store's error as the cause
    backend = BrokenBackend()
    backend.blocking = blocking
    source = [Record("k", 1), Record("k", "poison"), Record("j", 3)]
    with pytest.raises(JobFailure) as info:
        run_keyed(source, _CatchesBackendErrors(), backend, AecConfig(async_state=async_state))
    assert isinstance(info.value.__cause__, OSError)
    assert "state backend failed at record 'poison' of key 'k'" in str(info.value)
    assert (info.value.key, info.value.record) == ("k", "poison")
    assert engine_threads() == []


def test_a_failed_batch_of_several_records_names_them_all():
    # the store's error does not say which request failed: the failure names the batch's
    # records (not the first one alone, which may be a good record that shared it)
    source = [Record(i, i) for i in range(6)] + [Record("p", "poison")]
    with pytest.raises(JobFailure) as info:
        run_keyed(source, Failing("none"), backend=BrokenBackend(), config=AecConfig(buffer_size=7))
    message = str(info.value)
    assert "a batch of 7 requests of 7 records" in message, message
    assert "record 'poison' of key 'p'" in message and "record 0 of key 0" in message
    assert info.value.key is None and info.value.record is None


def test_threads_stop_after_a_successful_run():
    backend = BrokenBackend()
    result = run_keyed([Record(i % 5, i) for i in range(100)], Counter(), backend=backend)
    assert result.metrics["records_out"] == 100
    assert engine_threads() == []


@pytest.mark.parametrize(
    "element, error, text",
    [
        (Record(None, 1), TypeError, "None"),
        (Record(["list"], 1), TypeError, "unhashable"),
        (Record("k", 1, timestamp="noon"), TypeError, "timestamp"),
        (Record("k", 1, timestamp=float("nan")), ValueError, "NaN"),
        (Record("k", 1, timestamp=10**400), ValueError, "beyond the float range"),
        (Watermark(-(10**5000)), ValueError, "16610 bits, beyond the float range"),
        ("not a record", TypeError, "expected aec.Record"),
    ],
)
def test_bad_input_is_rejected_at_the_boundary(element, error, text):
    with pytest.raises(error, match=text):
        run_keyed([Record("k", 0), element], Counter())
    assert engine_threads() == []


def test_an_executor_that_is_not_a_state_executor_is_a_type_error():
    with pytest.raises(TypeError, match="StateExecutor"):
        KeyedProcessOperator(Counter(), MemoryBackend(), None, "threads")
    with pytest.raises(TypeError, match="StateExecutor"):
        run_keyed([Record("k", 0)], Counter(), executor=object())


def test_regressing_watermark_is_rejected():
    with pytest.raises(ValueError, match="backwards"):
        run_keyed([Watermark(5), Watermark(4)], Counter())


def test_sync_and_async_styles_agree():
    source = [Record(i % 7, i) for i in range(500)]
    want = values(run_sync(source, Counter()).outputs)
    for function in (Counter(), AsyncCounter()):
        got = values(run_keyed(source, function, config=AecConfig(buffer_size=16)).outputs)
        assert sorted(got) == sorted(want)
        for key in range(7):
            assert [o for o in got if o[0] == key] == [o for o in want if o[0] == key]


def test_returning_a_plain_value_is_an_error():
    class Returns(KeyedProcessFunction):
        def process_element(self, value, ctx):
            return 42

    with pytest.raises(JobFailure, match="returned 42"):
        run_keyed([Record("k", 1)], Returns())


def test_awaiting_a_foreign_awaitable_is_an_error():
    import asyncio

    class AwaitsAsyncio(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            await asyncio.sleep(0)

    with pytest.raises(JobFailure, match="only aec StateFutures"):
        run_keyed([Record("k", 1)], AwaitsAsyncio())


def test_an_awaitable_yielding_a_completed_future_resumes_with_its_result():
    """``await`` on an object whose ``__await__`` yields an aec future that is already
    done (not what ``StateFuture.__await__`` does) resumes the coroutine at once."""

    class Done:
        def __init__(self, value):
            self.value = value

        def __await__(self):
            return (yield completed_future(self.value))

    class AwaitsDone(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        async def process_element(self, value, ctx):
            first = await Done(value)
            second = await Done(first * 10)
            n = await self.count.async_value() + 1
            self.count.async_update(n)
            ctx.output((ctx.current_key, first, second, n))

    source = [Record("k", 1), Record("k", 2), Record("j", 3)]
    for config in (AecConfig(), AecConfig(async_state=False)):
        outputs = [o for o in run_keyed(source, AwaitsDone(), config=config).outputs
                   if not isinstance(o, Watermark)]  # fmt: skip
        # keys may interleave (docs/semantics.md rule 2); a key's records keep their order
        assert sorted(outputs) == [("j", 3, 30, 1), ("k", 1, 10, 1), ("k", 2, 20, 2)]
        assert [o for o in outputs if o[0] == "k"] == [("k", 1, 10, 1), ("k", 2, 20, 2)]


def test_end_of_input_emits_infinite_watermark_last_and_fires_all_timers():
    log = []
    result = run_keyed([Record("a", 100), Record("b", 1e9)], Logged(log))
    assert result.outputs[-1] == Watermark(math.inf)
    assert {e for e in log if e[0] == "timer"} == {("timer", "a", 100), ("timer", "b", 1e9)}


def test_state_ordered_mode_overlaps_code_but_keeps_state_order():
    log, executor = [], ManualExecutor()
    op = operator(Logged(log), executor, buffer_size=100, state_ordered=True)
    op.process(Record("a", "a1"))
    op.process(Record("a", "a2"))
    # a2's code ran before a1 finished (record-ordered mode would hold a2 back) ...
    assert [e for e in log if e[0] == "start"] == [("start", "a", "a1"), ("start", "a", "a2")]
    op.finish()
    # ... but its state request waited: a1's read-modify-write, then a2's
    assert log.index(("done", "a", "a1")) < log.index(("done", "a", "a2"))
    assert op.controller.in_flight == 0 and not len(op.controller.keys)
    assert not op.controller.waiting_requests


@pytest.mark.parametrize("seed", range(5))
def test_state_ordered_counter_equals_sync(seed):
    from aec.testing import assert_equivalent

    source = (
        [Record(i % 3, i) for i in range(60)]
        + [Watermark(5)]
        + [Record(i % 2, i) for i in range(20)]
    )
    config = AecConfig(buffer_size=4, in_flight_records_limit=10, state_ordered=True)
    assert_equivalent(Counter, source, configs=[config], seeds=[seed])
    assert_equivalent(AsyncCounter, source, configs=[config], seeds=[seed])


def test_blocking_state_calls_at_the_in_flight_limit_do_not_deadlock():
    class BlockingCounter(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        def process_element(self, value, ctx):
            n = self.count.value() + 1  # runs the mailbox until the read completes
            self.count.update(n)
            ctx.output((ctx.current_key, n))

    source = [Record(i % 4, i) for i in range(100)]
    for limit in (1, 2, 5):
        result = run_keyed(
            source, BlockingCounter(), backend=BrokenBackend(),  # an I/O-thread backend
            config=AecConfig(in_flight_records_limit=limit, buffer_size=3),
        )  # fmt: skip
        got = values(result.outputs)
        for key in range(4):
            assert [n for k, n in got if k == key] == list(range(1, 26))


def test_a_future_nobody_completes_is_reported_with_its_key_not_a_hang():
    from aec import StateFuture

    class Forgetful(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            if value == "stuck":
                await StateFuture()  # nothing will ever complete it
            ctx.output(value)

    for config in (AecConfig(), AecConfig(async_state=False)):
        with pytest.raises(JobFailure, match="can never finish.*'k2'"):
            run_keyed(
                [Record("k1", "ok"), Record("k2", "stuck"), Record("k3", "ok")],
                Forgetful(),
                config=config,
            )
    assert engine_threads() == []


@pytest.mark.parametrize("async_state", [True, False])
def test_a_record_outliving_its_entry_keeps_its_key_and_its_epoch(async_state):
    """The synchronous controller keeps no key accounting while every record finishes
    inside its entry; one that does not (it awaits a future completed later, here by
    engine-side misuse from another key's record) still holds its key and its epoch."""
    from aec import StateFuture

    pending = []

    class Handoff(KeyedProcessFunction):
        async def process_element(self, value, ctx):
            if value == "wait":
                pending.append(StateFuture())
                await pending[-1]
            elif value == "release":
                pending.pop().complete(None)
            ctx.output(value)

    source = [Record("a", "wait"), Record("a", "after"), Record("b", "release"),
              Watermark(1.0), Record("a", "late")]  # fmt: skip
    result = run_keyed(source, Handoff(), config=AecConfig(async_state=async_state))
    assert [o for o in result.outputs if not isinstance(o, Watermark) or o.timestamp < 2] == [
        "wait", "release", "after", Watermark(1.0), "late"
    ]


@pytest.mark.parametrize("async_state", [True, False])
@pytest.mark.parametrize("on", ["state", "completed"])
def test_a_callbacks_error_fails_the_job_even_if_user_code_catches_it(async_state, on):
    """Rule 10 whether the callback runs at registration (a complete future: every
    future of the synchronous run, or ``completed_future``) or at completion."""

    class Catches(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        async def process_element(self, value, ctx):
            future = self.count.async_value() if on == "state" else completed_future(0)
            try:
                await future.then_apply(lambda n: 1 // n)
            except ZeroDivisionError:
                ctx.output("caught")

    with pytest.raises(JobFailure, match="record 1 of key 'a': ZeroDivisionError") as info:
        run_keyed([Record("a", 1)], Catches(), config=AecConfig(async_state=async_state))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("async_state", [True, False])
def test_keyboard_interrupt_stops_cleanly(async_state):
    class Interrupted(KeyedProcessFunction):
        def open(self, ctx):
            self.state = ctx.get_state(ValueStateDescriptor("v"))

        def process_element(self, value, ctx):
            if value == 50:
                raise KeyboardInterrupt
            return self.state.async_update(value)

    source = [Record(i % 7, i) for i in range(100)]
    with pytest.raises(KeyboardInterrupt):
        run_keyed(
            source,
            Interrupted(),
            backend=BrokenBackend(),
            config=AecConfig(async_state=async_state),
        )
    assert engine_threads() == []


def test_failure_inside_a_blocked_io_thread_is_bounded_in_time():
    class SlowThenBroken(MemoryBackend):
        blocking = True

        def execute_batch(self, requests):
            time.sleep(0.01)
            if any(r.value == 13 for r in requests):
                raise OSError("remote store went away")
            super().execute_batch(requests)

    start = time.monotonic()
    with pytest.raises(JobFailure, match="remote store went away"):
        run_keyed([Record(i, i) for i in range(40)], Failing("none"), backend=SlowThenBroken(),
                  config=AecConfig(buffer_size=2, executor_threads=4))  # fmt: skip
    assert time.monotonic() - start < 10
    assert engine_threads() == []


def test_interpreter_settings_apply_while_operators_run_and_are_restored(
    default_interpreter_settings,
):
    import gc
    import sys

    interpreter_tuning = default_interpreter_settings
    first, second = operator(Counter()), operator(Counter())
    assert gc.get_threshold()[0] == interpreter_tuning.YOUNG_THRESHOLD
    assert sys.getswitchinterval() == pytest.approx(interpreter_tuning.SWITCH_INTERVAL)
    first.close()  # the other operator still runs: settings stay
    assert gc.get_threshold()[0] == interpreter_tuning.YOUNG_THRESHOLD
    second.close()
    assert gc.get_threshold()[0] == 700
    assert sys.getswitchinterval() == pytest.approx(0.005)
    # an application's own larger threshold and shorter interval are left alone
    gc.set_threshold(10 * interpreter_tuning.YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    sys.setswitchinterval(0.0001)
    third = operator(Counter())
    assert gc.get_threshold()[0] == 10 * interpreter_tuning.YOUNG_THRESHOLD
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    third.close()
    assert sys.getswitchinterval() == pytest.approx(0.0001)


# -- blocking state calls inside callbacks and timers --------------------------------------
class BlocksInACallback(KeyedProcessFunction):
    """The first request's callback reads with the blocking form while the record's
    unawaited write travels in the same batch."""

    def open(self, ctx):
        self.v = ctx.get_state(ValueStateDescriptor("v", default=0))
        self.w = ctx.get_state(ValueStateDescriptor("w", default=0))

    def process_element(self, value, ctx):
        self.v.async_value().then_accept(lambda n: ctx.output((ctx.current_key, n, self.w.value())))
        self.v.async_update(value)


class BlocksInOnTimer(KeyedProcessFunction):
    def open(self, ctx):
        self.v = ctx.get_state(ValueStateDescriptor("v", default=0))

    def process_element(self, value, ctx):
        self.v.update(self.v.value() + value)
        ctx.timer_service.register_event_time_timer(10)

    def on_timer(self, timestamp, ctx):
        ctx.output((ctx.current_key, self.v.value()))  # the blocking form


def _tuples(outputs):
    return sorted(o for o in outputs if isinstance(o, tuple))


@pytest.mark.parametrize("how", ["scripted", "threads", "rocksdb"])
def test_blocking_calls_in_callbacks_and_timers_give_the_synchronous_answer(how, tmp_path):
    def run(function, source):
        if how == "scripted":
            return run_keyed(source, function, MemoryBackend(), executor=ScriptedExecutor(seed=1))
        if how == "threads":
            return run_keyed(source, function, LatencyBackend(MemoryBackend(), 0.001))
        return run_keyed(source, function, RocksDBBackend(str(tmp_path / f"db{id(source)}")))

    in_callbacks = [Record(i % 7, i) for i in range(40)]
    assert _tuples(run(BlocksInACallback(), in_callbacks).outputs) == _tuples(
        run_sync(in_callbacks, BlocksInACallback()).outputs
    )  # a request deferred behind its own record's applied batch waited for ever
    in_timers = [Record(i, 1, 1.0) for i in range(300)] + [Watermark(20)]
    assert _tuples(run(BlocksInOnTimer(), in_timers).outputs) == _tuples(
        run_sync(in_timers, BlocksInOnTimer()).outputs
    )  # each due firing started inside the last one's wait: a RecursionError at ~140 keys


@pytest.mark.parametrize(
    ("timestamp", "error", "message"),
    [
        (10**400, ValueError, "1329 bits, beyond the float range"),
        (-(10**400), ValueError, "beyond the float range"),
        (True, TypeError, "must be a number of seconds, got True"),
        (float("nan"), ValueError, "is NaN"),
    ],
)
def test_a_timer_timestamp_is_checked_whatever_its_type(timestamp, error, message):
    class Registers(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service.register_event_time_timer(timestamp)

    with pytest.raises(JobFailure) as info:
        run_keyed([Record("k", 1, 0.0)], Registers())
    assert isinstance(info.value.__cause__, error)
    assert message in str(info.value.__cause__)


def test_an_int_timer_timestamp_at_the_float_range_fires_as_an_int():
    import sys

    edge = int(sys.float_info.max)

    class Registers(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service.register_event_time_timer(edge)

        def on_timer(self, timestamp, ctx):
            ctx.output(timestamp)

    outputs = run_keyed([Record("k", 1, 0.0)], Registers()).outputs
    fired = [o for o in outputs if not isinstance(o, Watermark)]
    assert fired == [edge] and type(fired[0]) is int
