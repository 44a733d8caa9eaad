"""PyFlink peer of bench_joins: the interval join written as a PyFlink user must (PyFlink
2.3's Python DataStream API has no ``interval_join``): ``connect`` of the two keyed
streams, a ``KeyedCoProcessFunction`` keeping each side in a ``MapState`` of timestamp ->
values, every record scanning the other side's buffer for partners inside
``[LOWER, UPPER]``, and an event-time cleanup timer per record (Flink's rule). Same
records as bench_joins' PyFlink row (``joins_data.co_rows``).

Runs only where ``apache-flink`` is installed (not a project dependency: a JVM and
~500 MB; install it into a venv of its own). Writes
``perf/results/bench_joins_pyflink.json``, which bench_joins.py folds into its table
(goal: aec >= 100x PyFlink's records/s).

What is measured: records / (time of the last output - time the first record reached the
Python worker), both read with ``time.time()`` inside the Python worker, so JVM start, job
submission and the worker's start are left out; the whole ``execute`` is recorded too.
Checked: the join's pairs equal a brute-force count over the records.

Usage (from the repository root)::

    python3 -m venv /work/pyflink-venv && /work/pyflink-venv/bin/pip install apache-flink==2.3.0
    /work/pyflink-venv/bin/python perf/bench_joins_pyflink.py --records 22000 --keys 200
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

from joins_data import LOWER, UPPER, co_rows  # noqa: E402

OUT_OF_ORDERNESS_S = 10  # as bench_joins' watermarks: the newest time - 10 s
END_OF_INPUT = 2**62  # milliseconds: the final watermark (Long.MAX_VALUE) fires what is left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=22_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--mode", choices=("process", "thread"), default="process",
                        help="PyFlink's python.execution-mode")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    try:
        from pyflink.common import Configuration, Duration, Types, WatermarkStrategy
        from pyflink.common.watermark_strategy import TimestampAssigner
        from pyflink.datastream import StreamExecutionEnvironment
        from pyflink.datastream.functions import KeyedCoProcessFunction, RuntimeContext
        from pyflink.datastream.state import MapStateDescriptor
    except ImportError:
        print("apache-flink is not installed: nothing to compare (see the module docstring)")
        return 0
    import pyflink

    rows = [r for r in co_rows(args.records, args.keys, args.seed) if r != "watermark"]
    left = [(k, v, int(t * 1000)) for i, k, v, t in rows if i == 1]
    right = [(k, v, int(t * 1000)) for i, k, v, t in rows if i == 2]
    lower_ms, upper_ms = int(LOWER * 1000), int(UPPER * 1000)
    marks = Path(tempfile.mkdtemp(prefix="pyflink-joins-"))
    first_mark, last_mark = str(marks / "first"), str(marks / "last")

    class Stamp(TimestampAssigner):
        def extract_timestamp(self, value, record_timestamp):
            if not os.path.exists(first_mark):  # the first record in the worker
                with open(first_mark, "w") as f:
                    f.write(repr(time.time()))
            return value[2]

    class IntervalJoin(KeyedCoProcessFunction):
        """Flink's interval join on MapState buffers, each record scanning the other side."""

        def open(self, runtime_context: RuntimeContext):
            values = Types.LIST(Types.INT())
            self.left = runtime_context.get_map_state(
                MapStateDescriptor("left", Types.LONG(), values))
            self.right = runtime_context.get_map_state(
                MapStateDescriptor("right", Types.LONG(), values))  # fmt: skip
            self.pairs = 0

        def _element(self, value, ctx, ours, other, low, high, cleanup):
            ts = ctx.timestamp()
            if ts < ctx.timer_service().current_watermark():
                return  # late
            bucket = ours.get(ts)
            ours.put(ts, (list(bucket) if bucket is not None else []) + [value[1]])
            for other_ts, other_values in other.items():
                if ts + low <= other_ts <= ts + high:
                    for other_value in other_values:
                        self.pairs += 1
                        yield (value[0], value[1], other_value)
            ctx.timer_service().register_event_time_timer(cleanup)

        def process_element1(self, value, ctx):
            ts = ctx.timestamp()
            yield from self._element(value, ctx, self.left, self.right, lower_ms, upper_ms,
                                     ts + upper_ms if upper_ms > 0 else ts)  # fmt: skip

        def process_element2(self, value, ctx):
            ts = ctx.timestamp()
            yield from self._element(value, ctx, self.right, self.left, -upper_ms, -lower_ms,
                                     ts - lower_ms if lower_ms < 0 else ts)  # fmt: skip

        def on_timer(self, timestamp, ctx):
            self.left.remove(timestamp - upper_ms if upper_ms > 0 else timestamp)
            self.right.remove(timestamp + lower_ms if lower_ms < 0 else timestamp)
            if ctx.timer_service().current_watermark() >= END_OF_INPUT:
                with open(last_mark, "w") as f:  # the worker's clock after the last record
                    f.write(f"{time.time()!r} {self.pairs}\n")
            return iter(())

    config = Configuration()
    config.set_string("python.execution-mode", args.mode)
    config.set_string("python.executable", sys.executable)  # the worker: this venv's Python
    config.set_string("python.client.executable", sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(1)
    kind = Types.TUPLE([Types.INT(), Types.INT(), Types.LONG()])
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(
        Duration.of_seconds(OUT_OF_ORDERNESS_S)
    ).with_timestamp_assigner(Stamp())
    streams = [
        env.from_collection(side, kind).assign_timestamps_and_watermarks(strategy)
        .key_by(lambda r: r[0], key_type=Types.INT())
        for side in (left, right)
    ]  # fmt: skip
    joined = streams[0].connect(streams[1]).process(
        IntervalJoin(), output_type=Types.TUPLE([Types.INT(), Types.INT(), Types.INT()])
    )
    results = joined.execute_and_collect()
    started = time.perf_counter()
    pairs = sum(1 for _ in results)
    job_seconds = time.perf_counter() - started
    expected = _brute_force(left, right, lower_ms, upper_ms)
    first = float(Path(first_mark).read_text())
    last = float(Path(last_mark).read_text().split()[0])
    records = len(left) + len(right)
    result = {
        "records": records, "keys": args.keys, "pairs": pairs, "expected_pairs": expected,
        "seconds": last - first, "records_per_s": records / (last - first),
        "job_seconds": job_seconds, "job_records_per_s": records / job_seconds,
        "execution_mode": args.mode,
        "pyflink": getattr(pyflink, "__version__", ""),
        "note": "seconds: first record in the Python worker to the last cleanup timer "
                "(JVM, job submission and worker start left out); job_seconds: collecting "
                "every result; expected_pairs: a brute-force count without lateness",
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_joins_pyflink.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _brute_force(left: list, right: list, lower_ms: int, upper_ms: int) -> int:
    """Pairs inside the interval, per key, ignoring lateness (an upper bound: PyFlink drops
    late records, so its count may be smaller only by what lateness drops)."""
    by_key: dict[int, list[int]] = {}
    for key, _, ts in right:
        by_key.setdefault(key, []).append(ts)
    return sum(
        1
        for key, _, ts in left
        for other in by_key.get(key, [])
        if ts + lower_ms <= other <= ts + upper_ms
    )


if __name__ == "__main__":
    raise SystemExit(main())
