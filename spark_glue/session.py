"""The SparkSession of the ``aec`` command: its master and defaults, under ``spark-submit`` too.

``aec flights --master URL`` picks the cluster manager (Spark's master URL:
``local[*]``, ``local-cluster[2,1,1024]``, ``spark://host:7077``, ...). Settings
that ``spark-submit`` (or ``PYSPARK_SUBMIT_ARGS``, or ``spark-defaults.conf``)
already put in the Spark conf are honoured: the command's defaults only fill
what is missing, and an explicit ``--master`` is the only one that overrides.
``aec flights --remote sc://host:port`` (or ``SPARK_REMOTE`` in the environment,
when ``--master`` is not given) connects to a Spark Connect server instead: only
the session's runtime settings apply there (the server owns its master and
memory); ``--remote local[N]`` starts a local Connect server for the run.
Decisions: ``docs/cluster.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER = "local[*]"
MASTER = "spark.master"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The driver JVM compiles with C1 only: the command's jobs last seconds, and C2's compile
# threads cost more CPU than they saved (the flights year: about 5 CPU-seconds less of
# ~20 in the JVM, session start 8 s instead of 14-19 s; docs/performance.md).
DEFAULT_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def session_settings(
    partitions: int, master: str | None, submitted: Mapping[str, str]
) -> dict[str, str]:
    """The conf entries the command sets, given what is already ``submitted``.

    Args:
        partitions: ``spark.sql.shuffle.partitions`` default (>= 1).
        master: ``--master`` (None: not given on the command line).
        submitted: the Spark conf before the session starts (``spark-submit``'s
            ``--master``/``--conf``, ``PYSPARK_SUBMIT_ARGS``, ``spark-defaults.conf``).

    Returns:
        Entries to set: the explicit ``master`` always; every default (master
        ``local[*]``, UI off, Arrow on, UTC session time zone, 2 GB driver memory)
        only when ``submitted`` has no value for it; the console progress bar off
        and the app name ``aec flights`` unless named (Spark's launcher sets both
        for any Python driver).

    Raises:
        ValueError: ``master`` empty or ``partitions`` < 1.
    """
    if master is not None and not master.strip():
        raise ValueError("master must be a Spark master URL such as local[*], got ''")
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    defaults = {
        MASTER: DEFAULT_MASTER,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
    }
    settings = {key: value for key, value in defaults.items() if key not in submitted}
    # Spark's launcher sets these two for every Python driver ("pyspark-shell", progress
    # bar on), so they cannot tell a user's choice: the command's win.
    settings["spark.ui.showConsoleProgress"] = "false"  # tqdm owns the terminal
    if submitted.get("spark.app.name", "pyspark-shell") == "pyspark-shell":
        settings["spark.app.name"] = "aec flights"
    if master is not None:
        settings[MASTER] = master.strip()
    return settings


# Settings a Spark Connect client may set on its session (the server owns the rest).
RUNTIME_SETTINGS = (
    "spark.sql.shuffle.partitions",
    "spark.sql.execution.arrow.pyspark.enabled",
    "spark.sql.session.timeZone",
)


def command_session(
    partitions: int,
    master: str | None = None,
    *,
    java_options: str | None = DEFAULT_JAVA_OPTIONS,
    remote: str | None = None,
    ship_package: bool = False,
) -> tuple[Any, bool]:
    """The active SparkSession if there is one (tests, notebooks), else a new one.

    The new one gets ``session_settings`` over the conf Spark loads by itself (so
    ``spark-submit --master yarn aec-flights.py ...`` keeps yarn). ``java_options``:
    the driver JVM's options when the user gave none (``java_options_given``); None
    leaves the JVM's own defaults (C1 and C2). ``remote`` (else ``SPARK_REMOTE``
    unless ``master`` is given): a Spark Connect session instead (``connect_session``).
    ``ship_package``: set ``spark.aec.shipPackage`` (``spark_glue.workers``).
    Returns ``(session, owned)``; ``owned`` sessions are the caller's to stop.
    """
    from pyspark.sql import SparkSession

    from spark_glue.session_conf import SHIP_PACKAGE

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if remote is None and master is None:
        remote = os.environ.get("SPARK_REMOTE") or None
    if remote is not None:
        session = connect_session(partitions, remote, java_options=java_options)
    else:
        session = _classic_session(partitions, master, java_options)
    if ship_package:
        session.conf.set(SHIP_PACKAGE, "true")
    return session, True


def connect_session(
    partitions: int, remote: str, *, java_options: str | None = DEFAULT_JAVA_OPTIONS
) -> Any:
    """A Spark Connect session at ``remote`` (``sc://host:port``, or ``local[N]``: a
    Connect server started in this process's JVM, with the command's defaults and
    ``java_options``). On ``sc://`` only ``RUNTIME_SETTINGS`` are set.

    Raises:
        ValueError: ``remote`` is neither form.
    """
    from pyspark.sql import SparkSession

    url = remote.strip()
    if not url.startswith(("sc://", "local")):
        raise ValueError(f"remote must be sc://host:port or local[N], got {remote!r}")
    settings = session_settings(partitions, None, {})
    settings.pop(MASTER)
    if url.startswith("sc://"):
        settings = {key: settings[key] for key in RUNTIME_SETTINGS}
    else:
        options = launch_java_options(
            java_options, os.environ.get("PYSPARK_SUBMIT_ARGS", ""), _spark_defaults()
        )
        if options is not None:
            settings[JAVA_OPTIONS] = options
    builder = SparkSession.builder.remote(url)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _classic_session(partitions: int, master: str | None, java_options: str | None) -> Any:
    """A classic session (a driver JVM in this process) with ``session_settings``."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # Start (or, under spark-submit, join) the JVM first, so that the conf below sees
    # the submitted settings; the launch itself gets the driver memory default and,
    # unless the user gave driver Java options, ``java_options`` (the JIT default).
    launch = SparkConf(loadDefaults=False)
    launch.set("spark.driver.memory", "2g")
    options = launch_java_options(
        java_options, os.environ.get("PYSPARK_SUBMIT_ARGS", ""), _spark_defaults()
    )
    if options is not None:
        launch.set(JAVA_OPTIONS, options)
    # PySpark has no public call that starts the JVM without making a SparkContext
    SparkContext._ensure_initialized(conf=launch)  # noqa: SLF001
    submitted = dict(SparkConf().getAll())
    settings = session_settings(partitions, master, submitted)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    remote = os.environ.pop("SPARK_REMOTE", None)  # an explicit --master wins over it
    try:
        session = builder.getOrCreate()
    finally:
        if remote is not None:
            os.environ["SPARK_REMOTE"] = remote
    session.sparkContext.setLogLevel("ERROR")
    return session


