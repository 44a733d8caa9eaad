"""Remote-state benchmark: sync vs async on slow state backends.

Workload: the keyed counter of ``bench_core`` (one read, one write, one output per record,
callback style), ``--records`` records over ``--keys`` uniform int keys (seeded), run by
``run_keyed`` on each backend. The main table (FLIP-423's table, on our engine):

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

Sync rows on slow backends time the first ``--sync-records`` records (figures are
records/s, so rows compare directly); sweeps on LatencyBackend over RocksDB vary the latency
(0.1-5 ms, sync and async), ``in_flight_records_limit`` and ``buffer_size`` (at 1 ms).
Method, goals and outputs: ``perf/README.md``; the shared method is ``perf/harness.py``
(interleaved rounds, best of ``--repeats``, clock around ``run_keyed`` only, every run's
final state checked). A missed goal's async row is profiled into ``bench_remote_profile.txt``.

Usage::

    .venv/bin/python perf/bench_remote.py               # full run (~5 min), perf/results/
    .venv/bin/python perf/bench_remote.py --quick       # smoke run (~30 s), temp dir
    .venv/bin/python perf/bench_remote.py --only r2,r3 --out /tmp/r   # a subset
    .venv/bin/python perf/bench_remote.py --from-json perf/results/bench_remote.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter as Tally
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from bench_core import Counter  # noqa: E402
from bench_remote_report import (  # noqa: E402
    BUFFER,
    IN_FLIGHT,
    ROW_MS,
    extra_ratios,
    judge,
    main_table,
    markdown,
    plot,
    sweep_table,
)

from aec import AecConfig, Record, run_keyed  # noqa: E402
from backends import CachedBackend, LatencyBackend, MemoryBackend, RedisBackend, RocksDBBackend  # noqa: E402

DEFAULTS = {"records": 100_000, "keys": 20_000, "sync_records": 2_000, "repeats": 4, "threads": 4}
QUICK = {"records": 10_000, "keys": 2_000, "sync_records": 300, "repeats": 1, "threads": 4}
SYNC_TARGET_S = 5.0  # a sync latency-sweep run times at most about this long
BOUND_TARGET_S = 2.5  # a round-trip-bound sweep point times about this long
PROFILE_RECORDS = 50_000


class Loader(Counter):
    """Cache warm-up: one read of the key, nothing written."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.count.async_value()


@dataclass(frozen=True)
class Variant:
    name: str  # stable id, used in the JSON
    label: str
    backend: str  # memory, rocksdb, latency, cached, cached-cold, slatedb, redis
    async_state: bool
    row: str = ""  # the main table's row ("" for sweep-only points)
    latency_ms: float = 0.0
    in_flight: int = IN_FLIGHT
    buffer_size: int = BUFFER
    records: int = 0
    groups: tuple[str, ...] = ()  # main, latency, in_flight, buffer

    def config(self, threads: int) -> AecConfig:
        if not self.async_state:
            return AecConfig(async_state=False)
        return AecConfig(in_flight_records_limit=self.in_flight, buffer_size=self.buffer_size,
                         executor_threads=threads)  # fmt: skip

    @property
    def mode(self) -> str:
        return "async" if self.async_state else "sync"


