"""Checkpoint benchmark: is a streaming micro-batch's cost flat in state size?

A micro-batch is what ``spark_glue.process_keyed_stream`` does per partition, at the
operator level (``aec.KeyedProcessOperator``, no Spark): get the partition's operator
(MemoryBackend: the kept live one; RocksDB, SlateDB: a fresh backend on the
partition's path restoring the newest checkpoint, as the glue does for backends with
state on disk), take a fixed 200-row micro-batch over 100 keys (a keyed counter: one
read and one write per row), the end-of-batch watermark, ``snapshot(<id>, dir)``
writing ``chk-<id>`` (and close the backend, RocksDB and SlateDB); checkpoints older
than the previous one are pruned. State sizes are 1k, 2k, 10k, 100k, 1M and 2M keys, preloaded straight into
the backend (value state ``count``, as the operator writes it) and checkpointed once
before the clock starts. Backends: ``MemoryBackend``, ``RocksDBBackend``,
``SlateDBBackend`` (``file://`` store, ``retained=3``).

Per backend the sizes run side by side: every round takes one micro-batch of every
size, in a rotating order, so machine noise hits all sizes alike; a figure is the
median over ``--repeats`` rounds (min kept in the JSON). Also measured:

* checkpoint bytes written per micro-batch: bytes of files new in ``chk-<id>`` (files
  hard-linked from the previous checkpoint do not count) plus, for SlateDB, bytes of
  objects new in its store;
* restore time: a restarted task: the live operator is closed, a fresh backend on the
  same path (as the backend's spec builds it) and a new operator ``restore`` the newest
  checkpoint; best of ``--restores`` per size, sizes interleaved. A restore need not
  read all state (MemoryBackend reads a large base's segment index and changelog and
  merges a segment on first access; RocksDB opens the linked files), so one more
  restore per size follows (after the timed ones, which a full read would disturb:
  SlateDB's next restores took seconds), with two figures beside the restore column:
  the first micro-batch on the restored operator (the same 200 rows, watermark and
  snapshot, without a restore of its own), then reading all state back
  (``state_items``: every key).

Goals: a micro-batch with 2M keys of state costs at most 1.3x the same with
2k keys (per backend); restore at 1M keys takes at most 2x restore at 10k keys.

``--store s3``: the checkpoints go to an object store, moto's S3 server started
as a separate process (``tests/s3_server.py``); checkpoints are incremental there
(``aec.checkpoint.shared``: a backend file uploaded once, referenced by later
checkpoints; ``CheckpointStore.retain(2)`` after each micro-batch deletes what no
kept checkpoint references). "Checkpoint bytes written" are then the bytes
uploaded per micro-batch (counted by a file-system wrapper), with the goal 2M / 2k
keys <= 1.3x; the restore columns are a restore in the process that wrote the
checkpoints (its object cache holds the files: a restarted task on the same
worker) and, beside them, a cold restore (a new process: every file downloaded and
hashed), whose time grows with the state.

Usage::

    .venv/bin/python perf/bench_checkpoint.py            # full run, writes perf/results/
    .venv/bin/python perf/bench_checkpoint.py --quick    # 1k/2k/10k/20k, temp output
    .venv/bin/python perf/bench_checkpoint.py --sizes 2000,200000 --backends rocksdb
    .venv/bin/python perf/bench_checkpoint.py --store s3 --quick   # on moto's S3 server

Outputs (in ``--out``): bench_checkpoint.json, bench_checkpoint.md, bench_checkpoint.png.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness  # perf/harness.py: rounds, samples, goals, reports

from aec import AecConfig, KeyedProcessFunction, KeyedProcessOperator, Record, ValueStateDescriptor
from aec.elements import Watermark
from aec.keygroups import key_group_for
from aec.state.memory import MemoryBackend
from aec.state.requests import Op, StateRequest
from backends.rocksdb import RocksDBBackend

SIZES = (1_000, 2_000, 10_000, 100_000, 1_000_000, 2_000_000)
QUICK_SIZES = (1_000, 2_000, 10_000, 20_000)
BATCH_ROWS = 200
BATCH_KEYS = 100
LOAD_CHUNK = 20_000  # requests per preload batch
CONFIG = AecConfig()
GOALS = {"batch": (2_000, 2_000_000, 1.3), "restore": (10_000, 1_000_000, 2.0)}
S3_GOALS = {"uploaded": (2_000, 2_000_000, 1.3)}  # bytes uploaded per micro-batch
NAME = "bench_checkpoint"


class Count(KeyedProcessFunction):
    """The keyed counter: one read, one write, one output per row."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process_element(self, value, ctx):
        count = self.count

        def bump(n):
            n = (n or 0) + value
            return count.async_update(n).then_accept(lambda _: ctx.output(n))

        return count.async_value().then_compose(bump)


