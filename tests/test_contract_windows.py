"""Contract tests: windows on async state (Flink's
WindowOperator semantics, PyFlink's names). Black-box against a reference model
(tests/contract_window_model.py) and hand-computed Flink answers."""

from __future__ import annotations

import math
import pickle
import sys

import cloudpickle
import pytest
from contract_window_model import WindowModel, assert_matches_model, records
from hypothesis import given
from hypothesis import strategies as st

import aec
from aec import (
    AecConfig,
    AggregateFunction,
    JobFailure,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.clock import ManualClock
from aec.keygroups import key_group_for, key_group_range_for
from aec.testing import ScriptedExecutor, assert_equivalent
from aec.windowing import (
    ContinuousEventTimeTrigger,
    CountEvictor,
    CountTrigger,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeEvictor,
    TimeWindow,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    window,
)
from backends import LatencyBackend, MemoryBackend

SYNC = AecConfig(async_state=False)
# Spark's Python workers cannot import this test module: ship its classes by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Describe(ProcessWindowFunction):
    """Emits ``(key, start, end, sorted values)``: what the model emits."""

    def process(self, key, context, elements):
        w = context.window()
        return [(key, w.start, w.end, tuple(sorted(elements)))]


class Count(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + 1

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


class WithWindow(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        return [(key, w.start, w.end, list(elements))]


def _values(outputs):
    return [o for o in outputs if not isinstance(o, Watermark)]


def _run(source, fn, config=None, **kw):
    return aec.run_keyed(source, fn, config=config, **kw)


# -- construction errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: TumblingEventTimeWindows.of(0),
        lambda: TumblingEventTimeWindows.of(-5),
        lambda: TumblingEventTimeWindows.of(10, 10),
        lambda: TumblingEventTimeWindows.of(10, -10),
        lambda: TumblingEventTimeWindows.of(10, 11),
        lambda: SlidingEventTimeWindows.of(0, 5),
        lambda: SlidingEventTimeWindows.of(10, 0),
        lambda: SlidingEventTimeWindows.of(10, -1),
        lambda: SlidingEventTimeWindows.of(10, 5, 5),
        lambda: SlidingEventTimeWindows.of(10, 5, -5),
        lambda: EventTimeSessionWindows.with_gap(0),
        lambda: EventTimeSessionWindows.with_gap(-1),
        lambda: TumblingProcessingTimeWindows.of(0),
        lambda: SlidingProcessingTimeWindows.of(10, 0),
        lambda: ProcessingTimeSessionWindows.with_gap(0),
        lambda: ContinuousEventTimeTrigger.of(0),
        lambda: ContinuousEventTimeTrigger.of(-2),
        lambda: CountTrigger.of(0),
        lambda: CountTrigger.of(-1),
        lambda: window(TumblingEventTimeWindows.of(10), allowed_lateness=-1),
        lambda: window(TumblingEventTimeWindows.of(10), aggregate=Count(), reduce=lambda a, b: a),
    ],
)
def test_value_errors_at_construction(build):
    with pytest.raises(ValueError):
        build()


def test_offsets_inside_the_range_are_accepted():
    TumblingEventTimeWindows.of(10, 9.5)
    TumblingEventTimeWindows.of(10, -9.5)
    SlidingEventTimeWindows.of(10, 5, 4)
    SlidingEventTimeWindows.of(10, 5, -4)
    CountTrigger.of(1)
    window(TumblingEventTimeWindows.of(10), allowed_lateness=0)


# -- TimeWindow, window starts ------------------------------------------------------------------


def test_time_window_is_frozen_hashable_half_open():
    w = TimeWindow(0, 10)
    assert w == TimeWindow(0, 10) and hash(w) == hash(TimeWindow(0, 10))
    assert {w: 1}[TimeWindow(0, 10)] == 1
    with pytest.raises(AttributeError):
        w.start = 3  # type: ignore[misc]
    assert (w.start, w.end) == (0, 10)
    assert GlobalWindow() == GlobalWindow()


@pytest.mark.parametrize("size,offset", [(0.1, 0.0), (3.0, 1.0), (7.0, -2.5), (0.3, 0.05)])
def test_window_starts_follow_the_grid_formula(size, offset):
    times = [0.3, 0.7, 1.0, 2.9999, 5.55, 12.345, -0.2, 100.1]
    source = [Record("k", t, timestamp=t) for t in times]
    out = _values(_run(source, window(TumblingEventTimeWindows.of(size, offset), process=WithWindow())).outputs)
    seen = {v: (s, e) for _, s, e, vs in out for v in vs}
    for t in times:
        s, e = seen[t]
        assert s == offset + math.floor((t - offset) / size) * size
        # the contract's formula can put t at the rounded end (100.1 with size 0.1:
        # start 100.0, end 100.0 + 0.1 == 100.1); the formula wins, see the report
        assert s <= t and (t < e or math.isclose(t, e))
        assert e == s + size


def test_sliding_windows_are_every_grid_start_holding_t():
    fn = window(SlidingEventTimeWindows.of(10, 3, 1), process=WithWindow())
    out = _values(_run([Record("k", "x", timestamp=12.0)], fn).outputs)
    starts = sorted(s for _, s, _, _ in out)
    assert starts == [4.0, 7.0, 10.0]  # 1 + 3k with s <= 12 < s + 10
    assert all(e - s == 10 for _, s, e, _ in out)


# -- event time against the model ---------------------------------------------------------------


def _assigner(kind, size, slide, gap, offset=0.0):
    if kind == "tumbling":
        return TumblingEventTimeWindows.of(size, offset)
    if kind == "sliding":
        return SlidingEventTimeWindows.of(size, slide, offset)
    return EventTimeSessionWindows.with_gap(gap)


CASES = {
    "tumbling_on_time": ("tumbling", 10, None, None, 0, [
        ("a", 1, 1.0), ("b", 2, 3.0), ("a", 3, 12.0), ("W", 9.0), ("a", 4, 9.5),
        ("W", 10.0), ("a", 5, 15.0), ("b", 6, 25.0), ("W", 30.0), ("a", 7, 31.0),
    ]),
    "tumbling_lateness_late_firing_and_cleanup": ("tumbling", 10, None, None, 5, [
        ("a", 1, 1.0), ("a", 2, 11.0), ("W", 12.0), ("a", 3, 2.0), ("a", 4, 3.0),
        ("W", 14.9), ("a", 5, 4.0), ("W", 15.0), ("a", 6, 5.0), ("a", 7, 19.0),
    ]),
    "tumbling_late_dropped": ("tumbling", 10, None, None, 0, [
        ("a", 1, 1.0), ("W", 10.0), ("a", 2, 9.99), ("a", 3, 10.0), ("b", 4, 0.0),
    ]),
    "sliding_with_lateness": ("sliding", 10, 5, None, 3, [
        ("a", 1, 1.0), ("a", 2, 6.0), ("W", 10.0), ("a", 3, 7.0), ("W", 13.0),
        ("a", 4, 8.0), ("a", 5, 12.0), ("W", 40.0),
    ]),
    "session_touching_merge": ("session", None, None, 5, 0, [
        ("a", 1, 0.0), ("a", 2, 10.0), ("a", 3, 5.0), ("b", 4, 0.0), ("b", 5, 6.0), ("W", 30.0),
    ]),
    "session_late_merge_refires": ("session", None, None, 5, 10, [
        ("a", 1, 0.0), ("a", 2, 3.0), ("W", 9.0), ("a", 3, 4.0), ("a", 4, 8.5),
        ("W", 30.0), ("a", 5, 1.0),
    ]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("config", [None, SYNC], ids=["async", "sync"])
def test_event_time_matches_the_model(name, config):
    kind, size, slide, gap, lateness, items = CASES[name]
    source = records(items)
    model = WindowModel(kind, size, slide, gap, lateness)
    expected = model.run(source)
    fn = window(_assigner(kind, size, slide, gap), process=Describe(), allowed_lateness=lateness,
                late_data_tag="late")
    result = _run(source, fn, config)
    assert_matches_model(result.outputs, expected, one_window_per_record=kind != "sliding")
    assert sorted(result.side_outputs.get("late", [])) == sorted(model.late)


def test_hand_computed_tumbling_answer():
    """Flink's answer, by hand: windows fire at the watermark reaching end, before it."""
    source = records([("a", 1, 1.0), ("a", 2, 9.0), ("a", 3, 10.0), ("W", 10.0), ("a", 4, 12.0)])
    out = _run(source, window(TumblingEventTimeWindows.of(10), process=Describe())).outputs
    assert out == [
        ("a", 0.0, 10.0, (1, 2)), Watermark(10.0), ("a", 10.0, 20.0, (3, 4)), Watermark(math.inf),
    ]


def test_late_records_dropped_metric_without_tag():
    source = records([("a", 1, 1.0), ("W", 10.0), ("a", 2, 2.0), ("b", 3, 5.0), ("a", 4, 11.0)])
    result = _run(source, window(TumblingEventTimeWindows.of(10), reduce=lambda a, b: a + b))
    assert result.metrics["late_records_dropped"] == 2
    assert _values(result.outputs) == [1, 4]
    assert result.side_outputs.get("late", []) == []


def test_late_side_output_carries_the_value():
    source = records([("a", 1, 1.0), ("W", 10.0), ("a", 2, 2.0), ("b", 3, 5.0)])
    result = _run(source, window(TumblingEventTimeWindows.of(10), late_data_tag="late"))
    assert result.side_outputs["late"] == [2, 3]
    assert result.metrics.get("late_records_dropped", 0) == 0


def test_record_without_timestamp_fails_the_run_naming_the_timestamp():
    with pytest.raises((JobFailure, ValueError, TypeError), match="(?i)timestamp"):
        _run([Record("a", 1)], window(TumblingEventTimeWindows.of(10)))


# -- property: random inputs against the model --------------------------------------------------


@st.composite
def _inputs(draw):
    n = draw(st.integers(0, 25))
    items, w = [], -1.0
    for _ in range(n):
        if draw(st.integers(0, 4)) == 0:
            w = w + draw(st.sampled_from([0.0, 0.5, 1.0, 3.0, 7.0]))
            items.append(("W", w))
        else:
            key = draw(st.sampled_from(["a", "b", "c"]))
            t = draw(st.integers(-2, 30)) / 2
            items.append((key, len(items), t))
    return items


@given(
    items=_inputs(),
    shape=st.sampled_from([
        ("tumbling", 4, None, None), ("tumbling", 2.5, None, None), ("sliding", 6, 2, None),
        ("sliding", 3, 1.5, None), ("session", None, None, 2), ("session", None, None, 3.5),
    ]),
    lateness=st.sampled_from([0, 1, 4]),
    mode=st.sampled_from(["sync", "async", "scripted"]),
    seed=st.integers(0, 2**16),
)
def test_random_inputs_match_the_model(items, shape, lateness, mode, seed):
    """Also with batches completed in a random order (ScriptedExecutor, small buffers)."""
    kind, size, slide, gap = shape
    source = records(items)
    model = WindowModel(kind, size, slide, gap, lateness)
    expected = model.run(source)
    fn = window(_assigner(kind, size, slide, gap), process=Describe(), allowed_lateness=lateness,
                late_data_tag="late")
    if mode == "scripted":
        result = aec.run_keyed(source, fn, config=AecConfig(buffer_size=3),
                               executor=ScriptedExecutor(seed))
    else:
        result = _run(source, fn, SYNC if mode == "sync" else None)
    assert_matches_model(result.outputs, expected, one_window_per_record=kind != "sliding")
    assert sorted(result.side_outputs.get("late", [])) == sorted(model.late)


def test_async_equals_sync_on_a_remote_backend():
    items = [("a", 1, 1.0), ("b", 2, 2.0), ("a", 3, 4.0), ("W", 5.0), ("a", 4, 3.0),
             ("b", 5, 9.0), ("W", 12.0), ("a", 6, 30.0)]
    assert_equivalent(
        lambda: window(SlidingEventTimeWindows.of(6, 3), aggregate=Count(), allowed_lateness=2),
        records(items),
        backend_factory=lambda: LatencyBackend(MemoryBackend(), 0.001),
    )


# -- sessions -----------------------------------------------------------------------------------


def test_session_merges_accumulators_through_merge():
    merges = []

    class Tracked(Count):
        def merge(self, a, b):
            merges.append((a, b))
            return a + b

    source = records([("a", "x", 0.0), ("a", "y", 10.0), ("a", "z", 5.0)])
    out = _values(_run(source, window(EventTimeSessionWindows.with_gap(5), aggregate=Tracked(),
                                      process=WithWindow())).outputs)
    assert out == [("a", 0.0, 15.0, [3])]
    assert merges  # accumulators were merged, not recomputed


def test_session_reduce_merges_too():
    source = records([("a", 1, 0.0), ("a", 2, 4.0), ("a", 4, 20.0), ("a", 8, 8.0)])
    out = _values(_run(source, window(EventTimeSessionWindows.with_gap(4),
                                      reduce=lambda a, b: a + b)).outputs)
    assert out == [11, 4]  # [0, 12) merges 1, 2, 8 (touching); [20, 24) holds 4


def test_session_dynamic_gap():
    fn = window(EventTimeSessionWindows.with_dynamic_gap(lambda v: v), process=WithWindow())
    source = records([("a", 2, 0.0), ("a", 1, 3.0), ("a", 1, 2.0)])
    out = _values(_run(source, fn).outputs)
    # [0,2) and [2,3) touch, [3,4) touches [2,3): one session [0, 4)
    assert out == [("a", 0.0, 4.0, [2, 1, 1])] or [o[:3] for o in out] == [("a", 0.0, 4.0)]


def test_session_trigger_state_merges_with_count_trigger():
    fn = window(EventTimeSessionWindows.with_gap(5), trigger=CountTrigger.of(3), process=WithWindow())
    source = records([("a", 1, 0.0), ("a", 2, 10.0), ("a", 3, 5.0)])
    out = _values(_run(source, fn).outputs)
    # 1 and 2 are one element each in separate sessions; 3's [5, 10) touches both: the
    # merged count is 3 (Flink's CountTrigger.onMerge merges the count), so the merged
    # window fires once with all three
    assert [(s, e, sorted(vs)) for _, s, e, vs in out] == [(0.0, 15.0, [1, 2, 3])]


# -- triggers and evictors ----------------------------------------------------------------------


def test_global_windows_never_fire_without_a_trigger():
    source = records([("a", 1, 1.0), ("W", 100.0), ("a", 2, 200.0)])
    assert _values(_run(source, window(GlobalWindows.create())).outputs) == []


def test_count_trigger_fire_keeps_contents():
    fn = window(GlobalWindows.create(), trigger=CountTrigger.of(2))
    out = _values(_run([Record("a", i) for i in range(5)], fn).outputs)
    assert out == [[0, 1], [0, 1, 2, 3]]


def test_purging_trigger_clears_contents():
    fn = window(GlobalWindows.create(), trigger=PurgingTrigger.of(CountTrigger.of(2)))
    out = _values(_run([Record("a", i) for i in range(5)], fn).outputs)
    assert out == [[0, 1], [2, 3]]


def test_continuous_event_time_trigger():
    fn = window(TumblingEventTimeWindows.of(10), trigger=ContinuousEventTimeTrigger.of(3),
                reduce=lambda a, b: a + b)
    source = records([("a", 1, 1.0), ("W", 3.0), ("a", 4, 4.0), ("W", 7.0), ("W", 20.0)])
    out = _run(source, fn).outputs
    assert out == [1, Watermark(3.0), 5, Watermark(7.0), 5, 5, Watermark(20.0), Watermark(math.inf)]


def test_custom_trigger_results_and_partitioned_state():
    class EveryOther(Trigger):
        """Fires on every second element, purging; a StateFuture result for the first."""

        def on_element(self, value, timestamp, window, ctx):
            seen = ctx.get_partitioned_state(ValueStateDescriptor("seen", default=0))

            future = seen.async_value()

            def after(n):
                if n == 1:
                    return seen.async_clear().then_apply(lambda _: TriggerResult.FIRE_AND_PURGE)
                return seen.async_update(n + 1).then_apply(lambda _: TriggerResult.CONTINUE)

            return future.then_compose(after)

        def clear(self, window, ctx):
            return ctx.get_partitioned_state(ValueStateDescriptor("seen", default=0)).async_clear()

    fn = window(GlobalWindows.create(), trigger=EveryOther())
    out = _values(_run([Record("a", i) for i in range(5)] + [Record("b", 9)], fn).outputs)
    assert out == [[0, 1], [2, 3]]


def test_count_evictor_before_and_after():
    source = records([("a", 1, 1.0), ("a", 2, 2.0), ("W", 10.0), ("a", 3, 3.0)])
    before = window(TumblingEventTimeWindows.of(10), evictor=CountEvictor.of(1), allowed_lateness=10)
    after = window(TumblingEventTimeWindows.of(10), evictor=CountEvictor.of(1, do_evict_after=True),
                   allowed_lateness=10)
    assert _values(_run(source, before).outputs) == [[2], [3]]
    assert _values(_run(source, after).outputs) == [[1, 2], [2, 3]]


def test_time_evictor_keeps_recent_values():
    source = records([("a", 1, 1.0), ("a", 5, 5.0), ("a", 8, 8.0)])
    fn = window(TumblingEventTimeWindows.of(10), evictor=TimeEvictor.of(4))
    assert _values(_run(source, fn).outputs) == [[5, 8]]


# -- process window function --------------------------------------------------------------------


class Stateful(ProcessWindowFunction):
    cleared: list = []

    def process(self, key, context, elements):
        per_window = context.window_state().get_state(ValueStateDescriptor("fired", default=0))
        per_key = context.global_state().get_state(ValueStateDescriptor("total", default=0))
        n, total = per_window.value() + 1, per_key.value() + 1
        per_window.update(n)
        per_key.update(total)
        return [(key, context.window().start, n, total, context.current_watermark(), list(elements))]

    def clear(self, context):
        type(self).cleared.append((context.window().start, context.current_watermark()))
        context.window_state().get_state(ValueStateDescriptor("fired", default=0)).clear()


def test_window_and_global_state_and_clear_at_cleanup():
    Stateful.cleared = []
    source = records([("a", 1, 1.0), ("a", 2, 12.0), ("W", 10.0), ("a", 3, 2.0), ("W", 14.0),
                      ("W", 20.0)])
    fn = window(TumblingEventTimeWindows.of(10), aggregate=Count(), process=Stateful(),
                allowed_lateness=5)
    out = _values(_run(source, fn).outputs)
    assert out == [
        ("a", 0.0, 1, 1, 10.0, [1]),
        ("a", 0.0, 2, 2, 10.0, [2]),  # late firing: window state kept, per-key state shared
        ("a", 10.0, 1, 3, 20.0, [1]),
    ]
    assert (0.0, 15.0) in [(s, w) for s, w in Stateful.cleared] or any(
        s == 0.0 and w >= 15.0 for s, w in Stateful.cleared
    )
    assert sorted(s for s, _ in Stateful.cleared) == [0.0, 10.0]


def test_async_process_function():
    class Async(ProcessWindowFunction):
        async def process(self, key, context, elements):
            total = context.global_state().get_state(ValueStateDescriptor("n", default=0))
            n = await total.async_value()
            await total.async_update(n + 1)
            return [(key, n, sorted(elements))]

    source = records([("a", 1, 1.0), ("a", 2, 11.0), ("b", 3, 2.0)])
    out = _values(_run(source, window(TumblingEventTimeWindows.of(10), process=Async())).outputs)
    assert sorted(out) == [("a", 0, [1]), ("a", 1, [2]), ("b", 0, [3])]


# -- processing time ----------------------------------------------------------------------------


def test_processing_time_windows_follow_the_operator_clock():
    clock = ManualClock()

    def source():
        clock.set(1.0)
        yield Record("a", 1)
        clock.advance(1.0)  # to 2.0
        yield Record("a", 2)
        clock.set(10.0)
        yield Record("b", 3)
        clock.set(15.0)
        yield Record("a", 4)
        clock.set(25.0)
        yield Record("a", 5)

    fn = window(TumblingProcessingTimeWindows.of(10), process=WithWindow())
    out = _values(_run(source(), fn, clock=clock).outputs)
    assert out[0] == ("a", 0.0, 10.0, [1, 2])  # fired once the clock reached 10
    fired = {(k, s): vs for k, s, _, vs in out}
    assert fired[("a", 0.0)] == [1, 2]
    assert fired[("b", 10.0)] == [3]
    assert fired[("a", 10.0)] == [4]
    assert len(out) == 3 and ("a", 20.0) not in fired  # the clock never reached 30


# -- checkpoints, rescaling, pickling -----------------------------------------------------------


def test_window_function_checkpoints_and_rescales(tmp_path):
    max_p = 8
    config = AecConfig(max_parallelism=max_p)
    items = [(f"k{i % 5}", i, float(i % 17)) for i in range(40)]
    for at in (10, 25):
        items.insert(at, ("W", float(at // 3)))
    source = records(items)

    def make():
        return window(EventTimeSessionWindows.with_gap(2), process=Describe(), allowed_lateness=3)

    expected = _run(source, make(), config).outputs
    cut = 21
    op = KeyedProcessOperator(make(), MemoryBackend(), config)
    op.open()
    for e in source[:cut]:
        op.process_watermark(e) if isinstance(e, Watermark) else op.process(e)
    handle = op.snapshot(1, tmp_path)
    outputs = op.drain_outputs()
    op.close()
    parts = [KeyedProcessOperator(make(), MemoryBackend(), config,
                                  key_group_range=key_group_range_for(max_p, 2, i)) for i in range(2)]
    for part in parts:
        part.restore(handle)
    for e in source[cut:]:
        if isinstance(e, Watermark):
            for part in parts:
                part.process_watermark(e)
        else:
            parts[0 if key_group_for(e.key, max_p) in parts[0].key_group_range else 1].process(e)
    for part in parts:
        part.finish()
        outputs += part.drain_outputs()
        part.close()

    def per_key(items):
        out = {}
        for o in items:
            if not isinstance(o, Watermark):
                out.setdefault(o[0], []).append(o)
        return out

    assert per_key(outputs) == per_key(expected)


def test_window_function_is_picklable():
    fn = window(SlidingEventTimeWindows.of(10, 5), aggregate=Count(), process=Describe(),
                trigger=PurgingTrigger.of(CountTrigger.of(2)), allowed_lateness=1,
                late_data_tag="late")
    clone = pickle.loads(cloudpickle.dumps(fn))
    source = records([("a", 1, 1.0), ("a", 2, 2.0), ("b", 3, 3.0)])
    assert _run(source, clone).outputs == _run(source, fn).outputs


def test_rescale_when_trigger_state_exists_in_only_some_checkpoints(tmp_path):
    """Trigger state (``get_partitioned_state``) is made on demand: an operator whose
    key groups saw no record has none, yet its checkpoint belongs to the same function
    and must merge with the others (contract: window functions are rescaled)."""
    max_p = 8
    config = AecConfig(max_parallelism=max_p)
    ranges = [key_group_range_for(max_p, 2, i) for i in range(2)]
    keys = [f"k{i}" for i in range(50)]
    first = [k for k in keys if key_group_for(k, max_p) in ranges[0]][:3]
    every = keys[:12]
    before = [Record(k, i, timestamp=float(i)) for i, k in enumerate(first * 3)]
    after = [Record(k, 100 + i, timestamp=float(20 + i)) for i, k in enumerate(every * 2)]

    def make():
        return window(TumblingEventTimeWindows.of(10), trigger=CountTrigger.of(2),
                      reduce=lambda a, b: a + b)

    expected = _values(_run(before + after, make(), config).outputs)
    handles, outputs = [], []
    for i, r in enumerate(ranges):
        op = KeyedProcessOperator(make(), MemoryBackend(), config, key_group_range=r)
        op.open()
        for e in before:
            if key_group_for(e.key, max_p) in r:
                op.process(e)
        handles.append(op.snapshot(1, tmp_path / f"p{i}"))
        outputs += _values(op.drain_outputs())
        op.close()
    for i in range(3):
        r = key_group_range_for(max_p, 3, i)
        op = KeyedProcessOperator(make(), MemoryBackend(), config, key_group_range=r)
        op.restore(handles)
        for e in after:
            if key_group_for(e.key, max_p) in r:
                op.process(e)
        op.finish()
        outputs += _values(op.drain_outputs())
        op.close()
    assert sorted(outputs) == sorted(expected)


def test_window_returns_a_keyed_process_function():
    assert isinstance(window(TumblingEventTimeWindows.of(1)), aec.KeyedProcessFunction)


def test_trigger_fire_keeps_and_purge_clears():
    class Signals(Trigger):
        def on_element(self, value, timestamp, window, ctx):
            return {"fire": TriggerResult.FIRE, "purge": TriggerResult.PURGE}.get(
                value, TriggerResult.CONTINUE
            )

    fn = window(GlobalWindows.create(), trigger=Signals())
    source = [Record("a", v) for v in ("x", "fire", "y", "fire", "purge", "z", "fire")]
    assert _values(_run(source, fn).outputs) == [
        ["x", "fire"], ["x", "fire", "y", "fire"], ["z", "fire"],
    ]


def test_trigger_context_timers_and_watermark():
    class TwoAfter(Trigger):
        """Fires two seconds (event time) after each element; records the watermark."""

        def on_element(self, value, timestamp, window, ctx):
            ctx.register_event_time_timer(timestamp + 2)
            if value == "cancel":
                ctx.delete_event_time_timer(timestamp + 2)
            return TriggerResult.CONTINUE

        def on_event_time(self, time, window, ctx):
            return TriggerResult.FIRE if ctx.current_watermark() >= time else TriggerResult.CONTINUE

    fn = window(GlobalWindows.create(), trigger=TwoAfter())
    source = records([("a", "p", 1.0), ("a", "cancel", 5.0), ("W", 2.5), ("W", 3.0), ("W", 8.0)])
    assert _run(source, fn).outputs == [
        Watermark(2.5), ["p", "cancel"], Watermark(3.0), Watermark(8.0), Watermark(math.inf),
    ]


def test_processing_time_context_and_other_assigners():
    class Times(ProcessWindowFunction):
        def process(self, key, context, elements):
            w = context.window()
            return [(key, w.start, w.end, context.current_processing_time(), list(elements))]

    clock = ManualClock()

    def source():
        for t, v in ((1.0, 1), (3.0, 2), (9.0, 3), (20.0, 4)):
            clock.set(t)
            yield Record("a", v)

    out = _values(_run(source(), window(ProcessingTimeSessionWindows.with_gap(4), process=Times()),
                       clock=clock).outputs)
    # [1,5) and [3,7) merge into [1,7); [9,13) separate; both fire once the clock passes
    assert [o[:3] + (o[4],) for o in out] == [("a", 1.0, 7.0, [1, 2]), ("a", 9.0, 13.0, [3])]
    assert [o[3] for o in out] == [9.0, 20.0]
    clock2 = ManualClock()

    def source2():
        for t, v in ((1.0, 1), (4.0, 2), (30.0, 3)):
            clock2.set(t)
            yield Record("a", v)

    out = _values(_run(source2(), window(SlidingProcessingTimeWindows.of(6, 3), process=Times()),
                       clock=clock2).outputs)
    assert [(s, e, vs) for _, s, e, _, vs in out] == [(-3.0, 3.0, [1]), (0.0, 6.0, [1, 2]),
                                                     (3.0, 9.0, [2])]


# -- one Spark test: a window function in process_keyed_stream, state on S3, rescaled ----------


class SumX(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value["x"]

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


class AsRow(ProcessWindowFunction):
    def process(self, key, context, elements):
        return [{"k": key, "start": context.window().start, "total": elements[0]}]


@pytest.mark.spark
def test_window_in_process_keyed_stream_on_s3_with_a_rescale(spark, tmp_path, s3):
    import json
    import os

    from spark_glue import process_keyed_stream

    server, bucket = s3
    location = f"s3://{bucket}/windows"
    source_dir = tmp_path / "input"
    source_dir.mkdir()
    batches = [
        [{"k": f"k{i % 6}", "seq": i, "x": i, "t": float(i % 15)} for i in range(30)],
        [{"k": f"k{i % 6}", "seq": i, "x": i, "t": float(15 + i % 15)} for i in range(30, 60)],
    ]
    got = []

    def sink(batch_df, batch_id):
        got.extend((r["k"], r["start"], r["total"]) for r in batch_df.collect())

    def make():
        return window(TumblingEventTimeWindows.of(10), aggregate=SumX(), process=AsRow())

    for n, (rows, partitions) in enumerate(zip(batches, [2, 3], strict=True)):
        df = spark.readStream.schema("k string, seq long, x long, t double").json(str(source_dir))
        query = process_keyed_stream(
            df, make(), "k", "k string, start double, total long",
            checkpoint_location=location, sink=sink, timestamp="t", watermark_delay=0,
            order_by="seq", num_partitions=partitions, config=AecConfig(max_parallelism=16),
            spark_checkpoint_location=str(tmp_path / "spark"),
        )  # fmt: skip
        try:
            (source_dir / f"f{n}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
            query.processAllAvailable()
        finally:
            query.stop()

    # the model: each micro-batch, then a watermark at its max event time (no final one)
    op = KeyedProcessOperator(make(), MemoryBackend(), AecConfig(max_parallelism=16))
    op.open()
    for rows in batches:
        for r in rows:
            op.process(Record(r["k"], r, timestamp=r["t"]))
        op.process_watermark(Watermark(max(r["t"] for r in rows)))
    expected = [(o["k"], o["start"], o["total"]) for o in _values(op.drain_outputs())]
    op.close()
    assert sorted(got) == sorted(expected)
    assert {start for _, start, _ in got} == {0.0, 10.0}  # [20, 30) has not closed yet
    keys = server.list_keys(bucket, "windows/")
    assert any("-of-3/" in k for k in keys) and any("-of-2/" in k for k in keys)
    assert not os.path.exists(tmp_path / "s3:")


def test_trigger_clear_runs_at_cleanup_time():
    cleared = []

    class Recording(Trigger):
        def on_element(self, value, timestamp, window, ctx):
            ctx.register_event_time_timer(window.end)
            return TriggerResult.CONTINUE

        def on_event_time(self, time, window, ctx):
            return TriggerResult.FIRE if time == window.end else TriggerResult.CONTINUE

        def clear(self, window, ctx):
            cleared.append((window.start, ctx.current_watermark()))

    fn = window(TumblingEventTimeWindows.of(10), trigger=Recording(), allowed_lateness=5)
    source = records([("a", 1, 1.0), ("a", 2, 12.0), ("W", 10.0), ("W", 14.0), ("W", 15.0),
                      ("a", 3, 3.0), ("W", 40.0)])
    result = _run(source, fn)
    assert _values(result.outputs) == [[1], [2]]
    assert cleared == [(0.0, 15.0), (10.0, 40.0)]  # at end + allowed_lateness, not before
    assert result.metrics["late_records_dropped"] == 1


def test_custom_trigger_with_on_merge_works_on_sessions():
    """The contract lists ``on_merge(window, ctx)`` among a Trigger's methods: a trigger
    that defines it is usable with merging (session) windows."""
    merged = []

    class EndTrigger(Trigger):
        def on_element(self, value, timestamp, window, ctx):
            ctx.register_event_time_timer(window.end)
            return TriggerResult.CONTINUE

        def on_event_time(self, time, window, ctx):
            return TriggerResult.FIRE if time == window.end else TriggerResult.CONTINUE

        def on_merge(self, window, ctx):
            merged.append((window.start, window.end))
            ctx.register_event_time_timer(window.end)

        def clear(self, window, ctx):
            ctx.delete_event_time_timer(window.end)

    fn = window(EventTimeSessionWindows.with_gap(5), trigger=EndTrigger(), process=WithWindow())
    source = records([("a", 1, 0.0), ("a", 2, 10.0), ("a", 3, 5.0), ("W", 30.0)])
    assert _values(_run(source, fn).outputs) == [("a", 0.0, 15.0, [1, 2, 3])]
    assert (0.0, 15.0) in merged
