"""Hourly windows per route with allowed lateness and a late-data side output.

Needs only the engine (``pip install aec``). Run: ``python examples/windows_late_data.py``.

``window(...)`` turns an assigner and an ``AggregateFunction`` into a
``KeyedProcessFunction`` (Flink's ``WindowOperator`` on async state). A window fires
when the watermark reaches its end; a record that arrives while the watermark is
within ``allowed_lateness`` of the end makes it fire again with the updated result;
a record later than that goes to the ``late_data_tag`` side output.
"""

from __future__ import annotations

from typing import Any

from aec import AggregateFunction, Record, Watermark, run_keyed
from aec.windowing import TumblingEventTimeWindows, window

HOUR = 3600.0


class MeanDelay(AggregateFunction):
    """(flights, total delay) -> mean delay in minutes."""

    def create_accumulator(self) -> tuple[int, float]:
        return (0, 0.0)

    def add(self, value: Any, accumulator: tuple[int, float]) -> tuple[int, float]:
        return (accumulator[0] + 1, accumulator[1] + value)

    def get_result(self, accumulator: tuple[int, float]) -> float:
        return round(accumulator[1] / accumulator[0], 2)

    def merge(self, a: tuple[int, float], b: tuple[int, float]) -> tuple[int, float]:
        return (a[0] + b[0], a[1] + b[1])


def main() -> None:
    hourly = window(
        TumblingEventTimeWindows.of(HOUR),
        aggregate=MeanDelay(),
        allowed_lateness=600.0,  # seconds: a window keeps its state 10 minutes past its end
        late_data_tag="late",
    )
    source: list[Record | Watermark] = [
        Record("JFK-LAX", 12.0, 100.0),  # delay minutes, event time in seconds
        Record("JFK-LAX", 20.0, 1800.0),
        Record("EWR-SFO", 5.0, 2000.0),
        Watermark(HOUR),  # the first hour's windows fire: 16.0 and 5.0
        Record("JFK-LAX", 40.0, 3000.0),  # within the lateness: fires again, 24.0
        Watermark(HOUR + 900.0),  # past end + lateness: the hour's state is cleaned up
        Record("EWR-SFO", 7.0, 1000.0),  # too late for any window: side output
        Record("EWR-SFO", 9.0, 4000.0),
    ]
    result = run_keyed(source, hourly)
    print("outputs:", result.outputs)
    print("late:", result.side_outputs.get("late"))


if __name__ == "__main__":
    main()
