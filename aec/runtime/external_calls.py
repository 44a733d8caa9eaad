"""External calls inside keyed functions: ``Context.call_async`` and
``Context.call_batched`` (beyond Flink).

Flink 2.x lets a keyed function await state, not a service; enrichment that needs
per-key state takes an ``AsyncWaitOperator`` and a shuffle. Here a call is one more
thing a record waits for, like a state request (FLIP-425's reference counting):

- ``ExternalCalls.call`` runs ``fn(*args)`` (an ``async def`` or anything returning
  an awaitable) on the operator's one asyncio loop thread (started lazily), with
  retries (``aec.retry``) and a timeout spanning them, and returns a ``CallFuture``.
- The pending call holds one reference on its ``RecordContext``, so same-key order,
  the in-flight limit and the drain before a snapshot hold as for state requests.
- The outcome comes back as a ``CallCompletion`` mail in the controller's mailbox
  (the only cross-thread hand-off); the controller runs it on the mailbox thread.
- In synchronous mode (``async_state=False``) the call runs to completion on the
  loop thread before ``call`` returns a completed future.
- ``ExternalCalls.call_batched`` hands its argument to the ``BatchQueue`` of its
  ``aec.async_io.Batcher`` (one per batcher and operator, on the same loop thread),
  so the calls of every in-flight record of every key share batch calls. Retries and
  the timeout are per argument (``aec.runtime.batched_calls``, on the loop thread):
  a retried argument joins whatever batch is pending then. Its outcome comes back
  through the same ``CallCompletion`` mail as a single call's. Before the mailbox thread sleeps
  (``Mailbox.before_sleep``) every queue sends the partial batch it holds: nothing
  else can run, so nothing more would join it; so does a watermark
  (``flush_batches``), which waits for the calls of the records before it. In
  synchronous mode a batch of one is sent and awaited before ``call_batched`` returns.

Invariants: ``controller.calls_in_flight`` counts calls (single or batched) whose
mail has not run; a timed-out call is cancelled (``asyncio.timeout``; a batch call
once none of its arguments is waited for); ``close`` cancels what is left and stops
the thread without waiting for abandoned calls to finish.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator
from time import monotonic
from typing import TYPE_CHECKING, Any, SupportsFloat, TypeVar, cast

from aec.errors import describe, qualified_name
from aec.functions import BatchCalls
from aec.retry import NoRetry, RetryStrategy, check_strategy, check_timeout
from aec.runtime.batch_queue import BatchItem, BatchQueue
from aec.runtime.batched_calls import BatchedCall, deliver_to_calls
from aec.runtime.deadlines import DeadlineFifo
from aec.runtime.event_loop import EventLoopThread
from aec.runtime.mailbox import Mailbox
from aec.runtime.record_context import RecordContext
from aec.state.future import _PENDING, StateFuture
from aec.state.typevars import IN, OUT, T

if TYPE_CHECKING:
    from aec.runtime.controller import AsyncExecutionController

__all__ = ["CallCompletion", "CallCompletions", "CallFuture", "ExternalCalls"]

R = TypeVar("R")

_NO_RETRY = NoRetry()
_CLOSE_GRACE = 0.5  # seconds close() gives cancelled calls to unwind


class CallFuture(StateFuture[T]):
    """The ``StateFuture`` of one external call (of result ``T``): it may carry an
    exception.

    ``await`` raises the call's exception inside the user's coroutine (which may
    catch it); a chained callback (``then_apply``, ...) or ``get()`` re-raises it,
    which fails the job (docs/semantics.md rule 10).
    """

    __slots__ = ("_error",)
    # a pending call holds a reference on its record (released after completion):
    # callbacks ride on it
    callbacks_hold_record = False
    may_fail = True

    def __init__(self, context: RecordContext | None = None) -> None:
        super().__init__(context)
        self._error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        """Complete with ``error`` (engine use; mailbox thread)."""
        self._error = error
        self.complete(None)  # type: ignore[arg-type]  # never read: get() raises the error

    def settle(self, result: T | None, error: BaseException | None) -> None:
        """Complete a future nothing is registered on yet with ``result`` or ``error``
        (synchronous mode: the call ran before the future was returned; with an error,
        ``result`` is None and never read)."""
        self._error = error
        self._result = None if error is not None else result  # type: ignore[assignment]

    def get(self) -> T:
        if self._error is not None:
            raise self._error
        return super().get()

    def __await__(self) -> Generator[StateFuture[T], T, T]:
        if self._result is _PENDING:
            yield self
        error = self._error
        if error is None:
            return self._result
        # the error's traceback holds this frame: no local may keep it (or this future,
        # which holds it) alive, else each caught error is a reference cycle
        del self
        try:
            raise error
        finally:
            del error

    def then_apply(self, fn: Callable[[T], R]) -> StateFuture[R]:
        return super().then_apply(self._checked(fn))

    def then_accept(self, fn: Callable[[T], object]) -> StateFuture[None]:
        return super().then_accept(self._checked(fn))

    def then_compose(self, fn: Callable[[T], object]) -> StateFuture[Any]:  # as StateFuture's
        return super().then_compose(self._checked(fn))

    def _checked(self, fn: Callable[[T], R]) -> Callable[[T], R]:
        def run(result: T) -> R:
            if self._error is not None:
                raise self._error
            return fn(result)

        return run


class CallCompletion:
    """The mail that hands a call's outcome to the mailbox thread; any thread may
    ``complete`` it (the loop thread does), the first outcome wins."""

    __slots__ = ("future", "result", "error", "fatal", "_mailbox", "_posted")

    def __init__(self, future: CallFuture[Any], mailbox: Mailbox) -> None:
        self.future = future  # of any result type: the call's outcome completes it
        self.result: object = None
        self.error: BaseException | None = None
        self.fatal = False  # the error fails the job when the mail runs
        self._mailbox = mailbox
        self._posted = False

    @property
    def mailbox(self) -> Mailbox:
        """Where the outcome is posted."""
        return self._mailbox

    def complete(self, result: object) -> None:
        if self.settle(result, None, False):
            self._mailbox.post(self)

    def complete_exceptionally(self, error: BaseException) -> None:
        if self.settle(None, error, False):
            self._mailbox.post(self)

    def abort(self, error: BaseException) -> None:
        """Complete with an ``error`` no coroutine may catch: running the mail fails
        the job naming the call's record (a misused batch function)."""
        if self.settle(None, error, True):
            self._mailbox.post(self)

    def settle(self, result: object, error: BaseException | None, fatal: bool) -> bool:
        """Record the outcome without posting it; False if one was recorded before
        (the first wins). The caller posts it (``post_together``)."""
        if self._posted:
            return False
        self._posted = True
        self.result = result
        self.error = error
        self.fatal = fatal
        return True

    def post_together(self, others: list[CallCompletion]) -> None:
        """Post this settled completion and ``others`` (same mailbox) as one mail:
        a batch call's results cost one hand-off, not one each."""
        self._mailbox.post(CallCompletions([self, *others]) if others else self)

    def run(self, controller: AsyncExecutionController) -> None:
        """On the mailbox thread: the mail of one call (``finish`` through the AEC)."""
        controller.complete_calls((self,))

    def finish(self, controller: AsyncExecutionController) -> None:
        """On the mailbox thread: complete the future, drop the call's reference.

        Raises the error of an ``abort``ed call (the job fails, rule 10)."""
        controller.calls_in_flight -= 1
        future = self.future
        context: RecordContext = future.context  # type: ignore[assignment]  # a call's future is its record's
        controller.current = context
        if self.fatal:
            raise cast(BaseException, self.error)
        if self.error is not None:
            future.fail(self.error)
        else:
            future.complete(self.result)
        context.release()  # the call's reference, after its callbacks ran
        controller.current = None


