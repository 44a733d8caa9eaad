"""Declared processing (FLIP-455) and checkpoints that do not drain (FLIP-425's
"Faster Checkpoint Drain"): the declarations, the records a checkpoint carries,
and the crash property: snapshot at any point under any completion schedule,
throw the operator away, restore (also rescaled 2 -> 3) and replay: per key the
same outputs, watermarks and final state as an uninterrupted run."""

from __future__ import annotations

import collections
import enum
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessOperator,
    MapStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.declare import DeclarationContext, DeclaredVariable, DeclaringKeyedProcessFunction
from aec.keygroups import key_group_for, key_group_range_for, operator_index_for
from aec.testing import ScriptedExecutor, assert_equivalent, run_sync
from aec.testing.strategies import keyed_streams
from backends import MemoryBackend, RocksDBBackend, SlateDBBackend


class Counter(DeclaringKeyedProcessFunction):
    """The contract's example: read, write n + 1 (remembering it), emit."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def declare_process(self, d: DeclarationContext):
        seen = d.declare_variable("seen", default=0)

        def read(value, ctx):
            return self.count.async_value()

        def write(n, ctx):
            seen.set(n + 1)
            return self.count.async_update(n + 1)

        def emit(_, ctx):
            ctx.output((ctx.current_key, seen.get()))

        return d.chain(d.declare("read", read), d.declare("write", write), d.declare("emit", emit))


class Dedup(DeclaringKeyedProcessFunction):
    """A conditional step: values seen before are counted as repeats, new ones
    stored; every record emits what it found. A timer per record fires declared."""

    def open(self, ctx):
        self.seen = ctx.get_state(MapStateDescriptor("seen"))
        self.repeats = ctx.get_state(ValueStateDescriptor("repeats", default=0))

    def declare_process(self, d: DeclarationContext):
        value_of: DeclaredVariable = d.declare_variable("value")

        def look(value, ctx):
            value_of.set(value)
            if ctx.timestamp is not None:
                ctx.timer_service.register_event_time_timer(ctx.timestamp + 5)
            return self.seen.async_contains(value)

        def store(_, ctx):
            return self.seen.async_put(value_of.get(), ctx.timestamp)

        def told_new(_, ctx):
            ctx.output((ctx.current_key, "new", value_of.get()))

        def read_repeats(_, ctx):
            return self.repeats.async_value()

        def count_repeat(n, ctx):
            ctx.output((ctx.current_key, "repeat", value_of.get(), n + 1))
            return self.repeats.async_update(n + 1)

        new = d.chain(d.declare("store", store), d.declare("told-new", told_new))
        repeat = d.chain(d.declare("read-repeats", read_repeats), d.declare("count", count_repeat))
        return d.chain(
            d.declare("look", look),
            d.branch("known?", lambda found, ctx: found, repeat, new),
        )

    def declare_on_timer(self, d: DeclarationContext):
        def read(timestamp, ctx):
            return self.repeats.async_value()

        def emit(n, ctx):
            ctx.output((ctx.current_key, "timer", ctx.timestamp, n))

        return d.chain(d.declare("timer-read", read), d.declare("timer-emit", emit))


class DerivedWait(Counter):
    """Waits for a future a callback derives: its checkpoints drain."""

    def declare_process(self, d: DeclarationContext):
        def read(value, ctx):
            return self.count.async_value().then_apply(lambda n: n + 1)

        def write(n, ctx):
            ctx.output((ctx.current_key, n))
            return self.count.async_update(n)

        return d.chain(d.declare("read", read), d.declare("write", write))


FUNCTIONS = {"counter": Counter, "dedup": Dedup, "derived": DerivedWait}


# -- declarations ---------------------------------------------------------------------------------
class Twice(Counter):
    def declare_process(self, d):
        d.declare("read", lambda v, ctx: None)
        return d.chain(d.declare("read", lambda v, ctx: None))


class TwiceAcrossTimer(Counter):
    def declare_on_timer(self, d):
        return d.chain(d.declare("write", lambda t, ctx: None))


class VariableNamedLikeAStep(Counter):
    def declare_process(self, d):
        d.declare_variable("emit")
        return super().declare_process(d)


class VariableTwiceAcrossTimer(Counter):
    def declare_process(self, d):
        d.declare_variable("tmp")
        return super().declare_process(d)

    def declare_on_timer(self, d):
        d.declare_variable("tmp")
        return d.chain(d.declare("fire", lambda timestamp, ctx: None))


class PlacedTwice(Counter):
    def declare_process(self, d):
        step = d.declare("only", lambda v, ctx: None)
        return d.chain(step, step)


@pytest.mark.parametrize(
    "function, name",
    [(Twice, "read"), (TwiceAcrossTimer, "write"), (VariableTwiceAcrossTimer, "tmp"),
     (PlacedTwice, "only")],
)  # fmt: skip
def test_a_name_declared_twice_fails_open_with_the_name_unwrapped(function, name):
    operator = KeyedProcessOperator(function(), MemoryBackend())
    with pytest.raises(ValueError, match=repr(name)) as raised:
        operator.open()
    assert not isinstance(raised.value, JobFailure)
    assert operator.status == "failed"


def test_a_variable_may_share_a_steps_name():
    """Steps (and branches) and variables are named apart, as Flink's
    ``DeclarationManager`` keeps its callbacks and its variables."""
    result = run_keyed([Record("k", 1), Record("k", 2)], VariableNamedLikeAStep())
    assert [o for o in result.outputs if not isinstance(o, Watermark)] == run_keyed(
        [Record("k", 1), Record("k", 2)], Counter()
    ).outputs[:-1]


def test_declared_processing_gives_the_synchronous_answer():
    source = [Record(k, i, timestamp=i) for i, k in enumerate("aabacabbbcaaab")]
    source.insert(6, Watermark(4))
    for function in FUNCTIONS.values():
        assert_equivalent(function, source, seeds=range(6))


def test_process_element_is_not_the_entry_of_a_declaring_function():
    with pytest.raises(TypeError, match="declare_process"):
        Counter().process_element(1, None)


# -- checkpoints that do not drain ---------------------------------------------------------------
def test_a_hot_keys_blocked_records_stay_pending_across_the_snapshot(tmp_path):
    """Fails if the snapshot drains: with batches held by a scripted executor, the
    hot key's records are still in flight when snapshot returns."""
    executor = ScriptedExecutor(seed=3)
    operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig(), executor)
    operator.open()
    for i in range(50):
        operator.process(Record("hot", i))
    operator.process(Record("cold", 0))
    in_flight = operator.controller.in_flight
    handle = operator.snapshot(1, tmp_path)
    assert operator.controller.in_flight == in_flight > 1  # nothing was drained
    assert operator.metrics["checkpoint_pending_records"] == in_flight
    assert operator.metrics["checkpoint_pause_s"] >= 0
    before = [o for o in operator.drain_outputs() if o[0] == "hot"]
    assert len(before) < 50
    operator.finish()
    assert operator.drain_outputs()[-2] == ("hot", 50)

    restored = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
    restored.restore(handle)
    restored.finish()
    after = [o for o in restored.drain_outputs() if type(o) is tuple and o[0] == "hot"]
    assert before + after == [("hot", n) for n in range(1, 51)]


