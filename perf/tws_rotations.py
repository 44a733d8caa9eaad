"""The flights job's ``rotations`` on Spark's own keyed state, next to aec's.

Spark 4's ``transformWithStateInPandas`` (arbitrary state API v2) runs a
``StatefulProcessor`` per key with a ``ValueState``. ``TwsRotations`` does what
``spark_glue.flights.functions.Rotations`` does, per flight and in the same arrival order
(``arrival_rank``): read the aircraft's previous flight from state, emit one row, write
this flight to state. Both read the same input (the flights job's: the table as one
Parquet file, the columns rotations reads), use ``--partitions`` partitions and RocksDB
state (aec's ``RocksDBSpec``; Spark's RocksDB state store provider), and write their rows
as Parquet; the two outputs are then checked to be the same rows (as multisets; rows
without a tail number are left out of both: aec writes them to its ``no_tailnum`` side
output, the Spark query filters them out first).

Timed: from building the query to its Parquet written (the Spark session start and the
input file are outside; an untimed run of each side on ``WARM_UP_ROWS`` rows goes first,
so neither pays for starting Python workers). aec runs the flights job's way
(``spark_glue.write_keyed``: one shuffle and sort, the partitions write the Parquet);
Spark runs ``groupBy("aircraft").transformWithStateInPandas(..., timeMode="None")``.
Beside wall time, the CPU seconds of the whole process tree (driver, JVM, Python
workers) during each run: on a shared machine the fairer figure.

Both sides share one driver JVM. ``--jit jvm`` (the default) leaves it the JVM's own
JIT (C1 and C2), as ``pyspark`` and ``spark-submit`` start it: Spark's side is a minute
of JVM work, which C2 speeds up by about a quarter. ``--jit c1`` runs it as the ``aec``
command does (``-XX:TieredStopAtLevel=1``, chosen for the command's seconds-long jobs),
which slows Spark's side: figures measured that way flatter aec (docs/performance.md).

Usage::

    .venv/bin/python perf/tws_rotations.py --limit 30000
    .venv/bin/python perf/tws_rotations.py            # the full year (Spark's side: minutes)
    .venv/bin/python perf/tws_rotations.py --repeats 3  # best of 3 interleaved rounds each
    .venv/bin/python perf/tws_rotations.py --jit c1     # the aec command's C1-only JVM
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from flights_run import tree_cpu_s  # noqa: E402

from spark_glue.session import DEFAULT_JAVA_OPTIONS  # noqa: E402

_EPOCH = dt.datetime(1970, 1, 1)
STATE = "prev_time double, prev_origin string, prev_dest string, prev_arr_delay double"
WARM_UP_ROWS = 2_000
GOAL = 20.0  # aec >= 20x faster on the full year
JIT = {"jvm": None, "c1": DEFAULT_JAVA_OPTIONS}  # --jit: the driver JVM's Java options
JIT_NAMES = {"jvm": "the JVM's own (C1 and C2)", "c1": "C1 only (the aec command's)"}


def tws_processor(fields: list[str]) -> Any:
    """The ``StatefulProcessor`` (pyspark's streaming module loads lazily)."""
    from pyspark.sql.streaming import StatefulProcessor

    from spark_glue.flights.functions import rotation_row

    class TwsRotations(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.previous = handle.getValueState("previous", STATE)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timer_values: Any = None
        ) -> Iterator[pd.DataFrame]:
            frame = pd.concat(list(rows)).sort_values("arrival_rank")
            out = []
            for flight in frame.to_dict("records"):
                seconds = (flight["event_time"] - _EPOCH).total_seconds()
                flight = {k: (None if isinstance(v, float) and v != v and k in ("dep_delay", "arr_delay")
                              else v) for k, v in flight.items()}  # fmt: skip
                previous = self.previous.get() if self.previous.exists() else None
                row = rotation_row(
                    flight, seconds, tuple(previous) if previous is not None else None
                )
                row["event_time"] = _EPOCH + dt.timedelta(seconds=row["event_time"])
                out.append(row)
                self.previous.update(
                    (seconds, flight["origin"], flight["dest"], flight["arr_delay"])
                )
            result = pd.DataFrame(out, columns=fields)
            for column in ("prev_origin", "prev_dest", "propagated", "relocated"):
                # an aircraft's only flight leaves these all missing: float NaN, not strings
                result[column] = result[column].astype(object).where(result[column].notna(), None)
            yield result

        def close(self) -> None:
            pass

    return TwsRotations()


def normalized(frame: pd.DataFrame) -> list[str]:
    """Rows as sorted reprs with NaN as None (pandas and Arrow disagree on missing floats)."""

    def value(v: Any) -> Any:
        return None if isinstance(v, float) and v != v else v

    return sorted(repr(tuple(value(v) for v in row)) for row in frame.itertuples(index=False))


def run_aec(source: Any, out: Path, state: Path, partitions: int) -> None:
    from backends.rocksdb import RocksDBSpec
    from spark_glue.flights import data
    from spark_glue.flights.functions import NO_TAILNUM_SCHEMA, ROTATIONS_SCHEMA, Rotations
    from spark_glue.flights.job import ROTATION_FIELDS
    from spark_glue.keyed_parquet import KeyedOperator, write_keyed

    shutil.rmtree(state, ignore_errors=True)
    op = KeyedOperator("rotations", Rotations(), ROTATIONS_SCHEMA, str(out / "rotations"),
                       side_outputs={"no_tailnum": (NO_TAILNUM_SCHEMA, str(out / "no_tailnum"))},
                       columns=ROTATION_FIELDS, backend=RocksDBSpec(str(state)))  # fmt: skip
    write_keyed(source, [op], "aircraft", timestamp="event_time", watermark_delay=7200,
                order_by=data.ARRIVAL_RANK, num_partitions=partitions)  # fmt: skip


def run_tws(source: Any, out: Path, fields: list[str]) -> None:
    from pyspark.sql import functions as F

    from spark_glue.flights.functions import ROTATIONS_SCHEMA

    query = source.filter(F.col("tailnum").isNotNull()).groupBy("aircraft")
    query.transformWithStateInPandas(
        statefulProcessor=tws_processor(fields), outputStructType=ROTATIONS_SCHEMA,
        outputMode="Append", timeMode="None",
    ).write.mode("overwrite").parquet(str(out / "rotations"))  # fmt: skip


def timed(run: Any) -> dict[str, float]:
    load = os.getloadavg()[0]
    cpu, started = tree_cpu_s(), time.perf_counter()
    run()
    return {"s": time.perf_counter() - started, "cpu_s": tree_cpu_s() - cpu, "load": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, help="first rows of the table (default: all 336,776)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--out", type=Path, default=h.RESULTS)
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleaved rounds of both sides; each side's best counts")  # fmt: skip
    parser.add_argument("--jit", choices=sorted(JIT), default="jvm",
                        help="the shared driver JVM's JIT: the JVM's own (C1 and C2) or the "
                             "aec command's C1 only")  # fmt: skip
    args = parser.parse_args(argv)
    import spark_glue  # noqa: F401  (Python workers: this interpreter)
    from spark_glue.flights import data
    from spark_glue.flights.functions import ROTATIONS_SCHEMA
    from spark_glue.flights.job import ROTATION_FIELDS
    from spark_glue.session import command_session

    fields = [f.split()[0] for f in ROTATIONS_SCHEMA.split(",")]
    # the aec command's session settings; its JVM's JIT as --jit says
    spark, _ = command_session(args.partitions, java_options=JIT[args.jit])
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")  # fmt: skip
    machine = h.machine_facts(("pyspark", "pyarrow", "rocksdict"))
    tmp = Path(tempfile.mkdtemp(prefix="aec-tws-"))
    try:
        prepared = data.load(args.limit)
        prepared[data.ARRIVAL_RANK] = data.arrival_ranks(prepared)
        columns = ["aircraft", "event_time", data.ARRIVAL_RANK, *ROTATION_FIELDS]
        source = data.to_spark_parquet(spark, prepared, columns, str(tmp / "input"))
        warm = source.where(f"{data.ARRIVAL_RANK} < {WARM_UP_ROWS}")
        run_aec(warm, tmp / "warm-aec", tmp / "state", args.partitions)
        run_tws(warm, tmp / "warm-tws", fields)
        figures: dict[str, Any] = {"rows": len(prepared)}
        rounds: dict[str, list[dict[str, float]]] = {"aec": [], "tws": []}
        for round_ in range(1, args.repeats + 1):  # interleaved: a slow spell hits both sides
            rounds["aec"].append(
                timed(lambda: run_aec(source, tmp / "aec", tmp / "state", args.partitions))
            )
            print(f"round {round_}: aec rotations {rounds['aec'][-1]['s']:.1f} s", flush=True)
            rounds["tws"].append(timed(lambda: run_tws(source, tmp / "tws", fields)))
            print(f"round {round_}: Spark transformWithStateInPandas "
                  f"{rounds['tws'][-1]['s']:.1f} s", flush=True)  # fmt: skip
        figures.update({side: min(runs, key=lambda r: r["s"]) for side, runs in rounds.items()})
        figures["rounds"] = rounds
        aec_rows = pd.read_parquet(tmp / "aec" / "rotations")
        tws_rows = pd.read_parquet(tmp / "tws" / "rotations")
        same = normalized(aec_rows) == normalized(tws_rows[list(aec_rows.columns)])
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    figures.update(output_rows=len(aec_rows), tws_output_rows=len(tws_rows), same_output=same,
                   speedup=figures["tws"]["s"] / figures["aec"]["s"],
                   cpu_speedup=figures["tws"]["cpu_s"] / figures["aec"]["cpu_s"])  # fmt: skip
    goal = h.goal("aec rotations vs transformWithStateInPandas, wall time", figures["speedup"],
                  at_least=GOAL, cpu_value=figures["cpu_speedup"])  # fmt: skip
    print(f"{figures['rows']:,} rows: aec rotations {figures['aec']['s']:.1f} s "
          f"({figures['aec']['cpu_s']:.0f} CPU-s), Spark transformWithStateInPandas "
          f"{figures['tws']['s']:.1f} s ({figures['tws']['cpu_s']:.0f} CPU-s): aec "
          f"{figures['speedup']:.1f}x faster ({figures['cpu_speedup']:.1f}x per CPU-second); "
          f"same output: {same} ({figures['output_rows']:,} / {figures['tws_output_rows']:,} "
          "rows)")  # fmt: skip
    print(f"{h.verdict(goal)}: {goal['text']}: {goal['measured']}")
    report = {"benchmark": "tws_rotations", "date": h.now(), "machine": machine,
              "params": {"limit": args.limit, "partitions": args.partitions,
                         "repeats": args.repeats, "jit": args.jit},
              "results": figures, "goals": {"speedup": goal}}  # fmt: skip
    h.write_outputs(args.out, "tws_rotations", report, markdown(report), lambda p: plot(report, p))
    return 0 if same else 1


def markdown(report: dict[str, Any]) -> str:
    r = report["results"]
    size = f"first {r['rows']:,} rows" if report["params"]["limit"] else "the full year"
    lines = [
        *h.md_header("tws_rotations: rotations on aec and on Spark's transformWithStateInPandas",
                     f"the flights job's rotations over {size}, RocksDB state, "
                     f"{report['params']['partitions']} partitions, driver JVM JIT: "
                     f"{JIT_NAMES[report['params']['jit']]}", report),  # fmt: skip
        "",
        *h.md_table(
            ["run", "wall s", "tree CPU s", "load average at start", "output rows"],
            [["aec (write_keyed)", f"{r['aec']['s']:.1f}", f"{r['aec']['cpu_s']:.0f}",
              f"{r['aec']['load']:.1f}", f"{r['output_rows']:,}"],
             ["Spark transformWithStateInPandas", f"{r['tws']['s']:.1f}",
              f"{r['tws']['cpu_s']:.0f}", f"{r['tws']['load']:.1f}",
              f"{r['tws_output_rows']:,}"]],
        ),  # fmt: skip
        "",
        f"Same rows: {r['same_output']}. aec is {r['speedup']:.1f}x faster by wall time, "
        f"{r['cpu_speedup']:.1f}x per CPU-second (each side's best round).",
        "",
        "Wall seconds per round: "
        + "; ".join(
            f"{name} " + ", ".join(f"{run['s']:.1f}" for run in r["rounds"][side])
            for side, name in (("aec", "aec"), ("tws", "Spark"))
        )
        + ".",
        *h.goal_lines(report["goals"]),
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = h.pyplot()
    r = report["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(["aec", "transformWithStateInPandas"], [r["aec"]["s"], r["tws"]["s"]],
           color=["#4c72b0", "#c44e52"])  # fmt: skip
    ax.set_ylabel("wall seconds")
    ax.set_title(f"rotations over {r['rows']:,} rows: aec {r['speedup']:.1f}x faster", fontsize=10)
    h.save(fig, path)


if __name__ == "__main__":
    sys.exit(main())
