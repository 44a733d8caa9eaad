"""One side's buffered records of an interval join, in time buckets of MapState.

Flink's interval join keeps a ``MapState<timestamp, List<entry>>`` per side and
reads the whole other buffer for every record (``otherBuffer.asyncEntries()``,
then a bounds check per timestamp), so a record's cost grows with the buffer.
Here a side's MapState maps a *bucket* (``floor(timestamp / width)``, ``width`` the
interval's length) to the list of its entries in arrival order: the records that
can pair with a new record lie in the one or two buckets its interval covers, so
it reads those (point gets in one batch) and never the rest.

An entry is ``(timestamp, watermark, value)``: ``watermark`` is the operator's
watermark when the record arrived. An entry is *dead* for code that sees watermark
``w`` when its cleanup time is ``<= w`` and ``w`` is above the watermark it arrived
with: then a watermark advance to at least its cleanup time closed an epoch after
it arrived, so its cleanup timer (DESIGN rule 8) has fired or fires in that epoch.
Reads skip dead entries and writes drop them, so what a record sees does not
depend on whether its key's cleanup timers ran before it (they may not have, in
``parallel`` watermark order); the timers only free the memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from aec.state.future import StateFuture, combine_all
from aec.state.handles import MapState

Entry = tuple[float, float, Any]  # (timestamp, arrival watermark, value)
_MARGIN = 1e-12  # relative: a bucket range widened by this many ulps' worth at each end


class TimeBuffer:
    """The entries of one side of one key (the running record's), in time buckets.

    Args:
        state: the side's ``MapState`` (bucket index -> list of entries).
        width: bucket width in seconds (> 0, finite).
        cleanup_time: ``fn(timestamp) -> seconds``: when an entry of this side is
            removed (Flink's cleanup time of its side).
    """

    __slots__ = ("state", "width", "cleanup_time")

    def __init__(self, state: MapState, width: float, cleanup_time: Callable[[float], float]):
        self.state = state
        self.width = width
        self.cleanup_time = cleanup_time

    def bucket(self, timestamp: float) -> int:
        """The bucket holding entries of ``timestamp``."""
        return math.floor(timestamp / self.width)

    def buckets(self, low: float, high: float) -> range:
        """Every bucket that may hold a timestamp in ``[low, high]`` (widened by a
        rounding margin, so a bound computed as ``a + b`` never misses its bucket)."""
        margin = _MARGIN * max(abs(low), abs(high), self.width)
        return range(self.bucket(low - margin), self.bucket(high + margin) + 1)

    def dead(self, entry: Entry, watermark: float) -> bool:
        """Whether ``entry`` is cleaned up for code seeing ``watermark`` (module doc)."""
        return entry[1] < watermark and self.cleanup_time(entry[0]) <= watermark

    def read(self, buckets: range) -> StateFuture:
        """A future of the lists stored in ``buckets`` (None for an empty bucket), in
        bucket order."""
        get = self.state.async_get
        return combine_all([get(b) for b in buckets])

    def live(self, stored: list[Any], watermark: float) -> list[Entry]:
        """The live entries of buckets read by ``read``, in bucket order, each bucket's
        in arrival order."""
        entries: list[Entry] = []
        for bucket in stored:
            if bucket:
                entries += [e for e in bucket if not self.dead(e, watermark)]
        return entries

    def write(
        self, bucket: int, stored: list[Entry] | None, watermark: float
    ) -> StateFuture | None:
        """Store ``bucket`` as ``stored`` (as read) without its dead entries; None if
        nothing changed, else the write's future (a remove when it empties)."""
        if not stored:
            return None
        kept = [e for e in stored if not self.dead(e, watermark)]
        if len(kept) == len(stored):
            return None
        if not kept:
            return self.state.async_remove(bucket)
        return self.state.async_put(bucket, kept)

    def append(
        self, bucket: int, stored: list[Entry] | None, entry: Entry, watermark: float
    ) -> StateFuture:
        """Store ``bucket`` as ``stored`` (as read) plus ``entry``, without dead entries."""
        kept = [e for e in stored if not self.dead(e, watermark)] if stored else []
        kept.append(entry)
        return self.state.async_put(bucket, kept)
