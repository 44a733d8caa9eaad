"""Joins benchmark: ``aec.joins.interval_join`` and a two-input enrichment on async state.

Each figure is a ratio of two variants timed side by side in interleaved rounds
(``harness.run_rounds``: the variant order rotates per round; best of ``--repeats``):

* ``buffer``: the interval join's cost per record with ``--buffered`` (1,000) entries
  buffered per key vs 10: every key gets a left and a right record per second
  (``joins_data.steady_rows``), interval [-5, 5] s, and the watermark trails the newest
  time by ``buffered / 2`` seconds, so each key's buffer holds about that many entries
  (both sides), most of which no new record can pair with. Flink's operator reads the whole other
  buffer per record (linear); aec reads the buckets of the interval. CPU seconds, async
  on Memory. Goal: <= 1.3x.
* ``latency``: async / sync records/s on ``LatencyBackend(MemoryBackend(), 1 ms)`` for the
  interval join and a two-input enrichment (input 1 sets a key's profile, input 2 reads it
  and counts), ``--keys`` keys (``joins_data.co_rows``; sync on ``--sync-records``: it
  waits 1 ms per request). Wall clock. Goal: >= 100x.
* ``memory``, ``rocksdb``: async / sync on each backend, both functions. CPU. Goal: >= 1.0x.
* ``spark``: the flights job's ``flights_weather`` as a stream: ``process_keyed_co_stream``
  (MemoryBackend) vs Spark's own stream-stream join of the same files (``withWatermark``
  on both sides, ``origin`` equal and ``obs_time`` between ``event_time - 1 h`` and
  ``event_time``), both ``availableNow`` with ``maxFilesPerTrigger``, a 24 h watermark
  delay; both must write the same rows. Wall clock. Reported; aim >= 2x.
* ``pyflink``: aec's interval join (async, Memory, wall clock) vs PyFlink 2.3's, written
  as a PyFlink user must (``connect`` + ``KeyedCoProcessFunction`` + MapState buffers +
  cleanup timers: ``perf/bench_joins_pyflink.py``) on the same ``--pyflink-records``
  records over ``--pyflink-keys`` keys; runs with ``--pyflink PYTHON`` (a venv with
  ``apache-flink``), else shows an earlier ``bench_joins_pyflink.json`` for the same
  records. Goal: >= 100x.

Usage::

    .venv/bin/python perf/bench_joins.py             # full run, writes perf/results/
    .venv/bin/python perf/bench_joins.py --quick     # smoke run into a temp dir
    .venv/bin/python perf/bench_joins.py --no-spark --pyflink /work/pyflink-venv/bin/python
    bin/with-venv bin/build-compiled /tmp/aec-compiled   # then: interpreted vs compiled
    .venv/bin/python perf/bench_joins.py --compiled /tmp/aec-compiled

``--compiled DIR`` (a copy with the compiled kernel) runs the engine variants only (no
Spark, no PyFlink) in two worker processes per round, this checkout's interpreted build
and DIR's compiled one taking turns (``harness.worker_rounds``; a worker whose
``aec.compiled`` is wrong stops the run), and writes ``bench_joins_compiled.{json,md,png}``.
Goal: every interval-join variant on the CPU clock (the buffer rows, async and sync on
Memory and RocksDB) compiled / interpreted records/s >= 1.7x; the enrichment and the
latency rows are shown, not judged.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from joins_data import LOWER, UPPER, co_rows, steady_rows  # noqa: E402

from aec import (  # noqa: E402
    AecConfig,
    KeyedCoProcessFunction,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed_co,
)
from aec.joins import interval_join  # noqa: E402
from backends import LatencyBackend, MemoryBackend, RocksDBBackend  # noqa: E402

NAME = "bench_joins"
DEFAULTS = {"records": 100_000, "keys": 2_000, "sync_records": 1_000, "buffered": 1_000,
            "buffer_keys": 20, "buffer_records": 100_000, "flights": 336_776, "repeats": 3,
            "pyflink_records": 22_000, "pyflink_keys": 200}  # fmt: skip  # flights: the whole year
QUICK = {"records": 10_000, "keys": 500, "sync_records": 200, "buffered": 1_000,
         "buffer_keys": 4, "buffer_records": 20_000, "flights": 5_000, "repeats": 1,
         "pyflink_records": 22_000, "pyflink_keys": 200}  # fmt: skip
SYNC, ASYNC = AecConfig(async_state=False), AecConfig()
COMPILED_GOAL = 1.7  # compiled / interpreted CPU records/s of every interval-join variant
WARM_UP_SHARE = 20  # a worker's warm-up runs every variant on 1/20 of its records
DATABASES = itertools.count()  # RocksDB directories, one per run


class Enrich(KeyedCoProcessFunction):
    """Input 1 sets the key's profile; input 2 reads it, counts, and emits the event
    enriched (a co-process enrichment: one read and one write per record)."""

    def open(self, ctx: Any) -> None:
        self.profile = ctx.get_state(ValueStateDescriptor("profile"))
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=0))

    def process_element1(self, value: Any, ctx: Any) -> Any:
        return self.profile.async_update(value)

    async def process_element2(self, value: Any, ctx: Any) -> None:
        profile = await self.profile.async_value()
        seen = await self.seen.async_value()
        await self.seen.async_update(seen + 1)
        ctx.output((ctx.current_key, value, profile, seen + 1))


def pair(left: Any, right: Any) -> tuple[Any, Any]:
    return (left, right)


def join() -> KeyedCoProcessFunction:
    return interval_join(LOWER, UPPER, pair)


def co_source(records: int, keys: int, seed: int) -> list[Any]:
    """``joins_data.co_rows`` as ``(input, Record | Watermark)``: each input's watermark
    at its newest time - 10 s, for both inputs at each marker."""
    source: list[Any] = []
    newest = {1: -1e18, 2: -1e18}
    for row in co_rows(records, keys, seed):
        if row == "watermark":
            source += [(i, Watermark(newest[i] - 10)) for i in (1, 2) if newest[i] > -1e18]
            continue
        input, key, value, t = row
        newest[input] = max(newest[input], t)
        source.append((input, Record(key, value, t)))
    return source


def buffer_source(records: int, keys: int, buffered: int) -> list[Any]:
    """``steady_rows``: each second's records, then both inputs' watermark at that second
    minus ``buffered / 2`` (each side then keeps ~``buffered / 2`` entries per key)."""
    seconds = max(1, records // (2 * keys))
    source: list[Any] = []
    last = -1.0
    for input, key, value, t in steady_rows(seconds, keys):
        if t != last and t - buffered / 2 > 0:
            source += [(1, Watermark(t - buffered / 2)), (2, Watermark(t - buffered / 2))]
        last = t
        source.append((input, Record(key, value, t)))
    return source


def records_in(source: list[Any]) -> int:
    return sum(1 for _, e in source if type(e) is Record)


@dataclass
class Variant:
    name: str
    records: int
    run: Callable[[], dict[str, Any] | None]
    clock: str = "cpu"  # what judges it: "cpu" (process CPU seconds) or "wall"


def engine_variant(
    name: str, make: Callable[[], Any], source: list[Any], config: AecConfig,
    backend: Callable[[], Any], clock: str = "cpu",
) -> Variant:  # fmt: skip
    def run() -> dict[str, Any]:
        store = backend()
        try:
            result = run_keyed_co(source, make(), store, config)
        finally:
            store.close()
        return {"outputs": result.metrics["records_out"], "batches": result.metrics["batches"]}

    return Variant(name, records_in(source), run, clock)


@dataclass(frozen=True)
class Spec:
    """An engine variant before its records exist (what the driver of ``--compiled``
    needs): its name, function, source, backend, mode and clock."""

    name: str
    kind: str  # "join" (the interval join) or "enrich"
    source: str  # of engine_variants' sources: "wide", "narrow", "deep", "shallow"
    backend: str  # "memory", "rocksdb" or "latency" (1 ms over Memory)
    async_state: bool = True
    clock: str = "cpu"


def engine_specs(buffered: int) -> list[Spec]:
    """The engine variants: the buffer pair, then per function the latency pair and
    async / sync on Memory and RocksDB."""
    specs = [Spec(f"buffer {buffered}", "join", "deep", "memory"),
             Spec("buffer 10", "join", "shallow", "memory")]  # fmt: skip
    for kind in ("join", "enrich"):
        specs += [Spec(f"latency async {kind}", kind, "wide", "latency", True, "wall"),
                  Spec(f"latency sync {kind}", kind, "narrow", "latency", False, "wall")]  # fmt: skip
        for backend in ("memory", "rocksdb"):
            for mode in ("async", "sync"):
                specs.append(
                    Spec(f"{backend} {mode} {kind}", kind, "wide", backend, mode == "async")
                )
    return specs


def engine_variants(args: argparse.Namespace, scratch: Path, share: int = 1) -> list[Variant]:
    """``engine_specs`` on their records (``1 / share`` of them: a warm-up)."""

    def rocks() -> Any:
        return RocksDBBackend(str(scratch / f"db{next(DATABASES)}"))

    def latency() -> Any:
        return LatencyBackend(MemoryBackend(), 0.001)

    sources = {
        "wide": co_source(args.records // share, args.keys, args.seed),
        "narrow": co_source(args.sync_records // share, args.keys, args.seed),
        "deep": buffer_source(args.buffer_records // share, args.buffer_keys, args.buffered),
        "shallow": buffer_source(args.buffer_records // share, args.buffer_keys, 10),
    }
    backends = {"memory": MemoryBackend, "rocksdb": rocks, "latency": latency}
    functions = {"join": join, "enrich": Enrich}
    return [engine_variant(s.name, functions[s.kind], sources[s.source],
                           ASYNC if s.async_state else SYNC, backends[s.backend], s.clock)
            for s in engine_specs(args.buffered)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(parser)
    for key in DEFAULTS:
        if key != "repeats":
            parser.add_argument(f"--{key.replace('_', '-')}", type=int)
    parser.add_argument("--no-spark", action="store_true", help="no Spark variants")
    parser.add_argument("--pyflink", metavar="PYTHON", help="a Python with apache-flink")
    harness.add_compiled_arg(parser, "the engine variants", NAME)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a worker
    args = harness.finish_args(parser, parser.parse_args(argv), NAME, DEFAULTS, QUICK)
    if args.serve:
        return serve(args)
    if args.compiled is not None:
        return compare_builds(args)
    scratch = Path(tempfile.mkdtemp(prefix="bench-joins-"))
    variants = engine_variants(args, scratch)
    if not args.no_spark:
        from bench_joins_spark import spark_variants

        spark_rows = [Variant(name, records, run, "wall")
                      for name, records, run in spark_variants(args.flights or None, scratch)]  # fmt: skip
        for variant in spark_rows:  # untimed: Python workers, imports, first-query costs
            variant.run()
        variants += spark_rows
    samples = harness.run_rounds(variants, lambda v: harness.timed(v.run, v.records), args.repeats)
    aec_wall = max(s.rps for s in samples["memory async join"])
    flink = pyflink_peer(args)
    report = build_report(args, variants, samples, flink, aec_wall)
    shutil.rmtree(scratch, ignore_errors=True)
    harness.write_outputs(args.out, NAME, report, markdown(report), lambda p: plot(report, p))
    print(markdown(report))
    return 0


def serve(args: argparse.Namespace) -> int:
    """Worker of ``--compiled``: builds the engine variants' sources once, warms every
    variant up, then answers requests by variant name with samples."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-joins-"))
    try:
        for variant in engine_variants(args, scratch, WARM_UP_SHARE):
            variant.run()
        variants = {v.name: v for v in engine_variants(args, scratch)}
        harness.serve_samples(harness.build_hello(), lambda request: harness.timed(
            variants[request["variant"]].run, variants[request["variant"]].records))  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def compare_builds(args: argparse.Namespace) -> int:
    """The engine variants on this checkout's interpreted build and on ``args.compiled``'s
    compiled one, in ``harness.worker_rounds`` workers taking turns (a worker whose
    ``aec.compiled`` is wrong stops the run). Judged: the interval join on the CPU clock."""
    machine = harness.machine_facts(("rocksdict",))
    roots = harness.build_roots(args.compiled)
    specs = engine_specs(args.buffered)
    sizes = ("records", "keys", "sync_records", "buffered", "buffer_keys", "buffer_records", "seed")
    worker_args = ["--serve", *(x for k in sizes for x in (f"--{k.replace('_', '-')}",
                                                          str(getattr(args, k))))]  # fmt: skip
    samples = harness.worker_rounds(
        Path(__file__).resolve(), worker_args, roots, specs, lambda s: {"variant": s.name},
        args.repeats, name=lambda s: s.name, check=harness.check_worker(roots),
    )  # fmt: skip
    rows = [
        harness.build_row("interval join" if s.kind == "join" else "enrichment", s.name, s.clock,
                          {b: [x.rps if s.clock == "wall" else x.cpu_rps
                               for x in samples[f"{s.name}@{b}"]] for b in roots},
                          judged=s.kind == "join" and s.clock == "cpu")
        for s in specs
    ]  # fmt: skip
    goals = harness.build_goals(rows, "compiled / interpreted records/s (CPU)", COMPILED_GOAL)
    harness.write_builds(
        args.out, f"{NAME}_compiled", "bench_joins: interpreted and compiled builds",
        f"{args.records:,} two-input records over {args.keys:,} keys (sync at 1 ms latency on "
        f"{args.sync_records:,}); buffer rows {args.buffer_records:,} records over "
        f"{args.buffer_keys} keys; fresh workers per round",
        machine, {k: getattr(args, k) for k in (*DEFAULTS, "seed")}, rows, goals, COMPILED_GOAL,
        notes=["Records/s on the variant's clock: `cpu`, process CPU seconds (judged for the "
               "interval join); `wall`, the 1 ms latency rows, which wait on the modelled "
               "round trips (shown, no goal). The enrichment is shown, not judged."],
        builds={b: str(root) for b, root in roots.items()},
    )  # fmt: skip
    return 0


