"""Async calls from Spark: ``async_udf`` (a column expression) and ``async_map`` (rows).

Both run ``aec.async_io``'s wait functions inside a Spark task, so each Python worker
keeps up to ``capacity`` calls of an ``async def`` (or an ``AsyncFunction``) in
flight instead of one at a time (FLIP-400's async scalar functions, FLIP-12's
async I/O). Per task:

* one wait call spans every Arrow batch of the partition, so calls of the next
  batch start while the last ones of the previous batch are still running, and the
  function's ``open()``/``close()`` and the asyncio event-loop thread live once per
  task, not once per batch;
* ``async_udf`` returns one value per input row, in row order (``ordered=False``
  lets a finished row free its capacity slot before earlier rows finish; results
  are put back in row order before Spark sees them); with ``batch_size`` the
  function takes a list of inputs and rows travel in batches (``batch_wait``:
  FLINK-38825's batched async I/O);
* ``async_map`` emits each call's results as output rows (zero or more per input
  row): in input order (``mode="ordered"``) or as calls finish
  (``mode="unordered"``).

A call that fails (after its retries) or times out fails the task, and so the
Spark job, with the ``aec.JobFailure`` message naming the input.
"""

from __future__ import annotations

import decimal
import fractions
import inspect
import math
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.util import PythonEvalType

from aec.async_io import AsyncBatchFunction, AsyncFunction, batch_wait, ordered_wait, unordered_wait
from aec.async_io.operator import check_capacity
from aec.retry import NoRetry, RetryStrategy, check_strategy, check_timeout
from aec.runtime.batch_queue import batch_results, check_max_batch_size, check_max_wait
from spark_glue.convert import arrow_schema, encode_columns, rows_as_dicts, struct_type
from spark_glue.workers import ensure_workers

DEFAULT_CAPACITY = 100  # calls in flight per Spark task
DEFAULT_TIMEOUT = 60.0  # seconds per input, spanning retries
DEFAULT_BATCH_TIMEOUT = 0.05  # seconds a partial batch of a batched async_udf waits
_OUTPUT_BATCH = 1000  # rows per Arrow batch async_map hands back to Spark
_MODES = ("ordered", "unordered")


class _Row(tuple):
    """A UDF input tagged with its place: ``(position in the task, argument tuple)``;
    shown as its arguments (in a ``JobFailure`` naming the failed row)."""

    __slots__ = ()

    def __repr__(self) -> str:
        args = self[1]
        return repr(args[0]) if len(args) == 1 else repr(args)


class _CallWith(AsyncFunction):
    """An ``async def fn(*args)`` as an asyncio-style ``AsyncFunction``: its one result,
    tagged with the input row's position in the task."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    # the asyncio style of AsyncFunction.async_invoke: one argument, a coroutine
    async def async_invoke(self, value: _Row) -> list[tuple[int, Any]]:  # type: ignore[override]
        position, args = value
        return [(position, await self.fn(*args))]


class _BatchCallWith(AsyncBatchFunction):
    """An ``async def fn(values: list) -> list`` as an ``AsyncBatchFunction``: each
    row's one result. A row of one column gives ``fn`` its value, a row of several
    the tuple of them. Tagged (``_Row`` inputs), each result is tagged with its row's
    position in the task; untagged, the inputs are ``fn``'s values themselves."""

    def __init__(self, fn: Callable[[list[Any]], Any], tagged: bool = True) -> None:
        self.fn = fn
        self.tagged = tagged

    async def async_invoke_batch(self, values: list[Any]) -> list[Any]:
        fn = self.fn
        if not self.tagged:
            # the user's function is the one whose result must fit (named in the error)
            size = len(values)  # counted before the call: fn may consume its list
            return [[result] for result in batch_results(fn, size, await fn(values))]
        rows = cast("list[_Row]", values)
        args = [row[1][0] if len(row[1]) == 1 else row[1] for row in rows]
        results = batch_results(fn, len(rows), await fn(args))
        return [[(row[0], result)] for row, result in zip(rows, results, strict=True)]


