"""AsyncWaitOperator: async I/O as an embeddable operator with checkpoints (FLIP-12).

Flink's ``AsyncWaitOperator``: inputs are pushed in (``process``,
``process_watermark``), each admitted input gets its calls (``CallDriver``), and
the element queue (ordered, unordered, or unordered with FLIP-519's per-key gate)
decides when results leave. ``snapshot`` stores every queued input without waiting
for its calls; ``restore`` re-invokes them (at-least-once calls, exactly-once
outputs). ``ordered_wait`` and friends (``aec.async_io.waits``) are iterator
front-ends over it.

Invariants (caller's thread only):
- At most ``capacity`` elements (records and watermarks) are admitted and not yet
  emitted; ``process`` waits for room *before* admitting (Flink), never after. Only a
  restore may overdraw (it re-admits what the checkpoint held).
- ``_queued`` holds exactly the admitted, not yet emitted elements, in arrival order:
  what a snapshot stores.
- Outputs are appended only inside ``process``, ``process_watermark`` and ``finish``.
- Any failure (``JobFailure``) leaves the operator failed, with its loop thread
  stopped and the function closed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Hashable, Iterator
from time import monotonic
from typing import Generic, NoReturn, Self

from aec.async_io import snapshot as async_snapshot
from aec.async_io.driver import CallDriver, is_asyncio_style
from aec.async_io.function import AsyncFunctionBase
from aec.async_io.queue import AsyncEntry, OrderedQueue, UnorderedQueue
from aec.checkpoint.files import CheckpointHandle
from aec.checkpoint.storage import CheckpointStorageError, CheckpointStore
from aec.elements import Watermark
from aec.errors import JobFailure
from aec.retry import NoRetry, RetryStrategy, check_strategy, check_timeout
from aec.runtime import interpreter_tuning
from aec.state.serialization import Serializer, resolve
from aec.state.typevars import IN, OUT

__all__ = ["AsyncWaitOperator", "MODES"]

MODES = ("ordered", "unordered", "key_ordered")
_NO_RETRY = NoRetry()


class AsyncWaitOperator(CallDriver, Generic[IN, OUT]):
    """Calls ``function`` per input with at most ``capacity`` inputs admitted and not
    yet emitted (Flink's ``AsyncWaitOperator``, FLIP-12; retries FLIP-232;
    ``key_ordered`` FLIP-519). Inputs ``IN``, outputs ``OUT``: the function's.

    Args:
        function: an ``AsyncFunction`` (Flink style or asyncio style).
        timeout: seconds from an input's first call to its timeout, spanning all
            attempts (finite and > 0), or None / ``math.inf`` for none.
        capacity: max elements (records and watermarks) admitted and not yet
            emitted (int >= 1).
        mode: ``"ordered"`` (input order), ``"unordered"`` (completion order, watermarks
            as barriers) or ``"key_ordered"`` (like unordered; an input's call starts
            after the previous same-key input completed).
        retry: an ``aec.retry`` strategy.
        key_selector: ``value -> key``, required for ``key_ordered`` and refused
            otherwise.
        serializer: how checkpoints store the queued inputs: ``"msgpack"`` (plain
            data; reading runs nothing the bytes name), ``"pickle"`` (any picklable
            input; restore only checkpoints no one else writes) or an
            ``aec.state.serialization.Serializer``; a restore needs the same one.

    Raises:
        TypeError / ValueError: bad arguments (named).
    """

    modes: tuple[str, ...] = MODES  # the modes this operator class takes

    def __init__(
        self,
        function: AsyncFunctionBase[IN, OUT],
        timeout: float | None,
        capacity: int,
        *,
        mode: str = "ordered",
        retry: RetryStrategy = _NO_RETRY,
        key_selector: Callable[[IN], Hashable] | None = None,
        serializer: str | Serializer = "msgpack",
    ) -> None:
        asyncio_style = self.check_function(function)
        timeout = check_limits(timeout, capacity, retry)
        self.serializer = resolve(serializer)  # TypeError / ValueError naming it
        if mode not in self.modes:
            raise ValueError(f"mode must be one of {', '.join(self.modes)}, got {mode!r}")
        if mode == "key_ordered":
            if not callable(key_selector):
                raise TypeError(
                    f"key_ordered mode needs a callable key_selector (value -> key), "
                    f"got {key_selector!r}"
                )
        elif key_selector is not None:
            raise ValueError(f"key_selector is for mode='key_ordered' only, not {mode!r}")
        queue = OrderedQueue() if mode == "ordered" else UnorderedQueue()
        super().__init__(function, timeout, retry, queue, key_selector, asyncio_style=asyncio_style)
        self.mode = mode
        self.capacity = capacity
        self._outputs: list[OUT | Watermark] = []
        self._queued: dict[int, AsyncEntry | Watermark] = {}
        self._sequence = itertools.count()
        self._state = "new"  # new -> open -> finished | failed -> closed
        self._restorable = True  # until the first input or snapshot
        self._records_in = 0
        self._records_out = 0
        self._restored = 0
        self._closed = False  # function.close() ran
        self._tuned = False  # holds interpreter_tuning, from open() to the shutdown

    @staticmethod
    def check_function(function: object) -> bool:
        """Check ``function`` for this operator; True if it is asyncio style.
        Raises TypeError (see ``aec.async_io.driver.is_asyncio_style``)."""
        return is_asyncio_style(function)

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Call ``function.open()``. Idempotent. Raises JobFailure if it fails (the
        function is then closed)."""
        if self._state != "new":
            return
        self._state = "open"
        # the loop thread and the mailbox thread share the GIL, and thousands of calls in
        # flight hold many young objects: the keyed operators' settings apply
        interpreter_tuning.acquire()
        self._tuned = True
        try:
            self._function.open()
        except Exception as exc:
            failure = JobFailure(f"AsyncFunction.open() failed: {type(exc).__name__}: {exc}")
            failure.__cause__ = exc
            self._fail(failure)

    def finish(self) -> None:
        """End of input: wait for every call, emit the rest (no watermark of its own),
        then ``close()``. Raises JobFailure on failure."""
        self._require_open()
        self._restorable = False
        try:
            while True:
                self.advance()
                if not self._queued:
                    break
                self.wait()
        except BaseException as exc:
            self._fail(exc)
        self._state = "finished"
        self.close()

    def close(self) -> None:
        """Stop the loop thread (cancelling running coroutines, bounded wait) and call
        ``function.close()``. Idempotent; never waits for abandoned calls to finish.
        Raises JobFailure if ``function.close()`` fails."""
        error = self._shutdown()
        if error is not None:
            raise JobFailure(
                f"AsyncFunction.close() failed: {type(error).__name__}: {error}"
            ) from error

    def abandon(self, reason: BaseException) -> None:
        """Close after ``reason`` ended the run elsewhere (a source error, an abandoned
        iterator); a ``close()`` failure is added to ``reason`` as a note."""
        error = self._shutdown()
        if error is not None:
            reason.add_note(f"AsyncFunction.close() also failed: {error!r}")

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- input ---------------------------------------------------------------------------
    def process(self, value: IN | Watermark) -> None:
        """Admit one input (a ``Watermark`` goes to ``process_watermark``), first
        waiting, while ``capacity`` elements are queued, for one to be emitted.

        Raises:
            TypeError / ValueError: a bad key from the key selector (None, unhashable,
                NaN); the operator stays usable.
            RuntimeError: the operator finished, failed or was closed.
            JobFailure: a call's final outcome is an exception (raised, retries
                exhausted, timeout), the key selector raised, or user code misused
                the API; ``__cause__`` is the exception.
        """
        if isinstance(value, Watermark):
            self.process_watermark(value)
            return
        self._push(value)

    def process_watermark(self, watermark: Watermark) -> None:
        """Queue ``watermark``: it leaves after every result of the inputs before it
        and before any result of the inputs after it. Waits for room like ``process``.

        Raises TypeError for a non-Watermark or a non-numeric timestamp, ValueError
        for a regressing one (the operator stays usable); JobFailure as ``process``.
        """
        if not isinstance(watermark, Watermark):
            raise TypeError(f"expected an aec.Watermark, got {type(watermark).__name__}")
        self._push(watermark)

    def _push(self, element: IN | Watermark) -> None:
        self._require_open()
        try:
            self.advance()
            while len(self._queue) >= self.capacity:
                self.wait()
                self.advance()
        except BaseException as exc:
            self._fail(exc)
        self.admit(element)
        try:
            self.advance()
        except BaseException as exc:
            self._fail(exc)

    def admit(self, element: IN | Watermark) -> None:
        """Admit an input or a ``Watermark`` now: ``process`` without its steps around
        the admission (running mails, waiting for room, emitting), for a front-end
        that just ran ``advance`` and saw ``has_room()`` and no ``has_completions()``.
        Raises as ``process``."""
        self._require_open()
        self._restorable = False
        self._enqueue(element)
        if not isinstance(element, Watermark):
            self._records_in += 1

    def admit_from(self, elements: Iterator[IN | Watermark]) -> bool:
        """``admit`` elements of ``elements`` one after another while there is room and
        nothing is to run first (no completion mail, no timer due, no watermark just
        admitted that ``advance`` may emit), for a front-end that just ran ``advance``
        and saw ``has_room()`` and no ``has_completions()``. Pulls an element only to
        admit it. True once ``elements`` is exhausted. Raises as ``process``."""
        mails, timers, queue, capacity = self._mailbox.mails, self._timers, self._queue, self.capacity
        admit = self.admit
        for element in elements:
            admit(element)
            if (
                mails
                or len(queue) >= capacity
                or timers.due <= monotonic()
                or isinstance(element, Watermark)
            ):
                return False
        return True

    def _enqueue(self, element: object, attempts: int = 0) -> None:
        """Admit ``element`` (no room check); boundary errors leave nothing changed."""
        try:
            admitted = self._admit(element, attempts)
        except (TypeError, ValueError):
            raise  # bad input: nothing was admitted
        except BaseException as exc:
            self._fail(exc)
        sequence = next(self._sequence)
        if type(admitted) is AsyncEntry:
            admitted.sequence = sequence
        self._queued[sequence] = admitted

    # -- output --------------------------------------------------------------------------
    def drain_outputs(self) -> list[OUT | Watermark]:
        """Results (each input's iterable, element by element) and ``Watermark``s emitted
        since the last call, in emission order."""
        outputs, self._outputs = self._outputs, []
        return outputs

    @property
    def metrics(self) -> dict[str, float]:
        """Counters: records_in, records_out (results emitted), queued (elements
        admitted and not emitted), restored_inputs."""
        return {
            "records_in": self._records_in,
            "records_out": self._records_out,
            "queued": len(self._queued),
            "restored_inputs": self._restored,
        }

    # -- the loop: steps for front-ends that drive the operator without blocking in
    # ``process`` (the wait iterators of ``aec.async_io.waits``) -------------------------
    def advance(self) -> None:
        """Run completion mails, then due timers, then emit what the queue releases;
        never blocks. Raises JobFailure as ``process`` (without failing the operator:
        the front-end calls ``abandon``)."""
        if self._mailbox.mails:
            self._run_mails()
        if self._timers.due <= monotonic():
            self._fire_timers()
        ready = self._queue.pop_ready()
        if not ready:
            return
        queued, outputs = self._queued, self._outputs
        for element in ready:
            if type(element) is AsyncEntry:
                del queued[element.sequence]
                results, element.results = element.results, None
                outputs.extend(results)  # type: ignore[arg-type]
                self._records_out += len(results)  # type: ignore[arg-type]
            else:  # a watermark leaves only after everything before it
                del queued[next(iter(queued))]
                outputs.append(element)

    def wait(self) -> None:
        """Sleep until a completion mail arrives or the next timer is due."""
        self._mailbox.wait(self._timers.next_delay(monotonic()))

    def has_room(self) -> bool:
        """Whether ``process`` would admit an input without waiting (fewer than
        ``capacity`` elements queued)."""
        return len(self._queue) < self.capacity

    def has_completions(self) -> bool:
        """Whether completion mails wait for ``advance`` (they run before new input)."""
        return bool(self._mailbox)

    def idle(self) -> bool:
        """Nothing queued."""
        return not self._queued

    # -- checkpoints ---------------------------------------------------------------------
    def snapshot(self, checkpoint_id: int, directory: str | os.PathLike[str]) -> CheckpointHandle:
        """Write checkpoint ``checkpoint_id`` to ``directory/chk-<id>`` (a local path or a
        URI: ``file://``, ``s3://bucket/prefix``, ...) and return its handle, without
        waiting for calls and without emitting anything: it stores
        every input admitted and not yet emitted (running, in backoff, or completed),
        in arrival order, with the watermarks between them, each input's calls so
        far, and the last watermark. Same manifest, checksums and atomic commit as
        keyed checkpoints (``aec.checkpoint.files``).

        Raises:
            TypeError / ValueError: a bad id or directory, an unresolvable scheme
                (nothing changes).
            FileExistsError: ``chk-<id>`` exists.
            CheckpointStorageError: the store cannot be reached or an upload failed
                (nothing committed; the operator stays usable, as a keyed one does).
            RuntimeError: the operator finished, failed or was closed.
            JobFailure: an input the serializer cannot store, or writing failed; no
                checkpoint is left and the operator is failed.
        """
        store = CheckpointStore.at(directory)
        store.prepare(checkpoint_id)
        self._require_open()
        self._restorable = False
        try:
            inputs = async_snapshot.encode(self._queued.values(), self._watermark)
            contents = async_snapshot.files(self.mode, self.capacity, inputs, self.serializer)
            return store.write_files(checkpoint_id, contents)
        except CheckpointStorageError:
            raise  # the upload failed: nothing committed, the operator goes on
        except BaseException as exc:
            failure = JobFailure(
                f"async I/O checkpoint {checkpoint_id} failed: {type(exc).__name__}: {exc}"
            )
            failure.__cause__ = exc
            self._fail(failure)

    def restore(self, handle: CheckpointHandle | str | os.PathLike[str]) -> None:
        """Open the operator and re-invoke the inputs a checkpoint stored, in their
        order with their watermarks, before any new input (Flink's
        ``AsyncWaitOperator.initializeState``). Their calls already made count against
        the retry strategy's ``max_attempts`` (at least one new call each); timeouts
        start afresh. The stored inputs are admitted even beyond ``capacity``.

        Raises:
            RuntimeError: the operator took input, a snapshot or a restore already.
            FileNotFoundError: no checkpoint at the handle's path.
            ValueError: an incomplete or corrupt checkpoint, a keyed-operator
                checkpoint, or one taken in another mode; nothing changed.
            JobFailure: ``open()`` or a re-invoked call failed.
        """
        if not self._restorable or self._state not in ("new", "open"):
            raise RuntimeError(
                f"restore() needs a fresh AsyncWaitOperator (this one is {self._state} and "
                "has taken input, a snapshot or a restore): restore before processing"
            )
        elements, watermark = async_snapshot.read(handle, self.mode, self.serializer)
        self.open()
        self._restorable = False
        for element, attempts in elements:
            self._enqueue(element, attempts)
        self._watermark = max(self._watermark, watermark)
        self._restored = sum(1 for element, _ in elements if not isinstance(element, Watermark))

    # -- failure -------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._state == "new":
            self.open()
        elif self._state != "open":
            raise RuntimeError(f"AsyncWaitOperator is {self._state}; it takes no more input")

    def _fail(self, exc: BaseException) -> NoReturn:
        """Stop everything, then re-raise ``exc`` (JobFailure or an interrupt)."""
        self._state = "failed"
        error = self._shutdown()
        if error is not None:
            exc.add_note(f"AsyncFunction.close() also failed: {error!r}")
        raise exc

    def _shutdown(self) -> BaseException | None:
        """Stop the loop thread, then close the function once; its exception."""
        try:
            self._stop_calls()
        finally:
            if self._tuned:
                self._tuned = False
                interpreter_tuning.release()
        opened = self._state in ("open", "finished", "failed")
        if self._state != "failed":
            self._state = "closed"
        if not opened or self._closed:
            return None
        self._closed = True
        try:
            self._function.close()
        except Exception as exc:
            return exc
        return None


def check_arguments(
    function: object, timeout: object, capacity: object, retry: object
) -> float | None:
    """Validate the shared arguments of async I/O; returns the timeout (None: none).

    Raises TypeError / ValueError naming the bad argument.
    """
    is_asyncio_style(function)  # raises TypeError for a function it cannot call
    return check_limits(timeout, capacity, retry)


def check_limits(timeout: object, capacity: object, retry: object) -> float | None:
    """Validate ``timeout``, ``capacity`` and ``retry``; returns the timeout (None: none).

    Raises TypeError / ValueError naming the bad argument.
    """
    seconds = check_timeout(timeout)
    check_capacity(capacity)
    check_strategy(retry)
    return seconds


def check_capacity(capacity: object) -> int:
    """Return ``capacity`` if it is an int >= 1; TypeError / ValueError otherwise."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int >= 1, got {capacity!r}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    return capacity
