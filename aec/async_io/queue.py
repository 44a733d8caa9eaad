"""Element queues of async I/O: which admitted elements may leave, and when.

Follows Flink's ``StreamElementQueue`` implementations
(``OrderedStreamElementQueue``, ``UnorderedStreamElementQueue``) and, for
FLIP-519's key-ordered mode, a per-key gate like the AEC's key accounting.
Everything here lives on the mailbox thread; nothing is thread-safe.

Invariants:
- ``len(queue)`` is the number of elements (records and watermarks) admitted and
  not yet popped for emission; the driver admits only while it is below capacity.
- ``pop_ready`` returns elements in the order they must be emitted: an
  ``AsyncEntry`` (whose ``results`` are emitted) or a ``Watermark``.
- Ordered: elements leave in arrival order. Unordered (also used by key-ordered):
  records leave in completion order within a segment; a watermark is a segment of
  its own, so it leaves after every record before it and before every record
  after it (nothing crosses a watermark).
- Key gate: per key, at most one entry is started and not done; the others wait
  in arrival order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from typing import Protocol, final

from aec.elements import Watermark

__all__ = ["AsyncEntry", "KeyGate", "OrderedQueue", "UnorderedQueue"]

# AsyncEntry.state values
WAITING = "waiting"  # admitted, its key is held by an earlier entry (key-ordered only)
RUNNING = "running"  # an attempt is in flight; ``future`` is that attempt's ResultFuture
BACKOFF = "backoff"  # an attempt asked for a retry; the retry timer is pending
TIMED_OUT = "timed_out"  # timeout() was called; ``future`` is the one handed to it
DONE = "done"  # ``results`` is final; waits in the queue to be emitted


class Cancellable(Protocol):
    """A running attempt a timeout cancels: an asyncio ``TaskHandle`` or a ``BatchItem``."""

    def cancel(self) -> None: ...


# a timer: (due, sequence, kind, entry, attempt) (``aec.async_io.driver``)
Timer = tuple[float, int, int, "AsyncEntry", int]


@final  # told apart from watermarks by ``type(element) is AsyncEntry``
class AsyncEntry:
    """One input value's progress through its calls (Flink's ``StreamRecordQueueEntry``
    plus the retry state of ``RetryableResultHandlerDelegator``).

    Transitions: WAITING -> RUNNING <-> BACKOFF; RUNNING/BACKOFF -> TIMED_OUT;
    RUNNING/TIMED_OUT -> DONE. ``future`` is the only ResultFuture whose completion
    the driver accepts (None while none is expected); an exceptional final outcome
    fails the job instead of reaching DONE.
    """

    __slots__ = (
        "value",
        "key",
        "state",
        "attempts",
        "deadline",
        "future",
        "task",
        "timers",
        "timeout_due",
        "timeout_sequence",
        "results",
        "segment",
        "sequence",
    )

    def __init__(self, value: object, key: Hashable = None) -> None:
        self.value = value
        self.key = key
        self.state = WAITING
        self.attempts = 0  # calls of async_invoke so far
        self.deadline: float | None = None  # monotonic seconds; set when the first call starts
        self.future: object = None  # the ResultFuture accepted now (compared by identity)
        self.task: Cancellable | None = None  # the running attempt, if any
        self.timers: list[Timer] = []  # this entry's live retry timers
        # its timeout in ``aec.async_io.driver.Timers``: due (monotonic seconds) and
        # creation number, -1 when it has none live
        self.timeout_due = math.inf
        self.timeout_sequence = -1
        self.results: list[object] | None = None
        self.segment: _Segment | None = None  # unordered queues only
        self.sequence = 0  # arrival number in its operator (the snapshot's order)

    def __repr__(self) -> str:
        return f"<AsyncEntry {self.value!r} {self.state} attempts={self.attempts}>"


class OrderedQueue:
    """Elements leave in arrival order: the head leaves once it is done
    (Flink's ``OrderedStreamElementQueue``)."""

    __slots__ = ("_elements",)

    def __init__(self) -> None:
        self._elements: deque[AsyncEntry | Watermark] = deque()

    def __len__(self) -> int:
        return len(self._elements)

    def add_record(self, entry: AsyncEntry) -> None:
        self._elements.append(entry)

    def add_watermark(self, watermark: Watermark) -> None:
        self._elements.append(watermark)

    def completed(self, entry: AsyncEntry) -> None:
        """``entry`` reached DONE (nothing to do: ``pop_ready`` checks the head)."""

    def pop_ready(self) -> list[AsyncEntry | Watermark]:
        """Remove and return the done prefix of the queue."""
        elements = self._elements
        ready: list[AsyncEntry | Watermark] = []
        while elements:
            head = elements[0]
            if type(head) is AsyncEntry and head.state != DONE:
                break
            ready.append(elements.popleft())
        return ready


class _Segment:
    """Records between two watermarks, or one watermark (``watermark`` not None)."""

    __slots__ = ("watermark", "pending", "ready")

    def __init__(self, watermark: Watermark | None) -> None:
        self.watermark = watermark
        self.pending = 0  # records of this segment not done yet
        self.ready: deque[AsyncEntry] = deque()  # done records, in completion order


class UnorderedQueue:
    """Records leave as they complete; watermarks are barriers
    (Flink's ``UnorderedStreamElementQueue``: a deque of segments)."""

    __slots__ = ("_segments", "_size")

    def __init__(self) -> None:
        self._segments: deque[_Segment] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add_record(self, entry: AsyncEntry) -> None:
        segments = self._segments
        if not segments or segments[-1].watermark is not None:
            segments.append(_Segment(None))
        segment = segments[-1]
        segment.pending += 1
        entry.segment = segment
        self._size += 1

    def add_watermark(self, watermark: Watermark) -> None:
        self._segments.append(_Segment(watermark))
        self._size += 1

    def completed(self, entry: AsyncEntry) -> None:
        """``entry`` reached DONE: it may leave once its segment is the first."""
        segment = entry.segment
        assert segment is not None
        entry.segment = None
        segment.pending -= 1
        segment.ready.append(entry)

    def pop_ready(self) -> list[AsyncEntry | Watermark]:
        """Remove and return what may leave now: the first segment's done records,
        then, once it is empty, the next segment (a watermark leaves at once)."""
        segments = self._segments
        ready: list[AsyncEntry | Watermark] = []
        while segments:
            head = segments[0]
            if head.watermark is not None:
                ready.append(head.watermark)
                segments.popleft()
                continue
            while head.ready:
                ready.append(head.ready.popleft())
            if head.pending or len(segments) == 1:
                break  # records still running, or the open last segment
            segments.popleft()
        self._size -= len(ready)
        return ready


class KeyGate:
    """FLIP-519's key order: per key, one entry started and not done at a time; the
    others wait in arrival order. Keys are independent.

    Invariant: ``key in self._waiting`` iff an entry of that key is started and not
    done; the deque holds the entries admitted after it, oldest first.
    """

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: dict[Hashable, deque[AsyncEntry]] = {}

    def __len__(self) -> int:
        """Number of keys with a started, unfinished entry."""
        return len(self._waiting)

    def acquire(self, entry: AsyncEntry) -> bool:
        """True if ``entry`` may start now; otherwise it waits behind its key."""
        waiting = self._waiting.get(entry.key)
        if waiting is None:
            self._waiting[entry.key] = deque()
            return True
        waiting.append(entry)
        return False

    def release(self, entry: AsyncEntry) -> AsyncEntry | None:
        """``entry`` is done: return the next entry of its key to start, if any."""
        waiting = self._waiting[entry.key]
        if waiting:
            return waiting.popleft()
        del self._waiting[entry.key]
        return None
