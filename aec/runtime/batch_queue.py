"""Batch calls: single inputs coalesced into calls ``fn(values) -> results`` on an event loop.

One ``BatchQueue`` per batch function and operator, used by both batched paths:
``aec.async_io.AsyncBatchWaitOperator`` (FLINK-38825's ``AsyncBatchWaitOperator``)
and ``Context.call_batched`` (``aec.runtime.external_calls``: the calls of every
in-flight record of every key share batches).

The owner thread (a mailbox thread) hands inputs over (``submit``) and asks for what
is held to go (``flush``: at a watermark, a checkpoint, the end of input, and before
the owner sleeps because nothing else can run). On the loop thread the queue keeps
the pending batch and sends it as one call when it holds ``max_batch_size`` inputs,
when ``max_wait`` seconds passed since its first input (an asyncio timer, so a batch
leaves on time even while the owner is busy elsewhere), or when the owner flushes.
Inputs cross over in an outbox the loop takes from, and the owner wakes the loop
about twice per batch, not per input: a wake-up is a self-pipe write, and one per
input cost more than the inputs themselves (measured on ``perf/bench_batch_calls.py``).

Invariants (loop thread unless said otherwise):
- Each input is in at most one batch call, and a batch holds at most
  ``max_batch_size`` inputs: a full pending batch is sent at once.
- The deadline timer is armed iff the pending batch is non-empty (and ``max_wait``
  is finite).
- A dropped input (its owner stopped waiting: a timeout) is never sent; a batch call
  whose inputs are all dropped is cancelled and reports nothing.
- Each batch call that is not cancelled reports once, through ``deliver(batch,
  results, error, fatal)`` on the loop thread: ``results`` has exactly one entry per
  input, in order, or ``error`` is set; ``fatal`` marks a misuse (a result of the
  wrong length, no awaitable) that no retry can mend.
- Every input the owner hands over is taken by the loop at the latest when its batch
  is full, its batch's ``max_wait`` ends, or the owner flushes; after a flush nothing
  stays pending until the owner hands over again (``flush`` also asks when inputs
  re-entered on the loop are pending, and a ``take`` while the owner sleeps sends
  what is left). The first input of a batch wakes the loop to start that timer:
  ``_loop_empty`` is set by the loop when it sent its pending batch (however it
  left: full, on its timer, flushed) and cleared by the owner's wake-up; the loop
  sets it before looking at the outbox once more, so an input handed over while it
  sent is either seen there or wakes the loop itself.
- A flush is a boundary: it puts a mark in the outbox, and the loop sends the pending
  batch when it takes the mark, so no input handed over after a flush shares a batch
  call with one handed over before it (a watermark's inputs never travel with the
  next epoch's, however the two threads interleave).
- ``_owner_idle`` is set by the owner's ``flush`` and cleared by its ``submit``:
  while the owner sleeps, an input that re-enters on the loop (a retry after its
  backoff) leaves in the next loop turn (with the other retries due in this one)
  instead of waiting for ``max_wait``.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import math
from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Generic, TypeVar, final

from aec.errors import describe, qualified_name
from aec.runtime.event_loop import EventLoopThread

__all__ = [
    "BatchItem",
    "BatchQueue",
    "BatchResultError",
    "SentBatch",
    "batch_results",
    "check_max_batch_size",
    "check_max_wait",
]

OWNER = TypeVar("OWNER")  # an input's owner: what the queue's user needs back with its outcome
# a batch function: an awaitable of one result per value, in order (checked when called;
# the values are the caller's)
BatchFn = Callable[[list[Any]], object]
# (batch, results, error, fatal) -> None: a batch call's outcome
Deliver = Callable[["SentBatch[OWNER]", "list[object] | None", "BaseException | None", bool], None]


class BatchResultError(ValueError):
    """A batch function's result does not give one result per input (wrong length, or
    not a list at all). Fails the job at once: retrying the same batch cannot mend it."""


def batch_results(fn: object, size: int, results: Any) -> list[object]:
    """``results`` of a call of ``fn`` with ``size`` values (whatever it returned) as a
    list, one entry per input in order (``size`` is counted before the call: ``fn`` may
    consume its list).

    Raises:
        BatchResultError: ``results`` is not an iterable of ``size`` entries (the
            message names ``fn`` as ``module.qualname`` and both lengths).
    """
    # a set or mapping has no order to pair its entries with the inputs
    if results is None or isinstance(results, (str, bytes, bytearray, AbstractSet, Mapping)):
        raise BatchResultError(
            f"{qualified_name(fn)} returned {describe(results, 80)} for a batch of "
            f"{size} inputs: a batch function returns a list with one result per input"
        )
    try:
        collected = list(results)
    except TypeError:
        raise BatchResultError(
            f"{qualified_name(fn)} returned {type(results).__name__} for a batch of "
            f"{size} inputs: a batch function returns a list with one result per input"
        ) from None
    if len(collected) != size:
        raise BatchResultError(
            f"{qualified_name(fn)} returned {len(collected)} results for a batch of "
            f"{size} inputs: a batch function returns one result per input, in order"
        )
    return collected


def check_max_batch_size(size: object, name: str = "max_batch_size") -> int:
    """Return ``size`` if it is an int >= 1; TypeError / ValueError naming ``name``."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"{name} must be an int >= 1 (inputs per batch call), got {size!r}")
    if size < 1:
        raise ValueError(f"{name} must be >= 1, got {size}")
    return size


