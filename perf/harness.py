"""The shared benchmark harness: rounds, samples, summaries, goals, reports, plots, profiles.

A bench file keeps only its workloads (the functions, the variants, how one variant runs,
its tables and plot) and uses this module for the rest:

* :func:`timed` runs one callable under the wall clock, the process CPU clock and a GC
  clock and returns a :class:`Sample`;
* :func:`run_rounds` runs every variant once per round for ``repeats`` rounds, rotating
  the variant order each round, so machine noise hits all variants alike (ratios measured
  side by side in one run);
* :func:`summarize` turns a variant's samples into best-of / median / per-CPU-second
  figures; :func:`paired` gives per-round ratios of two variants;
* :class:`BuildWorker` / :func:`serve_samples` run a bench's variants in one worker
  process per build (interpreted, compiled, another commit); :func:`worker_rounds`
  starts fresh workers each round, in alternating order, so neither build keeps the
  luck of one process (its memory layout, its place in each pair);
* :func:`build_roots`, :func:`check_worker` / :func:`check_roots` (refuse a build whose
  ``aec.compiled`` is wrong), :func:`build_row`, :func:`build_goals` and
  :func:`write_builds` serve a bench's ``--compiled DIR``: each figure on the interpreted
  and the compiled build, the speed-up, its goal, one table and one plot;
* :func:`goal` judges one measured figure against an ``at_least`` / ``at_most`` bound;
* :func:`machine_facts` (Python, CPUs, load average, package versions, git commit),
  :func:`md_table` and :func:`write_outputs` (JSON + Markdown + PNG) write the report;
* :class:`ThreadProfiler`, :func:`profile_call`, :func:`top_text` and
  :func:`profile_diff` (from ``perf/profiles.py``) explain a missed goal with cProfile.

Benchmarks are scripts, not tests: they print, write under ``perf/results/`` and never
fail a build.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profiles import ThreadProfiler, profile_call, profile_diff, top_text  # noqa: E402, F401 (re-exported)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results"
V = TypeVar("V")

# --- samples and rounds ---------------------------------------------------------------------


@dataclass
class Sample:
    """One timed run: wall seconds, process CPU seconds (all threads), records timed."""

    seconds: float
    cpu_seconds: float
    records: int
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        """Records per wall-clock second."""
        return self.records / self.seconds if self.seconds > 0 else float("inf")

    @property
    def cpu_rps(self) -> float:
        """Records per process CPU-second (other load on the machine inflates it little)."""
        return self.records / self.cpu_seconds if self.cpu_seconds > 0 else float("inf")


class GcClock:
    """Seconds spent in (and number of) garbage collections while entered."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.by_generation = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.by_generation[info["generation"]] += 1

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def timed(run: Callable[[], dict[str, Any] | None], records: int, collect: bool = True) -> Sample:
    """Time ``run()`` (wall and process CPU); its returned dict becomes the sample's metrics,
    plus ``gc_seconds`` and ``gc_runs``. ``collect``: a full GC first, so runs start alike."""
    if collect:
        gc.collect()
    with GcClock() as gc_clock:
        cpu, start = time.process_time(), time.perf_counter()
        metrics = run() or {}
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    metrics = dict(metrics, gc_seconds=gc_clock.seconds, gc_runs=gc_clock.by_generation)
    return Sample(seconds, cpu, records, metrics)


