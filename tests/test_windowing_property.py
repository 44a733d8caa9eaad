"""Properties of windows: the asynchronous run equals the synchronous one for every
assigner and trigger under random batch-completion schedules (Memory and RocksDB),
and the synchronous run equals a small reference model of Flink's WindowOperator
(tumbling, sliding, sessions; allowed lateness, late firings, the late side output)."""

from __future__ import annotations

import itertools
import math
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from windowing_cases import (
    SYNC,
    SumAggregate,
    SumList,
    SumWithWindow,
    run,
    sum_reduce,
    window_sources,
)

from aec import AecConfig, Record, Watermark
from aec.testing import assert_equivalent
from aec.windowing import (
    ContinuousEventTimeTrigger,
    CountEvictor,
    CountTrigger,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeEvictor,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    window,
)
from backends import RocksDBBackend

# Windows read state in timers that later records of the key write (late firings,
# merging), so only the serial watermark order promises the synchronous answer.
SERIAL = (
    AecConfig(buffer_size=2, in_flight_records_limit=8),
    AecConfig(buffer_size=1, in_flight_records_limit=1),
    AecConfig(buffer_size=5, in_flight_records_limit=40),
)

EVENT_TIME = {
    "tumbling-aggregate": lambda: window(TumblingEventTimeWindows.of(10), aggregate=SumAggregate()),
    "tumbling-late-tag": lambda: window(TumblingEventTimeWindows.of(10, 3), reduce=sum_reduce,
                                        allowed_lateness=7, late_data_tag="late"),
    "sliding-panes": lambda: window(SlidingEventTimeWindows.of(12, 4), aggregate=SumAggregate(),
                                    allowed_lateness=5),
    # no lateness: panes in chain mode (aec.windowing.sliding), a late side output
    "sliding-chain": lambda: window(SlidingEventTimeWindows.of(12, 4), aggregate=SumAggregate(),
                                    late_data_tag="late"),
    "sliding-list": lambda: window(SlidingEventTimeWindows.of(10, 4), process=SumList()),
    "session-reduce": lambda: window(EventTimeSessionWindows.with_gap(5), reduce=sum_reduce,
                                     allowed_lateness=4, late_data_tag="late"),
    "session-process": lambda: window(EventTimeSessionWindows.with_gap(4),
                                      process=SumWithWindow()),
    "session-count": lambda: window(EventTimeSessionWindows.with_gap(6), reduce=sum_reduce,
                                    trigger=PurgingTrigger.of(CountTrigger.of(3))),
    "session-continuous": lambda: window(EventTimeSessionWindows.with_gap(6), process=SumList(),
                                         trigger=ContinuousEventTimeTrigger.of(4)),
    "tumbling-continuous": lambda: window(TumblingEventTimeWindows.of(20), reduce=sum_reduce,
                                          trigger=ContinuousEventTimeTrigger.of(5)),
    "global-count": lambda: window(GlobalWindows.create(), reduce=sum_reduce,
                                   trigger=CountTrigger.of(3)),
    "global-purging-count": lambda: window(GlobalWindows.create(), aggregate=SumAggregate(),
                                           trigger=PurgingTrigger.of(CountTrigger.of(2))),
    "count-evictor": lambda: window(TumblingEventTimeWindows.of(15), process=SumList(),
                                    evictor=CountEvictor.of(2), trigger=CountTrigger.of(2)),
    "time-evictor": lambda: window(SlidingEventTimeWindows.of(10, 5), aggregate=SumAggregate(),
                                   evictor=TimeEvictor.of(3, do_evict_after=True)),
}  # fmt: skip

PROCESSING_TIME = {
    "processing-tumbling": lambda: window(TumblingProcessingTimeWindows.of(3), reduce=sum_reduce),
    "processing-sliding": lambda: window(SlidingProcessingTimeWindows.of(4, 2),
                                         aggregate=SumAggregate()),
    "processing-session": lambda: window(ProcessingTimeSessionWindows.with_gap(2),
                                         process=SumWithWindow()),
}  # fmt: skip


def sources(max_size: int = 30) -> st.SearchStrategy[list]:
    """Records of keys a/b/c with timestamps in [0, 60) and rising watermarks."""
    return window_sources(max_size, watermark_odds=5, max_value=5)


@pytest.mark.parametrize("name", list(EVENT_TIME))
@given(source=sources(), data=st.data())
def test_async_equals_sync_on_memory(name, source, data):
    assert_equivalent(EVENT_TIME[name], source, configs=SERIAL, data=data)


@pytest.mark.parametrize("name", list(PROCESSING_TIME))
@given(source=sources(), advances=st.lists(st.sampled_from([0, 0, 1, 2, 5]), max_size=30),
       data=st.data())  # fmt: skip
def test_processing_time_async_equals_sync(name, source, advances, data):
    source = [Record(e.key, e.value) if type(e) is Record else e for e in source]
    assert_equivalent(PROCESSING_TIME[name], source, configs=SERIAL, data=data,
                      clock_advances=advances)  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [
        "tumbling-late-tag",
        "sliding-panes",
        "sliding-chain",
        "session-reduce",
        "session-count",
        "count-evictor",
    ],
)
@settings(max_examples=10)
@given(source=sources(20), data=st.data())
def test_async_equals_sync_on_rocksdb(name, source, data):
    with tempfile.TemporaryDirectory() as directory:
        paths = (f"{directory}/db{i}" for i in itertools.count())
        assert_equivalent(EVENT_TIME[name], source, configs=SERIAL[:1], data=data,
                          backend_factory=lambda: RocksDBBackend(next(paths)))  # fmt: skip


