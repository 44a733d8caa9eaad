"""Contract tests: rescaling by key group.

Black-box: only public names (``aec``, ``aec.keygroups``, ``backends``), read
sentence by sentence from the contract.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import aec
from aec import (
    AecConfig,
    KeyedProcessFunction,
    KeyedProcessOperator,
    ListStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.keygroups import KeyGroupRange, key_group_for, key_group_range_for
from backends import MemoryBackend

MAX_P = 16


class Counting(KeyedProcessFunction):
    """Per key: a count and the values seen; an event-time timer per record at t + 5
    that reports the state; outputs carry the key so they can be grouped."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.seen = ctx.get_state(ListStateDescriptor("seen"))

    async def process_element(self, value, ctx):
        n = await self.count.async_value()
        await self.count.async_update(n + 1)
        await self.seen.async_add(value)
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 5)
        ctx.output((ctx.current_key, "rec", value, n + 1))

    async def on_timer(self, timestamp, ctx):
        n = await self.count.async_value()
        seen = await (await self.seen.async_get()).on_next(lambda v: v)
        ctx.output((ctx.current_key, "timer", timestamp, n, tuple(seen)))


class Other(KeyedProcessFunction):
    """Same as Counting in shape but with a different state name."""

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    async def process_element(self, value, ctx):
        await self.total.async_update((await self.total.async_value()) + value)


def _config(**kw):
    return AecConfig(max_parallelism=MAX_P, **kw)


def _source(n_records=120, n_keys=23, every=10):
    out = []
    for i in range(n_records):
        out.append(Record(f"k{i % n_keys}", i, timestamp=float(i)))
        if i % every == every - 1:
            out.append(Watermark(float(i - 3)))
    return out


def _per_key(outputs):
    grouped = {}
    for item in outputs:
        if isinstance(item, Watermark):
            continue
        grouped.setdefault(item[0], []).append(item)
    return grouped


# -- KeyGroupRange ------------------------------------------------------------------------------


def test_key_group_range_is_inclusive_on_both_ends():
    r = KeyGroupRange(2, 5)
    assert (r.start, r.end) == (2, 5)
    assert 2 in r and 5 in r
    assert 1 not in r and 6 not in r
    assert len(r) == 4
    assert list(r) == [2, 3, 4, 5]
    single = KeyGroupRange(7, 7)
    assert len(single) == 1 and list(single) == [7] and 7 in single


@pytest.mark.parametrize(
    "max_p,parallelism",
    [(m, p) for m in (1, 7, 16, 128, 1000) for p in (1, 2, 3, 5, 7) if p <= m],
)
def test_key_group_range_for_is_flinks_contiguous_assignment(max_p, parallelism):
    ranges = [key_group_range_for(max_p, parallelism, i) for i in range(parallelism)]
    # Flink's computeKeyGroupRangeForOperatorIndex
    for i, r in enumerate(ranges):
        assert r.start == (i * max_p + parallelism - 1) // parallelism
        assert r.end == ((i + 1) * max_p - 1) // parallelism
    covered = [kg for r in ranges for kg in r]
    assert covered == list(range(max_p))  # contiguous, disjoint, in order
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1


def test_key_group_for_is_in_range_and_stable_across_processes():
    keys = ["a", "flight-17", 3, 42, ("x", 1), b"raw"]
    here = [key_group_for(k, 128) for k in keys]
    assert all(0 <= kg < 128 for kg in here)
    code = (
        "from aec.keygroups import key_group_for;"
        "print([key_group_for(k, 128) for k in ['a', 'flight-17', 3, 42, ('x', 1), b'raw']])"
    )
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == str(here)


# -- operator ranges ----------------------------------------------------------------------------


def test_key_group_range_outside_max_parallelism_is_value_error():
    with pytest.raises(ValueError):
        KeyedProcessOperator(Counting(), MemoryBackend(), _config(),
                             key_group_range=KeyGroupRange(0, MAX_P))
    with pytest.raises(ValueError):
        KeyedProcessOperator(Counting(), MemoryBackend(), _config(),
                             key_group_range=KeyGroupRange(MAX_P, MAX_P + 2))


def test_key_group_range_none_owns_every_group():
    op = KeyedProcessOperator(Counting(), MemoryBackend(), _config(), key_group_range=None)
    op.open()
    for i in range(60):
        op.process(Record(f"any{i}", i, timestamp=float(i)))
    op.finish()
    assert len([o for o in op.drain_outputs() if not isinstance(o, Watermark) and o[1] == "rec"]) == 60
    op.close()


def _key_in(r, max_p=MAX_P, outside=False):
    for i in range(10_000):
        key = f"key{i}"
        if (key_group_for(key, max_p) in r) != outside:
            return key
    raise AssertionError("no key found")


