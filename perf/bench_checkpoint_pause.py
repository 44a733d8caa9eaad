"""Checkpoint pause: draining (rule 9) against declared processing that carries the
records in flight (FLIP-425's "Faster Checkpoint Drain" on FLIP-455's declarations).

Workload: the keyed counter (read, write n + 1, emit) written twice, as a plain
callback function (its checkpoints drain) and as a ``DeclaringKeyedProcessFunction``
(its checkpoints carry what is in flight), over a ``LatencyBackend`` modelling
remote state (one round trip per batch) around ``MemoryBackend``.

Rows, each variant measured side by side in one run (interleaved rounds, best of):

1. pause: fill the operator to ``--in-flight`` records in flight (Zipf(1.1) keys: a
   hot key holds hundreds of them in the blocking buffer), then time ``snapshot``;
   drain / declared at 10 ms (goal: declared >= 20x shorter);
2. the same at 1 ms and on uniform keys (goal: declared never longer);
3. throughput with a checkpoint every ``--every`` records at 10 ms (goal: declared
   >= 2x records/s);
4. the cost of declaring, no checkpoints: declared / callback records/s on Memory
   and RocksDB (goal: cost <= 1.1x);
5. ``process_keyed_stream`` on a local Spark session: micro-batches of
   ``--stream-rows`` rows, ``--hot-share`` of them of one key, LatencyBackend 5 ms,
   no event time; the callback counter (each micro-batch drains) against the
   declared one (each micro-batch carries its hot key's chain): micro-batch duration
   p95 (Spark's ``triggerExecution``, and the slowest partition's own time; the first
   micro-batch, which also starts the query, left out), the
   records carried at the end, and the time until every record finished (report; aim:
   carried p95 >= 3x shorter). ``--no-stream`` skips it.

Usage::

    .venv/bin/python perf/bench_checkpoint_pause.py            # full run, perf/results/
    .venv/bin/python perf/bench_checkpoint_pause.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

from aec import (  # noqa: E402
    AecConfig,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    run_keyed,
)
from aec.declare import DeclaringKeyedProcessFunction  # noqa: E402
from backends import LatencyBackend, MemoryBackend, RocksDBBackend  # noqa: E402

NAME = "bench_checkpoint_pause"
DEFAULTS = {
    "in_flight": 6000, "keys": 10_000, "repeats": 3, "records": 100_000, "every": 1000,
    "stream_batches": 12, "stream_rows": 400,
}  # fmt: skip
QUICK = {
    "in_flight": 600, "keys": 1000, "repeats": 1, "records": 5000, "every": 500,
    "stream_batches": 3, "stream_rows": 60,
}  # fmt: skip
STREAM_LATENCY = 0.005  # seconds per state round trip in the stream row


class Counter(KeyedProcessFunction):
    """Read, write n + 1, emit: callbacks (its checkpoints drain)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.count.async_value().then_compose(
            lambda n: self.count.async_update(n + 1).then_accept(
                lambda _: ctx.output((ctx.current_key, n + 1))
            )
        )


