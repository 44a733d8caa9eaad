"""Checkpoints (docs/semantics.md rule 9): snapshot, restore, replay == the uninterrupted run.

The property: cut a random keyed stream at a random position, run the prefix,
snapshot, throw the operator away, restore into a new operator and backend,
replay the suffix and finish. The outputs drained before the snapshot plus
the outputs after the restore, and the final state, equal the uninterrupted
run's: exactly in synchronous mode; per key and watermark segment in serial
async mode; per (key, epoch, record-or-timer) in parallel mode (docs/semantics.md rule
11's granularity, since async runs interleave keys differently anyway).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from engine_helpers import AsyncCounter, Counter, Everything, ManualExecutor
from hypothesis import given
from hypothesis import strategies as st

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    KeyedProcessOperator,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.checkpoint import CheckpointHandle, latest_checkpoint
from aec.checkpoint import files as ckpt
from aec.clock import ManualClock
from aec.testing import ScriptedExecutor
from aec.testing.strategies import keyed_streams
from backends import MemoryBackend, RocksDBBackend


class Windows(KeyedProcessFunction):
    """Records append to a list and register an event-time timer above the current
    watermark (multiples of 4 delete one instead); timers read and write only their
    own map state. So parallel watermark order is equivalent too (rule 11)."""

    def open(self, ctx):
        self.items = ctx.get_state(ListStateDescriptor("items"))
        self.fired = ctx.get_state(MapStateDescriptor("fired"))

    async def process_element(self, value, ctx):
        timers = ctx.timer_service
        base = max(float(value), timers.current_watermark())
        if value % 4 == 0:
            timers.delete_event_time_timer(base + 2)
        else:
            timers.register_event_time_timer(base + 2 + value % 3)
        await self.items.async_add(value)
        ctx.output((ctx.current_key, value))

    async def on_timer(self, timestamp, ctx):
        n = (await self.fired.async_get(timestamp) or 0) + 1
        await self.fired.async_put(timestamp, n)
        ctx.output(("fired", ctx.current_key, timestamp, n))


class Reminders(KeyedProcessFunction):
    """A record's value v sets a processing-time reminder v seconds from now;
    each reminder counts and re-arms itself 7 s later once."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        timers = ctx.timer_service
        timers.register_processing_time_timer(timers.current_processing_time() + value)
        await self.count.async_update(await self.count.async_value() + 1)

    async def on_timer(self, timestamp, ctx):
        n = await self.count.async_value()
        if timestamp % 2 == 0:
            ctx.timer_service.register_processing_time_timer(timestamp + 7)
        now = ctx.timer_service.current_processing_time()
        ctx.output(("reminder", ctx.current_key, timestamp, n, now))


FUNCTIONS: dict[str, Callable[[], KeyedProcessFunction]] = {
    "counter": Counter,
    "async-counter": AsyncCounter,
    "windows": Windows,
    "everything": Everything,  # its timers read state later records write: not parallel-safe
}
SYNC = AecConfig(async_state=False)
SERIAL = AecConfig(buffer_size=3, in_flight_records_limit=4)
PARALLEL = AecConfig(buffer_size=2, in_flight_records_limit=5, watermark_order="parallel")


def feed(operator: KeyedProcessOperator, elements: list[Any], clock: Any = None) -> None:
    """Records and watermarks in order; ``("advance", s)`` moves ``clock``."""
    for element in elements:
        if type(element) is Watermark:
            operator.process_watermark(element)
        elif type(element) is Record:
            operator.process(element)
        else:
            clock.advance(element[1])


def states(backend: Any, names: list[str]) -> dict[str, Any]:
    return {name: backend.state_items(name) for name in names}


