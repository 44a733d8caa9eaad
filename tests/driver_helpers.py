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