# --- backends -------------------------------------------------------------------------------


def make_backend(kind: str, root: Path, name: str, fresh: bool = False) -> Any:
    """A backend of ``kind`` (``fresh``: as its spec builds it for a task)."""
    if kind == "memory":
        return MemoryBackend()
    if kind == "rocksdb":
        return RocksDBBackend(root / "db" / name, fresh=fresh)
    from backends.slatedb import SlateDBBackend  # loads a 28 MB native library

    return SlateDBBackend(f"file://{root / 'store'}", name, fresh=fresh, retained=3)


def preload(backend: Any, size: int) -> None:
    """Keys ``0..size-1`` of value state ``count`` (as the operator writes them)."""
    groups = CONFIG.max_parallelism
    for start in range(0, size, LOAD_CHUNK):
        backend.execute_batch(
            [
                StateRequest(Op.VALUE_PUT, "count", key, key_group_for(key, groups), None, 1)
                for key in range(start, min(size, start + LOAD_CHUNK))
            ]
        )
    backend.flush()


# --- the object store (--store s3) -----------------------------------------------------------


class ObjectStore:
    """moto's S3 server in its own process (``tests/s3_server.py``), a bucket, the AWS
    variables pointing at it, and every checkpoint store's file system wrapped to
    count the bytes uploaded (``tests/store_faults.py``)."""

    def __init__(self) -> None:
        sys.path.insert(0, str(harness.ROOT / "tests"))
        from s3_server import S3Server
        from store_faults import StoreFaults

        from aec.checkpoint import storage

        self.server = S3Server().start()
        os.environ.update(self.server.environ())
        self.bucket = self.server.create_bucket()
        self.handlers: list[Any] = []
        real = storage.resolve_filesystem

        def counted(uri: str, timeouts: Any = None) -> Any:
            import pyarrow.fs as pafs

            fs, path = real(uri, timeouts)
            self.handlers.append(StoreFaults(fs))
            return pafs.PyFileSystem(self.handlers[-1]), path

        storage.resolve_filesystem = counted

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def uploaded(self) -> int:
        """Bytes uploaded so far (every store's file system)."""
        return sum(handler.written for handler in self.handlers)

    def close(self) -> None:
        self.server.stop()


STORE: ObjectStore | None = None  # set by --store s3


def forget_process() -> None:
    """What a new process knows: no verified file, no cached object, no registry."""
    from aec.checkpoint import digests, shared

    shared.forget_all()
    digests.forget()


# --- bytes written ------------------------------------------------------------------------


def inodes(path: Path) -> dict[tuple[int, int], int]:
    """``{(device, inode): size}`` of every file under ``path``."""
    found = {}
    for directory, _, files in os.walk(path):
        for name in files:
            stat = os.stat(os.path.join(directory, name))
            found[stat.st_dev, stat.st_ino] = stat.st_size
    return found


def new_bytes(before: dict, after: dict) -> int:
    return sum(size for node, size in after.items() if node not in before)


# --- one state size of one backend ----------------------------------------------------------


