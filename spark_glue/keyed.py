"""``process_keyed``: run a ``KeyedProcessFunction`` over a Spark DataFrame.

Plan (batch): ``repartition`` by the key columns (Spark's hash partitioning: every
row of a key lands in one partition; ``process_keyed_stream`` routes by key group
instead, because its state outlives a run), ``sortWithinPartitions`` by the arrival
order, then ``mapInArrow`` runs one ``aec.KeyedProcessOperator`` per partition. The
function travels to
the executors as cloudpickle bytes (pickled once on the driver, so an
unpicklable function fails there); each partition unpickles its own copy, builds
its own backend from the backend's picklable spec (``spec().build(partition)``)
and makes its state handles in ``open()``.

Side outputs and metrics (design decision). ``mapInArrow`` returns one frame,
so every partition writes a *raw* frame that carries all streams:

* ``__aec_stream`` (string): ``"main"``, ``"side:<tag>"`` or ``"metrics"``;
* ``__aec_metrics`` (string): a JSON object, only on the one metrics row each
  partition writes at its end;
* the main output's columns, under their own names;
* each declared side output's columns as ``__aec_s<i>_<name>`` (``i``: the
  tag's position in ``side_outputs``).

Columns that do not belong to a row's stream are null. The raw frame is
persisted (``MEMORY_AND_DISK``), so the operator runs once however many of the
streams are read; the main DataFrame, ``side_output(result, tag)`` and
``partition_metrics(result)`` are filters and projections of it. Free it with
``unpersist(result)``. A recomputation (evicted cache block, retried task) runs
the partition again from empty state, which yields the same rows: the input
order within a partition is fixed by the sort.

Shared with ``spark_glue.stream`` (``process_keyed_stream``, one run per
micro-batch): ``plan_job`` (argument checks on the driver, the shipped
``PartitionJob``), ``arrange`` (shuffle and sort), ``persisted_result`` (the persisted raw
frame behind the main output) and ``PartitionRun`` (one partition's backend,
operator, watermark generator and writer; the caller decides how the operator
starts and ends: ``open``/``finish`` here, ``restore``/``snapshot`` there).
"""

from __future__ import annotations

import datetime as dt
import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # cloudpickle ships no type hints
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from aec.config import AecConfig
from aec.functions import KeyedProcessFunction, check_function_kind
from aec.state.backend import BackendSpec, StateBackend
from aec.state.memory import MemoryBackend
from spark_glue.convert import (
    struct_type,
)
from spark_glue.partition import PartitionJob
from spark_glue.raw_frame import _METRICS, _RESERVED, _STREAM, RawLayout, side_column
from spark_glue.watermarks import BoundedOutOfOrderness, delay_seconds
from spark_glue.workers import ensure_workers

_POSITION = "__aec_position"
_TIME_TYPES = (T.TimestampType, T.TimestampNTZType, T.DateType, T.NumericType)

SchemaLike = T.StructType | str
OrderLike = str | Column | Sequence[str | Column]


@dataclass(frozen=True)
class _Output:
    """What ``side_output`` and ``partition_metrics`` need from a result."""

    raw: DataFrame
    layout: RawLayout


# The results process_keyed returned, with their raw frames (Spark's DataFrame has no
# place for them; a result's entry goes when the result does).
_OUTPUTS: weakref.WeakKeyDictionary[DataFrame, _Output] = weakref.WeakKeyDictionary()


