"""Arrow <-> Python rows for the Spark glue.

``mapInArrow`` hands each partition ``pyarrow.RecordBatch`` es and takes back
batches whose Arrow types must already match the declared Spark schema:
Spark does not coerce them (an ``int64`` column declared as a timestamp is
silently read as microseconds). This module does that conversion itself:

* ``timestamp_seconds`` turns a numeric, timestamp or date column into event
  time in float seconds since the epoch (naive timestamps count as UTC).
* ``encode_columns`` turns output rows (dicts, or tuples in schema order)
  into Arrow arrays of exactly the declared types, with the coercions listed
  in its docstring, and raises ``TypeError`` naming the field and the value
  otherwise; ``encode_rows`` does the same column by column, without a dict
  per row, and converts plain integers and seconds in pyarrow.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, cast

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.compute as pc  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_UNIT_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema Spark expects back from ``mapInArrow`` for ``schema``.

    Spark timestamps (``TimestampType``) are UTC instants, ``timestamp[us, tz=UTC]``;
    ``TimestampNTZType`` is a naive ``timestamp[us]``.
    """
    return to_arrow_schema(schema, timezone="UTC")


def struct_type(schema: T.StructType | str) -> T.StructType:
    """``schema`` as a ``StructType``: a ``StructType`` as is, a DDL string parsed
    (by the JVM: needs the active Spark session).

    Raises:
        TypeError: anything else.
    """
    if isinstance(schema, T.StructType):
        return schema
    if isinstance(schema, str):
        return cast(T.StructType, T.StructType.fromDDL(schema))  # a DataType by its stub
    raise TypeError(f"a schema must be a StructType or a DDL string, got {type(schema).__name__}")


def timestamp_seconds(column: pa.Array | pa.ChunkedArray) -> list[float | None]:
    """Event time of each row in float seconds since 1970-01-01 (None for nulls).

    Accepts integer/floating/decimal columns (already seconds; a decimal as the
    nearest float), timestamps of any unit (tz-aware: the instant; naive: read as UTC)
    and dates (midnight UTC): the Spark types the driver's check takes as numeric.

    Raises:
        TypeError: for any other Arrow type (strings are not parsed).
    """
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return pc.cast(column, pa.float64()).to_pylist()
    if pa.types.is_decimal(kind):  # the nearest float: decimal digits beyond it round
        return pc.cast(column, pa.float64(), safe=False).to_pylist()
    if pa.types.is_timestamp(kind):
        ticks = pc.cast(column, pa.int64())  # ticks since the epoch in the column's unit
        # safe=False: nanosecond ticks exceed float64's exact integers; sub-microsecond
        # rounding is fine for event time
        seconds = pc.divide(pc.cast(ticks, pa.float64(), safe=False), _UNIT_PER_SECOND[kind.unit])
        return seconds.to_pylist()
    if pa.types.is_date(kind):
        days = pc.cast(pc.cast(column, pa.date32()), pa.int32())
        return pc.multiply(pc.cast(days, pa.float64()), 86400.0).to_pylist()
    raise TypeError(
        f"timestamp column must be numeric (seconds), timestamp or date, got Arrow type {kind}"
    )


def rows_as_dicts(rows: Sequence[Any], schema: T.StructType) -> list[Mapping[str, Any]]:
    """Normalise output rows to mappings keyed by field name.

    Dicts (any ``Mapping``) pass through; tuples/lists (including ``pyspark.sql.Row``
    built positionally) are matched to ``schema`` field order.

    Raises:
        TypeError: a row that is neither, a tuple of the wrong length, or a dict
            with keys that are not fields of ``schema`` (caught typos).
    """
    names = schema.fieldNames()
    known = frozenset(names)
    out: list[Mapping[str, Any]] = []
    for row in rows:
        if isinstance(row, Mapping):
            if not known.issuperset(row.keys()):
                extra = sorted(str(k) for k in row.keys() - known)
                raise TypeError(f"output row has fields {extra} not in the schema {names}: {row!r}")
            out.append(row)
        elif isinstance(row, (tuple, list)):
            if getattr(row, "__fields__", None):  # a pyspark Row built with names
                out.extend(rows_as_dicts([cast(T.Row, row).asDict()], schema))
                continue
            if len(row) != len(names):
                raise TypeError(
                    f"output tuple has {len(row)} values, the schema has {len(names)} fields "
                    f"{names}: {row!r}"
                )
            out.append(dict(zip(names, row, strict=True)))
        else:
            raise TypeError(
                f"output must be a dict or a tuple in schema order, got {type(row).__name__}: {row!r}"
            )
    return out