def run_rounds(
    variants: Sequence[V],
    run: Callable[[V], Sample],
    repeats: int,
    name: Callable[[V], str] = lambda v: v.name,  # type: ignore[attr-defined]
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> dict[str, list[Sample]]:
    """Every variant once per round, ``repeats`` rounds, the order rotated per round.

    Returns ``{name(variant): [Sample per round]}``."""
    samples: dict[str, list[Sample]] = {name(v): [] for v in variants}
    for rnd in range(repeats):
        for v in rotated(variants, rnd, repeats):
            sample = run(v)
            samples[name(v)].append(sample)
            log(sample_line(rnd, repeats, name(v), sample))
    return samples


def rotated(items: Sequence[V], rnd: int, repeats: int) -> list[V]:
    """``items`` in round ``rnd``'s order: rotated by ``rnd / repeats`` of their length,
    so each starts a round about equally often."""
    shift = (rnd * len(items)) // max(repeats, 1)
    return list(items[shift:]) + list(items[:shift])


def sample_line(rnd: int, repeats: int, name: str, sample: Sample) -> str:
    """The progress line of one timed run."""
    return (
        f"  round {rnd + 1}/{repeats} {name:<34} {sample.records:>8,} rec "
        f"{sample.seconds:>6.2f} s {sample.rps:>11,.0f} rec/s "
        f"({sample.cpu_seconds / sample.seconds:.2f} cores)"
    )


class BuildWorker:
    """A bench's worker process that imports aec from ``root``: a checkout (the
    interpreted build) or a copy with the compiled kernel built in place
    (``bin/build-compiled DEST``). It runs ``script *args`` (the same bench file for
    every build) with ``root`` on ``PYTHONPATH``; the script answers with
    :func:`serve_samples`; ``run(**request)`` sends one request and returns the worker's
    ``Sample``. Workers of two builds taking turns (:func:`worker_rounds`) compare the
    builds side by side in one run (each in its own process, so both pay the same)."""

    def __init__(
        self, root: Path, script: Path, args: Sequence[str], env: dict[str, str] | None = None
    ) -> None:
        env = dict(os.environ, **(env or {}), PYTHONPATH=str(root))
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args], cwd=root, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.hello: dict[str, Any] = self._answer()  # the worker's first line

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"bench worker {self.process.args} exited ({self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, **request: Any) -> Sample:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        a = self._answer()
        return Sample(a["seconds"], a["cpu_seconds"], a["records"], a["metrics"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=120)


def worker_rounds(
    script: Path,
    args: Sequence[str],
    roots: dict[str, Path],
    runs: Sequence[V],
    request: Callable[[V], dict[str, Any]],
    repeats: int,
    name: Callable[[V], str],
    check: Callable[[str, dict[str, Any]], None] = lambda build, hello: None,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> dict[str, list[Sample]]:
    """Every run of ``runs`` on every build of ``roots`` (label -> checkout), once per
    round for ``repeats`` rounds, in :class:`BuildWorker` processes started afresh each
    round (``check(label, hello)`` may refuse a worker by raising), both with the same
    ``PYTHONHASHSEED`` (the round's number: the same string hashes, so the same dict
    layouts, on both sides). The builds take turns run by run, the first of each pair
    alternating per round, and the run order rotates per round as in
    :func:`run_rounds`. Kept workers favoured one build: an A/A
    run (the same checkout twice) measured the second worker 3% slower on average and
    up to 13% on one row, even the plain dict loop, which runs no aec code.

    Returns ``{f"{name(run)}@{label}": [Sample per round]}``."""
    labels = list(roots)
    samples: dict[str, list[Sample]] = {f"{name(r)}@{b}": [] for r in runs for b in labels}
    for rnd in range(repeats):
        order = labels if rnd % 2 == 0 else labels[::-1]
        workers: dict[str, BuildWorker] = {}
        try:
            for label in order:
                workers[label] = BuildWorker(roots[label], script, args,
                                             {"PYTHONHASHSEED": str(rnd)})  # fmt: skip
                check(label, workers[label].hello)
            for r in rotated(runs, rnd, repeats):
                for label in order:
                    sample = workers[label].run(**request(r))
                    samples[f"{name(r)}@{label}"].append(sample)
                    log(sample_line(rnd, repeats, f"{name(r)}@{label}", sample))
        finally:
            for worker in workers.values():
                worker.close()
    return samples


def serve_samples(hello: dict[str, Any], run: Callable[[dict[str, Any]], Sample]) -> None:
    """A :class:`BuildWorker`'s side: print ``hello``, then answer every request line on
    stdin with ``run(request)``'s sample, one JSON line each (nothing else on stdout)."""
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        s = run(json.loads(line))
        answer = {"seconds": s.seconds, "cpu_seconds": s.cpu_seconds, "records": s.records,
                  "metrics": s.metrics}  # fmt: skip
        print(json.dumps(answer, default=str), flush=True)


def summarize(runs: Sequence[Sample]) -> dict[str, Any]:
    """Best-of and median records/s, best records per CPU-second, the best run's metrics."""
    rates = [s.rps for s in runs]
    best = max(range(len(runs)), key=lambda i: rates[i])
    return {
        "records": runs[best].records,
        "rps_samples": [round(r, 1) for r in rates],
        "best_rps": rates[best],
        "median_rps": statistics.median(rates),
        "cpu_rps": max(s.cpu_rps for s in runs),
        "cores_busy": runs[best].cpu_seconds / runs[best].seconds,
        "metrics": runs[best].metrics,
    }


def paired(samples: dict[str, list[Sample]], num: str, den: str) -> list[float]:
    """Per-round ratios num/den of records/s (the two ran in the same round)."""
    return [a.rps / b.rps for a, b in zip(samples.get(num, []), samples.get(den, []), strict=False)]


# --- goals ----------------------------------------------------------------------------------


def goal(
    text: str,
    value: float | None,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    cpu_value: float | None = None,
    per_round: Sequence[float] = (),
    unit: str = "x",
) -> dict[str, Any]:
    """A goal's verdict: ``value`` against ``at_least`` or ``at_most`` (None: not measured).

    ``cpu_value`` is the same figure in records per CPU-second (a second opinion on a
    loaded machine); ``per_round`` the paired per-round figures."""

    def ok(x: float | None) -> bool | None:
        if x is None:
            return None
        return (at_least is None or x >= at_least) and (at_most is None or x <= at_most)

    bound = f">= {at_least:g}{unit}" if at_least is not None else f"<= {at_most:g}{unit}"
    measured = (
        "not measured" if value is None else fmt_ratio(value) if unit == "x" else f"{value:,.0f}"
    )
    if per_round and len(per_round) > 1:
        measured += f" (per round {min(per_round):.2f}x..{max(per_round):.2f}x)"
    if cpu_value is not None:
        measured += (
            f"; per CPU-second {fmt_ratio(cpu_value) if unit == 'x' else f'{cpu_value:,.0f}'}"
        )
    return {
        "text": f"{text} {bound}",
        "value": value,
        "at_least": at_least,
        "at_most": at_most,
        "per_round": [round(r, 3) for r in per_round],
        "cpu_value": cpu_value,
        "met": ok(value),
        "met_cpu": ok(cpu_value),
        "measured": measured,
    }


def goal_lines(goals: dict[str, Any], profile: str | None = None) -> list[str]:
    """The Markdown "Goals" list (and where the profile of a missed goal is)."""
    lines = ["", "Goals:", ""]
    lines += [f"- {g['text']}: {g['measured']} -> **{verdict(g)}**" for g in goals.values()]
    if profile:
        lines += ["", f"A goal was missed: cProfile top functions in `{profile}`."]
    return lines


def verdict(g: dict[str, Any]) -> str:
    if g["met"] is None:
        return "n/a"
    if g["met"]:
        return "PASS"
    return "MISS (met per CPU-second: machine under load?)" if g.get("met_cpu") else "MISS"


# --- formatting and reports -----------------------------------------------------------------


def fmt_rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate:,.0f}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def fmt_load(load: Any) -> str:
    return "n/a" if not load else ", ".join(f"{x:.1f}" for x in load)


def md_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric_from: int = 1
) -> list[str]:
    """A Markdown table; columns from ``numeric_from`` on are right-aligned."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def git_commit() -> str | None:
    """The short HEAD commit, marked ``+dirty(aec/backends/spark_glue)`` when the engine,
    backends or glue have uncommitted changes; None outside a git checkout."""
    try:
        git = ["git", "-C", str(ROOT)]
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(git + ["status", "--porcelain", "--", "aec", "backends", "spark_glue"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty(aec/backends/spark_glue)" if dirty else "")


def machine_facts(packages: Sequence[str] = (), **extra: Any) -> dict[str, Any]:
    """Python, platform, CPUs, load average, the versions of ``packages``, the git commit."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    for package in packages:
        try:
            facts[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[package] = None
    facts["git_commit"] = git_commit()
    facts.update(extra)
    return facts


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def machine_line(report: dict[str, Any]) -> str:
    """One sentence for a Markdown report: date, Python, CPUs, load, commit."""
    m = report["machine"]
    return (
        f"{report['date']}, Python {m['python']}, {m['cpu_count']} CPUs (load average at start "
        f"{fmt_load(m.get('load_average'))}), commit {m['git_commit']}."
    )


def md_header(title: str, workload: str, report: dict[str, Any]) -> list[str]:
    """A report's title and first paragraph: the workload, rounds and machine."""
    rounds = report["params"]["repeats"]
    return [
        f"# {title}",
        "",
        f"{workload}; best of {rounds} interleaved rounds. {machine_line(report)}",
    ]


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--quick``, ``--repeats``, ``--seed``, ``--out``, ``--no-profile``."""
    parser.add_argument("--quick", action="store_true", help="smoke run, output to a temp dir")
    parser.add_argument("--repeats", type=int, help="interleaved rounds")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, help="output directory (default perf/results)")
    parser.add_argument(
        "--no-profile", action="store_true", help="skip the cProfile run when a goal is missed"
    )


def finish_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, name: str,
    defaults: dict[str, Any], quick: dict[str, Any],
) -> argparse.Namespace:  # fmt: skip
    """Fill unset options from ``quick`` or ``defaults``, check counts, choose ``--out``."""
    for key, value in (quick if args.quick else defaults).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for key in defaults:
        value = getattr(args, key)
        if isinstance(value, int) and value < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix=f"{name}_quick_")) if args.quick else RESULTS
    return args


def write_outputs(
    out: Path, name: str, report: dict[str, Any], markdown: str,
    plot: Callable[[Path], None] | None = None,
) -> None:  # fmt: skip
    """``<name>.json`` (every sample, machine facts), ``<name>.md`` and ``<name>.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown)
    if plot is not None:
        plot(out / f"{name}.png")
    print(f"\nwrote {out}/{name}.{{json,md{',png' if plot else ''}}}")


