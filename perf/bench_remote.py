"""Remote-state benchmark: sync vs async on slow state backends (issue 4, section 3).

Workload: the keyed counter (one read ``async_value()``, one write ``async_update(n + 1)``,
one output per record, callback style), ``--records`` records over ``--keys`` int keys
(uniform, seeded), run by ``run_keyed`` on each backend. The main table (Flink's FLIP-423
table, on our engine):

====  =======  ======================================================================
row   mode     backend
====  =======  ======================================================================
1     sync     RocksDBBackend, local
2     sync     LatencyBackend(RocksDB, 1 ms)
3     async    LatencyBackend(RocksDB, 1 ms), no cache
4     async    CachedBackend(LatencyBackend(RocksDB, 1 ms)) holding every key (warmed)
4c    async    the same cache, cold (starts empty; its hit rate is reported)
5     sync     SlateDBBackend on a local object store (``file://`` in a temp dir)
5     async    the same
6     sync     RedisBackend on loopback (a private redis-server started for the run)
6     async    the same
ref   async    MemoryBackend (the "latency hidden" reference) and RocksDB local
====  =======  ======================================================================

Synchronous rows on slow backends pay every round trip in turn (1 ms per request, two
requests per record: 100,000 records would take over 200 s), so rows 2, 5 sync and 6 sync
run the first ``--sync-records`` records of the same source. Every figure is records/s, so
rows with different record counts compare directly; the table says how many records each
row timed.

Sweeps (LatencyBackend over RocksDB): latency 0.1 / 0.5 / 1 / 5 ms, sync and async (sync
on at most ``--sync-records`` records, fewer at 5 ms so a run stays near 5 s);
``in_flight_records_limit`` 10 / 100 / 1000 / 6000 and ``buffer_size`` 1 / 10 / 100 / 1000
at 1 ms. A sweep point whose throughput is bounded by the round trip (a small in-flight
limit or buffer) times fewer records: about 2.5 s worth at that bound. The 1 ms points of
the sweeps are rows 2 and 3.

Async rows use ``AecConfig(in_flight_records_limit=6000, buffer_size=1000,
executor_threads=--threads)`` (Flink's defaults; 4 I/O threads), ``LatencyBackend`` has
``max_concurrency=None`` (the I/O threads are the only limit), the cache holds
``--keys`` entries, Redis transactions are on (one MULTI/EXEC pipeline per batch).

Method: every variant runs once per round, ``--repeats`` rounds, the variant order rotated
per round so machine noise hits all alike; each figure is the best of the rounds (median and
all samples in the JSON; also records per process CPU-second). The clock covers
``run_keyed`` (operator open, all records, the end-of-input flush, which includes the
cache's write-back and SlateDB's WAL flush); backend creation, the cache warm-up pass and the
final-state check are outside it. Every run's final state is checked against the expected
per-key counts. Goals are ratios of best-of figures from this one run.

Goals: row 3 >= 50x row 2; row 3 >= 0.5x async MemoryBackend; row 4 >= row 1; SlateDB async
>= 10x SlateDB sync; Redis async >= 10x Redis sync. When a goal is missed the async row
concerned is profiled once (cProfile in every thread) and the top 15 functions by tottime go
to ``bench_remote_profile.txt``.

Usage::

    .venv/bin/python perf/bench_remote.py               # full run (~5 min), perf/results/
    .venv/bin/python perf/bench_remote.py --quick       # smoke run (~30 s), temp dir
    .venv/bin/python perf/bench_remote.py --records 50000 --sync-records 1000 --repeats 2

Outputs (in ``--out``): bench_remote.json, bench_remote.md, bench_remote.png and, when a
goal is missed, bench_remote_profile.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import io
import json
import os
import platform
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter as Tally
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aec import AecConfig, Record, run_keyed
from backends import CachedBackend, LatencyBackend, MemoryBackend, RedisBackend, RocksDBBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import Counter, git_commit  # noqa: E402  (shared with bench_core)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "perf" / "results"
DEFAULTS = {"records": 100_000, "keys": 20_000, "sync_records": 2_000, "repeats": 4}
QUICK = {"records": 10_000, "keys": 2_000, "sync_records": 300, "repeats": 1}
IN_FLIGHT = 6000  # Flink's default in-flight-records-limit
BUFFER = 1000  # Flink's default buffer-size
ROW_LATENCY_MS = 1.0
SYNC_TARGET_S = 5.0  # a sync latency-sweep run times at most about this long
BOUND_TARGET_S = 2.5  # a round-trip-bound sweep point times about this long
PROFILE_RECORDS = 50_000  # records of a profiled run (cProfile slows everything 2-4x)
GOAL_VS_SYNC_LATENCY = 50.0
GOAL_VS_MEMORY = 0.5
GOAL_CACHE_VS_LOCAL = 1.0
GOAL_REAL_REMOTE = 10.0
FLINK = {  # FLIP-423's measurements, records/s, for context
    "1": 17_100,
    "2": 850,
    "3": 7_000,
    "4": 42_700,
}


# --- the keyed functions --------------------------------------------------------------------


class Loader(Counter):
    """Cache warm-up: one read of the key, nothing written."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.count.async_value()


