"""The AEC's two buffers (FLIP-425's ``StateRequestBuffer``).

- Active buffer: state requests of records that hold their key, waiting to be
  flushed to the executor as one batch (at most ``buffer_size`` requests).
- Blocking buffer: per key, a FIFO of records (and timer firings) waiting for
  the record that holds the key to finish. In record-ordered mode a waiting
  record's pending work is its whole ``process_element`` call, so the blocking
  buffer holds record contexts (Flink's "sync point" requests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from time import monotonic
from typing import TYPE_CHECKING

from aec.runtime.metrics import HOT_KEYS_KEPT, keep_hottest

if TYPE_CHECKING:
    from aec.runtime.record_context import RecordContext
    from aec.state.requests import StateRequest


class ActiveBuffer:
    """Requests ready to run, in submission order, with the time the oldest arrived.

    Args:
        capacity: requests that make the buffer full (``AecConfig.buffer_size``).
        on_full: called when an ``add`` fills it (the AEC flushes a batch).

    Attributes:
        requests: the buffered requests, oldest first (read it; change it only
            through the methods: ``take`` may replace the list).
        first_time: monotonic seconds when the oldest buffered request arrived.
    """

    __slots__ = ("requests", "first_time", "capacity", "_on_full")

    def __init__(self, capacity: int, on_full: Callable[[], None]) -> None:
        self.requests: list[StateRequest] = []
        self.first_time = 0.0
        self.capacity = capacity
        self._on_full = on_full

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, request: StateRequest) -> None:
        """Buffer ``request``; a full buffer calls ``on_full``. O(1)."""
        requests = self.requests
        if not requests:
            self.first_time = monotonic()
        requests.append(request)
        if len(requests) >= self.capacity:
            self._on_full()

    def take(self, limit: int) -> list[StateRequest]:
        """Remove and return the oldest ``limit`` requests; what stays starts its
        ``buffer_timeout`` again."""
        requests = self.requests
        if len(requests) <= limit:
            self.requests = []
            return requests
        head, self.requests = requests[:limit], requests[limit:]
        self.first_time = monotonic()
        return head

    def push_front(self, requests: list[StateRequest]) -> None:
        """Put ``requests`` back ahead of everything buffered (they are older)."""
        if not self.requests:
            self.first_time = monotonic()
        self.requests[0:0] = requests


class BlockingBuffer:
    """Per-key FIFO queues of contexts waiting for their key.

    Attributes:
        queues: key -> its FIFO of waiting contexts; only keys with waiters (read
            it, e.g. ``key in queues``; change it only through the methods).
        size: contexts waiting, all keys.
        waits: key -> how many records waited for it so far (``hot_keys``; bounded:
            past ``HOT_KEYS_KEPT`` keys only the hottest stay).
    """

    __slots__ = ("queues", "size", "waits")

    def __init__(self) -> None:
        self.queues: dict[Hashable, deque[RecordContext]] = {}
        self.size = 0
        self.waits: dict[Hashable, int] = {}

    def add(self, context: RecordContext) -> None:
        """Queue ``context`` behind the records of its key. O(1)."""
        key = context.key
        queue = self.queues.get(key)
        if queue is None:
            self.queues[key] = deque((context,))
        else:
            queue.append(context)
        self.size += 1
        waits = self.waits  # count_wait, inline: most records of a skewed run wait here
        waits[key] = waits.get(key, 0) + 1
        if len(waits) > HOT_KEYS_KEPT:
            keep_hottest(waits)

    def count_wait(self, key: Hashable) -> None:
        """A record of ``key`` waits for it outside this buffer (a request's turn in
        state-ordered mode): counted like a context ``add`` queues."""
        waits = self.waits
        waits[key] = waits.get(key, 0) + 1
        if len(waits) > HOT_KEYS_KEPT:
            keep_hottest(waits)

    def forget_waits(self) -> None:
        """Count waits afresh (``hot_keys`` of a new metrics window)."""
        self.waits = {}

    def pop_next(self, key: Hashable) -> RecordContext | None:
        """The oldest context waiting for ``key``, removed; None if none waits."""
        queue = self.queues.get(key)
        if queue is None:
            return None
        context = queue.popleft()
        if not queue:
            del self.queues[key]
        self.size -= 1
        return context

    def peek(self, key: Hashable) -> RecordContext | None:
        """The oldest context waiting for ``key`` (not removed), or None."""
        queue = self.queues.get(key)
        return None if queue is None else queue[0]

    def keys(self) -> list[Hashable]:
        """Keys with at least one waiting context, in the order they first waited."""
        return list(self.queues)

    def waiting(self, key: Hashable) -> list[RecordContext]:
        """The contexts waiting for ``key``, oldest first (a copy; for inspection)."""
        return list(self.queues.get(key, ()))

    def key_count(self) -> int:
        """How many keys have waiting contexts (Flink's ``numBlockingKeys``). O(1)."""
        return len(self.queues)

    def __len__(self) -> int:
        return self.size