def encode_columns(
    rows: Sequence[Mapping[str, Any]], schema: T.StructType, target: pa.Schema
) -> list[pa.Array]:
    """One Arrow array per field of ``schema``, typed exactly as ``target``.

    ``rows`` are mappings (see ``rows_as_dicts``); a missing field is null.
    Coercions (anything else raises):

    * integral fields: ints (and numpy ints), floats with an integral value;
      float NaN becomes null. Out of range raises.
    * floating fields: any real number, ``Decimal``; a finite value that does not
      fit (``1e300`` in a ``float`` field) raises instead of becoming infinity.
    * timestamp / timestamp_ntz: ``datetime`` (naive read as UTC for
      ``TimestampType``; aware converted to UTC wall time for ``TimestampNTZType``),
      ``date`` (midnight), numpy ``datetime64``, or a number of seconds since the epoch.
    * date: ``date``, ``datetime`` (its date).
    * decimal: ``Decimal``, int, float (through its shortest repr).
    * everything else (strings, booleans, binary, arrays, maps, structs) as
      ``pyarrow.array`` takes it.

    Raises:
        TypeError: naming the field and the offending value, including None in a
            non-nullable field.
    """
    columns = [[row.get(field.name) for row in rows] for field in schema.fields]
    return _encode_all(columns, schema, target)


def encode_rows(rows: Sequence[Any], schema: T.StructType, target: pa.Schema) -> list[pa.Array]:
    """``encode_columns(rows_as_dicts(rows, schema), schema, target)`` without a dict
    per row: plain dict rows are read column by column, tuple rows transposed (the
    glue's per-column output builder). Same checks, coercions and errors."""
    names = schema.fieldNames()
    kinds = set(map(type, rows))
    if kinds == {dict}:
        # every row's fields at once (a set update per dict runs in C, on stored hashes)
        if not set().union(*rows) <= frozenset(names):
            rows_as_dicts(rows, schema)  # raises, naming the row with unknown fields
        columns = [list(map(dict.get, rows, repeat(name))) for name in names]
    elif kinds == {tuple} and set(map(len, rows)) == {len(names)}:
        columns = [list(column) for column in zip(*rows, strict=True)]
    else:
        dicts = rows_as_dicts(rows, schema)
        columns = [[row.get(name) for row in dicts] for name in names]
    return _encode_all(columns, schema, target)


def _encode_all(
    columns: list[list[Any]], schema: T.StructType, target: pa.Schema
) -> list[pa.Array]:
    return [
        _encode(values, field, arrow_field.type)
        for values, field, arrow_field in zip(columns, schema.fields, target, strict=True)
    ]


def _encode(values: list[Any], field: T.StructField, arrow_type: pa.DataType) -> pa.Array:
    coerce = _COERCERS.get(type(field.dataType))
    try:
        if coerce is not None:
            array = _columnar(values, arrow_type)
            if array is None:
                values = [None if v is None else coerce(v) for v in values]
                array = pa.array(values, type=arrow_type)
        else:
            try:
                array = pa.array(values, type=arrow_type)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                fallback = _FALLBACKS.get(type(field.dataType))
                if fallback is None:
                    raise _field_error(field, values, exc) from exc
                array = pa.array([None if v is None else fallback(v) for v in values], arrow_type)
    except _Reject as exc:
        raise TypeError(
            f"output field {field.name!r} ({field.dataType.simpleString()}): {exc}"
        ) from None
    except (pa.ArrowException, OverflowError) as exc:
        raise _field_error(field, values, exc) from exc
    if not field.nullable and array.null_count:
        raise TypeError(
            f"output field {field.name!r} is not nullable but a row has no value for it"
        )
    if pa.types.is_floating(arrow_type) and len(array) and pc.any(pc.is_inf(array)).as_py():
        _check_no_overflow(field, values, array)
    return array


def _check_no_overflow(field: T.StructField, values: list[Any], array: pa.Array) -> None:
    """Raise TypeError naming ``field`` for a value that became infinite only because
    the column's type cannot hold it (pyarrow casts ``1e300`` to a float32 ``inf``)."""
    for value, stored in zip(values, array.to_pylist(), strict=True):
        if stored is not None and math.isinf(stored) and not _is_infinite(value):
            raise TypeError(
                f"output field {field.name!r} ({field.dataType.simpleString()}) cannot hold "
                f"{value!r}: it overflows the type (to {stored}); use a wider type "
                "(double) or scale the value"
            )


def _is_infinite(value: Any) -> bool:
    try:
        return math.isinf(float(value))
    except (OverflowError, TypeError, ValueError):
        return False