class FailsOnRestore(Counter):
    """``Counter``'s steps, its write failing."""

    def declare_process(self, d: DeclarationContext):
        seen = d.declare_variable("seen", default=0)

        def write(n, ctx):
            raise ValueError(f"user error at {n}")

        return d.chain(
            d.declare("read", lambda value, ctx: self.count.async_value()),
            d.declare("write", write),
            d.declare("emit", lambda _, ctx: ctx.output(seen.get())),
        )


def test_carried_records_restored_into_a_synchronous_operator_run_after_restore(tmp_path):
    """A synchronous operator restoring records a checkpoint carried runs them with the
    next input, as an asynchronous one does (not inside ``restore``), and a failure of
    theirs fails the job naming the record."""
    operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig(), ScriptedExecutor(seed=3))
    operator.open()
    for i in range(10):
        operator.process(Record("hot", i))
    handle = operator.snapshot(1, tmp_path)
    carried = operator.metrics["checkpoint_pending_records"]
    operator.close()
    assert carried > 1

    restored = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig(async_state=False))
    restored.restore(handle)
    assert restored.drain_outputs() == []
    restored.finish()
    tail = [o for o in restored.drain_outputs() if type(o) is tuple]
    assert tail == [("hot", n) for n in range(11 - carried, 11)]
    assert restored.metrics["max_in_flight"] == carried

    failing = KeyedProcessOperator(FailsOnRestore(), MemoryBackend(), AecConfig(async_state=False))
    failing.restore(handle)
    with pytest.raises(JobFailure, match="key 'hot'"):
        failing.finish()
    assert failing.status == "failed"


