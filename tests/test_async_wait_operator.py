"""AsyncWaitOperator (FLIP-12): the embedding API, snapshot without waiting, restore
that re-invokes the queued inputs, and the crash property (exactly-once outputs)."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_async_io import split_at_watermarks
from test_trust import Point  # not plain data: msgpack refuses it

from aec import JobFailure, KeyedProcessFunction, KeyedProcessOperator, Watermark
from aec.async_io import AsyncFunction, AsyncWaitOperator
from aec.retry import FixedDelay
from backends import MemoryBackend

MODES = ["ordered", "unordered", "key_ordered"]


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aec-async-io-loop")]


def results_of(item: tuple[int, int]) -> list[Any]:
    """0, 1 or 2 results per input (index, key), so empty results are covered."""
    index, key = item
    return [(index, j) for j in range((index + key) % 3)]


class Sleepy(AsyncFunction):
    """asyncio style: sleeps a seeded random 0-2 ms, counts calls per input."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls: collections.Counter[Any] = collections.Counter()

    async def async_invoke(self, value):
        self.calls[value] += 1
        await asyncio.sleep(self.rng.random() * 0.002)
        return results_of(value)


class Held(AsyncFunction):
    """Flink style: keeps every ResultFuture; the test completes them."""

    def __init__(self) -> None:
        self.futures: dict[Any, Any] = {}
        self.calls: list[Any] = []

    def async_invoke(self, value, result_future):
        self.calls.append(value)
        self.futures[value] = result_future

    def complete(self, value: Any) -> None:
        self.futures.pop(value).complete([value])


def make(function: AsyncFunction, mode: str, capacity: int = 4, **kwargs) -> AsyncWaitOperator:
    if mode == "key_ordered":
        kwargs.setdefault("key_selector", lambda item: item[1])
    return AsyncWaitOperator(function, 5.0, capacity, mode=mode, **kwargs)


# -- the embedding API ------------------------------------------------------------------------
def test_outputs_only_inside_process_and_finish_and_snapshot_emits_nothing(tmp_path):
    function = Held()
    op = AsyncWaitOperator(function, 5.0, 3)
    op.open()
    op.process("a")
    op.process("b")
    function.complete("a")
    function.complete("b")
    assert op.drain_outputs() == []  # completions reach outputs only inside process/finish
    op.snapshot(1, tmp_path)
    assert op.drain_outputs() == []
    op.process_watermark(Watermark(1))
    assert op.drain_outputs() == ["a", "b", Watermark(1)]
    op.process("c")
    function.complete("c")
    op.finish()
    assert op.drain_outputs() == ["c"]


def test_process_waits_for_room_before_admitting():
    function = Held()
    op = AsyncWaitOperator(function, 5.0, 2, mode="unordered")
    op.process("a")
    op.process("b")
    # full: the next process blocks until "b" completes from another thread, and
    # only then calls async_invoke for "c"
    timer = threading.Timer(0.05, function.complete, ["b"])
    timer.start()
    op.process("c")
    timer.join()
    assert function.calls == ["a", "b", "c"]
    assert op.drain_outputs() == ["b"]
    op.close()


def test_snapshot_stores_completed_and_running_inputs_in_order_with_watermarks(tmp_path):
    function = Held()
    op = AsyncWaitOperator(function, 5.0, 10)
    for element in ["a", Watermark(1), "b", "c", Watermark(2), "d"]:
        op.process(element)
    function.complete("b")  # completed but behind the running "a": stored too
    op.process("e")
    handle = op.snapshot(7, tmp_path)
    assert op.drain_outputs() == []
    op.close()
    assert not loop_threads()
    again = Held()
    restored = AsyncWaitOperator(again, 5.0, 10)
    restored.restore(handle)
    assert again.calls == ["a", "b", "c", "d", "e"]  # re-invoked in order, before new input
    for value in list(again.futures):
        again.complete(value)
    restored.process("f")
    again.complete("f")
    restored.finish()
    assert restored.drain_outputs() == [
        "a", Watermark(1), "b", "c", Watermark(2), "d", "e", "f",
    ]  # fmt: skip
    assert restored.metrics["restored_inputs"] == 5