def process_keyed(
    df: DataFrame,
    function: Any,
    key: str | Sequence[str],
    output_schema: SchemaLike,
    timestamp: str | None = None,
    watermark_delay: float | dt.timedelta | None = None,
    order_by: OrderLike | None = None,
    watermark_interval: int = 1000,
    backend: StateBackend | BackendSpec | None = None,
    config: AecConfig | None = None,
    num_partitions: int | None = None,
    side_outputs: Mapping[str, SchemaLike] | None = None,
) -> DataFrame:
    """Run ``function`` (an ``aec.KeyedProcessFunction``) per key over ``df``.

    Args:
        df: the input; each row reaches ``process_element`` as a dict
            ``{column: Python value}`` of all of ``df``'s columns (timestamps as
            ``datetime``, dates as ``date``).
        function: the user function; cloudpickled to the executors.
        key: the key column, or several (the key is then a tuple of their values);
            a ``timestamp`` key is an aware datetime in UTC whatever the session time zone.
            A null key fails the job (``TypeError``): filter or ``coalesce`` first.
        output_schema: ``StructType`` or DDL string of the main output. The function
            emits dicts (missing fields are null) or tuples in field order;
            see ``spark_glue.convert.encode_columns`` for the coercions.
        timestamp: event-time column: numeric (seconds since the epoch),
            timestamp or timestamp_ntz (naive read as UTC), or date. Becomes
            ``ctx.timestamp`` in float seconds (None for a null). None: no event
            time and no watermarks but the final one (``watermark_delay`` must then
            be None too).
        watermark_delay: bounded out-of-orderness, seconds or a ``timedelta``
            (default 0). Every ``watermark_interval`` records a partition emits
            ``Watermark(max event time seen - watermark_delay)`` unless that does
            not advance; end of input then fires every remaining timer
            (``Watermark(inf)``).
        order_by: the arrival order inside each partition (columns or Columns,
            ``sortWithinPartitions``). None: the order of ``df``'s rows
            (tagged with ``monotonically_increasing_id`` before the shuffle).
        watermark_interval: records between watermarks, >= 1.
        backend: a ``StateBackend`` (its ``spec()`` is shipped, never the instance)
            or a ``BackendSpec``; None: ``MemoryBackend``. Each partition builds its own.
        config: ``aec.AecConfig``; None: defaults.
        num_partitions: partitions (and operators) to run; None: Spark's
            ``spark.sql.shuffle.partitions``. Rows are placed by Spark's hash
            partitioning of the key columns.
        side_outputs: ``{tag: schema}`` for ``ctx.side_output(tag, value)``; a tag
            not declared here fails the job.

    Returns:
        The main output as a DataFrame with ``output_schema``'s columns (lazy;
        the operator runs on the first action). Side outputs:
        ``side_output(result, tag)``; per-partition engine metrics:
        ``partition_metrics(result)``.

    Raises:
        TypeError, ValueError: on the driver, for bad arguments (a function that is
            not a ``KeyedProcessFunction``, unknown column, non-time timestamp column,
            a key column of a type that cannot key state (struct, array, map,
            interval), unpicklable function, a reserved column name (``__aec``...) in
            the input or the output, an input column name with a dot: PySpark's
            ``mapInArrow`` would read it as a struct field).
        spark_glue.WorkerEnvironmentError: before any job, when the session's Python
            workers cannot import aec (``spark_glue.workers``: the message names the
            interpreter, the missing modules and the fixes).
            At run time a failing partition fails the Spark job; the error Spark
            raises on the driver carries the ``aec.JobFailure`` message (key and record).
    """
    order_by = order_list(order_by)
    job = plan_job(
        df,
        function,
        key,
        output_schema,
        timestamp=timestamp,
        watermark_delay=watermark_delay,
        watermark_interval=watermark_interval,
        backend=backend,
        config=config,
        num_partitions=num_partitions,
        side_outputs=side_outputs,
        order_by=order_by,
    )
    # Batch keeps Spark's hash partitioning by key (where earlier versions placed records): which
    # records are late depends on each partition's watermark cadence, so the outputs
    # stay those of earlier versions. Key-group routing is for state that outlives the
    # job (process_keyed_stream), where a restart may change the partition count.
    arranged = arrange(df, job.keys, order_by, num_partitions)
    return persisted_result(arranged.mapInArrow(job.run, job.layout.raw), job.layout)


