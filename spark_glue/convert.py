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
import functools
import math
import numbers
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import repeat
from operator import is_
from typing import Any, NoReturn, cast

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
    * arrays (lists, tuples, numpy arrays), maps (dicts, lists of ``(key, value)``
      pairs) and structs (dicts, tuples or lists in field order, pyspark ``Row`` s),
      at any depth: each value inside by the rules above, as at the top level;
      a struct dict's unknown field names and a struct tuple of the wrong length
      raise, and so does None where the nested type cannot hold null
      (``containsNull`` / ``valueContainsNull`` false, a non-nullable struct
      field, any map key).
    * everything else (strings, booleans, binary) as ``pyarrow.array`` takes it.

    Raises:
        TypeError: naming the field and the offending value, including None in a
            non-nullable field; inside a nested value, also its path from the field
            (``x[2].t``: field ``x``, element 2, struct field ``t``; ``x['k']``: the
            value of map key ``'k'``; ``x[key 'k']``: that key itself).
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
        elif isinstance(field.dataType, _NESTED):
            array = _encode_nested(values, field, arrow_type)
        else:
            try:
                array = pa.array(values, type=arrow_type)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                fallback = _FALLBACKS.get(type(field.dataType))
                if fallback is None:
                    raise _field_error(field, values, exc) from exc
                array = pa.array([None if v is None else fallback(v) for v in values], arrow_type)
    except _Reject as exc:
        where = f" at {field.name}{exc.where}" if exc.where else ""
        raise TypeError(
            f"output field {field.name!r} ({field.dataType.simpleString()}){where}: {exc}"
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
                f"output field {field.name!r} ({field.dataType.simpleString()}) "
                f"{_overflows(value, stored)}"
            )