class SeesTheWatermark(Counter):
    def declare_process(self, d: DeclarationContext):
        def read(value, ctx):
            return self.count.async_value()

        def emit(n, ctx):
            ctx.output((ctx.current_key, ctx.timer_service.current_watermark()))
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("emit", emit))


def test_a_carried_record_sees_its_integer_watermark_exactly(tmp_path):
    """Nanosecond watermarks (ints above 2**53) stored with a carried record come back
    as stored, not rounded through float."""
    mark = 1_700_000_000_000_000_201
    operator = KeyedProcessOperator(
        SeesTheWatermark(), MemoryBackend(), AecConfig(), ScriptedExecutor(seed=1)
    )
    operator.open()
    operator.process_watermark(Watermark(mark))
    for i in range(20):
        operator.process(Record("hot", i, mark + 1))
    handle = operator.snapshot(1, tmp_path)
    assert operator.metrics["checkpoint_pending_records"] > 0
    operator.close()
    restored = KeyedProcessOperator(SeesTheWatermark(), MemoryBackend(), AecConfig())
    restored.restore(handle)
    restored.finish()
    seen = {o[1] for o in restored.drain_outputs() if type(o) is tuple}
    assert seen == {mark}


def test_a_checkpoint_of_derived_waits_drains_and_stays_exact(tmp_path):
    operator = KeyedProcessOperator(
        DerivedWait(), MemoryBackend(), AecConfig(), ScriptedExecutor(seed=1)
    )
    operator.open()
    for i in range(10):
        operator.process(Record("k", i))
    handle = operator.snapshot(1, tmp_path)
    assert operator.controller.in_flight == 0
    assert operator.metrics["checkpoint_pending_records"] == 0
    restored = KeyedProcessOperator(DerivedWait(), MemoryBackend(), AecConfig())
    restored.restore(handle)
    restored.process(Record("k", 10))
    restored.finish()
    assert restored.drain_outputs()[:-1] == [("k", 11)]


class Unpicklable(Counter):
    def declare_process(self, d):
        lock = d.declare_variable("lock")

        def read(value, ctx):
            import threading

            lock.set(threading.Lock())
            return self.count.async_value()

        def write(n, ctx):
            return self.count.async_update(n + 1)

        def done(_, ctx):
            lock.set(None)

        return d.chain(d.declare("read", read), d.declare("write", write), d.declare("done", done))


class Buffers(Counter):
    """A declared variable msgpack would give back changed (a bytearray as bytes)."""

    def declare_process(self, d):
        buffer = d.declare_variable("buffer")

        def read(value, ctx):
            buffer.set(bytearray(b"x"))
            return self.count.async_value()

        def write(n, ctx):
            buffer.get().extend(b"y")  # a bytes would fail here after a restore
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("write", write))


@pytest.mark.parametrize(
    "function, message",
    [(Unpicklable, "declared variable 'lock'"),
     (Buffers, "declared variable 'buffer'.*bytearray back as bytes")],
)  # fmt: skip
def test_a_declared_variable_it_cannot_store_as_it_is_fails_the_snapshot_naming_it(
    function, message, tmp_path
):
    operator = KeyedProcessOperator(function(), MemoryBackend(), AecConfig(), ScriptedExecutor(0))
    operator.open()
    for i in range(5):
        operator.process(Record("k", i))
    with pytest.raises(ValueError, match=message):
        operator.snapshot(1, tmp_path)
    assert not (tmp_path / "chk-1").exists()
    operator.finish()  # it goes on as if no snapshot had been asked
    assert operator.backend.state_items("count") == {"k": 5}


class Renamed(Counter):
    def declare_process(self, d):
        def read(value, ctx):
            return self.count.async_value()

        def write(n, ctx):
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("store", write))


