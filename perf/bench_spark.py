"""Spark-path benchmark: the same keyed function and rows in-process and through process_keyed.

Workload: the keyed counter of ``bench_core`` (callback style, one read, one write, one
output ``(k, n)`` per row) over ``--rows`` rows ``(k long, v long, t double)`` with
Zipf(1.1) keys over ``--keys`` ids (seeded), on ``RocksDBBackend`` (``RocksDBSpec`` in a
temp directory). Variants, interleaved per round (``perf/harness.py``):

* ``run_keyed``: ``aec.run_keyed`` over ``Record(k, row)`` built before the clock (the
  engine alone: what a partition could do at best);
* ``glue``: ``process_keyed``'s partition function (``PartitionJob.run``, the
  ``mapInArrow`` body) called in this process on the rows as Arrow batches of 10,000
  (Spark's ``maxRecordsPerBatch``): Arrow to records, the operator, outputs back to
  Arrow, the metrics row; no JVM;
* ``spark``: ``process_keyed(..., num_partitions=1)`` on a ``local[2]`` session (started
  outside the clock): timed by the partition's engine time ``elapsed_s`` (its operator
  from the first input batch to ``finish``, the glue's Arrow conversions included); the
  partition's ``wall_s`` (its whole time in the Python worker, the wait for the JVM's
  shuffle read and sort included) and the action's wall time (``count()`` on the
  persisted result) are reported beside it;
* ``write_keyed``: the same through ``spark_glue.write_keyed`` (the flights job's way:
  the partition writes its output as Parquet, no output row goes back to the JVM), timed
  the same way.

Goal: engine records/s of one partition through ``process_keyed``
(rows / partition ``elapsed_s``) >= 0.6x in-process ``run_keyed``, measured side by side.

Usage::

    PYTHONPATH=$PWD .venv/bin/python perf/bench_spark.py             # perf/results/
    PYTHONPATH=$PWD .venv/bin/python perf/bench_spark.py --quick     # temp dir
    PYTHONPATH=$PWD .venv/bin/python perf/bench_spark.py --no-spark  # run_keyed vs glue only
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter as Tally
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from bench_core import Counter, make_keys  # noqa: E402

from aec import AecConfig, Record, run_keyed  # noqa: E402
from backends.rocksdb import RocksDBBackend, RocksDBSpec  # noqa: E402

DEFAULTS = {"rows": 200_000, "keys": 10_000, "repeats": 3}
QUICK = {"rows": 20_000, "keys": 1_000, "repeats": 1}
ARROW_BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
OUTPUT = "k long, n long"
GOAL = 0.6


class RowCounter(Counter):
    """The keyed counter emitting a tuple in the output schema's order."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.count.async_value().then_compose(
            lambda n: self.count.async_update(n + 1).then_accept(
                lambda _: ctx.output((ctx.current_key, n + 1))
            )
        )


@dataclass(frozen=True)
class Variant:
    name: str
    label: str


VARIANTS = [
    Variant("run_keyed", "in-process run_keyed (engine alone)"),
    Variant("glue", "process_keyed's partition function, in-process (no JVM)"),
    Variant("spark", "process_keyed on Spark, 1 partition (engine elapsed_s)"),
    Variant("write_keyed", "write_keyed on Spark, 1 partition (engine elapsed_s)"),
]


class Env:
    def __init__(self, args: argparse.Namespace) -> None:
        import pyarrow as pa

        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="aec-bench-spark-")
        keys = make_keys("zipf-1.1", args.rows, args.keys, args.seed)
        self.expected = dict(Tally(keys))
        self.table = pa.table({"k": keys, "v": list(range(args.rows)),
                               "t": [float(i) for i in range(args.rows)]})  # fmt: skip
        self.batches = self.table.to_batches(max_chunksize=ARROW_BATCH)
        self.records = [Record(row["k"], row) for row in self.table.to_pylist()]
        self.spark: Any = None
        self.runs = 0

    def path(self) -> str:
        self.runs += 1
        return f"{self.tmp}/run-{self.runs}"

    def check(self, label: str, state: dict[Any, int]) -> None:
        if state != self.expected:
            wrong = sum(1 for k, n in self.expected.items() if state.get(k) != n)
            raise AssertionError(f"{label}: final state wrong for {wrong} keys")