def build_variants(args: argparse.Namespace) -> list[Variant]:
    """Every distinct run of one round; sweep points equal to a row are that row."""
    full, sync_n = args.records, min(args.sync_records, args.records)
    lat1 = f"LatencyBackend(RocksDB, {ROW_MS:g} ms)"
    rows = [
        Variant("r1-rocksdb-sync", "sync RocksDB local", "rocksdb", False, "1", records=full),
        Variant("r2-latency-sync", f"sync {lat1}", "latency", False, "2", ROW_MS, records=sync_n),
        Variant("r3-latency-async", f"async {lat1}", "latency", True, "3", ROW_MS, records=full),
        Variant("r4-cached-async", f"async CachedBackend({lat1}), warm", "cached", True, "4",
                ROW_MS, records=full),
        Variant("r4c-cached-cold-async", f"async CachedBackend({lat1}), cold", "cached-cold",
                True, "4c", ROW_MS, records=full),
        Variant("r5-slatedb-sync", "sync SlateDB, local object store", "slatedb", False, "5",
                records=sync_n),
        Variant("r5-slatedb-async", "async SlateDB, local object store", "slatedb", True, "5",
                records=full),
        Variant("r6-redis-sync", "sync Redis, loopback", "redis", False, "6", records=sync_n),
        Variant("r6-redis-async", "async Redis, loopback", "redis", True, "6", records=full),
        Variant("ref-memory-async", "async MemoryBackend", "memory", True, "ref", records=full),
        Variant("ref-rocksdb-async", "async RocksDB local", "rocksdb", True, "ref", records=full),
    ]  # fmt: skip
    by_name = {v.name: replace(v, groups=("main",)) for v in rows}

    def add(v: Variant, group: str) -> None:
        same = (v.backend, v.async_state, v.latency_ms, v.in_flight, v.buffer_size)
        twin = next((t for t in by_name.values()
                     if (t.backend, t.async_state, t.latency_ms, t.in_flight, t.buffer_size) == same), None)  # fmt: skip
        if twin is not None:
            by_name[twin.name] = replace(twin, groups=twin.groups + (group,))
        else:
            by_name[v.name] = replace(v, groups=(group,))

    for ms in args.latencies:
        n_sync = min(sync_n, max(50, int(SYNC_TARGET_S / (2 * ms / 1000))))
        add(Variant(f"lat-{ms:g}ms-sync", f"sync latency {ms:g} ms", "latency", False,
                    latency_ms=ms, records=n_sync), "latency")  # fmt: skip
        add(Variant(f"lat-{ms:g}ms-async", f"async latency {ms:g} ms", "latency", True,
                    latency_ms=ms, records=full), "latency")  # fmt: skip
    for limit in args.in_flight:
        bound = limit / (2 * ROW_MS / 1000)  # each of `limit` records needs 2 round trips
        add(Variant(f"inflight-{limit}", f"async in-flight {limit}", "latency", True, latency_ms=ROW_MS,
                    in_flight=limit, records=min(full, max(sync_n, int(bound * BOUND_TARGET_S)))),
            "in_flight")  # fmt: skip
    for size in args.buffer_sizes:
        bound = args.threads * size / (2 * ROW_MS / 1000)  # threads batches per round trip
        add(Variant(f"buffer-{size}", f"async buffer {size}", "latency", True, latency_ms=ROW_MS,
                    buffer_size=size, records=min(full, max(sync_n, int(bound * BOUND_TARGET_S)))),
            "buffer")  # fmt: skip
    variants = list(by_name.values())
    if args.only:
        variants = [v for v in variants if any(part in v.name for part in args.only)]
    return variants


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
    kind = variant.backend
    if kind == "memory":
        return MemoryBackend(), None
    if kind == "redis":
        if env.redis_url is None:
            raise RuntimeError("no redis-server for the Redis rows")
        env.runs += 1
        backend = RedisBackend(env.redis_url, prefix=f"bench{env.runs}",
                               max_connections=max(8, env.args.threads))  # fmt: skip
        return backend, backend.clear
    path = env.path(kind)
    cleanup = lambda: shutil.rmtree(path, ignore_errors=True)  # noqa: E731
    if kind == "slatedb":
        from backends import SlateDBBackend

        return SlateDBBackend(f"file://{path}", "aec"), cleanup
    backend = RocksDBBackend(path)
    if kind in ("latency", "cached", "cached-cold"):
        backend = LatencyBackend(backend, variant.latency_ms / 1000, seed=env.args.seed)
        if kind != "latency":
            backend = CachedBackend(backend, capacity_entries=env.args.keys)
    elif kind != "rocksdb":
        raise ValueError(kind)
    return backend, cleanup


def run_variant(
    variant: Variant, source: list[Record], expected: dict[Any, int], env: Env
) -> h.Sample:
    """One timed run of ``variant`` over ``source``; checks the final state afterwards."""
    backend, cleanup = make_backend(variant, env)
    config = variant.config(env.args.threads)
    try:
        hits = misses = 0
        if variant.backend == "cached":  # warm: one read of every key, outside the clock
            backend.open()
            run_keyed([Record(k, None) for k in range(env.args.keys)], Loader(), backend, config)
            hits, misses = backend.hits, backend.misses
        backend.open()  # DB creation stays outside the clock; run_keyed's open is a no-op
        keep = ("batches", "requests", "mean_batch_size", "max_batch_size", "max_in_flight",
                "blocked_requests", "inline_batches")  # fmt: skip
        sample = h.timed(lambda: {k: v for k, v in run_keyed(source, Counter(), backend, config).metrics.items()
                                  if k in keep}, len(source))  # fmt: skip
        if isinstance(backend, CachedBackend):
            hh, mm = backend.hits - hits, backend.misses - misses
            sample.metrics.update(cache_hits=hh, cache_misses=mm, hit_rate=hh / (hh + mm) if hh + mm else 0.0,
                                  cache_fetches=backend.fetches, cache_evictions=backend.evictions)  # fmt: skip
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
    return sample


