"""Core benchmark: a keyed counter through the aec engine, sync vs async, memory vs RocksDB,
across key skews.

Workload: one read and one write per record (``async_value()`` then ``async_update(n + 1)``,
then one output), ``--records`` records over ``--keys`` int keys, in the key distributions
of the skew sweep (seeded): ``uniform``, Zipf with exponent 0.8 / 1.1 / 1.5 (``zipf-0.8``,
...; rank r drawn with probability proportional to 1 / r**s, ranks shuffled onto keys) and
``hot-50`` (one key holds 50% of the records, the rest uniform). Variants:

* ``plain``: a Python dict loop doing the same work (the floor);
* ``memory-sync`` / ``memory-async``: ``AecConfig(async_state=False)`` / ``AecConfig()``
  on ``MemoryBackend``, callback style (``then_compose``/``then_accept``);
* ``memory-sync-asyncdef`` / ``memory-async-asyncdef``: the same in ``async def``;
* ``rocksdb-sync`` / ``rocksdb-async``: callback style on ``RocksDBBackend`` in a fresh
  temporary directory per run (opened before the clock starts).

Method (``perf/harness.py``): interleaved rounds with the variant order rotated per round,
best of ``--repeats`` (median, samples and records per CPU-second in the JSON). The clock
covers ``run_keyed``; source generation, DB creation and the final-state check (every run's
final state is checked against the expected counts) are outside it.

Goals (ratios of best-of figures from this one run): Zipf(1.1) RocksDB async/sync
>= 1.0x; Zipf(1.1) Memory sync/async cost <= 1.3x; uniform Memory cost <= 1.15x; uniform
RocksDB async/sync >= 1.3x; Memory sync >= 200,000 records/s. A missed goal's async
variant is profiled once (cProfile, every thread) into ``bench_core_profile.txt``.

Usage::

    .venv/bin/python perf/bench_core.py                 # full run, writes perf/results/
    .venv/bin/python perf/bench_core.py --quick         # smoke run, writes to a temp dir
    .venv/bin/python perf/bench_core.py --records 50000 --keys 1000 --repeats 5
    .venv/bin/python perf/bench_core.py --dists uniform,zipf-1.1 --variants plain,memory-async
    bin/with-venv bin/build-compiled /tmp/aec-compiled   # then: interpreted vs compiled
    .venv/bin/python perf/bench_core.py --compiled /tmp/aec-compiled --dists uniform,zipf-1.1

``--compiled DIR`` compares the builds instead (``bench_core_compiled.{json,md,png}``): every
variant runs in two worker processes, this checkout's interpreted build and DIR's compiled
one, taking turns in the same rounds; goals (compiled / interpreted records/s, uniform):
Memory sync and async >= 2.0x, RocksDB async >= 1.7x, plain loop / compiled Memory sync
<= 10x. ``--base DIR`` compares this checkout with another commit's the same way
(``bench_core_base.{json,md,png}``; ``git worktree add DIR COMMIT``, this venv): every
row's this / base records/s >= 0.95 is "no loss of speed".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter as Tally
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

from aec import AecConfig, KeyedProcessFunction, Record, ValueStateDescriptor, run_keyed  # noqa: E402
from aec.state.memory import MemoryBackend  # noqa: E402
from backends.rocksdb import RocksDBBackend  # noqa: E402

DEFAULTS = {"records": 200_000, "keys": 10_000, "repeats": 3}
QUICK = {"records": 20_000, "keys": 1_000, "repeats": 1}
DISTS = ["uniform", "zipf-0.8", "zipf-1.1", "zipf-1.5", "hot-50"]
GOAL_SYNC_RATE = 200_000.0


# --- the keyed functions --------------------------------------------------------------------


class Counter(KeyedProcessFunction):
    """The README's counter, callback style: read, write n + 1, emit (key, n + 1)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.count.async_value().then_compose(
            lambda n: self.count.async_update(n + 1).then_accept(
                lambda _: ctx.output((ctx.current_key, n + 1))
            )
        )


