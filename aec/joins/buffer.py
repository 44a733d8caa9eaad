"""The buffered records of an interval join, in time buckets of one MapState.

Flink's interval join keeps a ``MapState<timestamp, List<entry>>`` per side and
reads the whole other buffer for every record (``otherBuffer.asyncEntries()``,
then a bounds check per timestamp), so a record's cost grows with the buffer.
Here one MapState maps a *bucket* (``floor(cleanup time / width)``, ``width`` the
interval's length) to the entries of both sides whose cleanup times fall in it
(``(left entries, right entries)``, each list in arrival order). A side's cleanup
time is its timestamp plus a constant, so the records that can pair with a new
record (an interval of timestamps) lie in the one or two buckets of their cleanup
times: the record reads those (point gets in one batch) and never the rest, and its
own bucket is always one of them, so a record costs at most two reads and one
write. A cleanup timer fires at the cleanup time of the records it removes, which
all lie in one bucket: one read and at most one write.

An entry is ``[timestamp, cleanup time, watermark, value]``: ``watermark`` is the
operator's watermark when the record arrived; the value is kept as it is, and the
backend stores buckets with the state's serializer like any state (the job's
``AecConfig.state_serializer``: msgpack unless the job opted in to pickle), so stored
bytes run no code unless the job opted in, and a value the serializer cannot store
fails the backend's write (a MemoryBackend's snapshot) with the serializer's error
naming its type. Entries and buckets are lists, which every serializer stores
natively (msgpack stores a tuple as an extension type, several times dearer per
entry, and a bucket is rewritten by each record that joins it). Encoding each value
once on its way in (and decoding it on a match) would spare a serializing backend
(RocksDB, SlateDB, Redis) re-encoding the bucket's values at each rewrite, about
15 % of a record's cost there when records are not bundled, but would cost a
MemoryBackend as much, and values msgpack stores as another type (a named tuple as
a tuple) would then differ between record-by-record and bundled runs.

An entry is *dead* for code that sees watermark ``w`` when its cleanup time is
``<= w`` and ``w`` is above the watermark it arrived with: then a watermark advance
to at least its cleanup time closed an epoch after it arrived, so its cleanup timer
(``docs/semantics.md``, rule 8) has fired or fires in that epoch. Reads skip dead entries and
writes drop them, so what a record sees does not depend on whether its key's
cleanup timers ran before it (they may not have, in ``parallel`` watermark order);
the timers only free the memory.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any

from aec.elements import Time
from aec.state.future import StateFuture, combine_all
from aec.state.handles import MapState

Entry = list[Any]  # [timestamp, cleanup time, arrival watermark, value]
Bucket = list[list[Entry]]  # [left entries, right entries], each in arrival order
LEFT, RIGHT = 0, 1
# Bucket widths: a float timestamp of today (about 1.7e9 s) resolves 2.4e-7 s, so
# buckets narrower than a microsecond would only multiply the buckets a record reads
MIN_WIDTH = 1e-6
_SPAN = sys.float_info.max  # the largest float: bounds a huge span apart, and overflows
# A bucket range is widened at each end by this many units in the last place: a bound
# computed with two roundings (``timestamp + bound + shift``) is within a few of the
# exact one
_ULPS = 8
_FEW_BUCKETS = 64  # a record reads one or two buckets, up to this many by their range


def bucket_width(lower: Time, upper: Time) -> Time:
    """The bucket width (seconds) of an interval join with finite bounds ``lower <=
    upper``: the interval's length, at least ``MIN_WIDTH`` and at most the largest
    float; a single point (``lower == upper``) gets buckets of a second."""
    if upper <= lower:
        return 1.0
    return min(max(upper - lower, MIN_WIDTH), _SPAN)  # upper - lower may overflow to inf


def entry(timestamp: Time, cleanup: Time, watermark: Time, value: object) -> Entry:
    """A record's entry."""
    return [timestamp, cleanup, watermark, value]