def write_profile(out: Path, name: str, text: str | None) -> str | None:
    """Write ``<name>_profile.txt`` (or remove a stale one when ``text`` is None)."""
    path = out / f"{name}_profile.txt"
    out.mkdir(parents=True, exist_ok=True)
    if text is None:
        if path.exists():
            path.unlink()
        return None
    path.write_text(text)
    print(f"profile written to {path}")
    return path.name


def run_checkouts(
    script: Path, argv: Sequence[str], trees: dict[str, Path], repeats: int,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
    check: Callable[[str, Any], None] = lambda name, output: None,
) -> dict[str, list[Any]]:  # fmt: skip
    """Run ``script argv`` (this venv's Python) once per round on each checkout of
    ``trees`` (name -> directory), in a fresh process with ``PYTHONPATH`` and
    ``AEC_CHECKOUT`` set to the checkout, the order alternating per round (the load
    hits both alike). The script prints JSON on its last line of stdout;
    ``check(name, that JSON)`` may refuse a run by raising.

    Returns ``{name: [that JSON per round]}``. Raises CalledProcessError when a run fails.
    """
    runs: dict[str, list[Any]] = {name: [] for name in trees}
    names = list(trees)
    for rnd in range(repeats):
        for name in names if rnd % 2 == 0 else names[::-1]:
            tree = str(trees[name])
            env = dict(os.environ, AEC_CHECKOUT=tree, PYTHONPATH=tree)
            log(f"round {rnd + 1}/{repeats}: {name} ({tree})")
            done = subprocess.run([sys.executable, str(script), *argv], env=env, check=True,
                                  capture_output=True, text=True)  # fmt: skip
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            check(name, runs[name][-1])
    return runs


