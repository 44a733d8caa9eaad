"""Rescaling by key group: snapshot at parallelism p,
restore at q, replay == the uninterrupted run, per key; and every bad input.

The property: a random keyed stream is cut at a random position. The prefix runs
on p operators (each record routed to the operator owning its key group,
``operator_index_for``; watermarks go to every operator, as Flink broadcasts
them), each snapshots; q new operators with ``key_group_range_for(mp, q, i)``
each restore the list of all p handles (in a random order) and replay the rest,
routed the same way. Per key, the outputs (with the number of watermarks before
each) and the final state equal one operator's uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from engine_helpers import AsyncCounter, Counter, Everything
from hypothesis import given, settings
from hypothesis import strategies as st
from test_checkpoint import Windows

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.keygroups import KeyGroupRange, key_group_for, key_group_range_for, operator_index_for
from aec.testing.strategies import keyed_streams
from backends import MemoryBackend, RocksDBBackend, SlateDBBackend

FUNCTIONS: dict[str, Callable[[], KeyedProcessFunction]] = {
    "counter": Counter,
    "async-counter": AsyncCounter,
    "windows": Windows,
    "everything": Everything,
}
CONFIGS = [AecConfig(async_state=False), AecConfig(buffer_size=3, in_flight_records_limit=4)]


class Run:
    """Per-key outputs of several operators over one logical stream."""

    def __init__(self) -> None:
        self.per_key: dict[Any, list[Any]] = {}

    def collect(self, operator: KeyedProcessOperator, watermarks_before: int) -> None:
        """Take ``operator``'s trace: each output keyed, with its watermark segment."""
        seen = watermarks_before
        for kind, context, value in operator.trace:
            if kind == "watermark":
                seen += 1
            elif kind in ("out", "side"):
                self.per_key.setdefault(context.key, []).append((seen, kind, value))
        operator.trace = []
        operator.drain_outputs()
        operator.drain_side_outputs()


def route(operators: list[KeyedProcessOperator], elements: list[Any], mp: int) -> None:
    for element in elements:
        if type(element) is Watermark:
            for operator in operators:
                operator.process_watermark(element)
        else:
            index = operator_index_for(key_group_for(element.key, mp), mp, len(operators))
            operators[index].process(element)


def union_state(backends: list[Any], names: list[str]) -> dict[str, dict[Any, Any]]:
    state: dict[str, dict[Any, Any]] = {name: {} for name in names}
    for backend in backends:
        for name in names:
            items = backend.state_items(name)
            assert state[name].keys().isdisjoint(items), "a key lives in two operators"
            state[name].update(items)
    return state


def uninterrupted(function: str, config: AecConfig, source: list, backend: Any) -> tuple:
    run = Run()
    operator = KeyedProcessOperator(FUNCTIONS[function](), backend, config)
    operator.trace = []
    route([operator], source, config.max_parallelism)
    operator.finish()
    run.collect(operator, 0)
    return run.per_key, union_state([backend], operator.state_names)


def rescaled(
    function: str, config: AecConfig, source: list, cut: int, p: int, q: int,
    order: list[int], directory: str, make_backend: Callable[[str], Any],
) -> tuple:  # fmt: skip
    mp = config.max_parallelism
    run = Run()
    first = [
        KeyedProcessOperator(
            FUNCTIONS[function](), make_backend(f"p{i}"), config,
            key_group_range=key_group_range_for(mp, p, i),
        )
        for i in range(p)
    ]  # fmt: skip
    for operator in first:
        operator.trace = []
        operator.open()
    route(first, source[:cut], mp)
    handles = [op.snapshot(3, os.path.join(directory, f"old-{i}")) for i, op in enumerate(first)]
    for operator in first:
        run.collect(operator, 0)
        operator.close()
    done = sum(type(e) is Watermark for e in source[:cut])
    backends = [make_backend(f"q{i}") for i in range(q)]
    second = [
        KeyedProcessOperator(
            FUNCTIONS[function](), backends[i], config,
            key_group_range=key_group_range_for(mp, q, i),
        )
        for i in range(q)
    ]  # fmt: skip
    for operator in second:
        operator.trace = []
        operator.restore([handles[i] for i in order])
    route(second, source[cut:], mp)
    for operator in second:
        operator.finish()
        run.collect(operator, done)
    return run.per_key, union_state(backends, second[0].state_names)


