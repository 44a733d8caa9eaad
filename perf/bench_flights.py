"""The flights job's wall time, step by step, this checkout against another one side by side.

Each run is a fresh driver process (``perf/flights_run.py`` with ``PYTHONPATH`` set to
the checkout): it starts the command's SparkSession (``spark_glue.session``, 2
partitions, ``local[*]``), which is timed apart, then ``spark_glue.flights.job.run``
on the full year (or ``--limit``) with its default backend (RocksDB), and prints the
job's figures as JSON: wall time excluding the session start (the goal: <= 20 s), the
load step, each step's wall time, each operator's engine seconds (slowest partition)
and the Python workers' CPU seconds, with the CPU seconds of the whole
process tree (driver, JVM, Python workers; read from ``/proc``,
``flights_run.tree_cpu_s``), which the load of a shared
machine inflates much less than wall time.

Variants: ``this`` (this checkout) and, with ``--base DIR``, a checkout of another
commit (``git worktree add`` or ``git archive | tar -x``; the venv is this one's),
alternated round by round. The outputs of every run are compared with the first
``this`` run's (all six datasets as multisets of rows): a run that wrote other rows
fails the benchmark.

Goal: job wall time (session start excluded) <= 20 s.

``--compiled DIR`` (a copy with the compiled kernel, ``bin/build-compiled DIR``) runs
``interpreted`` (this checkout) and ``compiled`` (DIR) alternately instead, with the same
rows check; ``flights_run`` says which aec the driver and the Spark Python workers
imported, and a run on the wrong build stops the benchmark. Goal: interpreted /
compiled of the job's engine seconds (the sum over the operators, best round each) >=
1.5x; each operator's, the job's wall time and the CPU seconds shown
(``bench_flights_compiled.{json,md,png}``).

Usage::

    .venv/bin/python perf/bench_flights.py                        # this checkout, 3 rounds
    .venv/bin/python perf/bench_flights.py --base /tmp/aec-base   # side by side
    .venv/bin/python perf/bench_flights.py --quick                # 20,000 rows, 1 round
    bin/with-venv bin/build-compiled /tmp/aec-compiled            # then: the two builds
    .venv/bin/python perf/bench_flights.py --compiled /tmp/aec-compiled
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

DEFAULTS = {"repeats": 3}
QUICK = {"repeats": 1, "limit": 20_000}
GOAL_S = 20.0
COMPILED_GOAL = 1.5  # interpreted / compiled of the job's engine seconds (all operators)
RUNNER = Path(__file__).resolve().parent / "flights_run.py"
DATASETS = ("route_hourly", "late", "rotations", "no_tailnum", "aircraft_sessions", "late_sessions")


def run_once(checkout: Path, out: Path, limit: int | None) -> dict[str, Any]:
    """One driver process on ``checkout``; its JSON plus tree CPU and load average."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PYSPARK_PYTHON=sys.executable)
    argv = [sys.executable, str(RUNNER), str(out)] + ([str(limit)] if limit else [])
    load = os.getloadavg()
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, cwd=str(checkout))  # fmt: skip
    stdout = process.stdout.read() if process.stdout is not None else ""
    status = process.wait()
    if status != 0:
        raise RuntimeError(f"flights run on {checkout} failed (status {status})")
    figures = json.loads(stdout.strip().splitlines()[-1])
    figures.update(process_s=time.perf_counter() - started, load_before=load)
    return figures


def same_rows(a: Path, b: Path) -> list[str]:
    """Datasets whose rows differ (as multisets) between two output directories."""
    from spark_glue.flights.job import dataset_rows

    return [d for d in DATASETS if dataset_rows(str(a / d)) != dataset_rows(str(b / d))]


def workload(params: dict[str, Any]) -> str:
    size = "full year" if not params["limit"] else f"first {params['limit']:,} rows"
    return f"aec flights, {size}, RocksDB, 2 partitions"


