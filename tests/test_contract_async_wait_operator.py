"""Contract tests: async I/O as an operator with
checkpoints (FLIP-12 ``AsyncWaitOperator``). Black-box, public names only."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aec import JobFailure, Watermark
from aec.async_io import (
    AsyncFunction,
    AsyncWaitOperator,
    key_ordered_wait,
    ordered_wait,
    unordered_wait,
)
from aec.retry import FixedDelay


class Manual(AsyncFunction):
    """Flink style: the test completes each input's future itself."""

    def __init__(self):
        self.pending = {}
        self.invoked = []
        self.opened = 0

    def open(self):
        self.opened += 1

    def async_invoke(self, value, result_future):
        self.invoked.append(value)
        self.pending[value] = result_future

    def complete(self, value):
        self.pending.pop(value).complete([("out", value)])


class Echo(Manual):
    """Flink style, completing each call at once."""

    def async_invoke(self, value, result_future):
        super().async_invoke(value, result_future)
        self.complete(value)


class Sleepy(AsyncFunction):
    """asyncio style; sleeps ``value[1]`` seconds; tracks concurrency overall and per key."""

    def __init__(self):
        self.running = 0
        self.max_running = 0
        self.per_key = {}
        self.overlap = False
        self.lock = threading.Lock()

    async def async_invoke(self, value):
        key, delay = value
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            if self.per_key.get(key):
                self.overlap = True
            self.per_key[key] = self.per_key.get(key, 0) + 1
        await asyncio.sleep(delay)
        with self.lock:
            self.running -= 1
            self.per_key[key] -= 1
        return [value]


def _out(values):
    return [("out", v) if not isinstance(v, Watermark) else v for v in values]


def test_ordered_emits_in_input_order_with_watermarks():
    fn = Manual()
    op = AsyncWaitOperator(fn, 10.0, 10)
    op.open()
    op.process(0)
    op.process(1)
    op.process_watermark(Watermark(5.0))
    op.process(2)
    for v in (2, 1, 0):
        fn.complete(v)
    op.finish()
    assert op.drain_outputs() == _out([0, 1, Watermark(5.0), 2])


def test_outputs_are_emitted_only_inside_process_watermark_and_finish():
    fn = Manual()
    op = AsyncWaitOperator(fn, 10.0, 10)
    op.open()
    op.process(0)
    op.process(1)
    fn.complete(0)
    fn.complete(1)
    time.sleep(0.05)
    assert op.drain_outputs() == []  # completed, but no process/watermark/finish call yet
    op.process_watermark(Watermark(1.0))
    assert op.drain_outputs() == _out([0, 1, Watermark(1.0)])
    op.process(2)
    fn.complete(2)
    assert op.drain_outputs() == []
    op.finish()
    assert op.drain_outputs() == _out([2])


def test_process_waits_for_room_before_admitting_never_after():
    fn = Manual()
    op = AsyncWaitOperator(fn, 10.0, 2)
    op.open()
    op.process(0)
    op.process(1)
    done = threading.Event()

    def third():
        op.process(2)
        done.set()

    worker = threading.Thread(target=third, daemon=True)
    worker.start()
    time.sleep(0.2)
    assert not done.is_set()
    assert fn.invoked == [0, 1]  # input 2 not admitted (not invoked) while full
    fn.complete(0)
    assert done.wait(5.0)
    worker.join(5.0)
    assert fn.invoked == [0, 1, 2]
    assert op.drain_outputs() == _out([0])  # room was made by emitting 0, before admitting
    fn.complete(1)
    fn.complete(2)
    op.finish()
    assert op.drain_outputs() == _out([1, 2])


