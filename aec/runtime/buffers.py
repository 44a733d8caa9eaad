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
from typing import Any


class ActiveBuffer:
    """Requests ready to run, in submission order, with the time the oldest arrived."""

    __slots__ = ("requests", "first_time")

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.first_time = 0.0  # monotonic seconds of the oldest buffered request

    def __len__(self) -> int:
        return len(self.requests)

    def take(self, limit: int) -> list[Any]:
        """Remove and return the oldest ``limit`` requests."""
        requests = self.requests
        if len(requests) <= limit:
            self.requests = []
            return requests
        head, self.requests = requests[:limit], requests[limit:]
        return head

    def push_front(self, requests: list[Any]) -> None:
        """Put ``requests`` back ahead of everything buffered (they are older)."""
        self.requests[0:0] = requests


class BlockingBuffer:
    """Per-key FIFO queues of contexts waiting for their key."""

    __slots__ = ("queues", "size")

    def __init__(self) -> None:
        self.queues: dict[Any, deque[Any]] = {}
        self.size = 0

    def add(self, context: Any) -> None:
        queue = self.queues.get(context.key)
        if queue is None:
            self.queues[context.key] = deque((context,))
        else:
            queue.append(context)
        self.size += 1

    def pop_next(self, key: Any) -> Any | None:
        """The oldest context waiting for ``key``, removed; None if none waits."""
        queue = self.queues.get(key)
        if queue is None:
            return None
        context = queue.popleft()
        if not queue:
            del self.queues[key]
        self.size -= 1
        return context

    def __len__(self) -> int:
        return self.size
