"""What must hold in both builds, interpreted and mypyc-compiled (setup.py, AEC_COMPILE=1):
the build imported is the one expected, the compiled kernel's classes still subclass, key
group ranges (in every checkpoint) still pickle, and engine errors keep their cause. .ci/run runs this file (with the rest of
the non-Spark tests) against the compiled build with AEC_EXPECT_COMPILED=1."""

from __future__ import annotations

import collections
import gc
import math
import os
import pickle
import weakref

import numpy as np
import pytest
from engine_helpers import Counter
from windowing_cases import SumAggregate, SumWithWindow

import aec
from aec import (
    AecConfig,
    JobFailure,
    KeyedCoProcessOperator,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    Watermark,
    run_keyed,
    run_keyed_co,
)
from aec.clock import Clock, ManualClock
from aec.errors import StuckError
from aec.joins import ProcessJoinFunction, interval_join
from aec.keygroups import KeyGroupRange
from aec.runtime.controller import BatchFailed
from aec.runtime.executor import InlineExecutor
from aec.runtime.record_context import RecordContext
from aec.state.future import StateFuture, combine_all, completed_future
from aec.state.memory import MemoryBackend
from aec.state.requests import Op, StateRequest
from aec.windowing import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    window,
)


def test_the_build_imported_is_the_one_expected():
    expected = os.environ.get("AEC_EXPECT_COMPILED", "0") not in ("", "0")
    assert aec.compiled is expected


def test_key_group_ranges_pickle_by_value():
    for r in (KeyGroupRange(0, 127), KeyGroupRange(5, 4), KeyGroupRange.all(32)):
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(r, protocol))
            assert type(back) is KeyGroupRange
            assert (back.start, back.end) == (r.start, r.end) and back == r


def test_a_batch_failure_carries_the_backends_error_as_cause():
    error = OSError("disk went away")
    assert BatchFailed([], error).__cause__ is error


def test_a_backend_error_is_the_job_failures_cause():
    class Broken(MemoryBackend):
        def execute_batch(self, batch):
            raise OSError("store is gone")

    with pytest.raises(JobFailure, match="store is gone") as failure:
        run_keyed([aec.Record("k", 1)], Counter(), Broken(), AecConfig())
    assert isinstance(failure.value.__cause__, OSError)


def test_engine_classes_users_and_the_engine_subclass_still_subclass():
    class CountingInline(InlineExecutor):
        runs = 0

        def submit(self, batch):
            CountingInline.runs += 1
            super().submit(batch)

    class Context(RecordContext):  # compiled without allow_interpreted_subclasses: TypeError
        pass

    result = run_keyed(
        [aec.Record("k", i) for i in range(5)], Counter(), MemoryBackend(), AecConfig(),
        executor=CountingInline(),
    )  # fmt: skip
    assert ("k", 5) in result.outputs and CountingInline.runs > 0
    assert issubclass(Context, RecordContext)
    assert issubclass(StuckError, RuntimeError)


class TimeTypes(KeyedProcessFunction):
    """Emits what the context says about time, for records and for timers."""

    def process_element(self, value, ctx):
        ctx.timer_service.register_event_time_timer(value + 1)
        ctx.output(("record", ctx.timestamp, ctx.timer_service.current_watermark(),
                    ctx.timer_service.current_processing_time()))  # fmt: skip

    def on_timer(self, timestamp, ctx):
        ctx.output(("timer", timestamp, ctx.timer_service.current_watermark(),
                    ctx.timer_service.current_processing_time()))  # fmt: skip


def test_times_keep_their_type():
    # an int timestamp or watermark stays an int in both builds
    source = [aec.Record("k", 1, timestamp=1), aec.Watermark(5), aec.Record("k", 2, timestamp=6)]
    result = run_keyed(source, TimeTypes(), MemoryBackend(), AecConfig(), clock=ManualClock(3))
    rows = [o[:3] for o in result.outputs if isinstance(o, tuple)]
    assert rows[0] == ("record", 1, float("-inf"))
    assert ("timer", 2, 5) in rows and ("record", 6, 5) in rows
    times = [v for row in rows for v in row[1:] if math.isfinite(v)]  # not the end's +-inf
    assert len(times) >= 5 and {type(v) for v in times} == {int}, rows


