"""The partitions' engine metrics in Spark: what each one is, sampled gauges, the driver's merge.

Each partition writes one metrics row (JSON, ``spark_glue.raw_frame``): the operator's
``metrics`` (``aec.KeyedProcessOperator.metrics``: counters, Flink's AEC gauges
``num_in_flight_records``, ``active_buffer_size``, ``blocking_buffer_size``,
``num_blocking_keys``, the histograms ``batch_size``, ``state_request_latency_s``,
``record_latency_s`` as ``{"count", "p50", "p95", "p99", "max"}``, ``hot_keys``) and
the glue's own (``rows_in``, ``wall_s``, ...). Here:

* the vocabulary: which names are counters (summed over partitions, and per
  micro-batch on an operator ``process_keyed_stream`` keeps between micro-batches),
  gauges (current values, summed), maxima, histograms;
* ``GaugeSamples``: a bounded time series of the gauges a partition takes between
  slices of its input, never per record (``gauge_samples`` in the metrics row);
* ``json_safe_hot_keys``: hot keys as JSON values (a key that is not a plain JSON
  scalar becomes its ``repr``);
* ``merge``: the driver's view of one micro-batch (Spark's ``StreamingQueryProgress``
  carries state-store metrics per micro-batch the same way), and ``log_line``, the
  line ``process_keyed_stream`` logs on the logger ``aec.stream``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aec.runtime.metrics import HOT_KEYS, merge_summaries

# per run (process_keyed) or per micro-batch (process_keyed_stream): summed over partitions
COUNTERS = (
    "records_in", "records_out", "batches", "requests", "inline_batches", "blocked_requests",
    "timers_fired", "watermarks_out", "external_calls", "batched_calls", "call_batches",
    "late_records_dropped", "rows_in", "watermarks_in", "main_rows", "side_rows",
    "initial_rows",
)  # fmt: skip
# current values at the end of the partition's run: summed over partitions
GAUGES = (
    "num_in_flight_records", "active_buffer_size", "blocking_buffer_size",
    "num_blocking_keys", "checkpoint_pending_records",
)  # fmt: skip
# the largest over partitions (for an operator kept between micro-batches: since it opened)
MAXIMA = (
    "max_in_flight", "max_batch_size", "call_batch_max_size", "checkpoint_pause_s",
    "elapsed_s", "wall_s", "cpu_s",
)  # fmt: skip
HISTOGRAMS = ("batch_size", "state_request_latency_s", "record_latency_s")
# one gauge sample: seconds since the partition's run began, records fed, then the gauges
SAMPLE_FIELDS = ("t_s", "records", "num_in_flight_records", "num_blocking_keys",
                 "blocking_buffer_size")  # fmt: skip


class GaugeSamples:
    """A bounded time series of an operator's AEC gauges over one partition's run.

    The glue feeds records in slices (``until_next`` records at most) and calls
    ``take`` between slices, so sampling costs nothing per record. At most ``limit``
    samples are kept: when full, every other one is dropped and the stride doubles,
    so a long run keeps evenly spread samples.

    Args:
        stride: records between samples at first (>= 1).
        limit: samples kept (>= 2).
    """

    def __init__(self, stride: int = 1000, limit: int = 256) -> None:
        if stride < 1 or limit < 2:
            raise ValueError(f"stride must be >= 1 and limit >= 2, got {stride}, {limit}")
        self.stride = stride
        self.limit = limit
        self.points: list[list[float]] = []
        self.started = time.perf_counter()
        self._fed = 0  # records since the last sample

    def until_next(self) -> int:
        """Records to feed before the next sample (>= 1)."""
        return self.stride - self._fed

    def take(self, operator: Any, fed: int, records: int) -> None:
        """Count ``fed`` more records (at most ``until_next()``); when a sample is due,
        record ``operator``'s gauges with ``records``, the records fed so far."""
        self._fed += fed
        if self._fed < self.stride:
            return
        self._fed = 0
        self.sample(operator, records)

    def sample(self, operator: Any, records: int) -> None:
        """Record ``operator``'s gauges now (``in_flight_gauges``, O(1); also at the end
        of a run)."""
        in_flight, blocking_keys, blocking = operator.in_flight_gauges
        elapsed = round(time.perf_counter() - self.started, 6)
        self.points.append([elapsed, records, in_flight, blocking_keys, blocking])
        if len(self.points) >= self.limit:
            self.points = self.points[::2]
            self.stride *= 2


