"""Async I/O benchmark: waits, async UDFs in Spark, the asyncio floor, threads; call_async.

Part 1. ``--inputs`` inputs (20,000), each a call of a service
whose latency is drawn per input, uniform in ``--latency-low``..``--latency-high``
seconds (5-20 ms, seeded), at most ``--capacity`` (100) calls in flight:

* ``ordered`` / ``unordered`` / ``key-ordered`` (1,000 keys): ``aec.async_io`` waits
  over an asyncio-style ``AsyncFunction``;
* ``asyncio floor``: a plain ``asyncio.Semaphore(capacity)`` + ``gather`` loop;
* ``async_udf in Spark``: ``spark_glue.async_udf`` in a ``select`` over one partition;
* ``thread-pool mapPartitions``: what Spark users do today, a ``ThreadPoolExecutor``
  of ``capacity`` threads blocking in ``time.sleep`` inside ``mapPartitions``;
* the same ordered / unordered / floor against the real aiohttp service
  (``spark_glue.flights.service`` in its own process, the same latency range).

The bound is ``capacity / mean latency`` (8,000/s for 5-20 ms); the ordered bound
adds head-of-line blocking: the exact finish time of an ordered queue of ``capacity``
with these latencies and instant calls (an input enters when the one ``capacity``
before it has left; it leaves after it finished and after its predecessor left).
Goals: unordered >= 0.9 of the bound, async_udf in Spark >= 0.5 of the bound.

Part 2 (section 2): a keyed function that reads state, calls a 5 ms service
(``asyncio.sleep``) with ``ctx.call_async`` and writes state, ``--records`` (20,000)
records over ``--keys`` (2,000) keys: async vs sync (the synchronous mode is timed on
``--sync-records`` records, it makes one call at a time) and vs ``unordered_wait``
followed by ``run_keyed`` (the two-operator way) in the engine, and in Spark
``process_keyed`` with call_async vs ``async_map`` followed by ``process_keyed``.
Goals: async / sync >= 50x; call_async within 1.5x of the two-operator way.

Usage::

    .venv/bin/python perf/bench_async_io.py            # full run, writes perf/results/
    .venv/bin/python perf/bench_async_io.py --quick    # smoke run, temp dir
    .venv/bin/python perf/bench_async_io.py --no-spark # engine variants only
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from aec import AecConfig, KeyedProcessFunction, Record, ValueStateDescriptor, run_keyed  # noqa: E402
from aec.async_io import AsyncFunction, key_ordered_wait, ordered_wait, unordered_wait  # noqa: E402

NAME = "bench_async_io"
DEFAULTS = {"inputs": 20_000, "capacity": 100, "records": 20_000, "keys": 2_000,
            "sync_records": 400, "repeats": 2}  # fmt: skip
QUICK = {"inputs": 2_000, "capacity": 100, "records": 2_000, "keys": 200,
         "sync_records": 100, "repeats": 1}  # fmt: skip
GOAL_UNORDERED = 0.9  # of capacity / mean latency
GOAL_UDF = 0.5
GOAL_CALL_SPEEDUP = 50.0  # call_async async / sync
GOAL_CALL_VS_TWO_OPERATORS = 1.5  # two-operator rate / call_async rate, at most
CALL_LATENCY = 0.005


# --- part 1: the waits ----------------------------------------------------------------------


def latencies(n: int, low: float, high: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(n)]


def ordered_finish(lat: list[float], capacity: int) -> float:
    """Seconds an ordered queue of ``capacity`` needs for calls of these latencies."""
    left: list[float] = []
    previous = 0.0
    for i, latency in enumerate(lat):
        start = left[i - capacity] if i >= capacity else 0.0
        previous = max(previous, start + latency)
        left.append(previous)
    return previous


class Sleep(AsyncFunction):
    def __init__(self, lat: list[float]) -> None:
        self.lat = lat

    async def async_invoke(self, i: int) -> list[int]:
        await asyncio.sleep(self.lat[i])
        return [i]


class Http(AsyncFunction):
    def __init__(self, url: str) -> None:
        from spark_glue.flights.service import ServiceClient

        self.client = ServiceClient(url)

    async def async_invoke(self, i: int) -> list[int]:
        await self.client.plane("N14228")
        return [i]


def wait_variant(wait: str, function: AsyncFunction, n: int, capacity: int) -> Callable[[], Any]:
    def run() -> dict[str, Any]:
        if wait == "ordered":
            out = ordered_wait(range(n), function, 60.0, capacity)
        elif wait == "unordered":
            out = unordered_wait(range(n), function, 60.0, capacity)
        else:
            out = key_ordered_wait(range(n), function, 60.0, capacity,
                                   key_selector=lambda i: i % 1000)  # fmt: skip
        count = sum(1 for _ in out)
        assert count == n, count
        return {}

    return run


def floor_variant(call: Callable[[int], Any], n: int, capacity: int) -> Callable[[], Any]:
    async def main() -> int:
        semaphore = asyncio.Semaphore(capacity)

        async def one(i: int) -> int:
            async with semaphore:
                await call(i)
            return i

        return len(await asyncio.gather(*(one(i) for i in range(n))))

    def run() -> dict[str, Any]:
        assert asyncio.run(main()) == n
        return {}

    return run


def spark_udf_variant(spark: Any, lat: list[float], capacity: int) -> Callable[[], Any]:
    from spark_glue import async_udf

    @async_udf("int", capacity=capacity, timeout=60.0)
    async def call(i: int) -> int:
        await asyncio.sleep(lat[i])
        return i

    df = spark.range(len(lat)).selectExpr("cast(id as int) as i").repartition(1).cache()
    df.count()

    def run() -> dict[str, Any]:
        assert df.select(call("i").alias("r")).agg({"r": "count"}).collect()[0][0] == len(lat)
        return {}

    return run


def spark_threads_variant(spark: Any, lat: list[float], capacity: int) -> Callable[[], Any]:
    def partition(rows: Any) -> Any:
        def call(i: int) -> int:
            time.sleep(lat[i])
            return i

        with ThreadPoolExecutor(capacity) as pool:
            yield from pool.map(call, (row.i for row in rows))

    df = spark.range(len(lat)).selectExpr("cast(id as int) as i").repartition(1).cache()
    df.count()

    def run() -> dict[str, Any]:
        assert df.rdd.mapPartitions(partition).count() == len(lat)
        return {}

    return run


# --- part 2: call_async -------------------------------------------------------------------


async def service_call(value: int) -> int:
    await asyncio.sleep(CALL_LATENCY)
    return value + 1


class ReadCallWrite(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value: Any, ctx: Any) -> None:
        seen = await self.count.async_value()
        enriched = await ctx.call_async(service_call, value, timeout=30.0)
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, enriched, seen + 1))


class ReadWrite(KeyedProcessFunction):
    """The second operator of the two-operator way: the value is already enriched."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value: Any, ctx: Any) -> None:
        seen = await self.count.async_value()
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, value, seen + 1))


