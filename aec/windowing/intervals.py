"""The rule on time intervals that session windows merge by, on plain numbers, so the
compiled session kernel asks it without a call into ``TimeWindow`` (a dataclass, kept
interpreted): ``TimeWindow.intersects`` and ``aec.windowing.merging`` both ask here.
"""

from __future__ import annotations

from aec.elements import Time


def touch(start: Time, end: Time, other_start: Time, other_end: Time) -> bool:
    """Whether ``[start, end)`` and ``[other_start, other_end)`` (seconds) overlap or
    touch: ``start <= other_end and end >= other_start`` (Flink's
    ``TimeWindow.intersects``, which merges sessions that meet end to start)."""
    return bool(start <= other_end and end >= other_start)  # numpy times: numpy.bool