def launch_java_options(java_options: str | None, submit_args: str, defaults: str) -> str | None:
    """The driver Java options the launch sets: ``java_options``, unless it is None
    or the user gave their own (``java_options_given``: theirs win)."""
    if java_options is None or java_options_given(submit_args, defaults):
        return None
    return java_options


def java_options_given(submit_args: str, defaults: str) -> bool:
    """Whether the user set the driver's Java options: ``--driver-java-options`` or
    ``spark.driver.extraJavaOptions`` in ``PYSPARK_SUBMIT_ARGS`` (``submit_args``) or in
    ``spark-defaults.conf`` (its text, ``defaults``). Their options win over the JIT
    default, which the launch would otherwise put on the command line."""
    if "--driver-java-options" in submit_args or JAVA_OPTIONS in submit_args:
        return True
    return any(line.split()[:1] == [JAVA_OPTIONS] for line in defaults.splitlines())


def _spark_defaults() -> str:
    """The text of the ``spark-defaults.conf`` spark-submit would read ('' if none)."""
    directory = os.environ.get("SPARK_CONF_DIR")
    if directory is None:
        try:
            from pyspark.find_spark_home import _find_spark_home

            directory = os.path.join(_find_spark_home(), "conf")
        except Exception:  # no Spark home: no defaults file either
            return ""
    try:
        with open(os.path.join(directory, "spark-defaults.conf"), encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""