def test_a_restored_integer_watermark_stays_exact(tmp_path):
    # compiled, a checkpoint's watermark read as a float would round a nanosecond one
    big = 1_700_000_000_000_000_201
    operator = KeyedProcessOperator(TimeTypes(), MemoryBackend())
    operator.open()
    operator.process_watermark(aec.Watermark(big))
    handle = operator.snapshot(1, tmp_path)
    operator.close()
    restored = KeyedProcessOperator(TimeTypes(), MemoryBackend())
    restored.restore(handle)
    assert restored.watermark == big and type(restored.watermark) is int
    restored.process_watermark(aec.Watermark(big + 1))  # not "behind" a rounded one
    restored.process(aec.Record("k", 1, timestamp=big + 2))
    restored.finish()
    rows = [o for o in restored.drain_outputs() if isinstance(o, tuple)]
    assert rows[0][:3] == ("record", big + 2, big + 1)


class CountingClock(Clock):
    """A user's clock: the n-th reading is ``kind(n)`` seconds."""

    deterministic = True

    def __init__(self, kind: type) -> None:
        self.kind, self.reads = kind, 0

    def now(self):
        self.reads += 1
        return self.kind(self.reads)


class ProcessingTimer(KeyedProcessFunction):
    def process_element(self, value, ctx):
        ctx.timer_service.register_processing_time_timer(
            ctx.timer_service.current_processing_time() + 1
        )

    def on_timer(self, timestamp, ctx):
        ctx.output((timestamp, ctx.timer_service.current_processing_time()))


@pytest.mark.parametrize("kind", [int, np.float64])
def test_a_users_clock_readings_keep_their_type(kind):
    # compiled, a reading annotated float would be a C double: an int one would come back
    # a float; numpy's compare to numpy.bool, which compiled code must take as it comes
    source = [aec.Record("k", i) for i in range(4)]
    result = run_keyed(source, ProcessingTimer(), MemoryBackend(), clock=CountingClock(kind))
    fired = [o for o in result.outputs if isinstance(o, tuple)]
    assert fired and {type(v) for row in fired for v in row} == {kind}, result.outputs


def test_the_keyed_operators_stay_subclassable_from_python():
    class Counting(KeyedProcessOperator):
        def process(self, record):
            self.seen = getattr(self, "seen", 0) + 1
            super().process(record)

    class CoCounting(KeyedCoProcessOperator):
        pass

    operator = Counting(Counter(), MemoryBackend())
    operator.open()
    operator.process(aec.Record("k", 1))
    operator.finish()
    assert operator.seen == 1 and ("k", 1) in operator.drain_outputs()
    assert isinstance(CoCounting(Joined(), MemoryBackend()), KeyedProcessOperator)


class Joined(aec.KeyedCoProcessFunction):
    def process_element1(self, value, ctx):
        ctx.output(value)

    def process_element2(self, value, ctx):
        ctx.output(value)


def test_weak_references_to_futures_and_requests_die_with_them():
    # compiled, these classes have a Python base (Generic) and take weak references, which
    # must be cleared when the object is freed (setup.py fixes mypyc's C); interpreted,
    # their __slots__ have no __weakref__
    made = [StateFuture, lambda: StateRequest(Op.VALUE_GET, "s", "k", 0)]
    try:
        refs = [weakref.ref(make()) for make in made for _ in range(100)]  # each freed at once
    except TypeError:
        assert not aec.compiled
        return
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_combine_all_names_what_is_not_a_future():
    with pytest.raises(TypeError, match="combine_all takes StateFutures, got int"):
        combine_all([completed_future(1), 2])


def test_chained_futures_leave_no_cyclic_garbage():
    # compiled, a closure and its environment are a reference cycle: the chaining methods
    # use partials instead
    gc.collect()
    gc.disable()
    try:
        for i in range(100):
            future: StateFuture[int] = StateFuture()
            done = future.then_apply(lambda v: v + 1).then_compose(completed_future)
            done.then_accept(lambda v: None)
            future.complete(i)
            assert done.get() == i + 1
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert unreachable < 50, unreachable


MODES = pytest.mark.parametrize(
    "config", [AecConfig(async_state=False), AecConfig()], ids=["sync", "async"]
)
ASSIGNERS = pytest.mark.parametrize(
    "assigner",
    [TumblingEventTimeWindows.of(30), SlidingEventTimeWindows.of(30, 10),
     EventTimeSessionWindows.with_gap(10)],
    ids=["tumbling", "sliding", "sessions"],
)  # fmt: skip