def observed(trace: list, serial: bool) -> tuple[list, dict]:
    """The watermark sequence, and outputs grouped per key and watermark segment
    (serial) or per key, epoch and record-or-timer (parallel)."""
    watermarks: list[Any] = []
    groups: dict[tuple, list[Any]] = {}
    for kind, context, value in trace:
        if kind == "watermark":
            watermarks.append(value)
        elif kind != "tick":
            if serial:
                slot = (kind, context.key, len(watermarks))
            else:
                slot = (kind, context.key, context.epoch.sequence, context.timer is not None)
            groups.setdefault(slot, []).append(value)
    return watermarks, groups


class Outcome:
    """What a run produced: outputs, side outputs, the trace, final state."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []
        self.side: dict[Any, list[Any]] = {}
        self.trace: list[Any] = []
        self.state: dict[str, Any] = {}

    def take(self, operator: KeyedProcessOperator) -> None:
        self.outputs += operator.drain_outputs()
        for tag, values in operator.drain_side_outputs().items():
            self.side.setdefault(tag, []).extend(values)
        self.trace += operator.trace


def uninterrupted(
    function: str, backend: Any, config: AecConfig, source: list, executor: Any = None
) -> Outcome:
    outcome = Outcome()
    operator = KeyedProcessOperator(FUNCTIONS[function](), backend, config, executor)
    operator.trace = []
    feed(operator, source)
    operator.finish()
    outcome.take(operator)
    outcome.state = states(backend, operator.state_names)
    return outcome


def checkpointed(
    function: str,
    backends: tuple[Any, Any],
    config: AecConfig,
    source: list,
    cut: int,
    directory: str,
    executors: tuple[Any, Any] = (None, None),
) -> Outcome:
    """Run ``source[:cut]``, snapshot, discard; restore a new operator, replay the rest."""
    outcome = Outcome()
    first = KeyedProcessOperator(FUNCTIONS[function](), backends[0], config, executors[0])
    first.trace = []
    feed(first, source[:cut])
    handle = first.snapshot(7, directory)
    assert first.controller.in_flight == 0 and first.epochs.all_closed_done()
    outcome.take(first)
    first.close()
    second = KeyedProcessOperator(FUNCTIONS[function](), backends[1], config, executors[1])
    second.trace = []
    second.restore(pickle.loads(pickle.dumps(handle)))  # the handle travels (Spark glue)
    feed(second, source[cut:])
    second.finish()
    outcome.take(second)
    outcome.state = states(backends[1], second.state_names)
    return outcome


def assert_same(whole: Outcome, pieces: Outcome, config: AecConfig) -> None:
    if not config.async_state:  # deterministic: exactly the same sequence
        assert pieces.outputs == whole.outputs
        assert pieces.side == whole.side
    else:
        serial = config.watermark_order == "serial"
        assert observed(pieces.trace, serial) == observed(whole.trace, serial)
        assert [o for o in pieces.outputs if type(o) is Watermark] == [
            o for o in whole.outputs if type(o) is Watermark
        ]
    assert pieces.state == whole.state


# -- the property ------------------------------------------------------------------------------
modes_and_functions = st.sampled_from([SYNC, SERIAL, PARALLEL]).flatmap(
    lambda config: st.tuples(
        st.just(config),
        st.sampled_from(
            ["counter", "async-counter", "windows"]
            + (
                []
                if config.watermark_order == "parallel" and config.async_state
                else ["everything"]
            )
        ),
    )
)


@given(source=keyed_streams(), choice=modes_and_functions, data=st.data())
def test_restore_and_replay_equals_uninterrupted_run_memory(source, choice, data):
    config, function = choice
    cut = data.draw(st.integers(0, len(source)), label="cut")

    def executor():  # adversarial batch completion orders, drawn (and shrunk) by hypothesis
        return ScriptedExecutor(data=data) if config.async_state else None

    whole = uninterrupted(function, MemoryBackend(), config, source, executor())
    with tempfile.TemporaryDirectory() as directory:
        pieces = checkpointed(
            function, (MemoryBackend(), MemoryBackend()), config, source, cut, directory,
            (executor(), executor()),
        )  # fmt: skip
    assert_same(whole, pieces, config)


@given(source=keyed_streams(max_size=25), choice=modes_and_functions, data=st.data())
def test_restore_and_replay_equals_uninterrupted_run_rocksdb(source, choice, data):
    # RocksDB is blocking: async runs use the thread-pool executor (real I/O threads)
    config, function = choice
    cut = data.draw(st.integers(0, len(source)), label="cut")
    with tempfile.TemporaryDirectory() as directory:
        made: list[RocksDBBackend] = []

        def rocksdb(name: str) -> RocksDBBackend:
            made.append(RocksDBBackend(os.path.join(directory, name)))
            return made[-1]

        try:
            whole = uninterrupted(function, rocksdb("whole"), config, source)
            pieces = checkpointed(
                function, (rocksdb("first"), rocksdb("second")), config, source, cut,
                os.path.join(directory, "checkpoints"),
            )  # fmt: skip
        finally:
            for backend in made:
                backend.close()
    assert_same(whole, pieces, config)


@pytest.mark.parametrize("config", [SYNC, SERIAL, PARALLEL], ids=["sync", "serial", "parallel"])
def test_every_cut_of_a_fixed_stream_with_thread_pool(config, tmp_path):
    # an explicit thread-pool executor over a blocking backend, at every cut position
    source = [
        Record("a", 3, 3), Record("b", 5, 5), Record("a", 1, 1), Watermark(2),
        Record("c", 8, 8), Record("a", 7, 7), Record("b", 4, 4), Watermark(6),
        Record("c", 2, 2), Record("a", 9, 9), Watermark(9), Record("b", 11, 11),
    ]  # fmt: skip
    whole_backend = RocksDBBackend(tmp_path / "whole")
    whole = uninterrupted("windows", whole_backend, config, source)
    whole_backend.close()
    for cut in range(len(source) + 1):
        first, second = RocksDBBackend(tmp_path / f"f{cut}"), RocksDBBackend(tmp_path / f"s{cut}")
        try:
            pieces = checkpointed(
                "windows", (first, second), config, source, cut, str(tmp_path / f"c{cut}")
            )
        finally:
            first.close()
            second.close()
        assert_same(whole, pieces, config)


# -- timers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [SYNC, SERIAL, PARALLEL], ids=["sync", "serial", "parallel"])
def test_event_time_timers_survive_restore_and_fire_at_the_same_watermarks(config, tmp_path):
    before = [Record("a", 10, 10), Record("b", 20, 20), Record("a", 30, 30), Watermark(5)]
    after = [Watermark(15), Record("b", 1, 1), Watermark(25), Watermark(40)]
    whole = uninterrupted("windows", MemoryBackend(), config, before + after)
    pieces = checkpointed(
        "windows", (MemoryBackend(), MemoryBackend()), config, before + after, len(before),
        str(tmp_path),
    )  # fmt: skip
    assert_same(whole, pieces, config)
    segments: list[list[Any]] = [[]]
    for output in pieces.outputs:
        if type(output) is Watermark:
            segments.append([])
        else:
            segments[-1].append(output)
    # a@10 sets 13, b@20 deletes 22 (none), a@30 sets 32; b@1 after watermark 15 sets 18
    fired = [[o for o in segment if o[0] == "fired"] for segment in segments]
    assert fired[1:4] == [
        [("fired", "a", 13.0, 1)],  # restored, fires at watermark 15
        [("fired", "b", 18.0, 1)],
        [("fired", "a", 32.0, 1)],  # restored, fires at watermark 40
    ]
    if config.watermark_order == "serial":  # parallel: b@1 may overtake watermark 15
        assert segments[2] == [("b", 1), ("fired", "b", 18.0, 1)]


@pytest.mark.parametrize("config", [SYNC, SERIAL], ids=["sync", "serial"])
def test_processing_time_timers_survive_restore(config, tmp_path):
    # ("advance", s) moves the ManualClock; the restored operator gets a clock at the
    # same reading, and the same advances follow
    before = [Record("a", 4), Record("b", 10), ("advance", 3), Record("a", 1), ("advance", 2)]
    after = [Record("c", 2), ("advance", 6), Record("b", 0), ("advance", 20), Record("a", 0)]

    def run(elements, clock, operator):
        feed(operator, elements, clock)

    clock = ManualClock(100)
    whole = KeyedProcessOperator(Reminders(), MemoryBackend(), config, clock=clock)
    run(before + after, clock, whole)
    whole.finish()
    expected = whole.drain_outputs()

    clock = ManualClock(100)
    first = KeyedProcessOperator(Reminders(), MemoryBackend(), config, clock=clock)
    run(before, clock, first)
    handle = first.snapshot(1, tmp_path)
    got = first.drain_outputs()
    first.close()
    clock = ManualClock(clock.now())
    second = KeyedProcessOperator(Reminders(), MemoryBackend(), config, clock=clock)
    second.restore(handle)
    assert len(second.timers.processing) > 0
    run(after, clock, second)
    second.finish()
    got += second.drain_outputs()
    assert got == expected
    reminders = [o for o in got if type(o) is not Watermark]
    # set before the checkpoint (clock 100), due at 104; the restored clock's 105 fires it
    assert reminders[0] == ("reminder", "a", 104, 2, 105)
    assert ("reminder", "a", 111, 2, 111) in reminders  # re-armed by the restored timer


class ArmsAtTheReading(KeyedProcessFunction):
    """A record "arm" sets a processing-time timer at the clock's current reading."""

    def open(self, ctx):
        self.last = ctx.get_state(ValueStateDescriptor("last"))

    def process_element(self, value, ctx):
        service = ctx.timer_service
        if value == "arm":
            service.register_processing_time_timer(service.current_processing_time())

        def write(old):
            ctx.output(("record", value, old))
            return self.last.async_update(value)

        return self.last.async_value().then_compose(write)

    def on_timer(self, timestamp, ctx):
        return self.last.async_value().then_apply(lambda old: ctx.output(("timer", old)))