class _Untagged(RetryStrategy):
    """The user's retry strategy, seeing a UDF call's result as ``[value]`` rather than
    the position-tagged ``[(position, value)]`` that ``_CallWith`` completes with."""

    __slots__ = ("inner", "max_attempts", "retry_on_exception", "retry_on_result")

    def __init__(self, inner: RetryStrategy) -> None:
        self.inner = inner
        self.max_attempts = inner.max_attempts
        self.retry_on_exception = inner.retry_on_exception
        self.retry_on_result = inner.retry_on_result

    def backoff(self, n: int) -> float:
        return self.inner.backoff(n)

    def should_retry_exception(self, exc: BaseException) -> bool:
        return self.inner.should_retry_exception(exc)

    def should_retry_result(self, results: list[Any]) -> bool:
        return self.inner.should_retry_result([value for _, value in results])


class _RowFunction(AsyncFunction):
    """An ``async def fn(row: dict) -> iterable of rows`` as an ``AsyncFunction``."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.fn = fn

    # the asyncio style of AsyncFunction.async_invoke: one argument, a coroutine
    async def async_invoke(self, value: dict[str, Any]) -> Iterable[Any]:  # type: ignore[override]
        return await self.fn(value)


def _check_common(capacity: int, timeout: float | None, retry: RetryStrategy | None) -> None:
    check_capacity(capacity)
    check_timeout(timeout)
    if retry is not None:
        check_strategy(retry)


def async_udf(
    return_type: T.DataType | str,
    capacity: int = DEFAULT_CAPACITY,
    timeout: float | None = DEFAULT_TIMEOUT,
    retry: RetryStrategy | None = None,
    ordered: bool = True,
    batch_size: int | None = None,
    batch_timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: an ``async def f(*columns) -> value`` becomes a pandas UDF; with
    ``batch_size``, an ``async def f(values: list) -> list`` does (one call per batch
    of rows).

    The result is used like any pandas UDF: ``df.select(f("url"))``,
    ``df.filter(f("x"))``, ``spark.udf.register("f", f)`` for SQL. Each argument
    arrives as the row's Python value, as Spark hands it to a pandas UDF and then made
    plain (``_plain``): ``None`` for null (pandas' NaN, NaT or NA: a double NaN too,
    which pandas does not tell from null), a list for an array, a dict for a map or a
    struct (a null struct too, as a dict of None fields: a pandas UDF receives a struct
    column as a DataFrame of its fields, which does not tell a null struct from one of
    null fields); an integer column with nulls in the batch gives floats (pandas holds
    it as float64). The return value must fit ``return_type`` as for any pandas UDF
    (None, NaN, NA and NaT are null), with one rule more: a result pandas would change
    without a word fails the job with a ``TypeError`` naming the UDF and the value (a
    number with a fraction, a ``Decimal`` or ``Fraction`` too, in an integer type,
    which would be truncated, or a finite number beyond a ``float``'s or ``double``'s
    range, which would become infinity, also inside arrays, maps and structs). A struct takes a dict or a ``Row`` built with names by
    its field names (other keys ignored, as PySpark's Python UDFs do), a tuple or list
    in field order.

    Args:
        return_type: the Spark type of the result (``DataType`` or DDL string).
        capacity: calls in flight per Spark task (int >= 1).
        timeout: seconds per row from its first call, spanning retries; None waits
            forever. A timeout fails the job (``TimeoutError`` as the cause).
        retry: an ``aec.retry`` strategy (default ``NoRetry()``).
        ordered: True keeps calls' results in row order (``ordered_wait``); False
            lets finished rows leave the in-flight window first (``unordered_wait``),
            then puts the batch back in row order.
        batch_size: None: one call per row. An int >= 1: up to that many rows per
            call of ``f(values)`` (``aec.async_io.batch_wait``), where ``values`` holds
            each row's argument (its value for one column, the tuple of them for
            several) and ``f`` returns one result per value, in order; a result of
            another length fails the job naming ``f`` and both lengths. ``capacity``
            still counts rows in flight (give it a few batches' worth), ``timeout``
            and ``retry`` still apply per row (a retried row travels in a later batch;
            ``retry_on_result`` sees ``[its result]``).
        batch_timeout: seconds a partial batch waits for more rows (>= 0; default
            0.05 with ``batch_size``); a batch also leaves when the task has nothing
            else to do (capacity reached, end of the partition).

    Returns:
        A decorator taking the ``async def`` and returning the pandas UDF.

    Raises:
        TypeError: the decorated function is not an ``async def``, or a bad ``retry``,
            ``batch_size`` or ``batch_timeout``.
        ValueError: bad ``capacity``, ``timeout``, ``batch_size`` or ``batch_timeout``;
            ``batch_timeout`` without ``batch_size``.
    """
    _check_common(capacity, timeout, retry)
    strategy = retry if retry is not None else NoRetry()
    batching = None
    if batch_size is not None:
        wait = DEFAULT_BATCH_TIMEOUT if batch_timeout is None else batch_timeout
        batching = (
            check_max_batch_size(batch_size, "batch_size"),
            check_max_wait(wait, "batch_timeout"),
        )
    elif batch_timeout is not None:
        raise ValueError("async_udf: batch_timeout applies to batches: give batch_size too")

    def decorate(fn: Callable[..., Any]) -> Any:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"async_udf decorates an `async def`, got {getattr(fn, '__name__', fn)!r}"
            )
        body = _UdfBody(fn, capacity, timeout, strategy, ordered, batching)
        session = SparkSession.getActiveSession()  # the UDF may be made before any session
        if session is not None:
            ensure_workers(session, "async_udf")
        # the iterator form: one wait call (and one event loop) per task, not per batch;
        # named by eval type, since type hints cannot say "any number of columns"
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*type hints for pandas UDF.*")
            # pyspark's stub lists atomic and array return types; struct types work too
            udf = pandas_udf(body, return_type, PythonEvalType.SQL_SCALAR_PANDAS_ITER_UDF)  # type: ignore[arg-type]
        resolved = udf.returnType  # a DDL string is parsed here (pandas_udf needs a session)
        body.return_type = resolved
        if isinstance(resolved, T.StructType):
            body.struct_fields = resolved.fieldNames()
        return udf

    return decorate


