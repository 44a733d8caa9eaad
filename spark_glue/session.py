"""The SparkSession of the ``aec`` command: its master and defaults, under ``spark-submit`` too.

``aec flights --master URL`` picks the cluster manager (Spark's master URL:
``local[*]``, ``local-cluster[2,1,1024]``, ``spark://host:7077``, ...). Settings
that ``spark-submit`` (or ``PYSPARK_SUBMIT_ARGS``, or ``spark-defaults.conf``)
already put in the Spark conf are honoured: the command's defaults only fill
what is missing, and an explicit ``--master`` is the only one that overrides.
Decisions: ``docs/cluster.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER = "local[*]"
MASTER = "spark.master"


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


def command_session(partitions: int, master: str | None = None) -> tuple[Any, bool]:
    """The active SparkSession if there is one (tests, notebooks), else a new one.

    The new one gets ``session_settings`` over the conf Spark loads by itself (so
    ``spark-submit --master yarn aec-flights.py ...`` keeps yarn). Returns
    ``(session, owned)``; ``owned`` sessions are the caller's to stop.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    # Start (or, under spark-submit, join) the JVM first, so that the conf below sees
    # the submitted settings; the launch itself gets the driver memory default.
    launch = SparkConf(loadDefaults=False)
    launch.set("spark.driver.memory", "2g")
    SparkContext._ensure_initialized(conf=launch)
    submitted = dict(SparkConf().getAll())
    settings = session_settings(partitions, master, submitted)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True