class CallCompletions(list[CallCompletion]):
    """Several settled ``CallCompletion``s handed over as one mail."""

    __slots__ = ()

    def run(self, controller: AsyncExecutionController) -> None:
        controller.complete_calls(self)


class _Queue:
    """A batcher's queue in one operator: the batcher (kept so its id stays its own),
    its ``BatchQueue``, its calls' timeouts (``DeadlineFifo``, loop thread), and the
    ``timeout`` and ``retry`` objects of the last call, checked then (``seconds``:
    what ``check_timeout`` made of ``timeout``)."""

    __slots__ = ("batcher", "queue", "deadlines", "timeout", "retry", "seconds")

    def __init__(self, batcher: BatchCalls[Any, Any], queue: BatchQueue[BatchedCall]) -> None:
        self.batcher = batcher
        self.queue = queue
        self.deadlines = DeadlineFifo()
        self.timeout: object = _UNCHECKED
        self.retry: object = _UNCHECKED
        self.seconds: float | None = None


_UNCHECKED = object()  # no call checked yet


class ExternalCalls:
    """The external calls of one operator: single calls and batched calls.

    Args:
        controller: the operator's ``AsyncExecutionController`` (its mailbox, the
            current record, ``calls_in_flight``, ``synchronous``).
    """

    def __init__(self, controller: AsyncExecutionController) -> None:
        self._controller = controller
        self._loop: EventLoopThread | None = None
        # id(Batcher) -> (the Batcher, kept so its id stays its own; its queue; the
        # timeouts of its calls, loop thread)
        self._queues: dict[int, _Queue] = {}
        self.calls = 0  # call_async calls started (metrics)
        self.batched_calls = 0  # call_batched calls started (metrics)

    def call(
        self,
        fn: Callable[..., Awaitable[R]],
        args: tuple[object, ...],
        timeout: SupportsFloat | None = None,
        retry: RetryStrategy = _NO_RETRY,
    ) -> CallFuture[R]:
        """Start ``fn(*args)`` for the current record; see ``Context.call_async``.

        Raises TypeError (a non-callable ``fn``, a bad timeout or retry) or
        ValueError (a timeout <= 0), RuntimeError outside a record.
        """
        if not callable(fn):
            raise TypeError(f"call_async takes an async function, got {describe(fn)}")
        seconds = check_timeout(timeout)
        check_strategy(retry)
        context = self._current_record("call_async")
        controller = self._controller
        loop = self._event_loop()
        self.calls += 1
        future: CallFuture[R] = CallFuture(context)
        coroutine = _call(fn, args, seconds, retry)
        if controller.synchronous:
            completion = _completion_here(future)
            loop.submit(coroutine, completion)
            _settle_when_done(future, completion)
            return future
        self._count_pending(context)
        loop.submit(coroutine, CallCompletion(future, controller.mailbox))
        return future

    def call_batched(
        self,
        batcher: BatchCalls[IN, OUT],
        arg: IN,
        timeout: SupportsFloat | None = None,
        retry: RetryStrategy = _NO_RETRY,
    ) -> CallFuture[OUT]:
        """Hand ``arg`` to ``batcher``'s batch calls for the current record; see
        ``Context.call_batched``.

        Raises TypeError (not a ``Batcher``, a bad timeout or retry), ValueError (a
        timeout <= 0), RuntimeError outside a record.
        """
        known = self._queues.get(id(batcher))
        checked = known is not None and timeout is known.timeout and retry is known.retry
        if checked:
            seconds = known.seconds  # type: ignore[union-attr]  # checked: known is set
        else:
            if known is None:
                _check_batcher(batcher)
            seconds = check_timeout(timeout)
            check_strategy(retry)
        controller = self._controller
        context = controller.current
        if context is None:
            raise _outside_record("call_batched")
        if known is None:
            known = self._queue(batcher)
        if not checked:  # remembered: the same objects next time are not checked again
            known.timeout, known.retry, known.seconds = timeout, retry, seconds
        queue = known.queue
        deadlines = known.deadlines
        self.batched_calls += 1
        future: CallFuture[OUT] = CallFuture(context)
        # monotonic seconds: asyncio's loop.time(), which the deadlines are compared with
        deadline = None if seconds is None else monotonic() + seconds
        if controller.synchronous:
            completion = _completion_here(future)
            call = BatchedCall(arg, completion, queue, deadlines, retry, seconds, deadline)
            queue.submit(cast("BatchItem[BatchedCall]", call.first))
            queue.flush()  # a batch of one: the mailbox thread waits for nothing else
            _settle_when_done(future, completion)
            if completion.fatal:
                # a misused batch function fails the job even if the caller catches
                # the error, naming this record, as in async mode
                controller.fails_the_run(cast(BaseException, completion.error))
            return future
        self._count_pending(context)
        completion = CallCompletion(future, controller.mailbox)
        call = BatchedCall(arg, completion, queue, deadlines, retry, seconds, deadline)
        first: BatchItem[BatchedCall] = call.first  # type: ignore[assignment]  # set, not entered yet
        queue.submit(first)  # (not typing.cast: a Python call per record)
        return future

    @property
    def metrics(self) -> dict[str, float]:
        """``call_async`` calls, ``call_batched`` calls, the batch calls they made, the
        arguments those carried and the largest batch (counters of this operator)."""
        queues = [known.queue for known in self._queues.values()]
        batches = sum(q.calls for q in queues)
        items = sum(q.items for q in queues)
        return {
            "external_calls": self.calls,
            "batched_calls": self.batched_calls,
            "call_batches": batches,
            "call_batch_max_size": max((q.largest for q in queues), default=0),
            "call_batch_mean_size": items / batches if batches else 0.0,
        }

    @property
    def deadline_entries(self) -> int:
        """Timeouts of batched calls held on the loop thread, live or of calls since
        finished (not yet dropped): about twice the calls waiting at most, however
        many finished (``aec.runtime.deadlines``). Read it on the mailbox thread (which
        adds batchers); a gauge."""
        return sum(len(known.deadlines) for known in self._queues.values())

    def close(self) -> None:
        """Cancel every running call and stop the loop thread (bounded, ~1 s at most:
        abandoned calls are not waited for). Idempotent."""
        loop, self._loop = self._loop, None
        if self._queues:
            self._controller.mailbox.before_sleep = None
        if loop is not None:
            loop.stop()

    # -- helpers ----------------------------------------------------------------------------
    def _current_record(self, what: str) -> RecordContext:
        context = self._controller.current
        if context is None:
            raise _outside_record(what)
        return context

    def _count_pending(self, context: RecordContext) -> None:
        """The pending call holds its record like a pending state request does."""
        context.retain()
        self._controller.calls_in_flight += 1

    def _event_loop(self) -> EventLoopThread:
        if self._loop is None:
            self._loop = EventLoopThread(grace=_CLOSE_GRACE, name="aec-call-loop")
        return self._loop

    def _queue(self, batcher: BatchCalls[Any, Any]) -> _Queue:
        """The batch queue of ``batcher`` in this operator and the timeouts of its
        calls, made at its first call."""
        queue = BatchQueue(
            self._event_loop(), batcher.fn, batcher.max_batch_size, batcher.max_wait,
            deliver_to_calls, BatchedCall.entered,
        )  # fmt: skip
        if not self._queues and not self._controller.synchronous:
            # nothing else can run once the mailbox thread sleeps: partial batches go
            self._controller.mailbox.before_sleep = self.flush_batches
        known = self._queues[id(batcher)] = _Queue(batcher, queue)
        return known

    def flush_batches(self) -> None:
        """Send every partial batch now: progress needs it (a watermark arrived behind
        it, or the mailbox thread is about to sleep)."""
        for known in self._queues.values():
            known.queue.flush()