@pytest.mark.parametrize("config", [SYNC, AecConfig()], ids=["sync", "async"])
@pytest.mark.parametrize("advance", [True, False])
def test_a_timer_due_at_the_checkpoints_own_reading_waits_for_the_next_advance(
    config, advance, tmp_path
):
    """A timer set at the current reading waits for the next clock advance (rule 8); a
    restore of that one checkpoint (same reading) neither fires it early nor fires one
    the uninterrupted run never fires (rule 9)."""

    def run(cut):
        clock = ManualClock(10.0)
        operator = KeyedProcessOperator(ArmsAtTheReading(), MemoryBackend(), config, clock=clock)
        operator.open()
        operator.process(Record("k", "arm"))
        out = []
        if cut:
            handle = operator.snapshot(1, str(tmp_path / f"{advance}"))
            out += operator.drain_outputs()
            operator.close()
            operator = KeyedProcessOperator(ArmsAtTheReading(), MemoryBackend(), config, clock=clock)
            operator.restore(handle)
        operator.process(Record("k", "second"))  # the same instant
        if advance:
            clock.advance(1.0)
            operator.process(Record("k", "third"))
        operator.finish()
        out += operator.drain_outputs()
        operator.close()
        return [o for o in out if type(o) is not Watermark]

    whole = run(False)
    assert run(True) == whole
    assert (("timer", "second") in whole) == advance


