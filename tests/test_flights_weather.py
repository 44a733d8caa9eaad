"""The flights job's weather join (``flights_weather``): each flight with the weather
observations at its origin in the hour before its scheduled departure.

With a 24 h watermark delay nothing is late and the rows equal pandas' merge of the
two tables on origin filtered to the interval, in process (January) and through the
command line; with the default 2 h delay every pair the merge finds is either
written or has a late flight or observation, and nothing else is written.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from test_flights import LIMIT, assert_same

from aec import AecConfig, Record, Watermark, run_keyed_co
from spark_glue.cli import main
from spark_glue.flights import data as flights_data
from spark_glue.flights import weather as flights_weather
from spark_glue.flights import weather_report
from spark_glue.watermarks import BoundedOutOfOrderness

HOUR = 3600
EPOCH = pd.Timestamp("1970-01-01")


def test_observation_time_is_the_local_hour_of_the_row():
    weather = flights_weather.load_weather()
    assert list(weather.columns) == flights_weather.WEATHER_SCHEMA.fieldNames()
    first = weather.iloc[0]
    assert first["obs_time"] == pd.Timestamp("2013-01-01 01:00")  # year, month, day, hour 1
    assert weather["row"].tolist() == list(range(len(weather)))


def test_weather_is_limited_to_the_span_the_flights_can_join():
    flights = flights_data.load(500)
    weather = flights_weather.load_weather(flights)
    earliest = flights["event_time"].min() - pd.Timedelta(hours=1)
    assert weather["obs_time"].min() >= earliest
    assert weather["obs_time"].max() <= flights["event_time"].max()
    every = flights_weather.load_weather()
    inside = every["obs_time"].between(earliest, flights["event_time"].max())
    assert weather["row"].tolist() == every.loc[inside, "row"].tolist()


def _first_days(days: int = 10) -> pd.DataFrame:
    """The prepared flights of the first ``days`` days of January."""
    flights = flights_data.load(12_000)
    return flights[flights["day"] <= days].reset_index(drop=True)


def _seconds(moment) -> float:
    return (moment - EPOCH).total_seconds()


def _source(flights: pd.DataFrame, weather: pd.DataFrame, delay: float, interval: int):
    """One partition's input, as the job gives it: flights in arrival order, observations in
    time order, merged by time (flights first), per-input periodic watermarks."""
    left = flights[flights_weather.FLIGHT_FIELDS].to_dict("records")
    right = weather.to_dict("records")
    tagged = [(_seconds(r["arrival_time"]), 1, r["row"], r) for r in left]
    tagged += [(_seconds(r["obs_time"]), 2, r["row"], r) for r in right]
    generators = {
        1: BoundedOutOfOrderness(delay, interval),
        2: BoundedOutOfOrderness(delay, interval),
    }
    source = []
    for _, input, _, row in sorted(tagged, key=lambda t: t[:3]):
        stamp = _seconds(row["event_time"] if input == 1 else row["obs_time"])
        source.append((input, Record(row["origin"], row, stamp)))
        mark = generators[input].on_record(stamp)
        if mark is not None:
            source.append((input, Watermark(mark)))
    return source


def test_in_process_with_a_day_of_delay_the_join_equals_pandas_merge():
    flights = _first_days()
    weather = flights_weather.load_weather(flights)
    source = _source(flights, weather, 24 * HOUR, flights_weather.WATERMARK_INTERVAL)
    result = run_keyed_co(
        source, flights_weather.flights_weather(), config=AecConfig(buffer_size=64)
    )
    assert result.side_outputs == {} and result.metrics["late_records_dropped"] == 0
    got = pd.DataFrame([o for o in result.outputs if not isinstance(o, Watermark)])
    expected = flights_weather.expected_pairs(flights, weather)
    assert len(got) == len(expected) > 10_000
    assert_same(got, expected, exact=True)
    assert result.outputs[-1] == Watermark(math.inf)


def test_last_observations_keep_each_flights_latest():
    joined = pd.DataFrame(
        {
            "year": [2013, 2013, 2013], "month": [1, 1, 1], "day": [1, 1, 1],
            "carrier": ["AA", "AA", "UA"], "flight": [1, 1, 2], "origin": ["JFK"] * 3,
            "event_time": [pd.Timestamp("2013-01-01 06:00")] * 3,
            "obs_time": [pd.Timestamp("2013-01-01 06:00"), pd.Timestamp("2013-01-01 05:00"),
                         pd.Timestamp("2013-01-01 05:00")],
            "visib": [10.0, 2.0, 0.5],
        }
    )  # fmt: skip
    latest = weather_report.last_observations(joined)
    assert sorted(zip(latest["carrier"], latest["visib"], strict=True)) == [
        ("AA", 10.0),
        ("UA", 0.5),
    ]


# -- through the command line ---------------------------------------------------------------------
@pytest.mark.spark
def test_the_job_with_a_day_of_delay_writes_the_pandas_merge(spark, tmp_path):
    out = tmp_path / "out"
    argv = ["flights", "--out", str(out), "--limit", str(LIMIT), "--backend", "memory"]
    assert main([*argv, "--watermark-delay", "24h"]) == 0
    flights = flights_data.load(LIMIT)
    expected = flights_weather.expected_pairs(flights, flights_weather.load_weather(flights))
    got = pd.read_parquet(out / "flights_weather")
    assert list(got.columns) == list(expected.columns)
    assert len(got) == len(expected) > LIMIT
    assert_same(got, expected, exact=True)
    assert len(pd.read_parquet(out / "late_flights_weather")) == 0
    assert len(pd.read_parquet(out / "late_weather")) == 0
    summary = (out / "summary.md").read_text()
    assert f"| flights_weather | {len(expected):,} |" in summary
    assert "0 flights arrived behind the watermark" in summary


def _missing_pairs_have_late_records(expected, got, late_flights, late_weather):
    """Every pair the merge finds is written or has a late flight or observation;
    nothing else is written. Returns how many pairs the late records cost."""
    key = ["carrier", "flight", "origin", "event_time", "obs_time"]
    written = set(map(tuple, got[key].itertuples(index=False)))
    assert written <= set(map(tuple, expected[key].itertuples(index=False)))
    flight = ["carrier", "flight", "origin", "event_time"]
    late = set(map(tuple, late_flights[flight].itertuples(index=False)))
    late_obs = set(map(tuple, late_weather[["origin", "obs_time"]].itertuples(index=False)))
    missing = 0
    for pair in expected[key].itertuples(index=False):
        if tuple(pair) not in written:
            missing += 1
            assert tuple(pair[:4]) in late or (pair[2], pair[4]) in late_obs, pair
    return missing


def test_in_process_with_two_hours_of_delay_late_flights_explain_every_missing_pair():
    flights = _first_days()
    weather = flights_weather.load_weather(flights)
    source = _source(flights, weather, 2 * HOUR, flights_weather.WATERMARK_INTERVAL)
    result = run_keyed_co(source, flights_weather.flights_weather())
    got = pd.DataFrame([o for o in result.outputs if not isinstance(o, Watermark)])
    late_flights = pd.DataFrame(result.side_outputs.get(flights_weather.LATE_FLIGHTS, []))
    late_weather = pd.DataFrame(
        result.side_outputs.get(flights_weather.LATE_WEATHER, []),
        columns=flights_weather.WEATHER_SCHEMA.fieldNames(),
    )
    expected = flights_weather.expected_pairs(flights, weather)
    assert len(late_flights) > 0  # flights more than two hours behind their schedule
    assert _missing_pairs_have_late_records(expected, got, late_flights, late_weather) > 0
    # the late ones are the flights that left more than the delay after others' schedules
    assert (late_flights["dep_delay"] > 60).all()


@pytest.mark.spark
def test_with_the_default_delay_every_missing_pair_has_a_late_record(spark, tmp_path):
    out = tmp_path / "out"
    assert main(["flights", "--out", str(out), "--limit", str(LIMIT), "--backend", "memory"]) == 0
    flights = flights_data.load(LIMIT)
    expected = flights_weather.expected_pairs(flights, flights_weather.load_weather(flights))
    _missing_pairs_have_late_records(
        expected,
        pd.read_parquet(out / "flights_weather"),
        pd.read_parquet(out / "late_flights_weather"),
        pd.read_parquet(out / "late_weather"),
    )