class _UdfBody:
    """The function Spark runs for an ``async_udf``: Arrow batches of the argument
    columns in (a Series, or a tuple of them), one Series (or, for a struct result,
    one DataFrame) per batch out."""

    def __init__(
        self,
        fn: Callable[..., Any],
        capacity: int,
        timeout: float | None,
        retry: RetryStrategy,
        ordered: bool,
        batching: tuple[int, float | None] | None = None,
    ) -> None:
        self.fn = fn
        self.capacity = capacity
        self.timeout = timeout
        self.retry = retry
        self.ordered = ordered
        self.batching = batching  # (batch_size, batch_timeout) for a batched UDF
        self.return_type: T.DataType | None = None  # set by async_udf once resolved
        self.struct_fields: list[str] | None = None  # set when the result is a struct
        self.__name__ = getattr(fn, "__name__", "async_udf")  # Spark names the UDF after it
        self.__doc__ = fn.__doc__

    def __call__(self, batches: Iterator[Any]) -> Iterator[pd.Series | pd.DataFrame]:
        results = _udf_batches(batches, self._calls, self._tagged)
        fields = self.struct_fields
        for values, index in results:
            if fields is not None:
                values = [_by_name(value, fields) for value in values]
            if self.return_type is not None:
                _check_nothing_lost(values, self.return_type, self.__name__)
            if fields is None:
                yield pd.Series(values, index=index, dtype=object)
            else:
                yield _struct_frame(values, fields, index)

    @property
    def _tagged(self) -> bool:
        """Whether rows travel as ``_Row``s and results carry their positions: all but
        an ordered batched UDF, whose function takes the rows' values as they are and
        whose results come back one per row in row order (see ``_udf_batches``)."""
        return self.batching is None or not self.ordered

    def _calls(self, rows: Iterator[Any]) -> Iterator[Any]:
        """One result per row, ``(position, result)`` if tagged: one wait call over
        every row of the task (rows only: no watermark comes out)."""
        if self.batching is None:
            wait = ordered_wait if self.ordered else unordered_wait
            return wait(rows, _CallWith(self.fn), self.timeout, self.capacity,
                        _Untagged(self.retry))  # fmt: skip
        size, batch_timeout = self.batching
        tagged = self._tagged
        return batch_wait(
            rows, _BatchCallWith(self.fn, tagged), max_batch_size=size,
            batch_timeout=batch_timeout, timeout=self.timeout, capacity=self.capacity,
            mode="ordered" if self.ordered else "unordered",
            retry=_Untagged(self.retry) if tagged else self.retry,
        )  # fmt: skip


