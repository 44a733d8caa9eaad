"""Firing fast paths: several due windows of a key handled by one firing or flush.

* End of input with allowed lateness (``TumblingDriver._at_end_of_input``): the key's first
  firing at watermark inf fires its unfired windows, clears every window and deletes
  its other timers (one firing per key instead of one per window end and cleanup).
* Sliding windows as panes in chain mode, bundled (``PaneBundle._fold_and_fire``):
  the flush before a watermark folds a key's records into its panes and fires the
  windows that watermark makes due (one context and one scan per key and watermark,
  instead of a flush and then a timer firing); without a process function.

Each is checked against the synchronous run, a reference model and the final state,
and by a metric that shows the path ran (so a broken path fails here)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from windowing_cases import SYNC, Record, Watermark, make_backend, rec, run, sum_reduce

from aec import AecConfig
from aec.testing import assert_equivalent
from aec.windowing import SlidingEventTimeWindows, TumblingEventTimeWindows, window

ASYNC = AecConfig(buffer_size=4, in_flight_records_limit=10)


def _open_windows_source(keys: str = "ab", windows: int = 30) -> list:
    """Records of each key in ``windows`` 10 s windows, a watermark after each window
    but the last five (so five windows per key are still to fire at end of input)."""
    source: list = []
    for w in range(windows):
        for i, key in enumerate(keys):
            source.append(rec(key, w + i, 10 * w + 1.5))
            source.append(rec(key, 1, 10 * w + 7))
        if w < windows - 5:
            source.append(Watermark(10 * w + 9))
    return source


def _expected_windows(source: list) -> dict:
    """``{key: [(start, total), ...]}`` in order of end: every window fires once."""
    totals: dict = {}
    for e in source:
        if type(e) is Record:
            start = math.floor(e.timestamp / 10) * 10
            per_key = totals.setdefault(e.key, {})
            per_key[start] = per_key.get(start, 0) + e.value[1]
    return {k: sorted(v.items()) for k, v in totals.items()}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("config", [SYNC, ASYNC], ids=["sync", "async"])
def test_end_of_input_cleans_a_keys_open_windows_in_one_firing(backend, config, tmp_path):
    source = _open_windows_source()
    fn = window(TumblingEventTimeWindows.of(10), reduce=sum_reduce, allowed_lateness=1000)
    store = make_backend(backend, tmp_path)
    result = run(source, fn, config, store)
    got: dict = {}
    for o in result.outputs:
        if type(o) is not Watermark:
            got.setdefault(o[0], []).append(o[1])
    want = _expected_windows(source)
    assert got == {k: [total for _, total in v] for k, v in want.items()}
    # every window was cleaned at end of input
    assert list(store.state_items("window-contents")) == []
    # one firing per key at end of input fires the last windows and cleans all 30 (not
    # one per end and cleanup time); before it, the 24 end timers per key fired as
    # timers in the synchronous run, and in the flush before each watermark (bundles)
    fired_during_run = 24 if config is SYNC else 0
    assert result.metrics["timers_fired"] == 2 * (fired_during_run + 1)


@settings(max_examples=60, deadline=None)
@given(
    source=st.lists(
        st.one_of(
            st.tuples(st.sampled_from("ab"), st.integers(1, 5), st.integers(0, 90)),
            st.integers(1, 25),
        ),
        max_size=40,
    ),
    lateness=st.sampled_from([1, 10, 35, 100]),
    data=st.data(),
)
def test_end_of_input_cleanup_async_equals_sync(source, lateness, data):
    elements, watermark = [], 0
    for item in source:
        if isinstance(item, int):
            watermark += item
            elements.append(Watermark(watermark))
        else:
            elements.append(rec(item[0], item[1], item[2]))
    assert_equivalent(
        lambda: window(TumblingEventTimeWindows.of(10), reduce=sum_reduce,
                       allowed_lateness=lateness, late_data_tag="late"),
        elements, configs=(ASYNC, AecConfig(buffer_size=1, in_flight_records_limit=1)),
        data=data,
    )  # fmt: skip


def _every_key_every_epoch(epochs: int = 20) -> list:
    source: list = []
    for e in range(epochs):
        for key in "abc":
            for i in range(3):
                source.append(rec(key, (e + i) % 9 + 1, 5 * e + 1.5 * i))
        source.append(Watermark(5 * e + 2))
    return source


def digits(a: tuple, b: tuple) -> tuple:
    return (a[0], f"{a[1]}{b[1]}")


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_the_flush_fires_the_due_panes_of_its_key(backend, tmp_path):
    source = _every_key_every_epoch()
    make = lambda: window(SlidingEventTimeWindows.of(12, 4), reduce=digits)  # noqa: E731
    want = run(source, make(), SYNC, make_backend(backend, tmp_path))
    got = run(source, make(), ASYNC, make_backend(backend, tmp_path))
    per_key = lambda r: {k: [o for o in r.outputs if type(o) is not Watermark and o[0] == k]  # noqa: E731
                         for k in "abc"}  # fmt: skip
    assert per_key(got) == per_key(want)
    assert [o for o in got.outputs if type(o) is Watermark] == [
        o for o in want.outputs if type(o) is Watermark
    ]
    # every key has records before every watermark: its windows fire in the flushes; only
    # the end of input (a flush that folds everything, fires nothing) leaves one chain
    # firing per key
    assert want.metrics["timers_fired"] >= 3 * 19  # a chain firing per key and watermark
    assert got.metrics["timers_fired"] == 3
