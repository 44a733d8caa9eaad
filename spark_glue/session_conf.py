"""What the glue reads from a SparkSession, the same way on a classic and a Connect session.

A Spark Connect session (``SparkSession.builder.remote("sc://host:port")``) has no
``sparkContext``, no RDDs and no JVM gateway: everything the glue needs from the
session goes through the DataFrame API and ``spark.conf`` (which on a classic
session also holds the ``SparkConf`` entries the session started with, such as
``spark.master`` and ``spark.speculation``). These helpers are that one path.
"""

from __future__ import annotations

from typing import Any

# Settings the glue reads from ``spark.conf`` (set them with ``spark.conf.set`` or
# ``--conf``); documented in docs/cluster.md.
SHIP_PACKAGE = "spark.aec.shipPackage"  # "true": ship aec to workers that lack it


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def conf_value(spark: Any, key: str, default: str | None = None) -> str | None:
    """``spark.conf.get(key, default)``: a runtime, static or Spark conf value as text."""
    value = spark.conf.get(key, default)
    return None if value is None else str(value)


def conf_flag(spark: Any, key: str, default: bool = False) -> bool:
    """A boolean setting (``"true"``/``"false"``, any case).

    Raises:
        ValueError: a value that is neither (names the key).
    """
    text = conf_value(spark, key, "true" if default else "false")
    value = (text or "").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{key} must be true or false, got {text!r}")
    return value == "true"


def master_of(spark: Any) -> str:
    """The session's master URL (``spark.master``; "" when the server hides it)."""
    return conf_value(spark, "spark.master", "") or ""


def runs_on_one_machine(spark: Any) -> bool:
    """Whether every executor runs on the driver's machine (``local[...]`` or
    ``local-cluster[...]``): only then is a local path the same directory for all."""
    return master_of(spark).startswith("local")