def pyflink_peer(args: argparse.Namespace) -> dict[str, Any] | None:
    """PyFlink's figures for ``--pyflink-records`` over ``--pyflink-keys``: run now with
    ``--pyflink``, else an earlier ``bench_joins_pyflink.json`` in ``--out``, else None."""
    peer = args.out / "bench_joins_pyflink.json"
    if args.pyflink:
        command = [args.pyflink, str(harness.ROOT / "perf" / "bench_joins_pyflink.py"),
                   "--records", str(args.pyflink_records), "--keys", str(args.pyflink_keys),
                   "--out", str(args.out)]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return {**json.loads(peer.read_text()), "run": "this run"}
    if peer.exists():
        flink = json.loads(peer.read_text())
        if (flink.get("records"), flink.get("keys")) == (args.pyflink_records, args.pyflink_keys):
            return {**flink, "run": "an earlier run (bench_joins_pyflink.json)"}
    return None


def pyflink_aec_rate(args: argparse.Namespace) -> float:
    """aec's wall-clock records/s on the PyFlink peer's records (async, Memory)."""
    source = co_source(args.pyflink_records, args.pyflink_keys, args.seed)
    best = 0.0
    for _ in range(args.repeats):
        started = time.perf_counter()
        run_keyed_co(source, join(), MemoryBackend(), ASYNC)
        best = max(best, records_in(source) / (time.perf_counter() - started))
    return best