def _check_nothing_lost(values: list[Any], data_type: T.DataType, name: str) -> None:
    """Raise TypeError naming the UDF, the value and its place for a result pandas and
    pyarrow would change without a word on its way to Spark: a number with a fraction
    in an integer type (``1.5`` would become 1), a finite number beyond a ``float``'s
    range (it would become infinity), a number for a timestamp or date (Arrow would
    take it as microseconds or days), anywhere inside arrays, maps and structs. What
    they take as it is, or refuse themselves, is left to them (NaN, NA and NaT are
    null; ``"2"`` in a ``bigint`` is 2, as for any pandas UDF)."""
    if not _may_lose(data_type):
        return  # strings, binary...: nothing to check
    if isinstance(data_type, _INTEGRAL) and all(type(v) is int or v is None for v in values):
        return  # the common case, at C speed
    if isinstance(data_type, T.DoubleType) and all(type(v) is float or v is None for v in values):
        return  # a Python float is a double: at C speed
    for row, value in enumerate(values):
        lost = _lost(value, data_type, "")
        if lost is not None:
            where, why = lost
            raise TypeError(
                f"async_udf {name!r} returned {value!r} (row {row} of its batch) for "
                f"{data_type.simpleString()}: {why}" + (f" (at result{where})" if where else "")
            )


_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_DOUBLE_MAX = sys.float_info.max
# numbers an integral column would truncate, and every number a float column rounds
_FRACTIONAL = (float, np.floating, decimal.Decimal, fractions.Fraction)
_NUMBERS = (*_FRACTIONAL, int, np.integer)


def _whole(value: Any) -> bool:
    """Whether a finite number of ``_FRACTIONAL`` has no fraction (without building the
    int of a Decimal like 1e1000000)."""
    if isinstance(value, decimal.Decimal):
        return bool(value == value.to_integral_value())
    if isinstance(value, fractions.Fraction):
        return value.denominator == 1
    return float(value).is_integer()


def _finite(value: Any) -> bool:
    """Whether a number of ``_NUMBERS`` is finite (a Decimal may be NaN or infinite)."""
    if isinstance(value, decimal.Decimal):
        return value.is_finite()
    return not isinstance(value, (float, np.floating)) or math.isfinite(value)


# time types: a number for one is not a time (Arrow would take it as microseconds or days)
_TIMES = (T.TimestampType, T.TimestampNTZType, T.DateType)


