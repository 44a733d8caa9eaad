"""``process_keyed``: run a ``KeyedProcessFunction`` over a Spark DataFrame.

Plan (batch): ``repartition`` by the key columns (every row of a key lands in one
partition), ``sortWithinPartitions`` by the arrival order, then ``mapInArrow``
runs one ``aec.KeyedProcessOperator`` per partition. The function travels to
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
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
import pyarrow as pa
from pyspark import StorageLevel, TaskContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import aec
from aec.config import AecConfig
from aec.elements import Record, Watermark
from aec.state.backend import BackendSpec, StateBackend
from aec.state.memory import MemoryBackend
from spark_glue.convert import (
    arrow_schema,
    encode_columns,
    rows_as_dicts,
    struct_type,
    timestamp_seconds,
)
from spark_glue.watermarks import BoundedOutOfOrderness, delay_seconds

_STREAM = "__aec_stream"
_METRICS = "__aec_metrics"
_POSITION = "__aec_position"
_RESERVED = "__aec"
_TIME_TYPES = (T.TimestampType, T.TimestampNTZType, T.DateType, T.NumericType)

SchemaLike = T.StructType | str
OrderLike = str | Column | Sequence[str | Column]


@dataclass(frozen=True)
class _Layout:
    """Where each stream lives in the raw frame; travels to the executors."""

    main: T.StructType
    sides: dict[str, tuple[int, T.StructType]]  # tag -> (index, schema)
    raw: T.StructType

    @staticmethod
    def build(main: T.StructType, sides: dict[str, T.StructType]) -> _Layout:
        fields = [T.StructField(_STREAM, T.StringType()), T.StructField(_METRICS, T.StringType())]
        fields += [T.StructField(f.name, f.dataType, True, f.metadata) for f in main.fields]
        numbered: dict[str, tuple[int, T.StructType]] = {}
        for index, (tag, schema) in enumerate(sides.items()):
            numbered[tag] = (index, schema)
            fields += [
                T.StructField(_side_column(index, f.name), f.dataType) for f in schema.fields
            ]
        return _Layout(main, numbered, T.StructType(fields))


@dataclass(frozen=True)
class _Output:
    """What ``side_output`` and ``partition_metrics`` need from a result."""

    raw: DataFrame
    layout: _Layout


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
        key: the key column, or several (the key is then a tuple of their values).
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
            ``spark.sql.shuffle.partitions`` (adaptive execution may coalesce them).
        side_outputs: ``{tag: schema}`` for ``ctx.side_output(tag, value)``; a tag
            not declared here fails the job.

    Returns:
        The main output as a DataFrame with ``output_schema``'s columns (lazy;
        the operator runs on the first action). Side outputs:
        ``side_output(result, tag)``; per-partition engine metrics:
        ``partition_metrics(result)``.

    Raises:
        TypeError / ValueError on the driver for bad arguments (unknown column,
        non-time timestamp column, unpicklable function, reserved column name).
        At run time a failing partition fails the Spark job; the error Spark
        raises on the driver carries the ``aec.JobFailure`` message (key and record).
    """
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
    )
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
) -> PartitionJob:
    """Validate the arguments on the driver (see ``process_keyed``); the job to ship."""
    keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise ValueError(f"{name} needs at least one key column")
    columns = df.columns
    for column in [*keys, *([timestamp] if timestamp else [])]:
        if column not in columns:
            raise ValueError(f"column {column!r} is not in the DataFrame (columns: {columns})")
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
    return PartitionJob(
        function_bytes=function_bytes,
        spec=spec,
        config=config,
        keys=keys,
        timestamp=timestamp,
        delay=delay,
        interval=watermark_interval,
        layout=_Layout.build(main, sides),
    )


