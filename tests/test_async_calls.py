"""spark_glue.async_udf and async_map: async calls inside Spark tasks."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import pandas as pd
import pytest
from pyspark import cloudpickle as spark_cloudpickle
from pyspark.sql import Row
from pyspark.sql import types as T

from aec.async_io import AsyncFunction
from aec.retry import FixedDelay
from spark_glue import async_map, async_udf

# Spark's Python workers cannot import this test module: ship its functions by value
# (UDFs and mapInArrow closures go through PySpark's own copy of cloudpickle).
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Calls running right now in this process (a Spark worker); read by the calls themselves.
_running = {"now": 0}


async def _tracked(value):
    """Sleep a little while counting concurrent calls; the peak seen rides along."""
    _running["now"] += 1  # one event loop thread per task: no race
    peak = _running["now"]
    await asyncio.sleep(0.005)
    _running["now"] -= 1
    return peak


def _numbers(spark, n=200, partitions=2):
    return spark.range(n).repartition(partitions).selectExpr("cast(id as int) as x")


def test_async_udf_returns_one_value_per_row_in_row_order_with_calls_in_flight(spark):
    @async_udf("struct<doubled:int, peak:int>", capacity=20)
    async def doubled(x):
        peak = await _tracked(x)
        return {"doubled": None if x is None else 2 * x, "peak": peak}

    rows = _numbers(spark).select("x", doubled("x").alias("r")).collect()
    assert sorted(r.x for r in rows) == list(range(200))
    assert all(r.r.doubled == 2 * r.x for r in rows)
    peaks = [r.r.peak for r in rows]
    assert max(peaks) > 1, "calls ran one at a time"
    assert max(peaks) <= 20, "more calls in flight than capacity"


@pytest.mark.parametrize("ordered", [True, False])
def test_async_udf_with_several_columns_and_nulls(spark, ordered):
    @async_udf(T.LongType(), capacity=8, ordered=ordered)
    async def add(a, b):
        await asyncio.sleep(0.001 * ((a or 0) % 3))  # finish out of order
        return None if a is None or b is None else a + b

    df = spark.createDataFrame(
        [(i, None if i % 7 == 0 else 10 * i) for i in range(100)], "a long, b long"
    ).repartition(3)
    rows = df.select("a", "b", add("a", "b").alias("s")).collect()
    assert len(rows) == 100
    for row in rows:
        assert row.s == (None if row.b is None else row.a + row.b)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_async_udf_arguments_are_plain_python_values(spark, batch_size):
    # a null is None (pandas hands the UDF NaN for a number, NaT for a time), a struct a
    # dict (pandas hands a DataFrame of its fields), an array a list (a numpy array)
    def describe(n, st, xs):
        return (
            "null" if n is None else f"{type(n).__name__}:{int(n)}",
            "null" if st is None else f"{type(st).__name__}:{sorted(st.items())}",
            "null" if xs is None else f"{type(xs).__name__}:{xs}",
        )

    if batch_size is None:

        @async_udf("array<string>", capacity=4)
        async def show(n, st, xs):
            return list(describe(n, st, xs))

    else:

        @async_udf("array<string>", capacity=4, batch_size=batch_size)
        async def show(values):
            return [list(describe(*row)) for row in values]

    df = spark.sql(
        "select i, if(i % 2 = 0, null, i * 10) as n, named_struct('a', i, 'b', 'x') as st, "
        "array(i, i + 1) as xs from range(6) as t(i)"
    ).repartition(1)
    rows = df.select("i", show("n", "st", "xs").alias("d")).orderBy("i").collect()
    for row in rows:
        i = row.i
        if i % 2 == 0:
            assert row.d[0] == "null"
        else:  # a bigint column with nulls in the batch is float64 in pandas
            assert row.d[0] in (f"float:{10 * i}", f"int:{10 * i}")
        assert row.d[1] == f"dict:{[('a', i), ('b', 'x')]}"
        assert row.d[2] == f"list:{[i, i + 1]}"


def test_async_udf_in_filter_and_sql(spark):
    @async_udf("boolean", capacity=10)
    async def is_even(x):
        await asyncio.sleep(0)
        return x % 2 == 0

    kept = sorted(r.x for r in _numbers(spark, 50).filter(is_even("x")).collect())
    assert kept == list(range(0, 50, 2))
    spark.udf.register("aec_is_even", is_even)
    _numbers(spark, 30).createOrReplaceTempView("aec_numbers")
    count = spark.sql("select count(*) as n from aec_numbers where aec_is_even(x)").first().n
    assert count == 15


def test_async_udf_retries_then_succeeds(spark):
    seen: set = set()  # per worker process

    @async_udf("int", capacity=5, retry=FixedDelay(3, 0.0))
    async def flaky(x):
        if x not in seen:
            seen.add(x)
            raise ConnectionError(f"first call of {x} fails")
        return x + 1

    rows = _numbers(spark, 40).select("x", flaky("x").alias("y")).collect()
    assert all(r.y == r.x + 1 for r in rows)


def test_async_udf_failure_and_timeout_fail_the_job_naming_the_cause(spark):
    @async_udf("int", capacity=4)
    async def broken(x):
        if x == 13:
            raise ValueError("no thirteen here")
        return x

    with pytest.raises(Exception, match="no thirteen here"):
        _numbers(spark, 30).select(broken("x")).collect()

    @async_udf("int", capacity=4, timeout=0.2)
    async def slow(x):
        await asyncio.sleep(5 if x == 3 else 0)
        return x

    with pytest.raises(Exception, match="TimeoutError"):
        _numbers(spark, 10, partitions=1).select(slow("x")).collect()


def _is_null(results):
    return results == [None]


def test_async_udf_retry_predicates_see_the_call_s_result(spark):
    calls: dict = {}  # per worker process

    # the predicate sees the call's result as [value], not the UDF's internal tagging
    @async_udf("string", capacity=5, retry=FixedDelay(3, 0.0, retry_on_result=_is_null))
    async def sometimes_missing(x):
        calls[x] = calls.get(x, 0) + 1
        return None if calls[x] == 1 and x % 2 else f"v{x}"

    rows = _numbers(spark, 20, partitions=1).select("x", sometimes_missing("x").alias("v"))
    assert all(r.v == f"v{r.x}" for r in rows.collect())


def test_async_udf_rejects_bad_arguments_on_the_driver():
    with pytest.raises(ValueError, match="capacity"):
        async_udf("int", capacity=0)
    with pytest.raises(TypeError, match="capacity"):
        async_udf("int", capacity="10")
    with pytest.raises(TypeError, match="timeout"):
        async_udf("int", timeout=True)
    with pytest.raises(ValueError, match="timeout"):
        async_udf("int", timeout=-1)
    with pytest.raises(TypeError, match="retry"):
        async_udf("int", retry=3)
    with pytest.raises(TypeError, match="async def"):
        async_udf("int")(lambda x: x)


@pytest.mark.parametrize("ordered", [True, False])
def test_batched_async_udf_sends_rows_in_batches_with_their_results_in_row_order(spark, ordered):
    @async_udf("struct<doubled:int, size:int>", capacity=32, batch_size=8, ordered=ordered)
    async def doubled(values):
        await asyncio.sleep(0.002 * (values[0] % 3))  # batches finish out of order
        return [{"doubled": 2 * v, "size": len(values)} for v in values]

    rows = _numbers(spark).select("x", doubled("x").alias("r")).collect()
    assert sorted(r.x for r in rows) == list(range(200))
    assert all(r.r.doubled == 2 * r.x for r in rows)
    sizes = [r.r.size for r in rows]
    assert max(sizes) == 8, "no batch was full"  # 100 rows per task: mostly full batches
    assert sum(1 / s for s in sizes) <= 200 / 4  # calls: far fewer than rows


def test_batched_async_udf_with_several_columns_gets_tuples_and_retries_per_row(spark):
    seen: set = set()  # per worker process

    @async_udf(T.LongType(), capacity=12, batch_size=4, retry=FixedDelay(3, 0.0))
    async def add(pairs):
        if any(a == 5 for a, _ in pairs) and 5 not in seen:
            seen.add(5)
            raise ConnectionError("the batch holding 5 fails once")
        return [None if b is None else a + b for a, b in pairs]

    df = spark.createDataFrame(
        [(i, None if i % 7 == 0 else 10 * i) for i in range(60)], "a long, b long"
    ).repartition(2)
    rows = df.select("a", "b", add("a", "b").alias("s")).collect()
    assert len(rows) == 60
    assert all(row.s == (None if row.b is None else row.a + row.b) for row in rows)


def test_batched_async_udf_result_of_the_wrong_length_fails_the_job(spark):
    @async_udf("int", capacity=8, batch_size=4)
    async def short(values):
        return values[1:]

    with pytest.raises(Exception, match=r"short returned 3 results for a batch of 4 inputs"):
        _numbers(spark, 8, partitions=1).select(short("x")).collect()


@pytest.mark.parametrize("batch_size", [None, 4])
def test_async_udf_results_pandas_would_change_silently_fail_the_job_naming_them(spark, batch_size):
    # pandas would make 3.5 a 3 in a bigint column (also in a struct's field or an array)
    # and 1e300 an infinity in a float one, without a word
    if batch_size is None:

        @async_udf("bigint", capacity=4)
        async def half(x):
            return x + 0.5 if x == 3 else x

    else:

        @async_udf("bigint", capacity=4, batch_size=batch_size)
        async def half(values):
            return [x + 0.5 if x == 3 else x for x in values]

    numbers = _numbers(spark, 8, partitions=1)
    with pytest.raises(Exception, match=r"async_udf 'half' returned 3\.5 .*not an integral"):
        numbers.select(half("x")).collect()

    @async_udf("struct<a:int, s:array<bigint>>", capacity=4)
    async def field(x):
        return {"a": x, "s": [x, x / 2], "b": "other keys are ignored, as PySpark's UDFs do"}

    with pytest.raises(Exception, match=r"0\.5 is not an integral value \(at result\.s\[1\]\)"):
        numbers.select(field("x")).collect()

    @async_udf("float", capacity=4)
    async def huge(x):
        return 1e300 if x == 5 else float(x)

    with pytest.raises(Exception, match=r"async_udf 'huge' returned 1e\+300 .*overflows a float"):
        numbers.select(huge("x")).collect()

    # numbers that are not floats: pyarrow truncates or overflows them silently too
    @async_udf("struct<n:bigint, f:float, d:double>", capacity=4)
    async def exact(x):
        if x == 2:
            return {"n": Fraction(3, 2), "f": 1.0, "d": 1.0}
        if x == 4:
            return {"n": 1, "f": Decimal("1e39"), "d": 1.0}
        if x == 6:
            return {"n": 1, "f": 1.0, "d": Decimal("1e400")}
        return {"n": Decimal(x), "f": x / 2, "d": 0.5}  # a whole Decimal is an integer

    for x, why in [(2, "Fraction.3, 2. is not an integral value .at result.n."),
                   (4, "Decimal..1E.39.. overflows a float"),
                   (6, "Decimal..1E.400.. overflows a double")]:  # fmt: skip
        with pytest.raises(Exception, match=why):
            numbers.where(f"x = {x}").select(exact("x")).collect()
    fine = numbers.where("x = 5").select(exact("x").alias("r")).collect()
    assert fine[0].r == Row(n=5, f=2.5, d=0.5)

    @async_udf("struct<t:timestamp, d:date>", capacity=4)
    async def when(x):  # Arrow would read a number as microseconds (or days)
        return {"t": 1_600_000_000 if x == 1 else None, "d": 19000 if x == 2 else None}

    for x, why in [(1, "1600000000 is a number for a timestamp.*at result.t"),
                   (2, "19000 is a number for a date.*at result.d")]:  # fmt: skip
        with pytest.raises(Exception, match=why):
            numbers.where(f"x = {x}").select(when("x")).collect()

    @async_udf("struct<n:bigint, t:string, d:double>", capacity=4)
    async def missing(x):  # pandas' missing values are null, as for any pandas UDF
        return {"n": float("nan"), "t": pd.NA, "d": None} if x % 2 else {"n": x, "t": "x", "d": 1.0}

    rows = numbers.select("x", missing("x").alias("r")).collect()
    assert all((r.r.n, r.r.t) == ((None, None) if r.x % 2 else (r.x, "x")) for r in rows)

    @async_udf("struct<a:int, b:string>", capacity=4)
    async def named(x):
        return Row(b=str(x), a=x)  # a Row built with names is read by its names

    rows = numbers.select("x", named("x").alias("r")).collect()
    assert sorted((r.x, r.r.a, r.r.b) for r in rows) == [(i, i, str(i)) for i in range(8)]

    @async_udf("bigint", capacity=4)
    async def whole(x):
        return float(x)  # an integral float fits: kept as the integer

    rows = numbers.select("x", whole("x").alias("w")).collect()
    assert sorted((r.x, r.w) for r in rows) == [(i, i) for i in range(8)]
    assert all(type(r.w) is int for r in rows)


def test_batched_async_udf_rejects_bad_batch_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        async_udf("int", batch_size=0)
    with pytest.raises(TypeError, match="batch_size"):
        async_udf("int", batch_size=2.5)
    with pytest.raises(ValueError, match="batch_timeout"):
        async_udf("int", batch_size=4, batch_timeout=-1)
    with pytest.raises(ValueError, match="batch_size too"):
        async_udf("int", batch_timeout=0.1)


async def _fan_out(row):
    """0, 1 or 2 output rows per input row, finishing out of order."""
    x = row["x"]
    await asyncio.sleep(0.001 * (x % 4))
    return [{"x": x, "copy": c} for c in range(x % 3)]


def _expected_fan_out(n):
    return [(x, c) for x in range(n) for c in range(x % 3)]


def test_async_map_ordered_keeps_input_order_within_a_partition(spark):
    df = spark.createDataFrame([(i,) for i in range(60)], "x int").coalesce(1)
    rows = async_map(df, _fan_out, "x int, copy int", mode="ordered", capacity=16).collect()
    assert [(r.x, r.copy) for r in rows] == _expected_fan_out(60)


def test_async_map_unordered_emits_every_result(spark):
    df = _numbers(spark, 60, partitions=3)
    rows = async_map(df, _fan_out, "x int, copy int", mode="unordered", capacity=16).collect()
    assert Counter((r.x, r.copy) for r in rows) == Counter(_expected_fan_out(60))


class _ThreadedLookup(AsyncFunction):
    """Flink style: completes its result futures from a thread of its own, as a client
    library's callback thread would; tuples in schema order."""

    def open(self):
        self.threads = []

    def async_invoke(self, value, result_future):
        thread = threading.Thread(target=result_future.complete, args=([(value["x"], "hit")],))
        self.threads.append(thread)
        thread.start()

    def close(self):
        for thread in self.threads:
            thread.join()


