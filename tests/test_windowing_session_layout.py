"""The session callback driver's state (``aec.windowing.sessions``): a key's sessions and their
contents are one value, so a record makes one read and one write and a firing one read
and one write (a clear when no session is left); snapshots carry that value."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from windowing_cases import (
    SYNC,
    SumAggregate,
    Watermark,
    epochs,
    rec,
    run,
    window_sources,
)

from aec import AecConfig
from aec.runtime.operator import KeyedProcessOperator
from aec.windowing import EventTimeSessionWindows, window
from aec.windowing import sessions as session_driver
from aec.windowing.windows import TimeWindow
from backends import MemoryBackend, RocksDBBackend

ASYNC = AecConfig(buffer_size=4, in_flight_records_limit=10)


def sessions(lateness: float = 0, tag: str | None = "late") -> object:
    return window(EventTimeSessionWindows.with_gap(5), aggregate=SumAggregate(),
                  allowed_lateness=lateness, late_data_tag=tag)  # fmt: skip


def requests_of(op: KeyedProcessOperator, element: object) -> int:
    before = op.metrics["requests"]
    if type(element) is Watermark:
        op.process_watermark(element)
    else:
        op.process(element)
    return op.metrics["requests"] - before


def test_a_session_record_reads_and_writes_one_value():
    backend = MemoryBackend()
    op = KeyedProcessOperator(sessions(lateness=2), backend, SYNC)
    op.open()
    assert op.function.path.driver == "sessions"
    names = set(op.state_names)
    assert session_driver.STATE in names
    assert not names & {"window-contents", "window-sessions"}  # the general path's layout
    assert requests_of(op, rec("a", 1, 1)) == 2  # new session [1, 6)
    assert requests_of(op, rec("a", 2, 3)) == 2  # inside: [1, 8)
    assert requests_of(op, rec("a", 3, 12)) == 2  # a second session [12, 17)
    assert requests_of(op, rec("a", 4, 7)) == 2  # bridges both: [1, 17)
    assert backend.state_items(session_driver.STATE) == {"a": [[1, 17, ["a", 10]]]}
    assert requests_of(op, Watermark(17)) == 1  # fires [1, 17): cleaned only at 19
    assert op.drain_outputs() == [("a", 10), Watermark(17)]
    assert requests_of(op, rec("a", 5, 9)) == 2  # a late firing of [1, 17)
    assert op.drain_outputs() == [("a", 15)]
    assert requests_of(op, rec("a", 6, -10)) == 1  # late: [-10, -5) retired, no write
    assert op.drain_side_outputs() == {"late": [("a", 6)]}
    assert requests_of(op, Watermark(19)) == 2  # cleaned at 19: read, clear
    assert backend.state_items(session_driver.STATE) == {}
    assert op.drain_outputs() == [Watermark(19)]


def test_each_firing_reads_and_writes_once():
    backend = MemoryBackend()
    op = KeyedProcessOperator(sessions(), backend, SYNC)
    op.open()
    for element in (rec("a", 1, 1), rec("a", 2, 10), rec("a", 3, 30)):
        op.process(element)
    # [1, 6) and [10, 15) fire at their own timers (a read and a write each); [30, 35) stays
    assert requests_of(op, Watermark(20)) == 4
    assert op.drain_outputs() == [("a", 1), ("a", 2), Watermark(20)]
    assert backend.state_items(session_driver.STATE) == {"a": [[30, 35, ["a", 3]]]}


def test_general_path_keeps_its_layout():
    """A trigger other than the built-in one: the set apart from the contents."""
    from aec.windowing import CountTrigger

    function = window(EventTimeSessionWindows.with_gap(5), aggregate=SumAggregate(),
                      trigger=CountTrigger.of(2))  # fmt: skip
    op = KeyedProcessOperator(function, MemoryBackend(), SYNC)
    op.open()
    assert op.function.path.driver == "general"
    assert {"window-contents", "window-sessions"} <= set(op.state_names)
    assert session_driver.STATE not in op.state_names


def _state(op: KeyedProcessOperator) -> dict:
    return op.backend.state_items(session_driver.STATE)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("config", [SYNC, ASYNC], ids=["sync", "async"])
@given(source=window_sources(40, watermark_odds=6, max_value=9), cut=st.integers(0, 40),
       lateness=st.sampled_from([0, 4]), tag=st.sampled_from(["late", None]))  # fmt: skip
@settings(max_examples=15, deadline=None)
def test_snapshot_mid_session_restores_and_continues(backend, config, source, cut, lateness,
                                                     tag):  # fmt: skip
    """Cut anywhere, snapshot, restore into a new operator and continue: the outputs, late
    side outputs (or dropped records) and state are the uninterrupted run's."""
    cut = min(cut, len(source))
    with tempfile.TemporaryDirectory() as directory:
        paths = iter(range(10))

        def make() -> object:
            if backend == "memory":
                return MemoryBackend()
            return RocksDBBackend(f"{directory}/db{next(paths)}")

        whole = KeyedProcessOperator(sessions(lateness, tag), make(), config)
        whole.open()
        for element in source:
            requests_of(whole, element)
        first = KeyedProcessOperator(sessions(lateness, tag), make(), config)
        first.open()
        for element in source[:cut]:
            requests_of(first, element)
        handle = first.snapshot(1, f"{directory}/chk")
        outputs, side = first.drain_outputs(), first.drain_side_outputs()
        first.close()
        second = KeyedProcessOperator(sessions(lateness, tag), make(), config)
        second.restore(handle)
        for element in source[cut:]:
            requests_of(second, element)
        # a snapshot folds a bundle: then the state is complete on both
        whole.snapshot(2, f"{directory}/whole")
        second.snapshot(2, f"{directory}/second")
        assert _state(second) == _state(whole)
        second.finish()
        whole.finish()
        outputs += second.drain_outputs()
        for tag, values in second.drain_side_outputs().items():
            side[tag] = side.get(tag, []) + values
        assert epochs(outputs) == epochs(whole.drain_outputs())
        assert sorted(side.get("late", [])) == sorted(whole.drain_side_outputs().get("late", []))
        dropped = [op.metrics.get("late_records_dropped", 0) for op in (first, second, whole)]
        assert dropped[0] + dropped[1] == dropped[2]
        assert _state(second) == {} == _state(whole)
        whole.close()
        second.close()


