"""Processing-time clocks: where ``current_processing_time()`` comes from.

The operator reads its clock once per input element (``poll``); a clock
advance cuts an epoch, like a watermark does for event time, so processing-time
timers fire only after the records that arrived before the advance have
finished (the synchronous answer). Records, timers and state TTL see the
clock value of their arrival, never a fresh reading, so a run with a
deterministic clock is reproducible.
"""

from __future__ import annotations

import decimal
import math
import numbers
import time
from collections.abc import Sequence
from typing import Any, cast


class Clock:
    """A source of processing time in seconds.

    Attributes:
        deterministic: True when readings depend only on how often ``now`` was
            called (test clocks); such clocks are polled at every input element
            and every advance cuts an epoch. A wall clock is polled only while
            processing-time timers or TTL state are in use, and cuts an epoch
            only when a processing-time timer is due.
    """

    deterministic = False

    def now(self) -> float | int:
        raise NotImplementedError


def check_clock(clock: object) -> Clock:
    """``clock`` if it is an ``aec.clock.Clock``; TypeError naming it otherwise."""
    if not isinstance(clock, Clock):
        raise TypeError(
            f"clock must be an aec.clock.Clock (SystemClock, ManualClock, ScriptedClock or "
            f"a subclass with now()), got {clock!r:.200} ({type(clock).__name__})"
        )
    return clock


def read_clock(clock: Clock) -> float | int:
    """``clock.now()``: an int or a float as it is, anything else through
    ``checked_reading`` (converted, or TypeError/ValueError naming the clock)."""
    now: Any = clock.now()
    if (type(now) is not float and type(now) is not int) or now != now:
        return checked_reading(clock, now)
    return now


def checked_reading(clock: Clock, now: object) -> float | int:
    """``now``, a reading of ``clock``, as the seconds the engine computes with: an
    ``int`` or ``float`` (or a subclass's, ``numpy.float64``) as it is, another integral
    number as an ``int`` and another real number as a ``float`` (``numpy.int64``,
    ``numpy.float32``, ``Decimal``, ``Fraction``: a clock fed from a pandas column
    returns ``numpy.int64``).

    Raises:
        TypeError: ``now`` is not a real number (a ``bool`` neither), naming the clock.
        ValueError: ``now`` is NaN (no time is before or after it), naming the clock.
    """
    if not _is_number(now):
        raise TypeError(
            f"{type(clock).__name__}.now() returned {now!r} ({type(now).__name__}): a "
            "clock reads seconds as an int or a float"
        )
    reading: float | int
    if isinstance(now, (int, float)):
        reading = now  # a subclass's (numpy.float64) kept as it is
    elif isinstance(now, numbers.Integral):
        reading = int(now)
    else:
        reading = float(cast(Any, now))  # a Real or a Decimal: both convert
    if reading != reading:
        raise ValueError(f"{type(clock).__name__}.now() returned NaN: a clock reads seconds")
    return reading


def _is_number(value: object) -> bool:
    """A real number or a ``Decimal``, not a ``bool``."""
    return not isinstance(value, bool) and isinstance(value, (numbers.Real, decimal.Decimal))


class SystemClock(Clock):
    """Wall-clock seconds since the Unix epoch, quantized to ``granularity`` seconds
    (default 0.05) so that a stream of records does not cut an epoch per record."""

    def __init__(self, granularity: float = 0.05) -> None:
        if not granularity > 0:
            raise ValueError(f"granularity must be > 0 seconds, got {granularity!r}")
        self.granularity = granularity

    def now(self) -> float:
        g = self.granularity
        return math.floor(time.time() / g) * g


class ManualClock(Clock):
    """A clock that moves only when told: ``advance(seconds)`` or ``set(t)``."""

    deterministic = True

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back {seconds!r} seconds")
        self._now += seconds

    def set(self, timestamp: float) -> None:
        if timestamp < self._now:
            raise ValueError(f"a clock cannot go back from {self._now!r} to {timestamp!r}")
        self._now = float(timestamp)


class ScriptedClock(Clock):
    """Advances by ``advances[i]`` seconds at the i-th reading (0 afterwards), so
    two runs over the same input see the same times at the same elements."""

    deterministic = True

    def __init__(self, advances: Sequence[float], start: float = 0.0) -> None:
        self._advances = list(advances)
        self._reads = 0
        self._now = float(start)

    def now(self) -> float:
        if self._reads < len(self._advances):
            self._now += self._advances[self._reads]
        self._reads += 1
        return self._now
