"""The flights job's two keyed operators and their rows.

* ``RouteHourly()`` (key ``route``): ``aec.windowing``'s tumbling one-hour
  event-time windows per route with an ``AggregateFunction``; a record whose
  window has already fired (window end <= the watermark it sees) goes to the
  ``late`` side output instead.
* ``AircraftSessions()`` (key ``aircraft``, rows with a tail number only):
  event-time session windows with a 12 h gap over the scheduled departures;
  records reaching a session already fired go to ``late_sessions``.
* ``Rotations`` (key ``aircraft``, ``async def`` style): ValueState holds the
  aircraft's previous flight in arrival order; one output row per flight.
  Rows without a tail number go to the ``no_tailnum`` side output.

Times are float seconds with naive local timestamps read as UTC (see
``spark_glue.flights.data``); the output schemas turn them back into naive
``timestamp_ntz`` values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from aec import AggregateFunction, KeyedProcessFunction, ValueStateDescriptor
from aec.windowing import (
    EventTimeSessionWindows,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    window,
)

HOUR = 3600
DELAYED_MINUTES = 15  # FAA's definition of a delayed flight
SESSION_GAP = 12 * HOUR  # an aircraft idle this long starts a new session
DATASETS = (
    "route_hourly", "late", "rotations", "no_tailnum", "aircraft_sessions", "late_sessions",
    "flights_weather", "late_flights_weather", "late_weather",  # spark_glue.flights.weather
)  # fmt: skip

ROUTE_HOURLY_SCHEMA = (
    "origin string, dest string, window_start timestamp_ntz, flights long, cancelled long, "
    "mean_dep_delay double, max_dep_delay double"
)
LATE_SCHEMA = (
    "row long, origin string, dest string, event_time timestamp_ntz, dep_delay double, "
    "cancelled boolean, window_start timestamp_ntz, watermark timestamp_ntz"
)
ROTATIONS_SCHEMA = (
    "tailnum string, event_time timestamp_ntz, origin string, dest string, prev_origin string, "
    "prev_dest string, prev_arr_delay double, dep_delay double, gap_minutes double, "
    "propagated boolean, relocated boolean"
)
AIRCRAFT_SESSIONS_SCHEMA = (
    "aircraft string, window_start timestamp_ntz, window_end timestamp_ntz, flights long, "
    "cancelled long, mean_dep_delay double"
)
LATE_SESSIONS_SCHEMA = (
    "row long, aircraft string, event_time timestamp_ntz, dep_delay double, cancelled boolean, "
    "watermark timestamp_ntz"
)
NO_TAILNUM_SCHEMA = (
    "row long, carrier string, flight long, origin string, dest string, "
    "event_time timestamp_ntz, dep_delay double, arr_delay double"
)


class HourlyAggregate(AggregateFunction):
    """A route-hour's accumulator ``(flights, cancelled, delays counted, delay sum,
    delay max)`` over non-null ``dep_delay`` (minutes)."""

    def create_accumulator(self) -> tuple:
        return (0, 0, 0, 0.0, None)

    def add(self, flight: dict[str, Any], acc: tuple) -> tuple:
        return _accumulate(acc, flight["dep_delay"], flight["cancelled"])

    def get_result(self, acc: tuple) -> tuple:
        return acc

    def merge(self, a: tuple, b: tuple) -> tuple:
        worst = [w for w in (a[4], b[4]) if w is not None]
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], max(worst) if worst else None)


class HourlyRows(ProcessWindowFunction):
    """One ``ROUTE_HOURLY_SCHEMA`` row per fired route-hour."""

    def process(self, key: str, context: Any, elements: list) -> list[dict[str, Any]]:
        origin, dest = key.split("-", 1)
        return [_window_row(origin, dest, context.window().start, elements[0])]


def RouteHourly() -> KeyedProcessFunction:  # noqa: N802 (the operator's published name)
    """Hourly departures per route: ``TumblingEventTimeWindows.of(3600)`` with
    ``HourlyAggregate``; late records to ``late`` as ``LATE_SCHEMA`` rows."""
    return window(
        TumblingEventTimeWindows.of(HOUR),
        aggregate=HourlyAggregate(),
        process=HourlyRows(),
        late_data_tag="late",
        late_output=_late_route_row,
    )


def _late_route_row(flight: dict[str, Any], event_time: float, watermark: float) -> dict:
    start = math.floor(event_time / HOUR) * HOUR  # TumblingEventTimeWindows' start, offset 0
    return _late_row(flight, event_time, start, watermark)


def _accumulate(acc: tuple | None, delay: float | None, cancelled: bool) -> tuple:
    flights, n_cancelled, counted, total, worst = acc or (0, 0, 0, 0.0, None)
    flights += 1
    n_cancelled += bool(cancelled)
    if delay is not None and not math.isnan(delay):
        counted += 1
        total += delay
        worst = delay if worst is None else max(worst, delay)
    return flights, n_cancelled, counted, total, worst


def _window_row(origin: str, dest: str, start: int, acc: tuple) -> dict[str, Any]:
    flights, cancelled, counted, total, worst = acc
    return {
        "origin": origin,
        "dest": dest,
        "window_start": start,
        "flights": flights,
        "cancelled": cancelled,
        "mean_dep_delay": total / counted if counted else None,
        "max_dep_delay": worst,
    }


def _late_row(flight: dict[str, Any], event_time: float, start: int, watermark: float) -> dict:
    return {
        "row": flight["row"],
        "origin": flight["origin"],
        "dest": flight["dest"],
        "event_time": event_time,
        "dep_delay": flight["dep_delay"],
        "cancelled": flight["cancelled"],
        "window_start": start,
        "watermark": watermark,
    }


class SessionAggregate(AggregateFunction):
    """An aircraft session's accumulator ``(flights, cancelled, delays counted, delay sum)``."""

    def create_accumulator(self) -> tuple:
        return (0, 0, 0, 0.0)

    def add(self, flight: dict[str, Any], acc: tuple) -> tuple:
        flights, cancelled, counted, total = acc
        delay = flight["dep_delay"]
        if delay is None or math.isnan(delay):
            return (flights + 1, cancelled + bool(flight["cancelled"]), counted, total)
        return (flights + 1, cancelled + bool(flight["cancelled"]), counted + 1, total + delay)

    def get_result(self, acc: tuple) -> tuple:
        return acc

    def merge(self, a: tuple, b: tuple) -> tuple:
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


