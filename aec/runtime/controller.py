"""AsyncExecutionController: the AEC of FLIP-425, one per operator.

It drives records through key accounting, the active and blocking buffers, the
executor and the mailbox; the operator owns user code and timers. The parts own
their state and the controller asks them (Flink's shape): ``KeyAccountingUnit``
hands keys over, ``EpochManager`` counts records in and out of epochs,
``RecordContext`` releases itself, the buffers hold requests and records, a
``StateRequest`` completes its own future (``resolve``).

The mode is chosen when the controller is built (``new_controller``), never
tested per request: ``AsyncExecutionController`` is the record-ordered mode
(docs/semantics.md, rule 2), ``SynchronousController`` runs every request at once
(``async_state=False``), ``StateOrderedController`` is FLIP-425's state-ordered
mode (``AecConfig.state_ordered``).

Invariants (mailbox thread only):
- ``in_flight`` = records and timer firings admitted and not finished; input
  is admitted only below ``in_flight_records_limit`` (timers overdraw).
- A context starts (``run_entry``) only while it holds its key; when its
  reference count reaches 0 the key passes to the next waiting context of that
  key (``on_context_finished``).
- Completion mails are handled before waiting contexts start, and both before
  the operator takes new input (rule 6).
- A hot key's records flow without a batch round trip each: a record that
  waited for its key runs its requests at once when the executor allows it
  (``StateExecutor.run_now``: a backend answering from memory), as a batch of
  one. It waited for the only record that could touch its key, and records of
  other keys may interleave in any order (rule 2), so the results are those
  of the buffered path; the buffer keeps batching the records of other keys.
  The same holds for a request made in a callback of a completed request
  (``completing``; inline executor only) or of a completed external call (inline
  executor, store not preferring batches): its record holds its key. So does a
  request of a timer firing or of a bundle's fold (``start_holding``; inline
  executor, store not preferring batches): each starts holding its key. Each
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
from collections.abc import Callable, Hashable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

from aec.config import AecConfig
from aec.errors import (
    StuckError as StuckError,  # there: compiled, a class cannot subclass RuntimeError
)
from aec.runtime import lanes
from aec.runtime.buffers import ActiveBuffer, BlockingBuffer
from aec.runtime.epochs import EpochManager
from aec.runtime.executor import StateExecutor
from aec.runtime.key_accounting import KeyAccountingUnit
from aec.runtime.mailbox import Mailbox
from aec.runtime.metrics import (
    BATCH_SAMPLE,
    RECORD_SAMPLE,
    count_summary,
    hottest,
    latency_histogram,
)
from aec.runtime.record_context import RecordContext
from aec.state.future import StateFuture
from aec.state.requests import StateRequest, new_request

if TYPE_CHECKING:
    from aec.state.backend import StateBackend

R = TypeVar("R")  # a future's result (wait_for)
HOLDER = TypeVar("HOLDER", bound=RecordContext)  # a context kind (start_holding)
BLOCKED_FLUSH = 100  # records blocked since the last flush that make the next one due

Completion = tuple[list[StateRequest], BaseException | None]  # an executor's mail


class Mail(Protocol):
    """A mail other than a batch completion (``aec.runtime.external_calls``): it runs
    on the mailbox thread with the controller."""

    def run(self, controller: AsyncExecutionController) -> None: ...


class CallOutcome(Protocol):
    """One external call's outcome in a mail (``aec.runtime.external_calls``)."""

    def finish(self, controller: AsyncExecutionController) -> None: ...


class BatchFailed(Exception):
    """A backend raised on a batch; carries the batch for the error message and the
    backend's error as ``__cause__``."""

    def __init__(self, batch: list[StateRequest], cause: BaseException) -> None:
        super().__init__(f"state backend failed on a batch of {len(batch)} requests")
        self.batch = batch
        self.__cause__ = cause  # set here: compiled by mypyc, ``raise ... from`` drops it


