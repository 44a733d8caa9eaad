"""``write_keyed_co``: a two-input operator over two DataFrames, outputs to Parquet.

``process_keyed_co`` hands its outputs back to Spark as a persisted DataFrame; a
job that only writes them (the ``aec flights`` job's ``flights_weather``) pays
less with this: the same plan (``spark_glue.keyed_co``: the union frame, the
shuffle by key, the two-input arrival order) and one ``mapInArrow`` pass in which
each partition writes the main output and the side outputs as Parquet itself
(``spark_glue.keyed_parquet.run_pass``, ``spark_glue.parquet_out``). One Spark job.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame

from spark_glue.keyed_co import ColumnPair, arranged, plan_co
from spark_glue.keyed_parquet import KeyedOperator, PassMember, Written, check_outputs, run_pass


def write_keyed_co(
    left: DataFrame,
    right: DataFrame,
    operator: KeyedOperator,
    key: ColumnPair,
    timestamp: ColumnPair | None = None,
    watermark_delay: float | dt.timedelta | None = None,
    order_by: ColumnPair | None = None,
    watermark_interval: int = 1000,
    num_partitions: int | None = None,
) -> Written:
    """Run ``operator`` (its ``function`` an ``aec.KeyedCoProcessFunction``) over
    ``left`` (input 1) and ``right`` (input 2) and write its outputs.

    The arguments are ``process_keyed_co``'s; ``operator`` is a ``KeyedOperator`` as
    ``write_keyed`` takes it, except that ``columns`` and ``row_filter`` do not apply
    (select and filter each side before). Returns what was written.

    Raises:
        TypeError, ValueError: on the driver, as ``process_keyed_co`` and
            ``write_keyed``; ``columns`` or ``row_filter`` set.
    """
    if operator.columns is not None or operator.row_filter is not None:
        raise ValueError(
            f"{operator.name}: columns and row_filter do not apply to two inputs: select and "
            "filter each side's DataFrame instead"
        )
    directories = check_outputs([operator], [left, right])
    job, union, _ = plan_co(
        left, right, operator.function, key, operator.output_schema, timestamp=timestamp,
        watermark_delay=watermark_delay, order_by=order_by,
        watermark_interval=watermark_interval, backend=operator.backend,
        config=operator.config, num_partitions=num_partitions,
        side_outputs={tag: schema for tag, (schema, _) in operator.side_outputs.items()},
        name="write_keyed_co",
    )  # fmt: skip
    member = PassMember(operator.name, job, None, operator.paths())
    (written,) = run_pass(arranged(union, job.keys, num_partitions), [member], directories)
    return written
