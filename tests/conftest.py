"""Shared fixtures: hypothesis profiles and one Spark session per test run."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# `ci` keeps the suite fast; `thorough` (HYPOTHESIS_PROFILE=thorough) runs many more examples.
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
_THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"


def pytest_collection_modifyitems(items):
    """Under the thorough profile a property runs 50x more examples: the ci-sized
    per-test timeout (pyproject's 600 s) would cut slow ones short (the real-I/O
    equivalence property alone takes ~9 minutes on 2 idle cores)."""
    if not _THOROUGH:
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(3600))

# Spark's Python workers must run this interpreter (it has pyarrow and aec).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole run, UI off, Arrow on."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("aec-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def redis_server():
    """One redis-server per test module (stopped by PID); a missing binary fails in CI
    and skips locally with a loud reason."""
    import warnings

    from backends.redis_server import LocalRedisServer

    try:
        server = LocalRedisServer().start()
    except FileNotFoundError as exc:
        if _in_ci():
            raise
        reason = f"!!! REDIS BACKEND TESTS SKIPPED: {exc} (they fail instead when CI=true)"
        warnings.warn(reason, stacklevel=1)
        pytest.skip(reason)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """One moto S3 server process on loopback for the whole run (stopped by PID)."""
    from s3_server import S3Server

    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket on the session's S3 server, with the AWS variables set for this
    test: ``(server, bucket)``. ``f"s3://{bucket}/prefix"`` is a checkpoint URI."""
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    return s3_server, s3_server.create_bucket()


@pytest.fixture
def default_interpreter_settings(monkeypatch):
    """CPython's defaults (young GC threshold 700, switch interval 5 ms) and no operator
    counted as open (earlier tests may leave some never closed), for a test of
    ``aec.runtime.interpreter_tuning``; the process's own settings come back after it."""
    import gc

    from aec.runtime import interpreter_tuning

    monkeypatch.setattr(interpreter_tuning, "_users", 0)
    monkeypatch.setattr(interpreter_tuning, "_saved_threshold", None)
    monkeypatch.setattr(interpreter_tuning, "_saved_interval", None)
    saved_threshold, saved_interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(700, *saved_threshold[1:])
    sys.setswitchinterval(0.005)
    try:
        yield interpreter_tuning
    finally:
        gc.set_threshold(*saved_threshold)
        sys.setswitchinterval(saved_interval)