def arrange(
    df: DataFrame,
    keys: list[str],
    order_by: OrderLike | None,
    num_partitions: int | None,
    extra: Mapping[str, Column] | None = None,
) -> DataFrame:
    """``df`` repartitioned by ``keys`` and sorted within partitions by the arrival
    order (``order_by``, or ``df``'s row order); ``extra`` columns are added before
    the shuffle."""
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
    arranged = shuffled.sortWithinPartitions(*order)
    if order_by is None:
        arranged = arranged.drop(_POSITION)
    return arranged


def persisted_result(mapped: DataFrame, layout: _Layout) -> DataFrame:
    """The main output of a raw frame (persisted here), carrying what ``side_output``
    and ``partition_metrics`` need."""
    raw = mapped.persist(StorageLevel.MEMORY_AND_DISK)
    main = layout.main
    result = raw.filter(F.col(_STREAM) == "main").select(*[F.col(n) for n in main.fieldNames()])
    result._aec_output = _Output(raw, layout)  # read back by side_output / partition_metrics
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
        *[F.col(_side_column(index, n)).alias(n) for n in schema.fieldNames()]
    )


def partition_metrics(result: DataFrame) -> DataFrame:
    """One row per partition: ``partition`` plus the operator's metrics.

    Columns: ``partition``, the engine's ``op.metrics`` keys (``records_in``,
    ``records_out``, ``max_in_flight``, ``batches``, ``requests``,
    ``max_batch_size``, ``mean_batch_size``, ``blocked_requests``,
    ``elapsed_s``, ...) and the glue's own: ``rows_in``, ``watermarks_in``
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
    output = getattr(result, "_aec_output", None)
    if not isinstance(output, _Output):
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


def _side_column(index: int, name: str) -> str:
    return f"{_RESERVED}_s{index}_{name}"


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


@dataclass(frozen=True)
class PartitionJob:
    """Everything one partition needs; pickled into the ``mapInArrow`` closure."""

    function_bytes: bytes
    spec: BackendSpec
    config: AecConfig
    keys: list[str]
    timestamp: str | None
    delay: float
    interval: int
    layout: _Layout

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function of ``process_keyed``: input batches in, raw
        batches out; end of input is ``finish()`` (every remaining timer fires)."""
        context = TaskContext.get()
        with PartitionRun(self, context.partitionId() if context is not None else 0) as run:
            run.operator.open()
            for batch in batches:
                yield from run.feed(batch)
            run.operator.finish()
            yield from run.drain()
        yield run.metrics_batch()

    def _feed(
        self, operator: Any, watermarks: BoundedOutOfOrderness, batch: pa.RecordBatch
    ) -> None:
        if len(self.keys) == 1:
            keys = batch.column(self.keys[0]).to_pylist()
        else:
            keys = list(zip(*(batch.column(k).to_pylist() for k in self.keys), strict=True))
        values = batch.to_pylist()
        if self.timestamp is None:
            for key, value in zip(keys, values, strict=True):
                operator.process(Record(key, value))
            return
        stamps = timestamp_seconds(batch.column(self.timestamp))
        for key, value, stamp in zip(keys, values, stamps, strict=True):
            operator.process(Record(key, value, stamp))
            mark = watermarks.on_record(stamp)
            if mark is not None:
                operator.process_watermark(Watermark(mark))