def plan_job(
    df: DataFrame,
    function: Any,
    key: str | Sequence[str],
    output_schema: SchemaLike,
    *,
    timestamp: str | None,
    watermark_delay: float | dt.timedelta | None,
    watermark_interval: int,
    backend: StateBackend | BackendSpec | None,
    config: AecConfig | None,
    num_partitions: int | None,
    side_outputs: Mapping[str, SchemaLike] | None,
    name: str = "process_keyed",
    function_class: type = KeyedProcessFunction,
    order_by: list[str | Column] | None = None,
    user_frame: bool = True,
) -> PartitionJob:
    """Validate the arguments on the driver (see ``process_keyed``); the job to ship.
    ``function_class``: what ``function`` must be (``KeyedCoProcessFunction`` for two
    inputs); ``user_frame``: ``df`` is the user's (False: a frame the glue built, whose
    ``__aec`` columns are its own)."""
    check_function_kind(function, function_class, name)
    keys = key_list(key)
    columns = df.columns
    if user_frame:
        check_not_reserved(columns, "the DataFrame")
        dotted = [c for c in columns if "." in c]
        if dotted:  # mapInArrow takes every column by its name, read as a path
            raise ValueError(
                f"column(s) {dotted}: Spark's mapInArrow reads a name with a dot as a struct "
                "field (or fails to find it); rename them (withColumnRenamed)"
            )
    named = [("key", column) for column in keys]
    named += [("timestamp", timestamp)] if timestamp is not None else []
    for role, column in named:  # exact names: the executors read them from Arrow
        if column not in columns:
            raise ValueError(
                f"{role} column {column!r} is not in the DataFrame (columns: {columns})"
            )
    check_key_types(df, keys)
    _check_order_names(df, order_by)
    if timestamp is not None:
        kind = df.schema[timestamp].dataType
        if not isinstance(kind, _TIME_TYPES):
            raise TypeError(
                f"timestamp column {timestamp!r} must be numeric seconds, timestamp, "
                f"timestamp_ntz or date, not {kind.simpleString()}"
            )
    if timestamp is None and watermark_delay is not None:
        raise ValueError(
            "watermark_delay needs a timestamp column: without one there are no watermarks"
        )
    delay = delay_seconds(watermark_delay)
    BoundedOutOfOrderness(delay, watermark_interval)  # validates the interval on the driver
    if num_partitions is not None and (
        isinstance(num_partitions, bool)
        or not isinstance(num_partitions, int)
        or num_partitions < 1
    ):
        raise ValueError(f"num_partitions must be an int >= 1, got {num_partitions!r}")
    config = config if config is not None else AecConfig()
    if not isinstance(config, AecConfig):
        raise TypeError(f"config must be an aec.AecConfig, got {type(config).__name__}")
    spec = _backend_spec(backend)
    main = struct_type(output_schema)
    sides = {str(tag): struct_type(s) for tag, s in (side_outputs or {}).items()}
    for field in main.fieldNames():
        if field.startswith(_RESERVED):
            raise ValueError(
                f"output column {field!r}: names starting with {_RESERVED!r} are reserved"
            )
    try:
        function_bytes = cloudpickle.dumps(function)
    except Exception as exc:
        raise TypeError(f"the function cannot be pickled for the executors: {exc}") from exc
    ensure_workers(df.sparkSession, name)  # before any job: the workers can run aec
    return PartitionJob(
        function_bytes=function_bytes,
        spec=spec,
        config=config,
        keys=keys,
        timestamp=timestamp,
        delay=delay,
        interval=watermark_interval,
        layout=RawLayout.build(main, sides),
    )


def key_list(key: object) -> list[str]:
    """``key`` (a column name or a sequence of names) as a list; TypeError naming the
    argument for another shape, ValueError for none."""
    keys = [key] if isinstance(key, str) else list(key) if isinstance(key, Sequence) else None
    if keys is None or not all(isinstance(k, str) for k in keys):
        raise TypeError(f"key takes a column name or a list of column names, got {key!r}")
    if not keys:
        raise ValueError("key needs at least one column name")
    return keys


