"""The window kernel on its own: the grid (``aec.windowing.grid``), the built-in
trigger's decisions (``aec.windowing.builtin``) and the choice of path
(``aec.windowing.path``), each against a brute-force model or Flink's definition.
The drivers that use them are checked end to end by the other window suites."""

from __future__ import annotations

import math
import tempfile
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from windowing_cases import SYNC, SumAggregate, SumList, Watermark, rec

from aec import AecConfig, AggregateFunction, KeyedProcessFunction, run_keyed
from aec.runtime.operator import KeyedProcessOperator
from aec.windowing import (
    CountEvictor,
    CountTrigger,
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    window,
)
from aec.windowing.builtin import BuiltinTrigger, fires_on_element
from aec.windowing.grid import Grid, Panes, pane_size
from aec.windowing.merging import add_session
from aec.windowing.path import choose_path
from aec.windowing.spec import WindowSpec
from backends import MemoryBackend

ASYNC = AecConfig()

sizes = st.sampled_from([(10, 10), (10, 4), (12, 4), (3600, 300), (2.5, 0.5), (7, 3)])
offsets = st.sampled_from([0, 1, -1.5, 0.25])
times = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def _grid(size: float, slide: float, offset: float) -> Grid:
    return Grid(math.copysign(abs(offset) % slide, offset), slide, size)


# -- the grid ------------------------------------------------------------------------------


@given(sizes, offsets, times)
def test_a_tumbling_slot_is_the_contract_start_formula(size_slide, offset, t):
    size = size_slide[0]
    grid = _grid(size, size, offset)
    start, end = grid.slot(t)
    assert start == grid.offset + math.floor((t - grid.offset) / size) * size
    assert end == start + size
    k = grid.index(t)
    assert (grid.start(k), grid.end(k)) == (start, end)
    assert grid.ending_at(end) == k


@given(
    st.integers(1, 10**12),
    st.integers(-(10**12), 10**12),
    st.integers(-(2**62), 2**62),
)
def test_an_int_grid_holds_nanosecond_timestamps_exactly(size, offset, t):
    """Int sizes, offsets and timestamps beyond 2**53: the slot holds t, exactly."""
    grid = Grid(offset, size, size)
    start, end = grid.slot(t)
    assert start <= t < end and end - start == size and (start - offset) % size == 0
    k = grid.index(t)
    assert (grid.start(k), grid.end(k)) == (start, end) and grid.ending_at(end) == k


def test_a_tumbling_window_of_nanoseconds_fires_and_takes_late_records_exactly():
    second = 10**9
    end = 1_700_000_000 * second
    t = end - 1  # the last nanosecond of [end - 1 s, end)
    fn = window(TumblingEventTimeWindows.of(second), aggregate=SumAggregate(), late_data_tag="late")
    for config in (SYNC, AecConfig()):
        on_time = run_keyed([rec("a", 1, t), Watermark(end)], fn, config=config)
        assert on_time.outputs[:2] == [("a", 1), Watermark(end)]
        late = run_keyed([Watermark(end), rec("a", 1, t)], fn, config=config)
        assert late.side_outputs == {"late": [("a", 1)]}


@given(st.integers(-4, 4), st.integers(2**55, 2**58))
def test_an_int_sliding_grid_puts_nanoseconds_in_the_same_windows_on_every_path(d, k):
    """Panes of an int grid stay ints: beyond 2**53 the aggregate (pane) path gives the
    windows the assigner lists, as the values path does."""
    step = 10**9 + 7
    t = k * step + d
    assigner = SlidingEventTimeWindows.of(2 * step, step)
    expected = sorted((w.start, w.end) for w in assigner.assign_windows(None, t))
    assert all(w.start <= t < w.end for w in assigner.assign_windows(None, t))
    panes = Panes(assigner.grid, pane_size(assigner.size, assigner.slide))
    assert type(panes.g) is int
    j = panes.pane(t)
    assert panes.offset + j * panes.g <= t < panes.offset + (j + 1) * panes.g
    first, last = panes.windows_of(j)
    assert [(panes.start(i), panes.end(i)) for i in range(first, last + 1)] == expected


class Nanos(int):
    """An int subclass of timestamps (as a user's own time type)."""


