"""spark_glue: Arrow conversion, watermark generation and process_keyed on Spark."""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import sys
from decimal import Decimal

import cloudpickle
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

import spark_glue
from aec import (
    AecConfig,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.keygroups import key_group_for
from backends import MemoryBackend, RocksDBBackend
from spark_glue import partition_metrics, process_keyed, side_output
from spark_glue.convert import (
    arrow_schema,
    encode_columns,
    encode_rows,
    rows_as_dicts,
    timestamp_seconds,
)
from spark_glue.routing import keys_of
from spark_glue.watermarks import BoundedOutOfOrderness, delay_seconds

# The functions below are defined in this test module, which Spark's Python
# workers cannot import: ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

UTC = dt.UTC


# --- user functions -------------------------------------------------------------------------


class RunningSum(KeyedProcessFunction):
    """Per key: running total of ``x`` (async def style) and an event-time timer
    ``fire_after`` seconds after each record, which reports the total."""

    def __init__(self, fire_after: float | None = None) -> None:
        self.fire_after = fire_after

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total"))

    async def process_element(self, value, ctx):
        total = (await self.total.async_value() or 0) + value["x"]
        await self.total.async_update(total)
        ctx.output({"k": ctx.current_key, "seq": value["seq"], "total": total})
        if self.fire_after is not None:
            ctx.timer_service.register_event_time_timer(ctx.timestamp + self.fire_after)

    def on_timer(self, timestamp, ctx):
        return self.total.async_value().then_accept(
            lambda total: ctx.output({"k": ctx.current_key, "seq": -1, "total": total})
        )


class EchoTimes(KeyedProcessFunction):
    """Emits the record's key, event time and watermark seen; no state."""

    def process_element(self, value, ctx):
        ctx.output((ctx.current_key, ctx.timestamp, value["seq"]))


class AllTypes(KeyedProcessFunction):
    """Emits one row per record built by ``value['style']``: dict, tuple or nulls."""

    def process_element(self, value, ctx):
        if value["style"] == "nulls":
            ctx.output({"i": None})
            return
        row = {
            "i": 3.0,  # an integral float into an int column
            "l": np.int64(2**40),
            "f": 1,  # an int into a double column
            "s": "text",
            "b": True,
            "ts": 86400.5,  # seconds since the epoch
            "ntz": dt.datetime(2013, 1, 1, 5, 15, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            "d": dt.datetime(2013, 2, 3, 4, 5),
            "dec": 1.25,
        }
        if value["style"] == "tuple":
            row = tuple(row.values())
        ctx.output(row)


ALL_TYPES = (
    "i int, l long, f double, s string, b boolean, ts timestamp, ntz timestamp_ntz, d date, "
    "dec decimal(10,2)"
)


class Splitter(KeyedProcessFunction):
    """Even ``x`` to the main output, odd to side ``odd``, negatives to ``neg``."""

    def process_element(self, value, ctx):
        x = value["x"]
        if x < 0:
            ctx.side_output("neg", {"k": ctx.current_key, "x": x})
        elif x % 2:
            ctx.side_output("odd", (ctx.current_key, float(x)))
        else:
            ctx.output({"k": ctx.current_key, "x": x})


class FailOn(KeyedProcessFunction):
    """Raises for the record of key ``bad``."""

    def __init__(self, bad: str) -> None:
        self.bad = bad

    def process_element(self, value, ctx):
        if ctx.current_key == self.bad:
            raise RuntimeError(f"cannot handle {value['x']}")
        ctx.output({"k": ctx.current_key})


class UndeclaredSide(KeyedProcessFunction):
    def process_element(self, value, ctx):
        ctx.side_output("mystery", {"k": ctx.current_key})


# --- watermarks (no Spark) ------------------------------------------------------------------


def test_watermarks_every_interval_never_regress():
    gen = BoundedOutOfOrderness(delay=10, interval=3)
    stamps = [100, 50, 120, 90, 80, 70, 200, 10, 5, 5, None, 6]
    marks = [gen.on_record(t) for t in stamps]
    # after records 3, 6, 9, 12: max 120 -> 110, still 120 (no repeat), 200 -> 190, still 200
    assert marks == [None, None, 110, None, None, None, None, None, 190, None, None, None]
    assert gen.emitted == 2 and gen.current == 190 and gen.max_timestamp == 200


def test_watermarks_wait_for_a_timestamp_and_accept_timedelta():
    gen = BoundedOutOfOrderness(dt.timedelta(minutes=2), 1)
    assert gen.on_record(None) is None  # nothing seen yet: no -inf watermark
    assert gen.on_record(1000.0) == 880.0
    assert delay_seconds(None) == 0.0 and delay_seconds(dt.timedelta(hours=2)) == 7200.0


@pytest.mark.parametrize("bad", [-1, float("nan"), "2h", True])
def test_watermark_delay_rejects_bad_values(bad):
    with pytest.raises((TypeError, ValueError)):
        delay_seconds(bad)


@pytest.mark.parametrize("interval", [0, -5, 1.5, True])
def test_watermark_interval_must_be_positive_int(interval):
    with pytest.raises(ValueError, match="watermark_interval"):
        BoundedOutOfOrderness(0, interval)


# --- Arrow conversion (no Spark) ------------------------------------------------------------


def test_timestamp_seconds_from_every_time_type():
    instant = dt.datetime(2013, 1, 1, 5, 15, 30, 500000)
    expected = (instant - dt.datetime(1970, 1, 1)).total_seconds()
    cases = [
        pa.array([instant, None], pa.timestamp("us")),
        pa.array([instant.replace(tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
        pa.array([instant, None], pa.timestamp("ns")),
        pa.array([expected, None], pa.float64()),
    ]
    for column in cases:
        assert timestamp_seconds(column) == [expected, None]
    assert timestamp_seconds(pa.array([7, None], pa.int32())) == [7.0, None]
    assert timestamp_seconds(pa.array([dt.date(1970, 1, 3)], pa.date32())) == [172800.0]
    # a decimal column (Spark's DecimalType: numeric seconds to the driver's check too)
    decimals = pa.array([Decimal("1700000000.125"), None], pa.decimal128(20, 3))
    assert timestamp_seconds(decimals) == [1700000000.125, None]
    with pytest.raises(TypeError, match="timestamp column"):
        timestamp_seconds(pa.array(["2013-01-01"]))


def _schema(ddl_fields: list[tuple[str, T.DataType, bool]]) -> T.StructType:
    return T.StructType([T.StructField(n, t, nullable) for n, t, nullable in ddl_fields])


def _encode(rows, schema):
    from spark_glue.convert import arrow_schema

    return encode_columns(rows_as_dicts(rows, schema), schema, arrow_schema(schema))


def test_encode_coerces_to_the_declared_types():
    schema = _schema(
        [
            ("i", T.IntegerType(), True),
            ("f", T.DoubleType(), True),
            ("s", T.StringType(), True),
            ("ts", T.TimestampType(), True),
            ("ntz", T.TimestampNTZType(), True),
            ("d", T.DateType(), True),
            ("dec", T.DecimalType(10, 2), True),
            ("b", T.BooleanType(), True),
        ]
    )
    eastern = dt.timezone(dt.timedelta(hours=-5))
    rows = [
        {
            "i": 4.0,
            "f": Decimal("2.5"),
            "s": "a",
            "ts": 1.5,
            "ntz": dt.datetime(2013, 1, 1, 0, 0, tzinfo=eastern),
            "d": dt.datetime(2013, 1, 2, 23, 0),
            "dec": 0.1,
            "b": np.bool_(True),
        },
        (np.int32(7), 3, "b", dt.datetime(2013, 1, 1), dt.date(2013, 1, 1), None, 2, False),
        {"i": float("nan")},  # pandas' missing int: null; absent fields: null
    ]
    arrays = _encode(rows, schema)
    assert [a.type for a in arrays] == [
        pa.int32(),
        pa.float64(),
        pa.string(),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("us"),
        pa.date32(),
        pa.decimal128(10, 2),
        pa.bool_(),
    ]
    columns = [a.to_pylist() for a in arrays]
    assert columns[0] == [4, 7, None]
    assert columns[1] == [2.5, 3.0, None]
    assert columns[2] == ["a", "b", None]
    assert columns[3] == [
        dt.datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=UTC),
        dt.datetime(2013, 1, 1, tzinfo=UTC),  # naive read as UTC
        None,
    ]
    assert columns[4] == [dt.datetime(2013, 1, 1, 5, 0), dt.datetime(2013, 1, 1), None]
    assert columns[5] == [dt.date(2013, 1, 2), None, None]
    assert columns[6] == [Decimal("0.10"), Decimal("2.00"), None]
    assert columns[7] == [True, False, None]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (T.LongType(), 1.5, "not an integral value"),
        (T.LongType(), True, "booleans are not integers"),
        (T.IntegerType(), 2**40, "field 'x'"),
        (T.StringType(), 5, "expected a string"),
        (T.DoubleType(), "1.0", "expected a number"),
        (T.TimestampType(), "2013-01-01", "expected a datetime"),
        (T.BooleanType(), 1, "expected a boolean"),
        (T.FloatType(), 1e300, "cannot hold 1e\\+300: it overflows"),  # not a silent inf
        (T.FloatType(), -3.5e38, "overflows"),
        (T.DoubleType(), 10**400, "field 'x'"),
    ],
)
def test_encode_rejects_values_naming_the_field(field, value, message):
    schema = _schema([("x", field, True)])
    with pytest.raises(TypeError, match=message) as info:
        _encode([{"x": value}], schema)
    assert "'x'" in str(info.value)


def test_encode_keeps_infinities_that_were_given():
    schema = _schema([("x", T.FloatType(), True), ("y", T.DoubleType(), True)])
    arrays = _encode([{"x": float("inf"), "y": 1e300}, {"x": -math.inf, "y": None}], schema)
    assert [a.to_pylist() for a in arrays] == [[math.inf, -math.inf], [1e300, None]]


def test_encode_checks_nullability_and_row_shapes():
    schema = _schema([("a", T.LongType(), False), ("b", T.StringType(), True)])
    with pytest.raises(TypeError, match="'a' is not nullable"):
        _encode([{"b": "x"}], schema)
    with pytest.raises(TypeError, match=r"fields \['c'\] not in the schema"):
        _encode([{"a": 1, "c": 2}], schema)
    with pytest.raises(TypeError, match="has 1 values, the schema has 2"):
        _encode([(1,)], schema)
    with pytest.raises(TypeError, match="dict or a tuple"):
        _encode([5], schema)
    from pyspark.sql import Row

    assert [a.to_pylist() for a in _encode([Row(b="y", a=1)], schema)] == [[1], ["y"]]


# --- nested values: the top level's rules at any depth (no Spark) -----------------------------


def _one(dtype: T.DataType, value, nullable: bool = True):
    """``value`` of the one field ``x`` of type ``dtype``, through ``encode_rows``."""
    schema = _schema([("x", dtype, nullable)])
    return encode_rows([{"x": value}], schema, arrow_schema(schema))[0].to_pylist()[0]


def _struct(*fields: tuple[str, T.DataType, bool]) -> T.StructType:
    return _schema(list(fields))


def test_a_nested_bigint_refuses_1_5_as_a_top_level_one_does():
    with pytest.raises(TypeError, match="not an integral value"):
        _one(T.LongType(), 1.5)
    with pytest.raises(TypeError, match=r"'x' \(array<bigint>\) at x\[0\]: 1.5 is not an integral"):
        _one(T.ArrayType(T.LongType()), [1.5])  # was [1]


def test_a_nested_struct_bigint_refuses_1_7():
    with pytest.raises(TypeError, match=r"at x\.a: 1.7 is not an integral value"):
        _one(_struct(("a", T.LongType(), True)), {"a": 1.7})  # was {"a": 1}


def test_seconds_in_a_nested_timestamp_are_seconds_as_at_the_top_level():
    top = _one(T.TimestampType(), 1_700_000_000)
    assert top == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert _one(T.ArrayType(T.TimestampType()), [1_700_000_000]) == [top]  # was 1970-01-01
    assert _one(T.MapType(T.StringType(), T.TimestampNTZType()), {"t": 1.5}) == [
        ("t", dt.datetime(1970, 1, 1, 0, 0, 1, 500000))
    ]


def test_a_typo_in_a_nested_struct_field_is_refused_as_at_the_top_level():
    struct = _struct(("a", T.LongType(), True))
    with pytest.raises(TypeError, match=r"'x' \(struct<a:bigint>\): struct has fields \['aa'\]"):
        _one(struct, {"aa": 1})  # was {"a": None}
    with pytest.raises(TypeError, match=r"at x\[1\]: struct has fields \['aa'\] not in"):
        _one(T.ArrayType(struct), [{"a": 1}, {"aa": 1}])
    with pytest.raises(TypeError, match=r"struct has fields \['aa'\]"):
        _one(struct, Row(aa=1))  # a Row built with names is read by its names
    with pytest.raises(TypeError, match="struct tuple has 2 values, its type has 1 fields"):
        _one(struct, (1, 2))  # a tuple's length, as a top-level row's
    with pytest.raises(TypeError, match="expected a struct"):
        _one(struct, 5)


def test_a_deep_value_gets_every_rule_and_its_error_names_the_path():
    inner = _struct(("t", T.TimestampType(), True), ("n", T.ArrayType(T.IntegerType()), True))
    dtype = T.ArrayType(inner)
    value = [
        {"t": 86400.5, "n": [1, 2.0, np.int32(3), None]},
        None,
        (dt.datetime(2013, 1, 1, 5, 0), np.array([4, 5])),
        Row(n=[], t=dt.date(2013, 1, 2)),
    ]
    assert _one(dtype, value) == [
        {"t": dt.datetime(1970, 1, 2, 0, 0, 0, 500000, tzinfo=UTC), "n": [1, 2, 3, None]},
        None,
        {"t": dt.datetime(2013, 1, 1, 5, 0, tzinfo=UTC), "n": [4, 5]},
        {"t": dt.datetime(2013, 1, 2, tzinfo=UTC), "n": []},
    ]
    message = (
        r"^output field 'x' \(array<struct<t:timestamp,n:array<int>>>\) at x\[1\]\.n\[2\]: "
        r"2\.5 is not an integral value$"
    )
    with pytest.raises(TypeError, match=message):
        _one(dtype, [{"n": [1]}, {"t": 0, "n": [1, 2, 2.5]}])
    with pytest.raises(TypeError, match=r"at x\[0\]\.t: expected a datetime or seconds"):
        _one(dtype, [{"t": "2013-01-01"}])
    with pytest.raises(TypeError, match=r"at x\[0\]\.n: expected an array .* got str 'ab'"):
        _one(dtype, [{"n": "ab"}])  # pyarrow read a string as its characters


def test_map_keys_and_values_are_coerced_and_null_keys_refused():
    dtype = T.MapType(T.LongType(), T.TimestampType())
    one = dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert _one(dtype, {1.0: 1, np.int64(2): None}) == [(1, one), (2, None)]
    assert _one(dtype, [(3, one), [4, 1]]) == [(3, one), (4, one)]  # (key, value) pairs
    assert _one(T.MapType(T.StringType(), T.StringType()), {"a": "b"}) == [("a", "b")]
    with pytest.raises(TypeError, match=r"at x\[key 1\.5\]: 1\.5 is not an integral value"):
        _one(dtype, {1.5: 0})
    with pytest.raises(TypeError, match=r"at x\[2\]: expected a datetime"):
        _one(dtype, {2: "soon"})
    for nulls in ({None: 1}, [(None, 1)], {math.nan: 1}):  # NaN: a missing integer
        with pytest.raises(TypeError, match=r"null, but map keys cannot be null"):
            _one(dtype, nulls)
    with pytest.raises(TypeError, match="map keys cannot be null"):
        _one(T.MapType(T.StringType(), T.StringType()), {None: "b"})
    with pytest.raises(TypeError, match=r"expected a map \(a dict or \(key, value\) pairs\)"):
        _one(T.MapType(T.StringType(), T.StringType()), ["ab"])


def test_none_is_refused_where_the_nested_type_cannot_hold_null():
    strict_array = T.ArrayType(T.StringType(), containsNull=False)
    assert _one(strict_array, ["a"]) == ["a"] and _one(strict_array, None) is None
    with pytest.raises(TypeError, match=r"at x\[1\]: null, but the array's elements"):
        _one(strict_array, ["a", None])
    with pytest.raises(TypeError, match=r"at x\[0\]: null, but the array's elements"):
        _one(T.ArrayType(T.LongType(), containsNull=False), [math.nan])  # a missing int
    with pytest.raises(TypeError, match=r"at x\['a'\]: null, but the map's values"):
        _one(T.MapType(T.StringType(), T.LongType(), valueContainsNull=False), {"a": None})
    required = _struct(("a", T.LongType(), False), ("b", T.StringType(), True))
    assert _one(required, {"a": 1}) == {"a": 1, "b": None}
    for missing in ({"b": "x"}, {"a": None}, (None, "x")):
        with pytest.raises(TypeError, match=r"at x\.a: null, but the field is not nullable"):
            _one(required, missing)
    with pytest.raises(TypeError, match=r"at x\[0\]\.a: null, but the field is not nullable"):
        _one(T.ArrayType(required), [{"b": "x"}])


def test_correct_nested_values_round_trip_exactly():
    eastern = dt.timezone(dt.timedelta(hours=-5))
    row = _struct(
        ("i", T.LongType(), True),
        ("f", T.DoubleType(), True),
        ("d", T.DecimalType(10, 2), True),
        ("ts", T.TimestampType(), True),
        ("ntz", T.TimestampNTZType(), True),
        ("day", T.DateType(), True),
        ("s", T.StringType(), True),
        ("b", T.BooleanType(), True),
        ("small", T.FloatType(), True),
    )
    schema = _schema(
        [
            ("ints", T.ArrayType(T.LongType()), True),
            ("doubles", T.ArrayType(T.DoubleType()), True),
            ("decimals", T.ArrayType(T.DecimalType(10, 2)), True),
            ("row", row, True),
            ("rows", T.ArrayType(row), True),
            ("counts", T.MapType(T.StringType(), T.ArrayType(T.IntegerType())), True),
        ]
    )
    values = {
        "ints": [2**62, -1, np.int64(7), 3.0, None],
        "doubles": [1, 2.5, Decimal("0.1"), np.float32(0.5), None],
        "decimals": (Decimal("1.25"), 2, 0.1),
        "row": Row(
            i=1,
            f=0.25,
            d=Decimal("9.99"),
            ts=dt.datetime(2013, 1, 1, 0, 0, tzinfo=eastern),
            ntz=dt.datetime(2013, 1, 1, 0, 0, tzinfo=eastern),
            day=dt.datetime(2013, 1, 2, 23),
            s="é",
            b=np.bool_(True),
            small=math.inf,
        ),
        "rows": [(None,) * 9, {"i": 2.0, "s": "x"}],
        "counts": {"a": [1, 2], "b": None, "c": []},
    }
    got = [a.to_pylist()[0] for a in encode_rows([values], schema, arrow_schema(schema))]
    full = {
        "i": 1, "f": 0.25, "d": Decimal("9.99"), "ts": dt.datetime(2013, 1, 1, 5, tzinfo=UTC),
        "ntz": dt.datetime(2013, 1, 1, 5), "day": dt.date(2013, 1, 2), "s": "é", "b": True,
        "small": math.inf,
    }  # fmt: skip
    nulls = dict.fromkeys(full)
    assert got == [
        [2**62, -1, 7, 3, None],
        [1.0, 2.5, 0.1, 0.5, None],
        [Decimal("1.25"), Decimal("2.00"), Decimal("0.10")],
        full,
        [nulls, {**nulls, "i": 2, "s": "x"}],
        [("a", [1, 2]), ("b", None), ("c", [])],
    ]
    assert [type(v) for v in got[0][:4]] == [int] * 4
    # the same rows as tuples, column by column, and through encode_columns: the same
    as_tuple = tuple(values[name] for name in schema.fieldNames())
    again = encode_rows([as_tuple], schema, arrow_schema(schema))
    assert [a.to_pylist()[0] for a in again] == got
    by_dicts = encode_columns(rows_as_dicts([values], schema), schema, arrow_schema(schema))
    assert [a.to_pylist()[0] for a in by_dicts] == got


def test_an_array_takes_lists_tuples_and_numpy_arrays_but_not_strings_or_sets():
    ints = T.ArrayType(T.LongType())
    assert _one(ints, (1, 2)) == [1, 2] and _one(ints, np.array([1, 2])) == [1, 2]
    assert _one(ints, np.array([1.0, 2.0])) == [1, 2]
    with pytest.raises(TypeError, match=r"at x\[1\]: np.float64\(2.5\) is not an integral"):
        _one(ints, np.array([1, 2.5]))
    assert _one(T.ArrayType(T.ArrayType(T.LongType())), np.array([[1, 2], [3, 4]])) == [
        [1, 2],
        [3, 4],
    ]
    stamps = np.array(["2013-01-01T00:00:01"], dtype="datetime64[ns]")
    assert _one(T.ArrayType(T.TimestampType()), stamps) == [
        dt.datetime(2013, 1, 1, 0, 0, 1, tzinfo=UTC)
    ]
    for wrong in ("abc", b"abc", {"a", "b"}, {"a": 1}, 5):  # pyarrow took the first three
        with pytest.raises(TypeError, match=r"'x' \(array<string>\): expected an array"):
            _one(T.ArrayType(T.StringType()), wrong)


def test_numpy_arrays_inside_containers_that_cannot_hold_null():
    """A numpy array answers ``== None`` element-wise: the null checks go by identity."""
    rows = T.ArrayType(T.ArrayType(T.DoubleType()), containsNull=False)
    assert _one(rows, np.array([[1.0, 2.0], [3.0, 4.0]])) == [[1.0, 2.0], [3.0, 4.0]]
    assert _one(rows, [np.array([1.0]), np.array([2.0])]) == [[1.0], [2.0]]
    with pytest.raises(TypeError, match=r"at x\[1\]: null, but the array's elements are not"):
        _one(rows, [np.array([1.0]), None])
    vectors = T.MapType(T.StringType(), T.ArrayType(T.DoubleType()), valueContainsNull=False)
    assert _one(vectors, {"e": np.array([1.0, 2.0])}) == [("e", [1.0, 2.0])]


def test_one_struct_column_may_mix_dicts_tuples_and_rows():
    struct = _struct(("a", T.LongType(), True), ("b", T.StringType(), True))
    values = [{"a": 1, "b": "x"}, (2, "y"), Row(b="z", a=3), [4, "w"], None, {"a": 5.0}]
    schema = _schema([("x", struct, True)])
    got = encode_rows([{"x": v} for v in values], schema, arrow_schema(schema))[0].to_pylist()
    assert got == [
        {"a": 1, "b": "x"},
        {"a": 2, "b": "y"},
        {"a": 3, "b": "z"},  # by name: pyarrow read a Row by position
        {"a": 4, "b": "w"},
        None,
        {"a": 5, "b": None},
    ]


LEAF_CASES = [
    (T.LongType(), 3),
    (T.LongType(), 3.0),
    (T.LongType(), np.int64(2**40)),
    (T.LongType(), 1.5),
    (T.LongType(), True),
    (T.LongType(), "1"),
    (T.IntegerType(), 2**40),
    (T.ByteType(), 1000),
    (T.DoubleType(), 1),
    (T.DoubleType(), Decimal("2.5")),
    (T.DoubleType(), "1.0"),
    (T.DoubleType(), 10**400),
    (T.FloatType(), 0.1),
    (T.FloatType(), math.inf),
    (T.FloatType(), 1e300),
    (T.FloatType(), -3.5e38),
    (T.FloatType(), 10**39),
    (T.StringType(), "a"),
    (T.StringType(), 5),
    (T.BooleanType(), np.bool_(False)),
    (T.BooleanType(), 1),
    (T.TimestampType(), 86400.5),
    (T.TimestampType(), 1_700_000_000),
    (T.TimestampType(), dt.datetime(2013, 1, 1)),
    (T.TimestampType(), dt.datetime(2013, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))),
    (T.TimestampType(), dt.date(2013, 1, 1)),
    (T.TimestampType(), "2013-01-01"),
    (T.TimestampType(), math.nan),
    (T.TimestampType(), 1e20),
    (T.TimestampNTZType(), dt.datetime(2013, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5)))),
    (T.DateType(), dt.datetime(2013, 1, 2, 23)),
    (T.DateType(), "2013-01-02"),
    (T.DecimalType(10, 2), 0.1),
    (T.DecimalType(10, 2), 3),
    (T.DecimalType(10, 2), Decimal("1.234")),
]


