"""bench_joins' Spark rows: the flights job's ``flights_weather`` as a stream through
``process_keyed_co_stream`` vs Spark's own stream-stream interval join of the same files.

The year (or its first ``limit`` rows) is cut into Parquet files in arrival order and
the weather into files along them (``spark_glue.flights.stream_job.write_files``,
``stream_weather.write_files``); both queries read both directories with
``maxFilesPerTrigger`` files per micro-batch (``availableNow``), a 24 h watermark delay
on both sides (so nothing is late and both give pandas' merge), and write Parquet.
Spark's join: ``withWatermark`` on each side (event times cast to ``timestamp``: Spark
watermarks take no ``timestamp_ntz``), ``origin`` equal and ``obs_time`` in
``[event_time - 1 h, event_time]``. Every run checks its rows against the other's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

FILE_ROWS = 5_000
FILES_PER_TRIGGER = 5
DELAY = 24 * 3600


def spark_variants(
    limit: int | None, scratch: Path
) -> list[tuple[str, int, Callable[[], dict[str, Any]]]]:
    """``(name, records, run)`` of both queries (a SparkSession is started here)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_glue  # noqa: F401  (sets PYSPARK_PYTHON)
    from aec import AecConfig
    from backends import MemoryBackend
    from spark_glue.flights import data as flights_data
    from spark_glue.flights import stream_job, stream_weather
    from spark_glue.flights import weather as flights_weather
    from spark_glue.stream_co import process_keyed_co_stream

    spark = (
        SparkSession.builder.master("local[2]").appName("bench_joins")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    prepared = flights_data.load(limit)
    weather = flights_weather.load_weather(prepared)
    files = scratch / "files"
    stream_job.write_files(prepared, str(files / "flights"), FILE_ROWS)
    stream_weather.write_files(
        prepared, weather, str(files / "weather"), FILE_ROWS, stream_job.END_TIME
    )
    records = len(prepared) + len(weather)
    columns = [c.split(" ")[0] for c in flights_weather.FLIGHTS_WEATHER_SCHEMA.split(", ")]
    outputs: dict[str, Path] = {}

    def streams() -> tuple[Any, Any]:
        flights = (spark.readStream.schema(flights_data.SCHEMA)
                   .option("maxFilesPerTrigger", FILES_PER_TRIGGER).parquet(str(files / "flights")))
        observations = (spark.readStream.schema(flights_weather.WEATHER_SCHEMA)
                        .option("maxFilesPerTrigger", FILES_PER_TRIGGER)
                        .parquet(str(files / "weather")))  # fmt: skip
        return flights, observations

    def fresh(name: str) -> Path:
        path = scratch / f"{name}-{uuid.uuid4().hex[:8]}"
        outputs[name] = path / "out"
        return path

    def aec_run() -> dict[str, Any]:
        root = fresh("aec")
        flights, observations = streams()

        def sink(batch_df: Any, batch_id: int) -> None:
            batch_df.write.mode("append").parquet(str(root / "out"))

        query = process_keyed_co_stream(
            flights.select(*flights_weather.FLIGHT_FIELDS), observations,
            stream_weather.UntilEndOfInputCo(flights_weather.flights_weather()), "origin",
            flights_weather.FLIGHTS_WEATHER_SCHEMA, checkpoint_location=str(root / "ckpt"),
            sink=sink, timestamp=("event_time", "obs_time"), watermark_delay=DELAY,
            order_by=("arrival_time", "obs_time"),
            watermark_interval=flights_weather.WATERMARK_INTERVAL, backend=MemoryBackend(),
            config=AecConfig(), num_partitions=2, trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()
        return check("aec")

    def spark_run() -> dict[str, Any]:
        root = fresh("spark")
        flights, observations = streams()
        left = (flights.filter("row >= 0")
                .withColumn("event_ts", F.col("event_time").cast("timestamp"))
                .withWatermark("event_ts", f"{DELAY} seconds").alias("f"))  # fmt: skip
        right = (observations.filter("row >= 0")
                 .withColumn("obs_ts", F.col("obs_time").cast("timestamp"))
                 .withWatermark("obs_ts", f"{DELAY} seconds").alias("w"))  # fmt: skip
        condition = F.expr(
            "f.origin = w.origin AND w.obs_ts >= f.event_ts - INTERVAL 1 HOUR "
            "AND w.obs_ts <= f.event_ts"
        )
        picked = [F.col(f"f.{c}") for c in columns[:7]] + [F.col(f"w.{c}") for c in columns[7:]]
        joined = left.join(right, condition).select(*picked)
        query = (joined.writeStream.format("parquet").option("path", str(root / "out"))
                 .option("checkpointLocation", str(root / "ckpt"))
                 .trigger(availableNow=True).start())  # fmt: skip
        query.awaitTermination()
        return check("spark")

    def check(name: str) -> dict[str, Any]:
        mine = _rows(outputs[name], columns)
        for other, path in outputs.items():
            if other != name and path.exists() and _rows(path, columns) != mine:
                raise AssertionError(f"{name} and {other} wrote different flights_weather rows")
        return {"rows": len(mine)}

    return [
        ("aec process_keyed_co_stream", records, aec_run),
        ("Spark stream-stream join", records, spark_run),
    ]


def _rows(path: Path, columns: list[str]) -> list[str]:
    frame = pd.read_parquet(path)[columns]
    for column in ("event_time", "obs_time"):  # Spark's side wrote them back as timestamps
        frame[column] = pd.to_datetime(frame[column]).dt.tz_localize(None)
    return sorted(repr(row) for row in frame.itertuples(index=False, name=None))

