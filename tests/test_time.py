"""Processing-time timers (injectable clock) and state TTL."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aec import (
    AecConfig,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ReducingStateDescriptor,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.clock import ManualClock, ScriptedClock, SystemClock
from aec.errors import JobFailure
from aec.testing import assert_equivalent
from backends import MemoryBackend

MODES = [
    pytest.param(AecConfig(async_state=False), id="sync"),
    pytest.param(AecConfig(buffer_size=2, in_flight_records_limit=3), id="async"),
]


class Reminders(KeyedProcessFunction):
    """Record value = seconds from now for a processing-time reminder; negative
    values delete the reminder at -value from now. A reminder at t sets the next
    at t + 99 (a timer registering a timer)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        timers = ctx.timer_service
        now = timers.current_processing_time()
        if value >= 0:
            timers.register_processing_time_timer(now + value)
        else:
            timers.delete_processing_time_timer(now - value)
        return self.count.async_value().then_compose(lambda n: self.count.async_update(n + 1))

    def on_timer(self, timestamp, ctx):
        ctx.timer_service.register_processing_time_timer(timestamp + 99)

        def emit(n):
            ctx.output(
                (
                    "timer",
                    ctx.current_key,
                    timestamp,
                    n,
                    ctx.timer_service.current_processing_time(),
                )
            )

        return self.count.async_value().then_accept(emit)


def outputs(result):
    return [o for o in result.outputs if not isinstance(o, Watermark)]


@pytest.mark.parametrize("config", MODES)
def test_processing_time_timers_fire_after_the_clock_passes_them(config):
    # the clock reads 0 for the first three elements, 5 from the fourth, 305 at the last
    clock = ScriptedClock([0, 0, 0, 5, 0, 0, 300])
    source = [
        Record("a", 5),  # t=0: reminder at 5
        Record("a", 5),  # t=0: the same reminder again: fires once
        Record("b", 10),  # t=0: reminder at 10
        Record("a", 0),  # t=5: the advance fires a@5 first (count 2), then: reminder at 5 again
        Record("b", -10),  # t=5: deletes b's reminder at 15 (none: no-op)
        Record("c", 1),  # t=5: reminder at 6
        Record(
            "a", 0
        ),  # t=305: everything due fires before it; its own reminder at 305 never fires
    ]
    got = outputs(run_keyed(source, Reminders(), config=config, clock=clock))
    assert got == [
        ("timer", "a", 5, 2, 5),
        ("timer", "a", 5, 3, 305),  # re-registered after it fired
        ("timer", "c", 6, 1, 305),
        ("timer", "b", 10, 2, 305),
        ("timer", "a", 104, 3, 305),  # each timer registers one 99 s later ...
        ("timer", "c", 105, 1, 305),
        ("timer", "b", 109, 2, 305),
        ("timer", "a", 203, 3, 305),
        ("timer", "c", 204, 1, 305),
        ("timer", "b", 208, 2, 305),
        ("timer", "a", 302, 3, 305),
        ("timer", "c", 303, 1, 305),  # ... until past the clock (b's 307 waits)
    ]


def test_pending_processing_time_timers_do_not_fire_at_end_of_input():
    result = run_keyed([Record("a", 50)], Reminders(), clock=ManualClock(0))
    assert outputs(result) == []


@given(
    rows=st.lists(st.tuples(st.sampled_from("abc"), st.integers(-20, 20)), max_size=25),
    advances=st.lists(st.sampled_from([0, 0, 0, 1, 7, 30]), max_size=25),
    data=st.data(),
)
def test_processing_time_is_equivalent_under_a_scripted_clock(rows, advances, data):
    source = [Record(k, v) for k, v in rows]
    assert_equivalent(
        Reminders, source, configs=[AecConfig(buffer_size=2, in_flight_records_limit=5)],
        data=data, clock_advances=advances,
    )  # fmt: skip