def test_snapshot_drains_in_flight_records_and_pending_timers(tmp_path):
    executor = ManualExecutor()
    operator = KeyedProcessOperator(
        Windows(), MemoryBackend(), AecConfig(buffer_size=100, watermark_order="parallel"),
        executor,
    )  # fmt: skip
    operator.open()
    for key in "abc":
        operator.process(Record(key, 1, 1))
    operator.process_watermark(Watermark(10))  # parallel: returns before the watermark left
    operator.process(Record("a", 2, 2))
    assert operator.controller.in_flight > 0 and not operator.epochs.all_closed_done()
    operator.snapshot(3, tmp_path)
    assert operator.controller.in_flight == 0 and operator.epochs.all_closed_done()
    assert not executor.held
    outputs = operator.drain_outputs()
    assert Watermark(10) in outputs
    assert sorted(o for o in outputs if type(o) is tuple and o[0] == "fired") == [
        ("fired", k, 4.0, 1) for k in "abc"
    ]
    operator.close()


# -- the files ---------------------------------------------------------------------------------
def snapshot_of_a_small_run(directory: Any, checkpoint_id: int = 1) -> CheckpointHandle:
    operator = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig())
    feed(operator, [Record("a", 1, 1), Record("b", 2, 2), Watermark(0), Record("a", 5, 5)])
    handle = operator.snapshot(checkpoint_id, directory)
    operator.close()
    return handle