def check_rescale(data: Any, source: list, make_backend: Callable[[str, str], Any]) -> None:
    config = data.draw(st.sampled_from(CONFIGS), label="config")
    mp = data.draw(st.sampled_from([6, 7, 16, 128]), label="max_parallelism")
    config = dataclasses.replace(config, max_parallelism=mp)
    function = data.draw(st.sampled_from(sorted(FUNCTIONS)), label="function")
    p = data.draw(st.integers(1, 6), label="p")
    q = data.draw(st.integers(1, 6), label="q")
    cut = data.draw(st.integers(0, len(source)), label="cut")
    order = data.draw(st.permutations(range(p)), label="handle order")
    with tempfile.TemporaryDirectory() as directory:
        made: list[Any] = []

        def backend(name: str) -> Any:
            made.append(make_backend(directory, name))
            return made[-1]

        try:
            whole = uninterrupted(function, config, source, backend("whole"))
            pieces = rescaled(function, config, source, cut, p, q, list(order), directory, backend)
        finally:
            for each in made:
                each.close()
    assert pieces[0] == whole[0]
    assert pieces[1] == whole[1]


@given(source=keyed_streams(), data=st.data())
def test_rescaled_restore_and_replay_equals_uninterrupted_run_memory(source, data):
    check_rescale(data, source, lambda directory, name: MemoryBackend())


@given(source=keyed_streams(max_size=25), data=st.data())
def test_rescaled_restore_and_replay_equals_uninterrupted_run_rocksdb(source, data):
    check_rescale(
        data, source, lambda directory, name: RocksDBBackend(os.path.join(directory, name))
    )


@settings(max_examples=10)  # each example opens up to 13 SlateDB databases
@given(source=keyed_streams(max_size=20), data=st.data())
def test_rescaled_restore_and_replay_equals_uninterrupted_run_slatedb(source, data):
    check_rescale(
        data, source, lambda directory, name: SlateDBBackend(f"file://{directory}/slate", name)
    )


# -- the operator's key-group range --------------------------------------------------------------
Count = AsyncCounter  # state "count", outputs (key, n)


class OtherState(AsyncCounter):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("other"))


def keys_in(key_groups: KeyGroupRange, mp: int, count: int = 3) -> list[str]:
    found = [f"k{i}" for i in range(1000) if key_group_for(f"k{i}", mp) in key_groups]
    return found[:count]


def test_a_record_of_another_key_group_is_refused_and_the_operator_stays_usable():
    config = AecConfig(max_parallelism=8)
    own = key_group_range_for(8, 2, 0)
    operator = KeyedProcessOperator(Count(), MemoryBackend(), config, key_group_range=own)
    inside, outside = keys_in(own, 8)[0], keys_in(key_group_range_for(8, 2, 1), 8)[0]
    operator.process(Record(inside, 1))
    with pytest.raises(ValueError, match="key group"):
        operator.process(Record(outside, 1))
    operator.process(Record(inside, 2))
    operator.finish()
    assert operator.drain_outputs() == [(inside, 1), (inside, 2), Watermark(math.inf)]
    assert operator.metrics["records_in"] == 2


@pytest.mark.parametrize(
    "bad, error", [(0, ValueError), (-4, ValueError), (2.5, TypeError), (True, TypeError)]
)  # fmt: skip
def test_key_group_for_refuses_a_max_parallelism_as_key_group_range_for_does(bad, error):
    with pytest.raises(error, match="max_parallelism"):
        key_group_for("b", bad)
    with pytest.raises(error, match="max_parallelism"):
        key_group_range_for(bad, 1, 0)


@pytest.mark.parametrize("bad", [KeyGroupRange(0, 8), KeyGroupRange(7, 9), KeyGroupRange(3, 2)])
def test_a_key_group_range_outside_max_parallelism_is_refused(bad):
    with pytest.raises(ValueError, match="key_group_range"):
        KeyedProcessOperator(Count(), MemoryBackend(), AecConfig(max_parallelism=8),
                             key_group_range=bad)  # fmt: skip
    with pytest.raises(TypeError, match="KeyGroupRange"):
        KeyedProcessOperator(Count(), MemoryBackend(), key_group_range=(0, 3))


