"""The flights job's two keyed operators and their rows.

* ``RouteHourly`` (key ``route``, callback-chain style): tumbling one-hour
  event-time windows per route, kept in MapState ``window start -> accumulator``
  and fired by an event-time timer at the window's end. A record whose window
  has already fired (window end <= the watermark it sees) goes to the ``late``
  side output instead.
* ``Rotations`` (key ``aircraft``, ``async def`` style): ValueState holds the
  aircraft's previous flight in arrival order; one output row per flight.
  Rows without a tail number go to the ``no_tailnum`` side output.

Times are float seconds with naive local timestamps read as UTC (see
``spark_glue.flights.data``); the output schemas turn them back into naive
``timestamp_ntz`` values.
"""

from __future__ import annotations

import math
from typing import Any

from aec import (
    KeyedProcessFunction,
    MapStateDescriptor,
    ValueStateDescriptor,
)

HOUR = 3600
DELAYED_MINUTES = 15  # FAA's definition of a delayed flight
DATASETS = ("route_hourly", "late", "rotations", "no_tailnum")

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
NO_TAILNUM_SCHEMA = (
    "row long, carrier string, flight long, origin string, dest string, "
    "event_time timestamp_ntz, dep_delay double, arr_delay double"
)


class RouteHourly(KeyedProcessFunction):
    """Hourly departures per route; callback-chain style.

    State: MapState ``windows``: window start (int seconds) -> accumulator
    ``(flights, cancelled, delays counted, delay sum, delay max)`` over non-null
    ``dep_delay`` (minutes). Output dicts match ``ROUTE_HOURLY_SCHEMA``.
    """

    def open(self, ctx: Any) -> None:
        self.windows = ctx.get_state(MapStateDescriptor("windows"))

    def process_element(self, flight: dict[str, Any], ctx: Any) -> Any:
        start = math.floor(ctx.timestamp / HOUR) * HOUR
        end = start + HOUR
        watermark = ctx.timer_service.current_watermark()
        if end <= watermark:  # the window's timer (at end) has already fired
            ctx.side_output("late", _late_row(flight, ctx.timestamp, start, watermark))
            return None
        ctx.timer_service.register_event_time_timer(end)  # once per (route, window)
        delay, cancelled = flight["dep_delay"], flight["cancelled"]
        return self.windows.async_get(start).then_compose(
            lambda acc: self.windows.async_put(start, _accumulate(acc, delay, cancelled))
        )

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        start = int(timestamp) - HOUR
        origin, dest = ctx.current_key.split("-", 1)

        def emit(acc: tuple | None) -> Any:
            if acc is not None:
                ctx.output(_window_row(origin, dest, start, acc))
            return self.windows.async_remove(start)

        return self.windows.async_get(start).then_compose(emit)


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


class Rotations(KeyedProcessFunction):
    """Each aircraft's consecutive flights (in arrival order); ``async def`` style.

    State: ValueState ``previous``: ``(event_time s, origin, dest, arr_delay)``
    of the aircraft's last flight. Output dicts match ``ROTATIONS_SCHEMA``: the
    ``prev_*``, ``gap_minutes``, ``propagated`` and ``relocated`` columns are
    null on an aircraft's first flight; ``propagated`` is previous
    ``arr_delay`` > 15 and this ``dep_delay`` > 15 (False when either is
    missing); ``relocated`` is origin != previous destination.
    """

    def open(self, ctx: Any) -> None:
        self.previous = ctx.get_state(ValueStateDescriptor("previous"))

    async def process_element(self, flight: dict[str, Any], ctx: Any) -> None:
        if flight["tailnum"] is None:
            ctx.side_output("no_tailnum", _no_tailnum_row(flight, ctx.timestamp))
            return
        previous = await self.previous.async_value()
        ctx.output(_rotation_row(flight, ctx.timestamp, previous))
        await self.previous.async_update(
            (ctx.timestamp, flight["origin"], flight["dest"], flight["arr_delay"])
        )


def _rotation_row(flight: dict[str, Any], event_time: float, previous: tuple | None) -> dict:
    row = {
        "tailnum": flight["tailnum"],
        "event_time": event_time,
        "origin": flight["origin"],
        "dest": flight["dest"],
        "dep_delay": flight["dep_delay"],
    }
    if previous is None:
        return row
    prev_time, prev_origin, prev_dest, prev_arr_delay = previous
    row.update(
        prev_origin=prev_origin,
        prev_dest=prev_dest,
        prev_arr_delay=prev_arr_delay,
        gap_minutes=(event_time - prev_time) / 60.0,
        propagated=_late_by(prev_arr_delay) and _late_by(flight["dep_delay"]),
        relocated=flight["origin"] != prev_dest,
    )
    return row


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
