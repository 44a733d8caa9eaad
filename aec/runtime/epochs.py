"""EpochManager: cutting the input into epochs at watermarks (FLIP-425).

Each record counts in the epoch that was open when it arrived; a watermark
closes the open epoch. Invariants:
- Epochs finish strictly in order: the head closed epoch first waits for its
  records (``ongoing`` back to 0), then its timers fire (``on_records_done``
  may start timer firings counted in the same epoch), and when those have
  finished too, ``on_epoch_done`` emits its watermark and it is removed.
- So a watermark leaves only after every earlier record and every timer it
  fires have finished, and watermarks leave in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aec.elements import ClockTick, Watermark

OPEN, CLOSED, FIRING = 0, 1, 2


class Epoch:
    """Records (and timer firings) between two watermarks.

    Attributes:
        sequence: 0, 1, 2, ... in arrival order.
        watermark: the closing element (a ``Watermark`` or a processing-time
            ``ClockTick``), None while open.
        processing_time: the clock reading when it closed (seconds).
        ongoing: unfinished records and timer firings counted in it.
        status: OPEN, CLOSED (waiting for records) or FIRING (waiting for timers).
    """

    __slots__ = ("sequence", "watermark", "ongoing", "status", "processing_time")

    def __init__(self, sequence: int) -> None:
        self.sequence = sequence
        # the element that closed it (set by ``close``, before anything reads it)
        self.watermark: Watermark | ClockTick = None  # type: ignore[assignment]
        # "| int": compiled, a bare float annotation would turn an int clock reading into a float
        self.processing_time: float | int = 0.0
        self.ongoing = 0
        self.status = OPEN

    def __repr__(self) -> str:
        return f"Epoch({self.sequence}, {self.watermark}, ongoing={self.ongoing}, status={self.status})"


class EpochManager:
    """Counts records in and out of epochs and finishes closed epochs in order.

    The AEC calls ``enter(context.epoch)`` when it admits a context and
    ``complete_one(context.epoch)`` when the context finished (Flink's
    ``EpochManager.onRecord`` / ``completeOneRecord``); only this class edits an
    epoch's count and status.

    Args:
        on_records_done: ``fn(epoch)`` when the head closed epoch's records are
            done; it may ``join`` timer firings to the epoch.
        on_epoch_done: ``fn(epoch)`` when the head epoch is fully done (emit).
    """

    __slots__ = ("active", "closed", "_on_records_done", "_on_epoch_done", "_advancing")

    def __init__(
        self,
        on_records_done: Callable[[Epoch], None],
        on_epoch_done: Callable[[Epoch], None],
    ) -> None:
        self.active = Epoch(0)
        self.closed: deque[Epoch] = deque()
        self._on_records_done = on_records_done
        self._on_epoch_done = on_epoch_done
        self._advancing = False

    def close(self, watermark: Watermark | ClockTick, processing_time: float | int = 0.0) -> Epoch:
        """Close the open epoch with ``watermark``; open the next one."""
        epoch = self.active
        epoch.watermark = watermark
        epoch.processing_time = processing_time
        epoch.status = CLOSED
        self.closed.append(epoch)
        self.active = Epoch(epoch.sequence + 1)
        self.advance()
        return epoch

    def restart_at(self, sequence: int) -> None:
        """A restored operator continues the epoch its checkpoint was taken in
        (before any input; nothing is closed yet)."""
        if self.closed or self.active.ongoing:
            raise RuntimeError("restart_at() on epochs that have seen input")
        self.active = Epoch(sequence)

    def enter(self, epoch: Epoch) -> None:
        """A record or timer firing counting in ``epoch`` was admitted. O(1)."""
        epoch.ongoing += 1

    def complete_one(self, epoch: Epoch) -> None:
        """A record or timer firing of ``epoch`` finished; a closed epoch whose count
        reaches 0 lets the epochs advance (fire its timers, emit its watermark)."""
        count = epoch.ongoing - 1
        epoch.ongoing = count
        if count == 0 and epoch.status != OPEN:
            self.advance()

    def all_closed_done(self) -> bool:
        """True when every closed epoch has finished (its watermark has left)."""
        return not self.closed

    def advance(self) -> None:
        """Finish head epochs whose work is done, in order."""
        if self._advancing:  # re-entered from a callback below: the outer loop re-checks
            return
        self._advancing = True
        try:
            closed = self.closed
            while closed and closed[0].ongoing == 0:
                head = closed[0]
                if head.status == CLOSED:
                    head.status = FIRING
                    self._on_records_done(head)
                    if head.ongoing:
                        break
                closed.popleft()
                self._on_epoch_done(head)
        finally:
            self._advancing = False