@pytest.mark.parametrize(
    "assigner", [TumblingEventTimeWindows.of(3), SlidingEventTimeWindows.of(4, 2)], ids=repr
)
def test_int_subclass_timestamps_beyond_2_53_land_in_the_windows_ints_do(assigner):
    """An int subclass is exact integer arithmetic too: beyond 2**53 a float division
    would put every record in one window that holds none of them."""
    base = 2**62

    class Spans(ProcessWindowFunction):
        def process(self, key, context, elements):
            values = sorted(n for _, n in elements)
            yield (context.window().start - base, context.window().end - base, values)

    for config in (SYNC, ASYNC):
        runs = [
            run_keyed([rec("k", v, conv(base + v)) for v in (1, 2, 3, 5, 9)],
                      window(assigner, process=Spans()), config=config).outputs
            for conv in (int, Nanos)
        ]  # fmt: skip
        assert runs[0] == runs[1]
        windows = [o for o in runs[1] if not isinstance(o, Watermark)]
        assert all(start <= v < end for start, end, values in windows for v in values)
        assert len(windows) == (4 if assigner.size == 3 else 6)


def test_a_sliding_window_aggregate_without_merge_runs_per_window():
    """Flink calls AggregateFunction.merge only for merging windows: an aggregate that
    leaves it out (the base raises) still aggregates sliding windows."""

    class NoMerge(SumAggregate):
        merge = AggregateFunction.merge  # the base's: not implemented

    source = [rec("a", 1, 1), rec("a", 2, 6), rec("a", 4, 12), Watermark(100)]
    fn = window(SlidingEventTimeWindows.of(10, 5), aggregate=NoMerge())
    assert fn.spec.pane is None  # windows keep their own accumulators, as in Flink
    for config in (SYNC, AecConfig()):
        outputs = run_keyed(source, fn, config=config).outputs
        sums = [o for o in outputs if not isinstance(o, Watermark)]
        assert sums == [("a", 1), ("a", 3), ("a", 6), ("a", 4)]


def test_a_session_gap_below_the_float_resolution_fails_naming_it():
    """At epoch seconds floats are 2.4e-7 s apart: [t, t + 1e-7) would be empty."""
    fn = window(EventTimeSessionWindows.with_gap(1e-7), aggregate=SumAggregate())
    with pytest.raises(Exception, match="gap of 1e-07 s .* below the float's resolution"):
        run_keyed([rec("a", 1, 1.7e9)], fn, config=SYNC)
    assert run_keyed([rec("a", 1, 1.0)], fn, config=SYNC).outputs[0] == ("a", 1)  # near zero


@given(sizes, offsets, times)
@example((10, 10), 0, -5e-324)  # the quotient rounds to -0.0: window 0 does not hold it
# the quotient rounds down: t sits exactly on a start (4.1 == 0.1 + 4 * 1)
@example((3, 1), 0.1, 4.1)
@example((0.5, 0.25), 0.1, 4.1)
@example((0.7, 0.2), 0, 8.6)
@example((0.3, 0.1), 0, 18.7)
def test_the_sliding_windows_of_a_time_are_every_grid_window_holding_it(size_slide, offset, t):
    size, slide = size_slide
    grid = _grid(size, slide, offset)
    got = grid.windows(t)
    k = grid.index(t)
    # brute force around the estimate: every k whose window holds t
    want = [grid.window(j) for j in range(k + 2, k - int(size / slide) - 3, -1)
            if grid.start(j) <= t < grid.end(j)]  # fmt: skip
    assert got == want
    assert all(type(w) is TimeWindow and w.end - w.start == pytest.approx(size) for w in got)


@given(sizes, offsets, st.integers(-1000, 1000), st.integers(-50, 50), st.floats(-100, 100))
def test_first_open_is_the_first_window_ending_after_a_time(size_slide, offset, k, ahead, frac):
    size, slide = size_slide
    grid = _grid(size, slide, offset)
    time = grid.end(k + ahead) + frac
    got = grid.first_open(k, time)
    want = k
    while grid.end(want) <= time:
        want += 1
    assert got == want
    assert grid.first_open(k, -math.inf) == k
    with pytest.raises(ValueError, match="inf"):
        grid.first_open(k, math.inf)


@given(sizes, offsets, times)
def test_panes_tile_the_grid(size_slide, offset, t):
    size, slide = size_slide
    g = pane_size(size, slide)
    assert g is not None
    panes = Panes(_grid(size, slide, offset), g)
    j = panes.pane(t)
    assert panes.offset + j * panes.g <= t < panes.offset + (j + 1) * panes.g
    first, last = panes.windows_of(j)
    # window k holds panes k*r .. k*r + n - 1
    holding = [k for k in range(first - 3, last + 4) if k * panes.r <= j < k * panes.r + panes.n]
    assert holding == list(range(first, last + 1))
    assert panes.first_window(j) == first and panes.due(j) == panes.end(first)