class AsyncExecutionController:
    """Runs records' state requests in batches and keeps same-key order
    (the record-ordered mode; ``new_controller`` picks the mode).

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

    synchronous = False  # requests run at once (SynchronousController)

    # slots: the mailbox thread reads these per request (fixed offsets, no dict)
    __slots__ = (
        "buffer_size", "buffer_timeout", "backend", "executor", "_concurrent",
        "_join_batches", "_complete_inline", "_holders_run_at_once", "_blocked_since_flush",
        "mailbox", "mails",
        "keys", "active", "blocking", "ready", "current", "completing", "in_flight",
        "calls_in_flight", "epochs", "_start", "_timer_successor", "_enqueue", "_claim",
        "holding", "max_in_flight", "batches", "requests", "ran_alone", "blocked",
        "batch_sizes", "_window_batches", "request_latency", "record_latency", "_sent", "_untimed",
        "_unsampled", "failure",
    )  # fmt: skip

    def __init__(
        self,
        config: AecConfig,
        backend: StateBackend,
        executor: StateExecutor,
        epochs: EpochManager,
        start: Callable[[RecordContext], None],
        timer_successor: Callable[[RecordContext], RecordContext | None],
    ) -> None:
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
        self.keys = KeyAccountingUnit()
        self.active = ActiveBuffer(config.buffer_size, self.flush)
        self.blocking = BlockingBuffer()
        self.ready: deque[RecordContext] = deque()  # contexts holding their key, not started
        self.current: RecordContext | None = None
        self.completing = False  # inside complete_batch: callbacks of completed requests run
        self.in_flight = 0
        self.calls_in_flight = 0  # external calls (aec.runtime.external_calls) not yet back
        self.epochs = epochs
        self._start = start
        self._timer_successor = timer_successor
        self._bind_mode()
        # a checkpoint that does not drain holds buffered requests back (flush sends none)
        self.holding = False
        # metrics
        self.max_in_flight = 0
        self.batches = 0
        self.requests = 0
        self.ran_alone = False  # a request ran at once: a batch of one (only in batches)
        self.blocked = 0
        self.batch_sizes: dict[int, int] = {}  # size -> batches of it handed to the executor
        self._window_batches = 0  # batches before the metrics window (new_metrics_window)
        self.request_latency = latency_histogram()  # hand-off to completion, sampled batches' requests
        self.record_latency = latency_histogram()  # admission to finish, sampled records
        self._sent: dict[int, float] = {}  # id(sampled batch) -> monotonic seconds at hand-off
        self._untimed = 1  # batches to hand over until the next one timed (the first is)
        self._unsampled = 1  # contexts to admit until the next one timed (the first is)
        # the first failure raised into user code that no code may survive (a backend's,
        # a misused batch function's): it fails the run even when user code catches it
        # (rule 10), at the end of the entry that caught it
        self.failure: BaseException | None = None

    def _bind_mode(self) -> None:
        """The mode's rules, bound once (``StateOrderedController`` binds its own)."""
        # whether requests made in callbacks of a completed batch may run at once:
        # thread pools keep them batched (run at once, they would take the mailbox
        # thread off its overlap with the I/O threads: measured on RocksDB sessions)
        self._complete_inline = not self._concurrent
        # whether a context that starts holding its key, nothing of its key unfinished
        # before it, runs its requests at once like a record that waited (start_holding):
        # only a store answering on this thread with no call to share gains from it
        self._holders_run_at_once = not (self._concurrent or self._join_batches)
        self._enqueue = self.active.add  # where a request goes when it may not run at once
        # claim(key, context): the key's holder once an admitted context asked for it
        # (the context itself: it may start)
        self._claim = self.keys.claim

    # -- admission -------------------------------------------------------------------------
    def admit(self, context: RecordContext, inline: bool) -> None:
        """Count ``context`` in flight and in its epoch; start it now (``inline``)
        or soon if its key is free, else queue it in the blocking buffer.

        1. count it in; 2. key free? occupy it and start (now or from ``ready``);
        3. else wait whole in the blocking buffer (Flink's sync point)."""
        self._count_in(context)
        self.epochs.enter(context.epoch)
        claim = self._claim  # a slot read, then a call: CPython 3.11 caches both
        if claim(context.key, context) is context:
            if inline:
                self.run_entry(context)
            else:
                self.ready.append(context)
            return
        self.blocking.add(context)
        self.blocked += 1
        blocked = self._blocked_since_flush
        if blocked is not None:
            if blocked + 1 >= BLOCKED_FLUSH and self.active.requests:
                self.flush()  # resets the count
            else:
                self._blocked_since_flush = blocked + 1

    def _count_in(self, context: RecordContext) -> None:
        """One more context in flight; the first admitted, then one in
        ``RECORD_SAMPLE``, has its admission timed (``record_latency``)."""
        in_flight = self.in_flight = self.in_flight + 1
        if in_flight > self.max_in_flight:
            self.max_in_flight = in_flight
        unsampled = self._unsampled - 1
        if unsampled:
            self._unsampled = unsampled
        else:
            self._unsampled = RECORD_SAMPLE
            context.admitted = monotonic()

    def _count_out(self, context: RecordContext) -> None:
        """One context fewer in flight; its latency if its admission was timed."""
        self.in_flight -= 1
        if context.admitted:
            self.record_latency.add(monotonic() - context.admitted)

    def run_entry(self, context: RecordContext) -> None:
        """Run the user entry of ``context`` holding one reference meanwhile."""
        self.current = context
        context.ref_count += 1  # the entry call's reference
        start = self._start  # (as in admit)
        start(context)
        self.current = context  # callbacks run inside may have switched it
        context.release()
        if self.failure is not None:  # user code caught it: the run fails all the same
            raise self.failure

    def failed(self, batch: list[StateRequest], error: BaseException) -> BatchFailed:
        """The ``BatchFailed`` to raise for ``batch``'s ``error``; the first is kept as
        ``failure``, so the run fails even if user code catches it."""
        failure = BatchFailed(batch, error)
        self.fails_the_run(failure)
        return failure

    def fails_the_run(self, error: BaseException) -> None:
        """Keep ``error`` (the first kept) to raise when the running entry returns,
        whether or not user code catches it."""
        if self.failure is None:
            self.failure = error

    def start_holding(self, context: HOLDER) -> HOLDER:
        """``context`` (a fold or a timer firing: it starts holding its key, nothing of
        its key unfinished before it) marked as a record that waited for its key, where
        that lets its requests run at once with the results of the buffered path (the
        invariants above); elsewhere unchanged. Made while its key is busy, it waits in
        the blocking buffer, which marks it again when it hands it the key. Returns
        ``context``."""
        if self._holders_run_at_once:
            context.waited = True
        return context

    def on_context_finished(self, context: RecordContext) -> None:
        """Reference count of ``context`` reached 0 (its ``on_finished``): pass its
        key on, count it out of its epoch."""
        self._count_out(context)
        if context.timer is None:
            blocking = self.blocking
            successor = blocking.pop_next(context.key) if context.key in blocking.queues else None
            if successor is not None:
                successor.waited = True
        else:
            successor = self._timer_chain(context)
            if successor is None:
                successor = self.blocking.pop_next(context.key)
                if successor is not None:
                    successor.waited = True
        if successor is None:
            self.keys.release(context)
        else:
            self.keys.transfer(context, successor)
            self.ready.append(successor)
        self.epochs.complete_one(context.epoch)

    def _timer_chain(self, context: RecordContext) -> RecordContext | None:
        """The next firing of a finished timer's key chain, counted in (it replaces
        the finished one: in flight stays below its maximum), or None."""
        successor = self._timer_successor(context)
        if successor is not None:
            self.in_flight += 1
            self.epochs.enter(successor.epoch)
        return successor

    # -- state requests ---------------------------------------------------------------------
    def submit(
        self,
        op: int,
        state: str,
        user_key: object = None,
        value: object = None,
        kind: type[StateRequest] = StateRequest,
    ) -> StateRequest:
        """A state request of the current record; a future of its result.

        1. a request of the running record; 2. may it run at once (see the module
        invariants)? then it runs as a batch of one and is complete; 3. else it holds a reference and waits in
        its read-modify-write lane or in the active buffer.
        ``kind`` is the request class (``DefaultedGet`` for reads with a default).
        Raises RuntimeError outside process_element, on_timer or their callbacks.
        """
        context = self.current
        if context is None:
            _outside_a_record()
        request = new_request(
            kind, op, state, context.key, context.key_group, user_key, value, context
        )
        self.requests += 1
        if (
            (context.waited or self.completing)
            and not context.queued
            and context.lanes is None
            and not (self._join_batches and (self.ready or self.active.requests))
        ):
            try:
                ran = self.executor.run_now((request,))
            except BaseException as exc:  # the job fails naming this record (rule 10)
                raise self.failed([request], exc) from exc
            if ran:
                self.batches += 1
                self.ran_alone = True
                request.resolve()
                return request
            context.waited = False  # from now on its requests keep their order via the buffer
        context.ref_count += 1  # the pending request's reference, released in complete_batch
        context.queued += 1
        if context.lanes is None and (kind is StateRequest or not kind.read_modify_write):
            self._enqueue(request)
        elif not lanes.hold(self._enqueue, context, request, kind):
            self._enqueue(request)
        return request

    def release_lane(self, state: str) -> None:
        """The running record's read-modify-write of ``state`` ended without a write."""
        context = self.current
        if context is None:
            raise RuntimeError("release_lane() outside a record")
        lanes.release(self._enqueue, context, state)

    def flush(self) -> None:
        """Send up to ``buffer_size`` buffered requests to the executor as one batch.

        With a concurrent executor, a request whose record still has requests in
        an earlier, uncompleted batch waits (``deferred``) so one record's
        requests never run in two batches at once.
        """
        active = self.active
        if not active.requests or self.holding:
            return
        batch = active.take(self.buffer_size)
        if self._blocked_since_flush is not None:
            self._blocked_since_flush = 0
        if self._concurrent:
            batch = self._hold_back_overlaps(batch)
        if batch:
            self.batches += 1
            size = len(batch)
            sizes = self.batch_sizes
            sizes[size] = sizes.get(size, 0) + 1
            self._untimed -= 1
            if not self._untimed:
                self._untimed = BATCH_SAMPLE
                self._sent[id(batch)] = monotonic()
            self.executor.submit(batch)

    def _hold_back_overlaps(self, requests: list[StateRequest]) -> list[StateRequest]:
        batch_id = self.batches
        batch = []
        for request in requests:
            context: RecordContext = request.context  # type: ignore[assignment]  # a record's
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

    # -- completions and the loop ---------------------------------------------------------------
    def complete_batch(self, mail: Completion) -> None:
        """Complete the futures of a finished batch, in request order; each drops its
        record's reference."""
        batch, error = mail
        self.executor.completed()
        if self._sent:  # a sampled batch is out
            sent = self._sent.pop(id(batch), None)
            if sent is not None:
                self.request_latency.add(monotonic() - sent, len(batch))
        if error is not None:
            self.current = _record_of(batch[0]) if batch else None
            raise self.failed(batch, error)
        concurrent = self._concurrent
        # a store preferring batches keeps callbacks' requests batched when the rest of
        # this batch's callbacks will make requests to share a call with
        completing, self.completing = self.completing, self._complete_inline and not (
            self._join_batches and len(batch) > 1
        )
        if concurrent:
            # the store applied the whole batch: no record of it is in it any more, also
            # for the callbacks of its first requests (a blocking call there must not
            # wait behind the batch's later, applied requests)
            for request in batch:
                context: RecordContext = request.context  # type: ignore[assignment]  # a record's
                context.in_batches -= 1
                if context.in_batches == 0 and context.deferred is not None:
                    self.active.push_front(context.deferred)
                    context.deferred = None
        for request in batch:
            context = request.context  # type: ignore[assignment]  # a record's
            self.current = context
            context.queued -= 1
            request.resolve()
            context.release()  # the reference the pending request held
        self.completing = completing
        self.current = None

    def complete_calls(self, outcomes: Sequence[CallOutcome]) -> None:
        """Finish external calls whose outcomes came in one mail (a batch call's, or
        one call's), in order. Requests their records make in the callbacks run at once
        (``completing``) where a context starting to hold its key would
        (``start_holding``): a store preferring batches keeps them batched, since more
        calls' mails may follow with requests to share its call."""
        completing, self.completing = self.completing, self._holders_run_at_once
        for outcome in outcomes:
            outcome.finish(self)
        self.completing = completing

    def run_available(self, start_ready: bool = True) -> None:
        """Handle every completion mail and start every ready context (unless
        ``start_ready`` is False); never blocks."""
        mails = self.mails
        ready = self.ready
        while True:
            if mails:
                mail = mails.popleft()
                if type(mail) is tuple:
                    self.complete_batch(mail)
                else:  # an external call's CallCompletion
                    mail.run(self)
            elif ready and start_ready:
                self.run_entry(ready.popleft())
            else:
                self.current = None
                return

    def step(self, start_ready: bool = True) -> bool:
        """Make progress, blocking for a completion if that is all that is left;
        ``start_ready=False`` starts no waiting context (a blocking call's wait).

        Returns False when nothing can progress (no mail, nothing ready, nothing
        buffered, no batch pending).
        """
        if self.mails or (start_ready and self.ready):
            self.run_available(start_ready)
            return True
        if self.active.requests:
            executor = self.executor
            executor.idle = True  # nothing else to run: an inline batch overlaps nothing
            self.flush()
            executor.idle = False
            if self.mails:  # run inline (a skewed run's tiny batches): complete it now
                self.run_available(start_ready)
            return True
        if self.executor.pending:
            self.executor.wait(None)
            return True
        if self.calls_in_flight:
            self.mailbox.wait(None)
            return True
        return False

    def finish_handed_over(self) -> None:
        """Run completion mails until no batch is at the executor and no external
        call is out, sending no batch (``holding``) and starting no waiting record:
        what a checkpoint that does not drain waits for (its pause is one round
        trip, not the longest same-key chain)."""
        executor = self.executor
        while True:
            self.run_available(start_ready=False)
            if executor.pending:
                executor.wait(None)
            elif self.calls_in_flight:
                self.mailbox.wait(None)
            else:
                break
        self.current = None

    def wait_for(self, future: StateFuture[R]) -> R:
        """Run the mailbox until ``future`` completes (the blocking state API); its result.

        Raises StuckError if it can never complete.
        """
        current, holding = self.current, self.holding
        self.holding = False  # a blocking call inside a checkpoint's wait needs its batch sent
        try:
            # what the call waits for is its own record's request: starting waiting
            # contexts, each of which may block in turn, would only nest waits
            while not future.is_done():
                if not self.step(start_ready=False):
                    raise StuckError(
                        "a blocking state call waits for a future nothing will complete"
                    )
        finally:
            self.holding = holding
        self.current = current
        return future.get()

    def counters(self) -> dict[str, float]:
        """The AEC's counters so far (the operator's ``metrics`` adds them)."""
        return {
            "max_in_flight": self.max_in_flight,
            "batches": self.batches,
            "requests": self.requests,
            # the synchronous run sends each request alone
            "max_batch_size": (
                min(1, self.requests) if self.synchronous
                else max(int(self.ran_alone), max(self.batch_sizes, default=0))
            ),  # fmt: skip
            "mean_batch_size": (self.requests / self.batches) if self.batches else 0.0,
            "blocked_requests": self.blocked,
        }

    def gauges(self) -> dict[str, object]:
        """Flink's AEC gauges now, and the histograms and hot keys so far (the
        operator's ``metrics`` adds them). ``batch_size`` counts every batch the store
        ran: those flushed from the active buffer and the requests run at once (a
        batch of one each, counted only in ``batches`` as they run)."""
        sizes = self.batch_sizes
        alone = self.batches - self._window_batches - sum(sizes.values())
        if alone:
            sizes = {**sizes, 1: sizes.get(1, 0) + alone}
        blocking_keys, blocking = self.blocking_gauges()
        return {
            "num_in_flight_records": self.in_flight,
            "active_buffer_size": len(self.active.requests),
            "blocking_buffer_size": blocking,
            "num_blocking_keys": blocking_keys,
            "batch_size": count_summary(sizes),
            "state_request_latency_s": self.request_latency.summary(),
            "record_latency_s": self.record_latency.summary(),
            "hot_keys": hottest(self.blocking.waits),
        }

    def blocking_gauges(self) -> tuple[int, int]:
        """``(num_blocking_keys, blocking_buffer_size)`` now: keys with waiting work and
        what waits for its key (contexts in record order). O(1)."""
        blocking = self.blocking
        return blocking.key_count(), blocking.size

    def new_metrics_window(self) -> None:
        """Start the histograms and hot-key counts afresh (the counters count on): a
        partition's operator kept between micro-batches reports them per micro-batch."""
        self.batch_sizes = {}
        self.ran_alone = False
        self._window_batches = self.batches
        self.request_latency = latency_histogram()
        self.record_latency = latency_histogram()
        self.blocking.forget_waits()

    def stuck_keys(self) -> list[Hashable]:
        """Keys held by unfinished records (for the stuck-run error)."""
        return self.keys.held_keys()