def _may_lose(data_type: T.DataType) -> bool:
    """Whether a value of ``data_type`` can hold an integer or float leaf (``_lost``)."""
    if isinstance(data_type, (*_INTEGRAL, T.FloatType, T.DoubleType, *_TIMES)):
        return True
    if isinstance(data_type, T.ArrayType):
        return _may_lose(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _may_lose(data_type.keyType) or _may_lose(data_type.valueType)
    if isinstance(data_type, T.StructType):
        return any(_may_lose(field.dataType) for field in data_type.fields)
    return False


def _lost(value: Any, data_type: T.DataType, where: str) -> tuple[str, str] | None:
    """What converting ``value`` (at path ``where`` in a result) to ``data_type`` would
    lose without an error (see ``_check_nothing_lost``): ``(path, why)``, or None."""
    if value is None:
        return None
    if isinstance(data_type, _INTEGRAL):
        if isinstance(value, _FRACTIONAL) and _finite(value) and not _whole(value):
            return where, f"{value!r} is not an integral value"
        return None
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        if type(value) is float and isinstance(data_type, T.DoubleType):
            return None  # the common case: nothing to lose
        if isinstance(value, _NUMBERS) and not isinstance(value, bool) and _finite(value):
            magnitude: Any = abs(value)
            number = float(value) if magnitude <= _DOUBLE_MAX else math.inf
            if isinstance(data_type, T.FloatType) and abs(number) > _FLOAT32_MAX:
                return where, f"{value!r} overflows a float (use double)"
            if math.isinf(number):
                return where, f"{value!r} overflows a double"
        return None
    if isinstance(data_type, _TIMES):
        if isinstance(value, _NUMBERS) and not isinstance(value, bool):
            return where, (
                f"{value!r} is a number for a {data_type.simpleString()}: Arrow would read it "
                "as microseconds (or days); return a datetime.datetime or datetime.date"
            )
        return None
    if isinstance(data_type, T.ArrayType):
        if not isinstance(value, (list, tuple, np.ndarray)):
            return None
        for index, item in enumerate(value):
            lost = _lost(item, data_type.elementType, f"{where}[{index}]")
            if lost is not None:
                return lost
        return None
    if isinstance(data_type, T.MapType):
        pairs = list(value.items()) if isinstance(value, Mapping) else value
        if not isinstance(pairs, (list, tuple)):
            return None
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                return None  # not pairs: Spark's conversion says what is wrong
            key, item = pair
            lost = _lost(key, data_type.keyType, f"{where}[key {key!r}]") or _lost(
                item, data_type.valueType, f"{where}[{key!r}]"
            )
            if lost is not None:
                return lost
        return None
    if isinstance(data_type, T.StructType):
        names = data_type.names
        if type(value) is not dict:  # a dict is read by name as it is (no copy per row)
            value = _by_name(value, names)
        if isinstance(value, Mapping):
            items = [value.get(field) for field in names]
        elif isinstance(value, (list, tuple)) and len(value) == len(names):
            items = list(value)
        else:
            return None
        for field, item in zip(data_type.fields, items, strict=True):
            lost = _lost(item, field.dataType, f"{where}.{field.name}")
            if lost is not None:
                return lost
    return None


def _by_name(value: Any, fields: list[str]) -> Any:
    """A struct result as its fields by name when it has names: a mapping's or a named
    ``Row``'s values of ``fields`` (other keys ignored, as PySpark's Python UDFs ignore
    them); a tuple or list in field order, None or anything else as it is."""
    if getattr(value, "__fields__", None):  # a pyspark Row built with names
        value = cast(T.Row, value).asDict()
    if isinstance(value, Mapping):
        return {name: value.get(name) for name in fields}
    return value


def _struct_frame(values: list[Any], fields: list[str], index: pd.Index) -> pd.DataFrame:
    """A struct result per row (a dict, or a tuple or list in field order: ``_by_name``
    made the rest so; None: all fields null) as the DataFrame a pandas UDF returns for a
    struct type."""
    rows = []
    for value in values:
        if value is None:
            rows.append([None] * len(fields))
        elif isinstance(value, Mapping):
            rows.append([value.get(name) for name in fields])
        elif isinstance(value, (tuple, list)):
            if len(value) != len(fields):
                raise TypeError(
                    f"struct result has {len(value)} values, the type has fields {fields}: {value!r}"
                )
            rows.append(list(value))
        else:
            raise TypeError(
                f"a struct result must be a dict, a Row or a tuple, got {type(value).__name__}"
            )
    return pd.DataFrame(rows, columns=fields, index=index, dtype=object)


class _PendingBatch:
    """One input batch of a UDF task waiting for its rows' results."""

    __slots__ = ("start", "values", "missing", "index")

    def __init__(self, start: int, size: int, index: pd.Index) -> None:
        self.start = start  # task-wide position of the batch's first row
        self.values: list[Any] = [None] * size
        self.missing = size
        self.index = index


def _plain_values(column: pd.Series | pd.DataFrame) -> list[Any]:
    """A pandas UDF argument's values as plain Python values (``_plain``); a struct
    column, which arrives as a DataFrame of its fields, as one dict per row."""
    if isinstance(column, pd.DataFrame):
        names = [str(name) for name in column.columns]
        fields = [_plain_values(column[name]) for name in column.columns]
        return [dict(zip(names, row, strict=True)) for row in zip(*fields, strict=True)]
    return [_plain(value) for value in column.tolist()]


def _plain(value: Any) -> Any:
    """``None`` for pandas' missing values (NaN, NaT, NA), a list for a numpy array
    (an array argument) and a Python number for a numpy one, recursively; anything
    else as it is."""
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, float):
        return None if value != value else value
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    tolist = getattr(value, "tolist", None)  # a numpy array (an array argument) or scalar
    if tolist is not None and not isinstance(value, (str, bytes)):
        return _plain(tolist())
    return value


