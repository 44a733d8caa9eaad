"""Failure injection: a process_keyed_stream driver killed (SIGKILL, its whole process
group) before the sink, after the sink, mid-batch and after a commit, then restarted on
the same checkpoint until its input is done. The output must equal a pandas answer
computed in the arrival order Spark's source log records: no lost, duplicated or wrong
row. One sequence runs a declaring function whose micro-batches carry records in flight
to later ones: each row must then appear once, in its arrival micro-batch or a later
one. Drivers: tests/drivers/crash_driver.py (crash points explained there)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from driver_helpers import DRIVERS, driver_env

DRIVER = DRIVERS / "crash_driver.py"
FILES, ROWS_PER_FILE, KEYS = 8, 24, 7
RUN_TIMEOUT = 240  # seconds per driver run (JVM start-up on a busy machine included)


def _write_input(workdir: Path) -> list[list[dict]]:
    """FILES JSON files of consecutive seqs; the source takes them in mtime order, which
    is not their name order. Returns the files' rows in that (expected) order."""
    rng = random.Random(42)
    source = workdir / "input"
    source.mkdir(parents=True)
    order = list(range(FILES))
    rng.shuffle(order)
    files = []
    for position, index in enumerate(order):
        rows = [
            {"k": f"k{rng.randrange(KEYS)}", "seq": seq, "x": rng.randrange(1, 100)}
            for seq in range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE)
        ]
        rng.shuffle(rows)  # the micro-batch sorts by seq (order_by)
        path = source / f"file-{index:02d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (2_000_000 + position, 2_000_000 + position))
        files.append(rows)
    return files


def _seq_in(files, file: int, position: int) -> int:
    """The seq at ``position`` (in seq order) of the ``file``-th file to arrive."""
    return sorted(r["seq"] for r in files[file])[position]


def _arrival(workdir: Path) -> dict[str, int]:
    """Input file path -> the micro-batch that read it, from Spark's checkpoint: the offset
    log gives micro-batch ``n`` the file source's log entries ``(offset[n-1], offset[n]]``
    (a source entry logged by a run killed before its offsets were written is read by
    the next run's micro-batch together with newer files)."""
    spark = workdir / "ckpt" / "spark"
    ends = {
        int(entry.name): json.loads(entry.read_text().splitlines()[2])["logOffset"]
        for entry in (spark / "offsets").iterdir()
        if entry.name.isdigit()
    }
    source: dict[int, list[str]] = {}
    for entry in (spark / "sources" / "0").iterdir():
        if entry.name.isdigit():
            for line in entry.read_text().splitlines()[1:]:  # first line: the log version
                item = json.loads(line)
                source.setdefault(item["batchId"], []).append(item["path"].removeprefix("file://"))
    arrival, previous = {}, -1
    for batch in sorted(ends):
        for log_id in range(previous + 1, ends[batch] + 1):
            arrival.update((path, batch) for path in source[log_id])
        previous = ends[batch]
    return arrival


def _pandas_answer(workdir: Path) -> pd.DataFrame:
    """Running count and total per key over the files in the logged arrival order
    (seq order within a micro-batch), with the micro-batch of each row."""
    frames = []
    for path, batch in _arrival(workdir).items():
        frame = pd.read_json(path, lines=True)
        frame["batch_id"] = batch
        frames.append(frame)
    rows = pd.concat(frames).sort_values(["batch_id", "seq"], kind="stable")
    rows = rows[~rows["k"].str.startswith("idle-")]  # the declared driver's idle rows
    rows["count"] = rows.groupby("k").cumcount() + 1
    rows["total"] = rows.groupby("k")["x"].cumsum()
    return rows[["k", "seq", "count", "total", "batch_id"]]


def _run_until_done(workdir: Path, backend: str, points: list[str], partitions: list[int]):
    """Start the driver until it exits 0; ``partitions[i]`` is run i's num_partitions (the
    last one repeats). Returns the crash points in the order they fired."""
    fired: list[str] = []
    for run in range(len(points) + 1):
        n = partitions[min(run, len(partitions) - 1)]
        argv = [sys.executable, str(DRIVER), str(workdir), backend, str(n), ",".join(points)]
        process = subprocess.Popen(
            argv,
            env=driver_env(),
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: the crash kills all of it
        )
        try:
            _, stderr = process.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
        new = sorted(set(os.listdir(workdir / "fired")) - set(fired))
        if process.returncode == 0:
            assert not new, f"run {run} ended normally but fired {new}"
            return fired
        assert process.returncode == -signal.SIGKILL, stderr[-4000:]
        assert len(new) == 1, f"run {run} was killed with crash points {new} fired"
        fired.extend(new)
    raise AssertionError(f"still crashing after {len(points)} crash points: fired {fired}")