def _overflows(value: Any, stored: float) -> str:
    return (
        f"cannot hold {value!r}: it overflows the type (to {stored}); use a wider type "
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
    """A value the field's coercion refuses; re-raised as TypeError with the field.

    ``where``: the path to the value inside a nested field's value (``"[0].t"``),
    each container prepending its step as the exception passes; empty at the top level.
    """

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.where = where


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


# --- nested values (arrays, maps, structs) ----------------------------------------------------
#
# ``pyarrow.array`` applies none of the rules above inside a nested value (it truncates
# 1.5 in an ``array<bigint>``, reads a number in an ``array<timestamp>`` as microseconds,
# nulls a misspelled struct field), so a nested field's values are walked first: one
# walker per data type, built once (``_walker``), that applies the top level's coercers
# to every value inside and checks the containers. As at the top level, the fallbacks run
# only when ``pyarrow.array`` rejected the walked column: a second walk applies them too.
#
# A walker takes one non-None value of its type and returns what ``pyarrow.array`` is to
# get for it (the value itself when nothing changes), or raises _Reject. Each container
# first tries a fast path (nothing to change, found in C where it can: ``_KEPT``) and
# on any failure walks its items again one by one (``_check``) to name the culprit.

_NESTED = (T.ArrayType, T.MapType, T.StructType)

_Walk = Callable[[Any], Any]

# Values of these exact types a coercer returns as they are: a container whose items are
# all of them (or None, where allowed) needs no copy and no call per item.
_KEPT: dict[Callable[[Any], Any], frozenset[type]] = {_to_int: frozenset({int})}

_FLOAT32 = struct.Struct("<f")  # packs as C casts to float; OverflowError where that is inf


def _encode_nested(values: list[Any], field: T.StructField, arrow_type: pa.DataType) -> pa.Array:
    walk = cast(_Walk, _walker(field.dataType, False))  # never None for a nested type
    walked = [None if v is None else walk(v) for v in values]
    try:
        return pa.array(walked, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError):
        strict = cast(_Walk, _walker(field.dataType, True))
        walked = [None if v is None else strict(v) for v in values]
        try:
            return pa.array(walked, type=arrow_type)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise _field_error(field, values, exc) from exc


@functools.cache  # pyspark data types hash and compare by value
def _walker(data_type: T.DataType, strict: bool) -> _Walk | None:
    """The walker for ``data_type``: always one for a nested type (its containers need
    checking); for a leaf, its coercer (``strict``: or its fallback), else None (a leaf
    pyarrow takes as it is). A float (float32) leaf is checked for overflow, as the top
    level's ``_check_no_overflow`` does."""
    if isinstance(data_type, T.ArrayType):
        return _array_walker(data_type, strict)
    if isinstance(data_type, T.MapType):
        return _map_walker(data_type, strict)
    if isinstance(data_type, T.StructType):
        return _struct_walker(data_type, strict)
    kind = type(data_type)
    if kind in _COERCERS:
        return _COERCERS[kind]
    if kind is T.FloatType:
        return _to_float32 if strict else _fits_float32
    return _FALLBACKS.get(kind) if strict else None


def _fits_float32(value: Any) -> Any:
    try:
        _FLOAT32.pack(value)
    except OverflowError:
        raise _Reject(_overflows(value, -math.inf if value < 0 else math.inf)) from None
    except (struct.error, ValueError):
        pass  # not a float: pyarrow, or the fallback, takes it or says why not
    return value


def _to_float32(value: Any) -> float:
    return cast(float, _fits_float32(_to_float(value)))


def _kept(walk: _Walk | None, nullable: bool) -> frozenset[type] | None:
    """The types of the items a position in a container (its walker, whether it may be
    null) passes as they are, when ``walk`` keeps any."""
    kept = _KEPT.get(walk) if walk else None
    return kept | {type(None)} if kept is not None and nullable else kept


def _as_is(
    items: Collection[Any], walk: _Walk | None, kept: frozenset[type] | None, nullable: bool
) -> bool:
    """Whether all ``items`` pass their position in a container as they are."""
    if walk is None:
        return nullable or not _holds_none(items)
    return kept is not None and kept.issuperset(map(type, items))


def _holds_none(items: Collection[Any]) -> bool:
    """Whether ``items`` holds None, by identity (``None in items`` compares with ``==``,
    which a numpy array answers element-wise)."""
    return any(map(is_, items, repeat(None)))


def _array_walker(data_type: T.ArrayType, strict: bool) -> _Walk:
    element = _walker(data_type.elementType, strict)
    nullable = data_type.containsNull
    kept = _kept(element, nullable)

    def walk(value: Any) -> Any:
        items = value if type(value) is list or type(value) is tuple else _elements(value)
        if _as_is(items, element, kept, nullable):
            return items
        if element is None:  # a null where none may be
            _array_error(items, element, nullable)
        try:
            out = [None if v is None else element(v) for v in items]
        except (_Reject, OverflowError):
            _array_error(items, element, nullable)
        if not nullable and _holds_none(out):
            _array_error(items, element, nullable)
        return out

    return walk


def _elements(value: Any) -> Sequence[Any]:
    """An array's value as a sequence: any but a string, bytes or a mapping (a set has
    no order), or a numpy array (iterated, its items are numpy scalars)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return value
    if type(value).__name__ == "ndarray" and getattr(value, "ndim", 0) >= 1:
        return cast(Sequence[Any], value)
    raise _Reject(
        f"expected an array (a list, tuple or numpy array), got {type(value).__name__} {value!r}"
    )


def _array_error(items: Sequence[Any], element: _Walk | None, nullable: bool) -> NoReturn:
    for i, v in enumerate(items):
        _check(f"[{i}]", v, element, nullable, "the array's elements are not nullable")
    raise AssertionError("an array failed its walk but none of its elements does")


def _map_walker(data_type: T.MapType, strict: bool) -> _Walk:
    key = _walker(data_type.keyType, strict)
    item = _walker(data_type.valueType, strict)
    nullable = data_type.valueContainsNull
    keys_kept, items_kept = _kept(key, False), _kept(item, nullable)

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            if _as_is(value, key, keys_kept, False) and _as_is(
                value.values(), item, items_kept, nullable
            ):
                return value
            keys_in, items_in = list(value), list(value.values())
        else:
            pairs = _pairs(value)
            keys_in, items_in = [p[0] for p in pairs], [p[1] for p in pairs]
        try:
            keys = keys_in if key is None else [None if k is None else key(k) for k in keys_in]
            items = items_in if item is None else [None if v is None else item(v) for v in items_in]
        except (_Reject, OverflowError):
            _map_error(keys_in, items_in, key, item, nullable)
        if _holds_none(keys) or (not nullable and _holds_none(items)):
            _map_error(keys_in, items_in, key, item, nullable)
        return list(zip(keys, items, strict=True))

    return walk


def _pairs(value: Any) -> Sequence[Any]:
    """A map's value given as ``(key, value)`` pairs (tuples or lists of two)."""
    if isinstance(value, (list, tuple)):
        for pair in value:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise _Reject(
                    f"expected a map (a dict or (key, value) pairs), got the pair {pair!r} "
                    f"in {value!r}"
                )
        return value
    raise _Reject(
        f"expected a map (a dict or (key, value) pairs), got {type(value).__name__} {value!r}"
    )


def _map_error(
    keys: list[Any], items: list[Any], key: _Walk | None, item: _Walk | None, nullable: bool
) -> NoReturn:
    for k, v in zip(keys, items, strict=True):
        _check(f"[key {k!r}]", k, key, False, "map keys cannot be null")
        _check(f"[{k!r}]", v, item, nullable, "the map's values are not nullable")
    raise AssertionError("a map failed its walk but none of its entries does")


def _struct_walker(data_type: T.StructType, strict: bool) -> _Walk:
    fields = data_type.fields
    names = data_type.names
    known = frozenset(names)
    walks = [_walker(f.dataType, strict) for f in fields]
    nullable = [f.nullable for f in fields]
    # the fields to walk, by name (a dict) and by position (a tuple), each with the types
    # it keeps as they are (None too: nullability is checked apart, after)
    kept = [_KEPT.get(w, frozenset()) | {type(None)} if w else frozenset() for w in walks]
    by_name: list[tuple[Any, _Walk, frozenset[type]]]
    by_name = [(n, w, k) for n, w, k in zip(names, walks, kept, strict=True) if w]
    by_index: list[tuple[Any, _Walk, frozenset[type]]]
    by_index = [(i, w, k) for i, (w, k) in enumerate(zip(walks, kept, strict=True)) if w]
    required_names: list[Any] = [f.name for f in fields if not f.nullable]
    required_index: list[Any] = [i for i, f in enumerate(fields) if not f.nullable]

    def walk(value: Any) -> Any:
        get: Callable[[Any], Any]
        # pyarrow takes a struct column as all dicts or all tuples: the strict walk (run
        # when pyarrow rejected the first) makes every struct a dict
        if type(value) is dict:
            if not known.issuperset(value):
                raise _unknown_fields(value, names)
            get, steps, required = value.get, by_name, required_names
        elif type(value) is tuple and not strict:
            if len(value) != len(names):
                raise _struct_length(value, names)
            get, steps, required = value.__getitem__, by_index, required_index
        else:
            return walk(_struct_form(value, names, strict))
        changed: Any = None  # a dict or a list (of a tuple's items) once a field changed
        try:
            for key, step, as_is in steps:
                v = get(key)
                if type(v) not in as_is:
                    new = step(v)
                    if new is not v:
                        if changed is None:
                            changed = dict(value) if type(value) is dict else list(value)
                        changed[key] = new
        except (_Reject, OverflowError):
            _struct_error(value, names, walks, nullable)
        if changed is not None:
            out = changed if type(changed) is dict else tuple(changed)
            get = out.get if type(out) is dict else out.__getitem__
        else:
            out = value
        for key in required:
            if get(key) is None:
                _struct_error(value, names, walks, nullable)
        return out

    return walk


def _struct_form(value: Any, names: list[str], strict: bool) -> dict[Any, Any] | tuple[Any, ...]:
    """A struct's value as a dict or (not ``strict``) a plain tuple, as top-level rows
    are read: any mapping; a pyspark Row built with names by its names; a tuple or list
    in field order."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list)):
        if getattr(value, "__fields__", None):  # a pyspark Row built with names
            return cast(T.Row, value).asDict()
        if not strict:
            return tuple(value)
        if len(value) != len(names):
            raise _struct_length(value, names)
        return dict(zip(names, value, strict=True))
    raise _Reject(
        f"expected a struct (a dict, a tuple in field order or a Row), got "
        f"{type(value).__name__} {value!r}"
    )


def _unknown_fields(value: dict[Any, Any], names: list[str]) -> _Reject:
    extra = sorted(str(k) for k in value.keys() - frozenset(names))
    return _Reject(f"struct has fields {extra} not in its type's {names}: {value!r}")


def _struct_length(value: Sequence[Any], names: list[str]) -> _Reject:
    return _Reject(
        f"struct tuple has {len(value)} values, its type has {len(names)} fields {names}: {value!r}"
    )


def _struct_error(
    value: dict[Any, Any] | tuple[Any, ...],
    names: list[str],
    walks: list[_Walk | None],
    nullable: list[bool],
) -> NoReturn:
    items = list(map(value.get, names)) if type(value) is dict else value
    for v, name, w, can_be_null in zip(items, names, walks, nullable, strict=True):
        _check(f".{name}", v, w, can_be_null, "the field is not nullable (or missing)")
    raise AssertionError("a struct failed its walk but none of its fields does")


def _check(step: str, value: Any, walk: _Walk | None, nullable: bool, null: str) -> None:
    """Walk one item of a container as its fast path did, a _Reject getting ``step``
    prepended to its path: the slow path that names the culprit."""
    try:
        out = value if value is None or walk is None else walk(value)
    except _Reject as exc:
        exc.where = step + exc.where
        raise
    except OverflowError as exc:
        raise _Reject(f"{value!r} is out of range: {exc}", step) from None
    if out is None and not nullable:
        raise _Reject(f"null, but {null}", step)