class Partition:
    """One partition's state of ``size`` keys, taking micro-batches as
    ``process_keyed_stream`` runs them: ``MemoryBackend`` keeps its live operator
    between micro-batches; RocksDB and SlateDB (state on disk that another worker may
    need) start every micro-batch from a fresh backend on the partition's path that
    restores the newest checkpoint, and close it at the end."""

    def __init__(self, kind: str, root: Path, size: int, seed: int) -> None:
        self.kind, self.size = kind, size
        self.keep = kind == "memory"
        self.root = root / f"{kind}-{size}"
        self.checkpoints: Any = self.root / "checkpoints"
        if STORE is not None:
            self.checkpoints = STORE.uri(f"{kind}-{size}")
        self.backend: Any = make_backend(kind, self.root, "live")
        self.operator: Any = KeyedProcessOperator(Count(), self.backend, CONFIG)
        self.operator.open()
        preload(self.backend, size)
        self.batch_id = self.restarts = 0
        self.handles = [self.operator.snapshot(0, self.checkpoints)]
        if not self.keep:
            self._release()
        self.watermark = 0.0
        self.keys = random.Random(seed).sample(range(size), BATCH_KEYS)
        self.seen = self._written()

    def _written(self) -> dict:
        store = self.root / "store" if self.kind == "slatedb" else None
        found = {} if STORE is not None else inodes(self.checkpoints)
        if store is not None:
            found.update(inodes(store))
        return found

    def _restored(self) -> None:
        """A fresh backend on the partition's path (as its spec builds it) and a new
        operator, restored from the newest checkpoint."""
        self.backend = make_backend(self.kind, self.root, "live", fresh=True)
        self.operator = KeyedProcessOperator(Count(), self.backend, CONFIG)
        self.operator.restore(self.handles[-1])

    def _release(self) -> None:
        self.operator.close()
        self.backend.close()
        self.operator = self.backend = None

    def _rows(self, checkpoint_id: int, directory: Path) -> Any:
        """The batch's rows, its watermark and a snapshot; the handle."""
        for i in range(BATCH_ROWS):
            self.operator.process(
                Record(self.keys[i % BATCH_KEYS], 1, timestamp=self.watermark + i)
            )
        self.operator.process_watermark(Watermark(self.watermark + BATCH_ROWS - 1))
        handle = self.operator.snapshot(checkpoint_id, directory)
        self.operator.drain_outputs()
        return handle

    def micro_batch(self) -> None:
        """One micro-batch (the timed part)."""
        self.uploaded_before = STORE.uploaded() if STORE is not None else 0
        self.batch_id += 1
        if not self.keep:
            self._restored()
        self.handles.append(self._rows(self.batch_id, self.checkpoints))
        self.watermark += BATCH_ROWS
        if not self.keep:
            self._release()

    def after_batch(self) -> int:
        """Prune as the glue does (the newest two checkpoints stay); the bytes the last
        micro-batch's checkpoint wrote (untimed; on S3 the bytes uploaded)."""
        uploaded = 0
        if STORE is not None:
            from aec.checkpoint import CheckpointStore

            uploaded = STORE.uploaded() - self.uploaded_before
            CheckpointStore.at(self.checkpoints).retain(2)
            self.handles = self.handles[-2:]
        while len(self.handles) > 2:
            shutil.rmtree(self.handles.pop(0).path)
        written = self._written()
        grown = new_bytes(self.seen, written) + uploaded
        self.seen = written
        return grown

    def restart(self, then_use: bool = False, cold: bool = False) -> tuple[float, float, float]:
        """A restarted task: a fresh backend on the partition's path and a new operator
        restore the newest checkpoint (a kept operator is dropped first); ``then_use``:
        take one micro-batch (its checkpoint is thrown away), then read all state back;
        ``cold``: as a new process (on S3: every file downloaded and hashed).
        Seconds of each of the three (0 for those not taken)."""
        if self.keep:
            self._release()
        if cold:
            forget_process()
        gc.collect()
        started = time.perf_counter()
        self._restored()
        restored = time.perf_counter()
        if not then_use:
            if not self.keep:
                self._release()
            return restored - started, 0.0, 0.0
        self.restarts += 1
        after = self.root / "after-restart" if STORE is None else f"{self.checkpoints}-after"
        handle = self._rows(self.restarts, after)
        batched = time.perf_counter()
        items = self.backend.state_items("count")
        finished = time.perf_counter()
        if STORE is None:
            shutil.rmtree(handle.path)
        else:
            from aec.checkpoint import CheckpointStore

            CheckpointStore.at(after).delete(handle.checkpoint_id)
        if len(items) != self.size:
            raise AssertionError(f"{self.kind} {self.size}: {len(items)} keys after a restore")
        if not self.keep:
            self._release()
        return restored - started, batched - restored, finished - batched

    def check(self) -> None:
        """Every batch key counted every row once (1 preloaded + 2 per batch)."""
        if not self.keep:
            self._restored()
        items = self.backend.state_items("count")
        if not self.keep:
            self._release()
        expected = 1 + self.batch_id * BATCH_ROWS // BATCH_KEYS
        wrong = [k for k in self.keys if items.get(k) != expected]
        if wrong or len(items) != self.size:
            raise AssertionError(f"{self.kind} {self.size}: wrong state for {wrong[:5]}")

    def close(self) -> None:
        if self.operator is not None:
            self._release()