def job(spec: Any) -> Any:
    import cloudpickle
    from pyspark.sql import types as T

    from spark_glue.partition import PartitionJob
    from spark_glue.raw_frame import RawLayout

    main = T.StructType([T.StructField("k", T.LongType()), T.StructField("n", T.LongType())])
    return PartitionJob(cloudpickle.dumps(RowCounter()), spec, AecConfig(), ["k"], None, 0.0,
                        1000, RawLayout.build(main, {}))  # fmt: skip


def run_variant(v: Variant, env: Env) -> h.Sample:
    rows = env.args.rows
    path = env.path()
    try:
        if v.name == "run_keyed":
            backend = RocksDBBackend(path)
            backend.open()
            sample = h.timed(
                lambda: dict(run_keyed(env.records, RowCounter(), backend).metrics), rows
            )
            env.check(v.name, backend.state_items("count"))
            backend.close()
            return sample
        if v.name == "glue":
            spec = RocksDBSpec(path)
            out: list[Any] = []

            def glue() -> dict[str, Any]:
                out.extend(job(spec).run(iter(env.batches)))
                return {}

            sample = h.timed(glue, rows)
            main = sum(b.num_rows for b in out[:-1])
            if main != rows:
                raise AssertionError(f"glue: {main} output rows for {rows} rows")
            check = RocksDBBackend(f"{path}/partition-0")
            check.open()
            env.check(v.name, check.state_items("count"))
            check.close()
            return sample
        if v.name == "write_keyed":
            return run_write_keyed(env, path)
        return run_spark(env, path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_spark(env: Env, path: str) -> h.Sample:
    from spark_glue import partition_metrics, process_keyed, unpersist

    df = env.spark.createDataFrame(env.table.to_pandas()).repartition(1).cache()
    df.count()  # the input is materialized outside the clock
    start = time.perf_counter()
    result = process_keyed(df, RowCounter(), "k", OUTPUT, order_by="v",
                           backend=RocksDBSpec(path), num_partitions=1)  # fmt: skip
    rows_out = result.count()
    action = time.perf_counter() - start
    m = partition_metrics(result).collect()[0].asDict()
    unpersist(result)
    df.unpersist()
    if rows_out != env.args.rows:
        raise AssertionError(f"spark: {rows_out} output rows for {env.args.rows} rows")
    # The engine's time in the partition (elapsed_s: the operator from its first input
    # batch to finish, the glue's conversions included), as the goal reads;
    # wall_s (the whole Python worker, waits for the JVM's sort included) is reported too.
    return h.Sample(m["elapsed_s"], m.get("cpu_s", m["wall_s"]), env.args.rows,
                    {"action_s": action, "wall_s": m["wall_s"], "batches": m["batches"]})  # fmt: skip


def run_write_keyed(env: Env, path: str) -> h.Sample:
    """The flights job's way: outputs written as Parquet by the partition (no output row
    back to the JVM, nothing cached); timed by the partition's engine ``elapsed_s``."""
    import pandas as pd

    from spark_glue import KeyedOperator, write_keyed

    df = env.spark.createDataFrame(env.table.to_pandas()).repartition(1).cache()
    df.count()  # the input is materialized outside the clock
    start = time.perf_counter()
    op = KeyedOperator("counter", RowCounter(), OUTPUT, f"{path}-out", backend=RocksDBSpec(path))
    done = write_keyed(df, [op], "k", order_by="v", num_partitions=1)[0]
    action = time.perf_counter() - start
    df.unpersist()
    rows_out = len(pd.read_parquet(f"{path}-out"))
    shutil.rmtree(f"{path}-out", ignore_errors=True)
    if rows_out != env.args.rows:
        raise AssertionError(f"write_keyed: {rows_out} output rows for {env.args.rows} rows")
    m = done.metrics[0]
    return h.Sample(m["elapsed_s"], m["cpu_s"], env.args.rows,
                    {"action_s": action, "wall_s": m["wall_s"], "batches": m["batches"]})  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    p = report["params"]
    lines = [
        *h.md_header(
            "bench_spark: the keyed counter in-process and through process_keyed",
            f"{p['rows']:,} rows, Zipf(1.1) keys over {p['keys']:,} ids, RocksDB",
            report,
        ),  # fmt: skip
        "",
        *h.md_table(
            [
                "variant",
                "records/s (best)",
                "median",
                "per CPU-s",
                "vs run_keyed",
                "per CPU-s vs run_keyed",
                "Spark action s",
                "partition wall s",
            ],  # fmt: skip
            [
                [
                    r["label"],
                    h.fmt_rate(r["best_rps"]),
                    h.fmt_rate(r["median_rps"]),
                    h.fmt_rate(r["cpu_rps"]),
                    h.fmt_ratio(r["best_rps"] / report["results"]["run_keyed"]["best_rps"]),
                    h.fmt_ratio(r["cpu_rps"] / report["results"]["run_keyed"]["cpu_rps"]),
                    f"{r['metrics']['action_s']:.2f}" if "action_s" in r["metrics"] else "",
                    f"{r['metrics']['wall_s']:.2f}" if "wall_s" in r["metrics"] else "",
                ]
                for r in report["results"].values()
            ],
        ),  # fmt: skip
        *h.goal_lines(report["goals"], report.get("profile")),
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = h.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rows = list(report["results"].values())
    h.bars(ax, range(len(rows)), [r["best_rps"] for r in rows], color="#4c72b0")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["name"] for r in rows])
    ax.set_ylabel("records/s (best)")
    ax.set_title("keyed counter on RocksDB: engine alone vs the Spark path", fontsize=10)
    h.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, help="rows (default 200,000)")
    parser.add_argument("--keys", type=int, help="key ids (default 10,000)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark variant")
    h.add_common_args(parser)
    args = h.finish_args(parser, parser.parse_args(argv), "bench_spark", DEFAULTS, QUICK)
    machine = h.machine_facts(("pyspark", "pyarrow", "rocksdict"))
    env = Env(args)
    spark_variants = ("spark", "write_keyed")
    variants = [v for v in VARIANTS if not (args.no_spark and v.name in spark_variants)]
    try:
        if not args.no_spark:
            import bench_core
            import cloudpickle
            from pyspark.sql import SparkSession

            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers: this venv
            cloudpickle.register_pickle_by_value(bench_core)  # perf/ is not on the workers' path

            env.spark = (SparkSession.builder.master("local[2]").appName("bench_spark")
                         .config("spark.ui.enabled", "false").getOrCreate())  # fmt: skip
        for v in variants:  # warm-up (Spark: the first job ships the Python worker)
            run_variant(v, env)
        samples = h.run_rounds(variants, lambda v: run_variant(v, env), args.repeats)
        text = None
        if not args.no_profile:
            text = h.profile_call(lambda: run_variant(VARIANTS[1], env), "glue, in-process")[0]
    finally:
        if env.spark is not None:
            env.spark.stop()
        shutil.rmtree(env.tmp, ignore_errors=True)
    results = {
        v.name: {"name": v.name, "label": v.label, **h.summarize(samples[v.name])} for v in variants
    }
    base = results["run_keyed"]
    goals = {}
    for name in ("spark", "glue", "write_keyed"):
        if name in results:
            r = results[name]
            goals[name] = h.goal(
                f"{name} records/s per partition / run_keyed",
                r["best_rps"] / base["best_rps"],
                at_least=GOAL,
                cpu_value=r["cpu_rps"] / base["cpu_rps"],
                per_round=h.paired(samples, name, "run_keyed"),
            )
    for r in results.values():
        print(f"{r['label']:<58} {h.fmt_rate(r['best_rps']):>10} rec/s "
              f"({r['best_rps'] / base['best_rps']:.2f}x run_keyed)")  # fmt: skip
    for g in goals.values():
        print(f"{h.verdict(g)}: {g['text']}: {g['measured']}")
    report = {"benchmark": "bench_spark", "date": h.now(), "machine": machine,
              "params": {"rows": args.rows, "keys": args.keys, "repeats": args.repeats, "seed": args.seed,
                         "arrow_batch": ARROW_BATCH, "backend": "RocksDBSpec"},
              "results": results, "goals": goals, "profile": h.write_profile(args.out, "bench_spark", text)}  # fmt: skip
    h.write_outputs(args.out, "bench_spark", report, markdown(report), lambda p: plot(report, p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
