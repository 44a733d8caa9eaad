"""Flink's ``WindowOperatorTest`` scenarios, ported to aec's windows.

Units: Flink's milliseconds are read as aec seconds (record at 3999 -> t = 3999 s),
and a Flink watermark ``end - 1`` (its windows fire at ``max_timestamp = end - 1``)
becomes the aec watermark ``end`` (aec fires when the watermark reaches ``end``).
Outputs are compared per epoch as multisets, as Flink's harness compares them
sorted. Every scenario runs synchronously and asynchronously, on Memory and RocksDB.
"""

from __future__ import annotations

import math
import sys

import pytest
from windowing_cases import (
    BACKENDS,
    CONFIGS,
    ManualClock,
    Record,
    SumAggregate,
    SumList,
    SumWithWindow,
    Watermark,
    epochs,
    make_backend,
    rec,
    run,
    sum_reduce,
)

from aec.windowing import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    window,
)

MATRIX = [(b, c) for b in BACKENDS for c in CONFIGS]


@pytest.fixture(params=MATRIX, ids=[f"{b}-{c}" for b, c in MATRIX])
def env(request, tmp_path):
    backend, config = request.param
    return lambda: {"backend": make_backend(backend, tmp_path), "config": CONFIGS[config]}


def _flink_records() -> list[Record]:
    """The elements of Flink's sliding/tumbling tests, out of order."""
    return [
        rec("key2", 1, 3999), rec("key2", 1, 3000),
        rec("key1", 1, 20), rec("key1", 1, 0), rec("key1", 1, 999),
        rec("key2", 1, 1998), rec("key2", 1, 1999), rec("key2", 1, 1000),
    ]  # fmt: skip


WATERMARKS = [Watermark(t) for t in (1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000)]

SLIDING_EXPECTED = [
    ([("key1", 3)], 1000),
    ([("key1", 3), ("key2", 3)], 2000),
    ([("key1", 3), ("key2", 3)], 3000),
    ([("key2", 5)], 4000),
    ([("key2", 2)], 5000),
    ([("key2", 2)], 6000),
    ([], 7000),
    ([], 8000),
    ([], math.inf),
]

TUMBLING_EXPECTED = [
    ([], 1000),
    ([], 2000),
    ([("key1", 3), ("key2", 3)], 3000),
    ([], 4000),
    ([], 5000),
    ([("key2", 2)], 6000),
    ([], 7000),
    ([], 8000),
    ([], math.inf),
]


@pytest.mark.parametrize(
    "contents",
    [{"reduce": sum_reduce}, {"aggregate": SumAggregate()}, {"process": SumList()}],
    ids=["reduce", "aggregate", "apply"],
)
def test_sliding_event_time_windows(env, contents):
    """testSlidingEventTimeWindowsReduce / ...Apply (3 s windows sliding by 1 s)."""
    fn = window(SlidingEventTimeWindows.of(3000, 1000), **contents)
    result = run(_flink_records() + WATERMARKS, fn, **env())
    assert epochs(result.outputs) == SLIDING_EXPECTED


@pytest.mark.parametrize(
    "contents",
    [{"reduce": sum_reduce}, {"aggregate": SumAggregate()}, {"process": SumList()}],
    ids=["reduce", "aggregate", "apply"],
)
def test_tumbling_event_time_windows(env, contents):
    """testTumblingEventTimeWindowsReduce / ...Apply (3 s windows)."""
    fn = window(TumblingEventTimeWindows.of(3000), **contents)
    result = run(_flink_records() + WATERMARKS, fn, **env())
    assert epochs(result.outputs) == TUMBLING_EXPECTED


def _session_records() -> list:
    return [
        rec("key2", 1, 0), rec("key2", 2, 1000), rec("key2", 3, 2500),
        rec("key1", 1, 10), rec("key1", 2, 1000), rec("key1", 3, 2500),
        rec("key2", 4, 5501), rec("key2", 5, 6000), rec("key2", 5, 6000), rec("key2", 6, 6050),
        Watermark(12000),
        rec("key2", 10, 15000), rec("key2", 20, 15000),
        Watermark(18000),
    ]  # fmt: skip