@pytest.mark.parametrize("mode", ["ordered", "unordered", "key_ordered"])
def test_capacity_bounds_calls_in_flight(mode):
    fn = Sleepy()
    kw = {"key_selector": lambda v: v[0]} if mode == "key_ordered" else {}
    op = AsyncWaitOperator(fn, 10.0, 3, mode=mode, **kw)
    op.open()
    values = [(i % 5, 0.01 * (i % 3)) for i in range(20)]
    for v in values:
        op.process(v)
    op.finish()
    out = op.drain_outputs()
    assert sorted(out) == sorted(values)
    if mode == "ordered":
        assert out == values
    assert fn.max_running <= 3
    if mode == "key_ordered":
        assert not fn.overlap  # same-key calls never overlap (FLIP-519)
        for key in range(5):
            assert [v for v in out if v[0] == key] == [v for v in values if v[0] == key]


def test_unordered_watermarks_are_boundaries():
    fn = Sleepy()
    op = AsyncWaitOperator(fn, 10.0, 10, mode="unordered")
    op.open()
    before = [("a", 0.05), ("b", 0.0), ("c", 0.02)]
    after = [("d", 0.0), ("e", 0.03)]
    for v in before:
        op.process(v)
    op.process_watermark(Watermark(1.0))
    for v in after:
        op.process(v)
    op.finish()
    out = op.drain_outputs()
    w = out.index(Watermark(1.0))
    assert sorted(out[:w]) == sorted(before)
    assert sorted(out[w + 1:]) == sorted(after)


def test_snapshot_does_not_wait_emits_nothing_and_stores_queued_inputs(tmp_path):
    fn = Manual()
    op = AsyncWaitOperator(fn, 30.0, 10)
    op.open()
    op.process(0)
    op.process(1)
    op.process_watermark(Watermark(5.0))
    op.process(2)
    fn.complete(1)  # completed but not emittable (0 is ahead, ordered)
    started = time.monotonic()
    handle = op.snapshot(1, tmp_path)
    assert time.monotonic() - started < 10.0  # did not wait for input 0's call
    assert op.drain_outputs() == []
    op.close()

    again = Echo()
    restored = AsyncWaitOperator(again, 30.0, 10)
    restored.restore(handle)
    assert again.opened == 1  # restore opens the operator
    assert restored.drain_outputs() == []  # outputs leave only in process/watermark/finish
    restored.process(3)
    restored.finish()
    assert restored.drain_outputs() == _out([0, 1, Watermark(5.0), 2, 3])
    assert again.invoked == [0, 1, 2, 3]  # at-least-once calls: 1 is invoked again


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_outputs_exactly_once_across_snapshot_loss_restore_replay(mode, tmp_path):
    fn = Manual()
    op = AsyncWaitOperator(fn, 30.0, 8, mode=mode)  # room for every input before the cut
    op.open()
    emitted = []
    inputs = list(range(10))
    cut = 6
    for v in inputs[:cut]:
        op.process(v)
        if v % 2 == 0 and v in fn.pending:
            fn.complete(v)
        emitted += op.drain_outputs()
    handle = op.snapshot(1, tmp_path)
    emitted += op.drain_outputs()
    assert emitted and len(emitted) < cut  # some emitted before the checkpoint, some queued
    # the operator goes on, then is lost: what it emits after the snapshot is gone
    for v in list(fn.pending):
        fn.complete(v)
    op.close()

    restored = AsyncWaitOperator(Echo(), 30.0, 8, mode=mode)
    restored.restore(handle)
    for v in inputs[cut:]:
        restored.process(v)
    restored.finish()
    emitted += restored.drain_outputs()
    assert sorted(emitted) == _out(inputs)
    if mode == "ordered":
        assert emitted == _out(inputs)


def test_restore_is_refused_after_input(tmp_path):
    op = AsyncWaitOperator(Echo(), 5.0, 4)
    op.open()
    op.process(1)
    handle = op.snapshot(1, tmp_path)
    op.close()
    other = AsyncWaitOperator(Echo(), 5.0, 4)
    other.open()
    other.process(9)
    with pytest.raises(RuntimeError):
        other.restore(handle)
    other.close()


