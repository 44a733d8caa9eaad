"""A keyed function over a Spark DataFrame with ``spark_glue.process_keyed`` (batch).

Needs ``pip install 'aec[spark]'`` and Java 17+. Run: ``python examples/spark_batch.py``.

``process_keyed`` repartitions the DataFrame by key, sorts each partition by the
arrival order (``order_by``) and runs one aec operator per partition through
``mapInArrow``. Rows reach ``process_element`` as dicts; outputs are dicts (or
tuples) of ``output_schema``. Event time comes from ``timestamp`` (seconds, or a
timestamp column) with bounded-out-of-orderness watermarks; timers fire as the
watermark passes, and the last ones at the end of the input.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from aec import AecConfig, Context, KeyedProcessFunction, MapStateDescriptor, RuntimeContext
from spark_glue import process_keyed, side_output, unpersist

HOUR = 3600.0


class HourlyTotals(KeyedProcessFunction):
    """Per sensor: the sum of each hour's readings, emitted when the watermark passes
    the end of the hour (an event-time timer per hour). A reading whose hour has
    already been emitted goes to the side output ``"late"``."""

    def open(self, ctx: RuntimeContext) -> None:
        self.totals = ctx.get_state(MapStateDescriptor("totals"))  # hour start -> sum

    async def process_element(self, value: dict[str, Any], ctx: Context) -> None:
        assert ctx.timestamp is not None  # process_keyed(timestamp="t") sets it
        hour = ctx.timestamp - ctx.timestamp % HOUR
        if hour + HOUR <= ctx.timer_service.current_watermark():  # its hour has fired
            ctx.side_output("late", {"sensor": ctx.current_key, "t": value["t"]})
            return
        total = await self.totals.async_get(hour) or 0.0
        await self.totals.async_put(hour, total + value["reading"])
        ctx.timer_service.register_event_time_timer(hour + HOUR)

    async def on_timer(self, timestamp: float, ctx: Context) -> None:
        hour = timestamp - HOUR
        total = await self.totals.async_get(hour)
        ctx.output({"sensor": ctx.current_key, "hour_start": hour, "total": total})
        await self.totals.async_remove(hour)


def main() -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("aec-example-batch")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # readings: (sensor, seconds since the epoch, value); s1's last row is late
    rows = [("s1", 10.0, 1.0), ("s2", 20.0, 5.0), ("s1", 3000.0, 2.0),
            ("s1", 3700.0, 4.0), ("s2", 4000.0, 1.0), ("s1", 100.0, 8.0)]  # fmt: skip
    df = spark.createDataFrame(rows, "sensor string, t double, reading double")
    result = process_keyed(
        df,
        HourlyTotals(),
        key="sensor",
        output_schema="sensor string, hour_start double, total double",
        timestamp="t",
        watermark_delay=0.0,
        watermark_interval=1,  # a watermark after every row: tiny input
        config=AecConfig(),  # the in-memory backend per partition (the default)
        side_outputs={"late": "sensor string, t double"},
    )
    for row in result.orderBy("sensor", "hour_start").collect():
        print(row.sensor, row.hour_start, row.total)
    for row in side_output(result, "late").collect():  # the side output is a DataFrame too
        print("late:", row.sensor, row.t)
    unpersist(result)  # the operators' output is cached until then


if __name__ == "__main__":
    main()