# --- interpreted and compiled builds side by side (a bench's --compiled DIR) ----------------

BUILDS = ("interpreted", "compiled")  # the two builds' labels, the baseline first


def build_roots(compiled: Path) -> dict[str, Path]:
    """``--compiled DIR``'s builds: this checkout (interpreted) and DIR, a copy with the
    kernel compiled in place (``bin/with-venv bin/build-compiled DIR``)."""
    return {"interpreted": ROOT, "compiled": compiled.resolve()}


def add_compiled_arg(parser: argparse.ArgumentParser, what: str, name: str) -> None:
    """A bench's ``--compiled DIR`` option: ``what`` runs on both builds, side by side,
    into ``<name>_compiled.*``."""
    parser.add_argument(
        "--compiled", type=Path, metavar="DIR",
        help=f"DIR holds the compiled build (bin/with-venv bin/build-compiled DIR): {what} on "
        f"this checkout's interpreted build and on DIR's, side by side; writes {name}_compiled.*",
    )  # fmt: skip


def build_hello() -> dict[str, Any]:
    """What a worker says of the aec it imported: ``aec.compiled`` (False in commits
    from before the attribute) and where aec came from."""
    import aec

    return {"compiled": bool(getattr(aec, "compiled", False)), "aec": aec.__file__}