def live(entries: list[Entry], watermark: Time) -> list[Entry]:
    """The entries not dead for code seeing ``watermark`` (see the module doc: dead is
    ``cleanup <= watermark`` and ``arrival watermark < watermark``), in order."""
    return [e for e in entries if e[1] > watermark or e[2] >= watermark]


class JoinBuffer:
    """Both sides' entries of the running record's key, in time buckets.

    Args:
        state: the ``MapState`` (bucket index -> ``Bucket``).
        width: bucket width in seconds (``bucket_width``: > 0, finite).
        bound: the larger magnitude of the join's bounds (seconds, finite): the
            rounding of a record's interval grows with it.
    """

    __slots__ = ("state", "width", "_slack")

    def __init__(self, state: MapState, width: Time, bound: Time) -> None:
        self.state = state
        self.width = width
        self._slack = _ULPS * math.ulp(bound)  # the bounds' part of a range's margin

    def bucket(self, timestamp: Time) -> int:
        """The bucket holding entries of ``timestamp``."""
        bucket: int = math.floor(timestamp / self.width)
        return bucket

    def buckets(self, low: Time, high: Time) -> range | list[int]:
        """Every bucket that may hold a timestamp in ``[low, high]`` (widened by a
        rounding margin, so a bound computed as ``a + b`` never misses its bucket; a
        bound that overflowed to an infinity is the largest float), in order.

        Where floats are spaced wider than a bucket (timestamps of 1e22 s in buckets of
        2 s), the margin spans millions of buckets but only a few floats: then the
        buckets are those of the floats in the range, as few as those. Each step moves
        to the next float or the next bucket's start, whichever is further: at most
        ``min(floats, buckets) + 1`` steps."""
        margin = _ULPS * math.ulp(max(abs(low), abs(high))) + self._slack
        low, high = max(low - margin, -_SPAN), min(high + margin, _SPAN)
        first, last = self.bucket(low), self.bucket(high)
        if last - first < _FEW_BUCKETS:
            return range(first, last + 1)
        width = self.width
        found: list[int] = []
        point: Time = float(low)  # later an int bucket start, kept so (compiled too)
        while point <= high:
            bucket = self.bucket(point)
            if not found or found[-1] != bucket:
                found.append(bucket)
            point = max(math.nextafter(point, math.inf), (bucket + 1) * width)
        return found

    def read(self, buckets: Iterable[int]) -> StateFuture:
        """A future of the ``Bucket``s (None: empty) of ``buckets``, in order (one batch
        of gets)."""
        get = self.state.async_get
        return combine_all([get(b) for b in buckets])

    @staticmethod
    def side(stored: Iterable[Bucket | None], side: int, watermark: Time) -> list[Entry]:
        """The live entries of ``side`` in ``stored`` buckets, in bucket order, each
        bucket's in arrival order."""
        entries: list[Entry] = []
        for bucket in stored:
            if bucket is not None and bucket[side]:
                entries += live(bucket[side], watermark)
        return entries

    def write(
        self,
        bucket: int,
        stored: Bucket | None,
        watermark: Time,
        add: tuple[int, Entry] | None = None,
    ) -> StateFuture | None:
        """Store ``bucket`` as ``stored`` (as read) without its dead entries and with
        ``add`` = ``(side, entry)`` appended; None when nothing changed, else the write's
        future (a remove when the bucket empties)."""
        if stored is None:
            if add is None:
                return None
            sides: Bucket = [[], []]
            sides[add[0]].append(add[1])
            return self.state.async_put(bucket, sides)
        left, right = live(stored[LEFT], watermark), live(stored[RIGHT], watermark)
        if add is None and len(left) == len(stored[LEFT]) and len(right) == len(stored[RIGHT]):
            return None
        kept = [left, right]
        if add is not None:
            kept[add[0]].append(add[1])
        return self.store(bucket, kept[0], kept[1])

    def store(self, bucket: int, left: list[Entry], right: list[Entry]) -> StateFuture:
        """Write ``bucket`` as ``[left, right]`` (a remove when both are empty)."""
        if not left and not right:
            return self.state.async_remove(bucket)
        return self.state.async_put(bucket, [left, right])