def test_session_windows(env):
    """testSessionWindows: 3 s gap, a ProcessWindowFunction over the values."""
    fn = window(EventTimeSessionWindows.with_gap(3000), process=SumWithWindow())
    assert epochs(run(_session_records(), fn, **env()).outputs) == [
        ([("key1-6", 10, 5500), ("key2-20", 5501, 9050), ("key2-6", 0, 5500)], 12000),
        ([("key2-30", 15000, 18000)], 18000),
        ([], math.inf),
    ]


def test_reduce_session_windows(env):
    """testReduceSessionWindows: merging accumulators through reduce/aggregate merge."""
    for contents in ({"reduce": sum_reduce}, {"aggregate": SumAggregate()}):
        fn = window(EventTimeSessionWindows.with_gap(3000), **contents)
        assert epochs(run(_session_records(), fn, **env()).outputs) == [
            ([("key1", 6), ("key2", 20), ("key2", 6)], 12000),
            ([("key2", 30)], 18000),
            ([], math.inf),
        ]


def test_session_windows_with_count_trigger(env):
    """testSessionWindowsWithCountTrigger: PurgingTrigger(CountTrigger(4)) on sessions;
    the count merges with the windows (on_merge)."""
    fn = window(
        EventTimeSessionWindows.with_gap(3000),
        process=SumWithWindow(),
        trigger=PurgingTrigger.of(CountTrigger.of(4)),
    )
    source = [
        rec("key2", 1, 0), rec("key2", 2, 1000), rec("key2", 3, 2500), rec("key2", 4, 3500),
        rec("key1", 1, 10), rec("key1", 2, 1000), rec("key1", 3, 2500),
        rec("key2", 5, 6000),  # merges into the purged [0, 6500): count 1
        Watermark(12000),  # cleans both sessions without firing
        *[rec("key1", 10, 20000) for _ in range(4)],
    ]  # fmt: skip
    assert epochs(run(source, fn, **env()).outputs) == [
        ([("key2-10", 0, 6500)], 12000),
        ([("key1-40", 20000, 23000)], math.inf),
    ]


def test_session_windows_with_continuous_event_time_trigger(env):
    """testSessionWindowsWithContinuousEventTimeTrigger: early firings every 2 s of
    event time inside a session, the fire-time state merged on merge."""
    fn = window(
        EventTimeSessionWindows.with_gap(3000),
        process=SumWithWindow(),
        trigger=ContinuousEventTimeTrigger.of(2000),
    )
    source = [
        rec("key2", 1, 0), rec("key2", 2, 1000),  # [0, 4000), next early firing at 2000
        Watermark(2000),
        rec("key2", 3, 2500),  # [0, 5500)
        Watermark(4000),
        Watermark(6000),
    ]  # fmt: skip
    assert epochs(run(source, fn, **env()).outputs) == [
        ([("key2-3", 0, 4000)], 2000),
        ([("key2-6", 0, 5500)], 4000),
        ([("key2-6", 0, 5500)], 6000),
        ([], math.inf),
    ]


class PointSessionWindows(EventTimeSessionWindows):
    """Flink's test assigner: a record's window is the point ``[t, t)``."""

    def assign_windows(self, value, timestamp):
        return [TimeWindow(timestamp, timestamp)]


def test_point_sessions(env):
    """testPointSessions: zero-length windows merge only when equal."""
    fn = window(PointSessionWindows.with_gap(3000), process=SumWithWindow())
    source = [
        rec("key2", 1, 0), rec("key2", 2, 1000), rec("key2", 3, 1000),
        rec("key1", 1, 10), rec("key1", 2, 10),
        Watermark(12000),
    ]  # fmt: skip
    assert epochs(run(source, fn, **env()).outputs) == [
        ([("key1-3", 10, 10), ("key2-1", 0, 0), ("key2-5", 1000, 1000)], 12000),
        ([], math.inf),
    ]


def test_count_trigger(env):
    """testCountTrigger: GlobalWindows with PurgingTrigger(CountTrigger(4)) fire every
    4th record of a key; without purging the sum keeps growing."""
    keys = ["key2", "key2", "key2", "key1", "key2", "key2", "key2", "key2", "key2"]
    keys += ["key1", "key1", "key1"]
    source = [Record(k, (k, 1)) for k in keys]
    purging = window(GlobalWindows.create(), reduce=sum_reduce,
                     trigger=PurgingTrigger.of(CountTrigger.of(4)))  # fmt: skip
    out = run(source, purging, **env()).outputs
    assert sorted(_values(out)) == [("key1", 4), ("key2", 4), ("key2", 4)]
    keeping = window(GlobalWindows.create(), reduce=sum_reduce, trigger=CountTrigger.of(4))
    out = run(source, keeping, **env()).outputs
    assert [o for o in _values(out) if o[0] == "key2"] == [("key2", 4), ("key2", 8)]
    assert [o for o in _values(out) if o[0] == "key1"] == [("key1", 4)]


