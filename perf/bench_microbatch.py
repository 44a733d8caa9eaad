"""Micro-batch cost against state size, MemoryBackend, as ``process_keyed_stream`` runs it.

A partition's micro-batch with a kept live operator (``spark_glue.stream_task``):
feed a fixed micro-batch of ``--rows`` rows over ``--touched`` keys (read, write,
output), end it with a watermark, ``snapshot(batch_id, directory)``, delete all but
the newest 2 checkpoints. State sizes ``--sizes`` keys (one value each), filled
before the clock starts; the first snapshot (the base) is outside the clock. Two
variants side by side in one run (micro-batches interleaved, the order rotating):
``incremental`` (the default MemoryBackend:
changelog against a hard-linked base) and ``full`` (``incremental=False``: a full
pickle per micro-batch). Each figure is the median
of ``--batches`` micro-batches. Also: restore time of the last checkpoint (a worker
that did not keep the operator).

Goal: the micro-batch with the largest state costs at most 1.3x the one
with the smallest (``incremental``).

Usage::

    python perf/bench_microbatch.py                       # 2k and 2M keys, writes perf/results/
    python perf/bench_microbatch.py --quick               # 2k and 200k keys, temp dir

Outputs: bench_microbatch.json, bench_microbatch.md, bench_microbatch.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aec import KeyedProcessFunction, KeyedProcessOperator, Record, ValueStateDescriptor, Watermark
from aec.state.memory import MemoryBackend


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        ctx.output(n)


class Variant:
    """One (state size, incremental or full) partition with its kept operator."""

    def __init__(self, size: int, incremental: bool, args: Any, root: str) -> None:
        self.size, self.incremental, self.args = size, incremental, args
        self.backend = MemoryBackend(incremental=incremental)
        self.backend._tables = {"count": {f"k{i}": i for i in range(size)}}  # off the clock
        self.operator = KeyedProcessOperator(Count(), self.backend)
        self.directory = os.path.join(root, f"{size}-{incremental}")
        self.operator.snapshot(0, self.directory)  # the base, off the clock
        self.times: list[float] = []

    def micro_batch(self, batch: int) -> None:
        args, operator = self.args, self.operator
        started = time.perf_counter()
        for row in range(args.rows):
            operator.process(Record(f"k{(batch * 7 + row) % args.touched}", row))
        operator.process_watermark(Watermark(float(batch)))
        operator.snapshot(batch, self.directory)
        operator.drain_outputs()
        for old in range(batch - 1):  # keep the newest 2, as process_keyed_stream does
            shutil.rmtree(os.path.join(self.directory, f"chk-{old}"), ignore_errors=True)
        self.times.append(time.perf_counter() - started)

    def finish(self) -> dict[str, Any]:
        last = os.path.join(self.directory, f"chk-{self.args.batches}")
        written = sum(  # bytes this checkpoint wrote itself (links to the base excluded)
            os.path.getsize(os.path.join(folder, name))
            for folder, _, names in os.walk(last)
            for name in names
            if os.stat(os.path.join(folder, name)).st_nlink == 1 or "delta" in name
        )
        started = time.perf_counter()
        KeyedProcessOperator(Count(), MemoryBackend()).restore(last)
        restore = time.perf_counter() - started
        self.operator.close()
        self.backend.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        return {
            "size": self.size,
            "variant": "incremental" if self.incremental else "full",
            "batch_ms": 1000 * statistics.median(self.times),
            "batch_ms_max": 1000 * max(self.times),
            "new_bytes_last": written,
            "restore_ms": 1000 * restore,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 2_000_000])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--touched", type=int, default=100)
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.batches = [2_000, 200_000], 5
    out = Path(args.out or (tempfile.mkdtemp() if args.quick else "perf/results"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        variants = [Variant(n, inc, args, root) for n in args.sizes for inc in (True, False)]
        os.sync()  # the bases' write-back must not land inside the clock
        for batch in range(1, args.batches + 1):  # interleaved, the order rotating per batch
            shift = batch % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                variant.micro_batch(batch)
        rows = [variant.finish() for variant in variants]
    small, large = min(args.sizes), max(args.sizes)
    ratios = {}
    for variant in ("incremental", "full"):
        by_size = {r["size"]: r["batch_ms"] for r in rows if r["variant"] == variant}
        ratios[variant] = by_size[large] / by_size[small]
    goal = ratios["incremental"] <= 1.3
    lines = [
        "| state keys | variant | micro-batch ms (median) | max ms | new bytes | restore ms |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']:,} | {r['variant']} | {r['batch_ms']:.1f} | {r['batch_ms_max']:.1f} "
            f"| {r['new_bytes_last']:,} | {r['restore_ms']:.0f} |"
        )
    lines.append("")
    lines.append(
        f"{large:,} vs {small:,} keys: incremental {ratios['incremental']:.2f}x "
        f"(goal <= 1.3x: {'met' if goal else 'MISSED'}), full {ratios['full']:.2f}x"
    )
    table = "\n".join(lines)
    print(table)
    (out / "bench_microbatch.md").write_text(table + "\n")
    data = {"rows": rows, "ratios": ratios, "goal_met": goal, "args": vars(args)}
    (out / "bench_microbatch.json").write_text(json.dumps(data, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for variant in ("incremental", "full"):
        points = [(r["size"], r["batch_ms"]) for r in rows if r["variant"] == variant]
        axis.plot(*zip(*points, strict=True), marker="o", label=variant)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("keys of state")
    axis.set_ylabel("ms per 200-row micro-batch (median)")
    axis.set_title("MemoryBackend micro-batch cost vs state size")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "bench_microbatch.png", dpi=100)
    print(f"wrote {out}/bench_microbatch.{{json,md,png}}")
    assert math.isfinite(ratios["incremental"])


if __name__ == "__main__":
    main()