def check_max_wait(seconds: object, name: str = "max_wait") -> float | None:
    """Seconds a partial batch may wait for more inputs: a number >= 0 (0: only inputs
    handed over together share a batch), or None / ``math.inf`` for no time limit
    (returned as None: batches then leave when full or when progress needs them).

    Raises TypeError for a non-number, ValueError for a negative number or NaN.
    """
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {seconds!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{name} must be >= 0 seconds (or None for no limit), got {seconds!r}")
    return None if math.isinf(seconds) else float(seconds)


class _Mark(enum.Enum):
    """What else the outbox carries: ``FLUSH``, a flush's boundary."""

    FLUSH = "flush"


class BatchItem(Generic[OWNER]):
    """One input waiting for, or travelling in, a batch call.

    ``value`` is what the batch function gets; ``owner`` is the caller's (the async
    I/O entry and its attempt, or a batched call). ``batch`` and ``dropped`` are
    loop-thread fields.
    """

    __slots__ = ("value", "owner", "batch", "dropped", "queue")

    def __init__(self, value: object, owner: OWNER) -> None:
        self.value = value
        self.owner = owner
        self.batch: SentBatch[OWNER] | None = None
        self.dropped = False
        self.queue: BatchQueue[OWNER] | None = None  # set when handed to a queue

    def cancel(self) -> None:
        """Stop waiting for this input (any thread; returns at once): see
        ``BatchQueue.drop``."""
        queue = self.queue
        if queue is not None:
            queue.loop.call_soon(queue.drop, self)

    def __repr__(self) -> str:
        return f"<BatchItem {describe(self.value, 60)}{' dropped' if self.dropped else ''}>"


@final  # told apart from other mails by ``type(mail) is SentBatch``
class SentBatch(Generic[OWNER]):
    """One batch call: its inputs in order, how many are still wanted, its task."""

    __slots__ = ("items", "live", "task")

    def __init__(self, items: list[BatchItem[OWNER]]) -> None:
        self.items = items
        self.live = len(items)  # inputs still waited for (not dropped)
        self.task: asyncio.Task[None] | None = None  # running the call, once sent

    def __repr__(self) -> str:
        return f"<SentBatch of {len(self.items)} ({self.live} wanted)>"


class BatchQueue(Generic[OWNER]):
    """Inputs of one batch function waiting for their batch call, and the calls.

    Args:
        loop: the operator's event loop thread (calls run there).
        fn: ``async def fn(values: list) -> list`` (or any callable returning an
            awaitable), one result per value, in order.
        max_batch_size: inputs per call, at most (see ``check_max_batch_size``).
        max_wait: seconds a partial batch waits for more inputs, or None.
        deliver: ``(batch, results, error, fatal) -> None``, called on the loop thread
            with each batch call's outcome (see the module's invariants).
        entered: ``(owner) -> None``, called on the loop thread with an input's
            ``owner`` when the input joins the pending batch (a batched call starts
            its timeout there), or None.
    """

    def __init__(
        self,
        loop: EventLoopThread,
        fn: BatchFn,
        max_batch_size: int,
        max_wait: float | None,
        deliver: Deliver[OWNER],
        entered: Callable[[OWNER], None] | None = None,
    ) -> None:
        self.loop = loop
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self._deliver = deliver
        self._entered = entered
        # handed over by the owner, taken by the loop (a deque: atomic append/popleft);
        # a flush's mark ends the batch of the inputs before it
        self._outbox: deque[BatchItem[OWNER] | _Mark] = deque()
        self._handed = 0  # owner thread: inputs handed over since the loop was last asked
        self._loop_empty = True  # no pending batch: the next input must wake the loop
        self._owner_idle = False  # written by the owner, read on the loop
        self._pending: list[BatchItem[OWNER]] = []  # loop thread
        self._timer: asyncio.TimerHandle | None = None  # loop thread
        self._send_soon = False  # loop thread: a send is due in the next loop turn
        # metrics, written on the loop thread
        self.calls = 0
        self.items = 0
        self.largest = 0

    # -- owner thread ------------------------------------------------------------------------
    def submit(self, item: BatchItem[OWNER]) -> None:
        """Hand ``item`` over. The loop is woken once per batch, not per input: when
        the first input of a batch arrives (to start its ``max_wait``) and when a
        batch's worth has arrived."""
        item.queue = self
        self._outbox.append(item)
        self._owner_idle = False
        handed = self._handed + 1
        if handed >= self.max_batch_size:
            handed = 0
            self._loop_empty = False
            self.loop.call_soon(self.take)
        elif self._loop_empty and self.max_wait is not None:
            self._loop_empty = False
            self.loop.call_soon(self.take)  # starts the pending batch's max_wait
        self._handed = handed

    def submit_all(self, items: list[BatchItem[OWNER]]) -> None:
        """Hand ``items`` over together, with one wake-up: they fill batches in order
        (a restore's stored inputs share batches however the threads interleave)."""
        for item in items:
            item.queue = self
        self._outbox.extend(items)
        self._owner_idle = False
        self._handed = 0
        self._loop_empty = False
        self.loop.call_soon(self.take)

    def flush(self) -> None:
        """Send what is held now (every input handed over before), and send inputs
        re-entering on the loop without waiting until the next ``submit``: the owner
        is about to sleep, or progress needs every input on its way."""
        self._owner_idle = True  # first: the loop's checks of it follow its own writes
        if self._outbox or self._pending:  # a deque's or list's truth is one atomic read
            self._outbox.append(_Mark.FLUSH)  # what was handed over so far leaves there
            self._handed = 0
            self.loop.call_soon(self.take)

    # -- loop thread -------------------------------------------------------------------------
    def take(self) -> None:
        """Move the inputs handed over into the pending batch (full batches leave, and
        the batch before a flush's mark; the rest too if the owner sleeps, as nothing
        would join it)."""
        outbox = self._outbox
        while outbox:
            item = outbox.popleft()
            if item is _Mark.FLUSH:
                if self._pending:
                    self.send()
            else:
                self.add(item)
        if self._owner_idle and self._pending:
            self.send()

    def take_and_send(self) -> None:
        """``take``, then send the pending batch, full or not."""
        self.take()
        self.send()

    def add(self, item: BatchItem[OWNER]) -> None:
        """Put ``item`` in the pending batch; send it if that makes it full."""
        item.queue = self
        if item.dropped:
            return
        if self._entered is not None:
            self._entered(item.owner)
        pending = self._pending
        pending.append(item)
        if len(pending) >= self.max_batch_size:
            self.send()
        elif len(pending) == 1 and self.max_wait is not None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait, self.take_and_send)

    def add_again(self, item: BatchItem[OWNER]) -> None:
        """``add`` for an input re-entering on the loop (a retry): while the owner
        sleeps, nothing it does can fill the batch, so it leaves in this loop turn,
        with the inputs whose retries fall due in the same turn."""
        self.add(item)
        if self._owner_idle and self._pending and not self._send_soon:
            self._send_soon = True
            asyncio.get_running_loop().call_soon(self.send)

    def send(self) -> None:
        """Send the pending batch (its inputs not dropped) as one call."""
        self._send_soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        self._loop_empty = True
        if self._outbox and self.max_wait is not None:  # handed over while this one left
            self._loop_empty = False
            asyncio.get_running_loop().call_soon(self.take)
        items = [item for item in pending if not item.dropped]
        if not items or self.loop.stopping:  # stopping: the owner waits for no outcome
            return
        batch = SentBatch(items)
        for item in items:
            item.batch = batch
        self.calls += 1
        self.items += len(items)
        if len(items) > self.largest:
            self.largest = len(items)
        batch.task = asyncio.get_running_loop().create_task(self._call(batch))

    def drop(self, item: BatchItem[OWNER]) -> None:
        """Nobody waits for ``item`` any more: it is left out of its batch if not sent
        yet; a sent batch none of whose inputs is wanted is cancelled."""
        if item.dropped:
            return
        item.dropped = True
        batch = item.batch
        if batch is None:
            return
        batch.live -= 1
        if batch.live == 0 and batch.task is not None:
            batch.task.cancel()

    async def _call(self, batch: SentBatch[OWNER]) -> None:
        items = batch.items
        values = [item.value for item in items]
        try:
            # the outcome is made where no local holds the batch: a failure's traceback
            # holds that frame, and each input's owner ends up holding the failure
            self._deliver(batch, *await _outcome(self.fn, values, len(items)))
        finally:
            # a finished call: its inputs let go of it, and it of its task (a batch and
            # its inputs would otherwise be a reference cycle, freed by the GC only, and
            # each input holds its caller's objects: a record, its future and completion)
            for item in items:
                item.batch = None
            batch.task = None