class AsyncDefCounter(Counter):
    """The same counter in ``async def``."""

    async def process_element(self, value: Any, ctx: Any) -> None:
        n = await self.count.async_value()
        await self.count.async_update(n + 1)
        ctx.output((ctx.current_key, n + 1))


def plain_loop(source: list[Record]) -> dict[Any, int]:
    """The floor: the same reads, writes and outputs on a dict, no engine."""
    counts: dict[Any, int] = {}
    outputs = []
    get = counts.get
    emit = outputs.append
    for record in source:
        key = record.key
        n = get(key, 0)
        counts[key] = n + 1
        emit((key, n + 1))
    return counts


# --- variants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str  # stable id, used in the JSON
    label: str  # for tables and the chart
    backend: str | None  # None: the plain loop
    async_state: bool = False
    style: str = "callback"  # or "async def"


VARIANTS = [
    Variant("plain", "plain dict loop", None),
    Variant("memory-sync", "memory sync", "memory", False),
    Variant("memory-async", "memory async", "memory", True),
    Variant("memory-sync-asyncdef", "memory sync (async def)", "memory", False, "async def"),
    Variant("memory-async-asyncdef", "memory async (async def)", "memory", True, "async def"),
    Variant("rocksdb-sync", "rocksdb sync", "rocksdb", False),
    Variant("rocksdb-async", "rocksdb async", "rocksdb", True),
]
BY_NAME = {v.name: v for v in VARIANTS}


def run_variant(variant: Variant, source: list[Record], expected: dict[Any, int]) -> h.Sample:
    """One timed run of ``variant`` over ``source``; checks the final state afterwards."""
    if variant.backend is None:
        counts: dict[Any, int] = {}

        def loop() -> None:
            counts.update(plain_loop(source))

        sample = h.timed(loop, len(source))
        if counts != expected:
            raise AssertionError("plain loop: wrong counts")
        return sample
    tmp = None
    if variant.backend == "memory":
        backend: Any = MemoryBackend()
    else:
        tmp = tempfile.mkdtemp(prefix="aec-bench-rocksdb-")
        backend = RocksDBBackend(tmp)
        backend.open()  # DB creation stays outside the clock; run_keyed's open is a no-op
    function = AsyncDefCounter() if variant.style == "async def" else Counter()
    config = AecConfig(async_state=variant.async_state)
    try:
        sample = h.timed(
            lambda: dict(run_keyed(source, function, backend, config).metrics), len(source)
        )
        state = backend.state_items("count")
        if state != expected:
            wrong = sum(1 for k, n in expected.items() if state.get(k) != n)
            raise AssertionError(f"{variant.label}: final state wrong for {wrong} keys")
    finally:
        backend.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return sample


# --- sources --------------------------------------------------------------------------------


def make_keys(distribution: str, records: int, keys: int, seed: int) -> list[int]:
    """Seeded key sequence for one distribution of ``DISTS``."""
    import numpy as np

    rng = np.random.default_rng([seed, DISTS.index(distribution)])
    if distribution == "uniform":
        return rng.integers(0, keys, size=records).tolist()
    ids = rng.permutation(keys)  # ranks land on arbitrary keys (and key groups)
    if distribution.startswith("zipf-"):
        s = float(distribution.split("-", 1)[1])
        p = 1.0 / np.arange(1, keys + 1) ** s
        return ids[rng.choice(keys, size=records, p=p / p.sum())].tolist()
    if distribution.startswith("hot-"):
        share = int(distribution.split("-", 1)[1]) / 100
        out = rng.integers(0, keys, size=records)
        out[rng.random(records) < share] = 0
        return ids[out].tolist()
    raise ValueError(f"unknown distribution {distribution!r}; known: {DISTS}")


