"""Async I/O (FLIP-12, FLIP-232 retries, FLIP-519 key-ordered): call an external
service per input with bounded calls in flight.

Modules: ``function`` (``AsyncFunction``, ``ResultFuture``), ``queue`` (ordered and
unordered queues, the per-key gate), ``driver`` (calls, timeouts, retries),
``operator`` (``AsyncWaitOperator``: push input, emit, snapshot, restore),
``snapshot`` (its checkpoint contents), ``waits`` (``ordered_wait``,
``unordered_wait``, ``key_ordered_wait``: iterator front-ends).
"""

from aec.async_io.function import AsyncFunction, ResultFuture
from aec.async_io.operator import AsyncWaitOperator
from aec.async_io.waits import key_ordered_wait, ordered_wait, unordered_wait

__all__ = [
    "AsyncFunction",
    "AsyncWaitOperator",
    "ResultFuture",
    "key_ordered_wait",
    "ordered_wait",
    "unordered_wait",
]