def check_build(label: str, compiled: bool, where: str) -> None:
    """Refuse (SystemExit) a build whose ``aec.compiled`` is not what ``label`` (of
    ``BUILDS``) says: the interpreted build must not be compiled, the compiled one must."""
    if bool(compiled) != (label == "compiled"):
        raise SystemExit(
            f"{where}: aec.compiled is {compiled} in the {label} build; --compiled DIR "
            "wants DIR made by `bin/with-venv bin/build-compiled DIR` (the interpreted "
            "build is this checkout)"
        )


def check_worker(roots: dict[str, Path]) -> Callable[[str, dict[str, Any]], None]:
    """The ``check`` of :func:`worker_rounds` or :func:`run_checkouts` for the builds
    of ``roots`` (:func:`build_roots`): :func:`check_build` on what a worker said of its
    aec (:func:`build_hello`'s keys)."""

    def check(label: str, said: dict[str, Any]) -> None:
        check_build(label, said["compiled"], f"{roots[label]} ({said['aec']})")

    return check


def check_roots(roots: dict[str, Path]) -> None:
    """:func:`check_worker` on each of ``roots`` before any run: a process with
    ``PYTHONPATH`` set to the build says which aec it imports."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import harness; "
            "print(json.dumps(harness.build_hello()))")  # fmt: skip
    for label, root in roots.items():
        done = subprocess.run([sys.executable, "-c", code, str(ROOT / "perf")], cwd=root,
                              env=dict(os.environ, PYTHONPATH=str(root)),
                              capture_output=True, text=True, check=True)  # fmt: skip
        check_worker(roots)(label, json.loads(done.stdout.strip().splitlines()[-1]))


def build_row(
    measure: str, variant: str, clock: str, rounds: dict[str, Sequence[float]],
    judged: bool, lower_is_better: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One figure on both builds. ``rounds``: build label (``BUILDS``) -> the figure per
    round (records/s, or seconds with ``lower_is_better``). Gives each build's best
    round and the compiled build's speed-up (compiled / interpreted records/s, or
    interpreted / compiled seconds), best over best and per round; ``judged``: a goal
    reads the speed-up (:func:`build_goals`)."""
    best = min if lower_is_better else max
    old, new = (list(rounds[b]) for b in BUILDS)

    def speedup(a: float, b: float) -> float:  # a interpreted, b compiled
        return a / b if lower_is_better else b / a

    return {"measure": measure, "variant": variant, "clock": clock, "judged": judged,
            "lower_is_better": lower_is_better, "rounds": {"interpreted": old, "compiled": new},
            "interpreted": best(old), "compiled": best(new), "ratio": speedup(best(old), best(new)),
            "per_round": [speedup(a, b) for a, b in zip(old, new, strict=False)]}  # fmt: skip


def build_goals(rows: list[dict[str, Any]], text: str, at_least: float) -> dict[str, Any]:
    """One goal per judged row of :func:`build_row`: its speed-up >= ``at_least``."""
    goals = {}
    for r in rows:
        if r["judged"]:
            r["goal"] = f"{r['measure']}: {r['variant']}"
            goals[r["goal"]] = goal(f"{r['measure']}, {r['variant']}: {text}", r["ratio"],
                                    at_least=at_least, per_round=r["per_round"])  # fmt: skip
    return goals


