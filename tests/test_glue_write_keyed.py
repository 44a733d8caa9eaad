"""spark_glue.write_keyed: several operators over one shuffle, Parquet written by the
partitions (spark_glue.keyed_parquet, spark_glue.parquet_out)."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pandas as pd
import pyarrow.compute as pc
import pytest

from aec import AecConfig, KeyedProcessFunction, ValueStateDescriptor
from backends import RocksDBBackend
from spark_glue import parquet_out, process_keyed, side_output
from spark_glue.keyed_parquet import KeyedOperator, write_keyed
from spark_glue.raw_frame import RawLayout

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = "k string, seq long, x long, t double"


class Counted(KeyedProcessFunction):
    """Per key: count and sum of ``x`` so far; odd ``x`` also to side output ``odd``;
    fails on ``x == fail_on``."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.fail_on = fail_on

    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("state", default=(0, 0)))

    async def process_element(self, value, ctx):
        if value["x"] == self.fail_on:
            raise RuntimeError(f"cannot handle {value['x']}")
        count, total = await self.state.async_value()
        count, total = count + 1, total + value["x"]
        await self.state.async_update((count, total))
        ctx.output({"k": ctx.current_key, "seq": value["seq"], "n": count, "total": total,
                    "wm": ctx.timer_service.current_watermark()})  # fmt: skip
        if value["x"] % 2:
            ctx.side_output("odd", (ctx.current_key, value["seq"]))


class Fields(KeyedProcessFunction):
    """Emits the sorted field names of each record's dict."""

    def process_element(self, value, ctx):
        ctx.output((ctx.current_key, ",".join(sorted(value))))


OUT = "k string, seq long, n long, total long, wm double"
ODD = "k string, seq long"