def test_executor_and_clock_keywords_still_work_with_a_range():
    from aec.clock import ManualClock
    from aec.runtime.executor import InlineExecutor

    operator = KeyedProcessOperator(
        Count(), MemoryBackend(), AecConfig(max_parallelism=4), executor=InlineExecutor(),
        clock=ManualClock(), key_group_range=KeyGroupRange(0, 3),
    )  # fmt: skip
    operator.process(Record("a", 1))
    operator.finish()
    assert operator.drain_outputs()[0] == ("a", 1)


# -- restore of several handles: what it refuses ---------------------------------------------------
def snapshot_of(tmp_path, name, function=None, mp=8, key_groups=None, records=(), wm=None):
    operator = KeyedProcessOperator(function or Count(), MemoryBackend(),
                                    AecConfig(max_parallelism=mp), key_group_range=key_groups)  # fmt: skip
    for key in records:
        operator.process(Record(key, 1))
    if wm is not None:
        operator.process_watermark(Watermark(wm))
    return operator.snapshot(1, tmp_path / name)


def test_a_single_handle_is_filtered_to_the_range(tmp_path):
    keys = [f"k{i}" for i in range(40)]
    handle = snapshot_of(tmp_path, "all", records=keys)
    own = key_group_range_for(8, 3, 1)
    backend = MemoryBackend()
    operator = KeyedProcessOperator(Count(), backend, AecConfig(max_parallelism=8),
                                    key_group_range=own)  # fmt: skip
    operator.restore(handle)
    kept = backend.state_items("count")
    assert kept and set(kept) == {k for k in keys if key_group_for(k, 8) in own}


def test_restored_watermark_is_the_minimum_and_metadata_records_the_range(tmp_path):
    mp = 8
    low = snapshot_of(tmp_path, "a", key_groups=key_group_range_for(mp, 2, 0), wm=5.0)
    high = snapshot_of(tmp_path, "b", key_groups=key_group_range_for(mp, 2, 1), wm=9.0)
    operator = KeyedProcessOperator(Count(), MemoryBackend(), AecConfig(max_parallelism=mp))
    operator.restore([high, low])
    assert operator.watermark == 5.0
    with pytest.raises(ValueError, match="backwards"):
        operator.process_watermark(Watermark(4.0))
    import json

    with open(os.path.join(high.path, "operator.json")) as src:
        assert json.load(src)["key_group_range"] == [4, 7]


def fresh(mp=8, key_groups=None):
    backend = MemoryBackend()
    backend.execute_batch([])  # untouched marker: no tables
    operator = KeyedProcessOperator(Count(), backend, AecConfig(max_parallelism=mp),
                                    key_group_range=key_groups)  # fmt: skip
    return operator, backend


@pytest.mark.parametrize("case", ["max_parallelism", "state names", "overlap", "same twice",
                                  "old full-range overlap", "empty"])  # fmt: skip
def test_restore_refuses_handles_that_do_not_fit_and_changes_nothing(tmp_path, case):
    mp = 8
    key = keys_in(key_group_range_for(mp, 2, 0), mp)[0]
    a = snapshot_of(tmp_path, "a", key_groups=key_group_range_for(mp, 2, 0), records=[key])
    if case == "max_parallelism":
        handles = [a, snapshot_of(tmp_path, "b", mp=16, key_groups=key_group_range_for(16, 2, 1))]
    elif case == "state names":
        handles = [a, snapshot_of(tmp_path, "b", OtherState(), key_groups=KeyGroupRange(4, 7))]
    elif case == "overlap":
        handles = [a, snapshot_of(tmp_path, "b", key_groups=KeyGroupRange(3, 7))]
    elif case == "same twice":
        handles = [a, a]
    elif case == "old full-range overlap":
        handles = [a, snapshot_of(tmp_path, "b")]  # no range recorded: every key group
    else:
        handles = []
    operator, backend = fresh(mp)
    backend._tables = {"count": {"live": 1}}
    with pytest.raises(ValueError):
        operator.restore(handles)
    assert backend.state_items("count") == {"live": 1}
    assert operator.status == "new"  # not even opened: restore can still be called
    operator.restore([a])
    assert backend.state_items("count") == {key: 1}