def test_async_map_with_a_flink_style_function(spark):
    rows = async_map(_numbers(spark, 25), _ThreadedLookup(), "x int, tag string").collect()
    assert sorted((r.x, r.tag) for r in rows) == [(x, "hit") for x in range(25)]


def test_async_map_rejects_bad_arguments(spark):
    df = _numbers(spark, 5)
    with pytest.raises(ValueError, match="mode"):
        async_map(df, _fan_out, "x int, copy int", mode="sideways")
    with pytest.raises(TypeError, match="AsyncFunction"):
        async_map(df, lambda row: [row], "x int")
    with pytest.raises(ValueError, match="capacity"):
        async_map(df, _fan_out, "x int, copy int", capacity=0)


async def _plus_hundred(row):
    await asyncio.sleep(0.001)
    return [{"x": row["x"], "y": row["x"] + 100}]


@pytest.mark.spark
def test_async_map_on_a_streaming_dataframe_with_a_file_sink(spark, tmp_path):
    """Structured Streaming: async_map (mapInArrow) runs per micro-batch; the file sink's
    commit log makes the output exactly once across runs of the query."""
    source, sink, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    source.mkdir()

    def run_query():
        stream = spark.readStream.schema("x int").json(str(source))
        mapped = async_map(stream, _plus_hundred, "x int, y int", mode="unordered", capacity=8)
        query = (
            mapped.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None

    (source / "a.json").write_text("".join(f'{{"x": {i}}}\n' for i in range(30)))
    run_query()
    (source / "b.json").write_text("".join(f'{{"x": {i}}}\n' for i in range(30, 50)))
    run_query()  # a restart picks up only the new file
    rows = sorted(tuple(r) for r in spark.read.parquet(str(sink)).collect())
    assert rows == [(i, i + 100) for i in range(50)]