def write_builds(
    out: Path, name: str, title: str, workload: str, machine: dict[str, Any],
    params: dict[str, Any], rows: list[dict[str, Any]], goals: dict[str, Any],
    at_least: float, notes: Sequence[str] = (), unit: str = "records/s", **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """Print and write ``<name>.{json,md,png}`` of the builds side by side: the table of
    ``rows`` (measure, variant, clock, each build's best in ``unit``, the speed-up and
    its goal's verdict), ``notes`` (Markdown lines) and the goal lines; the plot, the
    speed-up per row with a line at ``at_least``. ``machine``: :func:`machine_facts`
    at the start; ``params`` must hold ``repeats``; ``extra`` goes into the JSON.
    Returns the report."""
    report = {"benchmark": name, "date": now(), "machine": machine, "params": params,
              "rows": rows, "goals": goals, **extra}  # fmt: skip
    seconds = any(r["lower_is_better"] for r in rows)
    show = (lambda x: f"{x:,.2f}") if unit == "s" else fmt_rate
    table = md_table(
        ["measure", "variant", "clock", f"interpreted {unit}", f"compiled {unit}",
         "interpreted / compiled" if seconds else "compiled / interpreted", "goal verdict"],
        [[r["measure"], r["variant"], r["clock"], show(r["interpreted"]), show(r["compiled"]),
          fmt_ratio(r["ratio"]), verdict(goals[r["goal"]]) if r.get("goal") else "shown"]
         for r in rows],
        numeric_from=3,
    )  # fmt: skip
    print("\n" + "\n".join(table) + "\n")
    for g in goals.values():
        print(f"{verdict(g)}: {g['text']}: {g['measured']}")
    lines = [*md_header(title, workload, report), "", *notes, *([""] if notes else []), *table,
             *goal_lines(goals)]  # fmt: skip
    write_outputs(out, name, report, "\n".join(lines) + "\n",
                  lambda path: builds_plot(rows, goals, at_least, title, path))  # fmt: skip
    return report


def builds_plot(
    rows: list[dict[str, Any]], goals: dict[str, Any], at_least: float, title: str, path: Path
) -> None:
    """Horizontal bars: each row's speed-up (green: its goal met, red: missed, grey:
    shown, not judged), a dashed line at ``at_least``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.32 * len(rows)))
    names = [f"{r['measure']}: {r['variant']}" for r in rows]
    colors = ["tab:grey" if not r.get("goal") else "tab:green" if goals[r["goal"]]["met"]
              else "tab:red" for r in rows]  # fmt: skip
    ax.barh(names, [r["ratio"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        ax.annotate(fmt_ratio(r["ratio"]), (r["ratio"], i), fontsize=7, va="center",
                    xytext=(3, 0), textcoords="offset points")  # fmt: skip
    ax.axvline(at_least, color="red", linestyle="--", linewidth=1, label=f"goal {at_least:g}x")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("compiled build's speed-up over the interpreted one (best round each)")
    ax.set_title(f"{title} (green: goal met, red: missed, grey: shown)", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path)


# --- plots ----------------------------------------------------------------------------------


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def short_rate(y: float) -> str:
    return (
        f"{y / 1e6:.2f}M" if y >= 1e6 else f"{y / 1000:.1f}k" if y < 10_000 else f"{y / 1000:.0f}k"
    )


def bars(ax: Any, xs: Sequence[float], ys: Sequence[float], width: float = 0.8, **kw: Any) -> None:
    """Bars annotated with their short rates."""
    for bar, y in zip(ax.bar(xs, ys, width, **kw), ys, strict=True):
        ax.annotate(short_rate(y), (bar.get_x() + bar.get_width() / 2, y), ha="center",
                    va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")  # fmt: skip


def save(fig: Any, path: Path, dpi: int = 115) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def points(ax: Any, pts: Sequence[tuple[float, float]], **kw: Any) -> None:
    """A line through ``(x, records/s)`` points, each annotated with its rate."""
    if not pts:
        return
    ax.plot(*zip(*pts, strict=True), marker="o", **kw)
    for x, y in pts:
        ax.annotate(f"{y:,.0f}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