# --- variants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str  # stable id, used in the JSON
    label: str
    backend: str  # memory, rocksdb, latency, cached, cached-cold, slatedb, redis
    async_state: bool
    row: str = ""  # the main table's row ("" for sweep-only points)
    latency_ms: float = 0.0  # latency / cached
    in_flight: int = IN_FLIGHT
    buffer_size: int = BUFFER
    records: int = 0  # records timed (set by build_variants)
    groups: tuple[str, ...] = ()  # main, latency, in_flight, buffer

    def config(self, threads: int) -> AecConfig:
        if not self.async_state:
            return AecConfig(async_state=False)
        return AecConfig(
            in_flight_records_limit=self.in_flight,
            buffer_size=self.buffer_size,
            executor_threads=threads,
        )

    @property
    def mode(self) -> str:
        return "async" if self.async_state else "sync"


def fmt_ms(ms: float) -> str:
    return f"{ms:g} ms"


def build_variants(args: argparse.Namespace) -> list[Variant]:
    """Every distinct run of one round; sweep points equal to a row are that row."""
    full, sync_n = args.records, min(args.sync_records, args.records)
    one = ROW_LATENCY_MS
    lat1 = f"LatencyBackend(RocksDB, {fmt_ms(one)})"
    rows = [
        Variant("r1-rocksdb-sync", "sync RocksDB local", "rocksdb", False, "1", records=full),
        Variant("r2-latency-sync", f"sync {lat1}", "latency", False, "2", one, records=sync_n),
        Variant("r3-latency-async", f"async {lat1}", "latency", True, "3", one, records=full),
        Variant(
            "r4-cached-async", f"async CachedBackend({lat1}), warm", "cached", True, "4", one,
            records=full,
        ),
        Variant(
            "r4c-cached-cold-async", f"async CachedBackend({lat1}), cold", "cached-cold", True,
            "4c", one, records=full,
        ),
        Variant("r5-slatedb-sync", "sync SlateDB, local object store", "slatedb", False, "5",
                records=sync_n),
        Variant("r5-slatedb-async", "async SlateDB, local object store", "slatedb", True, "5",
                records=full),
        Variant("r6-redis-sync", "sync Redis, loopback", "redis", False, "6", records=sync_n),
        Variant("r6-redis-async", "async Redis, loopback", "redis", True, "6", records=full),
        Variant("ref-memory-async", "async MemoryBackend", "memory", True, "ref", records=full),
        Variant("ref-rocksdb-async", "async RocksDB local", "rocksdb", True, "ref", records=full),
    ]  # fmt: skip
    rows = [replace_groups(v, ("main",)) for v in rows]
    by_name = {v.name: v for v in rows}

    def add(variant: Variant, group: str) -> None:
        twin = next(
            (
                v
                for v in by_name.values()
                if (v.backend, v.async_state, v.latency_ms, v.in_flight, v.buffer_size)
                == (
                    variant.backend,
                    variant.async_state,
                    variant.latency_ms,
                    variant.in_flight,
                    variant.buffer_size,
                )
            ),
            None,
        )
        if twin is not None:
            by_name[twin.name] = replace_groups(twin, twin.groups + (group,))
        else:
            by_name[variant.name] = replace_groups(variant, (group,))

    for ms in args.latencies:
        seconds = ms / 1000
        n_sync = min(sync_n, max(50, int(SYNC_TARGET_S / (2 * seconds))))
        add(Variant(f"lat-{ms:g}ms-sync", f"sync latency {fmt_ms(ms)}", "latency", False,
                    latency_ms=ms, records=n_sync), "latency")  # fmt: skip
        add(Variant(f"lat-{ms:g}ms-async", f"async latency {fmt_ms(ms)}", "latency", True,
                    latency_ms=ms, records=full), "latency")  # fmt: skip
    seconds = one / 1000
    for limit in args.in_flight:
        bound = limit / (2 * seconds)  # records/s with `limit` records each 2 round trips
        n = min(full, max(sync_n, int(bound * BOUND_TARGET_S)))
        add(Variant(f"inflight-{limit}", f"async in-flight {limit}", "latency", True,
                    latency_ms=one, in_flight=limit, records=n), "in_flight")  # fmt: skip
    for size in args.buffer_sizes:
        bound = args.threads * size / (2 * seconds)  # threads batches of `size` per round trip
        n = min(full, max(sync_n, int(bound * BOUND_TARGET_S)))
        add(Variant(f"buffer-{size}", f"async buffer {size}", "latency", True,
                    latency_ms=one, buffer_size=size, records=n), "buffer")  # fmt: skip
    variants = list(by_name.values())
    if args.only:
        variants = [v for v in variants if any(part in v.name for part in args.only)]
    return variants


def replace_groups(variant: Variant, groups: tuple[str, ...]) -> Variant:
    return replace(variant, groups=groups)


# --- running --------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float  # wall clock
    cpu_seconds: float  # process CPU time, all threads
    records: int
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_rps(self) -> float:
        return self.records / self.cpu_seconds if self.cpu_seconds > 0 else float("inf")


