"""Windows: ``TimeWindow`` (a half-open interval of seconds) and ``GlobalWindow``.

After Flink's ``org.apache.flink.streaming.api.windowing.windows``. aec's
timestamps are real seconds, so a ``TimeWindow`` holds ``start <= t < end``
and fires when the watermark reaches ``end`` (Flink's millisecond windows use
``max_timestamp() == end - 1``). Where windows start: ``aec.windowing.grid``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aec.elements import Time
from aec.state.serialization import register_type
from aec.windowing.intervals import touch


class Window(Protocol):
    """What the package reads of any window (``TimeWindow``, ``GlobalWindow``, a custom
    assigner's): its start and end, seconds (a window fires at its end; Flink's
    ``maxTimestamp``)."""

    @property
    def start(self) -> Time: ...

    @property
    def end(self) -> Time: ...


@dataclass(frozen=True, order=True, slots=True)
class TimeWindow:
    """The interval ``[start, end)`` in seconds; frozen, hashable, ordered by (start, end).

    Raises:
        TypeError: ``start`` or ``end`` is not a number.
        ValueError: ``end < start`` or either is NaN.
    """

    start: Time
    end: Time

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"TimeWindow {name} must be a number of seconds, got {value!r}")
            if math.isnan(value):
                raise ValueError(f"TimeWindow {name} is NaN")
        if self.end < self.start:
            raise ValueError(f"TimeWindow end {self.end!r} is before its start {self.start!r}")

    def max_timestamp(self) -> Time:
        """The window's firing time in aec: ``end`` (Flink: ``end - 1`` ms)."""
        return self.end

    def intersects(self, other: TimeWindow) -> bool:
        """True when the windows overlap or touch (Flink's ``TimeWindow.intersects``):
        ``self.start <= other.end and self.end >= other.start`` (``intervals.touch``)."""
        return touch(self.start, self.end, other.start, other.end)

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window holding both (two valid windows: no checks)."""
        return TimeWindow.trusted(min(self.start, other.start), max(self.end, other.end))

    def __repr__(self) -> str:
        return f"TimeWindow({self.start!r}, {self.end!r})"

    def __reduce__(self) -> tuple[Callable[[Time, Time], TimeWindow], tuple[Time, Time]]:
        # session sets in byte stores pickle windows on every access: the slots
        # dataclass default (``fields()`` per dump and load) cost 1.8 s of a 60 s profile
        return _time_window, (self.start, self.end)

    @classmethod
    def trusted(cls, start: Time, end: Time) -> TimeWindow:
        """A window from numbers the caller computed (no checks: the hot path; a key's
        session set is decoded into windows at each of its records)."""
        window = _new(cls)
        _set_start(window, start)  # the slots' own setters: no frozen __setattr__
        _set_end(window, end)
        return window


_new = object.__new__
_set_start = TimeWindow.__dict__["start"].__set__
_set_end = TimeWindow.__dict__["end"].__set__


def _time_window(start: Time, end: Time) -> TimeWindow:
    """Unpickles a ``TimeWindow`` (its ``__reduce__``): the checks ran when it was made."""
    return TimeWindow.trusted(start, end)


@dataclass(frozen=True)
class GlobalWindow:
    """The one window of ``GlobalWindows``: every record of a key, never ends
    (``end`` is ``math.inf``); fires only through a trigger."""

    @property
    def start(self) -> Time:
        return -math.inf

    @property
    def end(self) -> Time:
        return math.inf

    def max_timestamp(self) -> Time:
        return math.inf

    def __repr__(self) -> str:
        return "GlobalWindow()"


def window_key(window: object) -> object:
    """The map key a window's state is stored under: ``(start, end)`` for a
    ``TimeWindow`` (a tuple, so the byte backends encode ``1`` and ``1.0`` alike),
    ``"global"`` for the ``GlobalWindow``, the window itself otherwise."""
    if type(window) is TimeWindow:
        return (window.start, window.end)
    if type(window) is GlobalWindow:
        return "global"
    return window


# Windows are state (session sets, timer indexes): the safe serializer stores them as
# plain data and rebuilds them through their checks (aec.state.serialization).
register_type(TimeWindow, 32, lambda w: (w.start, w.end), lambda p: TimeWindow(*p))
register_type(GlobalWindow, 33, lambda w: None, lambda p: GlobalWindow())