def test_record_outside_range_is_refused_and_operator_stays_usable():
    own = key_group_range_for(MAX_P, 2, 0)
    op = KeyedProcessOperator(Counting(), MemoryBackend(), _config(), key_group_range=own)
    op.open()
    inside, outside = _key_in(own), _key_in(own, outside=True)
    op.process(Record(inside, 1, timestamp=1.0))
    with pytest.raises(ValueError):
        op.process(Record(outside, 2, timestamp=2.0))
    op.process(Record(inside, 3, timestamp=3.0))
    op.finish()
    recs = [o for o in op.drain_outputs() if not isinstance(o, Watermark) and o[1] == "rec"]
    assert recs == [(inside, "rec", 1, 1), (inside, "rec", 3, 2)]
    op.close()


# -- rescaling equivalence -----------------------------------------------------------------------


def _uninterrupted(source):
    result = aec.run_keyed(source, Counting(), config=_config())
    return _per_key(result.outputs)


def _route(element, operators):
    if isinstance(element, Watermark):
        for op in operators:
            op.process_watermark(element)
        return
    kg = key_group_for(element.key, MAX_P)
    owners = [op for op in operators if kg in op.key_group_range]
    assert len(owners) == 1
    owners[0].process(element)


def _rescaled(source, cut, p, q, tmp_path, async_state=True):
    config = _config(async_state=async_state)
    first = [
        KeyedProcessOperator(Counting(), MemoryBackend(), config,
                             key_group_range=key_group_range_for(MAX_P, p, i))
        for i in range(p)
    ]
    outputs = []
    for op in first:
        op.open()
    for element in source[:cut]:
        _route(element, first)
    handles = [op.snapshot(1, tmp_path / f"p{i}") for i, op in enumerate(first)]
    for op in first:
        outputs += op.drain_outputs()
        op.close()  # the rest of the first run is lost
    second = [
        KeyedProcessOperator(Counting(), MemoryBackend(), config,
                             key_group_range=key_group_range_for(MAX_P, q, i))
        for i in range(q)
    ]
    for op in second:
        op.restore(handles)
    for element in source[cut:]:
        _route(element, second)
    for op in second:
        op.finish()
        outputs += op.drain_outputs()
        op.close()
    return _per_key(outputs)


@pytest.mark.parametrize("p,q", [(1, 3), (3, 1), (2, 5), (4, 2), (3, 3)])
def test_restore_p_checkpoints_into_q_operators_equals_uninterrupted(p, q, tmp_path):
    source = _source()
    expected = _uninterrupted(source)
    for cut in (0, 37, 80, len(source)):
        got = _rescaled(source, cut, p, q, tmp_path / f"cut{cut}")
        assert got == expected, f"p={p} q={q} cut={cut}"


def test_rescale_in_synchronous_mode_too(tmp_path):
    source = _source()
    assert _rescaled(source, 50, 2, 3, tmp_path, async_state=False) == _uninterrupted(source)