class Env:
    """What runs share: the temp root, the Redis server, a run counter."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="aec-bench-remote-")
        self.redis_url: str | None = None
        self.runs = 0

    def path(self, kind: str) -> str:
        self.runs += 1
        return os.path.join(self.tmp, f"{kind}-{self.runs}")


def make_backend(variant: Variant, env: Env) -> tuple[Any, Any]:
    """(backend, its cleanup); the backend is not opened yet."""
    args = env.args
    kind = variant.backend
    latency = variant.latency_ms / 1000
    if kind == "memory":
        return MemoryBackend(), None
    if kind == "rocksdb":
        path = env.path("rocksdb")
        return RocksDBBackend(path), lambda: shutil.rmtree(path, ignore_errors=True)
    if kind in ("latency", "cached", "cached-cold"):
        path = env.path("rocksdb")
        backend: Any = LatencyBackend(RocksDBBackend(path), latency, seed=args.seed)
        if kind != "latency":
            backend = CachedBackend(backend, capacity_entries=args.keys)
        return backend, lambda: shutil.rmtree(path, ignore_errors=True)
    if kind == "slatedb":
        from backends import SlateDBBackend

        path = env.path("slatedb")
        return SlateDBBackend(f"file://{path}", "aec"), lambda: shutil.rmtree(
            path, ignore_errors=True
        )
    if kind == "redis":
        if env.redis_url is None:
            raise RuntimeError("no redis-server for the Redis rows")
        env.runs += 1
        backend = RedisBackend(
            env.redis_url, prefix=f"bench{env.runs}", max_connections=max(8, args.threads)
        )
        return backend, backend.clear
    raise ValueError(kind)


def run_variant(
    variant: Variant,
    source: list[Record],
    expected: dict[Any, int],
    env: Env,
    profiler: ThreadProfiler | None = None,
) -> Sample:
    """One timed run of ``variant`` over ``source``; checks the final state afterwards."""
    args = env.args
    backend, cleanup = make_backend(variant, env)
    config = variant.config(args.threads)
    try:
        hits = misses = 0
        if variant.backend == "cached":  # warm: one read of every key, outside the clock
            backend.open()
            warm = [Record(k, None) for k in range(args.keys)]
            run_keyed(warm, Loader(), backend, config)
            hits, misses = backend.hits, backend.misses
        gc.collect()
        if profiler is not None:
            profiler.install()  # before open: SlateDB starts its loop thread there
        backend.open()  # DB creation stays outside the clock; run_keyed's open is a no-op
        cpu, start = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.main.enable()
        try:
            result = run_keyed(source, Counter(), backend, config)
        finally:
            if profiler is not None:
                profiler.main.disable()
                profiler.uninstall()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        metrics = {
            k: result.metrics.get(k)
            for k in (
                "batches",
                "requests",
                "mean_batch_size",
                "max_batch_size",
                "max_in_flight",
                "blocked_requests",
            )
        }
        del result
        if isinstance(backend, CachedBackend):
            h, m = backend.hits - hits, backend.misses - misses
            metrics.update(
                cache_hits=h, cache_misses=m, hit_rate=h / (h + m) if h + m else 0.0,
                cache_fetches=backend.fetches, cache_evictions=backend.evictions,
            )  # fmt: skip
        state = backend.state_items("count")
        if state != expected:
            wrong = sum(1 for k, n in expected.items() if state.get(k) != n)
            raise AssertionError(
                f"{variant.label}: final state wrong for {wrong} of {len(expected)} keys"
            )
    finally:
        try:
            if cleanup is not None and variant.backend == "redis":
                cleanup()  # delete the run's keys while the connection is open
        finally:
            backend.close()
            if cleanup is not None and variant.backend != "redis":
                cleanup()
    return Sample(seconds, cpu, len(source), metrics)


# --- profiling ------------------------------------------------------------------------------

# Functions where a thread waits rather than works (their tottime is idle time).
WAITS = (
    "acquire' of '_thread.lock",
    "acquire' of '_thread.RLock",
    "get' of '_queue.SimpleQueue",
    "wait' of '_thread.lock",
    "poll' of 'select.epoll",
    "select' of 'select",
    "built-in method time.sleep",
)


class ThreadProfiler:
    """cProfile in the calling thread and in every thread started while installed."""

    def __init__(self) -> None:
        self.main = cProfile.Profile()
        self.threads: list[tuple[str, cProfile.Profile]] = []
        self._lock = threading.Lock()

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        profile = cProfile.Profile()
        with self._lock:
            self.threads.append((threading.current_thread().name, profile))
        profile.enable()  # replaces this hook in this thread

    def install(self) -> None:
        threading.setprofile(self._hook)

    def uninstall(self) -> None:
        threading.setprofile(None)

    def stats(self, group: str | None = None) -> pstats.Stats | None:
        """Merged stats of one thread group (None: every thread)."""
        profiles = [p for name, p in self.profiles() if group is None or name == group]
        stats = None
        for profile in profiles:
            one = pstats.Stats(profile)
            if not one.stats:  # type: ignore[attr-defined]
                continue
            if stats is None:
                stats = one
            else:
                stats.add(one)
        return stats

    def profiles(self) -> list[tuple[str, cProfile.Profile]]:
        """``(thread group, profile)``: "mailbox" for the calling thread, else the thread
        name without its number (``aec-io``, ``aec-slatedb-loop``)."""
        rows = [("mailbox", self.main)]
        for name, profile in self.threads:
            head, _, tail = name.rpartition("_")
            rows.append((head if tail.isdigit() else name, profile))
        return rows


def top_text(stats: pstats.Stats, title: str, wall: float, limit: int = 15) -> str:
    """Top ``limit`` functions by tottime, wait functions left out (and summed in the title)."""
    table = stats.stats  # type: ignore[attr-defined]
    waits = {func: row for func, row in table.items() if any(w in func[2] for w in WAITS)}
    total = sum(row[2] for row in table.values())
    waited = sum(row[2] for row in waits.values())
    for func in waits:
        del table[func]
    out = io.StringIO()
    out.write(
        f"-- {title}: {total:.2f} s of tottime in {wall:.2f} s wall; {waited:.2f} s of it waiting "
        f"({', '.join(f'{func[2]} {row[2]:.2f} s' for func, row in waits.items()) or 'none'}), "
        f"left out below --\n"
    )
    stats.stream = out  # type: ignore[attr-defined]
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def profile_variant(
    variant: Variant, source: list[Record], expected: dict[Any, int], env: Env
) -> str:
    profiler = ThreadProfiler()
    sample = run_variant(variant, source, expected, env, profiler)
    groups = list(dict.fromkeys(name for name, _ in profiler.profiles()))
    counts = Tally(name for name, _ in profiler.profiles())
    text = [
        f"== {variant.label} (row {variant.row or '-'}): {sample.records:,} records, "
        f"{sample.seconds:.2f} s wall under cProfile ({sample.rps:,.0f} records/s), process "
        f"CPU {sample.cpu_seconds:.2f} s ({sample.cpu_seconds / sample.seconds:.2f} cores "
        f"busy); threads: {', '.join(f'{g} x{counts[g]}' for g in groups)} ==",
        "In a thread, the tottime of a C call that releases the GIL (socket send/recv, a "
        "Rocksdict multi-get) includes the wait to get the GIL back.",
        "",
    ]
    for group in [None, *groups]:
        stats = profiler.stats(group)
        if stats is not None:
            title = "all threads" if group is None else f"{group} thread(s)"
            text.append(top_text(stats, title, sample.seconds))
    return "\n".join(text) + "\n"


# --- machine --------------------------------------------------------------------------------


def machine_facts(redis_version: str | None) -> dict[str, Any]:
    from importlib import metadata

    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "redis_server": redis_version,
    }
    for package in ("rocksdict", "slatedb", "redis"):
        try:
            facts[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            facts[package] = None
    facts["git_commit"] = git_commit()
    return facts


def redis_server_version() -> str | None:
    binary = os.environ.get("AEC_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip() or None)


# --- reporting ------------------------------------------------------------------------------


def fmt_rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate:,.0f}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def aggregate(variants: list[Variant], samples: dict[str, list[Sample]]) -> dict[str, Any]:
    results = {}
    for v in variants:
        runs = samples[v.name]
        if not runs:
            continue
        rates = [s.rps for s in runs]
        best = max(range(len(runs)), key=lambda i: rates[i])
        results[v.name] = {
            "name": v.name,
            "label": v.label,
            "row": v.row,
            "mode": v.mode,
            "backend": v.backend,
            "latency_ms": v.latency_ms,
            "in_flight_records_limit": v.in_flight if v.async_state else None,
            "buffer_size": v.buffer_size if v.async_state else None,
            "records": v.records,
            "groups": list(v.groups),
            "rps_samples": [round(r, 1) for r in rates],
            "best_rps": rates[best],
            "median_rps": statistics.median(rates),
            "cpu_rps": max(s.cpu_rps for s in runs),
            "cores_busy": runs[best].cpu_seconds / runs[best].seconds,
            "metrics": runs[best].metrics,
        }
    return results


def paired(samples: dict[str, list[Sample]], a: str, b: str) -> list[float]:
    """Per-round ratios a/b (the two ran in the same round)."""
    return [x.rps / y.rps for x, y in zip(samples.get(a, []), samples.get(b, []), strict=False)]


GOALS = [
    # (id, numerator, denominator, at least, text, variant to profile when missed,
    #  both rows CPU-bound: records per CPU-second is a fair second opinion)
    ("row3_vs_row2", "r3-latency-async", "r2-latency-sync", GOAL_VS_SYNC_LATENCY,
     "row 3 (async, 1 ms) >= 50x row 2 (sync, 1 ms)", "r3-latency-async", False),
    ("row3_vs_memory", "r3-latency-async", "ref-memory-async", GOAL_VS_MEMORY,
     "row 3 (async, 1 ms) >= 0.5x async MemoryBackend (latency hidden)", "r3-latency-async",
     True),
    ("row4_vs_row1", "r4-cached-async", "r1-rocksdb-sync", GOAL_CACHE_VS_LOCAL,
     "row 4 (async, warm cache over 1 ms) >= row 1 (sync RocksDB local)", "r4-cached-async",
     True),
    ("slatedb_async_vs_sync", "r5-slatedb-async", "r5-slatedb-sync", GOAL_REAL_REMOTE,
     "SlateDB async >= 10x SlateDB sync", "r5-slatedb-async", False),
    ("redis_async_vs_sync", "r6-redis-async", "r6-redis-sync", GOAL_REAL_REMOTE,
     "Redis async >= 10x Redis sync", "r6-redis-async", False),
]  # fmt: skip


def judge(results: dict[str, Any], samples: dict[str, list[Sample]]) -> dict[str, Any]:
    goals = {}
    for gid, num, den, at_least, text, _, cpu_bound in GOALS:
        if num not in results or den not in results:
            goals[gid] = {"text": text, "met": None, "measured": "not measured"}
            continue
        ratio = results[num]["best_rps"] / results[den]["best_rps"]
        rounds = paired(samples, num, den)
        cpu_ratio = results[num]["cpu_rps"] / results[den]["cpu_rps"] if cpu_bound else None
        goals[gid] = {
            "text": text,
            "numerator": num,
            "denominator": den,
            "at_least": at_least,
            "ratio": ratio,
            "per_round_ratios": [round(r, 3) for r in rounds],
            "met": ratio >= at_least,
            "cpu_ratio": cpu_ratio,
            "measured": (
                f"{fmt_rate(results[num]['best_rps'])} / {fmt_rate(results[den]['best_rps'])} "
                f"records/s = {fmt_ratio(ratio)}"
                + (
                    f" (per round {min(rounds):.2f}x..{max(rounds):.2f}x)"
                    if len(rounds) > 1
                    else ""
                )
                + (
                    f"; per CPU-second {fmt_ratio(cpu_ratio)}"
                    f" ({'met' if cpu_ratio >= at_least else 'missed'} that way)"
                    if cpu_ratio is not None
                    else ""
                )
            ),
        }
    return goals


def verdict(goal: dict[str, Any]) -> str:
    return "n/a" if goal["met"] is None else "PASS" if goal["met"] else "MISS"


TWINS = {  # async row -> its sync twin (for the speed-up column)
    "r3-latency-async": "r2-latency-sync",
    "r4-cached-async": "r2-latency-sync",
    "r4c-cached-cold-async": "r2-latency-sync",
    "r5-slatedb-async": "r5-slatedb-sync",
    "r6-redis-async": "r6-redis-sync",
    "ref-rocksdb-async": "r1-rocksdb-sync",
}


EXTRAS = [
    # (id, numerator, denominator, what it shows)
    ("latency_hidden", "r3-latency-async", "ref-rocksdb-async",
     "latency hidden: row 3 / async RocksDB local (the same store without the 1 ms)"),
    ("rocksdb_cost", "ref-rocksdb-async", "ref-memory-async",
     "the store's CPU cost: async RocksDB local / async MemoryBackend"),
    ("warm_vs_cold", "r4-cached-async", "r4c-cached-cold-async",
     "warm cache / cold cache (row 4 / row 4c)"),
    ("cache_vs_no_cache", "r4-cached-async", "r3-latency-async",
     "warm cache / no cache (row 4 / row 3)"),
    ("in_flight_1000_vs_6000", "inflight-1000", "r3-latency-async",
     "in-flight limit 1000 / 6000 (async, 1 ms)"),
]  # fmt: skip


def extra_ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Ratios that explain the goals (best-of figures; per CPU-second alongside)."""
    extras = {}
    for eid, num, den, text in EXTRAS:
        if num in results and den in results:
            extras[eid] = {
                "text": text,
                "ratio": results[num]["best_rps"] / results[den]["best_rps"],
                "cpu_ratio": results[num]["cpu_rps"] / results[den]["cpu_rps"],
            }
    return extras