def redis_server_version() -> str | None:
    binary = os.environ.get("AEC_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip() or None)


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def numbers(kind: type) -> Any:
        return lambda text: [kind(x) for x in text.split(",") if x.strip()]

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, help="records of an async run (default 100,000)")
    parser.add_argument("--keys", type=int, help="distinct keys (default 20,000)")
    parser.add_argument(
        "--sync-records", type=int, help="records of a sync run on a slow backend (2,000)"
    )
    parser.add_argument("--threads", type=int, help="executor_threads (default 4)")
    parser.add_argument("--latencies", type=numbers(float), default=[0.1, 0.5, 1.0, 5.0], help="ms")
    parser.add_argument("--in-flight", type=numbers(int), default=[10, 100, 1000, 6000])
    parser.add_argument("--buffer-sizes", type=numbers(int), default=[1, 10, 100, 1000])
    parser.add_argument("--only", type=lambda s: [x for x in s.split(",") if x],
                        help="run only variants whose name contains one of these")  # fmt: skip
    parser.add_argument("--from-json", type=Path, metavar="JSON",
                        help="run nothing: rewrite the Markdown and PNG from a bench_remote.json")  # fmt: skip
    h.add_common_args(parser)
    return h.finish_args(parser, parser.parse_args(argv), "bench_remote", DEFAULTS, QUICK)


def write(report: dict[str, Any], out: Path) -> None:
    h.write_outputs(out, "bench_remote", report, markdown(report), lambda p: plot(report, p))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        report = json.loads(args.from_json.read_text())
        report["extra_ratios"] = extra_ratios(report["results"])
        write(report, args.out)
        return 0
    machine = h.machine_facts(
        ("rocksdict", "slatedb", "redis"), redis_server=redis_server_version()
    )
    rng = random.Random(args.seed)
    key_seq = [rng.randrange(args.keys) for _ in range(args.records)]
    source = [Record(key, i) for i, key in enumerate(key_seq)]
    variants = build_variants(args)
    expected = {n: dict(Tally(key_seq[:n])) for n in {v.records for v in variants} | {1000}}
    print(f"{args.records:,} records over {args.keys:,} keys; {len(variants)} variants x "
          f"{args.repeats} rounds, executor_threads={args.threads}", flush=True)  # fmt: skip
    env, server = Env(args), None
    try:
        if any(v.backend == "redis" for v in variants):
            from backends import LocalRedisServer

            try:
                server = LocalRedisServer().start()
                env.redis_url = server.url
            except (OSError, RuntimeError) as exc:
                print(f"!! Redis rows SKIPPED: no redis-server ({exc})", flush=True)
                variants = [v for v in variants if v.backend != "redis"]
        for kind in dict.fromkeys(v.backend for v in variants):  # warm-up, not recorded
            first = next(v for v in variants if v.backend == kind)
            run_variant(replace(first, async_state=True), source[:1000], expected[1000], env)
        samples = h.run_rounds(variants, lambda v: run_variant(v, source[: v.records], expected[v.records], env),
                               args.repeats)  # fmt: skip
        results = {}
        for v in variants:
            results[v.name] = {"name": v.name, "label": v.label, "row": v.row, "mode": v.mode, "backend": v.backend,
                               "latency_ms": v.latency_ms, "groups": list(v.groups),
                               "in_flight_records_limit": v.in_flight if v.async_state else None,
                               "buffer_size": v.buffer_size if v.async_state else None,
                               **h.summarize(samples[v.name])}  # fmt: skip
        goals = judge(results, samples)
        report: dict[str, Any] = {
            "benchmark": "bench_remote", "date": h.now(), "machine": machine,
            "params": {"records": args.records, "keys": args.keys, "sync_records": args.sync_records,
                       "repeats": args.repeats, "threads": args.threads, "seed": args.seed, "quick": args.quick,
                       "latencies_ms": args.latencies, "in_flight_sweep": args.in_flight,
                       "buffer_sweep": args.buffer_sizes, "statistic": "best of repeats"},
            "results": results, "main_table": main_table(results),
            "sweeps": {g: sweep_table(results, g) for g in ("latency", "in_flight", "buffer")},
            "goals": goals, "extra_ratios": extra_ratios(results),
        }  # fmt: skip
        print(f"\n{'row':<4} {'mode':<5} {'backend':<44} {'records':>8} {'best rec/s':>11} {'vs row 1':>9} "
              f"{'async/sync':>10}")  # fmt: skip
        for r in report["main_table"]:
            print(f"{r['row']:<4} {r['mode']:<5} {r['label'].split(' ', 1)[1]:<44} {r['records']:>8,} "
                  f"{h.fmt_rate(r['best_rps']):>11} {h.fmt_ratio(r['vs_row1']):>9} {h.fmt_ratio(r['vs_sync']):>10}")  # fmt: skip
        for g in goals.values():
            print(f"{h.verdict(g)}: {g['text']}: {g['measured']}")
        text = None
        missed = list(dict.fromkeys(g["profile"] for g in goals.values() if g["met"] is False))
        if missed and not args.no_profile:
            n = min(args.records, PROFILE_RECORDS)
            by_name = {v.name: v for v in variants}
            text = "".join(
                h.profile_call(lambda v=by_name[name]: run_variant(v, source[:n], dict(Tally(key_seq[:n])), env),
                               f"{name}, {n:,} records", threads=True)[0]
                for name in missed if name in by_name
            ) or None  # fmt: skip
        report["profile"] = h.write_profile(args.out, "bench_remote", text)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(env.tmp, ignore_errors=True)
    write(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
