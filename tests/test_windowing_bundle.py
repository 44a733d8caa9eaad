"""Mini-batches of on-time window records (``aec.windowing.bundles``, ``aec.windowing.session_bundle``): the async run
folds them per key and window at the watermark, at the end of input, before a snapshot
and at the size bound, and still gives the synchronous run's outputs, side outputs,
failures and final state."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from windowing_cases import (
    SYNC,
    Record,
    Watermark,
    epochs,
    make_backend,
    rec,
    run,
    window_sources,
)

import aec.runtime.operator as operator_module
from aec import AecConfig, AggregateFunction, JobFailure
from aec.keygroups import key_group_for, key_group_range_for
from aec.runtime.operator import KeyedProcessOperator
from aec.testing import assert_equivalent
from aec.windowing import (
    EventTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    window,
)
from backends import MemoryBackend, RocksDBBackend

ASYNC = AecConfig(buffer_size=4, in_flight_records_limit=10)


def concat(a: tuple, b: tuple) -> tuple:
    """An order-sensitive reduce: a record folded out of arrival order shows."""
    return (a[0], f"{a[1]}.{b[1]}")


class Digits(AggregateFunction):
    """An order-sensitive aggregate: the digits in arrival order."""

    def create_accumulator(self) -> str:
        return ""

    def add(self, value: tuple, acc: str) -> str:
        if value[1] == 13:
            raise ArithmeticError("13 is unlucky")
        return acc + str(value[1])

    def get_result(self, acc: str) -> str:
        return acc

    def merge(self, a: str, b: str) -> str:
        return a + b


class Windowed(ProcessWindowFunction):
    """Outputs the window and the watermark with the result (what a firing sees)."""

    def process(self, key, context, elements):
        w = context.window()
        return [(key, w.start, w.end, context.current_watermark(), *elements)]


FACTORIES = {
    "tumbling-reduce": lambda: window(TumblingEventTimeWindows.of(10), reduce=concat),
    "tumbling-aggregate-late": lambda: window(
        TumblingEventTimeWindows.of(10, 3), aggregate=Digits(), allowed_lateness=7,
        late_data_tag="late",
    ),
    "tumbling-list": lambda: window(TumblingEventTimeWindows.of(10)),
    # a process function seeing the firing watermark, with lateness (fired in the flush,
    # kept for late records, cleaned by a later flush)
    "tumbling-process-late": lambda: window(
        TumblingEventTimeWindows.of(10), aggregate=Digits(), process=Windowed(),
        allowed_lateness=15, late_data_tag="late",
    ),
    "sliding-chain": lambda: window(
        SlidingEventTimeWindows.of(12, 4), aggregate=Digits(), late_data_tag="late"
    ),
    # panes of 2 s, two per slide (r = 2), an offset; a reduce
    "sliding-chain-r2": lambda: window(SlidingEventTimeWindows.of(10, 4, 1), reduce=concat),
    # a process function: the flush folds only, the chain's timer fires
    "sliding-chain-process": lambda: window(
        SlidingEventTimeWindows.of(12, 4), aggregate=Digits(), process=Windowed()
    ),
    # sessions (aec.windowing.session_bundle): every record of a key, replayed in order
    "session-aggregate-late": lambda: window(
        EventTimeSessionWindows.with_gap(4), aggregate=Digits(), allowed_lateness=6,
        late_data_tag="late",
    ),
    "session-reduce": lambda: window(EventTimeSessionWindows.with_gap(5), reduce=concat,
                                     late_data_tag="late"),
    "session-process": lambda: window(
        EventTimeSessionWindows.with_gap(3), aggregate=Digits(), process=Windowed()
    ),
    "session-list": lambda: window(EventTimeSessionWindows.with_gap(6), allowed_lateness=20),
}  # fmt: skip


def feed(op: KeyedProcessOperator, source: list) -> None:
    for element in source:
        if type(element) is Watermark:
            op.process_watermark(element)
        else:
            op.process(element)


def ordered_sources(max_size: int = 40) -> st.SearchStrategy[list]:
    """Keys a/b/c, digits 1..9, timestamps in [0, 60), rising watermarks."""
    return window_sources(max_size, watermark_odds=6, max_value=9)


SERIAL = (ASYNC, AecConfig(buffer_size=1, in_flight_records_limit=1))


@pytest.mark.parametrize("name", list(FACTORIES))
@given(source=ordered_sources(), data=st.data())
def test_bundled_async_equals_sync_in_arrival_order(name, source, data):
    assert_equivalent(FACTORIES[name], source, configs=SERIAL, data=data)


@pytest.mark.parametrize("name", ["tumbling-aggregate-late", "sliding-chain",
                                  "session-aggregate-late"])  # fmt: skip
@settings(max_examples=10)
@given(source=ordered_sources(25), data=st.data())
def test_bundled_async_equals_sync_on_rocksdb(name, source, data):
    with tempfile.TemporaryDirectory() as directory:
        paths = iter(range(10**6))
        assert_equivalent(FACTORIES[name], source, configs=SERIAL[:1], data=data,
                          backend_factory=lambda: RocksDBBackend(f"{directory}/{next(paths)}"))  # fmt: skip


@pytest.mark.parametrize("name", list(FACTORIES))
@given(source=ordered_sources(), cut=st.integers(0, 40))
@settings(max_examples=25, deadline=None)
def test_snapshot_mid_window_gives_the_same_outputs(name, source, cut):
    """A snapshot folds the bundle first; restored and replayed, the same outputs."""
    cut = min(cut, len(source))
    whole = run(source, FACTORIES[name](), SYNC)
    with tempfile.TemporaryDirectory() as directory:
        first = KeyedProcessOperator(FACTORIES[name](), MemoryBackend(), ASYNC)
        first.open()
        feed(first, source[:cut])
        handle = first.snapshot(1, directory)
        outputs, side = first.drain_outputs(), first.drain_side_outputs()
        first.close()
        second = KeyedProcessOperator(FACTORIES[name](), MemoryBackend(), ASYNC)
        second.restore(handle)
        feed(second, source[cut:])
        second.finish()
        outputs += second.drain_outputs()
        for tag, values in second.drain_side_outputs().items():
            side[tag] = side.get(tag, []) + values
    assert epochs(outputs) == epochs(whole.outputs)
    assert per_key(side) == per_key(whole.side_outputs)  # ordered per key, not across keys


def per_key(side: dict) -> dict:
    return {(tag, v[0]): [w for w in values if w[0] == v[0]]
            for tag, values in side.items() for v in values}  # fmt: skip


def test_on_time_records_make_no_requests_until_the_watermark():
    op = KeyedProcessOperator(FACTORIES["tumbling-reduce"](), MemoryBackend(), ASYNC)
    op.open()
    feed(op, [rec("a", 1, 1), rec("b", 2, 2), rec("a", 3, 3), rec("a", 4, 12)])
    assert op.metrics["requests"] == 0 and op.metrics["records_in"] == 4
    op.process_watermark(Watermark(10))  # window [0, 10) of a and b fires
    assert op.drain_outputs() == [("a", "1.3"), ("b", 2), Watermark(10)]
    # the windows fire in the flush: nothing was stored (no end timer registered), so
    # nothing is read, written or removed (record by record: a read and a write per
    # record, 6, before the firings' 4)
    assert op.metrics["requests"] == 0
    assert op.metrics["timers_fired"] == 0
    op.finish()
    assert op.drain_outputs() == [("a", 4), Watermark(float("inf"))]


def test_a_flush_fires_windows_with_lateness_keeps_them_and_a_later_flush_cleans_them():
    # [0, 10) fires at watermark 12 (seeing 12) and stays until 25; a late record re-fires
    # it at once; at 30 the flush fires [10, 20) and cleans [0, 10); no timer fires as one
    source = [rec("a", 1, 1), rec("a", 3, 3), Watermark(12), rec("a", 4, 5),
              rec("a", 5, 14), Watermark(30)]  # fmt: skip
    backend = MemoryBackend()
    op = KeyedProcessOperator(FACTORIES["tumbling-process-late"](), backend, ASYNC)
    op.open()
    feed(op, source)
    assert op.drain_outputs() == [
        ("a", 0, 10, 12, "13"), Watermark(12), ("a", 0, 10, 12, "134"),
        ("a", 10, 20, 30, "5"), Watermark(30),
    ]  # fmt: skip
    assert op.metrics["timers_fired"] == 0
    assert list(backend.state_items("window-contents")["a"]) == [(10, 20)]
    op.finish()
    reference = run(source, FACTORIES["tumbling-process-late"](), SYNC)
    assert [o for o in reference.outputs if type(o) is not Watermark] == [
        ("a", 0, 10, 12, "13"), ("a", 0, 10, 12, "134"), ("a", 10, 20, 30, "5"),
    ]  # fmt: skip
    assert backend.state_items("window-contents") == {}


def test_a_flush_fires_the_keys_windows_stored_earlier_in_order_of_end(tmp_path):
    # a's window [0, 10) is stored by a flush before a snapshot (its end timer
    # registered); the watermark 25 then makes it, a's bundled [10, 20) and b's [20, 30)
    # due: the flush fires a's two in order of end, reading only the stored one
    backend = MemoryBackend()
    op = KeyedProcessOperator(FACTORIES["tumbling-reduce"](), backend, ASYNC)
    op.open()
    feed(op, [rec("a", 1, 1), rec("a", 2, 2)])
    op.snapshot(1, str(tmp_path / "chk"))  # the bundle goes to state, timers registered
    requests = op.metrics["requests"]
    assert backend.state_items("window-contents") and requests > 0
    feed(op, [rec("a", 3, 12), rec("b", 4, 21), rec("a", 5, 13)])
    op.process_watermark(Watermark(30))
    out = op.drain_outputs()
    assert out[-1] == Watermark(30)  # keys interleave freely; per key, in order of end
    assert [o for o in out[:-1] if o[0] == "a"] == [("a", "1.2"), ("a", "3.5")]
    assert [o for o in out[:-1] if o[0] == "b"] == [("b", 4)] and len(out) == 4
    assert op.metrics["requests"] == requests + 2  # a's read and remove of [0, 10)
    assert op.metrics["timers_fired"] == 0  # the flush deleted a's timer at 10
    assert backend.state_items("window-contents") == {}
    op.finish()
    assert op.drain_outputs() == [Watermark(float("inf"))]


def test_end_of_input_folds_the_bundle():
    source = [rec("a", 1, 1), rec("a", 2, 2), rec("b", 5, 15), rec("a", 3, 4)]
    result = run(source, FACTORIES["tumbling-list"](), ASYNC)
    assert result.outputs == run(source, FACTORIES["tumbling-list"](), SYNC).outputs
    assert [("a", 1), ("a", 2), ("a", 3)] in result.outputs


def test_size_bound_folds_early(monkeypatch):
    """At the bound the bundle goes to state at once; later records fold onto it."""
    monkeypatch.setattr(operator_module, "BUNDLE_LIMIT", 5)
    backend = MemoryBackend()
    op = KeyedProcessOperator(FACTORIES["tumbling-reduce"](), backend, ASYNC)
    op.open()
    source = [rec("a", n, n % 10) for n in range(1, 13)]
    feed(op, source)
    assert op.metrics["requests"] > 0  # two flushes of 5 records happened
    op.finish()
    assert op.drain_outputs() == run(source, FACTORIES["tumbling-reduce"](), SYNC).outputs


def test_late_record_and_late_firing_between_bundled_records_of_a_key():
    """Window [3, 13) of ``a`` fires at 13; a record for it then fires it again at once
    (late firing), one before 3 is late (side output); bundled records of the key's
    next window arrive before, between and after them."""
    source = [
        rec("a", 1, 5), Watermark(13), rec("a", 2, 14), rec("a", 3, 6), rec("a", 4, 15),
        rec("a", 5, 1), rec("a", 6, 16), rec("a", 7, 7), Watermark(30),
    ]  # fmt: skip
    name = "tumbling-aggregate-late"
    result = run(source, FACTORIES[name](), ASYNC)
    reference = run(source, FACTORIES[name](), SYNC)
    assert result.outputs == reference.outputs
    assert result.side_outputs == reference.side_outputs == {"late": [("a", 5)]}
    assert result.outputs[:5] == ["1", Watermark(13), "13", "137", "246"]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_raising_add_names_its_record(backend, tmp_path):
    source = [rec("a", 1, 1), rec("b", 2, 2), rec("a", 13, 3), rec("a", 4, 4), Watermark(20)]
    for config in (SYNC, ASYNC):
        with pytest.raises(JobFailure) as failure:
            run(source, FACTORIES["tumbling-aggregate-late"](), config,
                backend=make_backend(backend, tmp_path))  # fmt: skip
        assert failure.value.key == "a" and failure.value.record == ("a", 13)
        assert "('a', 13)" in str(failure.value) and "key 'a'" in str(failure.value)
        assert isinstance(failure.value.__cause__, ArithmeticError)


def test_records_of_other_key_groups_are_still_refused():
    groups = ASYNC.max_parallelism
    owned = key_group_range_for(groups, 2, 0)
    keys = [f"k{i}" for i in range(100)]
    mine = next(k for k in keys if key_group_for(k, groups) in owned)
    other = next(k for k in keys if key_group_for(k, groups) not in owned)
    op = KeyedProcessOperator(FACTORIES["tumbling-reduce"](), MemoryBackend(), ASYNC,
                              key_group_range=owned)  # fmt: skip
    op.open()
    op.process(rec(mine, 1, 1))
    with pytest.raises(ValueError, match="key group"):
        op.process(rec(other, 2, 2))
    op.finish()
    assert op.drain_outputs() == [(mine, 1), Watermark(float("inf"))]


def test_a_record_without_timestamp_still_fails_naming_it():
    with pytest.raises(JobFailure, match="timestamp"):
        run([rec("a", 1, 1), Record("a", ("a", 2))], FACTORIES["tumbling-reduce"](), ASYNC)


def test_sync_and_parallel_runs_do_not_bundle():
    source = [rec("a", n, n) for n in range(1, 9)]
    parallel = AecConfig(watermark_order="parallel")
    for config in (SYNC, parallel):
        result = run(source, FACTORIES["tumbling-reduce"](), config)
        assert result.metrics["requests"] >= 16  # a read and a write per record
    assert run(source, FACTORIES["tumbling-reduce"](), ASYNC).metrics["requests"] < 8


def test_session_records_fold_per_key_before_the_watermark():
    """A key's session records make no requests until the watermark; then one context per
    key places them and fires the sessions the watermark makes due; a key without
    timers has nothing stored (no read), and nothing is left to write."""
    source = [rec("a", 1, 1), rec("a", 2, 12), rec("b", 3, 2), rec("a", 4, 8),
              rec("a", 5, 4)]  # fmt: skip
    op = KeyedProcessOperator(FACTORIES["session-reduce"](), MemoryBackend(), ASYNC)
    op.open()
    feed(op, source)
    assert op.metrics["requests"] == 0 and op.metrics["records_in"] == 5
    op.process_watermark(Watermark(30))
    # a: [1, 6) and [12, 17), then 8 joins the second, then 4 bridges both
    out = op.drain_outputs()  # keys interleave freely (the timers' order was b, a)
    assert sorted(out[:-1]) == [("a", "1.2.4.5"), ("b", 3)] and out[-1] == Watermark(30)
    assert op.metrics["requests"] == 0 and op.metrics["timers_fired"] == 0
    reference = run([*source, Watermark(30)], FACTORIES["session-reduce"](), SYNC)
    assert reference.outputs[:2] == [("b", 3), ("a", "1.2.4.5")]


def test_a_session_flush_reads_stored_sessions_and_fires_only_the_due_ones(tmp_path):
    # a's session [1, 6) is stored by the flush before a snapshot (its end timer
    # registered); then a record at 5 joins it and one at 40 starts [40, 45): at
    # watermark 30 the flush reads a's value, fires the joined session and writes the
    # open one back, deleting the fired session's timer
    backend = MemoryBackend()
    op = KeyedProcessOperator(FACTORIES["session-reduce"](), backend, ASYNC)
    op.open()
    feed(op, [rec("a", 1, 1)])
    op.snapshot(1, str(tmp_path / "chk"))
    before = op.metrics["requests"]
    feed(op, [rec("a", 2, 5), rec("a", 3, 40)])
    op.process_watermark(Watermark(30))
    assert op.drain_outputs() == [("a", "1.2"), Watermark(30)]
    assert op.metrics["requests"] == before + 2 and op.metrics["timers_fired"] == 0
    stored = backend.state_items("window-sessions-contents")
    assert list(stored) == ["a"] and [(s, e) for s, e, _ in stored["a"]] == [(40, 45)]
    op.finish()
    assert op.drain_outputs() == [("a", 3), Watermark(float("inf"))]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_raising_session_aggregate_names_its_record(backend, tmp_path):
    source = [rec("a", 1, 1), rec("b", 2, 2), rec("a", 13, 3), rec("a", 4, 4), Watermark(20)]
    for config in (SYNC, ASYNC):
        with pytest.raises(JobFailure) as failure:
            run(source, FACTORIES["session-aggregate-late"](), config,
                backend=make_backend(backend, tmp_path))  # fmt: skip
        assert failure.value.key == "a" and failure.value.record == ("a", 13)
        assert isinstance(failure.value.__cause__, ArithmeticError)


class _FailingResult(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + value[1]

    def get_result(self, accumulator):
        raise ValueError("get_result failed")

    def merge(self, a, b):
        return a + b


class _FailingProcess(ProcessWindowFunction):
    def process(self, key, context, elements):
        raise ValueError("process failed")


@pytest.mark.parametrize(
    "assigner, fired",
    [
        (TumblingEventTimeWindows.of(10), "timer@20"),
        (SlidingEventTimeWindows.of(10, 5), "timer@15"),
        (EventTimeSessionWindows.with_gap(3), "timer@16"),  # sessions [13, 16) and [17, 20)
    ],
)
@pytest.mark.parametrize("kind", ["aggregate", "process"])
def test_a_failing_window_firing_names_its_timer_as_the_synchronous_run(assigner, fired, kind):
    """A flush fires the key's due windows instead of their timers: a failure there
    names the window's timer, as the firing by its timer does (not the bundle)."""
    source = [rec("k", 13, 13), rec("k", 17, 17), Watermark(25)]
    named = []
    for config in (SYNC, ASYNC):
        function = (
            window(assigner, aggregate=_FailingResult())
            if kind == "aggregate"
            else window(assigner, process=_FailingProcess())
        )
        with pytest.raises(JobFailure) as failure:
            run(source, function, config)
        assert failure.value.key == "k" and isinstance(failure.value.__cause__, ValueError)
        named.append((failure.value.record, str(failure.value).split(":")[0]))
    assert named[0] == named[1] == (fired, f"job failed at event-time {fired} of key 'k'")


def test_a_failing_later_window_of_a_sliding_chain_names_the_chains_timer():
    """Sync: the chain's timer at 15 fires the windows ending at 15, 20 and 25 together;
    the window [10, 20) failing is named by that timer, in the bundled flush too."""

    class FailsOnThirty(_FailingResult):
        def get_result(self, accumulator):
            if accumulator == 30:  # window [10, 20): 13 + 17
                raise ValueError("window [10, 20) failed")
            return accumulator

    source = [rec("k", 13, 13), rec("k", 17, 17), Watermark(25)]
    named = []
    for config in (SYNC, ASYNC):
        with pytest.raises(JobFailure) as failure:
            run(source, window(SlidingEventTimeWindows.of(10, 5), aggregate=FailsOnThirty()), config)
        named.append(failure.value.record)
    assert named == ["timer@15", "timer@15"]