def test_a_checkpoint_naming_an_undeclared_step_is_refused_before_state_changes(tmp_path):
    operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig(), ScriptedExecutor(0))
    operator.open()
    for i in range(20):
        operator.process(Record("k", i))
    handle = operator.snapshot(1, tmp_path)
    assert operator.metrics["checkpoint_pending_records"] > 0
    backend = MemoryBackend()
    restored = KeyedProcessOperator(Renamed(), backend, AecConfig())
    with pytest.raises(ValueError, match="'write'"):
        restored.restore(handle)
    assert backend.state_items("count") == {}


# -- the crash property ----------------------------------------------------------------------
BACKENDS = {
    "memory": lambda directory, name: MemoryBackend(),
    "rocksdb": lambda directory, name: RocksDBBackend(os.path.join(directory, name)),
    "slatedb": lambda directory, name: SlateDBBackend(f"file://{directory}/slate", name),
}


def _route(operators, elements, mp):
    for element in elements:
        if type(element) is Watermark:
            for operator in operators:
                operator.process_watermark(element)
        else:
            operators[operator_index_for(key_group_for(element.key, mp), mp, len(operators))].process(
                element
            )


def _collect(operator, per_key, segment):
    for kind, context, value in operator.trace:
        if kind == "watermark":
            segment += 1
        elif kind == "out":
            per_key.setdefault(context.key, []).append((segment, value))
    operator.trace = []
    operator.drain_outputs()


def _state(backends, names):
    state: dict[str, dict[Any, Any]] = {name: {} for name in names}
    for backend in backends:
        for name in names:
            state[name].update(backend.state_items(name))
    return state


def check_crash(data, source, backend_kind):
    name = data.draw(st.sampled_from(sorted(FUNCTIONS)), label="function")
    p, q = data.draw(st.sampled_from([(1, 1), (2, 3), (2, 1)]), label="parallelism")
    config = AecConfig(
        buffer_size=data.draw(st.integers(1, 8), label="buffer_size"),
        in_flight_records_limit=data.draw(st.integers(1, 30), label="in_flight"),
        max_parallelism=16,
    )
    cut = data.draw(st.integers(0, len(source)), label="cut")
    make = BACKENDS[backend_kind]
    made = []
    with tempfile.TemporaryDirectory() as directory:

        def backend(tag):
            made.append(make(directory, tag))
            return made[-1]

        try:
            whole = KeyedProcessOperator(FUNCTIONS[name](), backend("whole"), config)
            whole.trace = []
            whole.open()
            _route([whole], source, 16)
            whole.finish()
            expected: dict[Any, list] = {}
            _collect(whole, expected, 0)
            expected_state = _state([whole.backend], whole.state_names)

            got: dict[Any, list] = {}
            first = [
                KeyedProcessOperator(
                    FUNCTIONS[name](), backend(f"p{i}"), config,
                    ScriptedExecutor(data=data), key_group_range=key_group_range_for(16, p, i),
                )
                for i in range(p)
            ]  # fmt: skip
            for operator in first:
                operator.trace = []
                operator.open()
            _route(first, source[:cut], 16)
            handles = [op.snapshot(7, os.path.join(directory, f"c{i}")) for i, op in enumerate(first)]
            for operator in first:
                _collect(operator, got, 0)
                operator.close()
            done = sum(type(e) is Watermark for e in source[:cut])
            second = [
                KeyedProcessOperator(
                    FUNCTIONS[name](), backend(f"q{i}"), config,
                    ScriptedExecutor(data=data), key_group_range=key_group_range_for(16, q, i),
                )
                for i in range(q)
            ]  # fmt: skip
            for operator in second:
                operator.trace = []
                operator.restore(handles)
            _route(second, source[cut:], 16)
            for operator in second:
                operator.finish()
                _collect(operator, got, done)
            got_state = _state([op.backend for op in second], whole.state_names)
        finally:
            for each in made:
                each.close()
    assert got == expected
    assert got_state == expected_state


SKEWED = ("hot", "hot", "hot", "a", "b")


@given(source=keyed_streams(keys=SKEWED, max_size=40), data=st.data())
def test_crash_restore_and_replay_equals_an_uninterrupted_run_memory(source, data):
    check_crash(data, source, "memory")


@given(source=keyed_streams(keys=SKEWED, max_size=25), data=st.data())
def test_crash_restore_and_replay_equals_an_uninterrupted_run_rocksdb(source, data):
    check_crash(data, source, "rocksdb")


