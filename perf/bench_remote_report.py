"""bench_remote's report: goals, the main table, sweeps, Markdown and the PNG."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

IN_FLIGHT, BUFFER = 6000, 1000  # Flink's defaults (the async rows' config)
ROW_MS = 1.0
FLINK = {"1": 17_100, "2": 850, "3": 7_000, "4": 42_700}  # FLIP-423, records/s, for context
SHORT = {"memory": "memory", "rocksdb": "RocksDB", "latency": "1 ms", "cached": "cache warm",
         "cached-cold": "cache cold", "slatedb": "SlateDB", "redis": "Redis"}  # fmt: skip

# --- results --------------------------------------------------------------------------------

GOALS = [  # (id, numerator, denominator, at least, text, CPU-bound: per CPU-second is fair)
    ("row3_vs_row2", "r3-latency-async", "r2-latency-sync", 50.0, "row 3 (async, 1 ms) / row 2 (sync, 1 ms)", False),
    ("row3_vs_memory", "r3-latency-async", "ref-memory-async", 0.5, "row 3 (async, 1 ms) / async MemoryBackend", True),
    ("row4_vs_row1", "r4-cached-async", "r1-rocksdb-sync", 1.0, "row 4 (async, warm cache over 1 ms) / row 1 (sync RocksDB local)", True),
    ("slatedb_async_vs_sync", "r5-slatedb-async", "r5-slatedb-sync", 10.0, "SlateDB async / sync", False),
    ("redis_async_vs_sync", "r6-redis-async", "r6-redis-sync", 10.0, "Redis async / sync", False),
]  # fmt: skip
TWINS = {"r3-latency-async": "r2-latency-sync", "r4-cached-async": "r2-latency-sync",
         "r4c-cached-cold-async": "r2-latency-sync", "r5-slatedb-async": "r5-slatedb-sync",
         "r6-redis-async": "r6-redis-sync", "ref-rocksdb-async": "r1-rocksdb-sync"}  # fmt: skip
EXTRAS = [
    ("latency_hidden", "r3-latency-async", "ref-rocksdb-async", "latency hidden: row 3 / async RocksDB local"),
    ("rocksdb_cost", "ref-rocksdb-async", "ref-memory-async", "the store's CPU cost: async RocksDB local / async Memory"),
    ("warm_vs_cold", "r4-cached-async", "r4c-cached-cold-async", "warm cache / cold cache (row 4 / row 4c)"),
    ("cache_vs_no_cache", "r4-cached-async", "r3-latency-async", "warm cache / no cache (row 4 / row 3)"),
    ("in_flight_1000_vs_6000", "inflight-1000", "r3-latency-async", "in-flight limit 1000 / 6000 (async, 1 ms)"),
]  # fmt: skip


def judge(results: dict[str, Any], samples: dict[str, list[h.Sample]]) -> dict[str, Any]:
    goals = {}
    for gid, num, den, at_least, text, cpu_bound in GOALS:
        a, b = results.get(num), results.get(den)
        goals[gid] = h.goal(
            text, a["best_rps"] / b["best_rps"] if a and b else None, at_least=at_least,
            cpu_value=a["cpu_rps"] / b["cpu_rps"] if a and b and cpu_bound else None,
            per_round=h.paired(samples, num, den),
        )  # fmt: skip
        goals[gid]["profile"] = num
    return goals


def extra_ratios(results: dict[str, Any]) -> dict[str, Any]:
    return {eid: {"text": text, "ratio": results[num]["best_rps"] / results[den]["best_rps"],
                  "cpu_ratio": results[num]["cpu_rps"] / results[den]["cpu_rps"]}
            for eid, num, den, text in EXTRAS if num in results and den in results}  # fmt: skip


def main_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    row1 = results.get("r1-rocksdb-sync", {}).get("best_rps")
    table = []
    for r in results.values():
        if "main" in r["groups"]:
            twin = results.get(TWINS.get(r["name"], ""))
            table.append({**r, "vs_row1": r["best_rps"] / row1 if row1 else None,
                          "vs_sync": r["best_rps"] / twin["best_rps"] if twin else None,
                          "sync_twin": twin["name"] if twin else None})  # fmt: skip
    return table


def sweep_table(results: dict[str, Any], group: str) -> list[dict[str, Any]]:
    key = {"latency": lambda r: (r["latency_ms"], r["mode"]),
           "in_flight": lambda r: r["in_flight_records_limit"], "buffer": lambda r: r["buffer_size"]}[group]  # fmt: skip
    return sorted((r for r in results.values() if group in r["groups"]), key=key)


def markdown(report: dict[str, Any]) -> str:
    p, m = report["params"], report["machine"]
    lines = [
        "# bench_remote: the keyed counter on remote state, sync vs async",
        "",
        f"{p['records']:,} records over {p['keys']:,} keys (uniform, seed {p['seed']}); sync rows on "
        f"slow backends time the first {p['sync_records']:,} records; best of {p['repeats']} "
        f"interleaved rounds. {h.machine_line(report)} redis-server {m.get('redis_server')}, "
        f"slatedb {m.get('slatedb')}.",
        "",
        f"Async rows: `AecConfig(in_flight_records_limit={IN_FLIGHT}, buffer_size={BUFFER}, "
        f"executor_threads={p['threads']})`; row 4 is warmed outside the clock, row 4c starts cold. "
        "*cores busy* = process CPU time / wall time of the best run. The Flink column is FLIP-423's "
        "table, for comparison only (its rows 2 and 3 ran on HDFS).",
        "",
    ]  # fmt: skip
    rows = []
    for r in report["main_table"]:
        mt, flink = r["metrics"], FLINK.get(r["row"])
        rows.append([
            r["row"], r["mode"], r["label"].split(" ", 1)[1], f"{r['records']:,}", h.fmt_rate(r["best_rps"]),
            h.fmt_rate(r["median_rps"]), h.fmt_ratio(r["vs_row1"]),
            h.fmt_ratio(r["vs_sync"]) + (f" (vs {r['sync_twin'].split('-')[0]})" if r["vs_sync"] else ""),
            f"{r['cores_busy']:.2f}", f"{mt['batches']:,}" if r["mode"] == "async" else "",
            f"{mt['mean_batch_size']:.0f}" if r["mode"] == "async" else "",
            f"{mt['hit_rate']:.1%}" if "hit_rate" in mt else "", f"{flink:,} /s" if flink else "",
        ])  # fmt: skip
    lines += h.md_table(["row", "mode", "backend", "records timed", "records/s (best)", "median", "vs row 1",
                         "async / sync", "cores busy", "batches", "mean batch", "cache hit rate",
                         "Flink (FLIP-423)"], rows, numeric_from=3)  # fmt: skip
    lines += h.goal_lines(report["goals"], report.get("profile"))
    extras = report.get("extra_ratios") or {}
    if extras:
        lines += [
            "",
            "Ratios that explain them (best-of records/s; per CPU-second in brackets):",
            "",
        ]
        lines += [
            f"- {e['text']}: {h.fmt_ratio(e['ratio'])} ({h.fmt_ratio(e['cpu_ratio'])})"
            for e in extras.values()
        ]
    sweeps = report["sweeps"]
    if sweeps["latency"]:
        by_ms: dict[float, dict[str, Any]] = {}
        for r in sweeps["latency"]:
            by_ms.setdefault(r["latency_ms"], {})[r["mode"]] = r
        lines += ["", "## Sweep: round-trip latency (LatencyBackend over RocksDB)", ""]
        lines += h.md_table(["latency", "sync records timed", "sync records/s", "async records/s", "async / sync"], [
            [f"{ms:g} ms", f"{s['records'] if s else 0:,}", h.fmt_rate(s["best_rps"]) if s else "",
             h.fmt_rate(a["best_rps"]) if a else "", h.fmt_ratio(a["best_rps"] / s["best_rps"]) if s and a else ""]
            for ms, pair in sorted(by_ms.items()) for s, a in [(pair.get("sync"), pair.get("async"))]])  # fmt: skip
    for group, column in (("in_flight", "in_flight_records_limit"), ("buffer", "buffer_size")):
        if sweeps[group]:
            lines += [
                "",
                f"## Sweep: `{column}` (async, 1 ms, other options at their defaults)",
                "",
            ]
            lines += h.md_table([column, "records timed", "records/s (best)", "batches", "mean batch", "max in flight"], [
                [f"{r[column]:,}", f"{r['records']:,}", h.fmt_rate(r["best_rps"]), f"{r['metrics']['batches']:,}",
                 f"{r['metrics']['mean_batch_size']:.0f}", f"{r['metrics']['max_in_flight']:,}"]
                for r in sweeps[group]], numeric_from=0)  # fmt: skip
    lines += ["", "Reproduce: `.venv/bin/python perf/bench_remote.py` (samples and engine metrics in "
              "`bench_remote.json`, plots in `bench_remote.png`)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = h.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    ax, table = axes[0][0], report["main_table"]
    h.bars(ax, range(len(table)), [r["best_rps"] for r in table],
           color=["#dd8452" if r["mode"] == "sync" else "#4c72b0" for r in table])  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(range(len(table)))
    ax.set_xticklabels([f"{r['row']} {r['mode']}\n{SHORT[r['backend']]}" for r in table], fontsize=7,
                       rotation=30, ha="right")  # fmt: skip
    ax.set_title("the table (orange: sync, blue: async)", fontsize=10)
    sweeps, mem = report["sweeps"], report["results"].get("ref-memory-async")
    ax = axes[0][1]
    for mode, color in (("sync", "#dd8452"), ("async", "#4c72b0")):
        h.points(ax, sorted((r["latency_ms"], r["best_rps"]) for r in sweeps["latency"] if r["mode"] == mode),
                 color=color, label=mode)  # fmt: skip
    sync_ms = sorted(r["latency_ms"] for r in sweeps["latency"] if r["mode"] == "sync")
    if sync_ms:
        ax.plot(sync_ms, [1000 / (2 * ms) for ms in sync_ms], linestyle=":", color="#dd8452",
                label="sync bound: 1 / (2 x latency)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("round-trip latency per batch (ms)")
    ax.set_title("throughput vs latency (LatencyBackend over RocksDB)", fontsize=10)
    threads = report["params"]["threads"]
    for ax, group, column, per, bound in (
        (axes[1][0], "in_flight", "in_flight_records_limit", 1, "bound: limit / (2 x 1 ms)"),
        (axes[1][1], "buffer", "buffer_size", threads, f"bound: {threads} threads x size / (2 x 1 ms)"),
    ):  # fmt: skip
        pts = [(r[column], r["best_rps"]) for r in sweeps[group]]
        h.points(ax, pts, color="#4c72b0", label="measured")
        if pts:
            xs = [x for x, _ in pts]
            ax.plot(
                xs,
                [per * x / (2 * ROW_MS / 1000) for x in xs],
                linestyle=":",
                color="gray",
                label=bound,
            )
            ys = [y for _, y in pts] + ([mem["best_rps"]] if mem else [])
            ax.set_ylim(min(ys) / 2, max(ys) * 2)
        ax.set_xscale("log")
        ax.set_xlabel(column)
        ax.set_title(f"async, 1 ms: throughput vs {column}", fontsize=10)
    for ax in axes[0][1], axes[1][0], axes[1][1]:
        if mem:
            ax.axhline(
                mem["best_rps"],
                color="gray",
                linestyle="--",
                linewidth=1,
                label="async MemoryBackend",
            )
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes.flat:
        ax.set_yscale("log")
        ax.set_ylabel("records/s (best, log)")
        ax.grid(which="both", alpha=0.3)
    p, m = report["params"], report["machine"]
    fig.suptitle(f"aec keyed counter on remote state: {p['records']:,} records, {p['keys']:,} keys, best of "
                 f"{p['repeats']} (Python {m['python']}, {m['cpu_count']} CPUs)", fontsize=11)  # fmt: skip
    h.save(fig, path, dpi=110)