def _columnar(values: list[Any], arrow_type: pa.DataType) -> pa.Array | None:
    """The common cases of the integer and timestamp coercions, column at a time: a
    column pyarrow reads as plain integers (or, for timestamps, non-negative seconds
    as floats). None: anything else, which takes the per-value path (and its errors)."""
    try:
        array = pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None
    kind = array.type
    try:
        if pa.types.is_null(kind):
            return pa.nulls(len(values), arrow_type)
        if pa.types.is_integer(arrow_type):
            return array.cast(arrow_type) if pa.types.is_int64(kind) else None
        if not pa.types.is_timestamp(arrow_type):
            return None
        if pa.types.is_int64(kind):
            micros = pc.multiply_checked(array, 1_000_000)
        elif pa.types.is_floating(kind) and (pc.min(array).as_py() or 0.0) >= 0:
            # as timedelta(seconds=x) does: whole seconds exactly, the fraction
            # rounded half to even to the microsecond (NaN fails the cast below)
            whole = pc.floor(array)
            fraction = pc.round(pc.multiply(pc.subtract(array, whole), 1e6), 0, "half_to_even")
            micros = pc.add_checked(
                pc.multiply_checked(pc.cast(whole, pa.int64()), 1_000_000),
                pc.cast(fraction, pa.int64()),
            )
        else:
            return None
        return micros.cast(pa.timestamp("us", tz=arrow_type.tz))
    except (pa.ArrowException, OverflowError):
        return None


def _field_error(field: T.StructField, values: list[Any], exc: Exception) -> TypeError:
    return TypeError(
        f"output field {field.name!r} ({field.dataType.simpleString()}) cannot hold the "
        f"values given ({_first_odd(values)}): {exc}"
    )


def _first_odd(values: list[Any]) -> str:
    kinds = {type(v).__name__ for v in values if v is not None}
    return "types " + ", ".join(sorted(kinds)) if kinds else "all null"


class _Reject(Exception):
    """A value the field's coercion refuses; re-raised as TypeError with the field."""


def _to_int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise _Reject(f"booleans are not integers: {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return None  # pandas' missing integer
        if number.is_integer():
            return int(number)
        raise _Reject(f"{value!r} is not an integral value")
    raise _Reject(f"expected an integer, got {type(value).__name__} {value!r}")


def _to_float(value: Any) -> float:
    # bool first: it is a numbers.Real at runtime (ABC registration mypy does not see)
    if not isinstance(value, bool) and isinstance(value, (numbers.Real, decimal.Decimal)):
        return float(value)
    raise _Reject(f"expected a number, got {type(value).__name__} {value!r}")


def _to_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, decimal.Decimal):
        return value
    # bool first: it is a numbers.Integral at runtime (ABC registration mypy does not see)
    if not isinstance(value, bool) and isinstance(value, numbers.Integral):
        return decimal.Decimal(int(value))
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        return decimal.Decimal(repr(float(value)))
    raise _Reject(f"expected a decimal number, got {type(value).__name__} {value!r}")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy.bool_ too
        return bool(value)
    raise _Reject(f"expected a boolean, got {type(value).__name__} {value!r}")


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Reject(f"expected a string, got {type(value).__name__} {value!r}")


def _instant(value: Any) -> dt.datetime:
    """Value as an aware UTC datetime (naive datetimes and numbers count as UTC)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    # bool is a numbers.Real at runtime (ABC registration mypy does not see)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # type: ignore[unreachable]
        seconds = float(value)
        if math.isnan(seconds):
            raise _Reject("NaN is not a time")
        return _EPOCH_UTC + dt.timedelta(seconds=seconds)
    if type(value).__name__ == "datetime64":  # numpy.datetime64
        micros = value.astype("datetime64[us]").astype("int64")
        return _EPOCH_UTC + dt.timedelta(microseconds=int(micros))
    raise _Reject(
        f"expected a datetime or seconds since the epoch, got {type(value).__name__} {value!r}"
    )


def _to_timestamp(value: Any) -> dt.datetime:
    return _instant(value)


def _to_timestamp_ntz(value: Any) -> dt.datetime:
    return _instant(value).replace(tzinfo=None)


def _to_date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    raise _Reject(f"expected a date, got {type(value).__name__} {value!r}")


# Applied to every value: pyarrow would silently truncate 1.5 to 1 or read an
# int as microseconds, so these types never take the fast path.
_COERCERS: dict[type, Callable[[Any], Any]] = {
    T.ByteType: _to_int,
    T.ShortType: _to_int,
    T.IntegerType: _to_int,
    T.LongType: _to_int,
    T.TimestampType: _to_timestamp,
    T.TimestampNTZType: _to_timestamp_ntz,
}

# Tried only when ``pyarrow.array`` rejected the column as given.
_FALLBACKS: dict[type, Callable[[Any], Any]] = {
    T.FloatType: _to_float,
    T.DoubleType: _to_float,
    T.DecimalType: _to_decimal,
    T.BooleanType: _to_bool,
    T.StringType: _to_str,
    T.DateType: _to_date,
}