def test_layout_manifest_and_metadata(tmp_path):
    handle = snapshot_of_a_small_run(tmp_path, 12)
    assert handle == CheckpointHandle(12, str(tmp_path / "chk-12"))
    assert sorted(os.listdir(tmp_path)) == ["chk-12"]  # no staging directory left
    manifest = json.loads((tmp_path / "chk-12" / "MANIFEST.json").read_text())
    assert manifest["checkpoint_id"] == 12 and manifest["format"] == ckpt.FORMAT
    assert set(manifest["files"]) == {
        "backend/memory-base.msgpack", "operator.json", "timers.msgpack",
    }  # fmt: skip
    for name, entry in manifest["files"].items():
        assert entry["size"] == os.path.getsize(tmp_path / "chk-12" / name)
        assert len(entry["sha256"]) == 64
    metadata = json.loads((tmp_path / "chk-12" / "operator.json").read_text())
    assert metadata["watermark"] == 0 and metadata["checkpoint_id"] == 12
    assert isinstance(metadata["processing_time"], float)  # the system clock's reading
    assert metadata["state_names"] == ["items", "fired"]
    assert metadata["max_parallelism"] == 128 and metadata["config"]["async_state"] is True
    assert metadata["counts"]["records_in"] == 3 and metadata["counts"]["event_timers"] == 3
    assert latest_checkpoint(tmp_path) == handle
    assert latest_checkpoint(tmp_path / "absent") is None
    fresh = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig(), clock=ManualClock())
    fresh.snapshot(13, tmp_path)  # before any input: opens the operator, snapshots nothing
    metadata = json.loads((tmp_path / "chk-13" / "operator.json").read_text())
    assert metadata["watermark"] == "-inf"  # strict JSON: infinities as strings
    assert metadata["processing_time"] == "-inf"
    assert latest_checkpoint(tmp_path).checkpoint_id == 13
    fresh.close()


def test_restore_by_path_right_after_open_and_twice_from_one_checkpoint(tmp_path):
    handle = snapshot_of_a_small_run(tmp_path)
    results = []
    for _ in range(2):  # a retried task restores the same checkpoint again
        operator = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig())
        operator.open()
        operator.restore(handle.path)  # a path works as a handle too
        feed(operator, [Record("b", 3, 3), Watermark(10)])
        operator.finish()
        results.append(operator.drain_outputs())
    assert results[0] == results[1]
    assert ("fired", "a", 9.0, 1) in results[0]  # registered before the checkpoint


def test_restore_into_the_other_execution_mode(tmp_path):
    source = [Record("a", 1, 1), Record("b", 2, 2), Watermark(1), Record("a", 5, 5)]
    reference = run_keyed(source + [Watermark(9)], Everything(), config=SYNC)
    first = KeyedProcessOperator(Everything(), MemoryBackend(), SERIAL)
    feed(first, source)
    handle = first.snapshot(1, tmp_path)
    outputs = first.drain_outputs()
    first.close()
    backend = MemoryBackend()
    second = KeyedProcessOperator(Everything(), backend, SYNC)
    second.restore(handle)
    feed(second, [Watermark(9)])
    second.finish()
    assert outputs + second.drain_outputs() == reference.outputs