class SynchronousController(AsyncExecutionController):
    """``async_state=False``: every request runs at once on the mailbox thread and
    returns a completed future, so each record finishes before the next arrives
    (FLIP-425's "synchronous execution with async APIs"; the reference run)."""

    synchronous = True
    __slots__ = ("_accounting",)

    # Invariant of this mode: a record or timer firing finishes inside its entry (every
    # request and call completes before it returns), and input, timers and watermarks
    # come one at a time. So no context finds its key held by another, and no epoch
    # holds an unfinished context when an element closes it or fires its timers: key
    # accounting and epoch counts would read "free" and "done", and are not kept (in-
    # flight counts and latency samples are). A context that outlives its entry (it
    # awaits a future nobody completed yet), or one admitted to start later (a record
    # a restored checkpoint carried), breaks that: it is counted in then, and the
    # controller keeps the full rules (``_accounting``) for the rest of the run.
    def _bind_mode(self) -> None:
        super()._bind_mode()
        self._accounting = False

    def admit(self, context: RecordContext, inline: bool) -> None:
        """Run ``context`` to its end now, or (not ``inline``, or once one outlived its
        entry) as the asynchronous controller does."""
        if self._accounting or not inline:
            self._accounting = True
            super().admit(context, inline)
            return
        self._count_in(context)
        self.run_entry(context)
        if context.ref_count:  # not finished inside its entry: hold its key and epoch
            self._accounting = True
            self.keys.occupy(context)
            self.epochs.enter(context.epoch)

    def on_context_finished(self, context: RecordContext) -> None:
        if self._accounting:
            super().on_context_finished(context)
        else:
            self._count_out(context)

    def submit(
        self,
        op: int,
        state: str,
        user_key: object = None,
        value: object = None,
        kind: type[StateRequest] = StateRequest,
    ) -> StateRequest:
        context = self.current
        if context is None:
            _outside_a_record()
        request = new_request(
            kind, op, state, context.key, context.key_group, user_key, value, context
        )
        self.requests += 1
        self.batches += 1
        try:
            self.backend.execute_batch((request,))
        except BaseException as exc:  # the run fails naming this record (rule 10)
            raise self.failed([request], exc) from exc
        request.resolve()
        return request