def describe_keys(key_seq: list[int]) -> dict[str, Any]:
    tally = Tally(key_seq)
    top = tally.most_common(10)
    return {
        "distinct_keys": len(tally),
        "hottest_key_share": top[0][1] / len(key_seq),
        "top10_keys_share": sum(c for _, c in top) / len(key_seq),
    }


# --- results --------------------------------------------------------------------------------


def async_pairs(variants: list[Variant]) -> list[tuple[Variant, Variant]]:
    """(sync twin, async variant) of the same backend and style."""
    pairs = []
    for v in variants:
        twin = next((s for s in variants if v.async_state and s.backend == v.backend
                     and s.style == v.style and not s.async_state), None)  # fmt: skip
        if twin is not None:
            pairs.append((twin, v))
    return pairs


def judge(
    res: dict[tuple[str, str], dict[str, Any]], samples: dict[str, list[h.Sample]]
) -> dict[str, Any]:
    def ratio(num: str, den: str, dist: str) -> tuple[float | None, float | None, list[float]]:
        a, b = res.get((num, dist)), res.get((den, dist))
        if a is None or b is None:
            return None, None, []
        return (a["best_rps"] / b["best_rps"], a["cpu_rps"] / b["cpu_rps"],
                h.paired(samples, f"{num}@{dist}", f"{den}@{dist}"))  # fmt: skip

    goals = {}
    for gid, num, den, dist, text, bound in (
        ("zipf_rocksdb", "rocksdb-async", "rocksdb-sync", "zipf-1.1",
         "Zipf(1.1) RocksDB async / sync records/s", {"at_least": 1.0}),
        ("zipf_memory", "memory-sync", "memory-async", "zipf-1.1",
         "Zipf(1.1) Memory sync / async (cost of async)", {"at_most": 1.3}),
        ("uniform_memory", "memory-sync", "memory-async", "uniform",
         "uniform Memory sync / async (cost of async)", {"at_most": 1.15}),
        ("uniform_rocksdb", "rocksdb-async", "rocksdb-sync", "uniform",
         "uniform RocksDB async / sync records/s", {"at_least": 1.3}),
    ):  # fmt: skip
        value, cpu, rounds = ratio(num, den, dist)
        goals[gid] = h.goal(text, value, cpu_value=cpu, per_round=rounds, **bound)
        goals[gid]["profile"] = num if num.endswith("async") else den
    sync = [r for (n, _), r in res.items() if n == "memory-sync"]
    goals["sync_rate"] = h.goal(
        "Memory sync records/s (worst distribution)",
        min((r["best_rps"] for r in sync), default=None), at_least=GOAL_SYNC_RATE,
        cpu_value=min((r["cpu_rps"] for r in sync), default=None), unit=" records/s",
    )  # fmt: skip
    goals["sync_rate"]["profile"] = "memory-sync"
    return goals