def test_a_checkpoint_without_a_recorded_range_counts_as_every_key_group(tmp_path):
    handle = snapshot_of(tmp_path, "old", records=[f"k{i}" for i in range(20)])
    import json

    path = os.path.join(handle.path, "operator.json")
    with open(path) as src:
        metadata = json.load(src)
    del metadata["key_group_range"]  # as written before rescaling existed
    data = json.dumps(metadata, indent=1, sort_keys=True).encode()
    with open(path, "wb") as out:
        out.write(data)
    import hashlib

    manifest_path = os.path.join(handle.path, "MANIFEST.json")
    with open(manifest_path) as src:
        manifest = json.load(src)
    manifest["files"]["operator.json"] = {"size": len(data),
                                          "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    with open(manifest_path, "w") as out:
        json.dump(manifest, out)
    own = key_group_range_for(8, 2, 1)
    operator, backend = fresh(8, own)
    operator.restore(handle)
    assert set(backend.state_items("count")) == set(
        k for k in (f"k{i}" for i in range(20)) if key_group_for(k, 8) in own
    )


def test_memory_backend_restore_unions_and_filters(tmp_path):
    a, b = MemoryBackend(), MemoryBackend()
    a._tables = {"s": {"x": 1, "y": 2}}
    b._tables = {"s": {"z": 3}, "t": {"z": [1]}}
    a.snapshot(str(tmp_path / "a"))
    b.snapshot(str(tmp_path / "b"))
    merged = MemoryBackend()
    merged.restore([str(tmp_path / "a"), str(tmp_path / "b")])
    assert merged.state_items("s") == {"x": 1, "y": 2, "z": 3}
    assert merged.state_items("t") == {"z": [1]}
    own = KeyGroupRange(key_group_for("x", 4), key_group_for("x", 4))
    merged.restore([str(tmp_path / "a"), str(tmp_path / "b")], own, 4)
    assert set(merged.state_items("s")) == {k for k in "xyz" if key_group_for(k, 4) in own}
    with pytest.raises(ValueError, match="max_parallelism"):
        merged.restore(str(tmp_path / "a"), own)
    with pytest.raises(ValueError, match="two of the snapshots"):
        merged.restore([str(tmp_path / "a"), str(tmp_path / "a")])
    with pytest.raises(FileNotFoundError):
        merged.restore([str(tmp_path / "a"), str(tmp_path / "missing")])
    assert set(merged.state_items("s")) == {k for k in "xyz" if key_group_for(k, 4) in own}


def test_a_key_outside_the_range_is_refused_each_time_it_comes():
    """The key-group range is checked when a key's group is first cached; a refused key
    must not stay cached, or its next record would skip the check."""
    own = KeyGroupRange(0, 63)
    outside = next(k for k in range(1000) if key_group_for(k, 128) not in own)
    inside = next(k for k in range(1000) if key_group_for(k, 128) in own)
    op = KeyedProcessOperator(AsyncCounter(), MemoryBackend(), AecConfig(max_parallelism=128),
                              key_group_range=own)  # fmt: skip
    op.open()
    for n in range(3):
        with pytest.raises(ValueError, match="outside this operator's"):
            op.process_fields(outside, n, float(n))
        op.process_fields(inside, n, float(n))
    op.finish()
    assert [o for o in op.drain_outputs() if not isinstance(o, Watermark)] == [
        (inside, 1), (inside, 2), (inside, 3)
    ]  # fmt: skip
    op.close()


def _halves_of_16() -> tuple[KeyGroupRange, KeyGroupRange, str, str]:
    """The two halves of 16 key groups and a key of each."""
    first, second = key_group_range_for(16, 2, 0), key_group_range_for(16, 2, 1)
    a = next(f"a{i}" for i in range(1000) if key_group_for(f"a{i}", 16) in first)
    b = next(f"b{i}" for i in range(1000) if key_group_for(f"b{i}", 16) in second)
    return first, second, a, b


def _opened_halves(function: Callable[[], KeyedProcessFunction], config: AecConfig, clock: Any):
    """An opened operator of ``function`` per half of 16 key groups, sharing ``clock``."""
    first, second, _, _ = _halves_of_16()
    operators = [
        KeyedProcessOperator(function(), MemoryBackend(), config, clock=clock, key_group_range=r)
        for r in (first, second)
    ]
    for operator in operators:
        operator.open()
    return operators


def _snapshot_and_close(operators: list, directory: Any, checkpoint_id: int = 1,
                        name: str = "op") -> list:  # fmt: skip
    """Each operator's checkpoint ``checkpoint_id`` in ``directory/<name><i>``; then closed."""
    handles = [op.snapshot(checkpoint_id, directory / f"{name}{i}") for i, op in enumerate(operators)]
    for operator in operators:
        operator.close()
    return handles


@pytest.mark.parametrize("config", [AecConfig(max_parallelism=16), AecConfig(max_parallelism=16, async_state=False)], ids=["async", "sync"])  # fmt: skip
def test_a_processing_time_timer_due_at_a_merged_clock_reading_fires_before_new_input(
    tmp_path, config
):
    """Operator A registered a processing-time timer at 105 and last read the clock at
    100; B read 110. One operator restored from both takes 110 as read: the timer is
    due already, so it fires before the next element (as A would have at its next
    element), not at a clock advance that may never come."""
    from aec.clock import ManualClock

    class Arm(KeyedProcessFunction):
        def process_element(self, value, ctx):
            service = ctx.timer_service
            if value == "arm":
                service.register_processing_time_timer(service.current_processing_time() + 5)
            ctx.output(("record", value))

        def on_timer(self, timestamp, ctx):
            ctx.output(("timer", timestamp, ctx.timer_service.current_processing_time()))

    first, second, a, b = _halves_of_16()
    clock = ManualClock(0)
    operators = _opened_halves(Arm, config, clock)
    clock.set(100)
    operators[0].process(Record(a, "arm"))
    operators[1].process(Record(b, "x"))
    clock.set(110)
    operators[1].process(Record(b, "y"))  # only B reads 110
    handles = _snapshot_and_close(operators, tmp_path)
    merged = KeyedProcessOperator(Arm(), MemoryBackend(), config, clock=clock)
    merged.restore(handles)
    merged.process(Record(a, "after"))  # the clock still reads 110
    merged.finish()
    outputs = [o for o in merged.drain_outputs() if not isinstance(o, Watermark)]
    assert outputs == [("timer", 105.0, 110.0), ("record", "after")]

    # B's half alone, from both, with a timer of B's due at B's own reading: A's newly
    # due timer is of a key B's half does not own, so no tick fires B's early
    class ArmNow(Arm):
        def process_element(self, value, ctx):
            if value == "now":
                ctx.timer_service.register_processing_time_timer(110)
            return super().process_element(value, ctx)

    clock = ManualClock(100)
    before = [KeyedProcessOperator(ArmNow(), MemoryBackend(), config, clock=clock,
                                   key_group_range=r) for r in (first, second)]  # fmt: skip
    for operator in before:
        operator.open()
    before[0].process(Record(a, "arm"))  # due at 105
    clock.set(110)
    before[1].process(Record(b, "now"))  # due at 110, B's own reading
    handles = _snapshot_and_close(before, tmp_path, 2, "again")
    half = KeyedProcessOperator(ArmNow(), MemoryBackend(), config, clock=clock,
                                key_group_range=second)  # fmt: skip
    half.restore(handles)
    assert half.metrics["timers_fired"] == 0
    half.close()


@pytest.mark.parametrize("async_state", [True, False])
def test_a_timer_failing_when_a_merged_clock_reading_makes_it_due_fails_the_restore(
    tmp_path, async_state
):
    """The timer a merged clock reading makes due fires inside ``restore``: its user
    error is a ``JobFailure`` naming the firing, and the operator is failed."""
    from aec.clock import ManualClock

    class Fails(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service.register_processing_time_timer(105)

        def on_timer(self, timestamp, ctx):
            raise ValueError(f"timer {timestamp}")

    config = AecConfig(max_parallelism=16, async_state=async_state)
    _, _, a, b = _halves_of_16()
    clock = ManualClock(100)
    operators = _opened_halves(Fails, config, clock)
    operators[0].process(Record(a, "arm"))
    clock.set(110)
    operators[1].process(Record(b, "arm"))  # only B reads 110
    handles = _snapshot_and_close(operators, tmp_path)
    merged = KeyedProcessOperator(Fails(), MemoryBackend(), config, clock=clock)
    with pytest.raises(JobFailure, match=r"timer@105"):
        merged.restore(handles)
    assert merged.status == "failed"
