"""The AEC's histograms (``aec.runtime.metrics``): batch sizes counted exactly, request
latency timed on the first batch and one in ``BATCH_SAMPLE`` after it."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from engine_helpers import Counter as KeyedCounter
from hypothesis import given
from hypothesis import strategies as st

from aec import AecConfig, KeyedProcessFunction, Record, ValueStateDescriptor, run_keyed
from aec.runtime.metrics import BATCH_SAMPLE, count_summary
from backends import LatencyBackend, MemoryBackend


@given(st.dictionaries(st.integers(1, 2000), st.integers(1, 50), max_size=30))
def test_count_summary_is_the_exact_percentile_of_the_counted_values(counts):
    values = sorted(v for v, times in counts.items() for _ in range(times))
    summary = count_summary(counts)
    assert summary["count"] == len(values)
    assert summary["max"] == (values[-1] if values else 0)
    for name, fraction in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
        # the smallest value at or below which `fraction` of the values lie
        rank = max(math.ceil(fraction * len(values)), 1)
        assert summary[name] == (values[rank - 1] if values else 0)


class ReadOnce(KeyedProcessFunction):
    """One read per record: every batch is made of whole records."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=0))

    async def process_element(self, value, ctx):
        ctx.output((ctx.current_key, await self.seen.async_value()))


def test_batch_sizes_are_exact_and_request_latency_is_timed_on_sampled_batches():
    latency = 0.002
    batches = 3 * BATCH_SAMPLE
    source = [Record(f"k{i}", i) for i in range(4 * batches)]  # no key twice: none waits
    result = run_keyed(
        source, ReadOnce(), LatencyBackend(MemoryBackend(), latency),
        AecConfig(buffer_size=4, buffer_timeout=60.0),
    )  # fmt: skip
    metrics = result.metrics
    assert metrics["batches"] == batches
    assert metrics["batch_size"] == {"count": batches, "p50": 4, "p95": 4, "p99": 4, "max": 4}
    assert metrics["max_batch_size"] == 4
    timed = metrics["state_request_latency_s"]
    # the first batch, then every BATCH_SAMPLE-th: 1, 1 + BATCH_SAMPLE, 1 + 2 * BATCH_SAMPLE
    assert timed["count"] == 4 * 3
    assert timed["p50"] >= latency * 0.95 and timed["max"] >= timed["p50"]


class CountingCalls(MemoryBackend):
    """A MemoryBackend that records the size of every batch it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def execute_batch(self, requests):
        self.sizes.append(len(requests))
        super().execute_batch(requests)


@pytest.mark.parametrize("async_state", [True, False])
def test_batch_size_counts_every_batch_the_store_ran(async_state):
    # requests run at once (a waiting record's, a callback's, every synchronous one) are
    # batches of one the store runs like any other
    backend = CountingCalls()
    source = [Record(k, i) for i, k in enumerate("aaabccddddd")]
    result = run_keyed(source, KeyedCounter(), backend, AecConfig(async_state=async_state))
    metrics = result.metrics
    assert metrics["batches"] == len(backend.sizes)
    assert metrics["batch_size"] == count_summary(Counter(backend.sizes))
    assert metrics["max_batch_size"] == max(backend.sizes)
    if async_state:
        assert max(backend.sizes) > 1 and backend.sizes.count(1) > 1  # both kinds ran


def test_a_run_with_one_batch_times_it():
    result = run_keyed(
        [Record("a", 1), Record("b", 2)], ReadOnce(), LatencyBackend(MemoryBackend(), 0.001)
    )
    assert result.metrics["state_request_latency_s"]["count"] == 2
    assert result.metrics["batch_size"]["count"] == 1
    assert result.metrics["record_latency_s"]["count"] == 1  # the first record is timed



def test_a_synchronous_run_times_no_request():
    # the reference run answers each request inline: nothing is handed over to time
    # (an asynchronous run of the same records times its sampled batches)
    source = [Record(f"k{i}", i) for i in range(2 * BATCH_SAMPLE)]
    backend = LatencyBackend(MemoryBackend(), 0.001)
    result = run_keyed(source, ReadOnce(), backend, AecConfig(async_state=False))
    assert result.metrics["batches"] == len(source)
    assert result.metrics["state_request_latency_s"]["count"] == 0
    assert result.metrics["record_latency_s"]["count"] >= 1  # records are timed in both
