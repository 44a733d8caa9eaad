"""Every script in examples/ runs and prints what its comments promise.

The engine-only ones run as a user runs them (a child ``python examples/x.py``);
the Spark ones run in this process against the session fixture (their
``getOrCreate()`` picks it up), which saves a JVM start each.
"""

from __future__ import annotations

import os
import pathlib
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _run_script(name: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_in_process(name: str, spark, capsys) -> list[str]:
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="aec_example")["main"]()
    finally:  # the example's builder options land on the shared session: put them back
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    return capsys.readouterr().out.splitlines()


def test_every_example_is_tested():
    tested = {
        "keyed_counter.py",
        "check_equivalence.py",
        "spark_batch.py",
        "spark_streaming.py",
        "windows_late_data.py",
        "external_call.py",
        "spark_connect.py",
        "state_as_data.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_keyed_counter_in_both_styles():
    out = _run_script("keyed_counter.py").splitlines()
    expected = "[('a', 1), ('b', 1), ('a', 2), Watermark(timestamp=10), ('b', 2), Watermark(timestamp=inf)]"
    assert out[0] == f"callbacks: {expected}"
    assert out[1] == f"async def: {expected}"
    assert out[2].startswith("batches: ")


def test_check_equivalence_passes_the_right_function_and_catches_the_bug():
    out = _run_script("check_equivalence.py").splitlines()
    assert out[0] == "RunningTotal: the async runs equal the synchronous run"
    assert out[1].startswith("LeakyTotal: async run differs from the synchronous run")


def test_windows_with_late_firing_and_late_side_output():
    out = _run_script("windows_late_data.py").splitlines()
    assert out == [
        "outputs: [16.0, 5.0, Watermark(timestamp=3600.0), 24.0, Watermark(timestamp=4500.0), "
        "9.0, Watermark(timestamp=inf)]",
        "late: [7.0]",
    ]


def test_external_call_against_a_local_aiohttp_service():
    out = _run_script("external_call.py").splitlines()
    assert out == [
        "first of N14228: [('N14228', 'EWR', 3.9, 1), ('N14228', 'JFK', 4.5, 2)]",
        "records: 100 per key same as sync: True",
    ]


@pytest.mark.spark
def test_spark_batch(spark, capsys):
    out = _run_in_process("spark_batch.py", spark, capsys)
    assert out == [
        "s1 0.0 3.0",
        "s1 3600.0 4.0",
        "s2 0.0 5.0",
        "s2 3600.0 1.0",
        "late: s1 100.0",
    ]


@pytest.mark.spark
def test_spark_streaming_continues_from_its_checkpoint(spark, capsys):
    out = _run_in_process("spark_streaming.py", spark, capsys)
    assert out == [
        "first run:  [('ann', 1, 1), ('bob', 2, 1), ('ann', 3, 2)]",
        "second run: [('bob', 4, 2), ('ann', 5, 3)]",
    ]


@pytest.mark.spark
@pytest.mark.timeout(1800)  # three stream queries on a busy 2-core machine
def test_state_as_data_reads_the_flights_stream_and_bootstraps_a_query(spark, capsys):
    out = _run_in_process("state_as_data.py", spark, capsys)
    schema = [line.strip() for line in out[: out.index("")] if line.strip()]
    assert schema == [
        "root",
        "|-- key: string (nullable = true)",
        "|-- key_group: integer (nullable = true)",
        "|-- state: string (nullable = true)",
        "|-- namespace: string (nullable = true)",
        "|-- user_key: string (nullable = true)",
        "|-- value: string (nullable = true)",
        "|-- value_pickle: binary (nullable = true)",
    ]
    assert out[out.index("") + 1 :] == [
        "aircraft in the rotations state: 508",
        "where they landed last: ORD 36, ATL 32, LAX 28",
        "next 300 departures: 300 rotations, 126 with a previous leg",
        "first flights whose previous leg came from the checkpoint: 113",
    ]


@pytest.mark.spark
@pytest.mark.connect
def test_spark_connect_runs_on_a_local_connect_server():
    # a child process: a Connect client turns the whole process to Connect mode
    out = _run_script("spark_connect.py").splitlines()
    assert out == [
        "session: pyspark.sql.connect.session",
        "ann 1 10",
        "bob 2 5",
        "ann 3 17",
        "bob 4 6",
        "ann 5 20",
    ]