class SessionRows(ProcessWindowFunction):
    """One ``AIRCRAFT_SESSIONS_SCHEMA`` row per fired session: ``window_start`` is the
    first scheduled departure, ``window_end`` the last one + 12 h."""

    def process(self, key: str, context: Any, elements: list) -> list[dict[str, Any]]:
        flights, cancelled, counted, total = elements[0]
        session = context.window()
        return [
            {
                "aircraft": key,
                "window_start": session.start,
                "window_end": session.end,
                "flights": flights,
                "cancelled": cancelled,
                "mean_dep_delay": total / counted if counted else None,
            }
        ]


def AircraftSessions() -> KeyedProcessFunction:  # noqa: N802 (named like the other operators)
    """Each aircraft's busy periods: ``EventTimeSessionWindows.with_gap(12 h)`` over the
    scheduled departure; late records to ``late_sessions`` (``LATE_SESSIONS_SCHEMA``)."""
    return window(
        EventTimeSessionWindows.with_gap(SESSION_GAP),
        aggregate=SessionAggregate(),
        process=SessionRows(),
        late_data_tag="late_sessions",
        late_output=_late_session_row,
    )


def _late_session_row(flight: dict[str, Any], event_time: float, watermark: float) -> dict:
    return {
        "row": flight["row"],
        "aircraft": flight["aircraft"],
        "event_time": event_time,
        "dep_delay": flight["dep_delay"],
        "cancelled": flight["cancelled"],
        "watermark": watermark,
    }


