"""TTL benchmark: does state under a TTL stay bounded, and what does TTL cost per record?

The job: ``--records`` distinct keys (default 1M) arrive over a simulated hour
(``aec.clock.ManualClock``, advanced one second every ``records / 3600`` records),
each record read-modify-writes its key's value state and emits the count (the
keyed counter of ``bench_core``; ``--job write`` writes without reading or
emitting). Variants per backend, side by side in interleaved rounds:

* ``no-ttl``: the state without a TTL (the baseline);
* ``ttl``: the same state with a TTL of ``--ttl`` seconds (default 60), expired
  entries removed by the backend's sweep (``aec.state.ttl_cleanup``);
* ``ttl-no-cleanup``: TTL handles but no sweep (what TTL cost before cleanup, and
  what it holds without it).

Per run: CPU microseconds per record (process CPU time: less sensitive to other
load than wall time), records/s, and the entries the store holds at the end
(``StateBackend.stored_entries``) against the keys of the last TTL and of the last
two TTLs. One more, untimed, ``ttl`` run per backend samples the stored entries
every simulated minute for the plot.

Goals: the ``ttl`` run ends holding at most the keys of the last
2 minutes (two TTLs of 60 s); per-record cost with TTL <= 1.2x without.

Usage::

    .venv/bin/python perf/bench_ttl.py             # 1M records, memory/rocksdb/slatedb
    .venv/bin/python perf/bench_ttl.py --quick     # 20k records, temp output
    .venv/bin/python perf/bench_ttl.py --records 200000 --backends memory,rocksdb

Outputs (in ``--out``): bench_ttl.json, bench_ttl.md, bench_ttl.png.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness  # perf/harness.py: rounds, samples, goals, reports

from aec import AecConfig, KeyedProcessFunction, Record, ValueStateDescriptor, run_keyed
from aec.clock import ManualClock
from aec.state.memory import MemoryBackend
from aec.state.ttl_cleanup import TtlCleanup

NAME = "bench_ttl"
HOUR = 3600
VARIANTS = ("no-ttl", "ttl", "ttl-no-cleanup")
GOAL_RATIO = 1.2  # per-record cost with TTL / without
GOAL_WINDOW = 2  # the state holds at most the keys of this many TTLs


class Counter(KeyedProcessFunction):
    """The keyed counter: read, write, emit (``ttl`` None: no TTL)."""

    def __init__(self, ttl: float | None) -> None:
        self.ttl = ttl

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0, ttl=self.ttl))

    def process_element(self, value, ctx):
        count = self.count

        def bump(n):
            n += 1
            return count.async_update(n).then_accept(lambda _: ctx.output(n))

        return count.async_value().then_compose(bump)


class Writer(Counter):
    """Writes the record's value, reads and emits nothing."""

    def process_element(self, value, ctx):
        return self.count.async_update(value)


@dataclass
class Variant:
    backend: str
    kind: str  # one of VARIANTS
    job: str
    records: int
    ttl: float
    root: Path

    @property
    def name(self) -> str:
        return f"{self.backend} {self.kind}"

    def make_backend(self) -> Any:
        if self.backend == "memory":
            return MemoryBackend()
        directory = tempfile.mkdtemp(prefix=f"{self.backend}-", dir=self.root)
        if self.backend == "rocksdb":
            from backends.rocksdb import RocksDBBackend

            return RocksDBBackend(directory)
        from backends.slatedb import SlateDBBackend

        return SlateDBBackend(f"file://{directory}", "db")


