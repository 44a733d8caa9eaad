"""``interval_join``: Flink's interval join as a ``KeyedCoProcessFunction``
(``IntervalJoinOperator`` / ``AsyncIntervalJoinOperator``) on async state.

Input 1 is the left side, input 2 the right. For each key it emits, exactly once,
``process(left, right)`` for every pair with ``left.ts + lower <= right.ts <=
left.ts + upper`` (an exclusive bound drops its equality; bounds are real seconds
and, unlike Flink's milliseconds, are not shifted by one). Each record, unless
late, is added to its side's buffer (``aec.joins.buffer.JoinBuffer``, in the
function's backend) and paired with the other side's buffered records inside its
interval, read from the buckets that interval covers only. The pairs one record
completes leave in increasing timestamp of the other side, ties in the other side's
arrival order. Details: ``docs/joins.md``.

Lateness and cleanup follow Flink: a record below the operator's (combined)
watermark is late (to its side's tag, else dropped and counted in
``late_records_dropped``); a buffered record is removed by an event-time timer at
its cleanup time (left ``ts + upper`` if ``upper > 0`` else ``ts``; right ``ts -
lower`` if ``lower < 0`` else ``ts``), which fires at the first watermark advance to
at least that time after the record arrived (rule 8 of ``docs/semantics.md``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable
from operator import itemgetter
from typing import Any

from aec.elements import Time
from aec.errors import describe
from aec.functions import Context, KeyedCoProcessFunction, RuntimeContext
from aec.joins.buffer import LEFT, RIGHT, Bucket, Entry, JoinBuffer, bucket_width, entry, live
from aec.joins.bundle import JoinBundle
from aec.joins.process import JoinContext, ProcessJoinFunction
from aec.native import mypyc_attr
from aec.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aec.state.future import StateFuture

BUFFER = "interval-join.buffer"  # MapState: bucket -> (left entries, right entries)
_LAYOUT = "interval-join.bounds="  # + [lower, upper]: a state name marking the layout
_BY_TIMESTAMP = itemgetter(0)


def interval_join(
    lower: Time,
    upper: Time,
    process: ProcessJoinFunction | Callable[[Any, Any], Any],
    *,
    # bools, checked below: typed object so the compiled build gives that check's message
    lower_inclusive: object = True,
    upper_inclusive: object = True,
    left_late_tag: Hashable | None = None,
    right_late_tag: Hashable | None = None,
) -> IntervalJoinFunction:
    """An interval join of input 1 (left) with input 2 (right), per key.

    Args:
        lower, upper: seconds; pairs have ``left.ts + lower <= right.ts <= left.ts +
            upper`` (real numbers, ``lower <= upper``).
        process: a ``ProcessJoinFunction`` or a plain ``fn(left, right) -> output``
            (one output per pair).
        lower_inclusive, upper_inclusive: False drops the bound's equality.
        left_late_tag, right_late_tag: side-output tags for late records of each side
            (None: dropped and counted in the metric ``late_records_dropped``).

    Returns a ``KeyedCoProcessFunction`` for ``run_keyed_co``,
    ``KeyedCoProcessOperator``, ``assert_equivalent_co`` or
    ``spark_glue.process_keyed_co`` (picklable if ``process`` is).

    Raises:
        TypeError: a bound that is not a real number; ``process`` not callable;
            an inclusiveness flag that is not a bool.
        ValueError: a bound that is not finite; ``lower > upper``; ``lower ==
            upper`` with an exclusive bound.
    """
    _check_bound("lower", lower)
    _check_bound("upper", upper)
    lower_in = _check_flag("lower_inclusive", lower_inclusive)
    upper_in = _check_flag("upper_inclusive", upper_inclusive)
    if lower > upper:
        raise ValueError(f"interval lower bound {lower!r} is above the upper bound {upper!r}")
    if lower == upper and not (lower_in and upper_in):
        raise ValueError(
            f"interval [{lower!r}, {upper!r}] with an exclusive bound is empty: both bounds "
            "must be inclusive when lower == upper"
        )
    if not isinstance(process, ProcessJoinFunction) and not callable(process):
        raise TypeError(
            f"process must be a ProcessJoinFunction or a callable (left, right) -> output, "
            f"got {process!r}"
        )
    return IntervalJoinFunction(
        _seconds(lower), _seconds(upper), process, lower_in, upper_in, left_late_tag,
        right_late_tag,
    )  # fmt: skip


def _check_flag(name: str, flag: object) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"{name} must be a bool, got {flag!r}")
    return flag


def _seconds(bound: numbers.Real) -> Time:
    """A bound as an int if it is integral (int timestamps beyond 2**53, nanoseconds,
    then pair exactly, as in Flink's long arithmetic), else a float."""
    return int(bound) if isinstance(bound, numbers.Integral) else float(bound)


def _check_bound(name: str, bound: object) -> None:
    if isinstance(bound, bool) or not isinstance(bound, numbers.Real):
        raise TypeError(f"interval bound {name} must be a real number of seconds, got {bound!r}")
    try:
        finite = math.isfinite(bound)
    except OverflowError:  # an int beyond a float's range: seconds never that many
        finite = False
    if not finite:
        raise ValueError(
            f"interval bound {name} must be finite (within a float's range), got "
            f"{describe(bound, 40)}"
        )


class Plan:
    """A record's place (``IntervalJoinFunction.plan``): its side, cleanup time, own
    bucket and the buckets its partners may be in."""

    __slots__ = ("is_left", "cleanup", "own", "candidates")

    def __init__(
        self, is_left: bool, cleanup: Time, own: int, candidates: range | list[int]
    ) -> None:
        self.is_left = is_left
        self.cleanup = cleanup
        self.own = own
        self.candidates = candidates


@mypyc_attr(native_class=False)  # a KeyedCoProcessFunction: a Python class
class IntervalJoinFunction(KeyedCoProcessFunction):
    """The function ``interval_join`` returns (arguments as there, checked there)."""

    def __init__(
        self, lower: Time, upper: Time, process: Any, lower_inclusive: bool,
        upper_inclusive: bool, left_late_tag: Hashable | None, right_late_tag: Hashable | None,
    ) -> None:  # fmt: skip
        self.lower, self.upper = lower, upper
        self.lower_inclusive, self.upper_inclusive = lower_inclusive, upper_inclusive
        self.process = process
        self.late_tags = (left_late_tag, right_late_tag)
        self.bucket_width = bucket_width(lower, upper)
        self.late_records_dropped = 0

    # -- set-up ------------------------------------------------------------------------------
    def left_cleanup(self, timestamp: Time) -> Time:
        """When a left record at ``timestamp`` leaves the buffer (Flink's rule)."""
        return timestamp + self.upper if self.upper > 0 else timestamp

    def right_cleanup(self, timestamp: Time) -> Time:
        """When a right record at ``timestamp`` leaves the buffer (Flink's rule)."""
        return timestamp - self.lower if self.lower < 0 else timestamp

    def layout_marker(self) -> str:
        """A state name naming the bounds, which place the entries in their buckets (the
        width and the cleanup times), so a restore into a join with other bounds is
        refused (``check_restore``)."""
        return f"{_LAYOUT}[{float(self.lower)!r}, {float(self.upper)!r}]"

    def open(self, ctx: RuntimeContext) -> None:
        ctx.get_state(ValueStateDescriptor(self.layout_marker()))  # a name, never written
        descriptor: MapStateDescriptor[int, Bucket] = MapStateDescriptor(BUFFER)
        state = ctx.get_state(descriptor)
        self.buffer = JoinBuffer(state, self.bucket_width, max(abs(self.lower), abs(self.upper)))
        self.late_records_dropped = 0
        self.joined = _pair_function(
            self.lower, self.upper, self.lower_inclusive, self.upper_inclusive, self.process
        )
        config = ctx.config  # bundles: asynchronous, serial watermark order, record order
        self.bundles = (
            config.async_state and config.watermark_order == "serial" and not config.state_ordered
        )
        if isinstance(self.process, ProcessJoinFunction):
            self.process.open(ctx)

    def close(self) -> None:
        if isinstance(self.process, ProcessJoinFunction):
            self.process.close()

    def check_restore(self, state_names: list[str]) -> None:
        """Called by the operator's ``restore`` with the checkpoint's state names.

        Raises ValueError: the checkpoint's join had other bounds.
        """
        theirs = [n for n in state_names if n.startswith(_LAYOUT)]
        if theirs and theirs != [self.layout_marker()]:
            raise ValueError(
                f"the checkpoint's interval join has bounds {theirs[0][len(_LAYOUT) :]}, this "
                f"one [{self.lower!r}, {self.upper!r}]: the bounds place the buffered records in "
                "their buckets, so they would not be found"
            )

    def metric_counters(self) -> dict[str, int]:
        """Added to the run's metrics: ``late_records_dropped``."""
        return {"late_records_dropped": self.late_records_dropped}

    # -- records -----------------------------------------------------------------------------
    def process_element1(self, value: object, ctx: Context) -> StateFuture | None:
        return self._record(value, ctx, True)

    def process_element2(self, value: object, ctx: Context) -> StateFuture | None:
        return self._record(value, ctx, False)

    def _record(self, value: object, ctx: Context, is_left: bool) -> StateFuture | None:
        timestamp = ctx.timestamp
        if timestamp is None or not math.isfinite(timestamp):
            which = "left (input 1)" if is_left else "right (input 2)"
            raise ValueError(
                f"{which} record {value!r} of key {ctx.current_key!r} has timestamp "
                f"{timestamp!r}: an interval join needs Record(key, value, timestamp) with a "
                "finite timestamp"
            )
        watermark = ctx.timer_service.current_watermark()
        if timestamp < watermark:
            tag = self.late_tags[0 if is_left else 1]
            if tag is None:
                self.late_records_dropped += 1
            else:
                ctx.side_output(tag, value)
            return None
        plan = self.plan(is_left, timestamp)
        ctx.timer_service.register_event_time_timer(plan.cleanup)
        return _join_record(self.buffer, self.joined, plan, ctx, value, timestamp, watermark)

    def plan(self, is_left: bool, timestamp: Time) -> Plan:
        """Where a record of timestamp ``timestamp`` goes and what it reads: entries sit
        in the bucket of their cleanup time (``aec.joins.buffer``); its partners'
        timestamps lie in its interval, so their cleanup times in the interval shifted
        by their side's ``cleanup - timestamp``."""
        lower, upper = self.lower, self.upper
        if is_left:
            cleanup = self.left_cleanup(timestamp)
            shift = -lower if lower < 0 else 0.0  # a right entry's cleanup - its timestamp
            low, high = timestamp + lower + shift, timestamp + upper + shift
        else:
            cleanup = self.right_cleanup(timestamp)
            shift = upper if upper > 0 else 0.0  # a left entry's cleanup - its timestamp
            low, high = timestamp - upper + shift, timestamp - lower + shift
        buffer = self.buffer
        return Plan(is_left, cleanup, buffer.bucket(cleanup), buffer.buckets(low, high))

    def open_co_bundle(self) -> JoinBundle | None:
        """The mini-batch of on-time records (``aec.joins.bundle``), for the operator:
        only in runs that may bundle (asynchronous, serial watermark order, record order:
        nothing after a watermark can then see a bundle not yet folded); the synchronous
        run never bundles, it is the reference."""
        return JoinBundle(self) if self.bundles else None

    # -- cleanup -----------------------------------------------------------------------------
    def on_timer(self, timestamp: Time, ctx: Context) -> StateFuture:
        """A cleanup time: the records (of either side) whose cleanup time this is are in
        one bucket (the timer's timestamp is their cleanup time, computed alike): drop
        its entries dead at the firing watermark. They include every entry of the bucket
        whose cleanup timer is due in this firing (its cleanup time is at or below the
        watermark, it arrived before it), so those later timers are deleted: a bucket is
        cleaned once per firing, its records removed at the advance their own timers
        would have removed them."""
        return _clean_bucket(self.buffer, timestamp, ctx)


def _join_record(
    buffer: JoinBuffer, joined: Callable[[Context, object, Time, list[Entry], bool], None],
    plan: Plan, ctx: Context, value: object, timestamp: Time, watermark: Time,
) -> StateFuture | None:  # fmt: skip
    """An on-time record's work after its timer (``IntervalJoinFunction._record``): read
    its candidate buckets and its own, emit its pairs, add its entry. A module function,
    not a closure in the method: mypyc 2.4.1 cannot compile a closure in a method of a
    Python class."""
    own, candidates, is_left = plan.own, plan.candidates, plan.is_left
    side, other = (LEFT, RIGHT) if is_left else (RIGHT, LEFT)
    cleanup = plan.cleanup
    # the other side's buckets first, then its own bucket unless it is one of them
    mine = candidates.index(own) if own in candidates else len(candidates)
    wanted = candidates if mine < len(candidates) else [*candidates, own]

    def pair(stored: list[Bucket | None]) -> StateFuture | None:
        matches = buffer.side(stored[: len(candidates)], other, watermark)
        if matches:
            joined(ctx, value, timestamp, matches, is_left)
        added = entry(timestamp, cleanup, watermark, value)
        return buffer.write(own, stored[mine], watermark, (side, added))

    return buffer.read(wanted).then_compose(pair)


def _pair_function(
    lower: Time, upper: Time, lower_inclusive: bool, upper_inclusive: bool, process: Any
) -> Callable[[Context, object, Time, list[Entry], bool], None]:
    """``fn(ctx, value, timestamp, candidates, is_left)``: emit a record's pairs with the
    other side's live ``candidates`` (read in bucket order)."""
    plain = not isinstance(process, ProcessJoinFunction)

    def inside(left: Time, right: Time) -> bool:
        low, high = left + lower, left + upper
        return bool(  # numpy times compare to numpy.bool, which compiled code refuses
            (low <= right if lower_inclusive else low < right)
            and (right <= high if upper_inclusive else right < high)
        )

    def joined(
        ctx: Context, value: object, timestamp: Time, candidates: list[Entry], is_left: bool
    ) -> None:
        if is_left:
            matches = [e for e in candidates if inside(timestamp, e[0])]
        else:
            matches = [e for e in candidates if inside(e[0], timestamp)]
        matches.sort(key=_BY_TIMESTAMP)  # stable: ties keep the other side's arrival order
        output = ctx.output
        for stored in matches:
            other_timestamp, other = stored[0], stored[3]
            left, right = (value, other) if is_left else (other, value)
            if plain:
                output(process(left, right))
                continue
            times = (timestamp, other_timestamp) if is_left else (other_timestamp, timestamp)
            results = process.process_element(left, right, JoinContext(ctx, *times))
            if results is not None:
                for result in results:
                    output(result)

    return joined


def _clean_bucket(buffer: JoinBuffer, timestamp: Time, ctx: Context) -> StateFuture:
    """``IntervalJoinFunction.on_timer``'s work (a module function, as ``_join_record``)."""
    watermark = ctx.timer_service.current_watermark()
    bucket = buffer.bucket(timestamp)
    timers = ctx.timer_service

    def clean(stored: Bucket | None) -> StateFuture | None:
        if stored is None:
            return None
        write = buffer.write(bucket, stored, watermark)
        if write is not None:
            kept = {e[1] for side in stored for e in live(side, watermark)}
            gone = {e[1] for side in stored for e in side} - kept - {timestamp}
            for due in sorted(gone):  # a time a kept entry shares keeps its timer
                timers.delete_event_time_timer(due)
        return write

    return buffer.state.async_get(bucket).then_compose(clean)