def build_report(
    args: argparse.Namespace, variants: list[Variant], samples: dict[str, list[Any]],
    flink: dict[str, Any] | None, aec_wall: float,
) -> dict[str, Any]:  # fmt: skip
    clocks = {v.name: v.clock for v in variants}
    summary = {v.name: {**harness.summarize(samples[v.name]), "clock": v.clock} for v in variants}

    def rate(name: str) -> float | None:
        if name not in summary:
            return None
        return summary[name]["best_rps"] if clocks[name] == "wall" else summary[name]["cpu_rps"]

    def speedup(a: str, b: str) -> float | None:
        x, y = rate(a), rate(b)
        return None if x is None or y is None else x / y

    goals = {
        "buffer": harness.goal(f"cost per record, {args.buffered} vs 10 buffered per key",
                               speedup("buffer 10", f"buffer {args.buffered}"), at_most=1.3),
    }  # fmt: skip
    for kind in ("join", "enrich"):
        goals[f"latency {kind}"] = harness.goal(
            f"async/sync at 1 ms latency, {kind}",
            speedup(f"latency async {kind}", f"latency sync {kind}"),
            at_least=100,
        )
        for backend in ("memory", "rocksdb"):
            goals[f"{backend} {kind}"] = harness.goal(
                f"async/sync on {backend}, {kind}",
                speedup(f"{backend} async {kind}", f"{backend} sync {kind}"), at_least=1.0,
                per_round=harness.paired(samples, f"{backend} async {kind}",
                                         f"{backend} sync {kind}"))  # fmt: skip
    goals["spark"] = harness.goal(
        "flights_weather: process_keyed_co_stream / Spark's stream-stream join",
        speedup("aec process_keyed_co_stream", "Spark stream-stream join"),
        at_least=2.0,
    )
    if flink is not None:
        mine = pyflink_aec_rate(args)
        goals["pyflink"] = harness.goal("interval join vs PyFlink 2.3 (records/s)",
                                        mine / flink["records_per_s"], at_least=100)  # fmt: skip
        flink = {**flink, "aec_records_per_s": mine}
    return {
        "date": harness.now(),
        "machine": harness.machine_facts(["pyspark", "rocksdict"]),
        "params": {k: getattr(args, k) for k in (*DEFAULTS, "seed")},
        "variants": summary,
        "goals": goals,
        "pyflink": flink,
        "aec_memory_async_join_wall_rps": aec_wall,
    }