# -- a reference model of Flink's WindowOperator with the event-time trigger -----------------


def model(source: list, assign, lateness: float, merging: bool) -> tuple[list, list]:
    """Epochs of ``{key: [(start, end, total), ...]}`` and the late records."""
    windows: dict = {}  # key -> {TimeWindow: total}
    watermark, epochs, current, late = -math.inf, [], {}, []

    def emit(key, w):
        current.setdefault(key, []).append((w.start, w.end, windows[key][w]))

    for element in [*source, Watermark(math.inf)]:
        if type(element) is Watermark:
            for key in sorted(windows):
                mine = windows[key]
                for w in sorted(mine, key=lambda w: (w.end, w.start)):
                    if watermark < w.end <= element.timestamp:
                        emit(key, w)
                for w in [w for w in mine if w.end + lateness <= element.timestamp]:
                    del mine[w]
            watermark = element.timestamp
            epochs.append(current)
            current = {}
            continue
        key, value, t = element.key, element.value[1], element.timestamp
        mine = windows.setdefault(key, {})
        accepted = False
        for w in assign(t):
            if merging:
                touching = [o for o in mine if o.intersects(w)]
                cover = w
                for o in touching:
                    cover = cover.cover(o)
                total = sum(mine.pop(o) for o in touching)
                if cover.end + lateness <= watermark:
                    continue  # the model drops the merged contents with the retired window
                mine[cover] = total
                w = cover
            elif w.end + lateness <= watermark:
                continue
            accepted = True
            mine[w] = mine.get(w, 0) + value
            if w.end <= watermark:
                emit(key, w)
        if not accepted and t + lateness <= watermark:
            late.append(element.value)
    return epochs, late


def observed(outputs: list) -> list:
    epochs, current = [], {}
    for item in outputs:
        if type(item) is Watermark:
            epochs.append(current)
            current = {}
        else:
            key = item[0].split("-")[0]
            current.setdefault(key, []).append(item[1:])
    return epochs


class Totals(SumWithWindow):
    def process(self, key, context, elements):
        w = context.window()
        return [(f"{key}-", w.start, w.end, elements[0][1])]


@pytest.mark.parametrize(
    "assigner, lateness",
    [
        (TumblingEventTimeWindows.of(10), 0),
        (TumblingEventTimeWindows.of(10, -4), 6),
        (SlidingEventTimeWindows.of(12, 4), 0),
        (SlidingEventTimeWindows.of(12, 4, 1), 9),
        (SlidingEventTimeWindows.of(10, 4), 3),
        (EventTimeSessionWindows.with_gap(5), 0),
    ],
    ids=["tumbling", "tumbling-late", "sliding", "sliding-late", "sliding-gcd2", "session"],
)
@given(source=sources(40))
def test_sync_run_equals_the_reference_model(assigner, lateness, source):
    fn = window(assigner, reduce=sum_reduce, process=Totals(), allowed_lateness=lateness,
                late_data_tag="late")  # fmt: skip
    result = run(source, fn, SYNC)
    want, late = model(source, lambda t: assigner.assign_windows(None, t), lateness,
                       assigner.merging)  # fmt: skip
    assert observed(result.outputs) == want
    assert result.side_outputs.get("late", []) == late


def test_window_starts_follow_the_offset_grid_without_drift():
    """Starts are ``offset + floor((t - offset) / size) * size``, never ``t - t % size``."""
    for size, offset in [(0.1, 0), (3600, 600), (0.7, -0.3), (10, 3)]:
        assigner = TumblingEventTimeWindows.of(size, offset)
        for t in [x / 7 for x in range(-200, 200)] + [1e9 + 0.5]:
            (w,) = assigner.assign_windows(None, t)
            assert w.start == offset + math.floor((t - offset) / size) * size
            assert w.end == w.start + size
    sliding = SlidingEventTimeWindows.of(1.0, 0.25, 0.05)
    for t in [x / 7 for x in range(-20, 20)]:
        starts = [w.start for w in sliding.assign_windows(None, t)]
        last = 0.05 + math.floor((t - 0.05) / 0.25) * 0.25
        assert starts[0] == last and len(starts) == 4
        assert all(s <= t < s + 1.0 for s in starts)
    assert TumblingEventTimeWindows.of(3600, 600).assign_windows(None, 7000) == [
        TimeWindow(4200, 7800)
    ]


@pytest.mark.parametrize("t", [0, 7, -3, 2.5, -1e9, 1e15, 10**20])
def test_a_session_window_is_the_checked_window_of_its_timestamp(t):
    (window,) = EventTimeSessionWindows.with_gap(30).assign_windows(None, t)
    assert window == TimeWindow(t, t + 30)
    assert type(window.start) is type(t)


@pytest.mark.parametrize(
    ("t", "error", "message"),
    [(True, TypeError, "start must be a number"), (math.nan, ValueError, "start is NaN")],
)
def test_a_session_window_of_a_bad_timestamp_still_names_what_is_wrong(t, error, message):
    with pytest.raises(error, match=message):
        EventTimeSessionWindows.with_gap(30).assign_windows(None, t)
