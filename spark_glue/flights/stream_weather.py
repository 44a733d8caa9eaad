"""The weather join in ``aec flights --stream``: ``flights_weather`` through
``process_keyed_co_stream``, the flights and the weather arriving as two file streams.

The weather is cut into files along the flights' files: weather file ``k`` holds the
observations from just after the arrival time of flights file ``k - 1``'s last row
up to that of file ``k``'s (the first from the beginning, the last to the end), so
with the same ``maxFilesPerTrigger`` on both sources a micro-batch holds the flights
and the observations of the same stretch of time. The end-of-input file holds one
marker observation per airport at ``END_TIME`` (``row`` < 0), beside the flights'
markers: both inputs' watermarks pass every cleanup time, and ``UntilEndOfInputCo``
drops the markers before the join sees them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame, SparkSession

from aec import AecConfig, KeyedCoProcessFunction
from spark_glue.convert import arrow_schema
from spark_glue.flights import data as flights_data
from spark_glue.flights import weather as flights_weather
from spark_glue.keyed import partition_metrics, side_output
from spark_glue.stream_co import process_keyed_co_stream

DATASETS = (flights_weather.FLIGHTS_WEATHER, flights_weather.LATE_FLIGHTS, flights_weather.LATE_WEATHER)


class UntilEndOfInputCo(KeyedCoProcessFunction):
    """``function`` on every record of both inputs but the end-of-input markers
    (``row`` < 0), which only move the watermarks."""

    def __init__(self, function: KeyedCoProcessFunction) -> None:
        self.function = function

    def open(self, ctx: Any) -> None:
        self.function.open(ctx)

    def process_element1(self, value: dict[str, Any], ctx: Any) -> Any:
        return None if value["row"] < 0 else self.function.process_element1(value, ctx)

    def process_element2(self, value: dict[str, Any], ctx: Any) -> Any:
        return None if value["row"] < 0 else self.function.process_element2(value, ctx)

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        return self.function.on_timer(timestamp, ctx)

    def close(self) -> None:
        self.function.close()

    def check_restore(self, state_names: list[str]) -> None:
        self.function.check_restore(state_names)  # type: ignore[attr-defined]

    def metric_counters(self) -> dict[str, int]:
        return self.function.metric_counters()  # type: ignore[attr-defined, no-any-return]


def write_files(
    prepared: pd.DataFrame, weather: pd.DataFrame, directory: str, file_rows: int, end_time: Any
) -> list[str]:
    """The weather files beside the flights files of ``stream_job.write_files`` (same
    names, same modification times; see the module doc)."""
    os.makedirs(directory)
    ordered = flights_data.in_arrival_order(prepared)
    bounds = [ordered["arrival_time"].iloc[min(i + file_rows, len(ordered)) - 1]
              for i in range(0, len(ordered), file_rows)]  # fmt: skip
    observations = weather.sort_values(["obs_time", "row"], kind="stable")
    times = observations["obs_time"]
    slices = []
    for index, bound in enumerate(bounds):
        keep = pd.Series(True, index=observations.index)
        if index > 0:
            keep &= times > bounds[index - 1]
        if index < len(bounds) - 1:
            keep &= times <= bound
        slices.append(observations[keep])
    origins = sorted(set(prepared["origin"]) | set(weather["origin"]))
    markers = pd.DataFrame(
        {"row": [-(i + 1) for i in range(len(origins))], "origin": origins,
         "obs_time": end_time, "temp": None, "wind_speed": None, "precip": None, "visib": None}
    )  # fmt: skip
    schema = arrow_schema(flights_weather.WEATHER_SCHEMA)
    names = []
    first_mtime = time.time() - len(slices) - 10  # the flights files' times
    for index, frame in enumerate([*slices, markers]):
        name = f"part-{index:06d}.parquet"
        path = os.path.join(directory, name)
        table = pa.Table.from_pandas(
            frame[flights_weather.WEATHER_SCHEMA.fieldNames()], schema=schema, preserve_index=False
        )
        pq.write_table(table, path)
        os.utime(path, (first_mtime + index, first_mtime + index))
        names.append(name)
    return names


def run_query(
    spark: SparkSession,
    root: str,
    out: str,
    options: Any,
    stream: Any,
    partitions: int,
    backend: Any,
    write_batch: Callable[[str, int, DataFrame], None],
    on_batch: Callable[[pd.DataFrame], None],
    on_metrics: Callable[[int, dict[str, Any]], Any] | None = None,
) -> None:
    """Run the join over everything in ``root/input`` and ``root/input-weather``
    (``availableNow``); each micro-batch's three datasets go through ``write_batch``,
    its partition metrics to ``on_batch``, its merged metrics to ``on_metrics``
    (``process_keyed_co_stream``'s ``metrics_listener``)."""
    flights = (
        spark.readStream.schema(flights_data.SCHEMA)
        .option("maxFilesPerTrigger", stream.files_per_trigger)
        .parquet(os.path.join(root, "input"))
        .select(*flights_weather.FLIGHT_FIELDS)
    )
    weather = (
        spark.readStream.schema(flights_weather.WEATHER_SCHEMA)
        .option("maxFilesPerTrigger", stream.files_per_trigger)
        .parquet(os.path.join(root, "input-weather"))
    )

    def sink(batch_df: DataFrame, batch_id: int) -> None:
        write_batch(os.path.join(out, DATASETS[0]), batch_id, batch_df)
        for tag in DATASETS[1:]:
            write_batch(os.path.join(out, tag), batch_id, side_output(batch_df, tag))
        on_batch(partition_metrics(batch_df).toPandas())

    query = process_keyed_co_stream(
        flights, weather, UntilEndOfInputCo(flights_weather.flights_weather()), "origin",
        flights_weather.FLIGHTS_WEATHER_SCHEMA,
        checkpoint_location=os.path.join(root, "checkpoint", DATASETS[0]), sink=sink,
        timestamp=("event_time", "obs_time"), watermark_delay=options.watermark_delay,
        order_by=("arrival_time", "obs_time"),
        watermark_interval=flights_weather.WATERMARK_INTERVAL, backend=backend,
        config=AecConfig(async_state=not options.sync), num_partitions=partitions,
        side_outputs={
            flights_weather.LATE_FLIGHTS: flights_weather.LATE_FLIGHTS_SCHEMA,
            flights_weather.LATE_WEATHER: flights_weather.LATE_WEATHER_SCHEMA,
        },
        trigger={"availableNow": True}, metrics_listener=on_metrics,
    )  # fmt: skip
    query.awaitTermination()
