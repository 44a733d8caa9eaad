"""process_keyed and process_keyed_stream on a multi-process cluster (``local-cluster``),
and the ``aec`` command's session settings (``--master``, spark-submit's settings)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest
from driver_helpers import DRIVERS, ROOT, driver_env

from spark_glue.session import (
    DEFAULT_JAVA_OPTIONS,
    DEFAULT_MASTER,
    java_options_given,
    launch_java_options,
    session_settings,
)

DRIVER = DRIVERS / "cluster_driver.py"
MASTER = "local-cluster[2,1,1024]"


def _running_counts(rows):
    """The plain Python answer: per key, count and sum of x so far, in seq order."""
    count, total, out = defaultdict(int), defaultdict(int), []
    for r in sorted(rows, key=lambda r: r["seq"]):
        count[r["k"]] += 1
        total[r["k"]] += r["x"]
        out.append({"k": r["k"], "seq": r["seq"], "count": count[r["k"]], "total": total[r["k"]]})
    return out


@pytest.mark.spark
def test_process_keyed_and_stream_on_a_local_cluster(tmp_path):
    env = driver_env(
        PYSPARK_SUBMIT_ARGS=f"--master {MASTER} --conf spark.sql.shuffle.partitions=3 pyspark-shell"
    )
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    # the submitted settings won over the command's defaults (local[*], 2 partitions)
    assert result["master"] == MASTER
    assert result["shuffle_partitions"] == "3"
    # two executor JVMs besides the driver's, running this checkout's code
    executors = result["executors"]
    assert len(set(executors)) == 2 and result["driver_jvm"] not in executors
    assert all(pid > 1 for pid in executors)
    assert result["executor_code"] == [str(ROOT / "spark_glue")]

    import importlib.util

    spec = importlib.util.spec_from_file_location("cluster_driver", DRIVER)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    expected = _running_counts(driver.rows())

    def key(r):
        return r["seq"]

    assert sorted(result["batch"], key=key) == expected
    assert result["stream_batches"] == [0, 1, 2]
    assert sorted(result["stream"], key=key) == expected


def test_session_settings_honour_submitted_ones():
    assert session_settings(4, None, {})["spark.master"] == DEFAULT_MASTER
    assert session_settings(4, None, {})["spark.sql.shuffle.partitions"] == "4"
    submitted = {"spark.master": "yarn", "spark.sql.shuffle.partitions": "64"}
    settings = session_settings(4, None, submitted)
    assert "spark.master" not in settings and "spark.sql.shuffle.partitions" not in settings
    assert settings["spark.sql.session.timeZone"] == "UTC"
    assert settings["spark.app.name"] == "aec flights"
    assert "spark.app.name" not in session_settings(4, None, {"spark.app.name": "nightly"})
    # an explicit --master is the one setting that overrides
    assert session_settings(4, MASTER, submitted)["spark.master"] == MASTER
    with pytest.raises(ValueError, match="master"):
        session_settings(4, " ", {})
    with pytest.raises(ValueError, match="partitions"):
        session_settings(0, None, {})


def test_the_jit_default_yields_to_the_users_java_options():
    assert not java_options_given("pyspark-shell", "")
    assert not java_options_given("--master local[2] pyspark-shell", "spark.driver.memory 4g\n")
    assert java_options_given("--driver-java-options -Xss4m pyspark-shell", "")
    assert java_options_given("--conf spark.driver.extraJavaOptions=-Xss4m pyspark-shell", "")
    assert java_options_given("", "# comment\nspark.driver.extraJavaOptions  -Xss4m\n")
    assert not java_options_given("", "# spark.driver.extraJavaOptions -Xss4m\n")


def test_the_launch_sets_the_jit_default_unless_told_not_to_or_the_user_chose():
    assert launch_java_options(DEFAULT_JAVA_OPTIONS, "pyspark-shell", "") == DEFAULT_JAVA_OPTIONS
    assert launch_java_options(None, "pyspark-shell", "") is None  # the JVM's own JIT
    given = "--driver-java-options -Xss4m pyspark-shell"
    assert launch_java_options(DEFAULT_JAVA_OPTIONS, given, "") is None


def test_cli_passes_master():
    from spark_glue.cli import build_parser

    args = build_parser().parse_args(["flights", "--out", "x", "--master", MASTER])
    assert args.master == MASTER
    assert build_parser().parse_args(["flights", "--out", "x"]).master is None