@pytest.mark.parametrize(
    ("leaf", "value"),
    LEAF_CASES,
    ids=[f"{leaf.simpleString()}-{value!r:.20}" for leaf, value in LEAF_CASES],
)
def test_a_value_inside_an_array_a_struct_or_a_map_gets_the_top_level_rule(leaf, value):
    def outcome(dtype, given):
        try:
            return _one(dtype, given), None
        except TypeError as exc:
            return None, str(exc)

    top, refused = outcome(leaf, value)
    wrapped = [
        (T.ArrayType(leaf), [value], [top]),
        (_struct(("a", leaf, True)), {"a": value}, {"a": top}),
        (T.MapType(T.StringType(), leaf), {"k": value}, [("k", top)]),
        (T.ArrayType(T.ArrayType(leaf)), [[value]], [[top]]),
    ]
    for dtype, given, expected in wrapped:
        got, error = outcome(dtype, given)
        if refused:
            assert error is not None and "output field 'x'" in error, (dtype, error)
        else:
            assert (got, error) == (expected, None), dtype


# --- process_keyed on Spark -----------------------------------------------------------------


def _rows(n_keys: int, n_rows: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    return [
        (
            f"k{rng.randrange(n_keys)}",
            seq,
            rng.randrange(-5, 20),
            float(5 * seq + rng.randrange(60)),
        )
        for seq in range(n_rows)
    ]


ROWS_DDL = "k string, seq long, x long, t double"
SUM_DDL = "k string, seq long, total long"


@pytest.mark.spark
def test_process_keyed_matches_run_keyed_per_key(spark):
    rows = _rows(n_keys=7, n_rows=300, seed=1)
    df = spark.createDataFrame(rows, ROWS_DDL)
    result = process_keyed(
        df, RunningSum(), key="k", output_schema=SUM_DDL, order_by="seq", num_partitions=3
    )
    got = {}
    for row in result.collect():
        got.setdefault(row.k, []).append((row.seq, row.total))
    reference = run_keyed([Record(k, {"seq": s, "x": x}) for k, s, x, _ in rows], RunningSum())
    expected = {}
    for out in reference.outputs:
        if not isinstance(out, Watermark):
            expected.setdefault(out["k"], []).append((out["seq"], out["total"]))
    assert {k: sorted(v) for k, v in got.items()} == expected
    # same-key order held: within a key, totals follow the sequence order
    assert all(v == sorted(v) for v in expected.values())


@pytest.mark.spark
def test_one_partition_equals_run_keyed_with_the_same_watermarks(spark):
    rows = _rows(n_keys=4, n_rows=120, seed=2)
    df = spark.createDataFrame(rows, ROWS_DDL)
    result = process_keyed(
        df,
        RunningSum(fire_after=30),
        key="k",
        output_schema=SUM_DDL,
        timestamp="t",
        watermark_delay=50,
        order_by="seq",
        watermark_interval=7,
        num_partitions=1,
    )
    got = [tuple(r) for r in result.collect()]  # one partition: the emission order
    source, gen = [], BoundedOutOfOrderness(50, 7)
    for k, s, x, t in rows:
        source.append(Record(k, {"seq": s, "x": x}, t))
        mark = gen.on_record(t)
        if mark is not None:
            source.append(Watermark(mark))
    reference = run_keyed(source, RunningSum(fire_after=30))
    expected = [(o["k"], o["seq"], o["total"]) for o in reference.outputs if isinstance(o, dict)]
    assert got == expected
    assert any(seq == -1 for _, seq, _ in got)  # timers fired
    metrics = partition_metrics(result).collect()
    assert len(metrics) == 1 and metrics[0].watermarks_in == gen.emitted > 5
    assert metrics[0].records_in == 120 and metrics[0].main_rows == len(got)


@pytest.mark.spark
def test_default_arrival_order_is_the_dataframe_order(spark):
    rows = [("a", seq, 1, float(1000 - seq)) for seq in range(50)]
    rows.reverse()  # the DataFrame lists seq 49 first
    df = spark.createDataFrame(rows, ROWS_DDL)
    result = process_keyed(df, RunningSum(), key="k", output_schema=SUM_DDL, num_partitions=2)
    got = sorted((r.total, r.seq) for r in result.collect())
    assert [seq for _, seq in got] == list(range(49, -1, -1))


@pytest.mark.spark
def test_order_by_names_resolve_as_spark_resolves_them_and_may_be_an_iterator(spark):
    rows = [("a", seq, 1, float(seq)) for seq in range(20)]
    rows.reverse()  # the DataFrame lists seq 19 first
    df = spark.createDataFrame(rows, ROWS_DDL)
    for order in ("SEQ", (name for name in ["seq"]), ("seq",)):  # Spark ignores case
        result = process_keyed(df, RunningSum(), key="k", output_schema=SUM_DDL, order_by=order)
        got = sorted((r.total, r.seq) for r in result.collect())
        assert [seq for _, seq in got] == list(range(20)), order


@pytest.mark.spark
def test_timestamp_columns_become_float_seconds(spark):
    when = dt.datetime(2013, 1, 1, 5, 15)
    df = spark.createDataFrame(
        [("a", 0, when, when), ("a", 1, when + dt.timedelta(seconds=1.5), None)],
        "k string, seq long, ts timestamp, ntz timestamp_ntz",
    )
    epoch = (when - dt.datetime(1970, 1, 1)).total_seconds()
    schema = "k string, t double, seq long"
    for column in ("ts", "ntz"):  # session time zone is UTC: both read as UTC
        result = process_keyed(
            df, EchoTimes(), key="k", output_schema=schema, timestamp=column, order_by="seq"
        )
        got = [(r.t, r.seq) for r in result.collect()]
        assert got == (
            [(epoch, 0), (epoch + 1.5, 1)] if column == "ts" else [(epoch, 0), (None, 1)]
        )


# 2024-11-03 05:30 and 06:30 UTC: both 01:30 wall time in New York (the clocks fall back)
FALL_BACK = [dt.datetime(2024, 11, 3, 5, 30, tzinfo=UTC), dt.datetime(2024, 11, 3, 6, 30, tzinfo=UTC)]


def test_timestamp_keys_are_utc_instants_in_any_session_time_zone():
    """Spark hands timestamps over in the session time zone; the two instants of a
    fall-back hour share a wall time there, which has no stable key form."""
    zoned = pa.array(FALL_BACK, pa.timestamp("us", tz="UTC")).cast(
        pa.timestamp("us", tz="America/New_York")
    )
    keys = keys_of(pa.record_batch({"k": zoned, "j": pa.array([1, 2])}), ["k"])
    assert keys == FALL_BACK and all(key.utcoffset() == dt.timedelta(0) for key in keys)
    assert [key_group_for(key, 128) for key in keys] == [key_group_for(t, 128) for t in FALL_BACK]
    both = keys_of(pa.record_batch({"k": zoned, "j": pa.array([1, 2])}), ["k", "j"])
    assert both == [(FALL_BACK[0], 1), (FALL_BACK[1], 2)]


@pytest.mark.spark
def test_a_timestamp_key_in_a_dst_session_time_zone_keys_each_instant(spark):
    df = spark.createDataFrame(
        [(FALL_BACK[0], 0, 1), (FALL_BACK[1], 1, 10)], "k timestamp, seq long, x long"
    )
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        result = process_keyed(
            df, RunningSum(), key="k", output_schema="k timestamp, seq long, total long",
            num_partitions=2,
        )  # fmt: skip
        got = sorted(tuple(r) for r in result.selectExpr("cast(k as long)", "total").collect())
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert got == [(int(FALL_BACK[0].timestamp()), 1), (int(FALL_BACK[1].timestamp()), 10)]


@pytest.mark.spark
def test_outputs_are_coerced_to_the_declared_schema(spark):
    df = spark.createDataFrame(
        [("a", 0, "dict"), ("b", 1, "tuple"), ("c", 2, "nulls")], "k string, seq long, style string"
    )
    result = process_keyed(df, AllTypes(), key="k", output_schema=ALL_TYPES, num_partitions=2)
    declared = T.StructType.fromDDL(ALL_TYPES)
    assert [(f.name, f.dataType) for f in result.schema] == [(f.name, f.dataType) for f in declared]
    rows = sorted(result.collect(), key=lambda r: r.i is None)
    expected = (
        3,
        2**40,
        1.0,
        "text",
        True,
        dt.datetime(1970, 1, 2, 0, 0, 0, 500000),  # collected in the session zone, UTC
        dt.datetime(2013, 1, 1, 10, 15),  # -05:00 wall time to UTC, naive
        dt.date(2013, 2, 3),
        Decimal("1.25"),
    )
    assert tuple(rows[0]) == expected and tuple(rows[1]) == expected
    assert tuple(rows[2]) == (None,) * 9


@pytest.mark.spark
def test_side_outputs_and_metrics_are_dataframes(spark, tmp_path):
    rows = [(f"k{i % 5}", i, x, 0.0) for i, x in enumerate(range(-10, 40))]
    df = spark.createDataFrame(rows, ROWS_DDL)
    result = process_keyed(
        df,
        Splitter(),
        key="k",
        output_schema="k string, x long",
        num_partitions=2,
        backend=RocksDBBackend(str(tmp_path / "state")),
        side_outputs={"odd": "k string, x double", "neg": T.StructType.fromDDL("k string, x long")},
    )
    xs = list(range(-10, 40))
    assert sorted(r.x for r in result.collect()) == [x for x in xs if x >= 0 and x % 2 == 0]
    odd = side_output(result, "odd")
    assert odd.schema.simpleString() == "struct<k:string,x:double>"
    assert sorted(r.x for r in odd.collect()) == [float(x) for x in xs if x >= 0 and x % 2]
    assert sorted(r.x for r in side_output(result, "neg").collect()) == [x for x in xs if x < 0]
    metrics = partition_metrics(result).toPandas()
    assert sorted(metrics["partition"]) == [0, 1]
    assert metrics["rows_in"].sum() == metrics["records_in"].sum() == 50
    assert metrics["side_rows"].sum() == 30 and metrics["main_rows"].sum() == 20
    for column in ("max_in_flight", "batches", "requests", "mean_batch_size", "elapsed_s"):
        assert column in metrics
    assert sorted(os.listdir(tmp_path / "state")) == ["partition-0", "partition-1"]
    with pytest.raises(ValueError, match="not declared"):
        side_output(result, "nope")
    with pytest.raises(ValueError, match="not a process_keyed result"):
        side_output(result.filter("x > 0"), "odd")
    spark_glue.unpersist(result)


@pytest.mark.spark
def test_a_user_error_fails_the_job_naming_the_key(spark):
    df = spark.createDataFrame([(f"k{i}", i, i, 0.0) for i in range(20)], ROWS_DDL)
    result = process_keyed(
        df, FailOn("k13"), key="k", output_schema="k string", num_partitions=2,
        config=AecConfig(buffer_size=4),
    )  # fmt: skip
    with pytest.raises(Exception, match="JobFailure") as info:
        result.collect()
    assert "k13" in str(info.value) and "cannot handle 13" in str(info.value)


@pytest.mark.spark
def test_an_undeclared_side_output_fails_the_job(spark):
    df = spark.createDataFrame([("a", 0, 0, 0.0)], ROWS_DDL)
    result = process_keyed(df, UndeclaredSide(), key="k", output_schema="k string")
    with pytest.raises(Exception, match="side output 'mystery' is not declared"):
        result.collect()


@pytest.mark.spark
def test_bad_arguments_fail_on_the_driver(spark):
    df = spark.createDataFrame([("a", 0, 0, 0.0, "x")], ROWS_DDL + ", s string")
    schema = "k string"
    with pytest.raises(ValueError, match="column 'nope'"):
        process_keyed(df, EchoTimes(), key="nope", output_schema=schema)
    with pytest.raises(TypeError, match="timestamp column 's'"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, timestamp="s")
    for order in ("nope", ["s", "nope"]):  # named before any job, as process_keyed_co does
        with pytest.raises(ValueError, match="order_by column 'nope' is not in the DataFrame"):
            process_keyed(df, EchoTimes(), key="k", output_schema=schema, order_by=order)
    with pytest.raises(TypeError, match="order_by takes column names or Columns, got 3"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, order_by=["s", 3])
    with pytest.raises(ValueError, match="needs a timestamp column"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, watermark_delay=5)
    with pytest.raises(ValueError, match="reserved"):
        process_keyed(df, EchoTimes(), key="k", output_schema="__aec_stream string")
    with pytest.raises(ValueError, match="num_partitions"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, num_partitions=0)
    with pytest.raises(TypeError, match="backend"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, backend="memory")
    lock = __import__("threading").Lock()
    unpicklable = EchoTimes()
    unpicklable.lock = lock
    with pytest.raises(TypeError, match="cannot be pickled"):
        process_keyed(df, unpicklable, key="k", output_schema=schema)
    from aec.joins import interval_join

    with pytest.raises(TypeError, match="KeyedProcessFunction.*KeyedCoProcessFunction"):
        process_keyed(df, interval_join(0, 1, max), key="k", output_schema=schema)
    for key in (None, 5, ["k", 3]):
        with pytest.raises(TypeError, match="key takes a column name"):
            process_keyed(df, EchoTimes(), key=key, output_schema=schema)
    with pytest.raises(TypeError, match="order_by takes column names or Columns, got 5"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, order_by=5)
    with pytest.raises(ValueError, match="timestamp column '' is not in the DataFrame"):
        process_keyed(df, EchoTimes(), key="k", output_schema=schema, timestamp="")
    reserved = df.withColumn("__aec_position", df.seq)
    with pytest.raises(ValueError, match=r"\['__aec_position'\].*reserved"):
        process_keyed(reserved, EchoTimes(), key="k", output_schema=schema)
    nested = spark.createDataFrame([(("a", 1), [1], {"a": 1})], "s struct<x:string,y:int>, "
                                   "a array<int>, m map<string,int>")  # fmt: skip
    for column, kind in (("s", "struct"), ("a", "array"), ("m", "map")):
        with pytest.raises(TypeError, match=f"key column '{column}' is {kind}"):
            process_keyed(nested, EchoTimes(), key=column, output_schema=schema)


class Arrivals(KeyedProcessFunction):
    """Per key, the values of ``v`` in arrival order."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=()))

    def process_element(self, value, ctx):
        seen = (*self.seen.value(), value["v"])
        self.seen.update(seen)
        ctx.output({"k": str(ctx.current_key), "seen": list(seen)})


class CoArrivals(KeyedCoProcessFunction):
    """``Arrivals`` over two inputs (its methods: records of either input alike)."""

    open = Arrivals.open
    process_element1 = process_element2 = Arrivals.process_element


@pytest.mark.spark
def test_column_names_with_dots_are_refused_or_read_as_the_columns(spark):
    """One input: PySpark's mapInArrow takes a dotted name as a struct field (beside a
    struct ``a`` with a field ``b``, ``a.b`` would silently be that field), so such a name
    is refused on the driver. Two inputs: the glue quotes the names, and the key and the
    order are the columns."""
    from spark_glue import process_keyed_co

    rows = [(f"k{i % 2}", (f"s{i}", 9 - i), 9 - i, i) for i in range(10)]
    df = spark.createDataFrame(rows, "`a.b` string, a struct<b:string, c:int>, `o.x` int, v int")
    with pytest.raises(ValueError, match=r"\['a.b', 'o.x'\].*struct field"):
        process_keyed(df, Arrivals(), key="k", output_schema="k string, seen array<int>")
    other = spark.createDataFrame([("k0", 100, 100)], "`a.b` string, `o.x` int, v int")
    result = process_keyed_co(df, other, CoArrivals(), key="a.b", order_by="o.x",
                              output_schema="k string, seen array<int>")  # fmt: skip
    final: dict = {}
    for row in result.collect():  # each key's longest list: its last record's
        final[row.k] = max(final.get(row.k, []), row.seen, key=len)
    assert final == {"k0": [8, 6, 4, 2, 0, 100], "k1": [9, 7, 5, 3, 1]}


@pytest.mark.spark
def test_composite_keys_and_memory_spec(spark):
    rows = [("a", i % 2, i) for i in range(10)]
    df = spark.createDataFrame(rows, "k string, j long, seq long")
    result = process_keyed(
        df,
        EchoTimes(),
        key=["k", "j"],
        output_schema="key struct<k:string,j:long>, t double, seq long",
        order_by="seq",
        backend=MemoryBackend().spec(),
    )
    got = sorted((r.seq, tuple(r.key)) for r in result.collect())
    assert got == [(i, ("a", i % 2)) for i in range(10)]


class NestedOut(KeyedProcessFunction):
    """Emits nested values as users build them (``style``: lists and a dict, numpy and
    a tuple, or 1.5 in the ``array<bigint>``)."""

    def process_element(self, value, ctx):
        style = value["style"]
        if style == "lists":
            s = {"a": 7.0, "t": 1.5}
            ctx.output({"k": ctx.current_key, "xs": [1, 2.0, np.int64(3)], "s": s})
        elif style == "numpy":
            s = (8, "y", dt.datetime(2013, 1, 1, 5, 15))
            ctx.output({"k": ctx.current_key, "xs": np.array([4, 5]), "s": s})
        else:
            ctx.output({"k": ctx.current_key, "xs": [1, 1.5], "s": None})


NESTED_DDL = "k string, xs array<bigint>, s struct<a:bigint, b:string, t:timestamp>"


@pytest.mark.spark
def test_nested_outputs_reach_spark_coerced_to_the_declared_types(spark):
    df = spark.createDataFrame([("a", "lists"), ("b", "numpy")], "k string, style string")
    result = process_keyed(df, NestedOut(), key="k", output_schema=NESTED_DDL, num_partitions=2)
    assert result.schema.simpleString() == (
        "struct<k:string,xs:array<bigint>,s:struct<a:bigint,b:string,t:timestamp>>"
    )
    got = sorted((r.k, r.xs, r.s.asDict()) for r in result.collect())
    assert got == [
        ("a", [1, 2, 3], {"a": 7, "b": None, "t": dt.datetime(1970, 1, 1, 0, 0, 1, 500000)}),
        ("b", [4, 5], {"a": 8, "b": "y", "t": dt.datetime(2013, 1, 1, 5, 15)}),  # UTC session
    ]


@pytest.mark.spark
def test_a_nested_value_that_does_not_fit_fails_the_job_naming_the_field(spark):
    df = spark.createDataFrame([("a", "lists"), ("b", "bad")], "k string, style string")
    result = process_keyed(df, NestedOut(), key="k", output_schema=NESTED_DDL, num_partitions=2)
    with pytest.raises(Exception, match="main output does not fit its schema") as info:
        result.collect()  # pyarrow made [1, 1]
    assert "output field 'xs' (array<bigint>) at xs[1]: 1.5 is not an integral value" in str(
        info.value
    )