class PartitionRun:
    """One partition's operator with its backend, watermark generator and writer.

    A context manager: entering builds the backend from the job's spec and the
    operator (not opened: the caller opens, or restores, it); leaving closes the
    operator, then the backend (the operator leaves closing its backend to the
    owner). ``feed`` and ``drain`` yield raw batches; ``metrics_batch`` the
    partition's metrics row, with ``extra`` entries.
    """

    def __init__(self, job: PartitionJob, partition: int) -> None:
        self.job = job
        self.partition = partition
        self.started = time.perf_counter()
        self.writer = _RawWriter(job.layout)
        self.watermarks = BoundedOutOfOrderness(job.delay, job.interval)
        self.rows_in = 0
        self.backend: StateBackend | None = None
        self.operator: Any = None
        self.final_metrics: dict[str, Any] = {}

    def __enter__(self) -> PartitionRun:
        self.backend = self.job.spec.build(self.partition)
        try:
            self.operator = aec.KeyedProcessOperator(
                cloudpickle.loads(self.job.function_bytes), self.backend, self.job.config
            )
        except BaseException:
            self.backend.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.final_metrics = dict(self.operator.metrics)
        try:
            self.operator.close()
        finally:
            self.backend.close()

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Process one input batch (records and periodic watermarks); its outputs."""
        self.rows_in += batch.num_rows
        self.job._feed(self.operator, self.watermarks, batch)
        yield from self.writer.drain(self.operator)

    def drain(self) -> Iterator[pa.RecordBatch]:
        """Raw batches for everything emitted since the last drain."""
        yield from self.writer.drain(self.operator)

    def metrics_batch(self, **extra: Any) -> pa.RecordBatch:
        """The metrics row; call after leaving the context."""
        metrics = dict(self.final_metrics)
        metrics.update(
            partition=self.partition,
            rows_in=self.rows_in,
            watermarks_in=self.watermarks.emitted,
            main_rows=self.writer.main_rows,
            side_rows=self.writer.side_rows,
            wall_s=time.perf_counter() - self.started,
            **extra,
        )
        return self.writer.metrics_batch(metrics)


class _RawWriter:
    """Turns an operator's drained outputs into raw-frame batches."""

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        self.target = arrow_schema(layout.raw)
        self.main_rows = 0
        self.side_rows = 0

    def drain(self, operator: Any) -> Iterator[pa.RecordBatch]:
        """Batches for everything the operator emitted since the last drain."""
        values = [v for v in operator.drain_outputs() if not isinstance(v, Watermark)]
        if values:
            self.main_rows += len(values)
            yield self._batch("main", self.layout.main, values, 2)
        for tag, side_values in operator.drain_side_outputs().items():
            if not side_values:
                continue
            if tag not in self.layout.sides:
                raise ValueError(
                    f"side output {tag!r} is not declared in process_keyed(side_outputs=...); "
                    f"declared: {sorted(self.layout.sides)}"
                )
            index, schema = self.layout.sides[tag]
            self.side_rows += len(side_values)
            yield self._batch(f"side:{tag}", schema, side_values, self._offset(index))

    def metrics_batch(self, metrics: dict[str, Any]) -> pa.RecordBatch:
        """The partition's single metrics row."""
        columns: list[pa.Array] = [
            pa.array(["metrics"], pa.string()),
            pa.array([json.dumps(metrics, default=str)], pa.string()),
        ]
        columns += [pa.nulls(1, f.type) for f in list(self.target)[2:]]
        return pa.RecordBatch.from_arrays(columns, schema=self.target)

    def _offset(self, index: int) -> int:
        offset = 2 + len(self.layout.main.fields)
        for _, (other, schema) in self.layout.sides.items():
            if other < index:
                offset += len(schema.fields)
        return offset

    def _batch(
        self, stream: str, schema: T.StructType, values: list[Any], offset: int
    ) -> pa.RecordBatch:
        width = len(schema.fields)
        target = pa.schema(list(self.target)[offset : offset + width])
        try:
            encoded = encode_columns(rows_as_dicts(values, schema), schema, target)
        except TypeError as exc:
            where = "main output" if stream == "main" else f"side output {stream[5:]!r}"
            raise TypeError(f"{where} does not fit its schema: {exc}") from None
        rows = len(values)
        columns: list[pa.Array] = [
            pa.array([stream] * rows, pa.string()),
            pa.nulls(rows, pa.string()),
        ]
        for position, field in enumerate(list(self.target)[2:], start=2):
            if offset <= position < offset + width:
                columns.append(encoded[position - offset])
            else:
                columns.append(pa.nulls(rows, field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.target)
