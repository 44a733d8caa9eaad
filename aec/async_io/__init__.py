"""Async I/O (FLIP-12, FLIP-232 retries, FLIP-519 key-ordered): call an external
service per input with bounded calls in flight.

Batched calls (FLINK-38825, and beyond it across keys): ``AsyncBatchFunction``,
``batch_wait``, ``AsyncBatchWaitOperator``, and ``Batcher`` for
``Context.call_batched``.

Modules: ``function`` (``AsyncFunction``, ``ResultFuture``), ``queue`` (ordered and
unordered queues, the per-key gate), ``driver`` (calls, timeouts, retries),
``operator`` (``AsyncWaitOperator``: push input, emit, snapshot, restore),
``snapshot`` (its checkpoint contents), ``batch_function`` (``AsyncBatchFunction``),
``batch_operator`` (``AsyncBatchWaitOperator``), ``batcher`` (``Batcher``),
``waits`` (``ordered_wait``, ``unordered_wait``, ``key_ordered_wait``,
``batch_wait``: iterator front-ends).
"""

from aec.async_io.batch_function import AsyncBatchFunction
from aec.async_io.batch_operator import AsyncBatchWaitOperator
from aec.async_io.batcher import Batcher
from aec.async_io.function import AsyncFunction, ResultFuture
from aec.async_io.operator import AsyncWaitOperator
from aec.async_io.waits import batch_wait, key_ordered_wait, ordered_wait, unordered_wait

__all__ = [
    "AsyncBatchFunction",
    "AsyncBatchWaitOperator",
    "AsyncFunction",
    "AsyncWaitOperator",
    "Batcher",
    "ResultFuture",
    "batch_wait",
    "key_ordered_wait",
    "ordered_wait",
    "unordered_wait",
]
