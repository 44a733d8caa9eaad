"""A keyed function over Spark Connect: the thin client reaches Spark through a server.

Needs ``pip install 'aec[spark]'`` (it brings PySpark's Connect client: grpcio,
zstandard, ...) and Java 17+ for a local server. Run:
``python examples/spark_connect.py`` (starts a local Connect server for the run, on
PySpark's fixed port for ``remote("local[...]")``, 15002: a port in use fails the
start), or ``SPARK_REMOTE=sc://host:PORT python examples/spark_connect.py`` against a
running server, e.g. one started with ``$SPARK_HOME/sbin/start-connect-server.sh``
(``--conf spark.connect.grpc.binding.port=PORT``).

A Connect session has no ``sparkContext``; the glue needs none. Its Python workers
run on the server, with the server's interpreter: ``process_keyed`` first checks
that they can import aec and, if they cannot, fails before any job naming the two
fixes (install aec there, or ``spark.conf.set("spark.aec.shipPackage", "true")`` to
ship aec's own packages). Functions defined in ``__main__`` (this script, a
notebook) travel to the server by value; for a function in a module of your own,
ship the module too: ``spark.addArtifacts("mymodule.py", pyfile=True)``.
"""

from __future__ import annotations

import os
from typing import Any

import spark_glue  # noqa: F401  (before a local server starts: its workers get this Python)
from aec import Context, KeyedProcessFunction, RuntimeContext, ValueStateDescriptor
from spark_glue import process_keyed


class RunningTotal(KeyedProcessFunction):
    """Per account: the running total of its payments."""

    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    async def process_element(self, value: dict[str, Any], ctx: Context) -> None:
        total = await self.total.async_value() + value["amount"]
        await self.total.async_update(total)
        ctx.output({"account": ctx.current_key, "seq": value["seq"], "total": total})


def main() -> None:
    from pyspark.sql import SparkSession

    remote = os.environ.get("SPARK_REMOTE", "local[2]")
    builder = SparkSession.builder.remote(remote)
    if remote.startswith("local"):  # settings of the local server this run starts
        builder = builder.config("spark.ui.enabled", "false")
    spark = builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    try:
        payments = spark.createDataFrame(
            [("ann", 1, 10), ("bob", 2, 5), ("ann", 3, 7), ("bob", 4, 1), ("ann", 5, 3)],
            "account string, seq long, amount long",
        )
        totals = process_keyed(
            payments, RunningTotal(), "account", "account string, seq long, total long",
            order_by="seq",
        )  # fmt: skip
        print("session:", type(spark).__module__)
        for row in totals.orderBy("seq").collect():
            print(row["account"], row["seq"], row["total"])
    finally:
        spark.stop()


if __name__ in ("__main__", "aec_example"):
    main()