async def _outcome(
    fn: BatchFn, values: list[object], size: int
) -> tuple[list[object] | None, BaseException | None, bool]:
    """``fn(values)``'s ``(results, error, fatal)`` (``fatal``: a misused batch function,
    no retry). ``size`` is ``len(values)`` before the call (``fn`` may consume its list).
    Raises CancelledError when its task is cancelled (dropped by every input, or the
    loop stops: nobody takes an outcome)."""
    try:
        awaitable = fn(values)
    except (Exception, asyncio.CancelledError) as exc:  # before any awaitable: a failed call
        return None, exc, False
    except BaseException as exc:
        return None, exc, True
    if not inspect.isawaitable(awaitable):
        error = TypeError(
            f"{qualified_name(fn)} returned {describe(awaitable, 80)}, not an awaitable: "
            "a batch function is an `async def fn(values: list) -> list`"
        )
        return None, error, True
    try:
        return batch_results(fn, size, await awaitable), None, False
    except asyncio.CancelledError as exc:
        if _cancelling():
            raise
        return None, exc, False  # fn's own (it awaited a cancelled future)
    except BatchResultError as exc:  # also raised inside fn by a wrapper that checks
        return None, exc, True
    except Exception as exc:
        return None, exc, False
    except BaseException as exc:  # KeyboardInterrupt, SystemExit, a user's: fail, no retry
        return None, exc, True


def _cancelling() -> bool:
    """Whether the running task is being cancelled (not a CancelledError of its own)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