def check_not_reserved(columns: Sequence[str], what: str) -> None:
    """ValueError naming the columns of ``what`` (input) whose names the glue reserves
    for its own columns (``__aec``...): they would be overwritten or ambiguous."""
    taken = [c for c in columns if c.startswith(_RESERVED)]
    if taken:
        raise ValueError(
            f"{what} has column(s) {taken}: names starting with {_RESERVED!r} are reserved "
            "for the engine's own columns; rename them"
        )


# Spark types whose values key state: hashable as Python values, one stable form each
# (``aec.keygroups``); a struct, array or map arrives as a dict or list, an interval as
# a timedelta, neither a key
_KEY_TYPES = (
    T.StringType, T.NumericType, T.BooleanType, T.BinaryType, T.DateType, T.TimestampType,
    T.TimestampNTZType,
)  # fmt: skip


def check_key_types(df: DataFrame, keys: Sequence[str], side: str = "") -> None:
    """TypeError naming a key column (of ``side``, if given) whose type cannot key
    state, before any job."""
    schema = df.schema
    for column in keys:
        kind = schema[column].dataType
        if not isinstance(kind, _KEY_TYPES):
            raise TypeError(
                f"key column {column!r}{side} is {kind.simpleString()}: a key column must be "
                "a string, number, boolean, binary, date or timestamp (a struct, array, map "
                "or interval cannot key state; key by its fields)"
            )


def exact(columns: Sequence[str], name: str) -> Column:
    """``name`` as a column of a frame with ``columns``: quoted when it is one of them
    (Spark would read ``"a.b"`` as field ``b`` of a struct ``a``), else as given (a
    nested field, another case: Spark's to resolve). For the frames the glue builds from
    the user's (two inputs); one input's dotted names are refused (``plan_job``)."""
    return F.col("`" + name.replace("`", "``") + "`" if name in columns else name)


def order_list(order_by: OrderLike | None) -> list[str | Column] | None:
    """``order_by`` as a list (made once: an iterator is read once), or None; TypeError
    for an entry that is neither a column name nor a ``Column``."""
    if order_by is None:
        return None
    if not isinstance(order_by, (str, Column, Iterable)):
        raise TypeError(f"order_by takes column names or Columns, got {order_by!r}")
    orders = [order_by] if isinstance(order_by, (str, Column)) else list(order_by)
    for order in orders:
        if not isinstance(order, (str, Column)):
            raise TypeError(f"order_by takes column names or Columns, got {order!r}")
    return orders


def _check_order_names(df: DataFrame, order_by: list[str | Column] | None) -> None:
    """ValueError naming an ``order_by`` column name (``order_list``'s) Spark cannot
    resolve on ``df`` (its analysis, no job: other cases, nested fields and hidden columns
    resolve as Spark resolves them; a ``Column`` is Spark's to resolve at the first
    action)."""
    for name in order_by or ():
        if not isinstance(name, str) or name in df.columns:
            continue
        try:
            df.select(name).schema  # noqa: B018  # analysis only (Connect: a round trip)
        except AnalysisException as exc:
            raise ValueError(
                f"order_by column {name!r} is not in the DataFrame (columns: {df.columns})"
            ) from exc


def arrange(
    df: DataFrame,
    keys: list[str],
    order_by: OrderLike | None,
    num_partitions: int | None,
    extra: Mapping[str, Column] | None = None,
    leading: Sequence[Column] = (),
) -> DataFrame:
    """``df`` repartitioned by ``keys`` and sorted within partitions by the arrival
    order (``order_by``, or ``df``'s row order) after the ``leading`` sort keys;
    ``extra`` columns are added before the shuffle."""
    ordered = df
    for column, value in (extra or {}).items():
        ordered = ordered.withColumn(column, value)
    if order_by is None:
        ordered = ordered.withColumn(_POSITION, F.monotonically_increasing_id())
        order: list[str | Column] = [_POSITION]
    else:
        order = [order_by] if isinstance(order_by, (str, Column)) else list(order_by)
    if num_partitions is None:
        shuffled = ordered.repartition(*keys)
    else:
        shuffled = ordered.repartition(num_partitions, *keys)
    arranged = shuffled.sortWithinPartitions(*leading, *order)
    if order_by is None:
        arranged = arranged.drop(_POSITION)
    return arranged


