"""Property: the async run gives the synchronous answer (docs/semantics.md rule 11).

Random keyed streams with watermarks over few keys (to force collisions),
random configs, and batch completion orders drawn by hypothesis; plus real
I/O threads under random latencies.
"""

from __future__ import annotations

import random

from engine_helpers import AsyncCounter, Counter, Everything
from hypothesis import given
from hypothesis import strategies as st

from aec import AecConfig, KeyedProcessFunction, ListStateDescriptor, Record, Watermark
from aec.runtime.executor import ThreadPoolStateExecutor
from aec.testing import assert_equivalent
from backends import LatencyBackend, MemoryBackend


@st.composite
def keyed_streams(draw, max_size=40, keys=("a", "b", "c", 1, (2, "x"))):
    """Records (integer values and event times) and non-decreasing watermarks."""
    elements, watermark = [], -1
    for _ in range(draw(st.integers(0, max_size))):
        if draw(st.integers(0, 5)) == 0:
            watermark = draw(st.integers(watermark, watermark + 12))
            elements.append(Watermark(watermark))
        else:
            value = draw(st.integers(0, 30))
            elements.append(Record(draw(st.sampled_from(keys)), value, timestamp=value))
    return elements


def configs(watermark_order):
    return st.builds(
        AecConfig,
        in_flight_records_limit=st.integers(1, 50),
        buffer_size=st.integers(1, 20),
        watermark_order=st.just(watermark_order),
    )


class TimerOnly(KeyedProcessFunction):
    """Parallel-mode safe: timers read no state, and records register timers only
    above the current watermark (timers are state too: a record that registers a
    timer already due at an earlier watermark races that watermark's firing)."""

    def open(self, ctx):
        self.seen = ctx.get_state(ListStateDescriptor("seen"))

    def process_element(self, value, ctx):
        if value > ctx.timer_service.current_watermark():
            ctx.timer_service.register_event_time_timer(value)
        else:
            ctx.side_output("late", (ctx.current_key, value))
        return self.seen.async_add(value).then_accept(
            lambda _: ctx.output((ctx.current_key, value))
        )

    def on_timer(self, timestamp, ctx):
        ctx.output(("timer", ctx.current_key, timestamp))
        if timestamp < 25:  # a timer that registers a later timer
            ctx.timer_service.register_event_time_timer(timestamp + 3)


@given(source=keyed_streams(), config=configs("serial"), data=st.data())
def test_serial_mode_equals_sync_for_every_state_type(source, config, data):
    assert_equivalent(Everything, source, configs=[config], data=data)


@given(source=keyed_streams(), config=configs("serial"), data=st.data())
def test_callback_and_coroutine_counters_equal_sync(source, config, data):
    for function in (Counter, AsyncCounter):
        assert_equivalent(function, source, configs=[config], data=data)


@given(source=keyed_streams(), config=configs("parallel"), data=st.data())
def test_parallel_mode_equals_sync_when_timers_do_not_read_later_state(source, config, data):
    assert_equivalent(TimerOnly, source, configs=[config], data=data)


@given(source=keyed_streams(max_size=30), seed=st.integers(0, 2**16))
def test_real_io_threads_with_random_latencies_equal_sync(source, seed):
    rng = random.Random(seed)

    def slow_backend():
        return LatencyBackend(MemoryBackend(), lambda: rng.random() * 0.002)

    assert_equivalent(
        Everything,
        source,
        backend_factory=slow_backend,
        configs=[AecConfig(buffer_size=3, in_flight_records_limit=10, executor_threads=3)],
        seeds=[seed],
        executor_factory=lambda _: ThreadPoolStateExecutor(3),
    )


def test_equivalence_checker_names_the_diverging_mode():
    """A timer that reads state later records write diverges in parallel mode only."""
    source = [Record(k % 2, k, k) for k in range(8)] + [Watermark(4)]
    source += [Record(k % 2, k, k) for k in range(8)]
    assert_equivalent(Everything, source, configs=[AecConfig(buffer_size=2)])
    try:
        assert_equivalent(
            Everything,
            source,
            configs=[AecConfig(buffer_size=2, watermark_order="parallel")],
            seeds=range(10),
        )
    except AssertionError as error:
        assert "parallel watermark mode" in str(error)
    else:
        raise AssertionError("the parallel-mode divergence went unnoticed")


def test_the_checker_closes_every_backend_its_factory_made():
    """A factory's backends (threads, files, connections) end with their runs, also
    when a run fails."""
    made: list[MemoryBackend] = []
    closed: list[MemoryBackend] = []

    class Tracked(MemoryBackend):
        def close(self) -> None:
            closed.append(self)
            super().close()

    def factory() -> MemoryBackend:
        made.append(Tracked())
        return made[-1]

    source = [Record(k % 3, k) for k in range(12)]
    assert_equivalent(Counter, source, backend_factory=factory, seeds=(0,))
    assert made and all(backend in closed for backend in made)

    class Failing(KeyedProcessFunction):
        def process_element(self, value, ctx):
            raise ValueError("boom")

    made.clear()
    closed.clear()
    try:
        assert_equivalent(Failing, source, backend_factory=factory, seeds=(0,))
    except Exception as error:
        assert "boom" in str(error) or isinstance(error.__cause__, ValueError)
    else:
        raise AssertionError("a failing function passed the checker")
    assert made and all(backend in closed for backend in made)