@settings(max_examples=10)  # each example opens several SlateDB databases
@given(source=keyed_streams(keys=SKEWED, max_size=20), data=st.data())
def test_crash_restore_and_replay_equals_an_uninterrupted_run_slatedb(source, data):
    check_crash(data, source, "slatedb")


def test_run_sync_and_run_keyed_agree_on_the_contract_example():
    source = [Record("a", 1), Record("b", 1), Record("a", 2)]
    assert run_keyed(source, Counter()).outputs == run_sync(source, Counter()).outputs


class Opaque:
    """A record value the safe serializer cannot store."""

    def __init__(self, n):
        self.n = n


def test_records_the_serializer_cannot_store_make_the_checkpoint_drain(tmp_path):
    operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig(), ScriptedExecutor(2))
    operator.open()
    for i in range(30):
        operator.process(Record("k", Opaque(i)))
    handle = operator.snapshot(1, tmp_path)
    assert operator.controller.in_flight == 0  # drained instead of failing
    assert operator.metrics["checkpoint_pending_records"] == 0
    restored = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
    restored.restore(handle)
    restored.process(Record("k", Opaque(30)))
    restored.finish()
    assert restored.drain_outputs()[:-1] == [("k", 31)]


Point = collections.namedtuple("Point", "x y")


class Color(enum.StrEnum):
    RED = "red"


@pytest.mark.parametrize(
    "key, value", [("k", Point(1, 2)), ("k", bytearray(b"v")), (Color.RED, 1)]
)  # fmt: skip
def test_keys_and_values_msgpack_would_change_make_the_checkpoint_drain(key, value, tmp_path):
    # a named tuple would come back a tuple, a bytearray bytes, an enum key not at all:
    # carried, the restored run would differ from (or fail unlike) an uninterrupted one
    operator = KeyedProcessOperator(Counter(), RocksDBBackend(str(tmp_path / "db")),
                                    AecConfig(), ScriptedExecutor(2))  # fmt: skip
    operator.open()
    for _ in range(20):
        operator.process(Record(key, value))
    handle = operator.snapshot(1, tmp_path / "chk")
    assert operator.controller.in_flight == 0  # drained instead of carrying them
    assert operator.metrics["checkpoint_pending_records"] == 0
    assert handle is not None
    operator.close()


class PointWriter(DeclaringKeyedProcessFunction):
    """Writes a named tuple into a state that opted in to pickle."""

    def open(self, ctx):
        self.point = ctx.get_state(ValueStateDescriptor("point", serializer="pickle"))

    def declare_process(self, d):
        def read(value, ctx):
            return self.point.async_value()

        def write(old, ctx):
            ctx.output((ctx.current_key, type(old).__name__, None if old is None else old.x))
            return self.point.async_update(Point(0 if old is None else old.x + 1, 0))

        return d.chain(d.declare("read", read), d.declare("write", write))


def test_a_carried_write_keeps_what_its_state_stores(tmp_path):
    # the pending write of a pickle state travels by that state's serializer: its named
    # tuple is restored as one (by the job's msgpack it became a plain tuple)
    operator = KeyedProcessOperator(PointWriter(), MemoryBackend(), AecConfig(),
                                    ScriptedExecutor(1))  # fmt: skip
    operator.open()
    for i in range(6):
        operator.process(Record("k", i))
    handle = operator.snapshot(1, tmp_path)
    assert operator.metrics["checkpoint_pending_records"] > 0
    before = [o for o in operator.drain_outputs() if type(o) is tuple]
    restored = KeyedProcessOperator(PointWriter(), MemoryBackend(), AecConfig())
    restored.restore(handle)
    restored.finish()
    after = [o for o in restored.drain_outputs() if type(o) is tuple]
    assert before + after == [("k", "NoneType", None)] + [("k", "Point", n) for n in range(5)]
    assert type(restored.backend.state_items("point")["k"]) is Point