def test_restored_watermark_still_rejects_a_regression(tmp_path):
    op = AsyncWaitOperator(Held(), 5.0, 4)
    op.process_watermark(Watermark(5))
    handle = op.snapshot(1, tmp_path)
    op.close()
    restored = AsyncWaitOperator(Held(), 5.0, 4)
    restored.restore(handle)
    with pytest.raises(ValueError, match="backwards"):
        restored.process_watermark(Watermark(3))
    restored.close()


def test_a_restored_integer_watermark_is_exact_beyond_float_precision(tmp_path):
    """Nanosecond timestamps (ints above 2**53) come back as stored, not rounded: the
    next watermark the uninterrupted run accepts is accepted after a restore too."""
    last = 1_700_000_000_000_000_200
    op = AsyncWaitOperator(Held(), 5.0, 4)
    op.process_watermark(Watermark(last))
    handle = op.snapshot(1, tmp_path)
    op.close()
    restored = AsyncWaitOperator(Held(), 5.0, 4)
    restored.restore(handle)
    restored.process_watermark(Watermark(last + 1))
    with pytest.raises(ValueError, match="backwards"):
        restored.process_watermark(Watermark(last))
    restored.close()


def test_attempt_counts_survive_a_restore(tmp_path):
    class Failing(AsyncFunction):
        def __init__(self) -> None:
            self.calls = 0

        def async_invoke(self, value, result_future):
            self.calls += 1
            result_future.complete_exceptionally(OSError("down"))

    retry = FixedDelay(3, 10.0)  # the second attempt waits in its backoff at the snapshot
    op = AsyncWaitOperator(Failing(), 30.0, 2, retry=retry)
    op.process("x")
    op.process("y")  # runs the mails: "x" failed once and waits 10 s for its retry
    handle = op.snapshot(1, tmp_path)
    op.close()
    function = Failing()
    restored = AsyncWaitOperator(function, 30.0, 2, retry=FixedDelay(2, 0.0))
    restored.restore(handle)
    # one attempt used before the checkpoint, max 2: one more call each, then failure
    with pytest.raises(JobFailure, match="after 2 attempt") as info:
        restored.finish()
    assert isinstance(info.value.__cause__, OSError)
    assert function.calls <= 2


def test_restore_refuses_another_mode_and_keyed_checkpoints(tmp_path):
    op = AsyncWaitOperator(Held(), 5.0, 4, mode="unordered")
    op.process("a")
    handle = op.snapshot(1, tmp_path / "async")
    op.close()
    for mode in ("ordered", "key_ordered"):
        with pytest.raises(ValueError, match="mode"):
            make(Held(), mode).restore(handle)
    keyed = KeyedProcessOperator(_Nothing(), MemoryBackend())
    keyed_handle = keyed.snapshot(1, tmp_path / "keyed")
    keyed.close()
    with pytest.raises(ValueError):
        AsyncWaitOperator(Held(), 5.0, 4).restore(keyed_handle)
    with pytest.raises(ValueError):
        KeyedProcessOperator(_Nothing(), MemoryBackend()).restore(handle)


def test_restore_needs_a_fresh_operator_and_a_complete_checkpoint(tmp_path):
    op = AsyncWaitOperator(Held(), 5.0, 4)
    handle = op.snapshot(1, tmp_path)
    op.process("a")
    with pytest.raises(RuntimeError, match="fresh"):
        op.restore(handle)
    op.close()
    (tmp_path / "chk-1" / "MANIFEST.json").unlink()
    with pytest.raises(ValueError, match="incomplete"):
        AsyncWaitOperator(Held(), 5.0, 4).restore(handle)
    with pytest.raises(FileExistsError):
        AsyncWaitOperator(Held(), 5.0, 4).snapshot(1, tmp_path)


def test_a_failed_snapshot_leaves_no_checkpoint(tmp_path):
    op = AsyncWaitOperator(Held(), 5.0, 4)
    op.process(lambda: None)  # not picklable
    with pytest.raises(JobFailure, match="checkpoint 3"):
        op.snapshot(3, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="failed"):
        op.process("b")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="mode"):
        AsyncWaitOperator(Held(), 1.0, 1, mode="fast")
    with pytest.raises(TypeError, match="key_selector"):
        AsyncWaitOperator(Held(), 1.0, 1, mode="key_ordered")
    with pytest.raises(ValueError, match="key_selector"):
        AsyncWaitOperator(Held(), 1.0, 1, key_selector=len)
    with pytest.raises(ValueError, match="capacity"):
        AsyncWaitOperator(Held(), 1.0, 0)
    with pytest.raises(TypeError, match="expected an aec.Watermark"):
        AsyncWaitOperator(Held(), 1.0, 1).process_watermark(3)