def test_continuous_watermark_trigger(env):
    """testContinuousWatermarkTrigger: GlobalWindows with ContinuousEventTimeTrigger(3 s):
    each key fires on its 3 s grid while the watermark advances, and once more at its
    window's end (end of input)."""
    fn = window(GlobalWindows.create(), process=SumList(),
                trigger=ContinuousEventTimeTrigger.of(3000))  # fmt: skip
    source = _flink_records() + [Watermark(t) for t in (1000, 2000, 3000, 6000, 9000)]
    assert epochs(run(source, fn, **env()).outputs) == [
        ([], 1000),
        ([], 2000),
        ([("key1", 3)], 3000),
        ([("key1", 3), ("key2", 5)], 6000),
        ([("key1", 3), ("key2", 5)], 9000),
        ([("key1", 3), ("key1", 3), ("key2", 5), ("key2", 5)], math.inf),
    ]


def _clocked(steps: list) -> tuple[ManualClock, object]:
    """A source that sets the ManualClock before each group of records."""
    clock = ManualClock()

    def source():
        for time, records in steps:
            clock.set(time)
            yield from records

    return clock, source()


def _values(outputs: list) -> list:
    return [o for o in outputs if type(o) is not Watermark]


def test_processing_time_tumbling_windows(env):
    """testProcessingTimeTumblingWindows: 3 s windows on the operator's clock."""
    clock, source = _clocked([
        (3, [Record("key2", ("key2", 1)), Record("key2", ("key2", 1))]),
        (1000, [Record("key1", ("key1", 1)), Record("key1", ("key1", 1))]),
        (5000, [Record("key2", ("key2", 1))]),  # [0, 3000) fired first
        (7000, [Record("key1", ("key1", 1))]),  # [3000, 6000) fired first
    ])  # fmt: skip
    out = _values(run(source, window(TumblingProcessingTimeWindows.of(3000), reduce=sum_reduce),
                      clock=clock, **env()).outputs)  # fmt: skip
    assert sorted(out[:2]) == [("key1", 2), ("key2", 2)] and out[2:] == [("key2", 1)]


def test_processing_time_sliding_windows(env):
    """testProcessingTimeSlidingWindows: 3 s windows sliding by 1 s on the clock."""
    clock, source = _clocked([
        (3, [Record("key2", ("key2", 1))]),
        (1000, [Record("key2", ("key2", 1))]),  # fires [-2000, 1000): key2 1
        (2500, [Record("key1", ("key1", 1))]),  # fires [-1000, 2000): key2 2
        (3500, [Record("key1", ("key1", 1))]),  # fires [0, 3000): key2 2, key1 1
        (7000, [Record("key3", ("key3", 1))]),  # fires [1000, 4000), [2000, 5000), [3000, 6000)
    ])  # fmt: skip
    fn = window(SlidingProcessingTimeWindows.of(3000, 1000), reduce=sum_reduce)
    out = _values(run(source, fn, clock=clock, **env()).outputs)
    assert out[:2] == [("key2", 1), ("key2", 2)]
    assert sorted(out[2:4]) == [("key1", 1), ("key2", 2)]
    assert sorted(out[4:]) == [("key1", 1), ("key1", 2), ("key1", 2), ("key2", 1)]
    assert [o for o in out[4:] if o[0] == "key1"] == [("key1", 2), ("key1", 2), ("key1", 1)]


def test_processing_time_session_windows(env):
    """testProcessingTimeSessionWindows: a 3 s gap on the operator's clock."""
    clock, source = _clocked([
        (0, [Record("key2", ("key2", 1))]),
        (1002, [Record("key2", ("key2", 1))]),  # merges: [0, 4002)
        (5000, [Record("key2", ("key2", 1))]),  # [0, 4002) fired; new [5000, 8000)
        (5000, [Record("key1", ("key1", 1))]),
        (9000, [Record("key1", ("key1", 1))]),  # [5000, 8000) of both fired
    ])  # fmt: skip
    fn = window(ProcessingTimeSessionWindows.with_gap(3000), process=SumWithWindow())
    out = _values(run(source, fn, clock=clock, **env()).outputs)
    assert out[0] == ("key2-2", 0, 4002)
    assert sorted(out[1:]) == [("key1-1", 5000, 8000), ("key2-1", 5000, 8000)]


