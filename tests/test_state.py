"""State handles, futures and small pieces: each state type, async and blocking forms."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aec import (
    AecConfig,
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ReducingStateDescriptor,
    ValueStateDescriptor,
    Watermark,
    combine_all,
    completed_future,
    run_keyed,
)
from aec.keygroups import key_group_for
from backends import MemoryBackend, RocksDBBackend

MODES = [
    pytest.param(AecConfig(async_state=False), id="sync"),
    pytest.param(AecConfig(buffer_size=3, in_flight_records_limit=4), id="async"),
]


def run(function, rows, config, backend=None):
    backend = backend or MemoryBackend()
    result = run_keyed([Record(k, v) for k, v in rows], function, backend, config)
    return [o for o in result.outputs if not isinstance(o, Watermark)], backend


class Sum(AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        return [acc[0] + value, acc[1] + 1]

    def get_result(self, acc):
        return acc[0] / acc[1]

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


class Blocking(KeyedProcessFunction):
    """Only the blocking forms (value(), update(), get(), ...)."""

    def open(self, ctx):
        self.value = ctx.get_state(ValueStateDescriptor("value", default=0))
        self.list = ctx.get_state(ListStateDescriptor("list"))
        self.map = ctx.get_state(MapStateDescriptor("map"))
        self.reducing = ctx.get_state(ReducingStateDescriptor("reducing", max))
        self.aggregating = ctx.get_state(AggregatingStateDescriptor("aggregating", Sum()))

    def process_element(self, value, ctx):
        count = self.value.value() + 1
        self.value.update(count)
        self.list.add(value)
        if count == 2:
            self.list.add_all([100, 101])
        if count == 3:
            self.list.update([value])
        self.map.put(value % 3, value)
        self.map.put_all({"n": count})
        if count == 4:
            self.map.remove(0)
        self.reducing.add(value)
        self.aggregating.add(value)
        ctx.output(
            (
                ctx.current_key,
                count,
                list(self.list.get()),
                self.map.contains(1),
                self.map.is_empty(),
                sorted(map(str, self.map.keys())),
                self.map.get("n"),
                self.reducing.get(),
                self.aggregating.get(),
            )
        )
        if count == 5:
            self.list.clear()
            self.map.clear()
            self.value.clear()


@pytest.mark.parametrize("config", MODES)
def test_blocking_forms_in_both_modes(config):
    rows = [("a", v) for v in (4, 1, 7, 3, 9)] + [("b", 2)]
    outputs, backend = run(Blocking(), rows, config)
    a = [o for o in outputs if o[0] == "a"]
    assert a[0] == ("a", 1, [4], True, False, ["1", "n"], 1, 4, 4.0)
    assert a[1][2] == [4, 1, 100, 101]
    assert a[2][2] == [7]
    assert a[3][5] == ["1", "n"]  # key 0 removed at count 4
    assert a[4][7] == 9 and a[4][8] == pytest.approx(24 / 5)
    assert [o for o in outputs if o[0] == "b"] == [
        ("b", 1, [2], False, False, ["2", "n"], 1, 2, 2.0)
    ]
    assert "a" not in backend.state_items("list") and "a" not in backend.state_items("map")
    assert backend.state_items("value") == {"b": 1}


class Chains(KeyedProcessFunction):
    """The future combinators on real state futures."""

    def open(self, ctx):
        self.list = ctx.get_state(ListStateDescriptor("list"))
        self.map = ctx.get_state(MapStateDescriptor("map"))
        self.value = ctx.get_state(ValueStateDescriptor("value"))

    def process_element(self, value, ctx):
        out = ctx.output
        adds = [self.list.async_add(value), self.map.async_put(value, value * 10)]
        return (
            combine_all(adds)
            .then_compose(lambda _: self.list.async_get())
            .then_compose(lambda it: it.on_next(lambda v: self.map.async_get(v)))
            .then_combine(self.value.async_value(), lambda looked_up, old: (looked_up, old))
            .then_conditionally_apply(
                lambda pair: pair[1] is None, lambda pair: "first", lambda pair: "again"
            )
            .then_conditionally_compose(
                lambda flagged: flagged[0],
                lambda flagged: self.value.async_update(value).then_apply(lambda _: flagged[1]),
            )
            .then_accept(lambda result: out((ctx.current_key, result)))
            .then_compose(lambda _: self.map.async_entries())
            .then_conditionally_accept(
                lambda it: not it.is_empty(), lambda it: out((ctx.current_key, sorted(it)))
            )
        )


@pytest.mark.parametrize("config", MODES)
def test_future_combinators(config):
    outputs, _ = run(Chains(), [("k", 1), ("k", 2)], config)
    assert outputs == [
        ("k", (True, "first")),
        ("k", [(1, 10)]),
        ("k", (False, None)),
        ("k", [(1, 10), (2, 20)]),
    ]


def test_completed_future_and_combine_all_of_completed():
    f = completed_future(3)
    assert f.is_done() and f.get() == 3
    assert f.then_apply(lambda x: x + 1).get() == 4
    assert combine_all([completed_future(1), completed_future(2)]).get() == [1, 2]
    with pytest.raises(TypeError, match="StateFutures"):
        combine_all([1])


def test_state_is_scoped_to_the_current_key():
    class PerKey(KeyedProcessFunction):
        def open(self, ctx):
            self.total = ctx.get_state(ReducingStateDescriptor("total", lambda a, b: a + b))

        async def process_element(self, value, ctx):
            await self.total.async_add(value)
            ctx.output((ctx.current_key, await self.total.async_get()))

    rows = [("a", 1), ("b", 10), ("a", 2), ("b", 20), ("c", 5)]
    outputs, backend = run(PerKey(), rows, AecConfig(buffer_size=2))
    assert sorted(outputs) == [("a", 1), ("a", 3), ("b", 10), ("b", 30), ("c", 5)]
    assert backend.state_items("total") == {"a": 3, "b": 30, "c": 5}


def test_state_name_reused_by_another_descriptor_is_rejected():
    class Clash(KeyedProcessFunction):
        def open(self, ctx):
            ctx.get_state(ValueStateDescriptor("x"))
            ctx.get_state(ListStateDescriptor("x"))

        def process_element(self, value, ctx):
            pass

    from aec import JobFailure

    with pytest.raises(JobFailure, match="already used"):
        run_keyed([Record("k", 1)], Clash())


def test_state_access_outside_a_record_is_an_error():
    class Eager(KeyedProcessFunction):
        def open(self, ctx):
            ctx.get_state(ValueStateDescriptor("v")).async_value()

        def process_element(self, value, ctx):
            pass

    from aec import JobFailure

    with pytest.raises(JobFailure, match="outside process_element"):
        run_keyed([Record("k", 1)], Eager())


def test_key_groups_are_stable_across_processes():
    keys = ["JFK-LAX", 42, 7.5, ("a", 1), b"raw"]
    here = [key_group_for(k, 128) for k in keys]
    code = (
        f"from aec.keygroups import key_group_for;print([key_group_for(k, 128) for k in {keys!r}])"
    )
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == str(here)
    assert all(0 <= g < 128 for g in here)
    assert key_group_for(1, 128) == key_group_for(1.0, 128)  # equal keys, same group


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"in_flight_records_limit": 0}, ValueError),
        ({"buffer_size": "10"}, TypeError),
        ({"buffer_timeout": 0}, ValueError),
        ({"watermark_order": "sideways"}, ValueError),
        ({"max_parallelism": 40000}, ValueError),
        ({"async_state": 1}, TypeError),
    ],
)
def test_config_validation_names_the_option(kwargs, error):
    option = next(iter(kwargs))
    with pytest.raises(error, match=option):
        AecConfig(**kwargs)


def test_bad_ttl_is_refused_clearly():
    with pytest.raises(ValueError, match="ttl"):
        ValueStateDescriptor("v", ttl=0)
    with pytest.raises(ValueError, match="ttl"):
        ListStateDescriptor("v", ttl="1h")


class BigCollections(KeyedProcessFunction):
    """Fills a list and a map past one chunk, then iterates both ways."""

    def __init__(self, size):
        self.size = size

    def open(self, ctx):
        self.list = ctx.get_state(ListStateDescriptor("list"))
        self.map = ctx.get_state(MapStateDescriptor("map"))

    async def process_element(self, value, ctx):
        await self.list.async_add_all(range(self.size))
        await self.map.async_put_all({i: i * i for i in range(self.size)})
        doubled = await (await self.list.async_get()).on_next(lambda v: v * 2)
        looked_up = await (await self.map.async_keys()).on_next(lambda k: self.map.async_get(k))
        ctx.output(
            (
                len(doubled),
                sum(doubled),
                sorted(looked_up) == sorted(i * i for i in range(self.size)),
            )
        )
        ctx.output(
            sum(1 for _ in self.list.get())
        )  # plain iteration loads chunks with blocking calls
        ctx.output(sorted(self.map.values())[-1])


@pytest.mark.parametrize("config", MODES)
@pytest.mark.parametrize("backend_name", ["memory", "rocksdb"])
def test_iterators_load_big_collections_in_chunks(config, backend_name, tmp_path):
    from aec.state import ITERATOR_CHUNK
    from backends import RocksDBBackend

    size = ITERATOR_CHUNK * 2 + 500
    backend = MemoryBackend() if backend_name == "memory" else RocksDBBackend(str(tmp_path / "db"))
    result = run_keyed([Record("k", 0)], BigCollections(size), backend, config)
    assert result.outputs[:3] == [(size, size * (size - 1), True), size, (size - 1) ** 2]
    # 2 writes + 3 list chunks + 3 key chunks + size map gets + 3 + 3 blocking chunk loads
    assert result.metrics["requests"] == 2 + 3 + 3 + size + 3 + 3
    backend.close()


class Unawaited(KeyedProcessFunction):
    """Read-modify-writes followed at once, without waiting, by more requests on
    the same state: program order must hold (found by the generated programs)."""

    def open(self, ctx):
        self.total = ctx.get_state(ReducingStateDescriptor("total", lambda a, b: a + b))
        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", Sum()))
        self.value = ctx.get_state(ValueStateDescriptor("value", ttl=5))

    def process_element(self, value, ctx):
        return combine_all(
            [
                self.total.async_add(value),
                self.total.async_add(1),
                self.total.async_get(),  # sees both adds
                self.mean.async_add(value),
                self.mean.async_get(),
                self.value.async_value(),  # a TTL read ...
                self.value.async_update(value),  # ... then a write of the same state
            ]
        ).then_accept(
            lambda results: ctx.output((ctx.current_key, results[2], results[4], results[5]))
        )


@pytest.mark.parametrize("config", MODES + [pytest.param(AecConfig(buffer_size=1), id="async-b1")])
def test_unawaited_requests_after_a_read_modify_write_keep_program_order(config):
    from aec.clock import ScriptedClock

    rows = [("a", 1), ("a", 2), ("b", 5), ("a", 3)]
    clock = ScriptedClock([0, 0, 10, 0])  # the third record finds the TTL value expired
    result = run_keyed(
        [Record(k, v) for k, v in rows], Unawaited(), MemoryBackend(), config, clock=clock
    )
    outputs = [o for o in result.outputs if not isinstance(o, Watermark)]
    assert [o for o in outputs if o[0] == "a"] == [
        ("a", 2, 1.0, None),
        ("a", 5, 1.5, 1),
        ("a", 9, 2.0, None),
    ]
    assert [o for o in outputs if o[0] == "b"] == [("b", 6, 5.0, None)]


class _Scanner(KeyedProcessFunction):
    def open(self, ctx):
        self.map = ctx.get_state(MapStateDescriptor("m"))

    def process_element(self, value, ctx):
        self.map.async_put(value, value)
        return self.map.async_entries().then_compose(lambda it: it.on_next(len))


@pytest.mark.parametrize("config", MODES)
def test_iterating_state_leaves_no_reference_cycles(config):
    """``on_next`` must not leave garbage only the cyclic GC frees (it made four
    collections per run of the window benchmark's sliding panes)."""
    import gc

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # the unreachable stay in gc.garbage, to be told apart
    try:
        run(_Scanner(), [("k", i) for i in range(200)], config)
        gc.collect()
        # the engine's: a thread an earlier test left winding down may add its own
        # garbage while this one runs
        unreachable = [o for o in gc.garbage if type(o).__module__.startswith("aec")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert len(unreachable) < 50, unreachable[:10]


class AppendsToItsDefault(KeyedProcessFunction):
    """Reads a list state whose default is ``[]``, appends in place, writes it back."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=[]))

    def process_element(self, value, ctx):
        seen = self.seen.value()
        seen.append(value)
        self.seen.update(seen)
        ctx.output((ctx.current_key, list(seen)))


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("async_state", [True, False], ids=["async", "sync"])
def test_each_key_starts_from_its_own_copy_of_a_mutable_default(backend, async_state, tmp_path):
    store = MemoryBackend() if backend == "memory" else RocksDBBackend(str(tmp_path / "db"))
    result = run_keyed(
        [Record("a", 1), Record("b", 2), Record("c", 3), Record("a", 4)], AppendsToItsDefault(),
        store, AecConfig(async_state=async_state),
    )  # fmt: skip
    assert [o for o in result.outputs if isinstance(o, tuple)] == [
        ("a", [1]), ("b", [2]), ("c", [3]), ("a", [1, 4])
    ]  # fmt: skip


@pytest.mark.parametrize("ttl", [None, 60], ids=["plain", "ttl"])
@pytest.mark.parametrize("config", MODES)
def test_put_all_takes_pairs_and_a_list_update_takes_any_iterable(config, ttl):
    """``put_all`` takes what ``dict()`` takes, ``ListState.update`` what ``list()``
    takes (a numpy array too, whose truth value is ambiguous); both builds alike."""
    import types

    import numpy as np

    class Fills(KeyedProcessFunction):
        def open(self, ctx):
            self.map = ctx.get_state(MapStateDescriptor("map", ttl=ttl))
            self.list = ctx.get_state(ListStateDescriptor("list", ttl=ttl))

        def process_element(self, value, ctx):
            self.map.put_all(value)
            self.list.update(np.array(sorted(v for _, v in self.map.entries())))
            self.list.add_all(np.array([9]))
            ctx.output((sorted(self.map.entries()), [int(v) for v in self.list.get()]))

    rows = [("a", [("x", 1), ("y", 2)]), ("b", zip("xy", (3, 4), strict=True)),
            ("c", types.MappingProxyType({"x": 5}))]  # fmt: skip
    outputs, _ = run(Fills(), rows, config)
    assert outputs == [([("x", 1), ("y", 2)], [1, 2, 9]), ([("x", 3), ("y", 4)], [3, 4, 9]),
                       ([("x", 5)], [5, 9])]  # fmt: skip
