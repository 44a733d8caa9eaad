"""The interval join's records in mini-batches (``aec.runtime.bundle``): a key's
records between two watermarks are joined in one fold, with one read of every bucket
they touch and one write of every bucket they change.

Where it applies: asynchronous runs in serial watermark order (the operator bundles
only those; the synchronous run stays per record, the reference) of a
``KeyedCoProcessOperator`` running an interval join.

What it takes: records with a finite ``float`` or ``int`` timestamp at or above the
operator's watermark (on time). A record without one, or late, is declined and runs
as a record of its own (its error, its side output), after the records held before
it (the operator takes the bundle first).

When it gives them back (``take``): everything, before any watermark leaves (the
pairs of a record must leave before the next watermark: rule 7), before a snapshot,
at the end of input, at ``BUNDLE_LIMIT`` records and before a declined record runs.
Until then nothing can observe the key's buffers or outputs: no cleanup timer is due
(none fires before the next watermark), and in serial order no record after a
watermark starts before it left.

How it folds (one derived context per key, in the epoch the records arrived in): the
records' timers are registered in arrival order, every bucket any of them reads or
writes is read in one batch, then each record is joined against the buckets in
memory exactly as on its own (its interval's buckets, the dead entries of its
watermark skipped, the pairs in the other side's timestamp order), its entry
appended to its bucket; finally each changed bucket is written once. So the outputs
and the final state are the synchronous run's, in the same order per key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from aec.elements import Time
from aec.functions import Context
from aec.joins.buffer import LEFT, RIGHT, Bucket, Entry, JoinBuffer, entry, live
from aec.runtime.bundle import BundleContext

Record = tuple[int, object, Time, Time]  # (input, value, timestamp, arrival watermark)


class _Join(Protocol):
    """What the bundle uses of ``aec.joins.interval.IntervalJoinFunction``."""

    buffer: JoinBuffer
    joined: Callable[[Context, object, Time, list[Entry], bool], None]

    def plan(self, is_left: bool, timestamp: Time) -> Any: ...


class JoinBundle:
    """The held records of an interval join, per key in arrival order (see the module
    doc). The operator offers records with their input (``offer_input``)."""

    def __init__(self, join: _Join) -> None:
        self.join = join
        self.size = 0
        self._held: dict[Hashable, list[Record]] = {}

    def offer_input(
        self, input: int, key: Hashable, value: object, timestamp: Time, watermark: Time
    ) -> bool:
        """Hold an on-time record of input ``input``; False (run it alone) otherwise
        (not a finite number: alone, it fails with the join's error naming it)."""
        if (type(timestamp) is not float and type(timestamp) is not int) or not (
            watermark <= timestamp < math.inf and timestamp > -math.inf
        ):
            return False
        held = self._held.get(key)
        if held is None:
            self._held[key] = [(input, value, timestamp, watermark)]
        else:
            held.append((input, value, timestamp, watermark))
        self.size += 1
        return True

    def take(self, watermark: Time) -> list[tuple[Hashable, list[Record], int]]:
        """Every key's records (a watermark must not leave before their pairs)."""
        held, self._held, self.size = self._held, {}, 0
        return [(key, records, len(records)) for key, records in held.items()]

    def fold(self, share: list[Record], context: BundleContext, ctx: Context) -> None:
        """Join one key's held records (``share``) as the entry of ``context``."""
        join = self.join
        buffer = join.buffer
        plans = []
        wanted: set[int] = set()
        for input, value, timestamp, _ in share:
            plan = join.plan(input == 1, timestamp)
            ctx.timer_service.register_event_time_timer(plan.cleanup)
            wanted.add(plan.own)
            wanted.update(plan.candidates)
            plans.append((plan, value, timestamp))
        order = sorted(wanted)

        def joined(stored: list[Bucket | None]) -> None:
            watermark = share[0][3]
            if any(held[3] != watermark for held in share):
                raise RuntimeError(
                    "records held across a watermark: the operator must take the bundle "
                    "before every watermark closes the epoch"
                )
            # every record sees this watermark: drop the dead entries once (a bucket is
            # written back only when one of the records adds to it, as record by record)
            buckets: dict[int, list[list[Entry]]] = {
                bucket: [[], []]
                if entries is None
                else [live(entries[0], watermark), live(entries[1], watermark)]
                for bucket, entries in zip(order, stored, strict=True)
            }
            written: set[int] = set()
            pairs = join.joined
            for plan, value, timestamp in plans:
                other = RIGHT if plan.is_left else LEFT
                matches: list[Entry] = []
                for bucket in plan.candidates:
                    matches += buckets[bucket][other]
                try:
                    if matches:
                        pairs(ctx, value, timestamp, matches, plan.is_left)
                except BaseException:
                    context.value = value  # the failure names this record
                    raise
                added = entry(timestamp, plan.cleanup, watermark, value)
                buckets[plan.own][LEFT if plan.is_left else RIGHT].append(added)
                written.add(plan.own)
            for bucket in sorted(written):
                buffer.store(bucket, *buckets[bucket])

        buffer.read(order).then_accept(joined)
