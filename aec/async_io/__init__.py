"""Async I/O (FLIP-12, FLIP-232 retries, FLIP-519 key-ordered): call an external
service per input with bounded calls in flight.

Modules: ``function`` (``AsyncFunction``, ``ResultFuture``), ``queue`` (ordered and
unordered queues, the per-key gate), ``driver`` (admission, calls, timeouts,
retries), ``waits`` (``ordered_wait``, ``unordered_wait``, ``key_ordered_wait``).
"""

from aec.async_io.function import AsyncFunction, ResultFuture
from aec.async_io.waits import key_ordered_wait, ordered_wait, unordered_wait

__all__ = [
    "AsyncFunction",
    "ResultFuture",
    "key_ordered_wait",
    "ordered_wait",
    "unordered_wait",
]