def persisted_result(mapped: DataFrame, layout: RawLayout) -> DataFrame:
    """The main output of a raw frame (persisted here), carrying what ``side_output``
    and ``partition_metrics`` need."""
    raw = mapped.persist(StorageLevel.MEMORY_AND_DISK)
    main = layout.main
    result = raw.filter(F.col(_STREAM) == "main").select(*[F.col(n) for n in main.fieldNames()])
    _OUTPUTS[result] = _Output(raw, layout)  # read back by side_output / partition_metrics
    return result


def side_output(result: DataFrame, tag: str) -> DataFrame:
    """The side output ``tag`` of a ``process_keyed`` result, with its declared schema.

    Raises:
        ValueError: ``result`` is not a ``process_keyed`` result (as returned, not a
            DataFrame derived from it) or ``tag`` was not declared.
    """
    output = output_of(result)
    if tag not in output.layout.sides:
        raise ValueError(
            f"side output {tag!r} was not declared; declared: {sorted(output.layout.sides)}"
        )
    index, schema = output.layout.sides[tag]
    return output.raw.filter(F.col(_STREAM) == f"side:{tag}").select(
        *[F.col(side_column(index, n)).alias(n) for n in schema.fieldNames()]
    )


def partition_metrics(result: DataFrame) -> DataFrame:
    """One row per partition: ``partition`` plus the operator's metrics.

    Columns: ``partition``, the engine's ``op.metrics`` keys (``records_in``,
    ``records_out``, ``max_in_flight``, ``batches``, ``requests``,
    ``max_batch_size``, ``mean_batch_size``, ``blocked_requests``,
    ``elapsed_s``: from the partition's first input batch, when its operator opens,
    to its end, ...) and the glue's own: ``rows_in``, ``watermarks_in``
    (periodic watermarks sent), ``main_rows``, ``side_rows`` (all tags),
    ``wall_s`` (the partition's time in the Python worker, conversions included).
    Runs the operator if the raw frame is not computed yet (a Spark action).
    """
    output = output_of(result)
    rows = output.raw.filter(F.col(_STREAM) == "metrics").select(_METRICS).collect()
    records = sorted((json.loads(row[0]) for row in rows), key=lambda m: m["partition"])
    spark = result.sparkSession
    if not records:
        return spark.createDataFrame([], "partition int")
    names = sorted({name for record in records for name in record} - {"partition"})
    fields = [T.StructField("partition", T.IntegerType(), False)]
    fields += [T.StructField(name, _metric_type(records, name)) for name in names]
    data = [tuple(record.get(f.name) for f in fields) for record in records]
    return spark.createDataFrame(data, T.StructType(fields))


def unpersist(result: DataFrame) -> None:
    """Drop the cached raw frame behind a ``process_keyed`` result."""
    output_of(result).raw.unpersist()


def output_of(result: DataFrame) -> _Output:
    try:
        output = _OUTPUTS.get(result)
    except TypeError:  # no weak reference to it: not a DataFrame at all
        output = None
    if output is None:
        raise ValueError(
            "not a process_keyed result: pass the DataFrame process_keyed returned "
            "(not one derived from it)"
        )
    return output


def _metric_type(records: list[dict[str, Any]], name: str) -> T.DataType:
    values = [r.get(name) for r in records if r.get(name) is not None]
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return T.LongType()
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return T.DoubleType()
    for record in records:  # anything else is shown as text
        if record.get(name) is not None:
            record[name] = str(record[name])
    return T.StringType()


def _backend_spec(backend: StateBackend | BackendSpec | None) -> BackendSpec:
    if backend is None:
        return MemoryBackend().spec()
    if isinstance(backend, BackendSpec):
        return backend
    if isinstance(backend, StateBackend):
        return backend.spec()
    raise TypeError(
        f"backend must be a backends.StateBackend or BackendSpec, got {type(backend).__name__}"
    )


