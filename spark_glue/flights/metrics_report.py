"""The ``## AEC metrics`` section of summary.md and ``aec_metrics.png``.

Per operator, from its partitions' metrics rows (``spark_glue.metrics``): Flink's AEC
gauges, the histograms of state batch size, state request latency and record latency,
the hot keys (keys whose records waited most for their key) and, in stream mode, what
the checkpoints carried. The plot shows records in flight and blocking keys over the
run: in batch mode each partition's sampled gauges over its seconds (sampled every
1,000 records or more, ``GaugeSamples``), in stream mode the peaks per micro-batch
(the partitions' peaks summed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt  # noqa: E402

from aec.runtime.metrics import HOT_KEYS, merge_summaries  # noqa: E402
from spark_glue.flights.job import FlightsRun, StageResult  # noqa: E402
from spark_glue.metrics import HISTOGRAMS, SAMPLE_FIELDS, merge  # noqa: E402

PLOT_FILE = "aec_metrics.png"
_IN_FLIGHT = SAMPLE_FIELDS.index("num_in_flight_records")
_BLOCKING_KEYS = SAMPLE_FIELDS.index("num_blocking_keys")


def operator_metrics(run: FlightsRun) -> dict[str, dict[str, Any]]:
    """Per operator, its run's metrics merged: over partitions (batch mode) or over
    micro-batches (stream mode; histograms count-weighted, maxima and peaks the
    largest, counters summed, each hot key's largest report)."""
    found: dict[str, dict[str, Any]] = {}
    batches = _micro_batches(run)
    for stage in run.stages:
        if stage.name in batches:
            found[stage.name] = _over_micro_batches(batches[stage.name])
        else:
            found[stage.name] = merge(0, _partition_rows(stage))
    return found


def _micro_batches(run: FlightsRun) -> dict[str, list[dict[str, Any]]]:
    if run.stream is None:
        return {}
    return {query.name: list(query.micro_batches) for query in run.stream.queries}


def _partition_rows(stage: StageResult) -> list[dict[str, Any]]:
    frame = stage.metrics
    if frame is None or frame.empty:
        return []
    rows = frame.to_dict("records")
    return [{k: v for k, v in row.items() if not _missing(v)} for row in rows]


def _missing(value: Any) -> bool:
    return isinstance(value, float) and value != value  # NaN: a column other rows have


def _over_micro_batches(batches: list[dict[str, Any]]) -> dict[str, Any]:
    merged = merge(0, [])
    if not batches:
        return merged
    for name in ("records_in", "records_out", "batches", "requests", "blocked_requests"):
        merged[name] = sum(b.get(name, 0) for b in batches)
    for name in ("max_in_flight", "max_batch_size", "peak_in_flight_records",
                 "peak_blocking_keys", "checkpoint_pause_s", "checkpoint_pending_records"):  # fmt: skip
        merged[name] = max(b.get(name, 0) for b in batches)
    for name in HISTOGRAMS:
        merged[name] = merge_summaries([b[name] for b in batches if isinstance(b.get(name), dict)])
    hottest: dict[Any, int] = {}
    for batch in batches:
        for key, blocked in batch.get("hot_keys", ()):
            hottest[key] = max(hottest.get(key, 0), blocked)
    merged["hot_keys"] = sorted(hottest.items(), key=lambda kv: -kv[1])[:HOT_KEYS]
    merged["micro_batches"] = len(batches)
    merged["carried_micro_batches"] = sum(1 for b in batches if b.get("checkpoint_pending_records"))
    return merged


def section(run: FlightsRun) -> list[str]:
    """The lines of ``## AEC metrics``."""
    metrics = operator_metrics(run)
    stream = run.stream is not None
    lines = [
        "## AEC metrics",
        "",
        "Flink's async state processing metrics per operator (`asyncStateProcessing` of "
        "the `AsyncExecutionController`), from the partitions' engines"
        + (", over every micro-batch" if stream else ", summed over partitions")
        + ". Peak in flight and peak blocking keys are the largest sampled values (the "
        "partitions' own peaks summed); batch size counts state requests per batch sent "
        "to the backend; a state request's latency runs from its batch's hand-off to its "
        "completion, a record's from its admission to its end (one record in 16). Hot "
        "keys are those whose records waited most for their key (blocked records).",
        "",
        "| operator | max in flight | peak blocking keys | state batches | batch size p50 / "
        "p95 / max | state request ms p50 / p95 / p99 | record ms p50 / p95 / p99 | hot keys "
        "(blocked records) |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for name, m in metrics.items():
        size, request, record = m["batch_size"], m["state_request_latency_s"], m["record_latency_s"]
        hot = ", ".join(f"`{key}` ({blocked:,})" for key, blocked in m["hot_keys"][:3]) or "none"
        lines.append(
            f"| {name} | {m['max_in_flight']:,} | {m['peak_blocking_keys']:,} | "
            f"{m['batches']:,} | {size['p50']:.0f} / {size['p95']:.0f} / {size['max']:.0f} | "
            f"{_ms(request)} | {_ms(record)} | {hot} |"
        )
    if stream:
        lines += ["", *_carried(metrics)]
    lines += ["", f"![records in flight and blocking keys]({PLOT_FILE})", ""]
    return lines


def _ms(summary: dict[str, float]) -> str:
    return " / ".join(f"{summary[p] * 1000:.2f}" for p in ("p50", "p95", "p99"))


def _carried(metrics: dict[str, dict[str, Any]]) -> list[str]:
    parts = [
        f"`{name}` {m['carried_micro_batches']} of {m['micro_batches']} micro-batches "
        f"(at most {m['checkpoint_pending_records']:,} records; longest checkpoint pause "
        f"{m['checkpoint_pause_s'] * 1000:.0f} ms)"
        for name, m in metrics.items()
    ]
    return [
        "Micro-batches whose checkpoint carried records in flight to the next one "
        "(only a declaring function's do; the others drain): " + "; ".join(parts) + "."
    ]


def plot(run: FlightsRun, path: str) -> None:
    """``aec_metrics.png``: records in flight (top) and blocking keys (bottom) over the
    run, one line per operator (and partition, in batch mode)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    batches = _micro_batches(run)
    if batches:
        for name, series in batches.items():
            ids = [b["batch_id"] for b in series]
            top.plot(ids, [b.get("peak_in_flight_records", 0) for b in series], marker=".", label=name)
            bottom.plot(ids, [b.get("peak_blocking_keys", 0) for b in series], marker=".", label=name)
        bottom.set_xlabel("micro-batch")
        top.set_title("Peak records in flight and blocking keys per micro-batch (partitions summed)")
    else:
        for stage in run.stages:
            for partition, samples in _samples(stage):
                times = [point[0] for point in samples]
                label = f"{stage.name} p{partition}"
                top.plot(times, [p[_IN_FLIGHT] for p in samples], label=label)
                bottom.plot(times, [p[_BLOCKING_KEYS] for p in samples], label=label)
        bottom.set_xlabel("seconds since the partition's operator started")
        top.set_title("Records in flight and blocking keys over the run (sampled)")
    top.set_ylabel("records in flight")
    bottom.set_ylabel("blocking keys")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    if top.lines:
        top.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _samples(stage: StageResult) -> Sequence[tuple[int, list[list[float]]]]:
    frame = stage.metrics
    if frame is None or frame.empty or "gauge_samples" not in frame:
        return []
    return [
        (int(row["partition"]), list(row["gauge_samples"]))
        for _, row in frame.iterrows()
        if isinstance(row["gauge_samples"], list) and row["gauge_samples"]
    ]