def json_safe_hot_keys(hot_keys: Iterable[tuple[Any, int]]) -> list[list[Any]]:
    """``[[key, blocked], ...]`` with each key a JSON scalar: strings, numbers, booleans
    and None as they are, any other key (a tuple of several key columns, a date) as
    its ``repr``."""
    return [[key if _scalar(key) else repr(key), int(n)] for key, n in hot_keys]


def _scalar(value: Any) -> bool:
    return value is None or type(value) in (str, int, float, bool)


def per_batch(metrics: dict[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` with each counter less its value in ``before`` (an operator's metrics
    at the start of a micro-batch, for one kept from the previous one), and the means
    and rates computed from those differences."""
    result = dict(metrics)
    for name in COUNTERS:
        if name in before and name in result:
            result[name] = result[name] - before[name]
    if "requests" in result and "batches" in result:
        batches = result["batches"]
        result["mean_batch_size"] = result["requests"] / batches if batches else 0.0
    return result


def carries_work(metrics: Mapping[str, Any]) -> bool:
    """Whether a partition's checkpoint holds work for the next micro-batch: records in
    flight it carried, or an end-of-micro-batch watermark held back."""
    return bool(metrics.get("checkpoint_pending_records") or metrics.get("held_watermark"))


def merge(batch_id: int, partitions: list[dict[str, Any]]) -> dict[str, Any]:
    """One micro-batch's metrics from its partitions' metrics rows.

    Counters and gauges are summed, maxima and ``peak_*`` taken as the largest (peaks:
    the sum over partitions of each one's largest sampled gauge), histograms merged
    (``aec.runtime.metrics.merge_summaries``: counts summed, percentiles
    count-weighted), hot keys merged (a key lives in one partition) keeping the
    ``HOT_KEYS`` with the most blocked records, as ``[(key, blocked), ...]``.
    ``partitions`` is how many partitions ran the micro-batch, ``kept_operators`` how
    many reused their live operator.
    """
    merged: dict[str, Any] = {"batch_id": batch_id, "partitions": len(partitions)}
    for name in COUNTERS + GAUGES:
        values = [p[name] for p in partitions if isinstance(p.get(name), (int, float))]
        merged[name] = sum(values) if values else 0
    for name in MAXIMA:
        values = [p[name] for p in partitions if isinstance(p.get(name), (int, float))]
        merged[name] = max(values) if values else 0
    for name in HISTOGRAMS:
        merged[name] = merge_summaries([p[name] for p in partitions if isinstance(p.get(name), dict)])
    batches = merged["batches"]
    merged["mean_batch_size"] = merged["requests"] / batches if batches else 0.0
    hot = [(key, n) for p in partitions for key, n in p.get("hot_keys", ())]
    merged["hot_keys"] = [tuple(pair) for pair in heapq.nlargest(HOT_KEYS, hot, key=_count)]
    for field, peak in (("num_in_flight_records", "peak_in_flight_records"),
                        ("num_blocking_keys", "peak_blocking_keys")):  # fmt: skip
        index = SAMPLE_FIELDS.index(field)
        merged[peak] = sum(
            max((point[index] for point in p.get("gauge_samples", ())), default=p.get(field, 0))
            for p in partitions
        )
    merged["kept_operators"] = sum(1 for p in partitions if p.get("kept_operator"))
    return merged


def _count(pair: tuple[Any, int]) -> int:
    return pair[1]


def log_line(metrics: Mapping[str, Any]) -> str:
    """One line describing a merged micro-batch (``merge``), for the ``aec.stream`` log."""
    hot = metrics.get("hot_keys") or []
    top = f"{hot[0][0]!r} ({hot[0][1]:,} blocked)" if hot else "none"
    requests = metrics.get("state_request_latency_s") or {}
    records = metrics.get("record_latency_s") or {}
    return (
        f"micro-batch {metrics['batch_id']}: {metrics['partitions']} partition(s), "
        f"{metrics['rows_in']:,} rows in, {metrics['records_out']:,} records out, "
        f"{metrics['batches']:,} state batches (mean {metrics['mean_batch_size']:.1f}), "
        f"in flight now {metrics['num_in_flight_records']:,} (peak "
        f"{metrics['peak_in_flight_records']:,}), blocking keys now "
        f"{metrics['num_blocking_keys']:,} (peak {metrics['peak_blocking_keys']:,}), "
        f"state request p95 {requests.get('p95', 0.0) * 1000:.2f} ms, record p95 "
        f"{records.get('p95', 0.0) * 1000:.2f} ms, hottest key {top}, carried "
        f"{metrics['checkpoint_pending_records']:,} record(s), checkpoint pause "
        f"{metrics['checkpoint_pause_s'] * 1000:.1f} ms, slowest partition "
        f"{metrics['wall_s']:.2f} s"
    )