class CollectsIntoADefault(DeclaringKeyedProcessFunction):
    """A declared variable whose default is mutable (a list), changed in place."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def declare_process(self, d: DeclarationContext) -> Any:
        seen = d.declare_variable("seen", default=[])

        def read(value: Any, ctx: Any) -> Any:
            seen.get().append(value)
            return self.count.async_value()

        def emit(n: int, ctx: Any) -> Any:
            ctx.output((ctx.current_key, list(seen.get())))
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("emit", emit))


def test_each_record_starts_from_its_own_copy_of_a_mutable_default():
    source = [Record("a", 1), Record("b", 2), Record("a", 3)]
    outputs = [o for o in run_sync(source, CollectsIntoADefault()).outputs if isinstance(o, tuple)]
    assert outputs == [("a", [1]), ("b", [2]), ("a", [3])]
    assert_equivalent(CollectsIntoADefault, source, seeds=range(3))


class AsyncDefStep(DeclaringKeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def declare_process(self, d: DeclarationContext) -> Any:
        async def read(value: Any, ctx: Any) -> int:
            return await self.count.async_value()

        return d.chain(d.declare("read", read), d.declare("emit", lambda n, ctx: ctx.output(n)))


class FutureCondition(DeclaringKeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def declare_process(self, d: DeclarationContext) -> Any:
        positive = d.chain(d.declare("pos", lambda v, ctx: ctx.output(("pos", v))))
        negative = d.chain(d.declare("neg", lambda v, ctx: ctx.output(("neg", v))))

        def condition(value: Any, ctx: Any) -> Any:
            return self.count.async_value().then_apply(lambda n: n > 0)

        return d.chain(
            d.declare("start", lambda v, ctx: v), d.branch("positive?", condition, positive, negative)
        )


@pytest.mark.parametrize("async_state", [True, False], ids=["async", "sync"])
def test_an_async_def_step_and_a_future_condition_are_refused_naming_them(async_state):
    config = AecConfig(async_state=async_state)
    with pytest.raises(JobFailure, match="declared step 'read' returned a coroutine"):
        run_keyed([Record("a", 1)], AsyncDefStep(), config=config)
    with pytest.raises(JobFailure, match="branch 'positive\\?' returned .*not a plain bool"):
        run_keyed([Record("a", 1)], FutureCondition(), config=config)


@pytest.mark.parametrize("before, after", [("msgpack", "pickle"), ("pickle", "msgpack")])
def test_a_serializer_change_under_carried_records_is_refused_naming_the_state(
    before, after, tmp_path
):
    operator = KeyedProcessOperator(
        Counter(), MemoryBackend(), AecConfig(state_serializer=before), ScriptedExecutor(seed=1)
    )
    operator.open()
    for i in range(10):
        operator.process(Record("k", i))
    handle = operator.snapshot(1, tmp_path)
    assert operator.metrics["checkpoint_pending_records"] > 0  # records are carried
    operator.close()
    restored = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig(state_serializer=after))
    with pytest.raises(ValueError, match="state 'count' was a value state stored with"):
        restored.restore(handle)


def test_carried_records_of_the_first_format_still_read():
    # aec-in-flight/2 stores a request payload by its state's serializer (here pickle),
    # /1 stored it by the job's (msgpack): each is read by its own
    from aec.keygroups import KeyGroupRange
    from aec.runtime import in_flight
    from aec.state.serialization import PICKLE, SAFE, StateSerializers

    states = StateSerializers()
    states.register("count", PICKLE)
    record = in_flight.CarriedRecord(
        "k", 3, 7, 1.0, 4, 0.0, 0.0, True, "write", {"seen": 2},
        [in_flight.StoredRequest(1, "count", None, Point(5, 6), "")], 0,
    )  # fmt: skip
    blob = in_flight.encode([record], SAFE, states)
    data = SAFE.loads(blob)
    assert data["format"] == "aec-in-flight/2"
    assert data["records"][0][10][0][3] == PICKLE.dumps(Point(5, 6))
    first = [row[:10] + [[[1, "count", SAFE.dumps(None), SAFE.dumps(5), ""]]] + row[11:]
             for row in data["records"]]  # fmt: skip
    old = SAFE.dumps({"format": "aec-in-flight/1", "records": first})
    [now] = in_flight.decode([blob], "chk-1", KeyGroupRange(0, 127), SAFE, states)
    [then] = in_flight.decode([old], "chk-1", KeyGroupRange(0, 127), SAFE, states)
    assert now == record and type(now.requests[0].value) is Point
    assert then.requests[0].value == 5 and then.variables == {"seen": 2}