def test_a_bad_key_is_refused_and_leaves_the_operator_usable():
    function = Held()
    op = AsyncWaitOperator(function, 5.0, 2, mode="key_ordered", key_selector=lambda v: v[1])
    with pytest.raises(TypeError):
        op.process(("a", None))
    op.process(("b", 1))
    function.complete(("b", 1))
    op.finish()
    assert op.drain_outputs() == [("b", 1)]


class _Nothing(KeyedProcessFunction):
    """A keyed function, for a keyed-operator checkpoint."""

    def process_element(self, value, ctx):
        ctx.output(value)


# -- the crash property -----------------------------------------------------------------------
@st.composite
def crash_runs(draw):
    keys = draw(st.integers(1, 4))
    items = draw(st.lists(st.one_of(st.integers(0, keys - 1), st.just("wm")), max_size=30))
    source, stamp, index = [], 0, 0
    for item in items:
        if item == "wm":
            stamp += draw(st.integers(0, 2))
            source.append(Watermark(stamp))
        else:
            source.append((index, item))
            index += 1
    points = st.integers(0, max(0, len(source) - 1))
    snapshots = draw(st.sets(points, max_size=4))
    crashes = draw(st.sets(points, max_size=3))
    return source, snapshots, crashes


def expected_outputs(source: list[Any]) -> list[Any]:
    return [
        out
        for element in source
        for out in ([element] if isinstance(element, Watermark) else results_of(element))
    ]


def sleepy_operator(seed: int, calls: Any, mode: str, capacity: int) -> AsyncWaitOperator:
    function = Sleepy(seed)
    function.calls = calls
    return make(function, mode, capacity)


def run_with_crashes(source, snapshots, crashes, mode, capacity, seed, directory,
                     build=sleepy_operator):  # fmt: skip
    """Feed ``source``, snapshotting at ``snapshots`` (outputs drained so far are
    committed with the checkpoint) and throwing the operator away at ``crashes``
    (uncommitted outputs are lost), restoring from the last checkpoint and replaying
    the input after it. ``build(seed, calls, mode, capacity)`` makes each operator,
    its function counting calls per input in ``calls``. Returns the committed outputs
    and the calls per input."""
    calls: collections.Counter[Any] = collections.Counter()
    committed: list[Any] = []
    uncommitted: list[Any] = []
    handle, resume = None, 0
    crashes = set(crashes)
    checkpoint_id = 0

    def new_operator(seed: int) -> AsyncWaitOperator:
        return build(seed, calls, mode, capacity)

    op = new_operator(seed)
    position = 0
    while position < len(source):
        op.process(source[position])
        uncommitted += op.drain_outputs()
        if position in snapshots:
            checkpoint_id += 1
            handle = op.snapshot(checkpoint_id, directory)
            committed += uncommitted
            uncommitted = []
            resume = position + 1
        if position in crashes:
            crashes.discard(position)
            op.close()  # the operator is lost, with what it emitted since the checkpoint
            uncommitted = []
            seed += 1
            op = new_operator(seed)
            if handle is not None:
                op.restore(handle)
            position = resume
            continue
        position += 1
    op.finish()
    committed += uncommitted + op.drain_outputs()
    return committed, calls


def check_segments(source: list[Any], outputs: list[Any]) -> None:
    """Watermarks in order and never crossed: each segment's results stay in it."""
    in_segments, in_marks = split_at_watermarks(source)
    out_segments, out_marks = split_at_watermarks(outputs)
    assert out_marks == in_marks
    for inputs, results in zip(in_segments, out_segments, strict=True):
        expected = collections.Counter(r for item in inputs for r in results_of(item))
        assert collections.Counter(results) == expected


