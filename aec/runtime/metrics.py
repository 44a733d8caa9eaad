"""The AEC's metrics beyond counters: histograms, hot keys and gauges over time
(Flink's ``asyncStateProcessing`` metric group of ``AsyncExecutionController``:
``numInFlightRecords``, ``activeBufferSize``, ``blockingBufferSize``,
``numBlockingKeys``; Spark's state-store metrics per micro-batch).

Always on, so cheap: a histogram insert is a bisect over fixed log-spaced bucket
bounds (no per-sample storage); batch sizes, whole numbers bounded by the buffer
size, are counted exactly in a dict (``count_summary``); latencies are sampled: a
record's (the first and one in ``RECORD_SAMPLE`` after it) and a batch's requests'
(the first and one in ``BATCH_SAMPLE``: a skewed run hands over a batch every few
records, and two clock reads, a dict entry and an insert per batch cost it about 2 %); a
histogram's ``count`` is what was measured. Hot keys count only records that had to
wait for their key.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Hashable
from typing import Any

# the first record and one in this many after it have their latency measured (a power of two)
RECORD_SAMPLE = 16
BATCH_SAMPLE = 8  # one batch in this many has its requests' latency measured (a power of two)
HOT_KEYS = 10  # keys reported by hot_keys
HOT_KEYS_KEPT = 1 << 16  # keys counted before the coldest are forgotten
_GROWTH = 1.05  # bucket bound ratio: percentiles within 5 %


class Histogram:
    """Counts of non-negative values in log-spaced buckets; percentiles within 5 %.

    Args:
        smallest: the bound of the first bucket (values at or below it land there).
        largest: the bound of the last bucket (values above it land there; ``max``
            stays exact).
    """

    __slots__ = ("_bounds", "_counts", "count", "max", "total")

    def __init__(self, smallest: float, largest: float) -> None:
        steps = math.ceil(math.log(largest / smallest, _GROWTH)) + 1
        self._bounds = [smallest * _GROWTH**i for i in range(steps)]
        self._counts = [0] * (steps + 1)
        self.count = 0
        self.max = 0.0
        self.total = 0.0

    def add(self, value: float, times: int = 1) -> None:
        """Count ``value`` ``times`` times. O(log buckets)."""
        self._counts[bisect_left(self._bounds, value)] += times
        self.count += times
        self.total += value * times
        if value > self.max:
            self.max = value

    def percentile(self, fraction: float) -> float:
        """The value below which ``fraction`` of the counted values lie (the bucket's
        upper bound, capped at ``max``); 0.0 when empty."""
        if not self.count:
            return 0.0
        rank = fraction * self.count
        seen = 0
        for i, n in enumerate(self._counts):
            seen += n
            if seen >= rank and n:
                bound = self._bounds[i] if i < len(self._bounds) else self.max
                return min(bound, self.max)
        return self.max

    def summary(self) -> dict[str, float]:
        """``{"count", "p50", "p95", "p99", "max"}`` (the contract's shape)."""
        return {
            "count": self.count,
            "p50": self.percentile(0.50),
            "p95": self.percentile(0.95),
            "p99": self.percentile(0.99),
            "max": self.max,
        }


def count_summary(counts: dict[int, int]) -> dict[str, float]:
    """``Histogram.summary``'s shape, exact, for small whole values counted in a dict
    (``value -> times``, as batch sizes are: bounded by the buffer size, so a dict
    increment per batch costs less than a histogram insert). A percentile is the
    smallest value at or below which ``fraction`` of the counted values lie."""
    values = sorted(counts)
    count = sum(counts.values())
    summary: dict[str, float] = {"count": count}
    for name, fraction in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
        rank, seen, found = fraction * count, 0, 0
        for value in values:
            seen += counts[value]
            if seen >= rank:
                found = value
                break
        summary[name] = found
    summary["max"] = values[-1] if values else 0.0
    return summary


def latency_histogram() -> Histogram:
    """Seconds, from 1 microsecond to an hour."""
    return Histogram(1e-6, 3600.0)


def keep_hottest(counts: dict[Hashable, int]) -> None:
    """Bound ``counts`` (key -> records that waited for it), grown past
    ``HOT_KEYS_KEPT`` keys: only the hottest sixteenth stays (a key that matters
    comes back at once; the top of a skewed run stays exact)."""
    kept = heapq.nlargest(HOT_KEYS_KEPT // 16, counts.items(), key=lambda kv: kv[1])
    counts.clear()
    counts.update(kept)


def hottest(counts: dict[Hashable, int], n: int = HOT_KEYS) -> list[tuple[Hashable, int]]:
    """The ``n`` keys with the most blocked records, ``[(key, count), ...]``, most
    first (ties in first-blocked order)."""
    return heapq.nlargest(n, counts.items(), key=lambda kv: kv[1])


def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, float]:
    """An approximate merge of histogram summaries from several operators (count
    summed, max the largest, percentiles count-weighted): the driver's view of a
    micro-batch's partitions."""
    parts = [p for p in parts if p.get("count")]
    if not parts:
        return {"count": 0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    count = sum(p["count"] for p in parts)
    merged: dict[str, float] = {"count": count, "max": max(p["max"] for p in parts)}
    for name in ("p50", "p95", "p99"):
        merged[name] = sum(p[name] * p["count"] for p in parts) / count
    return merged