def main_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    row1 = results.get("r1-rocksdb-sync", {}).get("best_rps")
    table = []
    for r in results.values():
        if "main" not in r["groups"]:
            continue
        twin = results.get(TWINS.get(r["name"], ""))
        table.append(
            {
                **r,
                "vs_row1": r["best_rps"] / row1 if row1 else None,
                "vs_sync": r["best_rps"] / twin["best_rps"] if twin else None,
                "sync_twin": twin["name"] if twin else None,
            }
        )
    return table


def sweep_table(results: dict[str, Any], group: str) -> list[dict[str, Any]]:
    rows = [r for r in results.values() if group in r["groups"]]
    key = {
        "latency": lambda r: (r["latency_ms"], r["mode"]),
        "in_flight": lambda r: r["in_flight_records_limit"],
        "buffer": lambda r: r["buffer_size"],
    }[group]
    return sorted(rows, key=key)


def markdown(report: dict[str, Any]) -> str:
    p, m = report["params"], report["machine"]
    lines = [
        "# bench_remote: the keyed counter on remote state, sync vs async",
        "",
        f"{p['records']:,} records over {p['keys']:,} keys (uniform, seed {p['seed']}); sync "
        f"rows on slow backends time the first {p['sync_records']:,} records; best of "
        f"{p['repeats']} interleaved rounds. {report['date']}, Python {m['python']}, "
        f"{m['cpu_count']} CPUs (load average at start {fmt_load(m['load_average'])}), "
        f"commit {m['git_commit']}, redis-server {m['redis_server']}, slatedb {m['slatedb']}.",
        "",
        f"Async rows: `AecConfig(in_flight_records_limit={IN_FLIGHT}, buffer_size={BUFFER}, "
        f"executor_threads={p['threads']})`; LatencyBackend `max_concurrency=None`; "
        f"CachedBackend `capacity_entries={p['keys']:,}`. Row 4 is warmed (one read of every "
        "key, outside the clock: every key's state is in the cache when the clock starts); "
        "row 4c starts cold. Figures are records/s, so rows timed on different record counts "
        "compare directly. *cores busy* = process CPU time / wall time of the best run (all "
        "threads; 2 would be both cores): async rows are held near 1 by the GIL, sync rows on "
        "slow backends sit idle waiting, and a single-threaded CPU-bound row below 1 lost CPU "
        "to other load on the machine. The Flink column is FLIP-423's table for comparison "
        "only (Flink on its own hardware; its rows 2 and 3 ran on HDFS, not a modelled 1 ms).",
        "",
        "| row | mode | backend | records timed | records/s (best) | records/s (median) |"
        " vs row 1 | async / sync | cores busy | batches | mean batch | cache hit rate |"
        " Flink (FLIP-423) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["main_table"]:
        mt = r["metrics"]
        batch = (
            f"{mt['batches']:,} | {mt['mean_batch_size']:.0f}" if r["mode"] == "async" else " | "
        )
        hit = f"{mt['hit_rate']:.1%}" if "hit_rate" in mt else ""
        flink = FLINK.get(r["row"]) if r["row"] in ("1", "2", "3", "4") else None
        twin = f" (vs {r['sync_twin'].split('-')[0]})" if r["vs_sync"] is not None else ""
        lines.append(
            f"| {r['row']} | {r['mode']} | {r['label'].split(' ', 1)[1]} | {r['records']:,} | "
            f"{fmt_rate(r['best_rps'])} | {fmt_rate(r['median_rps'])} | {fmt_ratio(r['vs_row1'])} | "
            f"{fmt_ratio(r['vs_sync'])}{twin} | {r['cores_busy']:.2f} | {batch} | {hit} | "
            f"{fmt_rate(flink) + ' /s' if flink else ''} |"
        )
    lines += ["", "## Goals (ratios of best-of figures from this run)", ""]
    for goal in report["goals"].values():
        lines.append(f"- {goal['text']}: {goal['measured']} -> **{verdict(goal)}**")
    if report.get("profile"):
        lines += ["", f"A goal was missed: cProfile top functions in `{report['profile']}`."]
    extras = report.get("extra_ratios") or {}
    if extras:
        lines += [
            "",
            "Ratios that explain them (best-of records/s; per CPU-second in brackets):",
            "",
        ]
        for extra in extras.values():
            lines.append(
                f"- {extra['text']}: {fmt_ratio(extra['ratio'])} ({fmt_ratio(extra['cpu_ratio'])})"
            )
    sweeps = report["sweeps"]
    if sweeps["latency"]:
        lines += [
            "",
            "## Sweep: round-trip latency (LatencyBackend over RocksDB)",
            "",
            "| latency | sync records timed | sync records/s | async records/s | async / sync |",
            "|---:|---:|---:|---:|---:|",
        ]
        by_ms: dict[float, dict[str, Any]] = {}
        for r in sweeps["latency"]:
            by_ms.setdefault(r["latency_ms"], {})[r["mode"]] = r
        for ms, pair in sorted(by_ms.items()):
            s, a = pair.get("sync"), pair.get("async")
            lines.append(
                f"| {fmt_ms(ms)} | {s['records'] if s else 0:,} | "
                f"{fmt_rate(s['best_rps']) if s else ''} | {fmt_rate(a['best_rps']) if a else ''} | "
                f"{fmt_ratio(a['best_rps'] / s['best_rps']) if s and a else ''} |"
            )
    for group, title, column in (
        ("in_flight", "in_flight_records_limit", "in_flight_records_limit"),
        ("buffer", "buffer_size", "buffer_size"),
    ):
        if not sweeps[group]:
            continue
        lines += [
            "",
            f"## Sweep: `{title}` (async, 1 ms, other options at their defaults)",
            "",
            f"| {title} | records timed | records/s (best) | batches | mean batch |"
            " max in flight |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sweeps[group]:
            mt = r["metrics"]
            lines.append(
                f"| {r[column]:,} | {r['records']:,} | {fmt_rate(r['best_rps'])} | "
                f"{mt['batches']:,} | {mt['mean_batch_size']:.0f} | {mt['max_in_flight']:,} |"
            )
    lines += [
        "",
        "Reproduce: `.venv/bin/python perf/bench_remote.py` (all figures, samples and engine "
        "metrics in `bench_remote.json`; plots in `bench_remote.png`).",
    ]
    return "\n".join(lines) + "\n"


def fmt_load(load: Any) -> str:
    return "n/a" if not load else ", ".join(f"{x:.1f}" for x in load)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    ax = axes[0][0]
    table = report["main_table"]
    labels = [f"{r['row']} {r['mode']}\n{short(r)}" for r in table]
    ys = [r["best_rps"] for r in table]
    colors = ["#dd8452" if r["mode"] == "sync" else "#4c72b0" for r in table]
    bars = ax.bar(range(len(ys)), ys, color=colors)
    for bar, y in zip(bars, ys, strict=True):
        ax.annotate(
            f"{y / 1000:.1f}k" if y < 10_000 else f"{y / 1000:.0f}k",
            (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=7,
            xytext=(0, 2), textcoords="offset points",
        )  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(range(len(ys)))
    ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("records/s (best, log)")
    ax.set_title("the table (orange: sync, blue: async)", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)

    sweeps = report["sweeps"]
    ax = axes[0][1]
    for mode, color in (("sync", "#dd8452"), ("async", "#4c72b0")):
        pts = sorted(
            (r["latency_ms"], r["best_rps"]) for r in sweeps["latency"] if r["mode"] == mode
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", color=color, label=mode)
            for x, y in pts:
                ax.annotate(f"{y:,.0f}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    sync_ms = sorted(r["latency_ms"] for r in sweeps["latency"] if r["mode"] == "sync")
    if sync_ms:
        ax.plot(sync_ms, [1000 / (2 * ms) for ms in sync_ms], linestyle=":", color="#dd8452",
                label="sync bound: 1 / (2 x latency)")  # fmt: skip
    mem = report["results"].get("ref-memory-async")
    if mem:
        ax.axhline(mem["best_rps"], color="gray", linestyle="--", linewidth=1)
        ax.annotate("async MemoryBackend", (0.1, mem["best_rps"]), fontsize=7, color="gray",
                    va="bottom")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("round-trip latency per batch (ms)")
    ax.set_ylabel("records/s (best, log)")
    ax.set_title("throughput vs latency (LatencyBackend over RocksDB)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(which="both", alpha=0.3)

    p = report["params"]
    bound_label = {
        "in_flight": "bound: limit / (2 x 1 ms)",
        "buffer": f"bound: {p['threads']} threads x size / (2 x 1 ms)",
    }
    for ax, group, column, xlabel in (
        (axes[1][0], "in_flight", "in_flight_records_limit", "in_flight_records_limit"),
        (axes[1][1], "buffer", "buffer_size", "buffer_size"),
    ):
        pts = [(r[column], r["best_rps"]) for r in sweeps[group]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", color="#4c72b0", label="measured")
            for x, y in pts:
                ax.annotate(f"{y:,.0f}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
            # the round-trip bound: every record needs 2 round trips of 1 ms, one after the other
            per = 1 if group == "in_flight" else p["threads"]
            xs = [x for x, _ in pts]
            ax.plot(xs, [per * x / (2 * ROW_LATENCY_MS / 1000) for x in xs], linestyle=":",
                    color="gray", label=bound_label[group])  # fmt: skip
            if mem:
                ax.axhline(mem["best_rps"], color="gray", linestyle="--", linewidth=1,
                           label="async MemoryBackend")  # fmt: skip
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xscale("log")
        ax.set_yscale("log")
        if pts:
            ys = [y for _, y in pts] + ([mem["best_rps"]] if mem else [])
            ax.set_ylim(min(ys) / 2, max(ys) * 2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("records/s (best, log)")
        ax.set_title(f"async, 1 ms: throughput vs {xlabel}", fontsize=10)
        ax.grid(which="both", alpha=0.3)
    p, m = report["params"], report["machine"]
    fig.suptitle(
        f"aec keyed counter on remote state: {p['records']:,} records, {p['keys']:,} keys, "
        f"best of {p['repeats']} (Python {m['python']}, {m['cpu_count']} CPUs)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def short(r: dict[str, Any]) -> str:
    return {
        "memory": "memory",
        "rocksdb": "RocksDB",
        "latency": "1 ms",
        "cached": "cache warm",
        "cached-cold": "cache cold",
        "slatedb": "SlateDB",
        "redis": "Redis",
    }[r["backend"]]


# --- main -----------------------------------------------------------------------------------


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, help="records of an async run (default 100,000)")
    parser.add_argument("--keys", type=int, help="distinct keys (default 20,000)")
    parser.add_argument(
        "--sync-records", type=int,
        help="records of a sync run on a slow backend (default 2,000)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--quick", action="store_true",
        help="smoke run: 10,000 records, 2,000 keys, 300 sync records, 1 round, temp dir",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=4, help="executor_threads (default 4)")
    parser.add_argument("--latencies", type=floats, default=[0.1, 0.5, 1.0, 5.0],
                        help="latency sweep, ms (default 0.1,0.5,1,5)")  # fmt: skip
    parser.add_argument("--in-flight", type=ints, default=[10, 100, 1000, 6000],
                        help="in-flight limit sweep (default 10,100,1000,6000)")  # fmt: skip
    parser.add_argument("--buffer-sizes", type=ints, default=[1, 10, 100, 1000],
                        help="buffer size sweep (default 1,10,100,1000)")  # fmt: skip
    parser.add_argument(
        "--only", type=lambda s: [x for x in s.split(",") if x],
        help="run only variants whose name contains one of these (exploration)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, help="output directory (default perf/results)")
    parser.add_argument(
        "--from-json", type=Path, metavar="JSON",
        help="run nothing: rewrite the Markdown and PNG (into --out) from a bench_remote.json",
    )  # fmt: skip
    parser.add_argument(
        "--no-profile", action="store_true", help="skip the cProfile run when a goal is missed"
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.records, args.keys, args.sync_records, args.repeats, args.threads) < 1:
        parser.error("--records, --keys, --sync-records, --repeats and --threads must be >= 1")
    if args.out is None:
        args.out = (
            Path(tempfile.mkdtemp(prefix="bench_remote_quick_")) if args.quick else DEFAULT_OUT
        )
    return args


def render(path: Path, out: Path) -> int:
    """Rewrite bench_remote.md and .png (and the JSON's derived ratios) from a JSON report."""
    report = json.loads(path.read_text())
    report["extra_ratios"] = extra_ratios(report["results"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_remote.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "bench_remote.md").write_text(markdown(report))
    plot(report, out / "bench_remote.png")
    print(f"rendered {out}/bench_remote.{{json,md,png}} from {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return render(args.from_json, args.out)
    wall = time.perf_counter()
    machine = machine_facts(redis_server_version())  # now: the code this process imports
    rng = random.Random(args.seed)
    key_seq = [rng.randrange(args.keys) for _ in range(args.records)]
    source = [Record(key, i) for i, key in enumerate(key_seq)]
    variants = build_variants(args)
    expected: dict[int, dict[Any, int]] = {}
    for n in {v.records for v in variants}:
        expected[n] = dict(Tally(key_seq[:n]))
    print(
        f"{args.records:,} records over {args.keys:,} keys ({len(set(key_seq)):,} distinct); "
        f"{len(variants)} variants x {args.repeats} rounds, executor_threads={args.threads}",
        flush=True,
    )

    env = Env(args)
    server = None
    try:
        if any(v.backend == "redis" for v in variants):
            from backends import LocalRedisServer

            try:
                server = LocalRedisServer().start()
                env.redis_url = server.url
            except (OSError, RuntimeError) as exc:
                print(f"!! Redis rows SKIPPED: no redis-server ({exc})", flush=True)
                variants = [v for v in variants if v.backend != "redis"]
        if any(v.backend == "slatedb" for v in variants):
            try:
                from backends import SlateDBBackend  # noqa: F401
            except ImportError as exc:
                print(f"!! SlateDB rows SKIPPED: {exc}", flush=True)
                variants = [v for v in variants if v.backend != "slatedb"]

        # warm-up: imports, first DB creation, code paths (not recorded)
        warm_n = min(1000, args.records)
        seen = set()
        for v in variants:
            if v.backend in seen:
                continue
            seen.add(v.backend)
            run_variant(
                Variant(v.name, v.label, v.backend, True, latency_ms=v.latency_ms),
                source[:warm_n], dict(Tally(key_seq[:warm_n])), env,
            )  # fmt: skip

        samples: dict[str, list[Sample]] = {v.name: [] for v in variants}
        for rnd in range(args.repeats):
            shift = (rnd * len(variants)) // args.repeats
            order = variants[shift:] + variants[:shift]
            for v in order:
                sample = run_variant(v, source[: v.records], expected[v.records], env)
                samples[v.name].append(sample)
                extra = (
                    f", hit rate {sample.metrics['hit_rate']:.1%}"
                    if "hit_rate" in sample.metrics
                    else ""
                )
                print(
                    f"  round {rnd + 1}/{args.repeats} {v.name:<24} {v.records:>7,} rec "
                    f"{sample.seconds:>6.2f} s {sample.rps:>10,.0f} rec/s "
                    f"({sample.cpu_seconds / sample.seconds:.2f} cores){extra}",
                    flush=True,
                )

        results = aggregate(variants, samples)
        goals = judge(results, samples)
        report: dict[str, Any] = {
            "benchmark": "bench_remote",
            "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine,
            "params": {
                "records": args.records,
                "keys": args.keys,
                "sync_records": args.sync_records,
                "repeats": args.repeats,
                "threads": args.threads,
                "seed": args.seed,
                "quick": args.quick,
                "latencies_ms": args.latencies,
                "in_flight_sweep": args.in_flight,
                "buffer_sweep": args.buffer_sizes,
                "statistic": "best of repeats (median and samples also given)",
                "aec_config_async": f"AecConfig(in_flight_records_limit={IN_FLIGHT}, "
                f"buffer_size={BUFFER}, executor_threads={args.threads})",
                "aec_config_sync": "AecConfig(async_state=False)",
                "cache": "row 4 warm (one read of every key before the clock); row 4c cold",
            },
            "results": results,
            "main_table": main_table(results),
            "sweeps": {g: sweep_table(results, g) for g in ("latency", "in_flight", "buffer")},
            "goals": goals,
            "extra_ratios": extra_ratios(results),
            "profile": None,
        }

        # print
        print(
            f"\n{'row':<4} {'mode':<5} {'backend':<44} {'records':>8} {'best rec/s':>11} "
            f"{'median':>10} {'vs row 1':>9} {'async/sync':>10}"
        )
        for r in report["main_table"]:
            print(
                f"{r['row']:<4} {r['mode']:<5} {r['label'].split(' ', 1)[1]:<44} "
                f"{r['records']:>8,} {fmt_rate(r['best_rps']):>11} {fmt_rate(r['median_rps']):>10} "
                f"{fmt_ratio(r['vs_row1']):>9} {fmt_ratio(r['vs_sync']):>10}"
            )
        for group in ("latency", "in_flight", "buffer"):
            if report["sweeps"][group]:
                print(f"\nsweep {group}:")
            for r in report["sweeps"][group]:
                print(
                    f"  {r['label']:<28} {r['records']:>8,} rec {fmt_rate(r['best_rps']):>10} "
                    f"rec/s (mean batch {r['metrics']['mean_batch_size'] or 0:.0f})"
                )
        print()
        for goal in goals.values():
            print(f"{verdict(goal)}: {goal['text']}: {goal['measured']}")
        for extra in report["extra_ratios"].values():
            print(
                f"  {extra['text']}: {fmt_ratio(extra['ratio'])} "
                f"(per CPU-second {fmt_ratio(extra['cpu_ratio'])})"
            )

        # profile the async rows of missed goals
        args.out.mkdir(parents=True, exist_ok=True)
        profile_path = args.out / "bench_remote_profile.txt"
        missed = []
        for gid, *_rest, to_profile, _cpu in GOALS:
            if goals[gid]["met"] is False and to_profile not in missed:
                missed.append(to_profile)
        by_name = {v.name: v for v in variants}
        if missed and not args.no_profile:
            texts = [
                "cProfile of the async rows of missed goals, every thread (mailbox thread "
                "and I/O threads profiled separately, then merged); top 15 by tottime.\n"
            ]
            n = min(args.records, PROFILE_RECORDS)
            for name in missed:
                v = by_name[name]
                print(f"\nprofiling {name} on {n:,} records ...", flush=True)
                texts.append(profile_variant(v, source[:n], dict(Tally(key_seq[:n])), env))
            profile_path.write_text("\n".join(texts))
            report["profile"] = profile_path.name
            print(f"profile written to {profile_path}")
        elif profile_path.exists() and not missed:
            profile_path.unlink()  # stale: every goal is met now
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(env.tmp, ignore_errors=True)

    report["wall_seconds"] = round(time.perf_counter() - wall, 1)
    (args.out / "bench_remote.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "bench_remote.md").write_text(markdown(report))
    plot(report, args.out / "bench_remote.png")
    print(
        f"\nwrote {args.out}/bench_remote.{{json,md,png}} in {report['wall_seconds']:.0f} s total"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