def markdown(report: dict[str, Any]) -> str:
    p = report["params"]
    lines = [
        *h.md_header(
            "bench_core: keyed counter across key skews",
            f"{p['records']:,} records over {p['keys']:,} keys",
            report,
        ),  # fmt: skip
        "",
        *h.md_table(
            ["distribution", "distinct keys", "hottest key", "top 10 keys"],
            [
                [
                    d,
                    f"{i['distinct_keys']:,}",
                    f"{i['hottest_key_share']:.1%}",
                    f"{i['top10_keys_share']:.1%}",
                ]
                for d, i in report["distributions"].items()
            ],
        ),  # fmt: skip
        "",
        *h.md_table(
            [
                "variant",
                "keys",
                "records/s (best)",
                "median",
                "per CPU-s",
                "vs plain",
                "GC s",
                "batches",
                "mean batch",
                "inline batches",
                "max in-flight",
            ],
            [
                [
                    r["label"],
                    r["distribution"],
                    h.fmt_rate(r["best_rps"]),
                    h.fmt_rate(r["median_rps"]),
                    h.fmt_rate(r["cpu_rps"]),
                    f"{r['cost_vs_plain']:.1f}x",
                    f"{r['metrics']['gc_seconds']:.2f}",
                    *(
                        [
                            f"{r['metrics']['batches']:,}",
                            f"{r['metrics']['mean_batch_size']:.0f}",
                            f"{r['metrics'].get('inline_batches', 0):,}",
                            f"{r['metrics']['max_in_flight']:,}",
                        ]
                        if r["async_state"]
                        else ["", "", "", ""]
                    ),
                ]
                for r in report["results"]
            ],
            numeric_from=2,
        ),  # fmt: skip
        "",
        "Async / sync records/s per backend and skew (above 1: async faster; the cost of async "
        "is the inverse):",
        "",
        *h.md_table(
            [
                "backend",
                "style",
                "keys",
                "sync rec/s",
                "async rec/s",
                "async / sync",
                "cost (sync / async)",
                "cost per CPU-s",
            ],
            [
                [
                    c["backend"],
                    c["style"],
                    c["distribution"],
                    h.fmt_rate(c["sync_rps"]),
                    h.fmt_rate(c["async_rps"]),
                    f"{1 / c['cost']:.2f}x",
                    f"{c['cost']:.2f}x",
                    f"{c['cpu_cost']:.2f}x",
                ]
                for c in report["async_cost"]
            ],
            numeric_from=3,
        ),  # fmt: skip
        *h.goal_lines(report["goals"], report.get("profile")),
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = h.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    dists = list(report["distributions"])
    names = list(dict.fromkeys(r["variant"] for r in report["results"]))
    labels = [BY_NAME[n].label for n in names]
    rate = {(r["variant"], r["distribution"]): r["best_rps"] for r in report["results"]}
    width = 0.8 / len(dists)
    for i, dist in enumerate(dists):
        xs = [j + (i - (len(dists) - 1) / 2) * width for j in range(len(names))]
        h.bars(ax, xs, [rate[n, dist] for n in names], width, label=dist)
    ax.axhline(GOAL_SYNC_RATE, color="red", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_ylabel("records/s (best of rounds, log scale)")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.legend(title="keys", fontsize=7)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_title(f"keyed counter, {report['params']['records']:,} records, "
                 f"{report['params']['keys']:,} keys", fontsize=10)  # fmt: skip
    for (backend, style), color in ((("memory", "callback"), "#4c72b0"), (("memory", "async def"), "#8172b2"),
                                    (("rocksdb", "callback"), "#dd8452")):  # fmt: skip
        pts = [(dists.index(c["distribution"]), 1 / c["cost"]) for c in report["async_cost"]
               if c["backend"] == backend and c["style"] == style]  # fmt: skip
        if pts:
            ax2.plot(*zip(*pts, strict=True), marker="o", color=color, label=f"{backend} {style}")
        cpu = [(dists.index(c["distribution"]), 1 / c["cpu_cost"]) for c in report["async_cost"]
               if c["backend"] == backend and c["style"] == style]  # fmt: skip
        if cpu:
            ax2.plot(*zip(*cpu, strict=True), marker="x", linestyle="--", color=color,
                     label=f"{backend} {style}, per CPU-s")  # fmt: skip
    ax2.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax2.set_xticks(range(len(dists)))
    ax2.set_xticklabels(dists)
    ax2.set_xlabel("key skew")
    ax2.set_ylabel("async / sync records/s")
    ax2.set_title(
        "async / sync vs skew (above 1: async faster; dashed: per CPU-second)", fontsize=10
    )
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    h.save(fig, path)


def profile_failing(
    failing: set[str], args: argparse.Namespace, sources: dict, expected: dict
) -> str | None:
    """cProfile (thread CPU) of each failing variant on Zipf(1.1), and where async
    spends more than sync on each backend whose async variant failed."""
    dist = "zipf-1.1" if "zipf-1.1" in sources else args.dists[0]
    names = [n for n in sorted(failing) if n in args.variants]
    for name in list(names):  # the sync twin, for the difference
        twin = name.replace("-async", "-sync")
        if name.endswith("-async") and twin in args.variants and twin not in names:
            names.append(twin)
    texts, stats = [], {}
    for name in names:
        text, stats[name] = h.profile_call(
            lambda n=name: run_variant(BY_NAME[n], sources[dist], expected[dist]),
            f"{BY_NAME[name].label}, {dist}, {args.records:,} records", threads=True)  # fmt: skip
        texts.append(text)
    for name in names:
        twin = name.replace("-async", "-sync")
        if name.endswith("-async") and twin in stats:
            texts.append(
                h.profile_diff(stats[name], stats[twin], BY_NAME[name].label, BY_NAME[twin].label)
            )
    return "".join(texts) or None


# --- interpreted and compiled builds side by side (--compiled) ------------------------------

BUILD_GOALS = (  # the compiled kernel's goals: compiled / interpreted records/s, uniform keys
    ("memory_sync", "memory-sync", 2.0),
    ("memory_async", "memory-async", 2.0),
    ("rocksdb_async", "rocksdb-async", 1.7),
)
BASE_GOAL = 0.95  # this checkout / base records/s, every row: "no loss of speed"


@dataclass(frozen=True)
class Pair:
    """Two checkouts compared side by side: ``new`` (``new_root``) over ``old``."""

    name: str  # the results' file name
    title: str
    old: str  # labels
    new: str
    old_root: Path
    new_root: Path


def build_pair(args: argparse.Namespace) -> Pair:
    """``--compiled DIR``: this checkout's interpreted build vs DIR's compiled one;
    ``--base DIR``: DIR (another commit's checkout) vs this checkout."""
    if args.compiled is not None:
        return Pair("bench_core_compiled", "interpreted and compiled builds", "interpreted",
                    "compiled", h.ROOT, args.compiled.resolve())  # fmt: skip
    return Pair("bench_core_base", f"this checkout and {args.base} ({_commit(args.base)})",
                "base", "this", args.base.resolve(), h.ROOT)  # fmt: skip


def _commit(checkout: Path) -> str:
    """The short commit of a git checkout, or "not a git checkout"."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "not a git checkout"


def serve(args: argparse.Namespace) -> int:
    """Worker of ``--compiled`` / ``--base``: answers (variant, distribution) requests with
    samples."""
    variants = [v for v in VARIANTS if v.name in args.variants]
    sources, expected, _ = make_sources(args, show=False)
    warm_up(variants, sources[args.dists[0]])
    h.serve_samples(
        h.build_hello(),
        lambda r: run_variant(BY_NAME[r["variant"]], sources[r["dist"]], expected[r["dist"]]),
    )
    return 0


def compare_builds(args: argparse.Namespace) -> int:
    """Every variant and distribution in both checkouts of ``build_pair(args)``,
    alternately, in the same rounds."""
    pair = build_pair(args)
    machine = h.machine_facts(("rocksdict", "numpy", "matplotlib", "mypy"))
    variants = [v for v in VARIANTS if v.name in args.variants]
    _, _, dist_info = make_sources(args)
    roots = {pair.old: pair.old_root, pair.new: pair.new_root}
    worker_args = ["--serve", "--records", str(args.records), "--keys", str(args.keys),
                   "--seed", str(args.seed), "--dists", ",".join(args.dists),
                   "--variants", ",".join(v.name for v in variants)]  # fmt: skip

    samples = h.worker_rounds(
        Path(__file__).resolve(), worker_args, roots,
        [(v, d) for d in args.dists for v in variants],
        lambda r: {"variant": r[0].name, "dist": r[1]}, args.repeats,
        name=lambda r: f"{r[0].name}@{r[1]}",
        check=h.check_worker(roots) if args.compiled is not None else lambda b, hello: None,
    )  # fmt: skip
    rows = []
    for d in args.dists:
        for v in variants:
            o, n = (h.summarize(samples[f"{v.name}@{d}@{b}"]) for b in roots)
            rows.append({"variant": v.name, "label": v.label, "distribution": d,
                         pair.old: o, pair.new: n,
                         "speedup": n["best_rps"] / o["best_rps"],
                         "cpu_speedup": n["cpu_rps"] / o["cpu_rps"],
                         "per_round": h.paired(samples, f"{v.name}@{d}@{pair.new}",
                                               f"{v.name}@{d}@{pair.old}")})  # fmt: skip
    goals = build_goals(args, pair, rows)
    print(f"\n{'variant':<26} {'keys':>9} {pair.old:>12} {pair.new:>12} {'ratio':>8} "
          f"{'per CPU-s':>9}  per round")  # fmt: skip
    for r in rows:
        print(f"{r['label']:<26} {r['distribution']:>9} {h.fmt_rate(r[pair.old]['best_rps']):>12} "
              f"{h.fmt_rate(r[pair.new]['best_rps']):>12} {r['speedup']:>7.2f}x "
              f"{r['cpu_speedup']:>8.2f}x  {' '.join(f'{x:.2f}' for x in r['per_round'])}")  # fmt: skip
    print()
    for g in goals.values():
        print(f"{h.verdict(g)}: {g['text']}: {g['measured']}")
    report = {
        "benchmark": pair.name, "date": h.now(), "machine": machine,
        "params": {"records": args.records, "keys": args.keys, "repeats": args.repeats,
                   "seed": args.seed, "quick": args.quick, pair.old: str(pair.old_root),
                   pair.new: str(pair.new_root), "title": pair.title,
                   "labels": [pair.old, pair.new],
                   "statistic": "best of repeats; fresh workers per round, first of a pair alternating"},
        "distributions": dist_info, "results": rows, "goals": goals,
    }  # fmt: skip
    h.write_outputs(args.out, pair.name, report, builds_markdown(report),
                    lambda p: builds_plot(report, p))  # fmt: skip
    return 0


def build_goals(args: argparse.Namespace, pair: Pair, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``--compiled``: the compiled kernel's goals; ``--base``: every row >= BASE_GOAL."""
    goals = {}
    if args.compiled is None:
        for r in rows:
            goals[f"{r['variant']}@{r['distribution']}"] = h.goal(
                f"{r['distribution']} {r['label']}: this / base records/s", r["speedup"],
                at_least=BASE_GOAL, cpu_value=r["cpu_speedup"], per_round=r["per_round"],
            )  # fmt: skip
        return goals
    by = {(r["variant"], r["distribution"]): r for r in rows}
    for gid, name, bound in BUILD_GOALS:
        r = by.get((name, "uniform"))
        goals[gid] = h.goal(f"uniform {BY_NAME[name].label}: compiled / interpreted records/s",
                            r and r["speedup"], at_least=bound,
                            cpu_value=r and r["cpu_speedup"], per_round=r["per_round"] if r else ())  # fmt: skip
    plain, sync = by.get(("plain", "uniform")), by.get(("memory-sync", "uniform"))
    goals["vs_plain"] = h.goal(
        "uniform plain dict loop / compiled memory sync records/s",
        plain and sync and plain["compiled"]["best_rps"] / sync["compiled"]["best_rps"],
        at_most=10.0,
    )  # fmt: skip
    return goals


def builds_markdown(report: dict[str, Any]) -> str:
    p = report["params"]
    old, new = p["labels"]
    lines = [
        *h.md_header(f"bench_core: {p['title']}",
                     f"{p['records']:,} records over {p['keys']:,} keys", report),
        "",
        *h.md_table(
            ["variant", "keys", f"{old} records/s", f"{new} records/s", f"{new} / {old}",
             "per CPU-s", "per round"],
            [[r["label"], r["distribution"], h.fmt_rate(r[old]["best_rps"]),
              h.fmt_rate(r[new]["best_rps"]), f"{r['speedup']:.2f}x",
              f"{r['cpu_speedup']:.2f}x", " ".join(f"{x:.2f}" for x in r["per_round"])]
             for r in report["results"]],
            numeric_from=2,
        ),
        *h.goal_lines(report["goals"]),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def builds_plot(report: dict[str, Any], path: Path) -> None:
    plt = h.pyplot()
    rows = report["results"]
    old, new = report["params"]["labels"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows)), 5))
    xs = range(len(rows))
    for offset, build, color in ((-0.2, old, "#4c72b0"), (0.2, new, "#dd8452")):
        h.bars(ax, [x + offset for x in xs], [r[build]["best_rps"] for r in rows], 0.4,
               label=build, color=color)  # fmt: skip
    ax.set_yscale("log")
    ax.set_ylabel("records/s (best of rounds, log scale)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['label']}\n{r['distribution']} ({r['speedup']:.2f}x)" for r in rows],
                       rotation=20, ha="right", fontsize=8)  # fmt: skip
    ax.legend()
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_title(f"keyed counter, {report['params']['title']}, {report['params']['records']:,} records",
                 fontsize=10)  # fmt: skip
    h.save(fig, path)


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, help="records per run (default 200,000)")
    parser.add_argument("--keys", type=int, help="distinct keys (default 10,000)")
    parser.add_argument("--dists", default=",".join(DISTS), help=f"subset of {','.join(DISTS)}")
    parser.add_argument(
        "--variants", default=",".join(BY_NAME), help=f"subset of {','.join(BY_NAME)}"
    )
    parser.add_argument(
        "--compiled", type=Path, metavar="DIR",
        help="compare builds: DIR holds the compiled kernel built in place (bin/build-compiled "
        "DIR); each variant runs in this checkout's interpreted build and in DIR's compiled "
        "one, in two worker processes taking turns; writes bench_core_compiled.*",
    )  # fmt: skip
    parser.add_argument(
        "--base", type=Path, metavar="DIR",
        help="compare checkouts: DIR holds another commit's checkout (git worktree add DIR "
        "COMMIT); each variant runs on DIR and on this checkout, in two worker processes "
        "taking turns; every row's this / base >= 0.95; writes bench_core_base.*",
    )  # fmt: skip
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a worker
    h.add_common_args(parser)
    args = h.finish_args(parser, parser.parse_args(argv), "bench_core", DEFAULTS, QUICK)
    args.variants = [n.strip() for n in args.variants.split(",") if n.strip()]
    args.dists = [d.strip() for d in args.dists.split(",") if d.strip()]
    unknown = [n for n in args.variants if n not in BY_NAME] + [
        d for d in args.dists if d not in DISTS
    ]
    if args.compiled is not None and args.base is not None:
        parser.error("--compiled and --base compare two checkouts each: give one")
    if unknown or "plain" not in args.variants:
        parser.error(f"unknown variants/distributions {unknown} (or 'plain' missing: the baseline)")
    return args