# -- corruption and misuse ---------------------------------------------------------------------
def live_backend() -> MemoryBackend:
    """A backend holding state of another run, to check restore leaves it alone."""
    backend = MemoryBackend()
    run_keyed([Record("z", 1)], Counter(), backend)
    return backend


def assert_untouched(operator: KeyedProcessOperator, backend: MemoryBackend) -> None:
    assert backend.state_items("count") == {"z": 1}
    assert operator.status == "new" and len(operator.timers.event) == 0
    assert operator.watermark == float("-inf")


@pytest.mark.parametrize("name", ["backend/memory-base.msgpack", "timers.msgpack", "operator.json"])
def test_a_flipped_byte_is_detected_and_named(tmp_path, name):
    handle = snapshot_of_a_small_run(tmp_path)
    path = os.path.join(handle.path, name)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    with open(path, "wb") as out:
        out.write(data)
    backend = live_backend()
    operator = KeyedProcessOperator(Windows(), backend, AecConfig())
    with pytest.raises(ValueError, match=f"{name}.*SHA-256"):
        operator.restore(handle)
    assert_untouched(operator, backend)


def test_a_missing_manifest_is_an_incomplete_checkpoint(tmp_path):
    handle = snapshot_of_a_small_run(tmp_path)
    os.remove(os.path.join(handle.path, "MANIFEST.json"))
    backend = live_backend()
    operator = KeyedProcessOperator(Windows(), backend, AecConfig())
    with pytest.raises(ValueError, match="MANIFEST.json is missing.*incomplete"):
        operator.restore(handle)
    assert_untouched(operator, backend)
    assert latest_checkpoint(tmp_path) is None


def test_missing_truncated_and_unlisted_files_are_named(tmp_path):
    handle = snapshot_of_a_small_run(tmp_path)
    timers = os.path.join(handle.path, "timers.msgpack")
    content = open(timers, "rb").read()
    operator = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig())
    with open(timers, "wb") as out:
        out.write(content[:-1])
    with pytest.raises(ValueError, match="timers.msgpack has .* bytes"):
        operator.restore(handle)
    os.remove(timers)
    with pytest.raises(ValueError, match="timers.msgpack is missing"):
        operator.restore(handle)
    with open(timers, "wb") as out:
        out.write(content)
    with open(os.path.join(handle.path, "backend", "extra"), "wb") as out:
        out.write(b"?")
    with pytest.raises(ValueError, match="extra is not listed"):
        operator.restore(handle)
    os.remove(os.path.join(handle.path, "backend", "extra"))
    operator.restore(handle)  # intact again
    assert len(operator.timers.event) == 3


def test_restore_rejects_bad_handles_and_late_calls(tmp_path):
    handle = snapshot_of_a_small_run(tmp_path, 4)
    operator = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig())
    with pytest.raises(TypeError, match="CheckpointHandle or a checkpoint path"):
        operator.restore(4)
    with pytest.raises(FileNotFoundError):
        operator.restore(str(tmp_path / "chk-5"))
    with pytest.raises(ValueError, match="is checkpoint 4, the handle says 5"):
        operator.restore(CheckpointHandle(5, handle.path))
    other = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig(max_parallelism=64))
    with pytest.raises(ValueError, match="max_parallelism 128"):
        other.restore(handle)
    operator.restore(handle)
    with pytest.raises(RuntimeError, match="restore before processing"):
        operator.restore(handle)  # once only
    busy = KeyedProcessOperator(Windows(), MemoryBackend(), AecConfig())
    busy.process(Record("a", 1, 1))
    with pytest.raises(RuntimeError, match="restore before processing"):
        busy.restore(handle)
    rocks = KeyedProcessOperator(Windows(), RocksDBBackend(tmp_path / "db"), AecConfig())
    with pytest.raises(ValueError, match="does not restore into RocksDBBackend"):
        rocks.restore(handle)  # a memory snapshot: the backend refuses, nothing changed
    rocks.close()
    rocks.backend.close()


