"""``process_keyed_co``: a ``KeyedCoProcessFunction`` over two Spark DataFrames.

Plan (batch, and per micro-batch in ``spark_glue.stream_co``): both sides become
one frame (``union_frame``) whose rows carry

* ``__aec_input``: 1 for a row of the left side (input 1), 2 for the right;
* ``__aec_k<i>``: the key columns, from each side's own key columns (the same type
  on both sides: Spark hashes a string and an int differently);
* ``__aec_order``: the side's arrival-order value (``order_by``, default its
  timestamp), comparable across sides;
* ``__aec_left`` / ``__aec_right``: the row's columns as a struct (null on the
  other side's rows).

``repartition`` by the key columns puts both sides' rows of a key in one partition;
``sortWithinPartitions(__aec_order, __aec_input, __aec_position)`` is the arrival
order the contract gives: each side in its order, the two merged by that value,
ties left first, then each side's row order (``__aec_position``,
``monotonically_increasing_id`` before the shuffle). One ``KeyedCoProcessOperator``
per partition (``CoPartitionJob``) reads the rows in that order, each side's values
from its struct (a dict of the side's columns, as ``process_keyed`` gives them),
with periodic bounded-out-of-orderness watermarks per input
(``InputWatermarks``: every ``watermark_interval`` records *of that input*, that
input's ``max event time - watermark_delay``). The operator's watermark is their
minimum (``aec.KeyedCoProcessOperator``). The result, side outputs and metrics are
``process_keyed``'s (``side_output``, ``partition_metrics``, ``unpersist``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from aec.config import AecConfig
from aec.elements import Watermark
from aec.functions import KeyedCoProcessFunction, check_function_kind
from aec.keygroups import KeyGroupRange
from aec.runtime.co_operator import KeyedCoProcessOperator
from aec.state.backend import BackendSpec, StateBackend
from spark_glue.convert import timestamp_seconds
from spark_glue.keyed import (
    _TIME_TYPES,
    SchemaLike,
    arrange,
    check_key_types,
    check_not_reserved,
    exact,
    persisted_result,
    plan_job,
)
from spark_glue.metrics import GaugeSamples
from spark_glue.partition import PartitionJob
from spark_glue.routing import keys_of
from spark_glue.watermarks import BoundedOutOfOrderness, delay_seconds

INPUT = "__aec_input"
ORDER = "__aec_order"
POSITION = "__aec_position"
LEFT = "__aec_left"
RIGHT = "__aec_right"
SIDES = ("left", "right")

ColumnPair = str | Sequence[Any]  # a column on both sides, or (left, right)


@dataclass(frozen=True)
class Side:
    """One side's columns (after the checks of ``resolve``)."""

    name: str  # "left" or "right"
    keys: list[str]
    timestamp: str | None
    order: str | None  # None: its timestamp, or its row order without one


def resolve(
    left: DataFrame,
    right: DataFrame,
    key: ColumnPair,
    timestamp: ColumnPair | None,
    order_by: ColumnPair | None,
) -> tuple[Side, Side]:
    """Each side's key, timestamp and order columns, checked on the driver.

    ``key``: a column present on both sides, or a pair ``(left, right)`` of columns
    or of lists of columns (a plain list of two names is that pair). ``timestamp``
    and ``order_by``: a column on both sides or a ``(left, right)`` pair; None for none.

    Raises:
        TypeError: an argument of another shape; a timestamp column that is not a time.
        ValueError: a column missing on a side (naming the side and the column), key
            columns of different counts or types, order values that cannot be
            compared across the sides.
    """
    keys = _pair("key", key, allow_lists=True)
    times = _pair("timestamp", timestamp) if timestamp is not None else (None, None)
    orders = _pair("order_by", order_by) if order_by is not None else (None, None)
    sides = []
    for index, (frame, name) in enumerate(zip((left, right), SIDES, strict=True)):
        side_keys = keys[index] if isinstance(keys[index], list) else [keys[index]]
        side = Side(name, side_keys, times[index], orders[index])
        columns = frame.columns
        check_not_reserved(columns, f"the {name} side")
        for column in [*side.keys, *filter(None, (side.timestamp, side.order))]:
            if column not in columns:
                raise ValueError(
                    f"the {name} side has no column {column!r} (its columns: {columns})"
                )
        check_key_types(frame, side.keys, f" of the {name} side")
        if side.timestamp is not None:
            kind = frame.schema[side.timestamp].dataType
            if not isinstance(kind, _TIME_TYPES):
                raise TypeError(
                    f"timestamp column {side.timestamp!r} of the {name} side must be numeric "
                    f"seconds, timestamp, timestamp_ntz or date, not {kind.simpleString()}"
                )
        sides.append(side)
    first, second = sides
    if len(first.keys) != len(second.keys):
        raise ValueError(
            f"the left side has {len(first.keys)} key column(s) {first.keys}, the right "
            f"side {len(second.keys)} {second.keys}"
        )
    for one, other in zip(first.keys, second.keys, strict=True):
        _comparable(left, one, right, other, "key")
    a, b = _order_column(first), _order_column(second)
    if (a is None) != (b is None):
        raise ValueError(
            "one side orders by a column and the other by its row order: give both sides "
            "a timestamp or an order_by column"
        )
    if a is not None and b is not None:
        _comparable(left, a, right, b, "order")
    return first, second