def _completion_here(future: CallFuture[Any]) -> CallCompletion:
    """The completion of a synchronous-mode call: posted to a mailbox of its own,
    which the mailbox thread waits on (``_settle_when_done``)."""
    return CallCompletion(future, Mailbox())


def _settle_when_done(future: CallFuture[Any], completion: CallCompletion) -> None:
    """Wait for ``completion`` (made by ``_completion_here``) on the mailbox thread and
    settle ``future`` with its outcome (read from the completion, not from the mail,
    which may hold it in a group of one). The mail is taken out: left in its mailbox
    it would hold the completion, which holds the mailbox (a reference cycle)."""
    mailbox = completion.mailbox
    while not mailbox:
        mailbox.wait(None)
    mailbox.take()
    future.settle(completion.result, completion.error)


def _outside_record(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what}() outside a record: call it in process_element, on_timer or "
        "their callbacks (not in open() or after finish())"
    )


def _check_batcher(batcher: object) -> None:
    if not all(hasattr(batcher, name) for name in ("fn", "max_batch_size", "max_wait")):
        raise TypeError(
            f"call_batched takes an aec.async_io.Batcher(fn, max_batch_size=, max_wait=), "
            f"got {describe(batcher, 80)}"
        )


async def _call(
    fn: Callable[..., Awaitable[R]],
    args: tuple[object, ...],
    timeout: float | None,
    retry: RetryStrategy,
) -> R:
    """``fn(*args)`` with retries; ``timeout`` spans every attempt and backoff and
    cancels the running attempt (``TimeoutError``). The deadline holds whatever ``fn``
    does: an attempt that swallows the cancellation, or blocks the loop past the
    deadline, still ends the call with ``TimeoutError``, and no retry starts after it
    (as the async I/O operator's own timers do)."""
    if timeout is None:
        return await _attempts(fn, args, retry, None)
    deadline = asyncio.get_running_loop().time() + timeout
    async with asyncio.timeout_at(deadline):  # no extra task per call, unlike wait_for
        result = await _attempts(fn, args, retry, deadline)
    _check_deadline(deadline)
    return result


def _check_deadline(deadline: float | None) -> None:
    """Raise ``TimeoutError`` if the loop's clock passed ``deadline`` (None: none)."""
    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
        raise TimeoutError


async def _attempts(
    fn: Callable[..., Awaitable[R]],
    args: tuple[object, ...],
    retry: RetryStrategy,
    deadline: float | None,
) -> R:
    attempt = 0
    while True:
        attempt += 1
        awaitable = fn(*args)
        if not inspect.isawaitable(awaitable):
            raise TypeError(
                f"call_async: {qualified_name(fn)} returned {describe(awaitable, 80)}, not an "
                "awaitable: pass an `async def` function (or one returning an awaitable)"
            )
        try:
            result = await awaitable
        except Exception as exc:
            if attempt < retry.max_attempts and retry.should_retry_exception(exc):
                _check_deadline(deadline)
                await asyncio.sleep(retry.backoff(attempt))
                continue
            raise
        if attempt < retry.max_attempts and retry.should_retry_result(result):
            _check_deadline(deadline)
            await asyncio.sleep(retry.backoff(attempt))
            continue
        return result