def test_bad_snapshot_arguments_leave_the_operator_usable(tmp_path):
    operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
    operator.process(Record("a", 1))
    for bad, error in [(-1, ValueError), ("1", TypeError), (True, TypeError), (1.0, TypeError)]:
        with pytest.raises(error, match="checkpoint_id"):
            operator.snapshot(bad, tmp_path)
    with pytest.raises(TypeError, match="directory must be a path"):
        operator.snapshot(1, None)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="a-file is a file"):
        operator.snapshot(1, a_file)
    operator.snapshot(1, tmp_path)
    with pytest.raises(FileExistsError, match="checkpoint 1 already exists"):
        operator.snapshot(1, tmp_path)
    operator.process(Record("a", 2))
    operator.snapshot(2, tmp_path)
    operator.finish()
    assert [o for o in operator.drain_outputs() if type(o) is tuple] == [("a", 1), ("a", 2)]
    assert latest_checkpoint(tmp_path).checkpoint_id == 2
    assert a_file.read_text() == "not a directory"
    with pytest.raises(RuntimeError, match="the operator is closed"):
        operator.snapshot(3, tmp_path)


# -- failures during a snapshot ----------------------------------------------------------------
class FailsOnBoom(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process_element(self, value, ctx):
        def check(_):
            if value == "boom":
                raise ZeroDivisionError("boom")

        return self.count.async_value().then_accept(check)


def test_user_code_failing_while_draining_commits_no_checkpoint(tmp_path):
    operator = KeyedProcessOperator(FailsOnBoom(), MemoryBackend(), AecConfig(buffer_size=100))
    operator.process(Record("k", "fine"))
    operator.process(Record("k", "boom"))  # buffered: it fails only when the snapshot drains
    with pytest.raises(JobFailure, match="boom") as info:
        operator.snapshot(1, tmp_path)
    assert info.value.key == "k" and info.value.record == "boom"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="operator is failed.*commits no checkpoint"):
        operator.snapshot(2, tmp_path)
    operator.close()


class BrokenSnapshots(MemoryBackend):
    """Writes part of a snapshot, then fails."""

    def snapshot(self, directory: str) -> None:
        super().snapshot(directory)
        raise OSError("disk full")


@pytest.mark.parametrize("async_state", [True, False])
def test_backend_failing_to_snapshot_commits_no_checkpoint(tmp_path, async_state):
    operator = KeyedProcessOperator(
        Counter(), BrokenSnapshots(), AecConfig(async_state=async_state)
    )
    operator.process(Record("k", 1))
    with pytest.raises(JobFailure, match="checkpoint 9.*disk full") as info:
        operator.snapshot(9, tmp_path)
    assert isinstance(info.value.__cause__, OSError)
    assert os.listdir(tmp_path) == []  # neither chk-9 nor a staging directory
    with pytest.raises(RuntimeError, match="failed"):
        operator.process(Record("k", 2))
    operator.close()


def test_a_commit_whose_last_fsync_fails_leaves_no_checkpoint(tmp_path, monkeypatch):
    # the rename is the commit, but it is durable only once its directory is synced:
    # if that fails the snapshot fails, and a failed snapshot commits nothing
    location = tmp_path / "checkpoints"
    real = os.fsync

    def fsync(fd):
        if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(location):
            raise OSError(5, "Input/output error")
        return real(fd)

    operator = KeyedProcessOperator(Counter(), MemoryBackend())
    operator.process(Record("k", 1))
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(JobFailure, match="checkpoint 1.*Input/output error"):
        operator.snapshot(1, location)
    monkeypatch.setattr(os, "fsync", real)
    assert os.listdir(location) == []  # neither chk-1 nor a staging directory
    assert latest_checkpoint(location) is None
    operator.close()