def run_backend(kind: str, sizes: Sequence[int], repeats: int, restores: int, root: Path) -> dict:
    """Every size of one backend side by side (``harness.run_rounds``); ``{size: figures}``."""
    print(f"{kind}: preloading {', '.join(f'{s:,}' for s in sizes)} keys", flush=True)
    partitions = [Partition(kind, root, size, seed=size) for size in sizes]

    def batch(partition: Partition) -> harness.Sample:
        sample = harness.timed(partition.micro_batch, BATCH_ROWS)
        sample.metrics["checkpoint_bytes"] = partition.after_batch()
        return sample

    def restart(partition: Partition) -> harness.Sample:
        return harness.Sample(partition.restart()[0], 0.0, partition.size)

    def cold_restart(partition: Partition) -> harness.Sample:
        return harness.Sample(partition.restart(cold=True)[0], 0.0, partition.size)

    def restart_and_use(partition: Partition) -> harness.Sample:
        _, first, read_all = partition.restart(then_use=True)
        sample = harness.Sample(first, 0.0, partition.size)
        sample.metrics["read_all"] = read_all
        return sample

    name = lambda p: f"{kind} {p.size:,} keys"  # noqa: E731
    try:
        for partition in partitions:  # warm-up micro-batch, not counted
            batch(partition)
        batches = harness.run_rounds(partitions, batch, repeats, name)
        for partition in partitions:
            partition.check()
        restored = harness.run_rounds(partitions, restart, restores, name, log=lambda _: None)
        cold = (
            harness.run_rounds(partitions, cold_restart, 1, name, log=lambda _: None)
            if STORE is not None
            else {}
        )
        # after the timed restores: SlateDB's next restores slowed down after a full read
        used = harness.run_rounds(partitions, restart_and_use, 1, name, log=lambda _: None)
    finally:
        for partition in partitions:
            partition.close()
    figures = {}
    for partition in partitions:
        runs, restarts = batches[name(partition)], restored[name(partition)]
        (after,) = used[name(partition)]
        figures[partition.size] = {
            "batch_ms": 1e3 * statistics.median(s.seconds for s in runs),
            "batch_ms_min": 1e3 * min(s.seconds for s in runs),
            "checkpoint_bytes": int(statistics.median(s.metrics["checkpoint_bytes"] for s in runs)),
            "restore_ms": 1e3 * min(s.seconds for s in restarts),
            "restore_ms_median": 1e3 * statistics.median(s.seconds for s in restarts),
            "cold_restore_ms": 1e3 * cold[name(partition)][0].seconds if cold else None,
            "first_batch_after_restore_ms": 1e3 * after.seconds,
            "read_all_after_restore_ms": 1e3 * after.metrics["read_all"],
            "batch_seconds": [round(s.seconds, 5) for s in runs],
            "restore_seconds": [round(s.seconds, 5) for s in restarts],
        }
    return figures


# --- report -------------------------------------------------------------------------------


def goals(results: dict[str, dict[int, dict]]) -> list[dict[str, Any]]:
    """The goals per backend, as ``harness.goal`` verdicts (where both sizes ran)."""
    found = []
    wanted = {**GOALS, **(S3_GOALS if STORE is not None else {})}
    fields = {"batch": ("batch_ms", "micro-batch"), "restore": ("restore_ms", "restore"),
              "uploaded": ("checkpoint_bytes", "bytes uploaded per micro-batch")}  # fmt: skip
    for kind, figures in results.items():
        for what, (small, large, limit) in wanted.items():
            field, label = fields[what]
            if small in figures and large in figures and figures[small][field]:
                text = f"{kind}: {label} with {large:,} / {small:,} keys"
                found.append(
                    harness.goal(text, figures[large][field] / figures[small][field], at_most=limit)
                )
    return found


