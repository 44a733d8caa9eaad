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
from pyspark.sql import types as T

import spark_glue
from aec import (
    AecConfig,
    KeyedProcessFunction,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.keygroups import key_group_for
from backends import MemoryBackend, RocksDBBackend
from spark_glue import partition_metrics, process_keyed, side_output
from spark_glue.convert import encode_columns, rows_as_dicts, timestamp_seconds
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