class Expiring(KeyedProcessFunction):
    """Every state type with a 10 s TTL; emits what it reads before writing."""

    def open(self, ctx):
        ttl = 10

        self.value = ctx.get_state(ValueStateDescriptor("value", default="none", ttl=ttl))
        self.list = ctx.get_state(ListStateDescriptor("list", ttl=ttl))
        self.map = ctx.get_state(MapStateDescriptor("map", ttl=ttl))
        self.total = ctx.get_state(ReducingStateDescriptor("total", lambda a, b: a + b, ttl=ttl))
        from engine_helpers import Everything  # noqa: F401  (keeps helpers importable)
        from test_state import Sum

        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", Sum(), ttl=ttl))

    async def process_element(self, value, ctx):
        seen = (
            await self.value.async_value(),
            list(await self.list.async_get()),
            sorted(await self.map.async_entries()),
            await self.map.async_contains("x"),
            await self.map.async_is_empty(),
            await self.total.async_get(),
            await self.mean.async_get(),
        )
        ctx.output((ctx.current_key, value, seen))
        await self.value.async_update(value)
        await self.list.async_add(value)
        await self.map.async_put("x" if value % 2 else "y", value)
        await self.total.async_add(value)
        await self.mean.async_add(value)


@pytest.mark.parametrize("config", MODES)
def test_ttl_expires_values_and_state_shows_what_is_alive(config):
    clock = ManualClock(1000)
    backend = MemoryBackend()
    from aec import KeyedProcessOperator

    op = KeyedProcessOperator(Expiring(), backend, config, clock=clock)
    op.open()
    op.process(Record("k", 1))
    clock.advance(6)
    op.process(Record("k", 2))  # nothing expired yet (written at 1000, expires 1010)
    clock.advance(6)  # now 1012: the first writes expired, the second (1006) live until 1016
    op.process(Record("k", 3))
    clock.advance(20)
    op.process(Record("k", 4))  # everything expired
    op.finish()
    got = [o for o in op.drain_outputs() if not isinstance(o, Watermark)]
    assert got[0] == ("k", 1, ("none", [], [], False, True, None, None))
    assert got[1] == ("k", 2, (1, [1], [("x", 1)], True, False, 1, 1.0))
    assert got[2] == (
        "k",
        3,
        (2, [2], [("y", 2)], False, False, 3, 1.5),
    )  # folded state was rewritten at 1006
    assert got[3] == ("k", 4, ("none", [], [], False, True, None, None))
    # what expired by the last time the operator announced (1032) is left out, whether
    # a sweep removed it yet or not (aec.state.ttl_cleanup)
    assert backend.state_items("list") == {"k": [(4, 1042)]}
    assert backend.state_items("map") == {"k": {"y": (4, 1042)}}


def test_system_clock_is_quantized():
    clock = SystemClock(granularity=0.5)
    assert clock.now() % 0.5 == 0
    with pytest.raises(ValueError):
        SystemClock(granularity=0)
    manual = ManualClock(3)
    with pytest.raises(ValueError):
        manual.advance(-1)


class _LateTimer(KeyedProcessFunction):
    """Registers an event-time timer at the record's value (late when at or below the
    watermark) and reports each firing."""

    def process_element(self, value, ctx):
        ctx.timer_service.register_event_time_timer(value)

    def on_timer(self, timestamp, ctx):
        ctx.output(("fired", ctx.current_key, timestamp))


@pytest.mark.parametrize("async_state", [False, True])
def test_a_clock_tick_between_duplicate_late_registrations_does_not_fire_the_timer_twice(
    async_state,
):
    # Only a watermark fires event-time timers; the tick closes an epoch all the same,
    # which once made the second registration look like a re-registration after firing.
    source = [Watermark(10), Record("a", 5, 5), Record("a", 5, 5), Watermark(20)]
    result = run_keyed(
        source,
        _LateTimer(),
        config=AecConfig(async_state=async_state),
        clock=ScriptedClock([0, 0, 1, 0, 0]),
    )
    fired = [o for o in result.outputs if not isinstance(o, Watermark)]
    assert fired == [("fired", "a", 5)]
    assert result.outputs.index(("fired", "a", 5)) < result.outputs.index(Watermark(20))


