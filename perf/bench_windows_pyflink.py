"""PyFlink peer of bench_windows: ``window(TumblingEventTimeWindows).aggregate(...)`` over
the same synthetic records as bench_windows' tumbling run, in PyFlink's local mini-cluster.

Runs only where ``apache-flink`` is installed (it is not a project dependency: a JVM and
~500 MB). Writes ``perf/results/bench_windows_pyflink.json`` with records/s, which
bench_windows.py folds into its table (goal: aec >= 100x PyFlink's records/s).

Usage::

    pip install apache-flink        # elsewhere; needs Java 11+
    python perf/bench_windows_pyflink.py --records 100000 --keys 50
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "perf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    try:
        from pyflink.common import Duration, Time, Types, WatermarkStrategy
        from pyflink.common.watermark_strategy import TimestampAssigner
        from pyflink.datastream import StreamExecutionEnvironment
        from pyflink.datastream.functions import AggregateFunction
        from pyflink.datastream.window import TumblingEventTimeWindows
    except ImportError:
        print("apache-flink is not installed: nothing to compare (see the module docstring)")
        return 0
    from bench_windows import synthetic  # the same records as aec's run

    from aec import Record

    records = [(e.key, e.value, int(e.timestamp * 1000)) for e in
               synthetic(args.records, args.keys, 3600 * 24 / args.records) if type(e) is Record]  # fmt: skip

    class CountSum(AggregateFunction):
        def create_accumulator(self):
            return (0, 0.0)

        def add(self, value, acc):
            return (acc[0] + 1, acc[1] + value[1])

        def get_result(self, acc):
            return acc

        def merge(self, a, b):
            return (a[0] + b[0], a[1] + b[1])

    class Stamp(TimestampAssigner):
        def extract_timestamp(self, value, record_timestamp):
            return value[2]

    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(1)
    stream = env.from_collection(records, Types.TUPLE([Types.INT(), Types.DOUBLE(), Types.LONG()]))
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(60))
    (stream.assign_timestamps_and_watermarks(strategy.with_timestamp_assigner(Stamp()))
        .key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(Time.hours(1)))
        .aggregate(CountSum())
        .print())  # fmt: skip
    started = time.perf_counter()
    env.execute("bench_windows_pyflink")
    elapsed = time.perf_counter() - started
    result = {"records": len(records), "seconds": elapsed, "records_per_s": len(records) / elapsed,
              "note": "job wall time incl. mini-cluster start"}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_windows_pyflink.json").write_text(json.dumps(result, indent=2) + "\n")
    print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