def source(clock: ManualClock, records: int, sizes: list | None = None, backend: Any = None
           ) -> Iterator[Record]:  # fmt: skip
    """``records`` distinct keys over a simulated hour; with ``sizes``, the stored
    entries every simulated minute (untimed runs only)."""
    per_second = max(1, records // HOUR)
    for i in range(records):
        if i and i % per_second == 0:
            clock.advance(1.0)
            if sizes is not None and int(clock.now()) % 60 == 0:
                sizes.append((clock.now(), backend.stored_entries("count")))
        yield Record(i, i)


@contextlib.contextmanager
def cleanup_off(off: bool) -> Iterator[None]:
    """No sweep at all while entered (``off``): the ``ttl-no-cleanup`` variant."""
    if not off:
        yield
        return
    charge = TtlCleanup.charge
    TtlCleanup.charge = lambda self, writes: 0  # type: ignore[method-assign]
    try:
        yield
    finally:
        TtlCleanup.charge = charge  # type: ignore[method-assign]


def run_once(variant: Variant, sizes: list | None = None) -> harness.Sample:
    clock = ManualClock(0)
    backend = variant.make_backend()
    backend.open()
    function = (Counter if variant.job == "counter" else Writer)(
        None if variant.kind == "no-ttl" else variant.ttl
    )
    records = source(clock, variant.records, sizes, backend)
    try:
        with cleanup_off(variant.kind == "ttl-no-cleanup"):
            sample = harness.timed(
                lambda: run_keyed(records, function, backend, AecConfig(), clock=clock).metrics
                and None,
                variant.records,
            )
        sample.metrics["stored"] = backend.stored_entries("count")
        sample.metrics["end"] = clock.now()
    finally:
        backend.close()
    return sample


def live_keys(records: int, seconds: float) -> int:
    """Keys written in the last ``seconds`` of the simulated hour."""
    per_second = max(1, records // HOUR)
    return int(min(records, per_second * seconds))


def figures(samples: dict[str, list[harness.Sample]], variants: list[Variant]) -> dict:
    found: dict[str, dict[str, Any]] = {}
    for variant in variants:
        runs = samples[variant.name]
        found.setdefault(variant.backend, {})[variant.kind] = {
            "cpu_us_per_record": 1e6 * min(s.cpu_seconds for s in runs) / variant.records,
            "cpu_us_median": 1e6 * statistics.median(s.cpu_seconds for s in runs) / variant.records,
            "records_per_s": max(s.rps for s in runs),
            "stored_at_end": runs[-1].metrics["stored"],
            "cpu_seconds": [round(s.cpu_seconds, 4) for s in runs],
        }
    return found


def goals(results: dict, records: int, ttl: float) -> list[dict]:
    found = []
    window = live_keys(records, GOAL_WINDOW * ttl)
    for backend, rows in results.items():
        if "ttl" in rows and "no-ttl" in rows:
            ratio = rows["ttl"]["cpu_us_per_record"] / rows["no-ttl"]["cpu_us_per_record"]
            found.append(harness.goal(f"{backend}: CPU per record with TTL / without", ratio,
                                      at_most=GOAL_RATIO))  # fmt: skip
        if "ttl" in rows:
            found.append(harness.goal(
                f"{backend}: entries held at the end (keys of the last {GOAL_WINDOW * ttl:g} s: "
                f"{window:,})", rows["ttl"]["stored_at_end"], at_most=window, unit=" entries",
            ))  # fmt: skip
    return found


def table(results: dict, records: int, ttl: float) -> list[str]:
    rows = []
    for backend, kinds in results.items():
        base = kinds.get("no-ttl", {}).get("cpu_us_per_record")
        for kind, row in kinds.items():
            ratio = row["cpu_us_per_record"] / base if base else None
            rows.append((backend, kind, f"{row['cpu_us_per_record']:.2f}",
                         harness.fmt_ratio(ratio), harness.fmt_rate(row["records_per_s"]),
                         f"{row['stored_at_end']:,}"))  # fmt: skip
    return harness.md_table(
        ["backend", "variant", "CPU us / record (best)", "vs no-ttl", "records/s (best)",
         f"entries held at the end (last {ttl:g} s: {live_keys(records, ttl):,}; "
         f"last {2 * ttl:g} s: {live_keys(records, 2 * ttl):,})"],
        rows, numeric_from=2,
    )  # fmt: skip


def plot(results: dict, traces: dict, records: int, ttl: float, path: Path) -> None:
    plt = harness.pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for backend, points in traces.items():
        if points:
            left.plot([t / 60 for t, _ in points], [n for _, n in points], label=f"{backend} ttl")
    left.axhline(live_keys(records, ttl), color="grey", linestyle=":", label=f"keys of the last {ttl:g} s")
    left.axhline(live_keys(records, 2 * ttl), color="red", linestyle="--",
                 label=f"goal: keys of the last {2 * ttl:g} s")  # fmt: skip
    left.set_xlabel("simulated minutes")
    left.set_ylabel("entries stored")
    left.set_title("state held under a TTL, ever new keys")
    left.legend(fontsize=8)
    labels, values, colors = [], [], []
    palette = {"no-ttl": "tab:blue", "ttl": "tab:orange", "ttl-no-cleanup": "tab:grey"}
    for backend, kinds in results.items():
        for kind, row in kinds.items():
            labels.append(f"{backend}\n{kind}")
            values.append(row["cpu_us_per_record"])
            colors.append(palette[kind])
    right.bar(range(len(values)), values, color=colors)
    right.set_xticks(range(len(values)), labels, fontsize=7)
    right.set_ylabel("CPU us per record (best)")
    right.set_title("per-record cost")
    harness.save(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(parser)
    parser.add_argument("--records", type=int)
    parser.add_argument("--ttl", type=float, default=60.0)
    parser.add_argument("--backends", default="memory,rocksdb,slatedb")
    parser.add_argument("--job", choices=("counter", "write"), default="counter")
    args = harness.finish_args(
        parser, parser.parse_args(argv), NAME, {"repeats": 3, "records": 1_000_000},
        {"repeats": 2, "records": 20_000},
    )  # fmt: skip
    report: dict[str, Any] = {
        "date": harness.now(),
        "machine": harness.machine_facts(("rocksdict", "slatedb")),
        "params": {"records": args.records, "ttl": args.ttl, "repeats": args.repeats,
                   "job": args.job, "backends": args.backends},  # fmt: skip
    }
    results: dict[str, Any] = {}
    traces: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", ignore_cleanup_errors=True) as root:
        for backend in args.backends.split(","):
            variants = [Variant(backend, kind, args.job, args.records, args.ttl, Path(root))
                        for kind in VARIANTS]  # fmt: skip
            samples = harness.run_rounds(variants, run_once, args.repeats)
            results.update(figures(samples, variants))
            sizes: list = []
            started = time.perf_counter()
            run_once(variants[1], sizes)  # untimed: the size over time
            traces[backend] = sizes
            print(f"  {backend}: size trace in {time.perf_counter() - started:.1f} s", flush=True)
            print("\n".join(table({backend: results[backend]}, args.records, args.ttl)), flush=True)
    report["results"] = results
    report["traces"] = traces
    report["goals"] = goals(results, args.records, args.ttl)
    workload = (f"{args.records:,} distinct keys over a simulated hour, TTL {args.ttl:g} s, "
                f"job {args.job!r}")  # fmt: skip
    lines = [*harness.md_header(NAME, workload, report), "", *table(results, args.records, args.ttl)]
    lines += harness.goal_lines({g["text"]: g for g in report["goals"]})
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    harness.write_outputs(
        args.out, NAME, report, markdown,
        lambda path: plot(results, traces, args.records, args.ttl, path),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