class Enrich(AsyncFunction):
    async def async_invoke(self, record: Record) -> list[Record]:
        return [Record(record.key, await service_call(record.value))]


def keyed_variant(records: list[Record], config: AecConfig) -> Callable[[], Any]:
    def run() -> dict[str, Any]:
        result = run_keyed(records, ReadCallWrite(), config=config)
        return {"max_in_flight": result.metrics["max_in_flight"]}

    return run


def two_operator_variant(records: list[Record], capacity: int) -> Callable[[], Any]:
    def run() -> dict[str, Any]:
        enriched = unordered_wait(records, Enrich(), 30.0, capacity)
        run_keyed(enriched, ReadWrite(), config=AecConfig(in_flight_records_limit=capacity))
        return {}

    return run


def spark_keyed_variants(spark: Any, n: int, keys: int, capacity: int) -> dict[str, Any]:
    from spark_glue import async_map, process_keyed
    from spark_glue.keyed import unpersist

    df = spark.range(n).selectExpr(f"cast(id % {keys} as int) as k", "cast(id as int) as v")
    df = df.repartition(1).cache()
    df.count()
    schema = "k int, v int, n long"
    config = AecConfig(in_flight_records_limit=capacity)

    class SparkReadCallWrite(ReadCallWrite):
        async def process_element(self, row: Any, ctx: Any) -> None:
            seen = await self.count.async_value()
            enriched = await ctx.call_async(service_call, row["v"], timeout=30.0)
            await self.count.async_update(seen + 1)
            ctx.output({"k": row["k"], "v": enriched, "n": seen + 1})

    class SparkReadWrite(ReadWrite):
        async def process_element(self, row: Any, ctx: Any) -> None:
            seen = await self.count.async_value()
            await self.count.async_update(seen + 1)
            ctx.output({"k": row["k"], "v": row["v"], "n": seen + 1})

    async def fetch(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"k": row["k"], "v": await service_call(row["v"])}]

    def one_operator() -> dict[str, Any]:
        out = process_keyed(df, SparkReadCallWrite(), key="k", output_schema=schema,
                            order_by="v", config=config, num_partitions=1)  # fmt: skip
        assert out.count() == n
        unpersist(out)  # process_keyed caches its result: the next run must compute again
        return {}

    def two_operators() -> dict[str, Any]:
        enriched = async_map(df, fetch, "k int, v int", mode="unordered", capacity=capacity)
        out = process_keyed(enriched, SparkReadWrite(), key="k", output_schema=schema,
                            order_by="v", config=config, num_partitions=1)  # fmt: skip
        assert out.count() == n
        unpersist(out)
        return {}

    return {"spark call_async (process_keyed)": one_operator,
            "spark async_map + process_keyed": two_operators}  # fmt: skip


