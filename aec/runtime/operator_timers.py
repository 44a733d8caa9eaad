"""Timers of a ``KeyedProcessOperator``: registration per key, firing per epoch.

Event-time timers fire when a watermark closes their epoch, processing-time timers
when a ``ClockTick`` does (DESIGN rule 8). Flink: ``InternalTimerServiceAsyncImpl``.
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import TYPE_CHECKING, Any, cast

from aec.elements import ClockTick, Watermark
from aec.runtime.epochs import Epoch, EpochManager
from aec.runtime.record_context import RecordContext
from aec.runtime.timers import TimerQueue

if TYPE_CHECKING:
    from aec.runtime.controller import AsyncExecutionController

_EVENT = "event-time"
_PROCESSING = "processing-time"


class OperatorTimers:
    """Timer registration and firing of ``KeyedProcessOperator`` (a mixin over its fields)."""

    event_timers: TimerQueue
    processing_timers: TimerQueue
    synchronous: bool
    controller: AsyncExecutionController
    epochs: EpochManager
    _sequence: int
    _poll: bool
    _timers_fired: int

    if TYPE_CHECKING:  # the operator's methods

        def current_context(self) -> RecordContext: ...

        def _key_group(self, key: Any) -> int: ...

    def _close_epoch(self, element: Watermark | ClockTick, now: float) -> None:
        """Close the open epoch with ``element``; its domain's timers note the boundary."""
        domain = _EVENT if type(element) is Watermark else _PROCESSING
        self._timer_queue(domain).boundary(self.epochs.active.sequence)
        self.epochs.close(element, now)

    def register_timer(self, domain: str, timestamp: float) -> None:
        """Register a timer of the current key in ``domain`` (event or processing time)."""
        context = self.current_context()
        if domain == _PROCESSING:
            self._poll = True
        self._timer_queue(domain).register(
            context.key, timestamp, context.epoch.sequence, _arrival_limit(context, domain)
        )

    def delete_timer(self, domain: str, timestamp: float) -> None:
        """Delete the current key's timer at ``timestamp`` in ``domain`` (no-op if absent)."""
        context = self.current_context()
        self._timer_queue(domain).delete(
            context.key, timestamp, context.epoch.sequence, _arrival_limit(context, domain)
        )

    def timer_times(self, domain: str) -> Container[float]:
        """Timestamps of the current key's timers in ``domain`` (``TimerQueue.timestamps``)."""
        return self._timer_queue(domain).timestamps(self.current_context().key)

    def due_timers(self, domain: str, until: float) -> list[float]:
        """The current key's timer timestamps in ``domain`` at or before ``until``,
        ascending (``TimerQueue.due``)."""
        return self._timer_queue(domain).due(self.current_context().key, until)

    def _timer_queue(self, domain: str) -> TimerQueue:
        return self.event_timers if domain == _EVENT else self.processing_timers

    def _timer_context(
        self, domain: str, key: Any, timestamp: float, epoch: Epoch
    ) -> RecordContext:
        self._sequence += 1
        element = epoch.watermark
        watermark = element.timestamp if domain == _EVENT else element.watermark
        return RecordContext(
            None, key, self._key_group(key), timestamp, self._sequence, epoch, watermark,
            self.controller.on_context_finished, (domain, timestamp), epoch.processing_time,
        )  # fmt: skip

    def _fire_timers(self, epoch: Epoch) -> None:
        """The head epoch's records are done: fire the timers its closing element
        (a Watermark: event time; a ClockTick: processing time) makes due.

        Synchronous mode fires one timer at a time in (timestamp, registration)
        order, like Flink's timer service. Async mode fires each key's timers as a
        chain (the next starts when the previous finished), keys in parallel, so a
        timer registered by ``on_timer`` at or below the limit still fires in
        timestamp order within its key.
        """
        domain = _EVENT if type(epoch.watermark) is Watermark else _PROCESSING
        limit = epoch.watermark.timestamp
        timers = self._timer_queue(domain)
        controller = self.controller
        if self.synchronous:
            while (due := timers.pop_earliest(limit)) is not None:
                context = self._timer_context(domain, due[1], due[0], epoch)
                controller.admit(context, inline=True)
            return
        for key in timers.due_keys(limit, epoch.sequence):
            # a due key has a due timer: never None here
            timestamp = cast(float, timers.pop_next_for_key(key, limit, epoch.sequence))
            controller.admit(self._timer_context(domain, key, timestamp, epoch), inline=False)

    def _next_timer(self, context: RecordContext) -> RecordContext | None:
        if self.synchronous:
            return None
        domain = cast("tuple[str, float]", context.timer)[0]  # a timer's context: never None
        epoch = context.epoch
        timestamp = self._timer_queue(domain).pop_next_for_key(
            context.key, epoch.watermark.timestamp, epoch.sequence
        )
        if timestamp is None:
            return None
        return self._timer_context(domain, context.key, timestamp, epoch)


def _arrival_limit(context: RecordContext, domain: str) -> float:
    """The time (event or processing) that had passed before a record arrived:
    its timers at or below it fired before the record in the synchronous run.
    -inf for timer code, whose firing's due timers are all still to fire."""
    if context.timer is not None:
        return -math.inf
    return context.watermark if domain == _EVENT else context.processing_time