def runs_lines(report: dict[str, Any]) -> list[str]:
    """Markdown: each variant's best run, step by step, and whether the outputs agreed."""
    rows = []
    for name, runs in report["runs"].items():
        best = min(runs, key=lambda r: r["wall_s"])
        steps = ", ".join(f"{k} {v:.1f}" for k, v in best["steps"].items())
        engine = ", ".join(f"{k} {v:.1f}" for k, v in best["engine_s"].items())
        rows.append([name, f"{best['wall_s']:.1f}", " / ".join(f"{r['wall_s']:.1f}" for r in runs),
                     f"{best['load_s']:.1f}", steps, engine, f"{best['tree_cpu_s']:.0f}",
                     f"{best['workers_cpu_s']:.0f}", h.fmt_load(best["load_before"])])  # fmt: skip
    return [
        *h.md_table(
            [
                "variant",
                "job wall s (best)",
                "every round",
                "load s",
                "steps s",
                "engine s (slowest partition)",
                "tree CPU s",
                "workers CPU s",
                "load average",
            ],
            rows,
        ),  # fmt: skip
        "",
        "Job wall time excludes the Spark session start. Tree CPU: the driver process and "
        "its descendants (JVM, Python workers) during the job (/proc).",
        f"Outputs: {report['outputs']}.",
    ]


def markdown(report: dict[str, Any]) -> str:
    title = "bench_flights: the flights job, step by step"
    lines = [*h.md_header(title, workload(report["params"]), report), "", *runs_lines(report),
             "", *h.goal_lines(report["goals"])]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = h.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(report["runs"])
    bottoms = [0.0] * len(names)
    for step in dict.fromkeys(s for n in names for r in report["runs"][n] for s in r["steps"]):
        values = [min(report["runs"][n], key=lambda r: r["wall_s"])["steps"].get(step, 0.0)
                  for n in names]  # fmt: skip
        ax.bar(names, values, bottom=bottoms, label=step)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.axhline(GOAL_S, color="red", linestyle="--", linewidth=1, label=f"goal {GOAL_S:g} s")
    ax.set_ylabel("seconds (best round)")
    ax.set_title("aec flights: job wall time by step", fontsize=10)
    ax.legend(fontsize=8)
    h.save(fig, path)


def check_run(label: str, figures: dict[str, Any]) -> None:
    """``--compiled``: refuse a run whose driver or Spark Python workers imported the
    other build (``flights_run``'s ``aec``)."""
    seen = figures["aec"]
    for where, (compiled, path) in [("driver", seen["driver"]),
                                    *(("Spark Python worker", w) for w in seen["workers"])]:  # fmt: skip
        h.check_build(label, compiled, f"{where} ({path})")


