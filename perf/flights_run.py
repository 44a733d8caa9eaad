"""One run of the flights job for ``perf/bench_flights.py``, in its own driver process.

``python perf/flights_run.py OUT [LIMIT]`` with ``PYTHONPATH`` naming the checkout to
run: starts the command's SparkSession (timed apart), runs ``spark_glue.flights.job.run``
into ``OUT`` and prints one JSON line: ``session_s``, ``wall_s`` (the job, session start
excluded), ``load_s``, ``steps`` (wall seconds per progress step), ``engine_s`` (per
operator, its slowest partition's ``elapsed_s``), ``workers_cpu_s`` (the Python workers'
CPU seconds, each pass counted once), ``tree_cpu_s`` (the CPU seconds of this process
and its descendants, the JVM and its Python workers, during the job) and ``aec``: which
aec the driver and the Spark Python workers (two tasks after the job) imported,
``[aec.compiled, aec.__file__]`` each. Works with checkouts before ``write_keyed`` too.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> float:
    """CPU seconds of this process and every descendant (``/proc``): each live process's
    own time plus what its reaped children used (Linux only; 0.0 elsewhere)."""
    processes: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        processes[int(name)] = (int(fields[1]), ticks)
    total, stack = 0, [os.getpid()]
    while stack:
        pid = stack.pop()
        total += processes.get(pid, (0, 0))[1]
        stack += [child for child, (parent, _) in processes.items() if parent == pid]
    return total / _TICK


def aec_build(_: object = None) -> list[object]:
    """``[aec.compiled, aec.__file__]`` where this runs (a Spark Python worker too: a
    function of ``__main__`` travels by value, so the worker imports its own aec)."""
    import aec

    return [bool(getattr(aec, "compiled", False)), aec.__file__]


def main() -> None:
    warnings.filterwarnings("ignore")
    out = sys.argv[1]
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else None
    import spark_glue  # noqa: F401  (sets PYSPARK_PYTHON before Spark starts)
    from spark_glue.flights import job
    from spark_glue.session import command_session

    started = time.perf_counter()
    spark, _ = command_session(2)
    session_s = time.perf_counter() - started
    cpu = tree_cpu_s()
    marks: list[tuple[str, float]] = [("start", time.perf_counter())]
    run = job.run(spark, job.FlightsOptions(out=out, limit=limit),
                  lambda name: marks.append((name, time.perf_counter())))  # fmt: skip
    steps: dict[str, float] = {}
    for (_, before), (name, at) in zip(marks, marks[1:], strict=False):
        steps[name.replace("loaded the flights table", "load")] = at - before
    cpu = tree_cpu_s() - cpu
    engine = {s.name: float(s.metrics["elapsed_s"].max()) for s in run.stages}
    workers, seen = 0.0, set()
    for stage in run.stages:
        group = getattr(stage, "step", None) or stage.name
        if group not in seen and "cpu_s" in stage.metrics:
            seen.add(group)
            workers += float(stage.metrics["cpu_s"].sum())
    builds = {"driver": aec_build(),
              "workers": spark.sparkContext.parallelize(range(2), 2).map(aec_build).collect()}  # fmt: skip
    spark.stop()
    print(json.dumps({"session_s": session_s, "wall_s": run.wall_s, "load_s": run.load_s,
                      "steps": steps, "engine_s": engine, "workers_cpu_s": workers,
                      "tree_cpu_s": cpu, "aec": builds}))  # fmt: skip


if __name__ == "__main__":
    main()
