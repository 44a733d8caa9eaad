"""Two DataFrames through one keyed two-input function: ``spark_glue.process_keyed_co``.

Needs ``pip install 'aec[spark]'`` and Java 17+. Run: ``python examples/spark_join.py``.

Orders (the left side, input 1) are paired with the payments (the right side, input 2)
of the same customer made within a minute after the order: an interval join,
``payment.ts`` in ``[order.ts, order.ts + 60]``. ``process_keyed_co`` shuffles both
DataFrames by the key into the same partitions and feeds each partition's operator in
the arrival order: each side in its ``order_by`` order (default: its timestamp), the two
merged by that value, ties left first. Each side gets its own watermarks (``max event
time - watermark_delay`` every ``watermark_interval`` of its records); the operator's is
their minimum. A record that arrives below it is late: here, to a side output.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from aec.joins import interval_join
from spark_glue import process_keyed_co, side_output, unpersist


def paid(order: dict[str, Any], payment: dict[str, Any]) -> dict[str, Any]:
    """One output row per (order, payment) pair."""
    return {
        "customer": order["customer"],
        "order_id": order["order_id"],
        "payment_id": payment["payment_id"],
        "seconds": payment["ts"] - order["ts"],
    }


def main() -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("aec-example-join")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    orders = spark.createDataFrame(
        [("ann", 1, 10.0, 10.0), ("bob", 2, 20.0, 20.0), ("ann", 3, 300.0, 300.0)],
        "customer string, order_id long, ts double, arrived double",
    )
    # payment 12 was made at 25 s but arrived at 400 s: behind the watermark by then
    payments = spark.createDataFrame(
        [("ann", 10, 40.0, 40.0), ("bob", 11, 95.0, 95.0), ("ann", 12, 25.0, 400.0),
         ("ann", 13, 330.0, 330.0)],
        "who string, payment_id long, ts double, arrived double",
    )  # fmt: skip
    join = interval_join(0, 60, paid, right_late_tag="late_payments")
    result = process_keyed_co(
        orders, payments, join, ("customer", "who"),
        "customer string, order_id long, payment_id long, seconds double",
        timestamp="ts", order_by="arrived", watermark_delay=30, watermark_interval=1,
        side_outputs={"late_payments": "who string, payment_id long, ts double, arrived double"},
    )  # fmt: skip
    for row in sorted(result.collect()):
        print(row.customer, row.order_id, row.payment_id, row.seconds)
    for row in side_output(result, "late_payments").collect():
        print("late:", row.who, row.payment_id)
    unpersist(result)


if __name__ == "__main__":
    main()
