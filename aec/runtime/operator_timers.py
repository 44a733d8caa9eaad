"""Timers of a ``KeyedProcessOperator``: registration per key, firing per epoch.

Event-time timers fire when a watermark closes their epoch, processing-time timers
when a ``ClockTick`` does (docs/semantics.md, rule 8). Flink:
``InternalTimerServiceAsyncImpl``. The operator's collaborator: it owns the two
``TimerQueue``s and makes timer firings records of their key through the AEC.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Hashable

from aec.elements import ClockTick, Time, Watermark
from aec.runtime.controller import AsyncExecutionController
from aec.runtime.epochs import Epoch
from aec.runtime.record_context import RecordContext
from aec.runtime.timers import TimerQueue

EVENT = "event-time"
PROCESSING = "processing-time"

# (domain, key, timestamp, epoch) -> the firing's RecordContext (the operator numbers it)
TimerContextFactory = Callable[[str, Hashable, Time, Epoch], RecordContext]


class OperatorTimers:
    """The operator's timer service (mailbox thread only).

    Args:
        controller: the AEC that admits firings (``admit``; firings overdraw the
            in-flight limit).
        synchronous: fire one timer at a time in (timestamp, registration) order
            (the reference run) instead of per-key chains.
        new_context: makes the ``RecordContext`` of a firing.
        current: the running record's context (whose key registers timers).
        on_processing_time: called when a processing-time timer is registered
            (the operator then reads its clock per input element).

    Attributes:
        event, processing: the ``TimerQueue`` of each domain.
    """

    __slots__ = (
        "event", "processing", "_controller", "_new_context", "_current",
        "_on_processing_time", "_chains", "fire",
    )  # fmt: skip

    def __init__(
        self,
        controller: AsyncExecutionController,
        synchronous: bool,
        new_context: TimerContextFactory,
        current: Callable[[], RecordContext],
        on_processing_time: Callable[[], None],
    ) -> None:
        self.event = TimerQueue()
        self.processing = TimerQueue()
        self._controller = controller
        self._new_context = new_context
        self._current = current
        self._on_processing_time = on_processing_time
        # the firing strategy of the run's mode, chosen once
        self._chains = not synchronous
        self.fire: Callable[[Epoch], None] = (
            self._fire_in_order if synchronous else self._fire_per_key
        )

    def queue(self, domain: str) -> TimerQueue:
        """The queue of ``domain`` (``"event-time"`` or ``"processing-time"``)."""
        return self.event if domain == EVENT else self.processing

    def replace(self, event: TimerQueue, processing: TimerQueue) -> None:
        """Take restored queues (before any input)."""
        self.event, self.processing = event, processing

    def close_epoch(self, open_epoch: Epoch, element: Watermark | ClockTick) -> None:
        """``element`` closes ``open_epoch``: its domain's queue notes the boundary
        (the epochs that can fire its timers)."""
        domain = EVENT if type(element) is Watermark else PROCESSING
        self.queue(domain).boundary(open_epoch.sequence)

    # -- the running key's timers (TimerService) ------------------------------------------
    def register(self, domain: str, timestamp: Time) -> None:
        """Register a timer of the current key in ``domain``."""
        context = self._current()
        if domain == PROCESSING:
            self._on_processing_time()
        self.queue(domain).register(
            context.key, timestamp, context.epoch.sequence, _arrival_limit(context, domain)
        )

    def delete(self, domain: str, timestamp: Time) -> None:
        """Delete the current key's timer at ``timestamp`` in ``domain`` (no-op if absent)."""
        context = self._current()
        self.queue(domain).delete(
            context.key, timestamp, context.epoch.sequence, _arrival_limit(context, domain)
        )

    def times(self, domain: str) -> Container[Time]:
        """Timestamps of the current key's timers in ``domain`` (``TimerQueue.timestamps``)."""
        return self.queue(domain).timestamps(self._current().key)

    def due(self, domain: str, until: Time) -> list[Time]:
        """The current key's timer timestamps in ``domain`` at or before ``until``,
        ascending (``TimerQueue.due``)."""
        return self.queue(domain).due(self._current().key, until)

    # -- firing -------------------------------------------------------------------------------
    def _fire_in_order(self, epoch: Epoch) -> None:
        """Synchronous mode: one timer at a time in (timestamp, registration) order,
        each run to completion (Flink's timer service)."""
        domain, limit, timers = self._due_in(epoch)
        admit = self._controller.admit
        while (due := timers.pop_earliest(limit)) is not None:
            admit(self._new_context(domain, due[1], due[0], epoch), True)

    def _fire_per_key(self, epoch: Epoch) -> None:
        """Async mode: each key's due timers fire as a chain (the next starts when
        the previous finished: ``next_in_chain``), keys in parallel, so a timer
        registered by ``on_timer`` at or below the limit still fires in timestamp
        order within its key."""
        domain, limit, timers = self._due_in(epoch)
        admit = self._controller.admit
        for key in timers.due_keys(limit, epoch.sequence):
            timestamp = timers.pop_next_for_key(key, limit, epoch.sequence)
            if timestamp is not None:  # a due key has a due timer
                admit(self._new_context(domain, key, timestamp, epoch), False)

    def next_in_chain(self, context: RecordContext) -> RecordContext | None:
        """The firing after ``context`` (a finished firing) of its key, or None
        (the AEC's ``timer_successor``; synchronous runs have no chains)."""
        timer = context.timer
        if timer is None or not self._chains:
            return None
        domain, epoch = timer[0], context.epoch
        timestamp = self.queue(domain).pop_next_for_key(
            context.key, epoch.watermark.timestamp, epoch.sequence
        )
        if timestamp is None:
            return None
        return self._new_context(domain, context.key, timestamp, epoch)

    def _due_in(self, epoch: Epoch) -> tuple[str, Time, TimerQueue]:
        """The domain the epoch's closing element fires, its limit and queue."""
        element = epoch.watermark
        domain = EVENT if type(element) is Watermark else PROCESSING
        return domain, element.timestamp, self.queue(domain)


def _arrival_limit(context: RecordContext, domain: str) -> Time:
    """The time (event or processing) that had passed before a record arrived:
    its timers at or below it fired before the record in the synchronous run.
    -inf for timer code, whose firing's due timers are all still to fire."""
    if context.timer is not None:
        return -math.inf
    return context.watermark if domain == EVENT else context.processing_time
