"""Key-group routing of rows to Spark partitions (Flink's ``KeyGroupRangeAssignment``).

Partition ``p`` of ``n`` owns the key groups ``key_group_range_for(max_parallelism,
n, p)``, so its state can be split or merged when ``n`` changes (rescaling). A
row goes to the partition owning its key's group:

1. ``tag`` (a ``mapInArrow`` pass) computes each row's key exactly as the operator
   will see it (``keys_of``: Arrow -> Python values), its key group
   (``aec.keygroups.key_group_for``: CRC-32 of a canonical byte form, the same in
   every process) and the owning partition ``p``; it adds ``__aec_partition = p``
   and ``__aec_route = route[p]``.
2. ``repartition(n, __aec_route)``: Spark's hash partitioning puts a row in
   ``pmod(hash(route), n)``, and ``route[p]`` is an int chosen (``route_values``,
   by asking Spark's own ``hash``) so that this is exactly ``p``. So Spark
   partition ``p`` holds the rows of aec partition ``p``, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.compute as pc  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from aec.keygroups import key_group_for, operator_index_for

PARTITION = "__aec_partition"
ROUTE = "__aec_route"

_ROUTES: dict[int, list[int]] = {}  # n -> route values, per driver process


def keys_of(batch: pa.RecordBatch, keys: list[str]) -> list[Any]:
    """The record keys of ``batch``: one column's values, or tuples of several (as
    ``PartitionJob.feed`` builds them for the operator). A ``timestamp`` key column
    gives aware datetimes in UTC: Spark hands them over in the session time zone,
    where the two instants of a DST fall-back hour have the same wall time (Python
    compares them equal, and neither has a stable key form)."""
    if len(keys) == 1:
        return _key_values(batch.column(keys[0]))
    return list(zip(*(_key_values(batch.column(k)) for k in keys), strict=True))


def _key_values(column: pa.Array) -> list[Any]:
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.tz is not None and kind.tz != "UTC":
        column = column.cast(pa.timestamp(kind.unit, tz="UTC"))  # the same instants
    return column.to_pylist()


def route_values(spark: Any, partitions: int) -> list[int]:
    """For each ``p < partitions`` an int ``v`` with ``pmod(hash(v), partitions) == p``
    (Spark's ``HashPartitioning`` of ``repartition(partitions, col)``), found by
    evaluating Spark's ``hash`` on the driver once per ``partitions``."""
    cached = _ROUTES.get(partitions)
    if cached is not None:
        return cached
    limit = 64 * partitions + 4096
    value = F.col("id").cast("int")
    rows = (
        spark.range(0, limit)
        .select(value.alias("v"), F.pmod(F.hash(value), F.lit(partitions)).alias("p"))
        .groupBy("p")
        .agg(F.min("v").alias("v"))
        .collect()
    )
    found = {row["p"]: row["v"] for row in rows}
    if len(found) != partitions:  # cannot happen for murmur3 over thousands of ints
        raise RuntimeError(f"no route value for some of {partitions} partitions")
    _ROUTES[partitions] = [found[p] for p in range(partitions)]
    return _ROUTES[partitions]


@dataclass(frozen=True)
class Tagger:
    """The ``mapInArrow`` function of step 1 (picklable)."""

    keys: list[str]
    max_parallelism: int
    routes: list[int]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        mp, n, routes = self.max_parallelism, len(self.routes), self.routes
        for batch in batches:
            owners = [
                operator_index_for(key_group_for(key, mp), mp, n)
                for key in keys_of(batch, self.keys)
            ]
            yield batch.append_column(PARTITION, pa.array(owners, pa.int32())).append_column(
                ROUTE, pa.array([routes[p] for p in owners], pa.int32())
            )


def tag(df: DataFrame, keys: list[str], max_parallelism: int, partitions: int) -> DataFrame:
    """``df`` with ``__aec_partition`` and ``__aec_route`` (see the module doc)."""
    schema = T.StructType(
        [
            *df.schema.fields,
            T.StructField(PARTITION, T.IntegerType(), False),
            T.StructField(ROUTE, T.IntegerType(), False),
        ]
    )
    routes = route_values(df.sparkSession, partitions)
    return df.mapInArrow(Tagger(list(keys), max_parallelism, routes), schema)


def partition_of(batch: pa.RecordBatch) -> int:
    """The aec partition of a routed batch's rows (its first row's)."""
    return int(batch.column(PARTITION)[0].as_py())


def untagged(batch: pa.RecordBatch, partition: int) -> pa.RecordBatch:
    """``batch`` without the routing columns, after checking every row belongs to
    ``partition`` (the rows of one task must be one state partition).

    Raises RuntimeError naming the partitions found otherwise.
    """
    column = batch.column(PARTITION)
    if len(column) and not pc.all(pc.equal(column, partition)).as_py():
        raise RuntimeError(
            f"rows of state partitions {sorted(set(column.to_pylist()))} reached the task of "
            f"partition {partition}: the rows were not routed by key group as planned"
        )
    return batch.drop_columns([PARTITION, ROUTE])

