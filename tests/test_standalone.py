"""The glue on Spark's standalone cluster manager, as teams deploy it: a master and two
workers, each a separate process on loopback (``tests/spark_servers.py``), executors in
their own JVMs, the driver in its own process (a JVM hosts one SparkContext, and the
test session's ``local[2]`` one is taken). One cluster for the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest
from driver_helpers import DRIVERS, aec_command, driver_env, flights_differences
from spark_servers import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

DRIVER = DRIVERS / "standalone_driver.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("standalone")), workers=2).start()
    yield cluster
    cluster.stop()


def _running_counts(rows):
    count, total, out = defaultdict(int), defaultdict(int), []
    for r in sorted(rows, key=lambda r: r["seq"]):
        count[r["k"]] += 1
        total[r["k"]] += r["x"]
        out.append({"k": r["k"], "seq": r["seq"], "count": count[r["k"]], "total": total[r["k"]]})
    return out


def test_process_keyed_and_a_restarted_stream_on_a_standalone_cluster(cluster, tmp_path):
    env = driver_env()
    env.pop("PYSPARK_PYTHON")  # the session starts with PySpark's default interpreter
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    done = subprocess.run(
        [sys.executable, str(DRIVER), cluster.url, str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    # made before `import spark_glue`, the session's workers would run `python3` off the
    # PATH (no aec there); the glue gave them this interpreter
    assert result["worker_python"] == sys.executable
    assert "cannot run aec; they now run the driver's interpreter" in done.stderr

    import importlib.util

    spec = importlib.util.spec_from_file_location("standalone_driver", DRIVER)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    expected = _running_counts(driver.rows())

    def by_seq(r):
        return r["seq"]

    assert sorted(result["batch"], key=by_seq) == expected
    batches = [batch_id for batch_id, _ in result["stream"]]
    assert batches == list(range(5))  # one file per micro-batch, ids continue after restart
    streamed = [row for _, rows in result["stream"] for row in rows]
    assert sorted(streamed, key=by_seq) == expected


def test_aec_flights_on_the_cluster_writes_what_the_local_run_writes(spark, cluster, tmp_path):
    from spark_glue.flights.job import FlightsOptions, run

    cluster_out, local_out = tmp_path / "cluster", tmp_path / "local"
    done = aec_command(
        "flights", "--out", str(cluster_out), "--master", cluster.url, "--limit", "1000",
        "--backend", "memory", "--partitions", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run(spark, FlightsOptions(out=str(local_out), backend="memory", partitions=2, limit=1000))
    assert flights_differences(cluster_out, local_out) == []
