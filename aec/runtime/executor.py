"""State executors: where batches of state requests run (FLIP-425's ``StateExecutor``).

An executor takes a batch from the AEC, runs ``backend.execute_batch`` on it and
posts one completion mail ``(batch, error)`` to the mailbox. It never touches
futures or user code: completing futures is the mailbox thread's job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import Protocol, cast

from aec.native import mypyc_attr
from aec.runtime.batch_cost import BatchCostModel
from aec.runtime.mailbox import Mailbox
from aec.state.backend import StateBackend
from aec.state.requests import StateRequest

Batch = Sequence[StateRequest]
# the completion mail of a batch: the batch and what the backend raised (None: it ran)
Post = Callable[[tuple[Batch, BaseException | None]], None]

# Larger batches always go to a thread: there RocksDB-like stores release the GIL and
# overlap the mailbox thread, and several batches in flight run side by side. 64 made
# the flights job's operators 1.2-1.5x slower inside Spark (their mid-size drain batches
# lost that overlap); 8 sent too many of a Zipf hot key's batches to threads; 32 kept both.
INLINE_MAX_REQUESTS = 32
_NOW_SAMPLE = 8  # run_now asks the cost model once per this many calls


class Buffering(Protocol):
    """What ``StateExecutor.tick`` sees of the AEC: its active buffer, and a flush."""

    @property
    def active(self) -> Sized: ...
    def flush(self) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class StateExecutor:
    """Base: runs batches and reports them as completion mails.

    Lifecycle: ``start(backend, mailbox)`` once, then ``submit`` batches, then
    ``close()`` (idempotent; waits for running batches, stops all threads).
    ``pending`` is the number of submitted batches whose mail has not been taken
    (the AEC decrements it when it takes the mail).
    ``concurrent`` is False only when batches run one at a time in submission
    order (then the AEC needs no cross-batch ordering of one record's requests).
    """

    concurrent = True
    idle = False  # set by the AEC around a flush when the mailbox thread has nothing else to do
    # a request that may run at once joins the active buffer instead when other records
    # have requests waiting there or are ready to make some (a call costs more than a
    # request inside one: a store's per-call overhead, a round trip)
    prefers_batches = True

    def __init__(self) -> None:
        self.pending = 0
        self.inline_batches = 0  # batches run on the mailbox thread (metric ``inline_batches``)
        # set by start(), before any use (declared, not set to None: compiled, the
        # attributes hold only their declared types)
        self._backend: StateBackend
        self._mailbox: Mailbox

    def start(self, backend: StateBackend, mailbox: Mailbox) -> None:
        self._backend = backend
        self._mailbox = mailbox

    def submit(self, batch: Batch) -> None:
        raise NotImplementedError

    def completed(self) -> None:
        """The AEC took the completion mail of a submitted batch."""
        self.pending -= 1

    def run_now(self, batch: Batch) -> bool:
        """Run a one-request ``batch`` on the mailbox thread at once, if this executor's
        policy allows it; True if it ran (no mail is posted: the AEC completes it).
        The backend's error propagates. Default: never (completions stay scripted)."""
        return False

    def wait(self, timeout: float | None) -> None:
        """Block until a completion mail may be there or ``timeout`` seconds pass."""
        self._mailbox.wait(timeout)

    def tick(self, controller: Buffering) -> None:
        """Called by the operator before each input element with its
        ``AsyncExecutionController``; scripted executors act here (complete held
        batches, flush the active buffer early)."""

    def close(self) -> None:
        pass

    def _run(self, batch: Batch, post: Post) -> None:
        try:
            self._backend.execute_batch(batch)
        except BaseException as exc:  # handed to the mailbox thread, which fails the job
            post((batch, exc))
        else:
            post((batch, None))


@mypyc_attr(allow_interpreted_subclasses=True)
class InlineExecutor(StateExecutor):
    """Runs each batch at once on the mailbox thread (for non-blocking backends).

    ``prefers_batches`` is the backend's (``StateBackend.prefers_batches``): False
    for a dict in memory (every request that may run at once does), True for a
    store whose calls cost more than their requests (RocksDB).
    """

    concurrent = False

    def __init__(self, prefers_batches: bool = False) -> None:
        super().__init__()
        self.prefers_batches = prefers_batches

    def submit(self, batch: Batch) -> None:
        self.pending += 1
        self.inline_batches += 1
        self._run(batch, self._mailbox.post_local)

    def run_now(self, batch: Batch) -> bool:
        self.inline_batches += 1
        self._backend.execute_batch(batch)
        return True


@mypyc_attr(allow_interpreted_subclasses=True)
class ThreadPoolStateExecutor(StateExecutor):
    """Runs batches on ``threads`` I/O threads (named ``aec-io-N``), for blocking backends.

    Adaptive (``adaptive=True``, the default): when the mailbox thread would
    otherwise wait for it (``idle``: the AEC flushes because nothing else can
    run) and no other batch is on an I/O thread, a batch of at most
    ``INLINE_MAX_REQUESTS`` runs on the mailbox thread instead when the backend answered
    batches of its size there faster than a thread hand-off costs
    (``BatchCostModel``): a store answering from memory gains nothing from a
    thread for a handful of requests, and with skewed keys (a hot key's records
    run one after another) most batches are that small. A batch flushed while
    the mailbox thread has other work (a full buffer) always goes to a thread,
    where it overlaps that work.
    Results and order are the same either way: a batch is applied whole, and
    concurrent batches never share a key.
    """

    def __init__(self, threads: int, adaptive: bool = True) -> None:
        super().__init__()
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.cost = BatchCostModel() if adaptive else None
        self._posted_at = 0.0  # perf_counter of the last thread-pool completion post
        self._queue_delay = 0.0  # submit -> start of the last thread-pool batch, seconds
        self._submit_cost = 0.0  # the mailbox thread's time in the last pool submit, seconds
        self._now_calls = -1  # run_now calls; the first one asks the cost model
        self._now_inline = False  # run_now's last answer from the cost model

    def submit(self, batch: Batch) -> None:
        cost = self.cost
        inline = (
            cost is not None
            and self.idle
            and self.pending == 0  # with batches on I/O threads, this one runs beside them
            and len(batch) <= INLINE_MAX_REQUESTS
            and cost.run_inline(len(batch))
        )
        self.pending += 1
        if inline:
            self.inline_batches += 1
            start = perf_counter()
            self._run(batch, self._mailbox.post_local)
            cast(BatchCostModel, cost).record_inline(len(batch), perf_counter() - start)
            return
        try:  # a batch the store answers from memory (a warm cache) needs no thread
            answered = self._backend.execute_batch_now(batch)
        except BaseException as exc:  # the mailbox thread fails the job, as for _run
            self._mailbox.post_local((batch, exc))
            return
        if answered:
            self.inline_batches += 1
            self._mailbox.post_local((batch, None))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="aec-io")
        start = perf_counter()
        self._pool.submit(self._run_timed, batch, start)
        if cost is not None:  # waking an I/O thread may hand it the GIL: part of the hand-off
            self._submit_cost = perf_counter() - start

    def run_now(self, batch: Batch) -> bool:
        """Inline when the cost model finds a one-request batch cheaper than a hand-off.

        A hot key calls this once per request, so the model is asked (and the run
        timed) on one call in ``_NOW_SAMPLE``; the calls between follow its answer."""
        cost = self.cost
        if cost is None:
            return False
        calls = self._now_calls = self._now_calls + 1
        if calls % _NOW_SAMPLE:
            if not self._now_inline:
                return False
            self.inline_batches += 1
            self._backend.execute_batch(batch)
            return True
        if not cost.run_inline(1):  # an exploring "yes" is not followed between samples
            self._now_inline = False
            return False
        self.inline_batches += 1
        start = perf_counter()
        self._backend.execute_batch(batch)
        cost.record_inline(1, perf_counter() - start)
        self._now_inline = cost.cheaper_inline(1)
        return True

    def _run_timed(self, batch: Batch, submitted: float) -> None:
        self._queue_delay = perf_counter() - submitted
        post = self._mailbox.post

        def timed_post(mail: tuple[Batch, BaseException | None]) -> None:
            self._posted_at = perf_counter()
            post(mail)

        self._run(batch, timed_post)

    def wait(self, timeout: float | None) -> None:
        """Block for a completion; measures the hand-off the mailbox thread waited for."""
        start = perf_counter()
        self._mailbox.wait(timeout)
        if self.cost is not None and self._posted_at >= start:
            woken = perf_counter() - self._posted_at
            self.cost.record_handoff(self._submit_cost + self._queue_delay + woken)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