class StateOrderedController(AsyncExecutionController):
    """FLIP-425's state-ordered mode (``AecConfig(state_ordered=True)``, advanced):
    records start at once; a record takes its key with its first state request, and
    requests of a record that does not hold the key wait in a per-key queue until
    the holder finishes. Timer firings hold their key as in record order. Its
    records never run a request at once (none waits for its key in the blocking
    buffer, and ``completing`` stays off), so ``submit`` is the record-ordered one
    with ``_enqueue`` bound to the per-key queues."""

    __slots__ = ("waiting_requests", "_waiting")

    def _bind_mode(self) -> None:
        self._complete_inline = False  # a callback's request may need to wait for its key
        self._holders_run_at_once = False  # its records never run a request at once
        self._enqueue = self._enqueue_in_key_order
        self._claim = self._claim_for_timers
        self.waiting_requests: dict[Hashable, deque[StateRequest]] = {}
        self._waiting = 0  # requests in waiting_requests, all keys

    def _claim_for_timers(self, key: Hashable, context: RecordContext) -> RecordContext:
        """A record starts at once (its first state request takes the key): it is its
        own answer; a timer firing claims its key as in record order."""
        return context if context.timer is None else self.keys.claim(key, context)

    def _enqueue_in_key_order(self, request: StateRequest) -> None:
        """Into the active buffer if the request's record holds (or takes) its key,
        else behind the key's holder, in order."""
        context = _record_of(request)
        holder = self.keys.holder(context.key)
        if holder is None:
            self.keys.occupy(context)
        elif holder is not context:
            queue = self.waiting_requests.get(context.key)
            if queue is None:
                queue = self.waiting_requests[context.key] = deque()
            queue.append(request)
            self._waiting += 1
            self.blocked += 1
            self.blocking.count_wait(context.key)
            return
        self.active.add(request)

    def blocking_gauges(self) -> tuple[int, int]:
        """``AsyncExecutionController.blocking_gauges`` with the requests waiting for
        their key (Flink's blocking buffer holds requests) and their keys; O(timer
        firings waiting)."""
        waiting, blocking = self.waiting_requests, self.blocking
        keys = len(waiting) + sum(1 for key in blocking.queues if key not in waiting)
        return keys, blocking.size + self._waiting

    def on_context_finished(self, context: RecordContext) -> None:
        self._count_out(context)
        if self.keys.holder(context.key) is context:  # a record that made no request holds nothing
            successor = self._timer_chain(context) if context.timer is not None else None
            moved = False
            if successor is None:
                successor, moved = self._next_holder(context)
            if successor is None:
                if not moved:
                    self.keys.release(context)
            else:
                self.keys.transfer(context, successor)
                self.ready.append(successor)
        self.epochs.complete_one(context.epoch)

    def _next_holder(self, context: RecordContext) -> tuple[RecordContext | None, bool]:
        """Whoever waited first for the key ``context`` frees: ``(timer, False)`` for
        a timer firing of the blocking buffer (to start), ``(None, True)`` when a
        record with queued requests took the key (its requests moved to the active
        buffer), ``(None, False)`` if nobody waits."""
        key = context.key
        queue = self.waiting_requests.get(key)
        if queue is None:
            return self.blocking.pop_next(key), False
        waiter = _record_of(queue[0])
        timer = self.blocking.peek(key)
        if timer is not None and timer.sequence < waiter.sequence:
            return self.blocking.pop_next(key), False
        rest = deque(r for r in queue if r.context is not waiter)
        self._waiting -= len(queue) - len(rest)
        if rest:
            self.waiting_requests[key] = rest
        else:
            del self.waiting_requests[key]
        self.keys.transfer(context, waiter)
        for request in queue:
            if request.context is waiter:
                self.active.add(request)
        return None, True


def new_controller(
    config: AecConfig,
    backend: StateBackend,
    executor: StateExecutor,
    epochs: EpochManager,
    start: Callable[[RecordContext], None],
    timer_successor: Callable[[RecordContext], RecordContext | None],
) -> AsyncExecutionController:
    """The controller of ``config``'s mode: synchronous, state-ordered or record-ordered."""
    if not config.async_state:
        kind: type[AsyncExecutionController] = SynchronousController
    elif config.state_ordered:
        kind = StateOrderedController
    else:
        kind = AsyncExecutionController
    return kind(config, backend, executor, epochs, start, timer_successor)


def _outside_a_record() -> NoReturn:
    raise RuntimeError("state accessed outside process_element, on_timer or their callbacks")


def _record_of(request: StateRequest) -> RecordContext:
    """The record a request belongs to (every request the controller makes has one)."""
    context = request.context
    assert isinstance(context, RecordContext)
    return context