def test_lateness(env):
    """testLateness: 2 s windows, 500 ms allowed lateness, purging event-time trigger:
    late records within the lateness fire the window again at once; later ones are
    dropped and counted."""
    fn = window(TumblingEventTimeWindows.of(2000), reduce=sum_reduce,
                trigger=PurgingTrigger.of(EventTimeTrigger()), allowed_lateness=500)  # fmt: skip
    source = [
        rec("key2", 1, 500), Watermark(1500),
        rec("key2", 1, 1300), Watermark(2300),
        rec("key2", 1, 1997), rec("key2", 1, 1998),  # late firings of [0, 2000)
        Watermark(2400),
        Watermark(2500),  # cleanup of [0, 2000)
        rec("key2", 1, 1999),  # dropped
        Watermark(6000),
    ]  # fmt: skip
    result = run(source, fn, **env())
    assert epochs(result.outputs) == [
        ([], 1500), ([("key2", 2)], 2300), ([("key2", 1), ("key2", 1)], 2400),
        ([], 2500), ([], 6000), ([], math.inf),
    ]  # fmt: skip
    assert result.metrics["late_records_dropped"] == 1


@pytest.mark.parametrize(
    "assigner",
    [TumblingEventTimeWindows.of(2000), SlidingEventTimeWindows.of(2000, 1000),
     EventTimeSessionWindows.with_gap(2000)],
    ids=["tumbling", "sliding", "session"],
)  # fmt: skip
def test_side_output_due_to_lateness(env, assigner):
    """testSideOutputDueToLatenessTumbling / Sliding / SessionZeroLateness..."""
    fn = window(assigner, reduce=sum_reduce, late_data_tag="late")
    source = [rec("key2", 1, 0), rec("key2", 1, 1999), Watermark(5000),
              rec("key2", 7, 1998), rec("key2", 1, 6000)]  # fmt: skip
    result = run(source, fn, **env())
    assert result.side_outputs == {"late": [("key2", 7)]}
    assert result.metrics["late_records_dropped"] == 0
    assert _values(result.outputs)[-1] == ("key2", 1)


def test_side_output_with_lateness_keeps_records_inside_it(env):
    """testSideOutputDueToLatenessSessionWithLateness: inside the lateness a record
    re-fires its (merged) session; beyond it, it goes to the side output."""
    fn = window(EventTimeSessionWindows.with_gap(1000), reduce=sum_reduce,
                allowed_lateness=1000, late_data_tag="late")  # fmt: skip
    source = [
        rec("key2", 1, 0), rec("key2", 1, 500), Watermark(1600),  # [0, 1500) fires: 2
        rec("key2", 5, 800),  # within lateness: merged, fires again: 7
        Watermark(2600),  # cleanup of [0, 1800)... at 1800 + 1000 = 2800: still there
        rec("key2", 3, 1700),  # [1700, 2700) touches [0, 1800): late firing 10
        Watermark(3800),  # cleanup at 2700 + 1000
        rec("key2", 9, 100),  # beyond the lateness: side output
    ]  # fmt: skip
    result = run(source, fn, **env())
    assert epochs(result.outputs) == [
        ([("key2", 2)], 1600), ([("key2", 7)], 2600), ([("key2", 10)], 3800), ([], math.inf),
    ]  # fmt: skip
    assert result.side_outputs == {"late": [("key2", 9)]}


def test_cleanup_time_overflow(env):
    """testCleanupTimeOverflow: an allowed lateness at the top of the number range
    never makes a window late, and cleanup never comes."""
    for lateness in (sys.float_info.max, math.inf):
        fn = window(TumblingEventTimeWindows.of(1000), reduce=sum_reduce,
                    allowed_lateness=lateness, late_data_tag="late")  # fmt: skip
        source = [rec("key2", 1, 3999), Watermark(1e300), rec("key2", 1, 3000)]
        result = run(source, fn, **env())
        assert epochs(result.outputs) == [([("key2", 1)], 1e300), ([("key2", 2)], math.inf)]
        assert result.side_outputs == {}
