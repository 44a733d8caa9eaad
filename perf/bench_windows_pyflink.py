"""PyFlink peer of bench_windows: ``window(TumblingEventTimeWindows).aggregate(...)`` over
the same synthetic records as bench_windows' tumbling rows, in PyFlink's local mini-cluster.

Runs only where ``apache-flink`` is installed (not a project dependency: a JVM and
~500 MB; install it into a venv of its own). Writes
``perf/results/bench_windows_pyflink.json``, which bench_windows.py folds into its table
(goal: aec >= 100x PyFlink's records/s).

What is measured: records / (time of the last window result - time the first record
reached the Python worker), both read with ``time.time()`` inside the Python worker (the
timestamp assigner sees each record first; ``get_result`` runs at each firing). So JVM
start, job graph building, submission and the worker's start are left out; the job's
wall time from ``execute`` is recorded too. Checked: the window results count every
record once.

Usage (from the repository root)::

    python3 -m venv /work/pyflink-venv && /work/pyflink-venv/bin/pip install apache-flink==2.3.0
    /work/pyflink-venv/bin/python perf/bench_windows_pyflink.py --records 100000 --keys 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "perf"))

from windows_data import synthetic_rows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--mode", choices=("process", "thread"), default="process",
                        help="PyFlink's python.execution-mode")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    try:
        from pyflink.common import Configuration, Duration, Time, Types, WatermarkStrategy
        from pyflink.common.watermark_strategy import TimestampAssigner
        from pyflink.datastream import StreamExecutionEnvironment
        from pyflink.datastream.functions import AggregateFunction
        from pyflink.datastream.window import TumblingEventTimeWindows
    except ImportError:
        print("apache-flink is not installed: nothing to compare (see the module docstring)")
        return 0
    import pyflink

    # bench_windows' "dense" records: the tumbling rows' input
    step = 3600 * 24 / args.records
    records = [(k, v, int(t * 1000)) for row in synthetic_rows(args.records, args.keys, step)
               if row != "watermark" for k, v, t in [row]]  # fmt: skip
    marks = Path(tempfile.mkdtemp(prefix="pyflink-bench-"))
    first_mark, results_mark = str(marks / "first"), str(marks / "results")

    class CountSum(AggregateFunction):
        def create_accumulator(self):
            return (0, 0.0)

        def add(self, value, acc):
            return (acc[0] + 1, acc[1] + value[1])

        def get_result(self, acc):
            with open(results_mark, "a") as f:  # the worker's clock at each firing
                f.write(f"{time.time()!r} {acc[0]}\n")
            return acc

        def merge(self, a, b):
            return (a[0] + b[0], a[1] + b[1])

    class Stamp(TimestampAssigner):
        def extract_timestamp(self, value, record_timestamp):
            if not os.path.exists(first_mark):  # the first record in the worker
                with open(first_mark, "w") as f:
                    f.write(repr(time.time()))
            return value[2]

    config = Configuration()
    config.set_string("python.execution-mode", args.mode)
    config.set_string("python.executable", sys.executable)  # the worker: this venv's Python
    config.set_string("python.client.executable", sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(1)
    stream = env.from_collection(records, Types.TUPLE([Types.INT(), Types.DOUBLE(), Types.LONG()]))
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(60))
    (stream.assign_timestamps_and_watermarks(strategy.with_timestamp_assigner(Stamp()))
        .key_by(lambda r: r[0], key_type=Types.INT())
        .window(TumblingEventTimeWindows.of(Time.hours(1)))
        .aggregate(CountSum(), accumulator_type=Types.TUPLE([Types.LONG(), Types.DOUBLE()]),
                   output_type=Types.TUPLE([Types.LONG(), Types.DOUBLE()]))
        .print())  # fmt: skip
    started = time.perf_counter()
    env.execute("bench_windows_pyflink")
    job_seconds = time.perf_counter() - started
    first = float(Path(first_mark).read_text())
    fired = [line.split() for line in Path(results_mark).read_text().splitlines()]
    last = max(float(t) for t, _ in fired)
    counted = sum(int(n) for _, n in fired)
    if counted != len(records):
        raise AssertionError(f"window results count {counted} records, expected {len(records)}")
    seconds = last - first
    result = {
        "records": len(records), "keys": args.keys, "windows_fired": len(fired),
        "seconds": seconds, "records_per_s": len(records) / seconds,
        "job_seconds": job_seconds, "job_records_per_s": len(records) / job_seconds,
        "execution_mode": args.mode, "pyflink": pyflink.__version__ if hasattr(pyflink, "__version__") else "",
        "note": "seconds: first record in the Python worker to the last window result "
                "(JVM, job submission and worker start left out); job_seconds: env.execute",
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_windows_pyflink.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