class TimerAfterEach(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> None:
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 1)

    def on_timer(self, timestamp: float, ctx: Any) -> None:
        ctx.output(("timer", timestamp))


def test_a_checkpoint_after_the_final_watermark_restores_an_ended_operator(tmp_path):
    operator = KeyedProcessOperator(TimerAfterEach(), MemoryBackend())
    operator.process(Record("k", 1, 1.0))
    operator.process_watermark(Watermark(math.inf))
    handle = operator.snapshot(1, tmp_path)
    restored = KeyedProcessOperator(TimerAfterEach(), MemoryBackend())
    restored.restore(handle)
    assert restored.status == "ended"
    with pytest.raises(ValueError, match="after Watermark\\(inf\\)"):
        restored.process(Record("k", 2, 2.0))  # refused as the original refuses it
    restored.finish()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_enum_and_named_tuple_keys_are_checkpointed_as_the_plain_values_they_equal(
    backend, tmp_path
):
    """Keys that subclass built-in types (a ``StrEnum``, a ``class C(str, Enum)``, an
    ``IntEnum``, a named tuple) key state as the values they equal: a checkpoint
    stores those (state and timers, on every backend), and the restored job finds
    the same state under the original keys; a timer restored fires for the plain key."""
    from engine_helpers import Color, Level, Pair, Shade

    from aec import KeyedProcessFunction, ValueStateDescriptor

    class CountWithTimer(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        def process_element(self, value, ctx):
            self.count.update(self.count.value() + 1)
            ctx.timer_service.register_event_time_timer(100.0)

        def on_timer(self, timestamp, ctx):
            ctx.output((ctx.current_key, self.count.value()))

    def make_backend(name: str) -> Any:
        return MemoryBackend() if backend == "memory" else RocksDBBackend(str(tmp_path / name))

    keys = [Color.RED, Shade.DARK, Level.HIGH, Pair(Color.RED, Level.HIGH)]
    first = KeyedProcessOperator(CountWithTimer(), make_backend("a"))
    first.open()
    for i, key in enumerate(keys * 2):
        first.process(Record(key, i, float(i)))
    handle = first.snapshot(1, tmp_path / "checkpoints")
    first.close()
    second = KeyedProcessOperator(CountWithTimer(), make_backend("b"))
    second.restore(handle)
    second.open()
    for key in keys:
        second.process(Record(key, "again", 50.0))
    second.finish()
    fired = {out for out in second.drain_outputs() if isinstance(out, tuple)}
    assert fired == {("red", 3), ("dark", 3), (2, 3), (("red", 2), 3)}
    assert all(type(key) in (str, int, tuple) for key, _ in fired)


def test_retain_removes_what_a_killed_snapshot_left_once_a_later_one_committed(tmp_path):
    from aec.checkpoint.storage import CheckpointStore

    operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
    for checkpoint_id in (1, 2, 3):
        operator.process(Record("k", checkpoint_id))
        operator.snapshot(checkpoint_id, tmp_path)
    operator.finish()
    # what a snapshot killed before its rename leaves (files.commit's staging directory)
    for name in (".chk-2.staging-0a1b", ".chk-4.staging-2c3d"):
        os.mkdir(tmp_path / name)
        (tmp_path / name / "timers.msgpack").write_bytes(b"x")
    assert CheckpointStore.at(tmp_path).retain(1) == [1, 2]
    # checkpoint 4 may still commit; 2 never can
    assert sorted(os.listdir(tmp_path)) == [".chk-4.staging-2c3d", "chk-3"]
    assert latest_checkpoint(tmp_path) == CheckpointHandle(3, str(tmp_path / "chk-3"))