def markdown(report: dict[str, Any]) -> str:
    p = report["params"]
    lines = harness.md_header(
        "bench_joins: two inputs on async state",
        f"{p['records']:,} two-input records over {p['keys']:,} keys (interval [{LOWER:g}, "
        f"{UPPER:g}] s; sync at 1 ms latency on {p['sync_records']:,}); buffer rows "
        f"{p['buffer_records']:,} records over {p['buffer_keys']} keys",
        report,
    )
    lines += [
        "",
        "Clock `cpu`: records per process CPU-second (the machine is shared); `wall`: records "
        "per wall-clock second (the latency and Spark rows wait on I/O).",
        "",
    ]
    rows = []
    for name, v in report["variants"].items():
        shown = v["best_rps"] if v["clock"] == "wall" else v["cpu_rps"]
        rows.append([name, v["clock"], harness.fmt_rate(shown), harness.fmt_rate(v["median_rps"]),
                     f"{v['cores_busy']:.2f}"])  # fmt: skip
    lines += harness.md_table(["variant", "clock", "records/s", "median (wall)", "cores"], rows)
    lines += ["", "## Goals", ""]
    lines += harness.md_table(["goal", "measured", "verdict"],
                              [[g["text"], g["measured"], harness.verdict(g)]
                               for g in report["goals"].values()])  # fmt: skip
    flink = report.get("pyflink")
    if flink:
        lines += [
            "",
            f"PyFlink ({flink.get('pyflink', '')}, {flink.get('run', 'this run')}): "
            f"{flink['records_per_s']:,.0f} records/s over {flink['records']:,} records and "
            f"{flink['keys']} keys, from the first record in its Python worker to the last "
            f"output; aec {flink['aec_records_per_s']:,.0f} records/s (async, Memory, wall).",
        ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = harness.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    names = list(report["variants"])
    rates = [v["best_rps"] if v["clock"] == "wall" else v["cpu_rps"]
             for v in report["variants"].values()]  # fmt: skip
    harness.bars(left, range(len(names)), rates)
    left.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    left.set_yscale("log")
    left.set_ylabel("records/s (cpu or wall, see the table)")
    left.set_title("variants")
    goals = [g for g in report["goals"].values() if g["value"] is not None]
    right.barh([g["text"] for g in goals], [g["value"] for g in goals],
               color=["tab:green" if g["met"] else "tab:red" for g in goals])  # fmt: skip
    right.set_xscale("log")
    right.tick_params(axis="y", labelsize=7)
    right.invert_yaxis()
    right.set_title("goals (green: met)")
    harness.save(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