def _udf_batches(
    batches: Iterator[Any], calls: Callable[[Iterator[Any]], Iterator[Any]], tagged: bool = True
) -> Iterator[tuple[list[Any], pd.Index]]:
    """``(results, index)`` per input batch: ``calls`` (one wait call) over every row of
    the task, giving one result per row.

    Tagged, a row is a ``_Row`` carrying its task-wide position and its argument
    tuple, and its result comes back as ``(position, result)``, in any order.
    Untagged, a row is its value (one column) or the tuple of its values (several),
    and results come back in row order. A batch's Series leaves once every row of it
    has its result and every earlier batch has left (Spark needs batches back in
    order, each as long as it came in).
    """
    waiting: deque[_PendingBatch] = deque()  # batches the wait call started pulling

    def rows() -> Iterator[Any]:
        position = 0
        for batch in batches:
            columns = batch if isinstance(batch, tuple) else (batch,)
            size = len(columns[0])
            waiting.append(_PendingBatch(position, size, columns[0].index))
            values = [_plain_values(column) for column in columns]
            if not tagged:
                yield from values[0] if len(values) == 1 else zip(*values, strict=True)
                position += size
                continue
            for args in zip(*values, strict=True):
                yield _Row((position, args))
                position += 1

    outputs = calls(rows())
    for position, value in outputs if tagged else enumerate(outputs):
        for pending in waiting:  # at most capacity rows in flight: few batches to scan
            offset = position - pending.start
            if offset < len(pending.values):
                pending.values[offset] = value
                pending.missing -= 1
                break
        while waiting and waiting[0].missing == 0:
            done = waiting.popleft()
            yield done.values, done.index
    for done in waiting:  # only empty batches can be left once every result arrived
        yield done.values, done.index


def async_map(
    df: DataFrame,
    function: AsyncFunction | Callable[[dict[str, Any]], Any],
    output_schema: T.StructType | str,
    mode: str = "ordered",
    capacity: int = DEFAULT_CAPACITY,
    timeout: float | None = DEFAULT_TIMEOUT,
    retry: RetryStrategy | None = None,
) -> DataFrame:
    """Call ``function`` once per row of ``df``; its results are the output rows.

    Args:
        df: the input; each row reaches the function as a dict ``{column: value}``.
        function: an ``async def f(row) -> iterable of rows`` or an
            ``aec.async_io.AsyncFunction`` (Flink style ``async_invoke(row,
            result_future)`` or asyncio style), completing with an iterable of output
            rows: dicts (missing fields are null) or tuples in ``output_schema``'s
            field order. Cloudpickled to the executors; ``open()``/``close()`` run
            once per Spark task.
        output_schema: ``StructType`` or DDL string of the output.
        mode: ``"ordered"`` (outputs in input order within a partition, Flink's
            ``orderedWait``) or ``"unordered"`` (as calls finish, ``unorderedWait``).
        capacity: calls in flight per Spark task (int >= 1).
        timeout: seconds per row from its first call, spanning retries; None waits
            forever.
        retry: an ``aec.retry`` strategy (default ``NoRetry()``).

    Returns:
        A lazy DataFrame with ``output_schema`` (one Spark task per input partition).

    Raises:
        TypeError, ValueError: on the driver, for a bad ``mode``, ``capacity``,
            ``timeout``, ``retry`` or schema, a function that is neither an
            ``AsyncFunction`` nor an ``async def``. At run time a failed or timed-out
            call fails the job with the ``aec.JobFailure`` message naming the row.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    _check_common(capacity, timeout, retry)
    if not isinstance(function, AsyncFunction):
        if not inspect.iscoroutinefunction(function):
            raise TypeError(
                "async_map needs an aec.async_io.AsyncFunction or an `async def f(row)`, "
                f"got {type(function).__name__}"
            )
        function = _RowFunction(function)
    schema = struct_type(output_schema)
    job = _MapJob(function, schema, mode, capacity, timeout, retry or NoRetry())
    ensure_workers(df.sparkSession, "async_map")
    return df.mapInArrow(job.run, schema)


class _MapJob:
    """What one ``async_map`` task needs; pickled into the ``mapInArrow`` closure."""

    def __init__(
        self,
        function: AsyncFunction,
        schema: T.StructType,
        mode: str,
        capacity: int,
        timeout: float | None,
        retry: RetryStrategy,
    ) -> None:
        self.function = function
        self.schema = schema
        self.mode = mode
        self.capacity = capacity
        self.timeout = timeout
        self.retry = retry

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: input batches in, output batches out."""
        target = arrow_schema(self.schema)
        wait = ordered_wait if self.mode == "ordered" else unordered_wait
        rows = (row for batch in batches for row in batch.to_pylist())
        pending: list[Any] = []
        for result in wait(rows, self.function, self.timeout, self.capacity, self.retry):
            pending.append(result)
            if len(pending) >= _OUTPUT_BATCH:
                yield self._batch(pending, target)
                pending = []
        if pending:
            yield self._batch(pending, target)

    def _batch(self, rows: list[Any], target: pa.Schema) -> pa.RecordBatch:
        columns = encode_columns(rows_as_dicts(rows, self.schema), self.schema, target)
        return pa.RecordBatch.from_arrays(columns, schema=target)
