"""The Connect-safe session helpers: the workers' Python probe, shipping aec, the
reachability check of a local location, and settings read through ``spark.conf``.

The refusal on a real server without aec is in ``tests/test_connect.py``, the
adoption of the driver's interpreter on a real cluster in ``tests/test_standalone.py``.
"""

from __future__ import annotations

import os
import sys
import zipfile

import pytest

import aec
from spark_glue import session_conf, workers
from spark_glue.workers import WorkerEnvironmentError, WorkerPython


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:
    def __init__(self, **values):
        self.conf = _Conf(values)


def test_settings_are_read_through_spark_conf():
    spark = _Session(**{"spark.aec.shipPackage": "TRUE", "spark.master": "spark://h:7077"})
    assert session_conf.conf_flag(spark, session_conf.SHIP_PACKAGE)
    assert not session_conf.conf_flag(_Session(), session_conf.SHIP_PACKAGE)
    assert not session_conf.runs_on_one_machine(spark)
    assert session_conf.runs_on_one_machine(_Session(**{"spark.master": "local-cluster[2,1,1024]"}))
    assert not session_conf.is_connect(spark)
    with pytest.raises(ValueError, match="spark.speculation must be true or false, got 'yes'"):
        session_conf.conf_flag(_Session(**{"spark.speculation": "yes"}), "spark.speculation")


def test_a_missing_module_and_another_version_are_named_with_the_fixes():
    found = WorkerPython(
        executable="/usr/bin/python3",
        version="3.11.2",
        modules={"aec": "/opt/aec/__init__.py"},
        missing={"pyarrow": "ModuleNotFoundError: No module named 'pyarrow'"},
        aec_version="0.0.1",
    )
    message = workers._explain(_Session(), "process_keyed", found)
    assert message.startswith(
        "process_keyed: the Spark session's Python workers cannot run aec: "
        "/usr/bin/python3 (Python 3.11.2): module 'pyarrow' is missing"
    )
    assert f"it has aec 0.0.1 from /opt/aec/__init__.py, the driver aec {aec.__version__}" in (
        message
    )
    assert "pip install 'aec[spark]'" in message and "PYSPARK_PYTHON=<python>" in message
    assert "spark.aec.shipPackage" in message and "spark_glue.ship_package(spark)" in message
    assert WorkerPython("/p", "3.11.7", {"aec": "x"}, {}, aec.__version__).problems == []


def test_the_shipped_archive_holds_the_three_packages_sources_only():
    path = workers.package_archive()
    assert workers.package_archive() == path  # built once per process
    assert os.path.basename(path).startswith(f"aec-{aec.__version__}-")
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert {"aec/__init__.py", "backends/__init__.py", "spark_glue/workers.py"} <= names
    assert "spark_glue/flights/job.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_a_file_planted_at_a_guessable_temp_path_is_never_shipped_or_imported(tmp_path):
    """The archive is built in a private directory on the driver and written to one in
    the worker: a zip another user left in the shared temp directory under the name is
    neither shipped nor put on ``sys.path``."""
    import subprocess

    from pyspark import cloudpickle

    name = os.path.basename(workers.package_archive())
    marker = tmp_path / "planted-code-ran"
    planted = tmp_path / name
    with zipfile.ZipFile(planted, "w") as archive:
        archive.writestr("aec/__init__.py", f"open({str(marker)!r}, 'w').close()\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    shipped, ours = subprocess.run(
        [sys.executable, "-c", "import zipfile, spark_glue.workers as w; p = w.package_archive(); "
         "print(p, b'open(' not in zipfile.ZipFile(p).read('aec/__init__.py'))"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.split()  # fmt: skip
    assert shipped != str(planted) and os.path.dirname(shipped) != str(tmp_path)
    assert ours == "True"
    with open(workers.package_archive(), "rb") as handle:
        carrier = workers._carrier(name, handle.read(), cloudpickle.dumps(lambda: 7))
    for _ in range(2):  # a worker that is gone leaves its copy to the next one to sweep
        ran = subprocess.run(
            [sys.executable, "-c", "import os, pickle, sys; f = pickle.loads(sys.stdin.buffer"
             ".read()); print(f(), sys.path[0].startswith(sys.argv[1])); os._exit(0)",
             str(planted)],
            input=cloudpickle.dumps(carrier), capture_output=True, env=env,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr.decode()
        assert ran.stdout.split() == [b"7", b"False"]
    assert not marker.exists()
    assert len([p for p in os.listdir(tmp_path) if p.startswith("aec-carried-")]) == 1


def test_the_probe_runs_in_a_python_without_aec(tmp_path):
    """The probe travels by value: an interpreter without aec unpickles and runs it."""
    import json
    import subprocess

    from pyspark import cloudpickle
    from spark_servers import bare_python

    python = bare_python(str(tmp_path / "python"))
    payload = cloudpickle.dumps(workers._probe_function(("aec", "json")))
    done = subprocess.run(
        [python, "-c", "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read())(None))"],
        input=payload, capture_output=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["executable"] == python and "json" in report["modules"]
    assert report["missing"] == {"aec": "ModuleNotFoundError: No module named 'aec'"}
    assert report["aec_version"] is None


@pytest.mark.spark
def test_the_test_sessions_workers_pass_once_per_session(spark, monkeypatch):
    found = workers.ensure_workers(spark, "test")
    assert found.problems == []
    assert found.modules["aec"] == os.path.abspath(aec.__file__)

    def no_more_jobs(_):
        raise AssertionError("probed twice")

    monkeypatch.setattr(workers, "probe", no_more_jobs)
    assert workers.ensure_workers(spark, "test") is found


@pytest.mark.spark
def test_a_local_path_the_executors_miss_is_refused(spark, tmp_path, monkeypatch):
    workers.check_reachable(spark, str(tmp_path / "state"), "checkpoint_location")
    assert os.listdir(tmp_path / "state") == []  # the marker is removed again
    # executors that look for the marker elsewhere: as on a machine without the mount
    elsewhere = workers._marker_function
    monkeypatch.setattr(workers, "_marker_function", lambda m: elsewhere(m + ".elsewhere"))
    with pytest.raises(ValueError) as failure:
        workers.check_reachable(spark, str(tmp_path / "state"), "checkpoint_location")
    assert str(failure.value).startswith(
        f"checkpoint_location {str(tmp_path / 'state')!r} is a local path the executors do not "
        "share with this process (executors on "
    )
    assert "object-store URI" in str(failure.value)


def test_the_command_line_takes_a_remote_or_a_master():
    from spark_glue.cli import build_parser

    args = build_parser().parse_args(["flights", "--out", "x", "--remote", "sc://h:15002"])
    assert (args.remote, args.master, args.ship_package) == ("sc://h:15002", None, False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["flights", "--out", "x", "--remote", "sc://h:1", "--master", "local[2]"]
        )


def test_a_worker_failure_to_start_is_reported_with_sparks_reason():
    class _Failing:
        def range(self, *args):
            raise RuntimeError("[PYTHON_VERSION_MISMATCH] Python in worker has different version")

    with pytest.raises(WorkerEnvironmentError, match="did not run a probe task: "
                       r"\[PYTHON_VERSION_MISMATCH\]"):  # fmt: skip
        workers.probe(_Failing())
