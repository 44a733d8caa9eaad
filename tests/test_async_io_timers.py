"""aec.async_io.driver.Timers: timeouts in a FIFO with lazy removal, retries sorted."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aec.async_io.driver import _RETRY, _TIMEOUT, Timers
from aec.async_io.queue import AsyncEntry


def _drain(timers: Timers, now: float) -> list[tuple[int, object, int]]:
    fired = []
    while (timer := timers.pop_due(now)) is not None:
        kind, entry, attempt = timer
        fired.append((kind, entry.value, attempt))
    return fired


def test_timeouts_and_retries_fire_in_due_order_and_cancelled_ones_never():
    timers = Timers()
    a, b, c = AsyncEntry("a"), AsyncEntry("b"), AsyncEntry("c")
    timers.add(10.0, _TIMEOUT, a)
    timers.add(11.0, _TIMEOUT, b)
    timers.add(12.0, _TIMEOUT, c)
    timers.add(10.5, _RETRY, b, 1)
    timers.cancel_all(a)
    assert len(timers) == 3 and a.timers == []
    assert timers.next_delay(0.0) == 10.5  # a's dead timeout is skipped
    assert _drain(timers, 11.0) == [(_RETRY, "b", 1), (_TIMEOUT, "b", 0)]
    assert b.timers == [] and len(timers) == 1
    assert _drain(timers, 20.0) == [(_TIMEOUT, "c", 0)]
    assert timers.next_delay(20.0) is None and timers.due == math.inf


def test_a_timeout_due_before_the_last_one_takes_its_place():
    timers = Timers()
    late, early = AsyncEntry("late"), AsyncEntry("early")
    timers.add(5.0, _TIMEOUT, late)
    timers.add(3.0, _TIMEOUT, early)
    assert timers.due == 3.0
    assert _drain(timers, 4.0) == [(_TIMEOUT, "early", 0)]
    assert _drain(timers, 5.0) == [(_TIMEOUT, "late", 0)]


def test_dead_timeouts_are_compacted_so_the_fifo_stays_near_the_live_ones():
    timers = Timers()
    entries = [AsyncEntry(i) for i in range(1000)]
    keep = entries[0]  # the head stays live, so only compaction removes the dead
    for i, entry in enumerate(entries):
        timers.add(100.0 + i, _TIMEOUT, entry)
    for entry in entries[1:]:
        timers.cancel_all(entry)
    assert len(timers) == 1
    assert len(timers._timeouts) <= 2 * len(timers) + 64  # noqa: SLF001 (the bound under test)
    assert _drain(timers, math.inf) == [(_TIMEOUT, keep.value, 0)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 100), st.booleans()), max_size=40))
def test_timers_fire_as_a_sorted_list_of_the_live_ones_would(steps):
    """Random adds (timeouts at increasing times, retries anywhere) and cancels: what
    fires is every live timer, earliest first, ties in creation order."""
    timers = Timers()
    model: list[tuple[float, int, int, AsyncEntry]] = []
    clock = 0.0
    for number, (is_retry, at, cancel) in enumerate(steps):
        entry = AsyncEntry(number)
        if is_retry:
            due, kind = at, _RETRY
        else:
            clock += at / 10
            due, kind = clock, _TIMEOUT
        timers.add(due, kind, entry)
        model.append((due, number, kind, entry))
        if cancel and model:
            victim = model[len(model) // 2][3]
            timers.cancel_all(victim)
            model = [m for m in model if m[3] is not victim]
    assert len(timers) == len(model)
    expected = [(kind, entry.value, 0) for _, _, kind, entry in sorted(model, key=lambda m: m[:2])]
    assert _drain(timers, math.inf) == expected