@settings(deadline=None)
@given(
    run=crash_runs(),
    mode=st.sampled_from(MODES),
    capacity=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_crash_restore_replay_emits_each_output_once(run, mode, capacity, seed, tmp_path_factory):
    source, snapshots, crashes = run
    directory = tmp_path_factory.mktemp("chk")
    outputs, calls = run_with_crashes(source, snapshots, crashes, mode, capacity, seed, directory)
    records = [e for e in source if not isinstance(e, Watermark)]
    assert set(calls) == set(records)  # every input called at least once
    check_segments(source, outputs)  # exactly once, nothing crosses a watermark
    if mode == "ordered":
        assert outputs == expected_outputs(source)
    if mode == "key_ordered":
        for key in {k for _, k in records}:
            mine = [
                o
                for o in outputs
                if not isinstance(o, Watermark)
                and o in {r for item in records if item[1] == key for r in results_of(item)}
            ]
            assert mine == sorted(mine)  # per key in input order
    assert not loop_threads()


def test_snapshot_and_restore_through_an_object_store(s3):
    server, bucket = s3
    function = Held()
    op = AsyncWaitOperator(function, 5.0, 4, mode="unordered")
    op.process("a")
    op.process("b")
    function.complete("b")
    op.process_watermark(Watermark(1))
    assert op.drain_outputs() == ["b"]
    handle = op.snapshot(3, f"s3://{bucket}/async")
    op.close()
    keys = server.list_keys(bucket, "async/chk-3/")
    assert any(k.endswith("MANIFEST.json") for k in keys)
    again = Held()
    restored = AsyncWaitOperator(again, 5.0, 4, mode="unordered")
    restored.restore(handle.path)  # the chk-<id> URI
    assert again.calls == ["a"]
    again.complete("a")
    restored.finish()
    assert restored.drain_outputs() == ["a", Watermark(1)]


# -- how checkpoints store the inputs ---------------------------------------------------------
def _touch(path: str) -> str:
    with open(path, "w"):
        return path


class RunsOnLoad:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def test_an_input_msgpack_would_give_back_changed_is_not_stored_so(tmp_path):
    # a named tuple would be re-invoked as a plain tuple after the restore
    pair = collections.namedtuple("Pair", "a b")
    op = make(Held(), "ordered")
    op.process(pair(1, 2))
    with pytest.raises(JobFailure, match="serializer='pickle'") as info:
        op.snapshot(1, tmp_path)
    assert "Pair back as tuple" in str(info.value)
    assert not (tmp_path / "chk-1").exists()


def test_inputs_are_stored_as_plain_data_unless_the_operator_opts_in_to_pickle(tmp_path):
    import hashlib
    import json
    import pickle

    op = make(Held(), "ordered")
    op.process(Point(1))
    with pytest.raises(JobFailure, match="serializer='pickle'"):
        op.snapshot(1, tmp_path / "plain")  # a Point is not plain data
    assert not (tmp_path / "plain" / "chk-1").exists()
    # opted in: any picklable input, restored by an operator with the same serializer
    op = make(Held(), "ordered", serializer="pickle")
    op.process(Point(2))
    handle = op.snapshot(1, tmp_path / "pickled")
    op.close()
    with pytest.raises(ValueError, match="'pickle' serializer; this operator's is 'msgpack'"):
        make(Held(), "ordered").restore(handle)
    function = Held()
    restored = make(function, "ordered", serializer="pickle")
    restored.restore(handle)
    assert function.calls == [Point(2)]
    restored.close()
    # bytes planted in a msgpack checkpoint (its manifest rewritten to match) run nothing
    op = make(Held(), "ordered")
    op.process(3)
    handle = op.snapshot(1, tmp_path / "planted")
    op.close()
    marker = tmp_path / "code-ran"
    planted = pickle.dumps({"elements": [("record", RunsOnLoad(str(marker)), 0)], "watermark": 0.0})
    chk = tmp_path / "planted" / "chk-1"
    (chk / "inputs.bin").write_bytes(planted)
    manifest = json.loads((chk / "MANIFEST.json").read_text())
    manifest["files"]["inputs.bin"] = {
        "sha256": hashlib.sha256(planted).hexdigest(), "size": len(planted)
    }  # fmt: skip
    (chk / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="cannot be read"):
        make(Held(), "ordered").restore(handle)  # decoded by msgpack: data or an error
    assert not marker.exists()