def test_the_stored_value_is_sorted_sessions_with_contents():
    backend = MemoryBackend()
    run([rec("a", 1, 20), rec("a", 2, 1), rec("b", 3, 2)], sessions(), SYNC, backend=backend)
    assert backend.state_items(session_driver.STATE) == {}  # end of input cleaned them
    sessions_, memory = session_driver.decode(((1, 6, ["a", 2]), (20, 25, ["a", 1])))
    assert sessions_ == [TimeWindow(1, 6), TimeWindow(20, 25)]
    assert session_driver.encode(sessions_, memory) == [[1, 6, ["a", 2]], [20, 25, ["a", 1]]]
    assert session_driver.encode([], {}) is None


def test_a_checkpoint_of_the_other_layout_is_refused(tmp_path):
    """Sessions kept apart from their contents (the general path, or an earlier version)
    would restore unread into the session path, and the other way round: refused."""
    from aec.windowing import CountTrigger

    def general() -> object:
        return window(EventTimeSessionWindows.with_gap(5), aggregate=SumAggregate(),
                      trigger=CountTrigger.of(100))  # fmt: skip

    source = [rec("a", 1, 1), rec("a", 2, 3)]
    for first, second in ((general(), sessions()), (sessions(), general())):
        op = KeyedProcessOperator(first, MemoryBackend(), SYNC)
        op.open()
        for element in source:
            op.process(element)
        handle = op.snapshot(1, str(tmp_path / f"chk-{id(first)}"))
        op.close()
        with pytest.raises(ValueError, match="keeps sessions"):
            KeyedProcessOperator(second, MemoryBackend(), SYNC).restore(handle)


class _Service:
    """The part of TimerService that NetTimers uses, recording the calls it gets."""

    def __init__(self, times):
        self.times = dict.fromkeys(times)
        self.calls = []

    def due_timers(self, domain, until):
        assert domain == "event-time"
        return sorted(t for t in self.times if t <= until)

    def register_event_time_timer(self, t):
        self.calls.append(("register", t))
        self.times[t] = None

    def delete_event_time_timer(self, t):
        self.calls.append(("delete", t))
        self.times.pop(t, None)


def test_net_timers_apply_only_the_net_effect_of_a_folds_changes():
    from aec.windowing.session_bundle import NetTimers

    service = _Service([10.0, 20.0, 30.0])
    net = NetTimers(service)
    net.register_event_time_timer(40.0)  # new, then fired in the fold: never reaches the queue
    net.delete_event_time_timer(40.0)
    net.register_event_time_timer(20.0)  # already there (a duplicate), then deleted: goes
    net.delete_event_time_timer(20.0)
    net.delete_event_time_timer(30.0)  # deleted, then registered again: stays
    net.register_event_time_timer(30.0)
    net.register_event_time_timer(50.0)  # new: registered
    assert service.calls == []  # nothing before apply
    net.apply()
    assert service.calls == [("delete", 20.0), ("register", 50.0)]
    assert sorted(service.times) == [10.0, 30.0, 50.0]
