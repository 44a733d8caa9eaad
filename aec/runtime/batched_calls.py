"""One ``Context.call_batched`` argument on the loop thread: attempts, backoff, timeout.

``aec.runtime.external_calls`` hands each argument over as a ``BatchedCall``; its
attempts travel as ``BatchItem``s in the batcher's ``BatchQueue`` and its outcome goes
back through the call's completion (a ``CallCompletion``, the mail a single
``call_async`` posts: ``settle`` then ``post_together``, so the calls a batch call
finishes reach the mailbox as one mail).
Retries follow ``aec.retry`` as for ``call_async``: ``retry_on_result`` gets the
argument's own result, ``backoff(n)`` seconds pass before retry ``n``. Timeouts wait in
the queue's ``DeadlineFifo`` (``aec.runtime.deadlines``: one asyncio timer for all of
them, not one per argument). Everything here runs on the loop thread.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, Self

from aec.errors import describe, qualified_name
from aec.retry import RetryStrategy
from aec.runtime.batch_queue import BatchItem, BatchQueue, SentBatch
from aec.runtime.deadlines import Deadline, DeadlineFifo

__all__ = ["BatchedCall", "Settling", "deliver_to_calls"]


class Settling(Protocol):
    """A call's completion (``aec.runtime.external_calls.CallCompletion``): settled
    once, then posted with the others a batch call finished."""

    def settle(self, result: object, error: BaseException | None, fatal: bool) -> bool: ...
    def post_together(self, others: list[Self]) -> None: ...


class BatchedCall:
    """One ``call_batched`` argument on the loop thread: its attempts (each a
    ``BatchItem`` in some batch call), the backoff between them and its timeout.

    The timeout (``deadline``, monotonic seconds from the call's admission) spans every
    attempt and backoff; it waits in ``deadlines`` (its queue's ``DeadlineFifo``) from
    the first attempt's entry into a batch (``expiry``) until the call finishes or it
    passes. When it passes, the argument leaves its batch (a batch call none of whose
    arguments is waited for is cancelled) and the call fails with ``TimeoutError``. A
    wanted retry that would start at or after the deadline is not made: the timeout
    ends the backoff, as for ``call_async``.
    """

    __slots__ = (
        "arg", "completion", "queue", "deadlines", "retry", "timeout", "deadline",
        "attempts", "item", "first", "expiry", "backoff",
    )  # fmt: skip

    def __init__(
        self,
        arg: object,
        completion: Settling,
        queue: BatchQueue[BatchedCall],
        deadlines: DeadlineFifo,
        retry: RetryStrategy,
        timeout: float | None,
        deadline: float | None,
    ) -> None:
        self.arg = arg
        self.completion = completion
        self.queue = queue
        self.deadlines = deadlines
        self.retry = retry
        self.timeout = timeout
        self.deadline = deadline
        self.attempts = 1
        # the attempt in a batch (pending or sent); the first one is handed over by the
        # owner (``first``), later ones are added on the loop
        self.first: BatchItem[BatchedCall] | None = BatchItem(arg, self)
        self.item: BatchItem[BatchedCall] | None = self.first
        self.expiry: Deadline | None = None  # the timeout, once started
        self.backoff: asyncio.TimerHandle | None = None  # the next attempt

    def entered(self) -> None:
        """An attempt joined the pending batch: at the first, the timeout starts."""
        if self.first is not None:
            self.first = None
            if self.deadline is not None:
                self.expiry = self.deadlines.add(self.deadline, self)

    def _attempt(self) -> None:
        self.backoff = None
        self.attempts += 1
        item = self.item = BatchItem(self.arg, self)
        self.queue.add_again(item)

    def outcome(self, result: object, error: BaseException | None, fatal: bool) -> Settling | None:
        """The batch call of the current attempt came back with this argument's
        ``result``, or ``error`` (``fatal``: no retry). Returns the completion to post
        if the call is finished (the caller posts a batch's together), else None."""
        self.item = None
        retry = self.retry
        if not fatal and self.attempts < retry.max_attempts:
            try:
                if error is not None:
                    wanted = retry.should_retry_exception(error)
                else:
                    wanted = retry.should_retry_result(result)
                delay = retry.backoff(self.attempts) if wanted else 0.0
            except Exception as exc:  # the strategy failed: so did the call
                return self._finish(None, exc, False)
            if wanted:
                loop = asyncio.get_running_loop()
                if self.deadline is not None and loop.time() + delay >= self.deadline:
                    return None  # the timeout will end the backoff
                self.backoff = loop.call_later(delay, self._attempt)
                return None
        return self._finish(result, error, fatal)

    def time_out(self) -> None:
        """The deadline passed (its ``DeadlineFifo`` calls this): the argument leaves its
        batch, the call fails with ``TimeoutError``."""
        self.expiry = None
        if self.item is not None:
            self.queue.drop(self.item)
            self.item = None
        error = TimeoutError(
            f"call_batched({describe(self.arg, 60)}) of {qualified_name(self.queue.fn)} "
            f"timed out after {self.timeout:g} s"
        )
        completion = self._finish(None, error, False)
        if completion is not None:
            completion.post_together([])

    def _finish(self, result: object, error: BaseException | None, fatal: bool) -> Settling | None:
        """Settle the call's completion (not posted yet); it, or None if it was
        settled before."""
        if self.expiry is not None:
            self.deadlines.discard(self.expiry)  # O(1), no asyncio call
            self.expiry = None
        if self.backoff is not None:
            self.backoff.cancel()
            self.backoff = None
        return self.completion if self.completion.settle(result, error, fatal) else None


def deliver_to_calls(
    batch: SentBatch[BatchedCall],
    results: list[object] | None,
    error: BaseException | None,
    fatal: bool,
) -> None:
    """A batch call's outcome, argument by argument (loop thread); the calls it
    finished are posted as one mail."""
    finished = []
    for index, item in enumerate(batch.items):
        if not item.dropped:
            call = item.owner
            done = call.outcome(None if results is None else results[index], error, fatal)
            if done is not None:
                finished.append(done)
    if finished:
        finished[0].post_together(finished[1:])