def _pair(name: str, value: Any, allow_lists: bool = False) -> tuple[Any, Any]:
    if isinstance(value, str):
        return value, value
    if isinstance(value, Sequence) and len(value) == 2:
        items = list(value)
        for item in items:
            ok = isinstance(item, str) or (
                allow_lists
                and isinstance(item, list)
                and item
                and all(isinstance(c, str) for c in item)
            )
            if not ok:
                break
        else:
            return items[0], items[1]
    shape = "a column name, or a (left, right) pair of names"
    if allow_lists:
        shape += " (each a name or a list of names)"
    raise TypeError(f"{name} must be {shape}, got {value!r}")


def _order_column(side: Side) -> str | None:
    return side.order if side.order is not None else side.timestamp


def _comparable(left: DataFrame, a: str, right: DataFrame, b: str, what: str) -> None:
    """Raise ValueError unless column ``a`` of the left side and ``b`` of the right have
    the same type, or are both numbers (then both are compared as doubles)."""
    kind_a, kind_b = left.schema[a].dataType, right.schema[b].dataType
    if kind_a == kind_b or (_numeric(kind_a) and _numeric(kind_b) and what == "order"):
        return
    raise ValueError(
        f"{what} column {a!r} of the left side is {kind_a.simpleString()}, {b!r} of the "
        f"right side {kind_b.simpleString()}: they must have the same type"
        + (" (or both be numbers)" if what == "order" else "")
    )


def _numeric(kind: T.DataType) -> bool:
    return isinstance(kind, T.NumericType)


def union_frame(left: DataFrame, right: DataFrame, sides: tuple[Side, Side]) -> DataFrame:
    """Both sides as one frame of ``INPUT``, the key columns, ``ORDER``, ``LEFT`` and
    ``RIGHT`` (see the module doc); streaming if the sides are."""
    first, second = sides
    key_names = key_columns(len(first.keys))
    names = [left.columns, right.columns]
    structs = [F.struct(*[exact(n, c) for c in n]) for n in names]  # exact names, quoted
    kinds = [T.StructType(left.schema.fields), T.StructType(right.schema.fields)]
    numeric_order = False
    orders = [_order_column(first), _order_column(second)]
    if orders[0] is not None and orders[1] is not None:
        numeric_order = left.schema[orders[0]].dataType != right.schema[orders[1]].dataType
    frames = []
    for index, (frame, side) in enumerate(zip((left, right), sides, strict=True)):
        order = orders[index]
        order_value = F.lit(None) if order is None else exact(names[index], order)
        if numeric_order:
            order_value = order_value.cast("double")
        columns = [F.lit(index + 1).cast("int").alias(INPUT)]
        columns += [
            exact(names[index], c).alias(n)
            for c, n in zip(side.keys, key_names, strict=True)
        ]
        columns.append(order_value.alias(ORDER))
        for own in range(2):
            value = structs[own] if own == index else F.lit(None).cast(kinds[own])
            columns.append(value.alias(LEFT if own == 0 else RIGHT))
        frames.append(frame.select(*columns))
    return frames[0].unionByName(frames[1])


def key_columns(count: int) -> list[str]:
    return [f"__aec_k{i}" for i in range(count)]


def arrival_order() -> list[str]:
    """The sort within a partition (the contract's arrival order)."""
    return [ORDER, INPUT, POSITION]