class ContainsNone(KeyedProcessFunction):
    """Puts a None value in a map, then asks what the map holds."""

    def __init__(self, ttl: float | None) -> None:
        self.ttl = ttl

    def open(self, ctx):
        self.entries = ctx.get_state(MapStateDescriptor("m", ttl=self.ttl))

    async def process_element(self, value, ctx):
        await self.entries.async_put("x", None)
        contains = await self.entries.async_contains("x")
        ctx.output((contains, await self.entries.async_is_empty()))


@pytest.mark.parametrize("ttl", [None, 100.0])
@pytest.mark.parametrize("async_state", [True, False], ids=["async", "sync"])
def test_a_live_map_entry_whose_value_is_none_is_contained(ttl, async_state):
    result = run_keyed(
        [Record("k", 1)], ContainsNone(ttl), config=AecConfig(async_state=async_state),
        clock=ManualClock(0),
    )  # fmt: skip
    assert [o for o in result.outputs if isinstance(o, tuple)] == [(True, False)]


class Readings(ScriptedClock):
    """A scripted clock whose readings go through ``convert`` (numpy, Decimal, ...)."""

    def __init__(self, convert):
        super().__init__([1.0] * 100)
        self.convert = convert

    def now(self):
        return self.convert(super().now())


@pytest.mark.parametrize("config", MODES)
def test_a_clock_may_read_any_real_number_and_a_bad_reading_names_the_clock(config):
    """numpy scalars, Decimal and Fraction readings run as the int or float they equal;
    a reading that is no number, or NaN, fails naming the clock (both builds)."""
    import decimal
    import fractions

    import numpy as np

    source = [Record("k", v) for v in (3, 5, 0, 2, 7)]
    expected = outputs(run_keyed(source, Reminders(), config=config, clock=Readings(int)))
    assert expected  # reminders fired
    for convert in (np.int64, np.float64, np.float32, decimal.Decimal, fractions.Fraction):
        clock = Readings(lambda t, c=convert: c(int(t)))
        assert outputs(run_keyed(source, Reminders(), config=config, clock=clock)) == expected
    for bad, error in ((lambda t: None, TypeError), (lambda t: True, TypeError),
                       (lambda t: "1", TypeError), (lambda t: float("nan"), ValueError)):  # fmt: skip
        with pytest.raises((error, JobFailure)) as raised:
            run_keyed(source, Reminders(), config=config, clock=Readings(bad))
        failure = raised.value if isinstance(raised.value, error) else raised.value.__cause__
        assert isinstance(failure, error) and "Readings.now() returned" in str(failure)


@pytest.mark.parametrize("config", MODES)
def test_a_timer_domain_that_is_not_one_is_refused_naming_it(config):
    """A misspelled domain is an error, not the processing-time queue's answer; a NaN
    ``until`` is an error, not every timer."""

    class Asks(KeyedProcessFunction):
        def __init__(self, ask):
            self.ask = ask

        def process_element(self, value, ctx):
            ctx.timer_service.register_event_time_timer(5.0)
            ctx.output(self.ask(ctx.timer_service))

    good = run_keyed([Record("k", 1)], Asks(lambda s: (5.0 in s.timer_times("event-time"),
                                                       s.due_timers("event-time", 9.0))),
                     config=config)  # fmt: skip
    assert good.outputs[0] == (True, [5.0])
    for ask, error, text in (
        (lambda s: s.timer_times("event_time"), ValueError, "'event_time'"),
        (lambda s: s.due_timers("eventtime", 9.0), ValueError, "'eventtime'"),
        (lambda s: s.due_timers("event-time", float("nan")), ValueError, "NaN"),
    ):
        with pytest.raises(JobFailure) as raised:
            run_keyed([Record("k", 1)], Asks(ask), config=config)
        assert isinstance(raised.value.__cause__, error) and text in str(raised.value.__cause__)