def make_sources(
    args: argparse.Namespace, show: bool = True
) -> tuple[dict[str, list[Record]], dict[str, dict[Any, int]], dict[str, dict[str, Any]]]:
    """Per distribution: the records, the expected final counts, the key statistics."""
    sources, expected, dist_info = {}, {}, {}
    for dist in args.dists:
        key_seq = make_keys(dist, args.records, args.keys, args.seed)
        sources[dist] = [Record(key, i) for i, key in enumerate(key_seq)]
        expected[dist] = dict(Tally(key_seq))
        dist_info[dist] = describe_keys(key_seq)
        if show:
            print(f"{dist:>9}: {dist_info[dist]['distinct_keys']:,} distinct keys, hottest key "
                  f"{dist_info[dist]['hottest_key_share']:.1%} of records")  # fmt: skip
    return sources, expected, dist_info


def warm_up(variants: list[Variant], source: list[Record]) -> None:
    """Imports, first DB creation, code paths (not recorded)."""
    warm = source[:2000]
    for v in variants:
        run_variant(v, warm, dict(Tally(r.key for r in warm)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args)
    if args.compiled is not None or args.base is not None:
        return compare_builds(args)
    machine = h.machine_facts(("rocksdict", "numpy", "matplotlib"))
    variants = [v for v in VARIANTS if v.name in args.variants]
    sources, expected, dist_info = make_sources(args)
    warm_up(variants, sources[args.dists[0]])

    runs = [(v, d) for d in args.dists for v in variants]
    samples = h.run_rounds(runs, lambda vd: run_variant(vd[0], sources[vd[1]], expected[vd[1]]),
                           args.repeats, name=lambda vd: f"{vd[0].name}@{vd[1]}")  # fmt: skip
    res: dict[tuple[str, str], dict[str, Any]] = {}
    for v, dist in runs:
        res[v.name, dist] = {"variant": v.name, "label": v.label, "backend": v.backend,
                             "async_state": v.async_state, "style": v.style if v.backend else None,
                             "distribution": dist, **h.summarize(samples[f"{v.name}@{dist}"])}  # fmt: skip
    for (_, dist), r in res.items():
        r["cost_vs_plain"] = res["plain", dist]["best_rps"] / r["best_rps"]
    async_cost = [
        {"backend": a.backend, "style": a.style, "distribution": d,
         "sync_rps": res[s.name, d]["best_rps"], "async_rps": res[a.name, d]["best_rps"],
         "cost": res[s.name, d]["best_rps"] / res[a.name, d]["best_rps"],
         "cpu_cost": res[s.name, d]["cpu_rps"] / res[a.name, d]["cpu_rps"]}
        for s, a in async_pairs(variants) for d in args.dists
    ]  # fmt: skip
    goals = judge(res, samples)

    print(f"\n{'variant':<26} {'keys':>9} {'best rec/s':>12} {'median':>12} {'per CPU-s':>12} "
          f"{'batches':>8} {'mean':>6} {'inline':>7}")  # fmt: skip
    for r in res.values():
        mt = r["metrics"]
        extra = (f"{mt['batches']:>8,} {mt['mean_batch_size']:>6.1f} {mt.get('inline_batches', 0):>7,}"
                 if r["async_state"] else "")  # fmt: skip
        print(f"{r['label']:<26} {r['distribution']:>9} {h.fmt_rate(r['best_rps']):>12} "
              f"{h.fmt_rate(r['median_rps']):>12} {h.fmt_rate(r['cpu_rps']):>12} {extra}")  # fmt: skip
    print("\nasync / sync records/s:")
    for c in async_cost:
        print(f"  {c['backend']:<8} {c['style']:<10} {c['distribution']:>9}: {1 / c['cost']:.2f}x "
              f"(cost {c['cost']:.2f}x, per CPU-s {c['cpu_cost']:.2f}x)")  # fmt: skip
    print()
    for g in goals.values():
        print(f"{h.verdict(g)}: {g['text']}: {g['measured']}")

    failing = {g["profile"] for g in goals.values() if g["met"] is False}
    text = None if args.no_profile else profile_failing(failing, args, sources, expected)
    report = {
        "benchmark": "bench_core", "date": h.now(), "machine": machine,
        "params": {"records": args.records, "keys": args.keys, "repeats": args.repeats,
                   "seed": args.seed, "quick": args.quick,
                   "statistic": "best of repeats (median and samples also given)",
                   "aec_config": "AecConfig() defaults; async_state=False for sync rows"},
        "distributions": dist_info, "results": list(res.values()), "async_cost": async_cost,
        "goals": goals, "profile": h.write_profile(args.out, "bench_core", text),
    }  # fmt: skip
    h.write_outputs(args.out, "bench_core", report, markdown(report), lambda p: plot(report, p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