class Rotations(KeyedProcessFunction):
    """Each aircraft's consecutive flights (in arrival order); ``async def`` style.

    State: ValueState ``previous``: ``[event_time s, origin, dest, arr_delay]``
    of the aircraft's last flight (``rotation_state``). Output dicts match ``ROTATIONS_SCHEMA``: the
    ``prev_*``, ``gap_minutes``, ``propagated`` and ``relocated`` columns are
    null on an aircraft's first flight; ``propagated`` is previous
    ``arr_delay`` > 15 and this ``dep_delay`` > 15 (False when either is
    missing); ``relocated`` is origin != previous destination.
    """

    def open(self, ctx: Any) -> None:
        self.previous = ctx.get_state(ValueStateDescriptor("previous"))

    async def process_element(self, flight: dict[str, Any], ctx: Any) -> None:
        timestamp = ctx.timestamp
        if flight["tailnum"] is None:
            ctx.side_output("no_tailnum", _no_tailnum_row(flight, timestamp))
            return
        previous = await self.previous.async_value()
        ctx.output(rotation_row(flight, timestamp, previous))
        # not awaited: the record holds its aircraft until the write lands (a pending
        # request counts like an awaited one), and nothing follows it here
        self.previous.async_update(rotation_state(flight, timestamp))


def rotation_state(flight: dict[str, Any], event_time: float) -> list[Any]:
    """What ``Rotations`` keeps of ``flight`` (at ``event_time`` seconds) for the
    aircraft's next one: ``[event_time, origin, dest, arr_delay]``. A list, not a tuple:
    msgpack (the default state serializer) stores a list natively and a tuple as an
    extension type, about 4x dearer to write and 2x to read."""
    return [event_time, flight["origin"], flight["dest"], flight["arr_delay"]]


def rotation_row(
    flight: dict[str, Any], event_time: float, previous: Sequence[Any] | None
) -> dict:
    """One ``ROTATIONS_SCHEMA`` row: ``flight`` (a row dict) at ``event_time`` (seconds)
    after ``previous`` (the aircraft's last flight as stored by ``Rotations``, or None
    for its first); shared with the enriched job and the Spark comparison in perf."""
    if previous is None:
        return {
            "tailnum": flight["tailnum"],
            "event_time": event_time,
            "origin": flight["origin"],
            "dest": flight["dest"],
            "dep_delay": flight["dep_delay"],
        }
    # one dict literal per row (not a dict then update(**fields)): it runs per flight
    prev_time, prev_origin, prev_dest, prev_arr_delay = previous
    dep_delay = flight["dep_delay"]
    return {
        "tailnum": flight["tailnum"],
        "event_time": event_time,
        "origin": flight["origin"],
        "dest": flight["dest"],
        "dep_delay": dep_delay,
        "prev_origin": prev_origin,
        "prev_dest": prev_dest,
        "prev_arr_delay": prev_arr_delay,
        "gap_minutes": (event_time - prev_time) / 60.0,
        "propagated": _late_by(prev_arr_delay) and _late_by(dep_delay),
        "relocated": flight["origin"] != prev_dest,
    }


def _late_by(minutes: float | None) -> bool:
    return minutes is not None and minutes > DELAYED_MINUTES  # NaN > 15 is False too


def _no_tailnum_row(flight: dict[str, Any], event_time: float) -> dict[str, Any]:
    return {
        "row": flight["row"],
        "carrier": flight["carrier"],
        "flight": flight["flight"],
        "origin": flight["origin"],
        "dest": flight["dest"],
        "event_time": event_time,
        "dep_delay": flight["dep_delay"],
        "arr_delay": flight["arr_delay"],
    }


NO_TAILNUM_KEY = ""  # the ``aircraft`` key of a flight without a tail number


def has_tailnum(batch: Any) -> Any:
    """The rows of an Arrow batch that have a tail number (aircraft_sessions' input).

    Here, not in ``job``: Spark's workers unpickle it by reference to its module, and
    this one they import anyway (``job`` would bring pandas, redis and aiohttp)."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]  # pyarrow ships no type hints

    return pc.not_equal(batch.column("aircraft"), NO_TAILNUM_KEY)