def test_restored_watermark_is_minimum_of_handles(tmp_path):
    class Reports(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.output(ctx.timer_service.current_watermark())

    handles = []
    for i, w in enumerate((10.0, 4.0, 7.0)):
        op = KeyedProcessOperator(Reports(), MemoryBackend(), _config(),
                                  key_group_range=key_group_range_for(MAX_P, 3, i))
        op.open()
        op.process_watermark(Watermark(w))
        handles.append(op.snapshot(1, tmp_path / str(i)))
        op.close()
    op = KeyedProcessOperator(Reports(), MemoryBackend(), _config())
    op.restore(handles)
    op.process(Record("x", 1, timestamp=20.0))
    op.finish()
    values = [o for o in op.drain_outputs() if not isinstance(o, Watermark)]
    assert values == [4.0]
    op.close()


def test_single_handle_is_filtered_to_the_range(tmp_path):
    full = KeyedProcessOperator(Counting(), MemoryBackend(), _config())
    full.open()
    keys = [f"k{i}" for i in range(40)]
    for i, key in enumerate(keys):
        full.process(Record(key, i, timestamp=float(i)))
    handle = full.snapshot(3, tmp_path)
    full.close()

    own = key_group_range_for(MAX_P, 2, 1)
    half = KeyedProcessOperator(Counting(), MemoryBackend(), _config(), key_group_range=own)
    half.restore(handle)
    inside = [k for k in keys if key_group_for(k, MAX_P) in own]
    outside = [k for k in keys if key_group_for(k, MAX_P) not in own]
    assert inside and outside
    for key in inside:
        half.process(Record(key, 100, timestamp=100.0))
    with pytest.raises(ValueError):
        half.process(Record(outside[0], 100, timestamp=100.0))
    half.finish()
    out = [o for o in half.drain_outputs() if not isinstance(o, Watermark)]
    recs = [o for o in out if o[1] == "rec"]
    assert sorted(recs) == sorted((k, "rec", 100, 2) for k in inside)  # state carried over
    timer_keys = {o[0] for o in out if o[1] == "timer"}
    assert timer_keys == set(inside)  # timers of other key groups dropped
    half.close()


def _snapshot_of(function, tmp_path, name, config, key_group_range=None, keys=("a", "b")):
    op = KeyedProcessOperator(function, MemoryBackend(), config, key_group_range=key_group_range)
    op.open()
    for key in keys:
        if key_group_range is None or key_group_for(key, config.max_parallelism) in key_group_range:
            op.process(Record(key, 1, timestamp=1.0))
    handle = op.snapshot(1, tmp_path / name)
    op.close()
    return handle


def _good_restore_still_possible(op, handle):
    op.restore(handle)
    op.process(Record("a", 5, timestamp=5.0))
    op.finish()
    assert [o for o in op.drain_outputs() if not isinstance(o, Watermark) and o[1] == "rec"] == [
        ("a", "rec", 5, 2)
    ]
    op.close()


def test_handles_with_different_max_parallelism_are_refused(tmp_path):
    a = _snapshot_of(Counting(), tmp_path, "a", _config(), key_group_range_for(MAX_P, 2, 0))
    b = _snapshot_of(Counting(), tmp_path, "b", AecConfig(max_parallelism=32),
                     key_group_range_for(32, 2, 1))
    op = KeyedProcessOperator(Counting(), MemoryBackend(), _config())
    with pytest.raises(ValueError):
        op.restore([a, b])
    # and a checkpoint of another max_parallelism than the operator's alone
    with pytest.raises(ValueError):
        op.restore(b)
    _good_restore_still_possible(op, _snapshot_of(Counting(), tmp_path, "ok", _config()))


def test_handles_with_different_state_names_are_refused(tmp_path):
    a = _snapshot_of(Counting(), tmp_path, "a", _config(), key_group_range_for(MAX_P, 2, 0))
    b = _snapshot_of(Other(), tmp_path, "b", _config(), key_group_range_for(MAX_P, 2, 1))
    op = KeyedProcessOperator(Counting(), MemoryBackend(), _config())
    with pytest.raises(ValueError):
        op.restore([a, b])
    _good_restore_still_possible(op, _snapshot_of(Counting(), tmp_path, "ok", _config()))


def test_handles_with_overlapping_key_groups_are_refused(tmp_path):
    a = _snapshot_of(Counting(), tmp_path, "a", _config())
    b = _snapshot_of(Counting(), tmp_path, "b", _config())
    op = KeyedProcessOperator(Counting(), MemoryBackend(), _config())
    with pytest.raises(ValueError):
        op.restore([a, b])
    c = _snapshot_of(Counting(), tmp_path, "c", _config(), KeyGroupRange(0, 9))
    d = _snapshot_of(Counting(), tmp_path, "d", _config(), KeyGroupRange(9, MAX_P - 1))
    with pytest.raises(ValueError):
        op.restore([c, d])
    _good_restore_still_possible(op, _snapshot_of(Counting(), tmp_path, "ok", _config()))


def test_restore_accepts_a_chk_path(tmp_path):
    handle = _snapshot_of(Counting(), tmp_path, "p", _config())
    op = KeyedProcessOperator(Counting(), MemoryBackend(), _config())
    _good_restore_still_possible(op, handle.path)


def _backends(tmp_path):
    from backends import CachedBackend, LatencyBackend, RocksDBBackend, SlateDBBackend

    made = iter(range(1000))
    return {
        "memory": MemoryBackend,
        "rocksdb": lambda: RocksDBBackend(str(tmp_path / f"rocks{next(made)}")),
        "latency": lambda: LatencyBackend(MemoryBackend(), 0.0005),
        "cached": lambda: CachedBackend(MemoryBackend(), 8),
        "slatedb": lambda: SlateDBBackend(f"file://{tmp_path}/slate", f"db{next(made)}"),
    }


@pytest.mark.parametrize("name", ["memory", "rocksdb", "latency", "cached", "slatedb"])
def test_rescale_with_every_backend(name, tmp_path):
    make = _backends(tmp_path)[name]
    source = _source(n_records=60, n_keys=11)
    expected = _uninterrupted(source)
    config = _config()
    cut, outputs, handles = 31, [], []
    for i in range(2):
        backend = make()
        op = KeyedProcessOperator(Counting(), backend, config,
                                  key_group_range=key_group_range_for(MAX_P, 2, i))
        op.open()
        for element in source[:cut]:
            if isinstance(element, Watermark) or key_group_for(element.key, MAX_P) in op.key_group_range:
                _route(element, [op])
        handles.append(op.snapshot(1, tmp_path / f"chk{i}"))
        outputs += op.drain_outputs()
        op.close()
        backend.close()
    for i in range(3):
        backend = make()
        op = KeyedProcessOperator(Counting(), backend, config,
                                  key_group_range=key_group_range_for(MAX_P, 3, i))
        op.restore(handles)
        for element in source[cut:]:
            if isinstance(element, Watermark) or key_group_for(element.key, MAX_P) in op.key_group_range:
                _route(element, [op])
        op.finish()
        outputs += op.drain_outputs()
        op.close()
        backend.close()
    assert _per_key(outputs) == expected