def rows(count: int = 400) -> list[tuple]:
    return [(f"k{(i * 7) % 13}", i, (i * 31) % 17 - 3, float(i // 3)) for i in range(count)]


def no_k0(batch):
    return pc.not_equal(batch.column("k"), "k0")


def counted(tmp_path, name: str, **kw) -> KeyedOperator:
    return KeyedOperator(
        name, Counted(), OUT, str(tmp_path / name),
        side_outputs={"odd": (ODD, str(tmp_path / f"{name}_odd"))}, **kw,
    )  # fmt: skip


def frame_rows(frame: pd.DataFrame) -> list[tuple]:
    return sorted(frame.itertuples(index=False, name=None))


@pytest.mark.spark
def test_each_operator_equals_its_own_process_keyed(spark, tmp_path):
    df = spark.createDataFrame(rows(), ROWS)
    common = {"timestamp": "t", "watermark_delay": 2.0, "order_by": "seq",
              "watermark_interval": 10, "num_partitions": 3}  # fmt: skip
    first = counted(tmp_path, "all", backend=RocksDBBackend(str(tmp_path / "state_all")))
    second = counted(tmp_path, "some", row_filter=no_k0, columns=["seq", "x"],
                     config=AecConfig(buffer_size=3))  # fmt: skip
    written = write_keyed(df, [first, second], "k", **common)

    assert [w.name for w in written] == ["all", "some"]
    for op, frame, done in ((first, df, written[0]), (second, df.where("k != 'k0'"), written[1])):
        expected = process_keyed(frame, Counted(), key="k", output_schema=OUT,
                                 side_outputs={"odd": ODD}, **common)  # fmt: skip
        main = pd.read_parquet(op.output_path)
        odd = pd.read_parquet(op.side_outputs["odd"][1])
        assert frame_rows(main) == sorted(tuple(r) for r in expected.collect())
        assert frame_rows(odd) == sorted(tuple(r) for r in side_output(expected, "odd").collect())
        assert done.rows == {op.output_path: len(main), op.side_outputs["odd"][1]: len(odd)}
        assert [m["partition"] for m in done.metrics] == [0, 1, 2]
        assert sum(m["records_in"] for m in done.metrics) == frame.count()
        for m in done.metrics:
            assert 0 <= m["elapsed_s"] <= m["pass_s"] and m["watermarks_in"] >= 1
        for path in op.paths().values():
            names = sorted(os.listdir(path))
            assert names[0] == "_SUCCESS" and len(names) == 4  # a file per partition
            assert all(n.startswith("part-0000") and n.endswith(".snappy.parquet") for n in names[1:])
    assert sorted(os.listdir(tmp_path / "state_all")) == ["partition-0", "partition-1", "partition-2"]


@pytest.mark.spark
def test_records_carry_only_the_named_columns(spark, tmp_path):
    df = spark.createDataFrame(rows(20), ROWS)
    ops = [
        KeyedOperator("named", Fields(), "k string, fields string", str(tmp_path / "named"),
                      columns=["x"]),
        KeyedOperator("all", Fields(), "k string, fields string", str(tmp_path / "all")),
    ]  # fmt: skip
    write_keyed(df, ops, "k", timestamp="t", order_by="seq", num_partitions=2)
    assert set(pd.read_parquet(tmp_path / "named")["fields"]) == {"x"}
    assert set(pd.read_parquet(tmp_path / "all")["fields"]) == {"k,seq,t,x"}


@pytest.mark.spark
def test_an_unused_stream_still_has_its_schema_and_a_rerun_overwrites(spark, tmp_path):
    df = spark.createDataFrame([(f"k{i}", i, 2 * i, 0.0) for i in range(30)], ROWS)  # even x
    op = counted(tmp_path, "even")
    write_keyed(df, [op], "k", order_by="seq", num_partitions=2)
    odd = pd.read_parquet(tmp_path / "even_odd")
    assert list(odd.columns) == ["k", "seq"] and len(odd) == 0
    first = set(os.listdir(tmp_path / "even"))
    done = write_keyed(df.limit(10), [op], "k", order_by="seq", num_partitions=2)
    assert not first & set(os.listdir(tmp_path / "even")) - {"_SUCCESS"}
    assert len(pd.read_parquet(tmp_path / "even")) == 10 == done[0].rows[op.output_path]


@pytest.mark.spark
def test_a_failing_operator_fails_the_job_and_leaves_no_files(spark, tmp_path):
    df = spark.createDataFrame(rows(100), ROWS)
    bad = KeyedOperator("bad", Counted(fail_on=5), OUT, str(tmp_path / "bad"),
                        side_outputs={"odd": (ODD, str(tmp_path / "bad_odd"))})  # fmt: skip
    with pytest.raises(Exception, match="JobFailure") as info:
        write_keyed(df, [counted(tmp_path, "good"), bad], "k", order_by="seq", num_partitions=2)
    assert "cannot handle 5" in str(info.value)
    for name in ("good", "good_odd", "bad", "bad_odd"):
        assert os.listdir(tmp_path / name) == []


@pytest.mark.spark
def test_bad_arguments_fail_on_the_driver(spark, tmp_path):
    df = spark.createDataFrame(rows(5), ROWS)
    with pytest.raises(ValueError, match="at least one operator"):
        write_keyed(df, [], "k")
    with pytest.raises(ValueError, match="unique"):
        write_keyed(df, [counted(tmp_path, "a"), counted(tmp_path, "a")], "k")
    same_dir = KeyedOperator("b", Counted(), OUT, str(tmp_path / "a"),
                             side_outputs={"odd": (ODD, str(tmp_path / "b_odd"))})  # fmt: skip
    with pytest.raises(ValueError, match="its own directory"):
        write_keyed(df, [counted(tmp_path, "a"), same_dir], "k")
    inside = KeyedOperator("b", Counted(), OUT, str(tmp_path / "b"),
                           side_outputs={"odd": (ODD, str(tmp_path / "b" / "odd"))})  # fmt: skip
    with pytest.raises(ValueError, match="lies inside output directory"):
        write_keyed(df, [inside], "k")
    with pytest.raises(ValueError, match="is a URI: write_keyed writes local paths"):
        write_keyed(df, [KeyedOperator("u", Counted(), OUT, f"file://{tmp_path}/u")], "k")
    assert not (tmp_path / "b").exists() and not os.path.exists("file:")
    with pytest.raises(ValueError, match=r"columns \['nope'\]"):
        write_keyed(df, [counted(tmp_path, "a", columns=["x", "nope"])], "k")
    with pytest.raises(ValueError, match="column 'nope'"):
        write_keyed(df, [counted(tmp_path, "a")], "nope")
    df.write.parquet(str(tmp_path / "input"))
    stored = spark.read.parquet(str(tmp_path / "input"))
    reads_its_output = KeyedOperator("c", Counted(), OUT, str(tmp_path / "input"))
    with pytest.raises(ValueError, match="an output directory and an input"):
        write_keyed(stored, [reads_its_output], "k")
    assert stored.count() == 5
    assert not (tmp_path / "a").exists()  # nothing touched before the checks passed


# --- parquet_out without Spark ------------------------------------------------------------------


class _Emitting:
    """Stands in for an operator: drain_outputs / drain_side_outputs."""

    def __init__(self, main: list, sides: dict) -> None:
        self.main, self.sides = main, sides

    def drain_outputs(self):
        main, self.main = self.main, []
        return main

    def drain_side_outputs(self):
        sides, self.sides = self.sides, {}
        return sides


def _layout():
    from pyspark.sql import types as T

    main = T.StructType([T.StructField("a", T.LongType()), T.StructField("t", T.TimestampNTZType())])
    return RawLayout.build(main, {"odd": T.StructType([T.StructField("b", T.StringType())])})


def test_streams_are_written_in_row_groups_and_committed(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_out, "ROW_GROUP_ROWS", 4)
    targets = {"main": str(tmp_path / "main"), "odd": str(tmp_path / "odd")}
    parquet_out.prepare(targets.values())
    streams = parquet_out.ParquetStreams(_layout(), targets, "part-00000.parquet", "attempt-7")
    for start in range(0, 10, 3):
        op = _Emitting([(i, 3600.0 * i) for i in range(start, start + 3)], {"odd": [("x",)]})
        assert list(streams.drain(op)) == []
    files = streams.close()
    assert files["main"][1] == 12 and files["odd"][1] == 4
    assert streams.main_rows == 12 and streams.side_rows == 4
    # a retried attempt's leftovers are not committed
    os.makedirs(tmp_path / "main" / "_temporary" / "attempt-3")
    (tmp_path / "main" / "_temporary" / "attempt-3" / "part-00000.parquet").write_bytes(b"junk")
    parquet_out.commit(targets.values(), [path for path, _ in files.values()])
    assert sorted(os.listdir(tmp_path / "main")) == ["_SUCCESS", "part-00000.parquet"]
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(tmp_path / "main" / "part-00000.parquet").metadata
    assert meta.num_row_groups == 2  # 6 + 6 rows: a group once 4 are pending, not one per drain
    main = pd.read_parquet(tmp_path / "main")
    assert list(main["a"]) == list(range(12))
    assert main["t"].iloc[1] == pd.Timestamp("1970-01-01 01:00:00")


def test_streams_refuse_undeclared_tags_and_foreign_files(tmp_path):
    targets = {"main": str(tmp_path / "main"), "odd": str(tmp_path / "odd")}
    parquet_out.prepare(targets.values())
    streams = parquet_out.ParquetStreams(_layout(), targets, "p.parquet", "attempt-0")
    with pytest.raises(ValueError, match="side output 'even' is not declared"):
        streams.drain(_Emitting([], {"even": [("x",)]}))
    with pytest.raises(TypeError, match="main output does not fit its schema"):
        streams.drain(_Emitting([("not a number", 0.0)], {}))
    streams.abort()
    with pytest.raises(ValueError, match="no output directory"):
        parquet_out.ParquetStreams(_layout(), {"main": targets["main"]}, "p", "a")
    with pytest.raises(ValueError, match="not a task file"):
        parquet_out.commit(targets.values(), [str(tmp_path / "elsewhere" / "p.parquet")])
    parquet_out.abort(targets.values())
    assert os.listdir(tmp_path / "main") == [] == os.listdir(tmp_path / "odd")

