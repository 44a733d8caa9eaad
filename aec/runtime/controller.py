"""AsyncExecutionController: the AEC of FLIP-425, one per operator.

It owns key accounting, the active and blocking buffers, the in-flight count,
epoch accounting and the mailbox loop; the operator owns user code and timers.
Invariants (mailbox thread only):
- ``in_flight`` = records and timer firings admitted and not finished; input
  is admitted only below ``in_flight_records_limit`` (timers overdraw).
- A context starts (``start``) only while it holds its key; when its reference
  count reaches 0 the key passes to the next waiting context of that key.
- Completion mails are handled before waiting contexts start, and both before
  the operator takes new input (DESIGN rule 6).
- In synchronous mode (``async_state=False``) every request runs at once on
  the mailbox thread and returns a completed future.
- A hot key's records flow without a batch round trip each: a record that
  waited for its key runs its requests at once when the executor allows it
  (``StateExecutor.run_now``: a backend answering from memory), as a batch of
  one. It waited for the only record that could touch its key, and records of
  other keys may interleave in any order (rule 2), so the results are those
  of the buffered path; the buffer keeps batching the records of other keys.
  The same holds for a request made in a callback of a completed request
  (``completing``; inline executor only): its record holds its key. Either
  runs at once only when none of its record's requests is still queued
  (``RecordContext.queued``), so a record's requests reach the backend in
  submission order, and, when the executor ``prefers_batches`` (a store call
  costs more than a request inside one: RocksDB), only when no other record
  has requests in the active buffer or is ready to make some; else it joins
  them there.
- Progress needs a flush (rule 4) when ``BLOCKED_FLUSH`` records went to the
  blocking buffer since the last one, on an inline executor that does not
  prefer batches (a store answering from memory: no call to share). Skewed
  keys otherwise keep thousands of records blocked behind a filling buffer,
  and their memory traffic, not their instructions, made async cost 1.27x
  sync on Zipf(1.1) keys (perf/bench_core.py; 1.14x with the flush).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import Any, cast

from aec.config import AecConfig
from aec.runtime import lanes
from aec.runtime.buffers import ActiveBuffer, BlockingBuffer
from aec.runtime.epochs import OPEN, EpochManager
from aec.runtime.executor import StateExecutor
from aec.runtime.key_accounting import KeyAccountingUnit
from aec.runtime.mailbox import Mailbox
from aec.runtime.record_context import RecordContext
from aec.state.future import StateFuture
from aec.state.requests import StateRequest

BLOCKED_FLUSH = 100  # records blocked since the last flush that make the next one due
_REQUESTS_MOVED = object()  # _next_holder's answer when a waiting record took the key


class BatchFailed(Exception):
    """A backend raised on a batch; carries the batch for the error message."""

    def __init__(self, batch: list[StateRequest]) -> None:
        super().__init__(f"state backend failed on a batch of {len(batch)} requests")
        self.batch = batch


class StuckError(RuntimeError):
    """Records are unfinished but nothing can make progress."""


class AsyncExecutionController:
    """Runs records' state requests in batches and keeps same-key order.

    Args:
        config: the operator's ``AecConfig``.
        backend: answers ``execute_batch``.
        executor: where batches run (``InlineExecutor``, thread pool, scripted).
        epochs: the operator's ``EpochManager``; contexts count in ``context.epoch``.
        start: ``fn(context)`` runs the user entry (process_element/on_timer).
        timer_successor: ``fn(timer_context) -> RecordContext | None`` when a timer
            firing finishes: the next firing of its key's chain, which takes the
            key before any waiting record.
    """

    def __init__(
        self,
        config: AecConfig,
        backend: Any,
        executor: StateExecutor,
        epochs: EpochManager,
        start: Callable[[RecordContext], None],
        timer_successor: Callable[[RecordContext], RecordContext | None],
    ) -> None:
        self.synchronous = not config.async_state
        self.buffer_size = config.buffer_size
        self.buffer_timeout = config.buffer_timeout
        self.backend = backend
        self.executor = executor
        self._concurrent = executor.concurrent
        self._join_batches = executor.prefers_batches
        # records blocked since the last flush (None: batches wait for buffer_size)
        self._blocked_since_flush: int | None = (
            None if executor.concurrent or executor.prefers_batches else 0
        )
        self.mailbox = Mailbox()
        self.mails = self.mailbox.mails  # completion mails, popped on this thread only
        executor.start(backend, self.mailbox)
        self.state_ordered = config.state_ordered and not self.synchronous
        self.waiting_requests: dict[Any, deque[StateRequest]] = {}  # state-ordered mode
        self.keys = KeyAccountingUnit()
        self.active = ActiveBuffer()
        self.blocking = BlockingBuffer()
        self.ready: deque[RecordContext] = deque()  # contexts holding their key, not started
        self.current: RecordContext | None = None
        self.completing = False  # inside complete_batch: callbacks of completed requests run
        self.in_flight = 0
        self.calls_in_flight = 0  # external calls (aec.runtime.external_calls) not yet back
        self.epochs = epochs
        self._start = start
        self._timer_successor = timer_successor
        # metrics
        self.max_in_flight = 0
        self.batches = 0
        self.requests = 0
        self.max_batch_size = 0
        self.blocked = 0

    # -- admission -------------------------------------------------------------------------
    def admit(self, context: RecordContext, inline: bool) -> None:
        """Count ``context`` in flight and in its epoch; start it now (``inline``)
        or soon if its key is free, else queue it in the blocking buffer."""
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        context.epoch.ongoing += 1
        if self.state_ordered and context.timer is None:
            # runs at once; its first state request takes the key (see submit)
            if inline:
                self.run_entry(context)
            else:
                self.ready.append(context)
            return
        holders = self.keys.holders
        if context.key not in holders:
            holders[context.key] = context
            if inline:
                self.run_entry(context)
            else:
                self.ready.append(context)
        else:
            self.blocking.add(context)
            self.blocked += 1
            blocked = self._blocked_since_flush
            if blocked is not None:
                if blocked + 1 >= BLOCKED_FLUSH and self.active.requests:
                    self.flush()  # resets the count
                else:
                    self._blocked_since_flush = blocked + 1

    def run_entry(self, context: RecordContext) -> None:
        """Run the user entry of ``context`` holding one reference meanwhile."""
        self.current = context
        context.ref_count += 1
        self._start(context)
        self.current = context  # callbacks run inside may have switched it
        count = context.ref_count - 1
        context.ref_count = count
        if count == 0:
            self.on_context_finished(context)

    def on_context_finished(self, context: RecordContext) -> None:
        """Reference count of ``context`` reached 0: pass its key on, leave its epoch."""
        self.in_flight -= 1
        key = context.key
        if context.timer is not None or self.state_ordered:
            self._pass_key_on(context, key)
        elif key in self.blocking.queues:
            # a record (the per-record path): the oldest record blocked on its key runs next
            successor = cast(RecordContext, self.blocking.pop_next(key))  # the key has a queue
            successor.waited = True
            self.keys.holders[key] = successor
            self.ready.append(successor)
        elif self.keys.holders.pop(key, None) is not context:
            raise RuntimeError(f"{context.describe()} released a key it did not hold")
        epoch = context.epoch
        epoch.ongoing -= 1
        if epoch.ongoing == 0 and epoch.status != OPEN:
            self.epochs.advance()

    def _pass_key_on(self, context: RecordContext, key: Any) -> None:
        """``on_context_finished`` for a timer firing or in state-ordered mode: the
        timer's successor, a state-ordered waiter or a blocked record gets the key."""
        successor = None
        if context.timer is not None:
            successor = self._timer_successor(context)
            if successor is not None:
                self.in_flight += 1
                if self.in_flight > self.max_in_flight:
                    self.max_in_flight = self.in_flight
                successor.epoch.ongoing += 1
        holders = self.keys.holders
        if self.state_ordered and holders.get(key) is not context:
            successor = None  # a record that never made a state request holds nothing
        elif successor is None and self.state_ordered and key in self.waiting_requests:
            successor = self._next_holder(key)
        elif successor is None and key in self.blocking.queues:
            successor = self.blocking.pop_next(key)
            if successor is not None:  # always, as the key has a queue
                successor.waited = not self.state_ordered
        if successor is None:
            if holders.get(key) is context:
                del holders[key]
            elif not self.state_ordered:
                raise RuntimeError(f"{context.describe()} released a key it did not hold")
        elif successor is not _REQUESTS_MOVED:
            holders[key] = successor
            self.ready.append(successor)

    # -- state requests ---------------------------------------------------------------------
    def submit(
        self,
        op: int,
        state: str,
        user_key: Any = None,
        value: Any = None,
        kind: type[StateRequest] = StateRequest,
    ) -> StateFuture:
        """A state request of the current record; a future of its result.

        ``kind`` is the request class (``DefaultedGet`` for reads with a default).
        Raises RuntimeError outside process_element, on_timer or their callbacks.
        """
        context = self.current
        if context is None:
            raise RuntimeError(
                "state accessed outside process_element, on_timer or their callbacks"
            )
        request = kind(op, state, context.key, context.key_group, user_key, value, context)
        self.requests += 1
        if self.synchronous:
            self.batches += 1
            self.backend.execute_batch((request,))
            if kind is StateRequest:
                request._result = request.result
            else:
                request.complete(request.result)
            return request
        if (
            (context.waited or self.completing)
            and not context.queued
            and context.lanes is None
            and not (self._join_batches and (self.ready or self.active.requests))
        ):
            # a hot key's next record, or a record continuing in a callback of its
            # completed request: it holds its key and none of its requests is still
            # queued, so running this one at once keeps its order (see module doc);
            # with others' requests to share a call with, it joins them instead
            try:
                ran = self.executor.run_now((request,))
            except BaseException as exc:  # the job fails naming this record (rule 10)
                raise BatchFailed([request]) from exc
            if ran:
                self.batches += 1
                if not self.max_batch_size:
                    self.max_batch_size = 1
                if kind is StateRequest:  # nothing can be registered on it yet
                    request._result = request.result
                else:
                    request.complete(request.result)
                return request
            context.waited = False  # from now on its requests keep their order via the buffer
        context.ref_count += 1  # the pending future
        context.queued += 1
        if context.lanes is not None or (kind is not StateRequest and kind.read_modify_write):
            if lanes.hold(self._enqueue, context, request, kind):
                return request
        if self.state_ordered:
            self._enqueue(request)
            return request
        # _enqueue's common case, inlined: this is the per-request hot path
        requests = self.active.requests
        if not requests:
            self.active.first_time = monotonic()
        requests.append(request)
        if len(requests) >= self.buffer_size:
            self.flush()
        return request

    def release_lane(self, state: str) -> None:
        """The running record's read-modify-write of ``state`` ended without a write."""
        lanes.release(self._enqueue, cast(RecordContext, self.current), state)  # one runs

    def _enqueue(self, request: StateRequest) -> None:
        """Put a submitted request in the active buffer (or, in state-ordered mode,
        behind the key's holder)."""
        context = request._context
        if self.state_ordered:
            holders = self.keys.holders
            holder = holders.get(context.key)
            if holder is None:
                holders[context.key] = context
            elif holder is not context:  # wait, in order, for the key
                queue = self.waiting_requests.get(context.key)
                if queue is None:
                    queue = self.waiting_requests[context.key] = deque()
                queue.append(request)
                self.blocked += 1
                return
        active = self.active
        if not active.requests:
            active.first_time = monotonic()
        active.requests.append(request)
        if len(active.requests) >= self.buffer_size:
            self.flush()

    def _next_holder(self, key: Any) -> Any:
        """State-ordered mode: give the freed ``key`` to whoever waited first, a
        timer firing (blocking buffer) or a record with queued requests; for the
        latter, move its requests to the active buffer. Returns the timer context,
        or ``_REQUESTS_MOVED``."""
        queue = self.waiting_requests[key]
        waiter = queue[0]._context
        timers = self.blocking.queues.get(key)
        if timers and timers[0].sequence < waiter.sequence:
            return self.blocking.pop_next(key)
        mine = [r for r in queue if r._context is waiter]
        rest = deque(r for r in queue if r._context is not waiter)
        if rest:
            self.waiting_requests[key] = rest
        else:
            del self.waiting_requests[key]
        self.keys.holders[key] = waiter
        active = self.active
        if not active.requests:
            active.first_time = monotonic()
        active.requests.extend(mine)
        if len(active.requests) >= self.buffer_size:
            self.flush()
        return _REQUESTS_MOVED

    def flush(self) -> None:
        """Send up to ``buffer_size`` buffered requests to the executor as one batch.

        With a concurrent executor, a request whose record still has requests in
        an earlier, uncompleted batch waits (``deferred``) so one record's
        requests never run in two batches at once.
        """
        active = self.active
        if not active.requests:
            return
        batch = active.take(self.buffer_size)
        if self._blocked_since_flush is not None:
            self._blocked_since_flush = 0
        if self._concurrent:
            batch = self._hold_back_overlaps(batch)
        if active.requests:
            active.first_time = monotonic()
        if batch:
            self.batches += 1
            if len(batch) > self.max_batch_size:
                self.max_batch_size = len(batch)
            self.executor.submit(batch)

    def _hold_back_overlaps(self, requests: list[StateRequest]) -> list[StateRequest]:
        batch_id = self.batches
        batch = []
        for request in requests:
            context = request._context
            if context.deferred is not None or (
                context.in_batches and context.batch_id != batch_id
            ):
                if context.deferred is None:
                    context.deferred = [request]
                else:
                    context.deferred.append(request)
                continue
            context.in_batches += 1
            context.batch_id = batch_id
            batch.append(request)
        return batch

    def flush_if_timed_out(self) -> None:
        """Flush a partial batch whose oldest request waited ``buffer_timeout`` seconds."""
        if self.active.requests and monotonic() - self.active.first_time >= self.buffer_timeout:
            self.flush()

    # -- completions and the loop ---------------------------------------------------------------
    def complete_batch(self, mail: tuple[list[StateRequest], BaseException | None]) -> None:
        """Complete the futures of a finished batch, in request order."""
        batch, error = mail
        self.executor.pending -= 1
        if error is not None:
            self.current = batch[0]._context if batch else None
            raise BatchFailed(batch) from error
        concurrent = self._concurrent
        # thread pools keep callbacks' requests batched: run at once, they would take the
        # mailbox thread off its overlap with the I/O threads (measured on RocksDB sessions);
        # a store preferring batches keeps them batched too when the rest of this batch's
        # callbacks will make requests to share a call with
        completing, self.completing = self.completing, not (
            self.state_ordered or concurrent or (self._join_batches and len(batch) > 1)
        )
        for request in batch:
            context = request._context
            self.current = context
            if concurrent:
                context.in_batches -= 1
                if context.in_batches == 0 and context.deferred is not None:
                    self._release_deferred(context)
            context.queued -= 1
            if request._callbacks is None and type(request) is StateRequest:
                request._result = request.result  # nothing to run (an unawaited write)
            else:
                request.complete(request.result)
            count = context.ref_count - 1  # the request's own reference
            context.ref_count = count
            if count == 0:
                self.on_context_finished(context)
        self.completing = completing
        self.current = None

    def _release_deferred(self, context: RecordContext) -> None:
        if not self.active.requests:
            self.active.first_time = monotonic()
        self.active.push_front(cast("list[Any]", context.deferred))  # checked by the caller
        context.deferred = None

    def run_available(self) -> None:
        """Handle every completion mail and start every ready context; never blocks."""
        mails = self.mails
        ready = self.ready
        while True:
            if mails:
                mail = mails.popleft()
                if type(mail) is tuple:
                    self.complete_batch(mail)
                else:  # an external call's CallCompletion
                    mail.run(self)
            elif ready:
                self.run_entry(ready.popleft())
            else:
                self.current = None
                return

    def step(self) -> bool:
        """Make progress, blocking for a completion if that is all that is left.

        Returns False when nothing can progress (no mail, nothing ready, nothing
        buffered, no batch pending).
        """
        if self.mails or self.ready:
            self.run_available()
            return True
        if self.active.requests:
            executor = self.executor
            executor.idle = True  # nothing else to run: an inline batch overlaps nothing
            self.flush()
            executor.idle = False
            if self.mails:  # run inline (a skewed run's tiny batches): complete it now
                self.run_available()
            return True
        if self.executor.pending:
            self.executor.wait(None)
            return True
        if self.calls_in_flight:
            self.mailbox.wait(None)
            return True
        return False

    def wait_for(self, future: StateFuture) -> Any:
        """Run the mailbox until ``future`` completes (the blocking state API).

        Raises StuckError if it can never complete.
        """
        if future.is_done():
            return future._result
        current = self.current
        while not future.is_done():
            if not self.step():
                raise StuckError("a blocking state call waits for a future nothing will complete")
        self.current = current
        return future._result

    def stuck_keys(self) -> list[Any]:
        """Keys held by unfinished records (for the stuck-run error)."""
        return list(self.keys.holders)
