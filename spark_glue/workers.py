"""The Python workers of a session: can they run aec? If not, say why, or ship it to them.

Spark runs the glue's functions (``mapInArrow``, pandas UDFs, ``foreachBatch`` on a
Connect server) in Python worker processes it starts with the session's
interpreter: on a classic session the ``PYSPARK_PYTHON`` of the driver when its
``SparkContext`` started (PySpark's default: ``python3`` on the PATH), on a
Connect session the ``PYSPARK_PYTHON`` of the server's environment. If that
interpreter cannot import aec, every task fails with ``ModuleNotFoundError`` deep
inside a Spark stack trace, or worse, after part of a job ran.

``ensure_workers(spark, feature)`` runs once per session, before the glue's first
job: one task with a plain (pickled, not Arrow) Python UDF reports the worker's
interpreter, its Python version and which of ``REQUIRED`` it imports. Then:

1. all there (and the same aec version as the driver's): done, cached per session;
2. a classic session whose workers run PySpark's default ``python3`` (nobody
   chose an interpreter: typically a session made before ``import spark_glue``,
   with a virtualenv not on the PATH): the session adopts the driver's own
   interpreter for its workers and probes again, so the glue does not depend on
   which of ``SparkSession`` and ``spark_glue`` was created or imported first;
3. ``spark.aec.shipPackage=true`` in the session's conf: ``ship_package`` adds
   aec's own packages (``aec``, ``backends``, ``spark_glue``: pure Python) to the
   session as a Python artifact (``spark.addArtifacts(zip, pyfile=True)``, on
   Connect and classic sessions alike) and probes again;
4. otherwise ``WorkerEnvironmentError`` naming the interpreter, each missing
   module and the two fixes (install aec there, or ship it), before any job ran.

Nothing here uses ``sparkContext``, RDDs or the JVM, except the adoption in
step 2, which only a classic session has (a Connect client cannot change the
server's interpreter).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import threading
import weakref
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aec
from aec.state import scratch
from spark_glue.session_conf import SHIP_PACKAGE, conf_flag, is_connect

# What the workers import to run the glue: the engine, the glue, Arrow, pandas (the
# pandas UDFs) and cloudpickle (the user's function travels pickled by it).
REQUIRED = ("aec", "spark_glue", "pyarrow", "pandas", "cloudpickle")
PACKAGES = ("aec", "backends", "spark_glue")  # what ship_package sends: pure Python
PYSPARK_DEFAULT_PYTHON = "python3"  # PySpark's worker interpreter when PYSPARK_PYTHON is unset

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_ready: weakref.WeakKeyDictionary[Any, WorkerPython] = weakref.WeakKeyDictionary()
_shipped: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_archive: list[str] = []  # the zip ship_package built in this process (built once)


class WorkerEnvironmentError(RuntimeError):
    """The session's Python workers cannot run aec (a module is missing, another aec
    version, or the interpreter does not start). Raised before any job of the glue
    ran; the message names the interpreter, what is missing and the fixes."""


@dataclass(frozen=True)
class WorkerPython:
    """What the probe task found in a Python worker.

    Attributes:
        executable: the worker's ``sys.executable``.
        version: its Python version, e.g. ``"3.11.7"``.
        modules: each importable module of ``REQUIRED`` -> where it was loaded from.
        missing: each module of ``REQUIRED`` that failed -> the import error.
        aec_version: the worker's ``aec.__version__`` (None if aec is missing).
    """

    executable: str
    version: str
    modules: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    aec_version: str | None = None

    @property
    def problems(self) -> list[str]:
        """What keeps these workers from running the glue ([] when nothing)."""
        found = [f"module {name!r} is missing ({error})" for name, error in self.missing.items()]
        if self.aec_version is not None and self.aec_version != aec.__version__:
            found.append(
                f"it has aec {self.aec_version} from {self.modules.get('aec')}, the driver "
                f"aec {aec.__version__}"
            )
        return found


def ensure_workers(spark: Any, feature: str) -> WorkerPython:
    """Check, once per session, that its Python workers can run the glue (see the
    module docstring); ``feature`` names the caller in the error.

    Raises:
        WorkerEnvironmentError: they cannot, and neither adopting the driver's
            interpreter (classic sessions) nor ``spark.aec.shipPackage`` helped.
    """
    with _lock:
        found = _ready.get(spark)
        if found is not None:
            return found
        try:
            found = probe(spark)
        except WorkerEnvironmentError:
            if is_connect(spark):
                raise
            found = None  # the interpreter did not even start: adoption may still help
        if (found is None or found.problems) and not is_connect(spark):
            found = _adopt_driver_python(spark, found)
        if found is not None and found.problems and conf_flag(spark, SHIP_PACKAGE):
            ship_package(spark)
            found = probe(spark)
        if found is None:
            found = probe(spark)  # raises with Spark's reason
        if found.problems:
            raise WorkerEnvironmentError(_explain(spark, feature, found))
        _ready[spark] = found
        return found


def probe(spark: Any) -> WorkerPython:
    """Run the probe task (one row, one partition, a plain Python UDF) and return
    what the worker found.

    Raises:
        WorkerEnvironmentError: the task failed (the interpreter does not start,
            another Python version than the driver's, ...): the message has
            Spark's first lines.
    """
    from pyspark.sql.functions import udf

    report = udf(_probe_function(REQUIRED), "string", useArrow=False)
    try:
        row = spark.range(0, 1, 1, 1).select(report("id").alias("probe")).first()
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()][:6]
        raise WorkerEnvironmentError(
            "spark_glue: the session's Python workers did not run a probe task: "
            + " | ".join(lines)
            + _FIXES.format(python="the workers' interpreter")
        ) from exc
    data = json.loads(row["probe"])
    return WorkerPython(
        executable=data["executable"],
        version=data["version"],
        modules=data["modules"],
        missing=data["missing"],
        aec_version=data["aec_version"],
    )


def ship_package(spark: Any) -> str:
    """Add aec's packages (``aec``, ``backends``, ``spark_glue``, as installed for
    this driver) to ``spark`` as a Python artifact: ``spark.addArtifacts(zip,
    pyfile=True)``, which puts the zip on the workers' ``sys.path`` for this
    session's Python functions (Connect and classic alike). Third-party modules
    (pyarrow, pandas, cloudpickle, and a backend's library) are not shipped: the
    workers' interpreter must have them. Once per session; returns the zip's path.
    """
    shipped = _shipped.get(spark)
    if shipped is not None:
        return shipped
    archive = package_archive()
    spark.addArtifacts(archive, pyfile=True)
    _shipped[spark] = archive
    _ready.pop(spark, None)
    _log.info("spark_glue: shipped %s to the session's Python workers", archive)
    return archive


def package_archive() -> str:
    """A zip of ``PACKAGES`` (sources only), built once per process in a private
    directory (``aec.state.scratch``); its name carries the version and a digest of its
    contents (an artifact name must not be reused for other contents)."""
    if _archive:
        return _archive[0]
    import backends
    import spark_glue

    sources: list[tuple[str, str]] = []
    for package in (aec, backends, spark_glue):
        root = os.path.dirname(os.path.abspath(package.__file__ or ""))
        base = os.path.dirname(root)
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".typed")):
                    path = os.path.join(directory, name)
                    sources.append((path, os.path.relpath(path, base)))
    digest = hashlib.sha256()
    for path, name in sources:
        digest.update(name.encode())
        with open(path, "rb") as handle:
            digest.update(handle.read())
    # built anew in a private directory: a file at a guessable path of the shared temp
    # directory could be another user's, holding code the workers would import
    name = f"aec-{aec.__version__}-{digest.hexdigest()[:12]}.zip"
    target = os.path.join(scratch.make("aec-package-"), name)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, name in sources:
            archive.write(path, name)
    _archive.append(target)
    return target


def _adopt_driver_python(spark: Any, found: WorkerPython | None) -> WorkerPython | None:
    """A classic session whose workers run PySpark's default interpreter, which
    cannot run aec (``found``; None: it did not start): start its workers with the
    driver's interpreter instead (a setting of the session's ``SparkContext``, read
    when a Python function is planned), if that one works there. An interpreter the
    user chose is kept."""
    context = spark.sparkContext
    if context.pythonExec != PYSPARK_DEFAULT_PYTHON or sys.executable in ("", context.pythonExec):
        return found
    context.pythonExec = sys.executable
    try:
        adopted = probe(spark)
    except WorkerEnvironmentError:
        adopted = None
    if adopted is None or adopted.problems:
        context.pythonExec = PYSPARK_DEFAULT_PYTHON
        return found
    _log.warning(
        "spark_glue: this session's Python workers ran %s (PySpark's default, no "
        "PYSPARK_PYTHON when the session started), which cannot run aec; they now run "
        "the driver's interpreter %s. Set PYSPARK_PYTHON before creating the session to "
        "choose another.",
        PYSPARK_DEFAULT_PYTHON if found is None else found.executable,
        sys.executable,
    )
    return adopted


_FIXES = (
    ". Fix one of: (1) install aec and its Spark extra into {python} on every worker "
    "(pip install 'aec[spark]'), or start the workers with an interpreter that has it: "
    "PYSPARK_PYTHON=<python> in the environment before the session starts (classic) or "
    "before the Spark Connect server starts (Connect); (2) ship aec's own packages with "
    "the job: spark.conf.set('spark.aec.shipPackage', 'true') or "
    "spark_glue.ship_package(spark) (the interpreter still needs pyarrow, pandas and "
    "cloudpickle). docs/cluster.md has the details."
)


def _explain(spark: Any, feature: str, found: WorkerPython) -> str:
    kind = "Spark Connect" if is_connect(spark) else "Spark"
    return (
        f"{feature}: the {kind} session's Python workers cannot run aec: "
        f"{found.executable} (Python {found.version}): "
        + "; ".join(found.problems)
        + _FIXES.format(python=found.executable)
    )


def _probe_function(modules: tuple[str, ...]) -> Callable[[Any], str]:
    """The probe UDF. Made inside a function so that it travels by value (pickled
    whole): the worker must run it without importing anything of aec."""

    def probe(_: Any) -> str:
        import importlib
        import json
        import sys

        found: dict[str, str] = {}
        missing: dict[str, str] = {}
        version = None
        for name in modules:
            try:
                module = importlib.import_module(name)
            except Exception as exc:  # report every failure, not only the first
                missing[name] = f"{type(exc).__name__}: {exc}"
                continue
            found[name] = str(getattr(module, "__file__", None) or "?")
            if name == "aec":
                version = getattr(module, "__version__", None)
        return json.dumps(
            {
                "executable": sys.executable,
                "version": ".".join(map(str, sys.version_info[:3])),
                "modules": found,
                "missing": missing,
                "aec_version": version,
            }
        )

    return probe


def check_reachable(spark: Any, directory: str, what: str, tasks: int = 8) -> None:
    """Check that the session's executors see the local directory ``directory`` as this
    process does: a marker file written here must be found by ``tasks`` probe tasks
    (spread over the executors as Spark places them). A local path on a cluster of
    several machines is a different directory on each (unless it is a shared mount),
    so state written there would be silently per executor.

    Raises:
        ValueError: a task did not find the marker (names ``what``, the directory
            and the hosts that missed it).
    """
    import socket
    import uuid

    from pyspark.sql.functions import udf

    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(os.path.abspath(directory), f".aec-reachable-{uuid.uuid4().hex}")
    with open(marker, "w", encoding="utf-8") as handle:
        handle.write(socket.gethostname())
    try:
        seen = udf(_marker_function(marker), "string", useArrow=False)
        rows = spark.range(0, tasks, 1, tasks).select(seen("id").alias("host")).collect()
    finally:
        with contextlib.suppress(OSError):
            os.remove(marker)
    missed = sorted({row["host"][1:] for row in rows if row["host"].startswith("-")})
    if missed:
        raise ValueError(
            f"{what} {directory!r} is a local path the executors do not share with this "
            f"process (executors on {', '.join(missed)} did not find a file written there): "
            "use a directory every executor and the driver reach (a shared mount), or an "
            "object-store URI such as s3://bucket/prefix"
        )


def _marker_function(marker: str) -> Callable[[Any], str]:
    """The reachability probe: ``"+host"`` if ``marker`` exists on the worker's
    machine, else ``"-host"`` (travels by value, like the probe)."""

    def seen(_: Any) -> str:
        import os
        import socket

        return ("+" if os.path.exists(marker) else "-") + socket.gethostname()

    return seen


def carried(spark: Any, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, made to run in a Python process that gets none of the session's
    artifacts: on a Connect session that ``ship_package`` served, the server runs a
    ``foreachBatch`` function in its own Python process, which imports only what its
    interpreter has. The result travels by value with the shipped zip inside and puts
    it on ``sys.path`` before it unpickles ``function``. Without shipping (aec
    installed there, or a classic session) ``function`` is returned as it is."""
    archive = _shipped.get(spark)
    if archive is None or not is_connect(spark):
        return function
    from pyspark import cloudpickle

    with open(archive, "rb") as handle:
        data = handle.read()
    return _carrier(os.path.basename(archive), data, cloudpickle.dumps(function))


def _carrier(name: str, data: bytes, payload: bytes) -> Callable[..., Any]:
    """The by-value wrapper of ``carried`` (made in a function: pickled whole)."""
    loaded: dict[str, Any] = {}

    def call(*args: Any) -> Any:
        function = loaded.get("function")
        if function is None:
            import os
            import socket
            import sys
            import tempfile

            from pyspark import cloudpickle

            # a private directory of this process (an existing file at a shared path
            # could be anyone's), named as aec.state.scratch names its directories so
            # a later worker sweeps it once this one is gone (PySpark's workers leave
            # through os._exit: no atexit runs); aec is not importable before it
            host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32]
            prefix = f"aec-carried-{host or 'host'}-{os.getpid()}-"
            path = os.path.join(tempfile.mkdtemp(prefix=prefix), name)
            with open(path, "wb") as handle:
                handle.write(data)
            sys.path.insert(0, path)
            from aec.state import scratch

            scratch.sweep("aec-carried-", tempfile.gettempdir())
            function = loaded["function"] = cloudpickle.loads(payload)
        return function(*args)

    return call