def test_pane_size_is_the_exact_gcd_or_none_beyond_the_limit():
    assert pane_size(3600, 300) == 300
    assert pane_size(10, 4) == 2
    g = pane_size(0.75, 0.5)  # binary fractions: exact
    assert g == Fraction(1, 4)
    g = pane_size(0.3, 0.1)  # the floats' own binary fractions: panes divide both exactly
    assert g is None or ((Fraction(0.3) / g).denominator, (Fraction(0.1) / g).denominator) == (1, 1)
    assert pane_size(1, 1 / 8192) is None  # more than 4,096 panes per window


@given(
    st.sampled_from([(10, 10), (10, 4), (12, 4), (6, 3), (15, 5)]),
    st.lists(st.integers(0, 60), min_size=1, max_size=12, unique=True),
    st.lists(st.integers(1, 25), min_size=1, max_size=8),
)
def test_the_chain_fires_every_window_holding_a_pane_once_in_order(size_slide, stored, steps):
    """Chain firings at rising watermarks emit exactly what one firing per window would:
    every window holding a pane, once, in order of end, with the panes it holds."""
    size, slide = size_slide
    panes = Panes(Grid(0, slide, size), pane_size(size, slide))  # type: ignore[arg-type]
    live = sorted(stored)
    n, r = panes.n, panes.r
    want = []
    for k in range(panes.first_window(live[0]), live[-1] // r + 1):
        held = [j for j in live if k * r <= j < k * r + n]
        if held:
            want.append((panes.start(k), panes.end(k), held))
    got: list = []
    timer = panes.due(live[0])  # the chain's first timer: the first pane's first window
    watermark = timer - 1
    for step in [*steps, 10**6]:
        watermark += step
        while timer is not None and timer <= watermark:
            k = panes.ending_at(timer)
            assert k is not None
            fired, timer = panes.chain(live, k, watermark)
            for start, end, lo, hi, _ in fired:
                got.append((start, end, live[lo:hi]))
            if fired:
                live = live[fired[-1][4]:]  # the last-use panes went
            assert timer is None or timer > watermark
    assert got == want and live == []


@given(
    sizes, offsets,
    st.lists(st.one_of(times, st.integers(-50, 50).map(lambda k: k * 3600.0),
                       st.integers(-50, 50).map(lambda k: math.nextafter(k * 3600.0, -math.inf))),
             min_size=1, max_size=40),
)  # fmt: skip
def test_the_tumbling_bundle_holds_each_record_in_the_grids_slot(size_slide, offset, stamps):
    """The bundle remembers the times a slot surely covers (``Grid.slot`` is monotone):
    every record still lands in the slot the grid gives its time, boundaries included."""
    size = size_slide[0]
    fn = window(TumblingEventTimeWindows.of(size, _grid(size, size, offset).offset),
                reduce=lambda a, b: a)  # fmt: skip
    op = KeyedProcessOperator(fn, MemoryBackend(), ASYNC)
    op.open()
    bundle = fn.open_bundle()
    assert bundle is not None
    grid = fn.grid
    assert grid is not None
    for i, t in enumerate(stamps):
        assert bundle.offer("k", i, t, -math.inf)
    _, (_, share), records = bundle.take(math.inf)[0]
    assert records == len(stamps)
    held = {value: slot for slot, values in share for value in values}
    assert held == {i: grid.slot(t) for i, t in enumerate(stamps)}


# -- the built-in trigger ------------------------------------------------------------------


def test_on_element_is_flinks_trigger_with_the_cleanup_timer():
    event = BuiltinTrigger(True, 5)
    # a new window after the watermark: the trigger's timer and the cleanup timer
    assert event.on_element(10, 3, True) == (False, (10, 15))
    # held records already: its timers are set
    assert event.on_element(10, 3, False) == (False, ())
    # the watermark passed its end (allowed lateness): a late firing, new or not
    assert event.on_element(10, 12, True) == (True, (15,))
    assert event.on_element(10, 12, False) == (True, ())
    # no lateness: the cleanup timer is the trigger's; an infinite one never cleans
    assert BuiltinTrigger(True, 0).on_element(10, 3, True) == (False, (10,))
    assert BuiltinTrigger(True, math.inf).on_element(10, 3, True) == (False, (10,))
    # processing time ignores lateness and never fires on a record
    clock = BuiltinTrigger(False, 5)
    assert clock.on_element(10, 3, True) == (False, (10,))
    assert clock.on_element(10, 12, True) == (False, (10,))
    assert fires_on_element(True, 10, 10) and not fires_on_element(False, 10, 10)


def test_lateness_and_cleanup_times():
    event, clock = BuiltinTrigger(True, 5), BuiltinTrigger(False, 5)
    assert event.cleanup_time(10) == 15 and clock.cleanup_time(10) == 10
    assert event.is_late(10, 15) and not event.is_late(10, 14.9)
    assert not clock.is_late(10, 1e9)
    assert event.is_late_record(10, 15) and not clock.is_late_record(10, 1e9)
    assert BuiltinTrigger(True, 1e308).cleanup_time(1e308) == math.inf  # saturates
    assert BuiltinTrigger(True, 1e308).cleanup_timer(1e308) is None


def test_a_grid_timer_fires_the_window_ending_and_cleans_the_one_whose_cleanup_it_is():
    grid = Grid(0, 10, 10)
    assert BuiltinTrigger(True, 0).grid_timer(grid, 20) == (1, 1)
    assert BuiltinTrigger(True, 5).grid_timer(grid, 20) == (1, None)
    assert BuiltinTrigger(True, 5).grid_timer(grid, 25) == (None, 1)
    assert BuiltinTrigger(True, 10).grid_timer(grid, 30) == (2, 1)
    assert BuiltinTrigger(True, math.inf).grid_timer(grid, 30) == (2, None)
    assert BuiltinTrigger(False, 5).grid_timer(grid, 20) == (1, 1)


def test_due_sessions_in_order_of_end():
    rules = BuiltinTrigger(True, 5)
    sessions = [TimeWindow(0, 10), TimeWindow(3, 5), TimeWindow(12, 20), TimeWindow(30, 40)]
    assert rules.due_sessions(sessions, 10, 10) == [
        (TimeWindow(3, 5), False, True), (TimeWindow(0, 10), True, False),
    ]  # fmt: skip
    assert rules.due_sessions(sessions, 15, 15) == [(TimeWindow(0, 10), False, True)]
    assert rules.due_sessions(sessions, -math.inf, 20) == [
        (TimeWindow(3, 5), True, True), (TimeWindow(0, 10), True, True),
        (TimeWindow(12, 20), True, False),
    ]  # fmt: skip


def test_merge_timers_keep_a_time_another_session_uses():
    rules = BuiltinTrigger(True, 5)
    after = [TimeWindow(0, 20), TimeWindow(10, 25)]  # 25 is the other session's end
    register, delete = rules.merge_timers(
        after, TimeWindow(0, 20), [TimeWindow(0, 10), TimeWindow(8, 20)], watermark=5
    )
    assert register == 20
    assert delete == [10, 15]  # 20 and 25 (cleanup of 20) stay: live
    register, _ = rules.merge_timers(after, TimeWindow(0, 20), [TimeWindow(0, 10)], 20)
    assert register is None  # the watermark passed its end: no trigger timer


# -- the path --------------------------------------------------------------------------------


class Async(ProcessWindowFunction):
    async def process(self, key, context, elements):  # type: ignore[override]
        return elements


class Clears(ProcessWindowFunction):
    def process(self, key, context, elements):
        return elements

    def clear(self, context):
        return None


def _path(assigner, config=ASYNC, **kw):
    return choose_path(window(assigner, **kw).spec, config)


def test_choose_path():
    tumbling = TumblingEventTimeWindows.of(10)
    p = _path(tumbling, aggregate=SumAggregate())
    assert (p.driver, p.timers, p.bundle, p.implied) == ("tumbling", "grid", True, True)
    for config in (SYNC, AecConfig(watermark_order="parallel"), AecConfig(state_ordered=True)):
        assert not _path(tumbling, config, aggregate=SumAggregate()).bundle
    assert not choose_path(window(tumbling).spec, None).bundle  # layout only
    assert _path(tumbling, evictor=CountEvictor.of(2)).driver == "general"
    assert _path(tumbling, process=Async()).driver == "general"
    p = _path(tumbling, process=Clears())
    assert (p.driver, p.clears) == ("general", True)
    assert _path(tumbling, trigger=CountTrigger.of(2)).timers == "index"
    sliding = SlidingEventTimeWindows.of(10, 4)
    p = _path(sliding, reduce=max)
    assert (p.driver, p.panes, p.chain, p.bundle) == ("panes", 2, True, True)
    p = _path(sliding, reduce=max, allowed_lateness=3)
    assert (p.driver, p.panes, p.chain) == ("general", 2, False)
    p = _path(SlidingProcessingTimeWindows.of(10, 4), reduce=max)
    assert (p.driver, p.chain, p.bundle) == ("panes", True, False)
    assert _path(sliding).panes is None  # the list of values: no panes
    p = _path(EventTimeSessionWindows.with_gap(5), aggregate=SumAggregate())
    assert (p.driver, p.timers, p.sessions, p.bundle) == ("sessions", "sessions", "together", True)
    p = _path(ProcessingTimeSessionWindows.with_gap(5), process=SumList())
    assert (p.driver, p.sessions) == ("general", "apart")
    p = _path(EventTimeSessionWindows.with_gap(5), trigger=CountTrigger.of(2))
    assert (p.timers, p.sessions) == ("index", "apart")


def test_the_spec_checks_stay_windows():
    with pytest.raises(TypeError, match="assigner"):
        WindowSpec.of(None, None, None, None, None, None, 0, None, None)


# -- layouts on restore ------------------------------------------------------------------------


def test_a_checkpoint_of_the_other_pane_layout_is_refused():
    """Chain-mode panes are one value per key; with lateness they are entries: a
    checkpoint of one restores unread into the other, so it is refused."""
    chain = lambda: window(SlidingEventTimeWindows.of(10, 5), aggregate=SumAggregate())  # noqa: E731
    entries = lambda: window(SlidingEventTimeWindows.of(10, 5), aggregate=SumAggregate(),  # noqa: E731
                             allowed_lateness=5)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for first, second in ((chain, entries), (entries, chain)):
            op = KeyedProcessOperator(first(), MemoryBackend(), SYNC)
            op.open()
            op.process(rec("a", 1, 1))
            handle = op.snapshot(1, f"{tmp}/chk-{id(first)}")
            op.close()
            with pytest.raises(ValueError, match="panes"):
                KeyedProcessOperator(second(), MemoryBackend(), SYNC).restore(handle)


def test_chain_panes_are_one_value_per_key():
    backend = MemoryBackend()
    fn = window(SlidingEventTimeWindows.of(10, 5), aggregate=SumAggregate())
    op = KeyedProcessOperator(fn, backend, SYNC)
    op.open()
    for element in (rec("a", 1, 1), rec("a", 2, 7), Watermark(10)):
        op.process_watermark(element) if type(element) is Watermark else op.process(element)
    assert op.drain_outputs() == [("a", 1), ("a", 3), Watermark(10)]  # [-5, 5), [0, 10)
    assert "window-contents" not in op.state_names
    assert backend.state_items("window-panes") == {"a": {1: ["a", 2]}}  # pane [5, 10) left
    op.finish()
    assert op.drain_outputs() == [("a", 2), Watermark(math.inf)]  # [5, 15)
    assert backend.state_items("window-panes") == {}


# -- what the kernel asks of the engine ----------------------------------------------------------


class _Timers(KeyedProcessFunction):
    def process_element(self, value, ctx):
        service = ctx.timer_service
        for t in (30.0, 10.0, 20.0):
            service.register_event_time_timer(t)
        ctx.output((sorted(service.timer_times("event-time")), service.due_timers("event-time", 20)))
        ctx.output(ctx.timer_service.due_timers("processing-time", math.inf))

    def open(self, ctx):
        self.async_state = ctx.config.async_state


def test_the_timer_service_shows_a_keys_timers_and_the_runtime_context_its_config():
    fn = _Timers()
    result = run_keyed([rec("a", 1, 0)], fn, config=SYNC)
    assert result.outputs[:2] == [([10.0, 20.0, 30.0], [10.0, 20.0]), []]
    assert fn.async_state is False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timestamp", [1.7e18, 1e308])
@pytest.mark.parametrize("config", [SYNC, AecConfig()], ids=["sync", "async"])
def test_a_timestamp_beyond_a_floats_exact_grid_fails_naming_it(timestamp, config):
    """Sliding windows of 10 s every 2 s at a timestamp of nanoseconds (1.7e18 s):
    the grid's bounds no longer move by a step (floats count 2**52 steps exactly):
    the pane path emitted nothing and 1e308 spun forever. Now the record fails."""
    from aec import JobFailure

    function = window(SlidingEventTimeWindows.of(10, 2), aggregate=SumAggregate())
    with pytest.raises(JobFailure, match=r"2\*\*52") as failure:
        run_keyed([rec("k", 1, timestamp), Watermark(math.inf)], function, config=config)
    assert isinstance(failure.value.__cause__, ValueError)


def test_the_session_set_asks_a_held_window_subclass_its_own_intersects():
    class NeverMerges(TimeWindow):
        def intersects(self, other):
            return False

    held = [NeverMerges(0, 10)]
    actual, merged = add_session(held, NeverMerges(5, 15))
    assert merged == [] and actual == NeverMerges(5, 15)
    assert held == [NeverMerges(0, 10), NeverMerges(5, 15)]
    plain = [TimeWindow(0, 10)]
    assert add_session(plain, TimeWindow(5, 15)) == (TimeWindow(0, 15), [TimeWindow(0, 10)])


def test_a_dynamic_gap_that_makes_a_nan_end_names_the_window():
    assigner = EventTimeSessionWindows.with_dynamic_gap(lambda value: math.inf)
    with pytest.raises(ValueError, match="TimeWindow end is NaN"):
        assigner.assign_windows(None, -math.inf)


def test_an_assigner_subclass_with_its_own_windows_is_asked_on_every_path():
    """A tumbling or sliding subclass overriding ``assign_windows`` is not the grid: its
    windows are the ones it lists, whatever the window function, in both modes."""

    class EvenOnly(TumblingEventTimeWindows):
        def assign_windows(self, value, timestamp):
            return [] if value[1] % 2 else super().assign_windows(value, timestamp)

    class Later(SlidingEventTimeWindows):
        def assign_windows(self, value, timestamp):
            return super().assign_windows(value, timestamp + 100)

    class Spans(ProcessWindowFunction):
        def process(self, key, context, elements):
            yield (context.window().start, context.window().end, sum(n for _, n in elements))

    source = [rec("k", v, v) for v in (1, 2, 3, 4)] + [Watermark(200)]
    for config in (SYNC, ASYNC):
        for kwargs in ({"aggregate": SumAggregate()}, {"process": Spans()}):
            outputs = run_keyed(source, window(EvenOnly.of(10), **kwargs), config=config).outputs
            assert outputs[0] in (("k", 6), (0, 10, 6))
        for kwargs in ({"aggregate": SumAggregate(), "process": Spans()}, {"process": Spans()}):
            fn = window(Later.of(10, 5), **kwargs)
            assert choose_path(fn.spec, config).driver == "general"
            windows = [o for o in run_keyed(source, fn, config=config).outputs
                       if not isinstance(o, Watermark)]  # fmt: skip
            assert [w[:2] for w in windows] == [(95, 105), (100, 110)]


def test_a_merging_assigner_of_time_window_subclasses_merges_and_others_are_named():
    """A TimeWindow subclass's windows merge as TimeWindows do (their order is by the
    numbers, not the dataclass's same-class one); a window that is no TimeWindow fails
    the run naming it."""
    from dataclasses import dataclass

    from aec import JobFailure
    from aec.windowing import WindowAssigner

    class MyWindow(TimeWindow):
        pass

    @dataclass(frozen=True)
    class Duck:
        start: float
        end: float

    class Merging(WindowAssigner):
        merging = True

        def __init__(self, make):
            self.make = make

        def assign_windows(self, value, timestamp):
            return [self.make(timestamp, timestamp + 3)]

    source = [rec("k", 1, 1), rec("k", 2, 2), rec("k", 3, 6), Watermark(20)]
    for config in (SYNC, ASYNC):
        expected = run_keyed(source, window(Merging(TimeWindow), aggregate=SumAggregate()),
                             config=config).outputs  # fmt: skip
        assert expected[:2] == [("k", 3), ("k", 3)]
        mine = run_keyed(source, window(Merging(MyWindow), aggregate=SumAggregate()), config=config)
        assert mine.outputs == expected
        with pytest.raises(JobFailure) as failure:
            run_keyed(source, window(Merging(Duck), aggregate=SumAggregate()), config=config)
        assert isinstance(failure.value.__cause__, TypeError)
        assert "Duck(start=1, end=4)" in str(failure.value.__cause__)
