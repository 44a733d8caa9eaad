"""Window assigners (Flink's ``WindowAssigner`` family; PyFlink's names).

An assigner maps a record (value, timestamp in seconds) to its windows and
names the default trigger. Tumbling and sliding assigners place records on their
``grid`` (``aec.windowing.grid``: ``start = offset + k * slide``), so a window rebuilt
from a timer's timestamp is bit-for-bit the window a record was put in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from aec.elements import Time
from aec.windowing.grid import Grid
from aec.windowing.triggers import EventTimeTrigger, NeverTrigger, ProcessingTimeTrigger, Trigger
from aec.windowing.windows import GlobalWindow, TimeWindow, Window


def _positive(owner: str, name: str, value: object) -> Time:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name} must be a number of seconds, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{owner}: {name} must be > 0 seconds and finite, got {value!r}")
    return value


def _offset(owner: str, offset: object, bound: Time, bound_name: str) -> Time:
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        raise TypeError(f"{owner}: offset must be a number of seconds, got {offset!r}")
    if not abs(offset) < bound:
        raise ValueError(f"{owner}: |offset| must be < {bound_name} ({bound!r}), got {offset!r}")
    return offset


class WindowAssigner:
    """Base of all assigners.

    Attributes:
        event_time: windows follow the watermark (else the operator's clock).
        merging: windows merge (sessions).
    """

    event_time = True
    merging = False

    def assign_windows(self, value: Any, timestamp: Time) -> Sequence[Window]:
        """The windows of a record at ``timestamp`` seconds (event or processing time)."""
        raise NotImplementedError

    def default_trigger(self) -> Trigger:
        return EventTimeTrigger() if self.event_time else ProcessingTimeTrigger()

    def describe(self) -> str:
        """A stable text naming the assigner and its parameters (checkpoint metadata)."""
        return repr(self)


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` seconds starting every ``slide`` seconds on the grid
    ``offset + k * slide`` (Flink's ``SlidingEventTimeWindows``); a record belongs
    to every window with ``start <= t < start + size``.

    Raises:
        ValueError: ``size`` or ``slide`` <= 0, or ``|offset| >= slide``.
    """

    def __init__(self, size: Time, slide: Time, offset: Time = 0) -> None:
        name = type(self).__name__
        self.size = _positive(name, "size", size)
        self.slide = _positive(name, "slide", slide)
        self.offset = _offset(name, offset, self.slide, "slide")
        self.grid = Grid(self.offset, self.slide, self.size)

    @classmethod
    def of(cls, size: Time, slide: Time, offset: Time = 0) -> SlidingEventTimeWindows:
        return cls(size, slide, offset)

    def assign_windows(self, value: object, timestamp: Time) -> list[TimeWindow]:
        return self.grid.windows(timestamp)

    def __repr__(self) -> str:
        return f"{type(self).__name__}.of({self.size!r}, {self.slide!r}, {self.offset!r})"


class TumblingEventTimeWindows(SlidingEventTimeWindows):
    """Back-to-back windows of ``size`` seconds: ``[offset + k*size, offset + (k+1)*size)``
    (Flink's ``TumblingEventTimeWindows``).

    Raises:
        ValueError: ``size`` <= 0 or ``|offset| >= size``.
    """

    def __init__(self, size: Time, offset: Time = 0) -> None:
        name = type(self).__name__
        self.size = self.slide = _positive(name, "size", size)
        self.offset = _offset(name, offset, self.size, "size")
        self.grid = Grid(self.offset, self.slide, self.size)

    @classmethod
    def of(cls, size: Time, offset: Time = 0) -> TumblingEventTimeWindows:  # type: ignore[override]
        return cls(size, offset)

    def assign_windows(self, value: object, timestamp: Time) -> list[TimeWindow]:
        grid = self.grid
        return [grid.window(grid.index(timestamp))]

    def __repr__(self) -> str:
        return f"{type(self).__name__}.of({self.size!r}, {self.offset!r})"


class SlidingProcessingTimeWindows(SlidingEventTimeWindows):
    """``SlidingEventTimeWindows`` over the operator's clock (processing time)."""

    event_time = False


class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    """``TumblingEventTimeWindows`` over the operator's clock (processing time)."""

    event_time = False


class EventTimeSessionWindows(WindowAssigner):
    """Session windows: a record's window is ``[t, t + gap)``; windows that overlap
    or touch merge into their cover (Flink's ``EventTimeSessionWindows``).
    ``with_gap(seconds)`` or ``with_dynamic_gap(fn(value) -> seconds)``.

    Raises:
        ValueError: a gap <= 0 (at construction; a dynamic gap <= 0 fails the run).
    """

    merging = True

    def __init__(self, gap: Time | None = None, gap_fn: Callable[[Any], Time] | None = None):
        name = type(self).__name__
        if gap_fn is None:
            self.gap: Time | None = _positive(name, "gap", gap)
        else:
            if not callable(gap_fn):
                raise TypeError(f"{name}: the dynamic gap must be callable, got {gap_fn!r}")
            self.gap = None
        self.gap_fn = gap_fn

    @classmethod
    def with_gap(cls, gap: Time) -> EventTimeSessionWindows:
        return cls(gap)

    @classmethod
    def with_dynamic_gap(cls, fn: Callable[[Any], Time]) -> EventTimeSessionWindows:
        return cls(None, fn)

    def assign_windows(self, value: object, timestamp: Time) -> list[TimeWindow]:
        gap = self.gap
        if gap is None:
            gap = self.gap_fn(value)  # type: ignore[misc]
            if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap > 0:
                raise ValueError(
                    f"{type(self).__name__}: the dynamic gap for {value!r} is {gap!r}; "
                    "it must be a number of seconds > 0"
                )
        end = timestamp + gap
        if end <= timestamp:  # the float sum absorbed the gap: the session would be empty
            raise ValueError(
                f"{type(self).__name__}: a gap of {gap!r} s after timestamp {timestamp!r} "
                f"is below the float's resolution there ({math.ulp(timestamp)!r} s): give "
                "a larger gap, or timestamps nearer zero"
            )
        exact = type(timestamp) is int or (type(timestamp) is float and timestamp == timestamp)
        if exact and end == end:  # numbers, not NaN (-inf + inf is), end > timestamp
            return [TimeWindow.trusted(timestamp, end)]
        return [TimeWindow(timestamp, end)]  # its checks name what is wrong

    def __repr__(self) -> str:
        gap = self.gap if self.gap_fn is None else getattr(self.gap_fn, "__qualname__", "fn")
        return f"{type(self).__name__}(gap={gap!r})"


class ProcessingTimeSessionWindows(EventTimeSessionWindows):
    """``EventTimeSessionWindows`` over the operator's clock (processing time)."""

    event_time = False


class GlobalWindows(WindowAssigner):
    """One ``GlobalWindow`` per key; its default trigger never fires (Flink's
    ``GlobalWindows``): give a trigger such as ``CountTrigger.of(n)``."""

    event_time = False

    @classmethod
    def create(cls) -> GlobalWindows:
        return cls()

    def assign_windows(self, value: object, timestamp: Time) -> list[GlobalWindow]:
        return [GLOBAL_WINDOW]

    def default_trigger(self) -> Trigger:
        return NeverTrigger()

    def __repr__(self) -> str:
        return "GlobalWindows.create()"


GLOBAL_WINDOW = GlobalWindow()
