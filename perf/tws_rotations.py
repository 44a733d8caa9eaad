"""The flights job's ``rotations`` on Spark's own keyed state, next to aec's (issue 9).

Spark 4's ``transformWithStateInPandas`` (arbitrary state API v2) runs a
``StatefulProcessor`` per key with a ``ValueState``. ``TwsRotations`` does what
``spark_glue.flights.functions.Rotations`` does, per flight and in the same arrival order
(``arrival_time``, ``row``): read the aircraft's previous flight from state, emit one row,
write this flight to state. Both runs read the same prepared rows (one Spark DataFrame,
cached before either clock starts), use 2 partitions, and their main outputs are checked
to be the same rows (as multisets; rows without a tail number are left out of both, aec's
``no_tailnum`` side output).

Timed: from the query's construction to its rows collected on the driver (Spark session
start and the input's caching are outside). aec: ``process_keyed(..., Rotations(), backend=
RocksDBSpec)``; Spark: ``groupBy("aircraft").transformWithStateInPandas(..., timeMode="None")``
with the RocksDB state store provider.

Usage::

    PYTHONPATH=$PWD .venv/bin/python perf/tws_rotations.py --limit 30000
    PYTHONPATH=$PWD .venv/bin/python perf/tws_rotations.py            # the full year (slow)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

_EPOCH = dt.datetime(1970, 1, 1)
STATE = "prev_time double, prev_origin string, prev_dest string, prev_arr_delay double"


def tws_processor() -> Any:
    """The ``StatefulProcessor`` class (pyspark's streaming module loads lazily)."""
    from pyspark.sql.streaming import StatefulProcessor

    from spark_glue.flights.functions import _rotation_row

    class TwsRotations(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.previous = handle.getValueState("previous", STATE)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timer_values: Any = None
        ) -> Iterator[pd.DataFrame]:
            frame = pd.concat(list(rows)).sort_values(["arrival_time", "row"])
            out = []
            for flight in frame.to_dict("records"):
                seconds = (flight["event_time"] - _EPOCH).total_seconds()
                flight = {k: (None if isinstance(v, float) and v != v and k in ("dep_delay", "arr_delay")
                              else v) for k, v in flight.items()}  # fmt: skip
                previous = self.previous.get() if self.previous.exists() else None
                row = _rotation_row(
                    flight, seconds, tuple(previous) if previous is not None else None
                )
                row["event_time"] = _EPOCH + dt.timedelta(seconds=row["event_time"])
                out.append(row)
                self.previous.update(
                    (seconds, flight["origin"], flight["dest"], flight["arr_delay"])
                )
            result = pd.DataFrame(out, columns=[f.split()[0] for f in ROTATIONS_FIELDS])
            for column in ("prev_origin", "prev_dest", "propagated", "relocated"):
                # an aircraft's only flight leaves these all missing: float NaN, not strings
                result[column] = result[column].astype(object).where(result[column].notna(), None)
            yield result

        def close(self) -> None:
            pass

    return TwsRotations()


ROTATIONS_FIELDS: list[str] = []


def normalized(rows: list[Any]) -> list[str]:
    """Rows as sorted reprs with NaN as None (pandas and Arrow disagree on missing floats)."""

    def value(v: Any) -> Any:
        return None if isinstance(v, float) and v != v else v

    return sorted(repr(tuple(value(v) for v in row)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, help="first rows of the table (default: all 336,776)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--out", type=Path, default=h.RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from backends.rocksdb import RocksDBSpec
    from spark_glue import process_keyed
    from spark_glue.flights import data
    from spark_glue.flights.functions import ROTATIONS_SCHEMA, Rotations

    ROTATIONS_FIELDS[:] = [f.strip() for f in ROTATIONS_SCHEMA.split(",")]
    spark = (SparkSession.builder.master("local[2]").appName("tws_rotations")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.partitions))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    machine = h.machine_facts(("pyspark", "pyarrow"))
    try:
        source = data.to_spark(spark, data.load(args.limit)).cache()
        rows = source.count()
        with_tail = source.filter(F.col("tailnum").isNotNull())
        figures: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="aec-tws-") as tmp:
            start = time.perf_counter()
            result = process_keyed(source, Rotations(), key="aircraft", output_schema=ROTATIONS_SCHEMA,
                                   timestamp="event_time", order_by=data.ARRIVAL_ORDER,
                                   backend=RocksDBSpec(f"{tmp}/aec"), num_partitions=args.partitions,
                                   side_outputs={"no_tailnum": data_no_tailnum_schema()})  # fmt: skip
            aec_rows = result.collect()
            figures["aec_s"] = time.perf_counter() - start
            start = time.perf_counter()
            tws = with_tail.groupBy("aircraft").transformWithStateInPandas(
                statefulProcessor=tws_processor(), outputStructType=ROTATIONS_SCHEMA,
                outputMode="Append", timeMode="None",
            )  # fmt: skip
            tws_rows = tws.collect()
            figures["tws_s"] = time.perf_counter() - start
        same = normalized(aec_rows) == normalized(tws_rows)
        figures.update(rows=rows, output_rows=len(aec_rows), tws_output_rows=len(tws_rows), same_output=same,
                       speedup=figures["tws_s"] / figures["aec_s"])  # fmt: skip
    finally:
        spark.stop()
    print(f"{rows:,} rows: aec rotations {figures['aec_s']:.1f} s, Spark transformWithStateInPandas "
          f"{figures['tws_s']:.1f} s: aec {figures['speedup']:.1f}x faster; same output: {same} "
          f"({figures['output_rows']:,} / {figures['tws_output_rows']:,} rows)")  # fmt: skip
    report = {"benchmark": "tws_rotations", "date": h.now(), "machine": machine, "params": vars(args) | {
        "out": str(args.out)}, "results": figures}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tws_rotations.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0 if same else 1


def data_no_tailnum_schema() -> str:
    from spark_glue.flights.functions import NO_TAILNUM_SCHEMA

    return NO_TAILNUM_SCHEMA


if __name__ == "__main__":
    sys.exit(main())