# --- running ----------------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    part: int
    records: int
    run: Callable[[], Any]


def start_service(low: float, high: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "spark_glue.flights.service", "--latency", str(low), str(high),
         "--failure-rate", "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=harness.ROOT,
    )  # fmt: skip
    url = process.stdout.readline().strip()  # type: ignore[union-attr]
    if not url.startswith("http"):
        process.kill()
        raise RuntimeError("the flights service did not start")
    return process, url


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    import spark_glue  # noqa: F401  (sets PYSPARK_PYTHON)

    spark = (
        SparkSession.builder.master("local[2]").appName(NAME)
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(parser)
    for key in DEFAULTS:
        if key != "repeats":
            parser.add_argument(f"--{key.replace('_', '-')}", type=int)
    parser.add_argument("--latency-low", type=float, default=0.005)
    parser.add_argument("--latency-high", type=float, default=0.020)
    parser.add_argument("--no-spark", action="store_true", help="engine variants only")
    parser.add_argument("--no-http", action="store_true", help="no aiohttp service variants")
    parser.add_argument("--part", type=int, choices=(1, 2), help="run one part only")
    args = harness.finish_args(parser, parser.parse_args(argv), NAME, DEFAULTS, QUICK)
    n, capacity = args.inputs, args.capacity
    lat = latencies(n, args.latency_low, args.latency_high, args.seed)
    mean = sum(lat) / n
    bound = capacity / mean
    ordered_bound = n / ordered_finish(lat, capacity)
    records = [Record(i % args.keys, i) for i in range(args.records)]

    variants = [
        Variant("ordered", 1, n, wait_variant("ordered", Sleep(lat), n, capacity)),
        Variant("unordered", 1, n, wait_variant("unordered", Sleep(lat), n, capacity)),
        Variant("key-ordered", 1, n, wait_variant("key_ordered", Sleep(lat), n, capacity)),
        Variant("asyncio floor", 1, n,
                floor_variant(lambda i: asyncio.sleep(lat[i]), n, capacity)),
        Variant("call_async async", 2, len(records), keyed_variant(records, AecConfig())),
        Variant("call_async sync", 2, args.sync_records,
                keyed_variant(records[: args.sync_records], AecConfig(async_state=False))),
        Variant("unordered_wait + run_keyed", 2, len(records),
                two_operator_variant(records, AecConfig().in_flight_records_limit)),
    ]  # fmt: skip
    service = None
    spark = None
    try:
        if not args.no_http:
            service, url = start_service(args.latency_low, args.latency_high)
            client = Http(url).client
            variants += [
                Variant("ordered (aiohttp)", 1, n, wait_variant("ordered", Http(url), n, capacity)),
                Variant("unordered (aiohttp)", 1, n,
                        wait_variant("unordered", Http(url), n, capacity)),
                Variant("asyncio floor (aiohttp)", 1, n,
                        floor_variant(lambda i: client.plane("N14228"), n, capacity)),
            ]  # fmt: skip
        if not args.no_spark:
            spark = spark_session()
            variants += [
                Variant("async_udf in Spark", 1, n, spark_udf_variant(spark, lat, capacity)),
                Variant("thread-pool mapPartitions", 1, n,
                        spark_threads_variant(spark, lat, capacity)),
            ]  # fmt: skip
            for name, run in spark_keyed_variants(spark, len(records), args.keys, capacity).items():
                variants.append(Variant(name, 2, len(records), run))
            for v in variants:  # one untimed warm-up each for Spark (workers, imports)
                if "park" in v.name and args.part in (None, v.part):
                    v.run()
        variants = [v for v in variants if args.part in (None, v.part)]
        samples = harness.run_rounds(variants, lambda v: harness.timed(v.run, v.records),
                                     args.repeats)  # fmt: skip
    finally:
        if service is not None:
            service.stdin.close()  # type: ignore[union-attr]
            service.wait(15)
        if spark is not None:
            spark.stop()
    report = build_report(args, variants, samples, mean, bound, ordered_bound)
    harness.write_outputs(args.out, NAME, report, markdown(report), lambda p: plot(report, p))
    print(markdown(report))
    return 0


def build_report(args: Any, variants: list[Variant], samples: dict[str, list[Any]], mean: float,
                 bound: float, ordered_bound: float) -> dict[str, Any]:  # fmt: skip
    summary = {v.name: {**harness.summarize(samples[v.name]), "part": v.part} for v in variants}

    def rate(name: str) -> float | None:
        return summary[name]["best_rps"] if name in summary else None

    def ratio(a: str, b: str) -> float | None:
        x, y = rate(a), rate(b)
        return None if x is None or y is None else x / y

    unordered, udf = rate("unordered"), rate("async_udf in Spark")
    two = "spark async_map + process_keyed"
    one = "spark call_async (process_keyed)"
    goals = [
        harness.goal("unordered / bound", None if unordered is None else unordered / bound,
                     at_least=GOAL_UNORDERED),
        harness.goal("async_udf in Spark / bound", None if udf is None else udf / bound,
                     at_least=GOAL_UDF),
        harness.goal("call_async async / sync", ratio("call_async async", "call_async sync"),
                     at_least=GOAL_CALL_SPEEDUP,
                     per_round=harness.paired(samples, "call_async async", "call_async sync")),
        harness.goal("engine: unordered_wait + run_keyed / call_async",
                     ratio("unordered_wait + run_keyed", "call_async async"),
                     at_most=GOAL_CALL_VS_TWO_OPERATORS,
                     per_round=harness.paired(samples, "unordered_wait + run_keyed",
                                              "call_async async")),
        harness.goal("Spark: async_map + process_keyed / call_async", ratio(two, one),
                     at_most=GOAL_CALL_VS_TWO_OPERATORS,
                     per_round=harness.paired(samples, two, one)),
    ]  # fmt: skip
    return {
        "date": harness.now(),
        "machine": harness.machine_facts(["pyspark", "aiohttp"]),
        "settings": {k: getattr(args, k) for k in (*DEFAULTS, "latency_low", "latency_high",
                                                   "seed")},  # fmt: skip
        "mean_latency_s": mean,
        "bound_rps": bound,
        "ordered_bound_rps": ordered_bound,
        "variants": summary,
        "goals": goals,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    bound, ordered_bound = report["bound_rps"], report["ordered_bound_rps"]
    lines = [
        "# bench_async_io",
        "",
        harness.machine_line(report),
        "",
        f"Part 1: {s['inputs']:,} inputs, latency uniform {s['latency_low'] * 1000:g}-"
        f"{s['latency_high'] * 1000:g} ms (mean {report['mean_latency_s'] * 1000:.2f} ms), "
        f"capacity {s['capacity']}: bound capacity / mean latency = {bound:,.0f}/s; ordered "
        f"head-of-line bound {ordered_bound:,.0f}/s. Best of {s['repeats']} interleaved rounds.",
        "",
    ]
    rows = []
    for name, v in report["variants"].items():
        if v["part"] != 1:
            continue
        of = ordered_bound if name.startswith("ordered") else bound
        rows.append([name, harness.fmt_rate(v["best_rps"]), harness.fmt_rate(v["median_rps"]),
                     f"{v['best_rps'] / of:.2f}", f"{v['cores_busy']:.2f}"])  # fmt: skip
    lines += harness.md_table(["variant", "inputs/s", "median", "of its bound", "cores"], rows)
    lines += [
        "",
        f"Part 2: read state, `ctx.call_async` a {CALL_LATENCY * 1000:g} ms service, write state; "
        f"{s['records']:,} records over {s['keys']:,} keys (sync on {s['sync_records']:,}).",
        "",
    ]
    rows = [[name, harness.fmt_rate(v["best_rps"]), harness.fmt_rate(v["median_rps"]),
             f"{v['cores_busy']:.2f}"]
            for name, v in report["variants"].items() if v["part"] == 2]  # fmt: skip
    lines += harness.md_table(["variant", "records/s", "median", "cores"], rows)
    lines += ["", "## Goals", ""]
    lines += harness.md_table(
        ["goal", "measured", "verdict"],
        [[g["text"], g["measured"], harness.verdict(g)] for g in report["goals"]],
    )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, part in zip(axes, (1, 2), strict=True):
        names = [n for n, v in report["variants"].items() if v["part"] == part]
        rates = [report["variants"][n]["best_rps"] for n in names]
        harness.bars(ax, range(len(names)), rates)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("inputs/s" if part == 1 else "records/s")
        if part == 1:
            ax.axhline(report["bound_rps"], ls="--", color="gray", label="capacity / mean latency")
            ax.axhline(report["ordered_bound_rps"], ls=":", color="gray",
                       label="ordered head-of-line bound")  # fmt: skip
            ax.legend(fontsize=7)
            ax.set_title("async I/O, 5-20 ms calls, capacity 100")
        else:
            ax.set_yscale("log")
            ax.set_title("state + 5 ms call per record")
    harness.save(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
