"""Async == sync for two-input functions (rule 11 of docs/semantics.md across both inputs), under
random batch-completion schedules, on MemoryBackend and RocksDBBackend:
``aec.testing.assert_equivalent_co`` over random two-input streams.

``Enrich``'s timers read state that later records write, so only serial watermark
order is promised for it; the interval join's reads skip entries whose cleanup
the reader's watermark decided (``aec.joins.buffer``), so it is exact in parallel
order too.
"""

from __future__ import annotations

import tempfile

import pytest
from co_helpers import Enrich
from hypothesis import given, settings
from hypothesis import strategies as st

from aec import KeyedCoProcessFunction, Record, ValueStateDescriptor, Watermark
from aec.joins import ProcessJoinFunction, interval_join
from aec.testing import assert_equivalent_co
from aec.testing.strategies import co_keyed_streams, configs
from backends import MemoryBackend, RocksDBBackend


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One directory for the module's RocksDB databases (pytest removes old runs')."""
    return tmp_path_factory.mktemp("co-equivalence")


def backends(name, scratch):
    """A factory of fresh backends (RocksDB: a new directory each, under ``scratch``)."""
    if name == "memory":
        return MemoryBackend
    root = tempfile.mkdtemp(dir=scratch)
    made = iter(range(10_000))
    return lambda: RocksDBBackend(f"{root}/db-{next(made)}")


class Tagged(ProcessJoinFunction):
    """A join function using its context and a side output."""

    def process_element(self, left, right, ctx):
        if (left + right) % 5 == 0:
            ctx.side_output("fives", (ctx.current_key, left, right))
        return [(ctx.current_key, left, right, ctx.timestamp)]


def join():
    return interval_join(-4, 2, Tagged(), upper_inclusive=False, left_late_tag="late")


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@settings(max_examples=30)
@given(source=co_keyed_streams(max_size=35), config=configs("serial"), data=st.data())
def test_co_functions_async_equals_sync(scratch, backend, source, config, data):
    assert_equivalent_co(
        Enrich, source, backend_factory=backends(backend, scratch), configs=[config], data=data
    )


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@settings(max_examples=30)
@given(source=co_keyed_streams(max_size=35), config=configs(), data=st.data())
def test_interval_join_async_equals_sync_in_both_watermark_orders(
    scratch, backend, source, config, data
):
    assert_equivalent_co(
        join, source, backend_factory=backends(backend, scratch), configs=[config], data=data
    )


def test_the_checker_finds_a_co_function_that_depends_on_completion_order():
    """A function whose output depends on which key's batch completes first is caught
    (the checker's own honesty), and the message names the mode."""
    order: list = []

    class Racy(KeyedCoProcessFunction):
        def open(self, ctx):
            self.seen = ctx.get_state(ValueStateDescriptor("seen"))

        def process_element1(self, value, ctx):
            return self.seen.async_value().then_accept(lambda _: order.append(value))

        def process_element2(self, value, ctx):
            ctx.output(tuple(order))

    source = [(1, Record(k, k)) for k in "abcdef"] + [(2, Record("z", "?"))]
    with pytest.raises(AssertionError, match="serial watermark mode"):
        assert_equivalent_co(Racy, source, seeds=range(5))


def test_a_bad_source_element_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="source element #1"):
        assert_equivalent_co(Enrich, [(1, Record("a", 1, 1)), Watermark(3)])