def _segments(outputs):
    """The outputs between watermarks as multisets (their order across keys is free),
    each with the watermark that ends it."""
    segments, segment = [], collections.Counter()
    for output in outputs:
        if type(output) is Watermark:
            segments.append((segment, output))
            segment = collections.Counter()
        else:
            segment[output] += 1
    return [*segments, (segment, None)]


def _windowed(time, assigner, lateness, kind):
    """Records of three keys every 7 s (every 13th 60 s late), a watermark every 10."""
    source = []
    for i in range(80):
        t = i * 7 - (60 if i % 13 == 12 else 0)
        source.append(Record(f"k{i % 3}", (f"k{i % 3}", 1), time(t)))
        if i % 10 == 9:
            source.append(Watermark(time(i * 7 - 20)))
    source.append(Watermark(time(10**6)))
    function = (
        {"aggregate": SumAggregate()} if kind == "aggregate" else {"process": SumWithWindow()}
    )
    return source, window(assigner, allowed_lateness=lateness, late_data_tag="late", **function)


@MODES
@pytest.mark.parametrize("kind", ["aggregate", "process"])
@pytest.mark.parametrize("lateness", [0, 25])
@ASSIGNERS
def test_windows_on_numpy_times_give_the_results_of_float_times(config, kind, lateness, assigner):
    """numpy.float64 timestamps (a float subclass, as pandas gives them) compare to
    numpy.bool, which compiled code refuses where a bool is declared: the windowing kernel
    reads times untyped (aec.elements.Time), so both builds give the float run's results."""
    results = []
    for time in (float, np.float64):
        source, function = _windowed(time, assigner, lateness, kind)
        result = run_keyed(source, function, config=config)
        results.append((_segments(result.outputs), result.side_outputs))
    assert results[0] == results[1]
    assert any(w is not None and type(w.timestamp) is np.float64 for _, w in results[1][0])


@MODES
def test_an_interval_join_on_numpy_times_gives_the_results_of_float_times(config):
    results = []
    for time in (float, np.float64):
        source = []
        for i in range(80):
            t = i * 3 - (40 if i % 11 == 0 else 0)
            source.append((1 + i % 2, Record(f"k{i // 2 % 3}", i, time(t))))
            if i % 10 == 9:
                source += [(1, Watermark(time(i * 3 - 10))), (2, Watermark(time(i * 3 - 10)))]
        join = interval_join(-5, 5, lambda left, right: (left, right), left_late_tag="late")
        result = run_keyed_co(source, join, config=config)
        results.append((_segments(result.outputs), result.side_outputs))
    assert results[0] == results[1] and sum(sum(c.values()) for c, _ in results[0][0]) > 20


@MODES
@pytest.mark.parametrize("time", [int, np.float64])
@ASSIGNERS
def test_late_output_sees_a_late_records_times_as_given(config, time, assigner):
    """A compiled float cast or annotation would hand ``late_output`` a float."""
    seen = []

    def late_output(value, timestamp, watermark):
        seen.append((type(timestamp), type(watermark)))
        return value

    function = window(
        assigner, aggregate=SumAggregate(), late_data_tag="late", late_output=late_output
    )
    source = [Record("k", ("k", 1), time(3)), Watermark(time(40)), Record("k", ("k", 1), time(2))]
    result = run_keyed(source, function, config=config)
    assert result.side_outputs == {"late": [("k", 1)]}
    assert seen == [(time, time)]


class _Tagged(ProcessJoinFunction):
    def __init__(self, tag):
        self.tag = tag

    def process_element(self, left, right, ctx):
        return [(self.tag, left, right)]


def test_a_process_join_functions_subclass_pickles_with_its_attributes():
    """Spark ships the join to its executors pickled: a user's subclass keeps its state."""
    join = pickle.loads(pickle.dumps(interval_join(-1, 1, _Tagged("t"))))
    assert join.process.tag == "t"
    source = [(1, Record("k", "l", 5)), (2, Record("k", "r", 6))]
    assert run_keyed_co(source, join).outputs[0] == ("t", "l", "r")


def test_interval_join_checks_its_flags_with_aecs_message():
    with pytest.raises(TypeError, match="lower_inclusive must be a bool, got 1"):
        interval_join(0, 1, max, lower_inclusive=1)