RESTORE_NOTE = (
    "restore ms: a fresh backend and operator restore the newest checkpoint, until "
    "`restore` returns (MemoryBackend: a large base's segment index and the changelog; "
    "its segments are read on first access). Then, on the restored operator: the first "
    "micro-batch (200 rows, watermark, snapshot) and reading all state back "
    "(`state_items`), after one more restore that follows the timed ones. Restore: best of "
    "the restores."
)


def table(results: dict[str, dict[int, dict]]) -> list[str]:
    s3 = STORE is not None
    written = "bytes uploaded per micro-batch (S3)" if s3 else "checkpoint bytes written"
    cold = ["cold restore ms (new process)"] if s3 else []
    return harness.md_table(
        ["backend", "keys of state", "micro-batch ms (median)", written, "restore ms (best)",
         *cold, "first micro-batch after restore ms", "read all state after restore ms"],
        [(kind, f"{size:,}", f"{row['batch_ms']:.1f}", f"{row['checkpoint_bytes']:,}",
          f"{row['restore_ms']:.1f}", *([f"{row['cold_restore_ms']:.1f}"] if s3 else []),
          f"{row['first_batch_after_restore_ms']:.1f}",
          f"{row['read_all_after_restore_ms']:.1f}") for kind, figures in results.items()
         for size, row in figures.items()],
    )  # fmt: skip


def plot(results: dict[str, dict[int, dict]], path: Path) -> None:
    plt = harness.pyplot()
    fields = [("batch_ms", "micro-batch (ms, median)"), ("checkpoint_bytes", "checkpoint bytes written"),
              ("restore_ms", "restore (ms, best)"),
              ("first_batch_after_restore_ms", "first micro-batch after restore (ms)"),
              ("read_all_after_restore_ms", "read all state after restore (ms)")]  # fmt: skip
    figure, axes = plt.subplots(1, len(fields), figsize=(25, 4.2))
    for axis, (field, label) in zip(axes, fields, strict=True):
        for kind, figures in results.items():
            sizes = sorted(figures)
            axis.plot(sizes, [max(figures[s][field], 1e-3) for s in sizes], marker="o", label=kind)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("keys of state")
        axis.set_title(label)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    figure.suptitle(f"{BATCH_ROWS}-row micro-batch over {BATCH_KEYS} keys, against state size")
    harness.save(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(parser)
    parser.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--backends", default="memory,rocksdb,slatedb")
    parser.add_argument("--restores", type=int)
    parser.add_argument("--store", choices=("local", "s3"), default="local",
                        help="where checkpoints go: a local directory, or moto's S3 server")  # fmt: skip
    args = harness.finish_args(
        parser, parser.parse_args(argv), NAME, {"repeats": 15, "restores": 3},
        {"repeats": 5, "restores": 2},
    )  # fmt: skip
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    global STORE
    if args.store == "s3":
        STORE = ObjectStore()
    name = NAME if STORE is None else f"{NAME}_s3"
    report: dict[str, Any] = {
        "date": harness.now(),
        "machine": harness.machine_facts(("rocksdict", "slatedb")),
        "config": {
            "sizes": list(sizes),
            "repeats": args.repeats,
            "restores": args.restores,
            "batch_rows": BATCH_ROWS,
            "batch_keys": BATCH_KEYS,
            "store": args.store,
        },  # fmt: skip
        "results": {},
    }
    results: dict[str, dict[int, dict]] = {}
    try:
        for kind in args.backends.split(","):
            with tempfile.TemporaryDirectory(
                prefix=f"{NAME}-{kind}-", ignore_cleanup_errors=True
            ) as root:
                results[kind] = run_backend(kind, sizes, args.repeats, args.restores, Path(root))
            print("\n".join(table({kind: results[kind]})), flush=True)
    finally:
        if STORE is not None:
            STORE.close()
    report["results"] = {k: {str(s): r for s, r in v.items()} for k, v in results.items()}
    report["goals"] = goals(results)
    lines = [f"# {name}", "", harness.machine_line(report), "", *table(results), "",
             RESTORE_NOTE, ""]  # fmt: skip
    lines += harness.md_table(
        ["goal", "measured", "met"], [(g["text"], g["measured"], harness.verdict(g)) for g in report["goals"]]
    )  # fmt: skip
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    harness.write_outputs(args.out, name, report, markdown, lambda path: plot(results, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