def arranged(union: DataFrame, keys: list[str], num_partitions: int | None) -> DataFrame:
    """``union`` shuffled by ``keys`` and sorted in the arrival order (``POSITION`` added
    before the shuffle)."""
    position = {POSITION: F.monotonically_increasing_id()}
    return arrange(union, keys, arrival_order(), num_partitions, position)


# -- executors: one partition's two-input operator ------------------------------------------------
class InputWatermarks:
    """A periodic watermark generator per input (``BoundedOutOfOrderness`` each: every
    ``interval`` records of that input, its ``max event time - delay``)."""

    def __init__(self, delay: float, interval: int) -> None:
        self.inputs = (
            BoundedOutOfOrderness(delay, interval),
            BoundedOutOfOrderness(delay, interval),
        )

    @property
    def emitted(self) -> int:
        return self.inputs[0].emitted + self.inputs[1].emitted

    def restarted(self) -> InputWatermarks:
        fresh = InputWatermarks(self.inputs[0].delay, self.inputs[0].interval)
        fresh.inputs = (self.inputs[0].restarted(), self.inputs[1].restarted())
        return fresh

    def progress(self) -> dict[str, Any]:
        return {"inputs": [generator.progress() for generator in self.inputs]}

    def resume(self, progress: list[dict[str, Any]]) -> None:
        for index, generator in enumerate(self.inputs):
            generator.resume([p["inputs"][index] for p in progress])


@dataclass(frozen=True)
class CoPartitionJob(PartitionJob):
    """A ``PartitionJob`` of a two-input function: rows of ``union_frame``."""

    left_time: str | None = None  # the timestamp field of each side's struct
    right_time: str | None = None

    def make_operator(
        self, function: Any, backend: StateBackend, key_group_range: KeyGroupRange | None
    ) -> Any:
        return KeyedCoProcessOperator(
            function, backend, self.config, key_group_range=key_group_range
        )

    def watermark_generator(self) -> Any:
        return InputWatermarks(self.delay, self.interval)

    def resume_watermarks(self, operator: Any, watermarks: Any) -> None:
        for index, generator in enumerate(watermarks.inputs, start=1):
            if generator.current > operator.input_watermarks[index - 1]:
                operator.process_input_watermark(index, Watermark(generator.current))

    def end_micro_batch(self, operator: Any, watermarks: Any, with_rows: bool) -> None:
        for index, generator in enumerate(watermarks.inputs, start=1):
            mark = generator.check_now()
            if mark is not None:
                operator.process_input_watermark(index, Watermark(mark))

    def holds_watermark(self, operator: Any, watermarks: Any) -> bool:
        return any(
            generator.current > operator.input_watermarks[index]
            for index, generator in enumerate(watermarks.inputs)
        )

    def feed(
        self,
        operator: Any,
        watermarks: Any,
        batch: pa.RecordBatch,
        samples: GaugeSamples,
        fed: int,
    ) -> None:
        """Feed ``batch``'s rows (of ``union_frame``) to the two-input ``operator``, each
        side's values from its struct, with each input's periodic watermarks; ``samples``
        takes the operator's gauges every so many rows (``fed``: rows fed before)."""
        inputs = batch.column(INPUT).to_pylist()
        keys = keys_of(batch, self.keys)
        sides = []
        for column, time in ((LEFT, self.left_time), (RIGHT, self.right_time)):
            struct = batch.column(column)
            rows = struct.to_pylist()
            stamps = [None] * len(rows) if time is None else timestamp_seconds(struct.field(time))
            sides.append((rows, stamps))
        (lefts, left_times), (rights, right_times) = sides
        process = operator.process_fields
        first, second = watermarks.inputs
        rows, start = len(inputs), 0
        while start < rows:  # the gauges are sampled between slices, never per record
            end = min(rows, start + samples.until_next())
            for index in range(start, end):
                input = inputs[index]
                if input == 1:
                    stamp = left_times[index]
                    process(keys[index], lefts[index], stamp, 1)
                    mark = first.on_record(stamp)
                else:
                    stamp = right_times[index]
                    process(keys[index], rights[index], stamp, 2)
                    mark = second.on_record(stamp)
                if mark is not None:
                    operator.process_input_watermark(input, Watermark(mark))
            samples.take(operator, end - start, fed + end)
            start = end