def _check_output(workdir: Path, carries: bool = False) -> int:
    """Every row once, with the pandas answer's values; in the micro-batch its input
    arrived in, or (``carries``: a declaring function) in that one or a later one."""
    expected = _pandas_answer(workdir)
    got = pd.concat(pd.read_parquet(p) for p in sorted((workdir / "out").glob("batch-*.parquet")))
    got = got[~got["k"].str.startswith("idle-")]
    assert not list((workdir / "out").glob("*.tmp"))
    batches = sorted(set(expected["batch_id"]))
    if not carries:
        assert sorted(got["batch_id"].unique()) == batches == list(range(len(batches)))
    assert len(got) == len(expected) == FILES * ROWS_PER_FILE  # nothing lost or duplicated
    columns = ["k", "seq", "count", "total", "batch_id"]
    got = got[columns].sort_values("seq").reset_index(drop=True).astype("int64", errors="ignore")
    expected = expected.sort_values("seq").reset_index(drop=True)
    if carries:
        assert (got["batch_id"] >= expected["batch_id"]).all()
        assert (got["batch_id"] > expected["batch_id"]).any(), "no record was carried"
        columns.remove("batch_id")
    pd.testing.assert_frame_equal(got[columns], expected[columns], check_dtype=False)
    return len(got)


def _crash_test(tmp_path: Path, backend: str, plan, partitions: list[int]) -> list[str]:
    """Run one crash plan to the end and check the output; returns the fired points."""
    files = _write_input(tmp_path)
    points = [p(files) if callable(p) else p for p in plan]
    fired = _run_until_done(tmp_path, backend, points, partitions)
    assert sorted(fired) == sorted(points)  # every crash point was reached, once
    _check_output(tmp_path, carries=backend == "declared")
    # the source took the files in modification time order (the crash plan relies on it)
    arrival = _arrival(tmp_path)
    by_mtime = sorted((tmp_path / "input").glob("file-*"), key=lambda p: p.stat().st_mtime)
    batches = [arrival[str(p)] for p in by_mtime]
    assert len(batches) == FILES and batches == sorted(batches)
    return fired


def _record(file: int, position: int):
    return lambda files: f"record:{_seq_in(files, file, position)}"


# Crash points, in the order they fire (a point of an already committed batch never would).
# _record(f, i): the i-th record of the f-th file to arrive (file f is micro-batch f unless
# a crash between the source's log and the offset log merged two files into one batch;
# the answer follows the logs, so only the plan's numbering assumes one file per batch).
MEMORY_PLAN = [
    _record(0, 17),  # mid-batch in the first micro-batch: nothing committed yet
    "sink-before:1",
    "sink-after:2",  # batch-2.parquet written, then rewritten by the replay
    "committed:3",
    _record(5, 0),  # the first record of a file
    "sink-after:5",  # the replay of a batch that crashed mid-way crashes again
]
ROCKSDB_PLAN = [
    _record(1, 5),
    "sink-before:1",  # three attempts of one micro-batch in a row
    "sink-after:1",
    "committed:4",
    _record(6, 23),  # the last record of a file
]


# Across a rescale (MemoryBackend: RocksDBBackend does not restore several checkpoints
# yet): runs 0 and 1 on 2 state partitions, then 3. Micro-batch 3 was snapshotted on 2
# partitions and not committed: the run on 3 replays it from the 2 partitions' state.
RESCALE_PLAN = [_record(1, 10), "sink-after:3"]
# A declaring function over a slow store: micro-batches carry records in flight, which
# finish (and emit) in later micro-batches; crashes hit micro-batches that restore them.
DECLARED_PLAN = [_record(1, 3), "sink-before:2", "sink-after:3", "committed:5"]
SEQUENCES = {  # name: (backend, crash plan, num_partitions per driver run)
    "memory": ("memory", MEMORY_PLAN, [2]),
    "rocksdb": ("rocksdb", ROCKSDB_PLAN, [2]),
    "rescale": ("memory", RESCALE_PLAN, [2, 2, 3]),
    "declared": ("declared", DECLARED_PLAN, [2]),
}


@pytest.mark.spark
@pytest.mark.timeout(1800)
def test_killed_drivers_restart_without_lost_or_duplicated_rows(tmp_path):
    """The sequences run side by side (each driver run pays a JVM start-up)."""
    with ThreadPoolExecutor(len(SEQUENCES)) as pool:
        futures = {
            name: pool.submit(_crash_test, tmp_path / name, backend, plan, partitions)
            for name, (backend, plan, partitions) in SEQUENCES.items()
        }
        fired = {name: future.result() for name, future in futures.items()}
    assert sum(len(points) for points in fired.values()) >= 14
    state = tmp_path / "rescale" / "ckpt" / "state"
    assert (state / "partition-2-of-3").is_dir()  # the last run had 3 partitions
