"""AsyncBatchWaitOperator: async I/O whose calls carry batches of inputs (FLINK-38825).

An ``AsyncWaitOperator`` whose call is ``AsyncBatchFunction.async_invoke_batch``:
everything per input stays the async I/O operator's (admission within ``capacity``,
the ordered or unordered queue with watermarks as boundaries, timeouts from
admission spanning attempts, retries under the strategy, ``timeout()`` fallbacks,
snapshot and restore), and only the call differs: each attempt of an input becomes
a ``BatchItem`` in the operator's ``aec.runtime.batch_queue.BatchQueue`` (on its
event-loop thread), which sends ``max_batch_size`` inputs per call, or fewer when
``batch_timeout`` seconds passed since the pending batch's first input, when a
watermark arrives, at a checkpoint, and before the operator sleeps because nothing
else can run (capacity reached, end of input). A restore re-invokes the stored
inputs in batches.

A batch call reports once, as one mail; the mailbox thread hands each input's
result (or the call's error) to that input's attempt, where the driver's usual rules
apply at once (a stale attempt is dropped, a failure may be retried; a retried input joins
whatever batch is pending then). A result of the wrong length fails the job at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import cast

from aec.async_io.batch_function import AsyncBatchFunction, check_batch_function
from aec.async_io.function import ResultFuture
from aec.async_io.operator import AsyncWaitOperator
from aec.async_io.queue import AsyncEntry
from aec.checkpoint.files import CheckpointHandle
from aec.retry import NoRetry, RetryStrategy
from aec.runtime.batch_queue import (
    BatchItem,
    BatchQueue,
    SentBatch,
    check_max_batch_size,
    check_max_wait,
)
from aec.runtime.event_loop import EventLoopThread
from aec.state.serialization import Serializer
from aec.state.typevars import IN, OUT

__all__ = ["AsyncBatchWaitOperator", "BATCH_MODES"]

BATCH_MODES = ("ordered", "unordered")
_NO_RETRY = NoRetry()
Attempt = tuple[AsyncEntry, ResultFuture]  # an input in a batch: its entry, its attempt


class AsyncBatchWaitOperator(AsyncWaitOperator[IN, OUT]):
    """Calls ``function.async_invoke_batch`` with batches of up to ``max_batch_size``
    inputs, at most ``capacity`` inputs admitted and not yet emitted (FLINK-38825's
    ``AsyncBatchWaitOperator``, on ``AsyncWaitOperator``'s queue, retries and
    checkpoints).

    Args:
        function: an ``AsyncBatchFunction``.
        max_batch_size: inputs per call, at most (int >= 1).
        batch_timeout: seconds a partial batch waits for more inputs after its first
            (>= 0; None or ``math.inf``: only when full or when progress needs it).
        timeout: seconds from an input's admission to its timeout, spanning every
            attempt (finite and > 0), or None / ``math.inf`` for none.
        capacity: max elements (records and watermarks) admitted and not yet emitted
            (int >= 1); a batch is never bigger than the inputs admitted.
        mode: ``"ordered"`` (input order) or ``"unordered"`` (completion order,
            watermarks as barriers).
        retry: an ``aec.retry`` strategy, per input (``retry_on_result`` gets the
            input's own list of outputs).
        serializer: how checkpoints store the inputs (``AsyncWaitOperator``'s).

    The methods are ``AsyncWaitOperator``'s (``open``, ``process``,
    ``process_watermark``, ``drain_outputs``, ``snapshot``, ``restore``, ``finish``,
    ``close``, ``metrics``, which adds ``batches``, ``batched_inputs``,
    ``max_batch_size`` and ``mean_batch_size``). Checkpoints have the async I/O
    operator's format, so a job may switch between per-input and batched calls
    across a restore (same mode).

    Raises:
        TypeError / ValueError: bad arguments (named).
    """

    modes = BATCH_MODES

    def __init__(
        self,
        function: AsyncBatchFunction[IN, OUT],
        *,
        max_batch_size: int,
        batch_timeout: float | None,
        timeout: float | None,
        capacity: int,
        mode: str = "ordered",
        retry: RetryStrategy = _NO_RETRY,
        serializer: str | Serializer = "msgpack",
    ) -> None:
        self.max_batch_size = check_max_batch_size(max_batch_size)
        self.batch_timeout = check_max_wait(batch_timeout, "batch_timeout")
        super().__init__(function, timeout, capacity, mode=mode, retry=retry, serializer=serializer)
        self._batches: BatchQueue[Attempt] | None = None
        # during restore: the stored inputs, a list per stretch between watermarks
        self._restoring: list[list[BatchItem[Attempt]]] | None = None
        # nothing else can run when the operator sleeps: the partial batch goes
        self._mailbox.before_sleep = self._flush

    @staticmethod
    def check_function(function: object) -> bool:
        """An ``AsyncBatchFunction`` with an ``async def async_invoke_batch(self,
        values)`` (TypeError otherwise); batch calls are always asyncio style."""
        return check_batch_function(function)

    # -- calls ---------------------------------------------------------------------------
    def _call(self, entry: AsyncEntry, future: ResultFuture) -> None:
        """This attempt of ``entry`` joins the pending batch; a timeout cancels it
        there (``entry.task``)."""
        item = BatchItem(entry.value, (entry, future))
        entry.task = item
        if self._restoring is not None:
            self._restoring[-1].append(item)  # handed over together when the restore is done
            return
        queue = self._batches
        if queue is None:
            queue = self._batch_queue()
        queue.submit(item)

    def _batch_queue(self) -> BatchQueue[Attempt]:
        queue = self._batches
        if queue is None:
            if self._loop is None:
                self._loop = EventLoopThread()
            function = cast(AsyncBatchFunction, self._function)
            queue = self._batches = BatchQueue(
                self._loop,
                function.async_invoke_batch,
                self.max_batch_size,
                self.batch_timeout,
                self._post_batch,
            )
        return queue

    def _post_batch(
        self,
        batch: SentBatch[Attempt],
        results: list[object] | None,
        error: BaseException | None,
        fatal: bool,
    ) -> None:
        """A batch call's outcome, one mail for the whole batch (loop thread)."""
        self._mailbox.post((batch, results, error, fatal))

    def _on_completion(
        self,
        future: ResultFuture | SentBatch[Attempt],
        results: list[object] | None,
        error: BaseException | None,
        fatal: bool,
    ) -> None:
        if type(future) is not SentBatch:
            super()._on_completion(future, results, error, fatal)
            return
        items = future.items
        if fatal:
            entry = items[0].owner[0]
            raise self._failure(entry, error) from error
        # each input's outcome becomes its attempt's completion, so the driver's rules
        # apply as for a single call: a result is checked by ResultFuture.settle and
        # handled at once, as the mail complete() would post (a mail per input cost
        # more than the input's other steps); a failed call's error goes by mail.
        complete = super()._on_completion
        for index, item in enumerate(items):
            entry, attempt = item.owner
            if entry.future is not attempt:
                continue  # timed out meanwhile, or an earlier attempt's batch
            if error is not None:
                attempt.complete_exceptionally(error)
                continue
            outcome = attempt.settle(cast("list[Iterable[object]]", results)[index])
            if outcome is not None:
                complete(attempt, *outcome)

    def _flush(self) -> None:
        """Send the pending partial batch (nothing once the loop thread stopped)."""
        if self._batches is not None and self._loop is not None:
            self._batches.flush()

    # -- boundaries: a partial batch leaves at once --------------------------------------
    def _before_watermark(self) -> None:
        if self._restoring is not None:  # the inputs before it leave in batches of their own
            self._restoring.append([])
            return
        self._flush()

    def restore(self, handle: CheckpointHandle | str | os.PathLike[str]) -> None:
        """``AsyncWaitOperator.restore``; the stored inputs between two watermarks are
        handed to the batch queue together, so they fill batches of ``max_batch_size``
        in their stored order (a watermark ends a batch, as it did before)."""
        self._restoring = [[]]
        try:
            super().restore(handle)
        finally:
            stretches, self._restoring = self._restoring, None
        for index, items in enumerate(stretches):
            if items:
                queue = self._batch_queue()
                queue.submit_all(items)
                if index < len(stretches) - 1:  # a watermark follows
                    queue.flush()

    def snapshot(self, checkpoint_id: int, directory: str | os.PathLike[str]) -> CheckpointHandle:
        """``AsyncWaitOperator.snapshot``; the pending partial batch is sent first."""
        self._flush()
        return super().snapshot(checkpoint_id, directory)

    @property
    def metrics(self) -> dict[str, float]:
        queue = self._batches
        calls, items, largest = (
            (0, 0, 0) if queue is None else (queue.calls, queue.items, queue.largest)
        )
        return {
            **super().metrics,
            "batches": calls,
            "batched_inputs": items,
            "max_batch_size": largest,
            "mean_batch_size": items / calls if calls else 0.0,
        }
