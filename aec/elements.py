"""Stream elements: keyed records and watermarks, validated at the boundary."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, TypeAlias, final

Time: TypeAlias = Any
"""A time in seconds (event time, a watermark, a timer): an int, a float or a float
subclass such as ``numpy.float64``, kept as given (an int is exact beyond 2**53:
nanoseconds). ``Any``, not ``float | int``: compiled, a ``float`` is a C double (an int
would be rounded) and a comparison of two ``float | int`` is a ``bool`` (numpy's
``numpy.bool`` would be refused)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One keyed input record.

    Attributes:
        key: hashable, not None; decides the key group and same-key order.
        value: the payload handed to ``process_element``.
        timestamp: event time in seconds (int or float, not NaN), or None.
    """

    key: Hashable
    value: object
    timestamp: float | int | None = None


@final  # the engine tells watermarks by ``type(element) is Watermark``
@dataclass(frozen=True, slots=True, order=True)
class Watermark:
    """Event-time progress: no record with timestamp <= ``timestamp`` follows.

    Compares and orders by ``timestamp`` (seconds; ``math.inf`` at end of input).
    """

    timestamp: float | int


@dataclass(frozen=True, slots=True)
class ClockTick:
    """Internal: the processing-time clock advanced to ``timestamp`` (seconds) while
    event time stood at ``watermark``; closes an epoch, never emitted."""

    timestamp: float | int
    watermark: float | int


def check_key(key: object) -> None:
    """Raise TypeError unless ``key`` can key state (hashable, not None); ValueError for NaN."""
    if key is None:
        raise TypeError("record key is None: every record needs a hashable, non-None key")
    if type(key) is float and key != key:
        raise ValueError("record key is NaN: NaN is not equal to itself, so it cannot key state")
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"record key {key!r} of type {type(key).__name__} is unhashable: "
            "use an immutable key (str, int, tuple, ...)"
        ) from None


def check_timestamp(timestamp: object, what: str = "record timestamp") -> None:
    """Raise TypeError/ValueError unless ``timestamp`` is a real number (or None)."""
    if timestamp is None:
        return
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise TypeError(
            f"{what} must be a number of seconds, got {timestamp!r} ({type(timestamp).__name__})"
        )
    try:
        nan = math.isnan(timestamp)
    except OverflowError:  # an int no float holds
        bits = int(timestamp).bit_length()
        raise ValueError(
            f"{what} is an int of {bits} bits, beyond the float range (+-1.8e308 s)"
        ) from None
    if nan:
        raise ValueError(f"{what} is NaN")
