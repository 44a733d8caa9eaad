"""Periodic bounded-out-of-orderness watermarks (Flink's ``BoundedOutOfOrdernessWatermarks``).

The glue feeds every record's event time to ``BoundedOutOfOrderness.on_record``;
every ``interval`` records it returns ``max event time seen - delay`` when that
is ahead of the last watermark it returned, so watermarks never regress and
never repeat. Flink emits on a wall-clock period; counting records instead
keeps a batch run deterministic (same input, same watermarks).

Unlike Flink (which subtracts one more millisecond) the watermark is exactly
``max - delay``: a record with that timestamp is already late, so a delay of
``d`` tolerates records that arrive strictly less than ``d`` behind the
maximum.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any


def delay_seconds(delay: float | int | dt.timedelta | None) -> float:
    """Watermark delay in seconds from a number of seconds or a ``timedelta``.

    None means 0 (watermarks follow the largest event time exactly).

    Raises:
        TypeError: not a number or timedelta. ValueError: negative or NaN.
    """
    if delay is None:
        return 0.0
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise TypeError(
            f"watermark_delay must be seconds (a number) or a datetime.timedelta, got {delay!r}"
        )
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"watermark_delay must be >= 0 seconds, got {delay!r}")
    return seconds


class BoundedOutOfOrderness:
    """Watermark generator for one partition's record stream.

    Args:
        delay: seconds of out-of-orderness tolerated (>= 0).
        interval: records between watermark checks (>= 1).

    Attributes:
        max_timestamp: largest event time seen so far (``-inf`` before any).
        current: the last watermark returned (``-inf`` before any).
        emitted: how many watermarks ``on_record`` returned.
    """

    def __init__(self, delay: float, interval: int) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"watermark_interval must be an int >= 1, got {interval!r}")
        self.delay = delay_seconds(delay)
        self.interval = interval
        self.max_timestamp = -math.inf
        self.current = -math.inf
        self.emitted = 0
        self._count = 0

    def on_record(self, timestamp: float | None) -> float | None:
        """Account one record (None: no event time); return a new watermark or None.

        Called after the record was handed to the operator, so the watermark it
        returns follows that record.
        """
        if timestamp is not None and timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        self._count += 1
        if self._count < self.interval:
            return None
        self._count = 0
        return self._advance()

    def until_check(self) -> int:
        """Records until the next interval check (>= 1)."""
        return self.interval - self._count

    def on_records(self, count: int, max_timestamp: float | None) -> float | None:
        """Account ``count`` records (at most ``until_check()``) whose largest event
        time is ``max_timestamp`` (None: none has one); the same answer as
        ``on_record`` for each of them, for the last one."""
        if max_timestamp is not None and max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        self._count += count
        if self._count < self.interval:
            return None
        self._count = 0
        return self._advance()

    def check_now(self) -> float | None:
        """A watermark now, between intervals (a micro-batch's end): ``max event time
        - delay`` if it is finite and ahead of the last one, else None."""
        return self._advance()

    def restarted(self) -> BoundedOutOfOrderness:
        """A generator with this one's progress (highest event time, last watermark)
        whose record count starts again (a kept operator's next micro-batch)."""
        fresh = BoundedOutOfOrderness(self.delay, self.interval)
        fresh.max_timestamp, fresh.current = self.max_timestamp, self.current
        return fresh

    def progress(self) -> dict[str, float]:
        """What a checkpoint keeps: ``{"max_timestamp", "current"}`` (seconds)."""
        return {"max_timestamp": self.max_timestamp, "current": self.current}

    def resume(self, progress: list[dict[str, Any]]) -> None:
        """Continue from the ``progress()`` of one or more checkpoints (a restore after
        rescaling): the highest event time seen, the lowest watermark emitted."""
        if progress:
            self.max_timestamp = max(float(p["max_timestamp"]) for p in progress)
            self.current = min(float(p["current"]) for p in progress)

    def _advance(self) -> float | None:
        candidate = self.max_timestamp - self.delay
        # no progress (or nothing seen yet): stay silent; an infinite event time never
        # ends the input (only the end of the data does, with its own Watermark(inf))
        if candidate <= self.current or candidate == math.inf:
            return None
        self.current = candidate
        self.emitted += 1
        return candidate