class DeclaredCounter(DeclaringKeyedProcessFunction):
    """The same counter, declared (its checkpoints carry the records in flight)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def declare_process(self, d: Any) -> Any:
        def read(value: Any, ctx: Any) -> Any:
            return self.count.async_value()

        def write(n: int, ctx: Any) -> Any:
            ctx.output((ctx.current_key, n + 1))
            return self.count.async_update(n + 1)

        return d.chain(d.declare("read", read), d.declare("write", write))


FUNCTIONS = {"drain": Counter, "declared": DeclaredCounter}


def keys(distribution: str, count: int, universe: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    if distribution == "uniform":
        return [rng.randrange(universe) for _ in range(count)]
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(universe)]
    return rng.choices(range(universe), weights, k=count)


@dataclass(frozen=True)
class PauseCase:
    style: str  # "drain" or "declared"
    latency: float
    distribution: str

    @property
    def name(self) -> str:
        return f"pause-{self.style}-{self.latency * 1000:g}ms-{self.distribution}"


def measure_pause(case: PauseCase, args: argparse.Namespace) -> h.Sample:
    """Fill to ``in_flight`` records in flight, then time one snapshot."""
    source = keys(case.distribution, args.in_flight * 3, args.keys, args.seed)
    backend = LatencyBackend(MemoryBackend(), case.latency)
    config = AecConfig(in_flight_records_limit=args.in_flight)
    operator = KeyedProcessOperator(FUNCTIONS[case.style](), backend, config)
    directory = tempfile.mkdtemp(prefix="aec-bench-pause-")
    try:
        operator.open()
        fed = 0
        for key in source:  # until the limit: then every record waits for room
            operator.process(Record(key, fed))
            fed += 1
            if operator.controller.in_flight >= args.in_flight - 1:
                break
        in_flight = operator.controller.in_flight
        sample = h.timed(lambda: _snapshot(operator, directory), 1)
        sample.metrics.update(in_flight_at_snapshot=in_flight, records_fed=fed)
        operator.finish()
        return sample
    finally:
        operator.close()
        backend.close()
        shutil.rmtree(directory, ignore_errors=True)


def _snapshot(operator: KeyedProcessOperator, directory: str) -> dict[str, Any]:
    operator.snapshot(1, directory)
    metrics = operator.metrics
    return {
        "checkpoint_pause_s": metrics["checkpoint_pause_s"],
        "checkpoint_pending_records": metrics["checkpoint_pending_records"],
    }


@dataclass(frozen=True)
class ThroughputCase:
    style: str
    latency: float

    @property
    def name(self) -> str:
        return f"throughput-{self.style}-{self.latency * 1000:g}ms"


def measure_throughput(case: ThroughputCase, args: argparse.Namespace) -> h.Sample:
    """``records`` Zipf(1.1) records with a checkpoint every ``every`` records."""
    count = max(args.every * 4, args.records // 5)
    source = keys("zipf", count, args.keys, args.seed)
    backend = LatencyBackend(MemoryBackend(), case.latency)
    operator = KeyedProcessOperator(FUNCTIONS[case.style](), backend, AecConfig())
    directory = tempfile.mkdtemp(prefix="aec-bench-pause-")

    def run() -> dict[str, Any]:
        operator.open()
        pauses = []
        for i, key in enumerate(source, 1):
            operator.process(Record(key, i))
            if i % args.every == 0:
                operator.snapshot(i, directory)
                pauses.append(operator.metrics["checkpoint_pause_s"])
        operator.finish()
        return {"checkpoints": len(pauses), "mean_pause_s": sum(pauses) / len(pauses)}

    try:
        return h.timed(run, len(source))
    finally:
        operator.close()
        backend.close()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class CostCase:
    style: str
    backend: str

    @property
    def name(self) -> str:
        return f"cost-{self.style}-{self.backend}"


def measure_cost(case: CostCase, args: argparse.Namespace) -> h.Sample:
    """``records`` uniform records, async, no checkpoint."""
    source = [Record(k, i) for i, k in enumerate(keys("uniform", args.records, args.keys, 7))]
    directory = tempfile.mkdtemp(prefix="aec-bench-cost-")
    backend: Any = MemoryBackend() if case.backend == "memory" else RocksDBBackend(directory)
    backend.open()
    try:
        return h.timed(
            lambda: dict(run_keyed(source, FUNCTIONS[case.style](), backend).metrics),
            len(source),
        )
    finally:
        backend.close()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class StreamCase:
    style: str  # "drain" (callbacks) or "declared" (carries its hot key)

    @property
    def name(self) -> str:
        return f"stream-{self.style}"


def measure_stream(case: StreamCase, args: argparse.Namespace, spark: Any) -> h.Sample:
    """One ``process_keyed_stream`` query over ``stream_batches`` micro-batches of
    ``stream_rows`` rows (``hot_share`` of them key 0, the rest 1,000 other keys), on 2
    state partitions, then micro-batches with one row of a key the hot key's partition
    does not own until nothing is carried (the hot key's partition runs them without
    rows and finishes its chain)."""
    from aec.keygroups import key_group_for, operator_index_for
    from spark_glue import process_keyed_stream

    work = Path(tempfile.mkdtemp(prefix="aec-bench-stream-"))
    source = work / "input"
    source.mkdir()
    rng = random.Random(args.seed)
    hot_partition = operator_index_for(key_group_for(0, 128), 128, 2)
    idle = next(k for k in range(1, 10_000) if operator_index_for(key_group_for(k, 128), 128, 2)
                != hot_partition)  # fmt: skip
    carried: list[int] = []
    partition_s: list[float] = []

    def write(index: int, keys: list[int]) -> None:
        path = source / f"part-{index:05d}.json"
        path.write_text("".join(f'{{"k": {k}, "x": {i}}}\n' for i, k in enumerate(keys)))
        os.utime(path, (1_000_000 + index, 1_000_000 + index))  # oldest first

    for index in range(args.stream_batches):
        write(index, [0 if rng.random() < args.hot_share else rng.randrange(1, 1001)
                      for _ in range(args.stream_rows)])  # fmt: skip

    def listen(batch_id: int, metrics: dict[str, Any]) -> None:
        carried.append(metrics["checkpoint_pending_records"])
        partition_s.append(metrics["wall_s"])

    def run() -> dict[str, Any]:
        query = process_keyed_stream(
            spark.readStream.schema("k long, x long").option("maxFilesPerTrigger", 1)
            .json(str(source)),
            FUNCTIONS[case.style](), "k", "k long, n long",
            checkpoint_location=str(work / "ckpt"), sink=lambda df, batch_id: df.count(),
            backend=LatencyBackend(MemoryBackend(), STREAM_LATENCY).spec(),
            num_partitions=2, metrics_listener=listen,
        )  # fmt: skip
        try:
            query.processAllAvailable()
            fed = len(carried)
            extra = 0
            while carried and carried[-1] and extra < 50:
                write(args.stream_batches + extra, [idle])
                extra += 1
                query.processAllAvailable()
            durations = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress]
        finally:
            query.stop()
        # the first micro-batch also pays the query's start: left out of the p95
        return {
            "micro_batch_s": durations[:fed],
            "micro_batch_p95_s": _p95(durations[1:fed]),
            "partition_p95_s": _p95(partition_s[1:fed]),
            "carried_at_end": carried[fed - 1] if fed else 0,
            "finishing_micro_batches": extra,
        }

    try:
        return h.timed(run, args.stream_batches * args.stream_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _spark() -> Any:
    from pyspark.sql import SparkSession

    import spark_glue  # noqa: F401  (the Python workers run this interpreter)

    session = (
        SparkSession.builder.master("local[2]").appName(NAME)
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )  # fmt: skip
    session.sparkContext.setLogLevel("ERROR")
    return session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    h.add_common_args(parser)
    for option in (o for o in DEFAULTS if o != "repeats"):
        parser.add_argument(f"--{option.replace('_', '-')}", type=int)
    parser.add_argument("--hot-share", type=float, default=0.3, help="stream row: hot key share")
    parser.add_argument("--no-stream", action="store_true", help="skip the Spark stream row")
    args = h.finish_args(parser, parser.parse_args(), NAME, DEFAULTS, QUICK)

    pauses = [
        PauseCase(style, latency, dist)
        for latency in (0.010, 0.001)
        for dist in ("zipf", "uniform")
        for style in ("drain", "declared")
    ]
    throughput = [ThroughputCase(style, 0.010) for style in ("drain", "declared")]
    costs = [CostCase(style, b) for b in ("memory", "rocksdb") for style in ("drain", "declared")]
    machine = h.machine_facts()  # the load average before the run
    print(f"{NAME}: {args.in_flight:,} in flight, {args.keys:,} keys, {args.repeats} rounds")
    samples: dict[str, list[h.Sample]] = {}
    samples |= h.run_rounds(pauses, lambda c: measure_pause(c, args), args.repeats)
    samples |= h.run_rounds(throughput, lambda c: measure_throughput(c, args), args.repeats)
    samples |= h.run_rounds(costs, lambda c: measure_cost(c, args), args.repeats)
    streams = [] if args.no_stream else [StreamCase(style) for style in ("drain", "declared")]
    if streams:
        spark = _spark()
        try:
            # untimed: Spark's first queries (planning, Python workers) cost seconds
            warm = argparse.Namespace(**{**vars(args), "stream_batches": 2, "stream_rows": 20})
            for case in streams:
                measure_stream(case, warm, spark)
            samples |= h.run_rounds(streams, lambda c: measure_stream(c, args, spark), args.repeats)
        finally:
            spark.stop()

    def best_pause(case: PauseCase) -> float:
        return min(s.seconds for s in samples[case.name])

    rows, goals = [], {}
    for latency in (0.010, 0.001):
        for dist in ("zipf", "uniform"):
            drain = best_pause(PauseCase("drain", latency, dist))
            declared = best_pause(PauseCase("declared", latency, dist))
            carried = samples[PauseCase("declared", latency, dist).name][0].metrics
            rows.append([
                f"{latency * 1000:g} ms", dist, f"{drain * 1000:,.1f} ms",
                f"{declared * 1000:,.1f} ms", f"{drain / declared:,.1f}x",
                f"{carried['checkpoint_pending_records']:,}",
            ])  # fmt: skip
            bound = {"at_least": 20.0} if (latency, dist) == (0.010, "zipf") else {"at_least": 1.0}
            goals[f"pause_{latency * 1000:g}ms_{dist}"] = h.goal(
                f"checkpoint pause drain / declared, {latency * 1000:g} ms, {dist} keys",
                drain / declared, **bound,
            )  # fmt: skip
    results = {name: h.summarize(runs) for name, runs in samples.items()}
    tput = {c.style: results[c.name]["best_rps"] for c in throughput}
    goals["throughput"] = h.goal(
        "records/s with a checkpoint every "
        f"{args.every:,} records at 10 ms, declared / drain",
        tput["declared"] / tput["drain"], at_least=2.0,
    )  # fmt: skip
    for b in ("memory", "rocksdb"):
        cost = results[f"cost-drain-{b}"]["best_rps"] / results[f"cost-declared-{b}"]["best_rps"]
        goals[f"cost_{b}"] = h.goal(
            f"cost of declaring on {b}: callback / declared records/s", cost, at_most=1.1
        )
    stream_rows = []
    if streams:
        best = {c.style: min(samples[c.name], key=lambda x: x.metrics["micro_batch_p95_s"])
                for c in streams}  # fmt: skip
        drain, carried = best["drain"].metrics, best["declared"].metrics
        ratio = drain["micro_batch_p95_s"] / carried["micro_batch_p95_s"]
        goals["stream_micro_batch_p95"] = h.goal(
            f"process_keyed_stream micro-batch p95, hot key ({args.hot_share:.0%} of rows), "
            f"{STREAM_LATENCY * 1000:g} ms: drain / carried (report; aim >= 3x)",
            ratio, at_least=3.0,
        )  # fmt: skip
        for style, m in (("drain (callbacks)", drain), ("declared (carries)", carried)):
            stream_rows.append([
                style, f"{m['micro_batch_p95_s']:.2f} s", f"{m['partition_p95_s']:.2f} s",
                f"{m['carried_at_end']:,}", str(m["finishing_micro_batches"]),
                f"{best['drain' if style.startswith('drain') else 'declared'].seconds:.1f} s",
            ])  # fmt: skip
    report = {
        "benchmark": NAME,
        "date": h.now(),
        "params": {k: getattr(args, k) for k in DEFAULTS},
        "machine": machine,
        "results": results,
        "goals": goals,
    }
    lines = [
        *h.md_header(
            "bench_checkpoint_pause: draining vs carrying the records in flight",
            f"keyed counter, {args.in_flight:,} in flight, {args.keys:,} keys",
            report,
        ),
        "",
        *h.md_table(
            ["round trip", "keys", "drain pause", "declared pause", "drain / declared",
             "records carried"],
            rows, numeric_from=2,
        ),  # fmt: skip
        "",
        *h.md_table(
            ["measure", "drain (callback)", "declared", "ratio"],
            [
                [f"records/s, checkpoint every {args.every:,}, 10 ms",
                 h.fmt_rate(tput["drain"]), h.fmt_rate(tput["declared"]),
                 f"{tput['declared'] / tput['drain']:.2f}x"],
                *[[f"records/s, no checkpoint, {b}",
                   h.fmt_rate(results[f"cost-drain-{b}"]["best_rps"]),
                   h.fmt_rate(results[f"cost-declared-{b}"]["best_rps"]),
                   f"{goals[f'cost_{b}']['value']:.2f}x cost"] for b in ("memory", "rocksdb")],
            ],
            numeric_from=1,
        ),  # fmt: skip
        "",
        *(h.md_table(
            ["process_keyed_stream", "micro-batch p95 (Spark)", "slowest partition p95",
             "records carried at the end", "micro-batches to finish them",
             "until every record finished"],
            stream_rows, numeric_from=1,
        ) if stream_rows else []),  # fmt: skip
        *h.goal_lines(goals),
    ]
    markdown = "\n".join(lines) + "\n"
    print(markdown)

    def plot(path: Path) -> None:
        plt = h.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels = [f"{r[0]}\n{r[1]}" for r in rows]
        xs = list(range(len(rows)))
        drain = [float(r[2].split()[0].replace(",", "")) for r in rows]
        declared = [float(r[3].split()[0].replace(",", "")) for r in rows]
        ax.bar([x - 0.2 for x in xs], drain, 0.4, label="drain")
        ax.bar([x + 0.2 for x in xs], declared, 0.4, label="declared (carries records)")
        ax.set_xticks(xs, labels)
        ax.set_yscale("log")
        ax.set_ylabel("checkpoint pause, ms (log)")
        ax.set_title(f"{args.in_flight:,} records in flight")
        ax.legend()
        h.save(fig, path)

    h.write_outputs(args.out, NAME, report, markdown, plot)


if __name__ == "__main__":
    main()