def plan_co(
    left: DataFrame,
    right: DataFrame,
    function: Any,
    key: ColumnPair,
    output_schema: SchemaLike,
    *,
    timestamp: ColumnPair | None,
    watermark_delay: float | dt.timedelta | None,
    order_by: ColumnPair | None,
    watermark_interval: int,
    backend: StateBackend | BackendSpec | None,
    config: AecConfig | None,
    num_partitions: int | None,
    side_outputs: Mapping[str, SchemaLike] | None,
    name: str,
) -> tuple[CoPartitionJob, DataFrame, tuple[Side, Side]]:
    """Check the arguments on the driver (see ``process_keyed_co``); the job to ship,
    the union frame and the resolved sides."""
    check_function_kind(function, KeyedCoProcessFunction, name)
    sides = resolve(left, right, key, timestamp, order_by)
    if timestamp is None and watermark_delay is not None:
        raise ValueError(
            "watermark_delay needs a timestamp column: without one there are no watermarks"
        )
    delay = delay_seconds(watermark_delay)
    union = union_frame(left, right, sides)
    job = plan_job(
        union, function, key_columns(len(sides[0].keys)), output_schema, timestamp=None,
        watermark_delay=None, watermark_interval=watermark_interval, backend=backend,
        config=config, num_partitions=num_partitions, side_outputs=side_outputs, name=name,
        function_class=KeyedCoProcessFunction, user_frame=False,
    )  # fmt: skip
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    fields["delay"] = delay
    co = CoPartitionJob(**fields, left_time=sides[0].timestamp, right_time=sides[1].timestamp)
    return co, union, sides


def process_keyed_co(
    left: DataFrame,
    right: DataFrame,
    function: KeyedCoProcessFunction,
    key: ColumnPair,
    output_schema: SchemaLike,
    timestamp: ColumnPair | None = None,
    watermark_delay: float | dt.timedelta | None = None,
    order_by: ColumnPair | None = None,
    watermark_interval: int = 1000,
    backend: StateBackend | BackendSpec | None = None,
    config: AecConfig | None = None,
    num_partitions: int | None = None,
    side_outputs: Mapping[str, SchemaLike] | None = None,
) -> DataFrame:
    """Run ``function`` (an ``aec.KeyedCoProcessFunction``) per key over two DataFrames:
    ``left``'s rows are input 1 (``process_element1``), ``right``'s input 2.

    Args:
        left, right: the inputs; each row reaches the function as a dict of its own
            side's columns (as ``process_keyed`` gives them).
        function: the two-input function; cloudpickled to the executors.
        key: a column present on both sides, or a pair ``(left_key, right_key)`` of
            columns or of lists of columns (several key columns: ``(["a", "b"], ["a",
            "b"])``; a list of two names is a pair); the key columns must have the same
            type on both sides. A null key fails the job.
        output_schema, watermark_interval, backend, config, num_partitions,
            side_outputs: as ``process_keyed``'s.
        timestamp: event-time column on both sides, or a ``(left, right)`` pair (types
            as ``process_keyed``'s); None: no event time, no watermarks but the last.
        watermark_delay: bounded out-of-orderness, seconds or a ``timedelta``, per
            input: every ``watermark_interval`` records of an input, that input's
            ``max event time - watermark_delay``; the operator's watermark is the
            minimum of the two inputs' (an input without rows holds it back until the
            end of input).
        order_by: the arrival order: a column on both sides or a ``(left, right)``
            pair (default: the timestamps; without those, each side's row order, the
            left side first). Each side in its own order, the two merged by that value
            (same type on both sides, or both numbers), ties left first, then each
            side's row order.

    Returns:
        The main output as a DataFrame (lazy); ``side_output(result, tag)``,
        ``partition_metrics(result)`` and ``unpersist(result)`` work on it.

    Raises:
        TypeError, ValueError: on the driver, before any job: a function that is not
            a ``KeyedCoProcessFunction`` (naming both kinds), a key, timestamp or order
            column missing on one side (naming the side and the column), key types
            that differ, and ``process_keyed``'s argument errors. At run time a
            failing partition fails the Spark job with the ``aec.JobFailure`` message.
    """
    job, union, _ = plan_co(
        left, right, function, key, output_schema, timestamp=timestamp,
        watermark_delay=watermark_delay, order_by=order_by,
        watermark_interval=watermark_interval, backend=backend, config=config,
        num_partitions=num_partitions, side_outputs=side_outputs, name="process_keyed_co",
    )  # fmt: skip
    ordered = arranged(union, job.keys, num_partitions)
    return persisted_result(ordered.mapInArrow(job.run, job.layout.raw), job.layout)
