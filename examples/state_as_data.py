"""Inspecting and bootstrapping state: ``spark_glue.read_state`` on the flights stream's
checkpoint, then a new query started from it with ``initial_state``.

Needs ``pip install 'aec[spark]'`` and Java 17+. Run: ``python examples/state_as_data.py``.

1. The flights job runs as a stream (``aec flights --stream``) over the first 600
   departures of 2013: its ``rotations`` operator keeps, per aircraft, the previous
   flight ``(event time, origin, dest, arrival delay)`` in a ValueState.
2. ``read_state(spark, <checkpoint location>)`` reads that state from the query's
   latest committed micro-batch, without running anything: one row per aircraft.
3. A new query over the next 300 departures starts from those rows
   (``process_keyed_stream(..., initial_state=df)``): an aircraft's first flight in
   it already knows its previous leg, as if the two queries were one.
Docs: docs/state_as_data.md.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from spark_glue import process_keyed_stream, read_state
from spark_glue.flights import data as flights_data
from spark_glue.flights import job, stream_job
from spark_glue.flights.functions import (
    NO_TAILNUM_SCHEMA,
    ROTATIONS_SCHEMA,
    Rotations,
    rotation_state,
)

FIRST, NEXT = 600, 300  # departures of the first query, then of the bootstrapped one


class SeededRotations(Rotations):
    """``Rotations`` whose ``previous`` state may come from an initial-state row."""

    async def process_initial_state(self, row: dict[str, Any], ctx: Any) -> None:
        await self.previous.async_update(rotation_state(row, row["event_time"]))


def main() -> None:
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    with tempfile.TemporaryDirectory(prefix="aec-state-as-data-") as out:
        # 1. the flights stream (route_hourly and rotations) over the first departures
        options = job.FlightsOptions(out=out, backend="memory", limit=FIRST)
        stream_job.run(spark, options, stream_job.StreamOptions(file_rows=200, files_per_trigger=2))
        checkpoint = os.path.join(out, stream_job.STREAM_DIR, "checkpoint", "rotations")

        # 2. its state, as data: one row per aircraft and state
        state = read_state(spark, checkpoint)
        state.printSchema()
        rows = state.filter(state.state == "previous").toPandas()
        previous = [pickle.loads(blob) for blob in rows["value_pickle"]]
        print(f"aircraft in the rotations state: {len(rows)}")
        last_dest = pd.Series([leg[2] for leg in previous]).value_counts()
        print("where they landed last:", ", ".join(f"{d} {n}" for d, n in last_dest.head(3).items()))

        # 3. a new query over the next departures, its state bootstrapped from that
        initial = spark.createDataFrame(
            pd.DataFrame({
                "aircraft": rows["key"],
                "event_time": [leg[0] for leg in previous],
                "origin": [leg[1] for leg in previous],
                "dest": [leg[2] for leg in previous],
                "arr_delay": [leg[3] for leg in previous],
            }),
            "aircraft string, event_time double, origin string, dest string, arr_delay double",
        )  # fmt: skip
        later = bootstrapped_run(spark, out, initial)
        known = later.dropna(subset=["prev_dest"])
        print(f"next {NEXT} departures: {len(later)} rotations, {len(known)} with a previous leg")
        seeded = set(rows["key"])
        from_checkpoint = known[known["tailnum"].isin(seeded)].groupby("tailnum").head(1)
        print(f"first flights whose previous leg came from the checkpoint: {len(from_checkpoint)}")


def bootstrapped_run(spark: SparkSession, out: str, initial: DataFrame) -> pd.DataFrame:
    """``SeededRotations`` over departures ``FIRST .. FIRST + NEXT``; its main output."""
    every = flights_data.load(FIRST + NEXT)
    table = flights_data.in_arrival_order(every[every["row"] >= FIRST])
    source = os.path.join(out, "later")
    os.makedirs(source)
    # microseconds: Spark reads no nanosecond timestamps
    table.to_parquet(os.path.join(source, "part-0.parquet"), index=False, coerce_timestamps="us")
    frames: list[pd.DataFrame] = []
    query = process_keyed_stream(
        spark.readStream.schema(flights_data.SCHEMA).parquet(source),
        SeededRotations(),
        "aircraft",
        ROTATIONS_SCHEMA,
        checkpoint_location=os.path.join(out, "later-checkpoint"),
        sink=lambda batch, batch_id: frames.append(batch.toPandas()),
        timestamp="event_time",
        order_by=flights_data.ARRIVAL_ORDER,
        side_outputs={"no_tailnum": NO_TAILNUM_SCHEMA},
        num_partitions=2,
        initial_state=initial,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


if __name__ == "__main__":
    main()
