"""KeyedProcessOperator: one keyed operator instance (the embedding API).

Feeds records and watermarks to a ``KeyedProcessFunction`` through the AEC,
fires event-time timers per epoch, and collects outputs in emission order.
Entry points (``process``, ``process_watermark``, ``snapshot``, ``finish``)
run the mailbox on the caller's thread, which is the mailbox thread for the
operator's life. ``snapshot``/``restore`` are checkpoints (DESIGN rule 9); the
file format is ``aec.checkpoint.files``'s.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from time import monotonic
from types import CoroutineType
from typing import Any, NoReturn

from aec.checkpoint import files as checkpoint
from aec.checkpoint.files import CheckpointHandle, OperatorState
from aec.clock import Clock, SystemClock
from aec.config import AecConfig
from aec.elements import ClockTick, Record, Watermark, check_key, check_timestamp
from aec.errors import JobFailure, describe
from aec.functions import Context, KeyedProcessFunction, RuntimeContext
from aec.keygroups import key_group_for
from aec.runtime import interpreter_tuning
from aec.runtime.controller import AsyncExecutionController, BatchFailed, StuckError
from aec.runtime.epochs import Epoch, EpochManager
from aec.runtime.executor import InlineExecutor, StateExecutor, ThreadPoolStateExecutor
from aec.runtime.record_context import RecordContext
from aec.runtime.timers import TimerQueue
from aec.state.future import StateFuture
from aec.state.handles import StateDescriptor, make_handle
from aec.state.ttl import with_ttl

_EVENT = "event-time"
_PROCESSING = "processing-time"
_KEY_GROUP_CACHE = 1 << 16  # keys whose group is remembered; cleared when full


class KeyedProcessOperator:
    """Runs ``function`` over keyed records with state in ``backend``.

    Args:
        function: a ``KeyedProcessFunction`` (opened by ``open``).
        backend: a ``backends.StateBackend``; opened here, never closed here
            (its owner closes it, so final state stays readable).
        config: ``AecConfig`` (default ``AecConfig()``).
        executor: a ``StateExecutor``; default inline for non-blocking backends,
            a thread pool of ``config.executor_threads`` for blocking ones.
        clock: the processing-time ``Clock`` (default ``SystemClock()``); see
            ``aec.clock`` for when it is read and how advances cut epochs.

    Errors: bad input raises TypeError/ValueError and leaves the operator usable;
    any failure of user code or the backend raises ``JobFailure`` (key and record
    in the message, cause attached) after stopping all engine threads; the
    operator is then unusable.
    """

    def __init__(
        self,
        function: KeyedProcessFunction,
        backend: Any,
        config: AecConfig | None = None,
        executor: StateExecutor | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(function, KeyedProcessFunction):
            raise TypeError(
                f"function must be a KeyedProcessFunction, got {type(function).__name__}"
            )
        if backend is None or not callable(getattr(backend, "execute_batch", None)):
            raise TypeError(f"backend must be a StateBackend, got {backend!r}")
        self.function = function
        self.backend = backend
        self.config = config if config is not None else AecConfig()
        if not isinstance(self.config, AecConfig):
            raise TypeError(f"config must be an AecConfig, got {type(self.config).__name__}")
        self.synchronous = not self.config.async_state
        if executor is None:
            if self.synchronous or not getattr(backend, "blocking", True):
                executor = InlineExecutor()
            else:
                executor = ThreadPoolStateExecutor(self.config.executor_threads)
        self.executor = executor
        self.epochs = EpochManager(self._fire_timers, self._emit_watermark)
        self.controller = AsyncExecutionController(
            self.config, backend, executor, self.epochs, self._run_entry, self._next_timer
        )
        self.event_timers = TimerQueue()
        self.processing_timers = TimerQueue()
        self.clock = clock if clock is not None else SystemClock()
        # poll the clock per input element: always for deterministic clocks, else
        # once processing-time timers or TTL state are in use
        self._poll = self.clock.deterministic
        self._now = -math.inf  # last clock reading
        self.context = Context(self)
        self._handles: dict[str, Any] = {}
        # (kind, emitting RecordContext, value) per emission, for aec.testing.checker; None = off
        self.trace: list[tuple[str, Any, Any]] | None = None
        self._key_groups: dict[Any, int] = {}
        self._ticks = type(executor).tick is not StateExecutor.tick
        self._outputs: list[Any] = []
        self._side_outputs: dict[Any, list[Any]] = {}
        self._watermark = -math.inf  # last watermark that arrived
        self._sequence = 0
        self._timers_fired = 0
        self._records_in = 0
        self._records_out = 0
        self._watermarks_out = 0
        self._started = 0.0
        self._elapsed = 0.0
        self._state = "new"  # new -> open -> finished | failed -> closed
        self._restorable = True  # until the first input, snapshot or restore

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Open the backend and the function. Idempotent; raises JobFailure if
        ``function.open`` fails."""
        if self._state != "new":
            return
        self._state = "open"
        self._started = time.perf_counter()
        interpreter_tuning.acquire()
        try:
            if not self.clock.deterministic:  # a deterministic clock is read per element only
                self._now = self.clock.now()
            self.backend.open()
            self.function.open(RuntimeContext(self))
        except BaseException as exc:
            self._raise_failure(exc)

    def close(self) -> None:
        """Stop the executor threads and close the function. Idempotent."""
        if self._state == "closed":
            return
        was_open = self._state in ("open", "finished")
        held_gc = self._state != "new"
        self._state = "closed"
        try:
            self.executor.close()
            if was_open:
                self.function.close()
        finally:
            if held_gc:
                interpreter_tuning.release()

    def __enter__(self) -> KeyedProcessOperator:
        self.open()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- input ---------------------------------------------------------------------------------
    def process(self, record: Record) -> None:
        """Admit one record, first waiting (running mails) while at the in-flight limit.

        Raises TypeError/ValueError for a bad key or timestamp, JobFailure on failure.
        """
        key = record.key
        check_key(key)
        timestamp = record.timestamp
        if timestamp is not None and (type(timestamp) is not float or timestamp != timestamp):
            check_timestamp(timestamp)
        if self._state != "open":
            self._require_open()
        controller = self.controller
        try:
            if self._ticks:
                self.executor.tick(controller)
            if controller.mails or controller.ready:
                controller.run_available()
            limit = self.config.in_flight_records_limit
            while controller.in_flight >= limit:
                if not controller.step():
                    raise self._stuck()
            active = controller.active
            if active.requests and monotonic() - active.first_time >= controller.buffer_timeout:
                controller.flush()
            if self._poll:
                self._poll_clock()
            self._sequence += 1
            self._records_in += 1
            key_group = self._key_groups.get(key)
            if key_group is None:
                key_group = self._key_group(key)
            context = RecordContext(
                record.value, key, key_group, timestamp, self._sequence,
                self.epochs.active, self._watermark, controller.on_context_finished,
                None, self._now,
            )  # fmt: skip
            controller.admit(context, inline=True)
        except BaseException as exc:
            self._raise_failure(exc)

    def _key_group(self, key: Any) -> int:
        """Compute and cache the key group of ``key`` (the cache is bounded)."""
        cache = self._key_groups
        key_group = cache.get(key)
        if key_group is not None:
            return key_group
        if len(cache) >= _KEY_GROUP_CACHE:
            cache.clear()
        key_group = cache[key] = key_group_for(key, self.config.max_parallelism)
        return key_group

    def _poll_clock(self) -> None:
        """Read the clock; an advance with a due processing-time timer (any
        advance, for a deterministic clock) closes the epoch with a ClockTick."""
        now = self.clock.now()
        if now <= self._now:
            return
        first, self._now = self._now == -math.inf, now
        if first:
            return
        if self.clock.deterministic or (
            (due := self.processing_timers.peek_time()) is not None and due <= now
        ):
            self._close_epoch(ClockTick(now, self._watermark), now)
            if self.config.watermark_order == "serial" or self.synchronous:
                self._run_until_epochs_done()

    def process_watermark(self, watermark: Watermark) -> None:
        """Close the current epoch with ``watermark``; in serial mode wait until it left.

        Raises TypeError for a non-Watermark, ValueError for NaN or a regressing
        watermark, JobFailure on failure.
        """
        if not isinstance(watermark, Watermark):
            raise TypeError(f"expected an aec.Watermark, got {type(watermark).__name__}")
        check_timestamp(watermark.timestamp, "watermark timestamp")
        if watermark.timestamp is None:
            raise TypeError("watermark timestamp must be a number, got None")
        if watermark.timestamp < self._watermark:
            raise ValueError(
                f"watermark {watermark.timestamp!r} arrived after {self._watermark!r}: "
                "watermarks must not go backwards"
            )
        self._require_open()
        self._restorable = False
        try:
            if self._poll:
                self._poll_clock()
            self._watermark = watermark.timestamp
            self._close_epoch(watermark, self._now)
            if self.config.watermark_order == "serial" or self.synchronous:
                self._run_until_epochs_done()
        except BaseException as exc:
            self._raise_failure(exc)

    def finish(self) -> None:
        """End of input: acts as ``Watermark(math.inf)`` (fires every remaining
        event-time timer, emitted last), drains every record, makes the backend's
        writes durable (``backend.flush()``), then ``close()``s.

        Raises JobFailure on failure, including a record that can never finish.
        """
        self._require_open()
        self._restorable = False
        try:
            if self._watermark < math.inf:
                self._watermark = math.inf
                self._close_epoch(Watermark(math.inf), self._now)
            self._run_until_epochs_done()
            if self.controller.in_flight:
                raise self._stuck()
            flush = getattr(self.backend, "flush", None)
            if flush is not None:  # write-back tiers and remote stores make writes durable
                flush()
        except BaseException as exc:
            self._raise_failure(exc)
        self._elapsed = time.perf_counter() - self._started
        self._state = "finished"
        self.close()

    def _close_epoch(self, element: Watermark | ClockTick, now: float) -> None:
        """Close the open epoch with ``element``; its domain's timers note the boundary."""
        domain = _EVENT if type(element) is Watermark else _PROCESSING
        self._timer_queue(domain).boundary(self.epochs.active.sequence)
        self.epochs.close(element, now)

    def _run_until_epochs_done(self) -> None:
        controller = self.controller
        while not self.epochs.all_closed_done():
            if not controller.step():
                raise self._stuck()

    # -- checkpoints (DESIGN rule 9) -------------------------------------------------------------
    def snapshot(self, checkpoint_id: int, directory: str | os.PathLike[str]) -> CheckpointHandle:
        """Take checkpoint ``checkpoint_id`` into ``directory/chk-<id>``; its handle.

        A checkpoint barrier between the input before it and after it: first
        runs the mailbox until every in-flight record, every callback and every
        timer firing due so far have finished and every closed epoch's watermark
        has left (FLIP-425 drains before the snapshot; Flink's
        ``AbstractAsyncStateStreamOperator``), then ``backend.flush()``, then
        writes backend state, timers, watermark, clock reading and metadata
        with a checksummed manifest (``aec.checkpoint.files``), committed atomically.
        Outputs emitted while draining are in ``drain_outputs()``, not in the
        checkpoint. The epoch open at the barrier stays open: nothing after the
        barrier has started, and a restored operator continues that epoch.

        Raises:
            TypeError / ValueError: ``checkpoint_id`` is not an int >= 0 or
                ``directory`` is not a path (the operator stays usable).
            FileExistsError: ``chk-<id>`` exists already (ids are never reused).
            RuntimeError: the operator failed, finished or was closed.
            JobFailure: user code or the backend failed while draining, or the
                backend's snapshot or the writing failed; no checkpoint is left
                and the operator is failed.
        """
        target = checkpoint.prepare(directory, checkpoint_id)
        if self._state != "open":
            if self._state != "new":
                raise RuntimeError(
                    f"cannot take checkpoint {checkpoint_id}: the operator is {self._state}"
                    + (" (a failed run commits no checkpoint)" if self._state == "failed" else "")
                )
            self.open()
        self._restorable = False
        try:
            self._drain()
            flush = getattr(self.backend, "flush", None)
            if flush is not None:
                flush()
            return checkpoint.write(target, checkpoint_id, self.backend, self._checkpoint_state())
        except BaseException as exc:
            self._raise_failure(exc, f"checkpoint {checkpoint_id}")

    def restore(self, handle: CheckpointHandle | str | os.PathLike[str]) -> None:
        """Replace state, timers, watermark and clock reading with a checkpoint's.

        Call it on a new operator (it opens it: the backend, then the function)
        or right after ``open()``, before any record, watermark or snapshot,
        then replay the input that came after the checkpoint. The checkpoint is
        verified (manifest, sizes, SHA-256) before anything live changes.
        Metrics start from zero. (Flink: ``initializeState`` on restore.)

        Args:
            handle: a ``CheckpointHandle`` from ``snapshot`` or the path of a
                ``chk-<id>`` directory.

        Raises:
            RuntimeError: the operator took input already, was restored, or is
                not usable.
            FileNotFoundError: no checkpoint directory at the handle's path.
            ValueError: a missing manifest (incomplete checkpoint), a corrupt,
                missing or unlisted file (named), a different ``max_parallelism``,
                or a backend snapshot this backend cannot read; nothing changed.
            JobFailure: the backend failed otherwise while restoring.
        """
        if not self._restorable or self._records_in or self._state not in ("new", "open"):
            raise RuntimeError(
                f"restore() needs a fresh operator (the operator is {self._state} and has "
                "taken input, a snapshot or a restore): restore before processing"
            )
        restored = checkpoint.read(handle, TimerQueue.from_export)  # verifies everything before anything changes
        state = restored.state
        if state.max_parallelism != self.config.max_parallelism:
            raise ValueError(
                f"checkpoint {restored.handle.checkpoint_id} has max_parallelism "
                f"{state.max_parallelism}, this operator {self.config.max_parallelism}: "
                "key groups would not match"
            )
        self.open()
        try:
            self.backend.restore(restored.backend_dir)
        except (FileNotFoundError, ValueError) as exc:  # backends leave live state untouched
            raise ValueError(
                f"the backend state of checkpoint {restored.handle.path} does not restore "
                f"into {self.backend!r}: {exc}"
            ) from exc
        except BaseException as exc:
            self._raise_failure(exc, f"restore of {restored.handle.path}")
        self._restorable = False
        self.event_timers = state.event_timers
        self.processing_timers = state.processing_timers
        self._watermark = state.watermark
        self._now = max(self._now, state.processing_time)
        self._poll = self._poll or state.poll_clock or len(self.processing_timers) > 0
        self.epochs.active = Epoch(state.epoch)
        self._sequence = state.record_sequence

    def _drain(self) -> None:
        """Run the mailbox until nothing is in flight and every closed epoch has left."""
        controller = self.controller
        while controller.in_flight or not self.epochs.all_closed_done():
            if not controller.step():
                raise self._stuck()
        controller.current = None  # nothing runs now: a failure from here on is the checkpoint's

    def _checkpoint_state(self) -> OperatorState:
        return OperatorState(
            watermark=self._watermark,
            processing_time=self._now,
            poll_clock=self._poll,
            epoch=self.epochs.active.sequence,
            record_sequence=self._sequence,
            max_parallelism=self.config.max_parallelism,
            event_timers=self.event_timers,
            processing_timers=self.processing_timers,
            state_names=self.state_names,
            config=dataclasses.asdict(self.config),
            counts={
                "records_in": self._records_in,
                "records_out": self._records_out,
                "timers_fired": self._timers_fired,
                "watermarks_out": self._watermarks_out,
            },
            backend=type(self.backend).__name__,
        )

    # -- output --------------------------------------------------------------------------------
    def drain_outputs(self) -> list[Any]:
        """Values and ``Watermark``s emitted since the last call, in emission order."""
        outputs, self._outputs = self._outputs, []
        return outputs

    def drain_side_outputs(self) -> dict[Any, list[Any]]:
        """Side outputs emitted since the last call: ``{tag: [value, ...]}``."""
        side, self._side_outputs = self._side_outputs, {}
        return side

    def emit(self, value: Any) -> None:
        self._records_out += 1
        self._outputs.append(value)
        if self.trace is not None:
            self.trace.append(("out", self.controller.current, value))

    def emit_side(self, tag: Any, value: Any) -> None:
        if self.trace is not None:
            self.trace.append(("side", self.controller.current, (tag, value)))
        bucket = self._side_outputs.get(tag)
        if bucket is None:
            self._side_outputs[tag] = [value]
        else:
            bucket.append(value)

    @property
    def metrics(self) -> dict[str, Any]:
        """Counters of this run (records, batches, requests, in-flight, seconds)."""
        c = self.controller
        elapsed = self._elapsed or (time.perf_counter() - self._started if self._started else 0.0)
        return {
            "records_in": self._records_in,
            "records_out": self._records_out,
            "max_in_flight": c.max_in_flight,
            "batches": c.batches,
            "requests": c.requests,
            "max_batch_size": c.max_batch_size if not self.synchronous else min(1, c.requests),
            "mean_batch_size": (c.requests / c.batches) if c.batches else 0.0,
            "blocked_requests": c.blocked,
            "timers_fired": self._timers_fired,
            "watermarks_out": self._watermarks_out,
            "elapsed_s": elapsed,
            "records_per_s": (self._records_in / elapsed) if elapsed > 0 else 0.0,
        }

    # -- state and timers (called by handles and the timer service) ------------------------------
    def state_handle(self, descriptor: StateDescriptor) -> Any:
        if not isinstance(descriptor, StateDescriptor):
            raise TypeError(f"get_state takes a state descriptor, got {type(descriptor).__name__}")
        handle = self._handles.get(descriptor.name)
        if handle is not None:
            if handle.descriptor != descriptor:
                raise ValueError(
                    f"state name {descriptor.name!r} is already used by {handle.descriptor!r}"
                )
            return handle
        controller = self.controller
        handle = make_handle(
            descriptor, controller.submit, controller.wait_for, controller.release_lane
        )
        if descriptor.ttl is not None:
            self.use_processing_time()
            handle = with_ttl(handle, descriptor, lambda: self.current_context().processing_time)
        self._handles[descriptor.name] = handle
        return handle

    @property
    def state_names(self) -> list[str]:
        """Names of the states the function created."""
        return list(self._handles)

    def current_context(self) -> RecordContext:
        context = self.controller.current
        if context is None:
            raise RuntimeError(
                "no current record: called outside process_element, on_timer or callbacks"
            )
        return context

    def register_timer(self, domain: str, timestamp: float) -> None:
        """Register a timer of the current key in ``domain`` (event or processing time)."""
        context = self.current_context()
        if domain == _PROCESSING:
            self._poll = True
        self._timer_queue(domain).register(
            context.key, timestamp, context.epoch.sequence, _arrival_limit(context, domain)
        )

    def delete_timer(self, domain: str, timestamp: float) -> None:
        """Delete the current key's timer at ``timestamp`` in ``domain`` (no-op if absent)."""
        context = self.current_context()
        self._timer_queue(domain).delete(
            context.key, timestamp, context.epoch.sequence, _arrival_limit(context, domain)
        )

    def _timer_queue(self, domain: str) -> TimerQueue:
        return self.event_timers if domain == _EVENT else self.processing_timers

    def use_processing_time(self) -> None:
        """Something (TTL state) needs fresh clock readings per input element."""
        self._poll = True

    # -- engine hooks --------------------------------------------------------------------------
    def _run_entry(self, context: RecordContext) -> None:
        if context.timer is None:
            result = self.function.process_element(context.value, self.context)
        else:
            self._timers_fired += 1
            result = self.function.on_timer(context.timestamp, self.context)
        if result is None or type(result) is StateFuture:
            return
        if type(result) is CoroutineType or hasattr(result, "send"):
            self._drive(result, None)
        elif not isinstance(result, StateFuture):
            entry = "process_element" if context.timer is None else "on_timer"
            raise TypeError(
                f"{entry} returned {describe(result)}; return None, a StateFuture, or use async def"
            )

    def _drive(self, coroutine: Any, value: Any) -> None:
        """Advance an ``async def`` entry until it awaits a pending future."""
        try:
            awaited = coroutine.send(value)
        except StopIteration:
            return
        if not isinstance(awaited, StateFuture):
            coroutine.close()
            raise TypeError(
                f"async user code awaited {describe(awaited)}; only aec StateFutures can be "
                "awaited in process_element/on_timer (use aec.async_io.waits for asyncio calls)"
            )
        if awaited._context is None and not awaited.is_done():
            # a future the user made: the awaiting record now depends on it
            awaited._context = self.controller.current
        awaited.on_complete(lambda result: self._drive(coroutine, result))

    def _timer_context(
        self, domain: str, key: Any, timestamp: float, epoch: Epoch
    ) -> RecordContext:
        self._sequence += 1
        element = epoch.watermark
        watermark = element.timestamp if domain == _EVENT else element.watermark
        return RecordContext(
            None, key, self._key_group(key), timestamp, self._sequence, epoch, watermark,
            self.controller.on_context_finished, (domain, timestamp), epoch.processing_time,
        )  # fmt: skip

    def _fire_timers(self, epoch: Epoch) -> None:
        """The head epoch's records are done: fire the timers its closing element
        (a Watermark: event time; a ClockTick: processing time) makes due.

        Synchronous mode fires one timer at a time in (timestamp, registration)
        order, like Flink's timer service. Async mode fires each key's timers as a
        chain (the next starts when the previous finished), keys in parallel, so a
        timer registered by ``on_timer`` at or below the limit still fires in
        timestamp order within its key.
        """
        domain = _EVENT if type(epoch.watermark) is Watermark else _PROCESSING
        limit = epoch.watermark.timestamp
        timers = self._timer_queue(domain)
        controller = self.controller
        if self.synchronous:
            while (due := timers.pop_earliest(limit)) is not None:
                context = self._timer_context(domain, due[1], due[0], epoch)
                controller.admit(context, inline=True)
            return
        for key in timers.due_keys(limit, epoch.sequence):
            timestamp = timers.pop_next_for_key(key, limit, epoch.sequence)
            controller.admit(self._timer_context(domain, key, timestamp, epoch), inline=False)

    def _next_timer(self, context: RecordContext) -> RecordContext | None:
        if self.synchronous:
            return None
        domain = context.timer[0]
        epoch = context.epoch
        timestamp = self._timer_queue(domain).pop_next_for_key(
            context.key, epoch.watermark.timestamp, epoch.sequence
        )
        if timestamp is None:
            return None
        return self._timer_context(domain, context.key, timestamp, epoch)

    def _emit_watermark(self, epoch: Epoch) -> None:
        if type(epoch.watermark) is not Watermark:  # a ClockTick is internal
            if self.trace is not None:
                self.trace.append(("tick", None, epoch.watermark))
            return
        self._watermarks_out += 1
        self._outputs.append(epoch.watermark)
        if self.trace is not None:
            self.trace.append(("watermark", None, epoch.watermark))

    # -- failure -------------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._state == "new":
            self.open()
        elif self._state != "open":
            raise RuntimeError(f"operator is {self._state}; it takes no more input")

    def _stuck(self) -> StuckError:
        keys = self.controller.stuck_keys()
        shown = ", ".join(describe(k, 60) for k in keys[:10])
        more = f" and {len(keys) - 10} more" if len(keys) > 10 else ""
        return StuckError(
            f"{self.controller.in_flight} record(s) can never finish: a future they wait for "
            f"is never completed (keys: {shown}{more})"
        )

    def _raise_failure(self, exc: BaseException, where: str | None = None) -> NoReturn:
        """Stop every engine thread, then raise ``JobFailure`` (KeyboardInterrupt,
        SystemExit and an existing JobFailure are re-raised as they are). ``where``
        names the action when no record is current (a checkpoint)."""
        context = self.controller.current
        self._state = "failed"
        self.executor.close()
        if isinstance(exc, (KeyboardInterrupt, SystemExit, JobFailure)):
            raise exc
        raise self._failure(exc, context, where) from _cause(exc)

    def _failure(
        self, exc: BaseException, context: RecordContext | None, action: str | None = None
    ) -> JobFailure:
        if context is not None:
            where = context.describe()
            key, record = (
                context.key,
                (context.value if context.timer is None else f"timer@{context.timer[1]!r}"),
            )
        else:
            where, key, record = action or "no current record", None, None
        cause = _cause(exc)
        what = "state backend failed" if isinstance(exc, BatchFailed) else "job failed"
        return JobFailure(
            f"{what} at {where}: {type(cause).__name__}: {cause}", key=key, record=record
        )


def _arrival_limit(context: RecordContext, domain: str) -> float:
    """The time (event or processing) that had passed before a record arrived:
    its timers at or below it fired before the record in the synchronous run.
    -inf for timer code, whose firing's due timers are all still to fire."""
    if context.timer is not None:
        return -math.inf
    return context.watermark if domain == _EVENT else context.processing_time


def _cause(exc: BaseException) -> BaseException:
    """The original error behind an engine wrapper."""
    if isinstance(exc, BatchFailed) and exc.__cause__ is not None:
        return exc.__cause__
    return exc
