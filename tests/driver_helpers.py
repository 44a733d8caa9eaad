"""Shared by the tests that start their own Spark driver in a subprocess (a JVM hosts one
SparkContext, and the test session's ``local[2]`` one is taken)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = Path(__file__).resolve().parent / "drivers"


def driver_env(**extra: str) -> dict[str, str]:
    """The environment of a driver subprocess: this checkout first on PYTHONPATH (Spark's
    Python workers inherit it, so executors import the same code as the driver, even when
    the venv's editable install points at another checkout), the test interpreter as
    Spark's Python, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYSPARK_PYTHON"] = sys.executable
    env.update(extra)
    return env


FLIGHTS_DATASETS = (
    "route_hourly", "late", "rotations", "no_tailnum", "aircraft_sessions", "late_sessions",
)  # fmt: skip


def flights_differences(first: str | Path, second: str | Path) -> list[str]:
    """The ``aec flights`` datasets whose rows differ between two output directories
    (row for row as multisets; a dataset missing from either counts as different)."""
    from spark_glue.flights.job import dataset_rows

    differing = []
    for name in FLIGHTS_DATASETS:
        a, b = Path(first) / name, Path(second) / name
        if not (a.is_dir() and b.is_dir()) or dataset_rows(str(a)) != dataset_rows(str(b)):
            differing.append(name)
    return differing


def aec_command(*args: str, env: dict[str, str] | None = None, timeout: float = 600):
    """Run the ``aec`` console script of this environment (as a user does)."""
    import subprocess

    command = [str(Path(sys.executable).parent / "aec"), *args]
    return subprocess.run(
        command, env=env or driver_env(), capture_output=True, text=True, timeout=timeout
    )