def compiled_report(
    args: argparse.Namespace, variants: dict[str, Path], report: dict[str, Any]
) -> None:
    """``--compiled``: the engine seconds (each operator's and their sum, judged), the
    job's wall time and CPU seconds on both builds, best round each."""
    runs = report["runs"]

    def row(measure: str, name: str, clock: str, figure: Any, judged: bool = False) -> dict:
        return h.build_row(measure, name, clock, {b: [figure(r) for r in runs[b]] for b in runs},
                           judged, lower_is_better=True)  # fmt: skip

    rows = [row("engine s (slowest partition)", op, "wall", lambda r, op=op: r["engine_s"][op])
            for op in runs["interpreted"][0]["engine_s"]]  # fmt: skip
    rows += [
        row("aec flights engine s", "all operators (sum)", "wall",
            lambda r: sum(r["engine_s"].values()), judged=True),
        row("job wall s", "session start excluded", "wall", lambda r: r["wall_s"]),
        row("Python workers CPU s", "every pass", "cpu", lambda r: r["workers_cpu_s"]),
        row("process tree CPU s", "driver, JVM, workers", "cpu", lambda r: r["tree_cpu_s"]),
    ]  # fmt: skip
    goals = h.build_goals(rows, "interpreted / compiled seconds", COMPILED_GOAL)
    seen = "; ".join(f"{b}: the driver {rs[0]['aec']['driver'][1]}, the Spark Python workers "
                     + ", ".join(sorted({path for _, path in rs[0]["aec"]["workers"]}))
                     for b, rs in runs.items())  # fmt: skip
    h.write_builds(
        args.out, "bench_flights_compiled", "bench_flights: interpreted and compiled builds",
        workload(report["params"]) + "; a fresh driver per build and round",
        report["machine"], report["params"], rows, goals, COMPILED_GOAL,
        notes=["Seconds, lower is better; the ratio is interpreted / compiled. Engine s: each "
               "operator's slowest partition (`elapsed_s`). Every run checked that its driver "
               f"and Spark Python workers imported the right build ({seen}).",
               "", *runs_lines(report)],
        unit="s", runs=runs, outputs=report["outputs"],
        builds={b: str(root) for b, root in variants.items()},
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="a checkout of another commit to compare with")
    h.add_compiled_arg(parser, "the job, a round each in turn,", "bench_flights")
    parser.add_argument("--limit", type=int, help="first rows of the table (default: all)")
    h.add_common_args(parser)
    args = h.finish_args(parser, parser.parse_args(argv), "bench_flights", DEFAULTS, QUICK)
    if args.base is not None and args.compiled is not None:
        parser.error("--base and --compiled compare two checkouts each: give one")
    machine = h.machine_facts(("pyspark", "pyarrow", "rocksdict"))
    variants = {"this": h.ROOT}
    if args.base is not None:
        variants["base"] = args.base.resolve()
    if args.compiled is not None:
        variants = h.build_roots(args.compiled)
        h.check_roots(variants)
    scratch = Path(tempfile.mkdtemp(prefix="aec-bench-flights-"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    reference = scratch / "reference"
    differing: dict[str, list[str]] = {}
    try:
        for rnd in range(args.repeats):
            order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
            for name in order:
                out = scratch / f"{name}-{rnd}"
                figures = run_once(variants[name], out, args.limit)
                if args.compiled is not None:
                    check_run(name, figures)
                runs[name].append(figures)
                print(f"  round {rnd + 1}/{args.repeats} {name:<5} job {figures['wall_s']:6.1f} s "
                      f"(load {figures['load_s']:.1f}; " + ", ".join(
                          f"{k} {v:.1f}" for k, v in figures["steps"].items()) +
                      f"); tree CPU {figures['tree_cpu_s']:.0f} s; load average "
                      f"{h.fmt_load(figures['load_before'])}", flush=True)  # fmt: skip
                if not reference.exists():
                    out.rename(reference)
                else:
                    wrong = same_rows(out, reference)
                    if wrong:
                        differing[f"{name} round {rnd + 1}"] = wrong
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    outputs = ("identical in every run (six datasets as multisets of rows)" if not differing
               else f"DIFFERENT: {differing}")  # fmt: skip
    report = {"benchmark": "bench_flights", "date": h.now(), "machine": machine,
              "params": {"repeats": args.repeats, "limit": args.limit,
                         "base": str(args.base) if args.base else None,
                         "compiled": str(args.compiled) if args.compiled else None},
              "runs": runs, "outputs": outputs}  # fmt: skip
    if args.compiled is not None:
        compiled_report(args, variants, report)
        print(f"outputs: {outputs}")
        return 1 if differing else 0
    best = min(r["wall_s"] for r in runs["this"])
    goals = {"job": h.goal("flights job wall time, session start excluded", best,
                           at_most=GOAL_S, unit=" s")}  # fmt: skip
    goals["job"]["measured"] = f"{best:.1f} s (best of {args.repeats})"
    report["goals"] = goals
    for g in goals.values():
        print(f"{h.verdict(g)}: {g['text']}: {g['measured']}")
    print(f"outputs: {outputs}")
    h.write_outputs(args.out, "bench_flights", report, markdown(report), lambda p: plot(report, p))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
