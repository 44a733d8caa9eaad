"""Spark as users deploy it, started by the tests: a Spark Connect server and a
standalone cluster (a master and workers), each a separate process on loopback.

Both come from the installed pyspark (its ``bin/spark-submit`` and ``bin/spark-class``
and the jars it ships, Connect's included), so CI needs nothing else. Every process
is started in its own session (process group) and stopped by its PID (SIGTERM to its
group, SIGKILL after a grace period), never by name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(**extra: str) -> dict[str, str]:
    """A server's environment: no Spark or PySpark settings of the test run, no
    PYTHONPATH and not this virtualenv on the PATH (a cluster's machines were set up
    without the user's environment: their workers see only what they are given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    ours = os.path.dirname(os.path.abspath(sys.executable))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", **extra)
    return env


class _Process:
    """One server process, started in its own process group, its output in a log."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], cwd: str) -> None:
        self.name = name
        self.log = Path(cwd) / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if not self.alive():
            return
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.pid, sig)  # the group we started: the JVM and its Python workers
            except ProcessLookupError:
                return
            try:
                self.process.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue


def _wait(what: str, ready, processes: list[_Process], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for process in processes:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited: {process.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{what} not ready within {timeout} s: "
                + " | ".join(p.tail(10) for p in processes)
            )
        time.sleep(0.2)


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class ConnectServer:
    """A Spark Connect server (``SparkConnectServer`` through ``spark-submit``, what
    ``sbin/start-connect-server.sh`` runs) on ``local[2]``; its Python workers run
    ``python`` (its ``PYSPARK_PYTHON``). ``url`` is ``sc://127.0.0.1:<port>``."""

    def __init__(self, python: str, workdir: str, conf: dict[str, str] | None = None) -> None:
        self.python = python
        self.workdir = workdir
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
            # foreachBatch's Python process must connect back within this (default 15 s,
            # too short for a Python start on a busy 2-core machine)
            "spark.python.authenticate.socketTimeout": "120s",
            **(conf or {}),
        }
        self.server: _Process | None = None

    def start(self, timeout: float = 120.0) -> ConnectServer:
        command = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", CONNECT_SERVER]
        command += ["--name", "aec-tests-connect", "--master", "local[2]"]
        for key, value in self.conf.items():
            command += ["--conf", f"{key}={value}"]
        command.append("spark-internal")
        env = _environment(PYSPARK_PYTHON=self.python)
        self.server = _Process("connect-server", command, env, self.workdir)
        started = "Spark Connect server started"
        _wait(
            "the Spark Connect server",
            lambda: _port_open(self.port) and started in self.server.tail(200),
            [self.server],
            timeout,
        )
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class StandaloneCluster:
    """Spark's standalone cluster manager: a master and ``workers`` workers
    (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``),
    each worker offering ``cores`` cores and ``memory`` of memory. ``url`` is
    ``spark://127.0.0.1:<port>``."""

    def __init__(self, workdir: str, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workdir = workdir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[_Process] = []

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        env = _environment(SPARK_WORKER_DIR=os.path.join(self.workdir, "work"))
        master = [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        master += ["--port", str(self.port), "--webui-port", str(self.ui_port)]
        self.processes.append(_Process("master", master, env, self.workdir))
        _wait("the standalone master", lambda: _port_open(self.port), self.processes, timeout)
        for index in range(self.workers):
            worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1"]
            worker += ["--cores", str(self.cores), "--memory", self.memory]
            worker += ["--webui-port", str(free_port()), "--work-dir"]
            worker += [os.path.join(self.workdir, f"work-{index}"), self.url]
            self.processes.append(_Process(f"worker-{index}", worker, env, self.workdir))
        _wait(
            f"{self.workers} registered workers",
            lambda: self.alive_workers() >= self.workers,
            self.processes,
            timeout,
        )
        return self

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def stop(self) -> None:
        for process in reversed(self.processes):  # workers (and their executors) first
            process.stop()


def bare_python(directory: str) -> str:
    """An interpreter with this test environment's third-party packages (pyarrow,
    pandas, cloudpickle, pyspark, ...) but without aec: a virtualenv whose only
    addition is a ``.pth`` line naming this environment's site-packages (a line, not
    a site directory, so that directory's own ``.pth`` files, among them aec's
    editable install, are not run). A cluster where aec was never installed."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    python = os.path.join(directory, "bin", "python")
    found = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    packages = [p for p in site.getsitepackages() if os.path.isdir(p)]
    Path(found, "aec-test-dependencies.pth").write_text("\n".join(packages) + "\n")
    return python


def workdir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix)