def test_restore_without_manifest_is_value_error(tmp_path):
    import os

    op = AsyncWaitOperator(Echo(), 5.0, 4)
    op.open()
    op.process(1)
    handle = op.snapshot(1, tmp_path)
    op.close()
    for name in os.listdir(handle.path):
        if name.lower().startswith("manifest"):
            os.remove(os.path.join(handle.path, name))
    with pytest.raises(ValueError):
        AsyncWaitOperator(Echo(), 5.0, 4).restore(handle)


def test_iterator_front_ends_match_the_operator():
    source = [1, 2, Watermark(3.0), 4, 5]

    def run(mode, **kw):
        op = AsyncWaitOperator(Echo(), 5.0, 2, mode=mode, **kw)
        op.open()
        for e in source:
            op.process(e) if not isinstance(e, Watermark) else op.process_watermark(e)
        op.finish()
        return op.drain_outputs()

    assert list(ordered_wait(source, Echo(), 5.0, 2)) == run("ordered")
    assert sorted(map(str, unordered_wait(source, Echo(), 5.0, 2))) == sorted(
        map(str, run("unordered"))
    )
    keyed = list(key_ordered_wait(source, Echo(), 5.0, 2, key_selector=lambda v: v % 2))
    assert sorted(map(str, keyed)) == sorted(map(str, run("key_ordered", key_selector=lambda v: v % 2)))
    # end of input emits no extra watermark
    assert [e for e in keyed if isinstance(e, Watermark)] == [Watermark(3.0)]


def test_default_timeout_fails_the_job_with_timeout_error():
    fn = Manual()
    op = AsyncWaitOperator(fn, 0.1, 4)
    op.open()
    op.process(1)
    with pytest.raises(JobFailure) as info:
        op.finish()
    assert isinstance(info.value.__cause__, TimeoutError)


def test_retry_on_exception_then_success():
    class Flaky(AsyncFunction):
        def __init__(self):
            self.calls = 0

        async def async_invoke(self, value):
            self.calls += 1
            if self.calls < 3:
                raise ConnectionError("flaky")
            return [value]

    fn = Flaky()
    op = AsyncWaitOperator(fn, 5.0, 2, retry=FixedDelay(3, 0.01))
    op.open()
    op.process("x")
    op.finish()
    assert op.drain_outputs() == ["x"]
    assert fn.calls == 3


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        AsyncWaitOperator(Echo(), 5.0, 2, mode="sideways")
    with pytest.raises(ValueError):
        AsyncWaitOperator(Echo(), 5.0, 0)
    with pytest.raises((TypeError, ValueError)):
        AsyncWaitOperator(Echo(), 5.0, 2, mode="key_ordered")  # no key_selector


def test_key_ordered_snapshot_and_restore_keep_per_key_order(tmp_path):
    fn = Manual()
    op = AsyncWaitOperator(fn, 30.0, 10, mode="key_ordered", key_selector=lambda v: v[0])
    op.open()
    values = [("a", 0), ("b", 1), ("a", 2), ("b", 3), ("a", 4)]
    for v in values:
        op.process(v)
    assert fn.invoked == [("a", 0), ("b", 1)]  # a later same-key call waits for the previous
    fn.complete(("b", 1))
    op.process_watermark(Watermark(1.0))
    emitted = op.drain_outputs()
    handle = op.snapshot(1, tmp_path)
    emitted += op.drain_outputs()
    op.close()
    restored = AsyncWaitOperator(Echo(), 30.0, 10, mode="key_ordered", key_selector=lambda v: v[0])
    restored.restore(handle)
    restored.process(("b", 5))
    restored.finish()
    emitted += restored.drain_outputs()
    records = [e for e in emitted if not isinstance(e, Watermark)]
    assert sorted(records) == sorted(("out", v) for v in values + [("b", 5)])
    for key in "ab":
        assert [r for r in records if r[1][0] == key] == [
            ("out", v) for v in values + [("b", 5)] if v[0] == key
        ]
    w = emitted.index(Watermark(1.0))
    assert {r[1] for r in emitted[:w]} == set(values)  # every input before the watermark
