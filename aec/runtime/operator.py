"""KeyedProcessOperator: one keyed operator instance (the embedding API).

Feeds records and watermarks to a ``KeyedProcessFunction`` through the AEC,
fires event-time timers per epoch, and collects outputs in emission order.
Entry points (``process``, ``process_watermark``, ``snapshot``, ``finish``)
run the mailbox on the caller's thread, which is the mailbox thread for the
operator's life. ``snapshot``/``restore`` are checkpoints (DESIGN rule 9); the
file format is ``aec.checkpoint.files``'s.
"""

from __future__ import annotations

import math
import time
from functools import partial
from time import monotonic
from types import CoroutineType
from typing import Any, cast

from aec.clock import Clock, SystemClock
from aec.config import AecConfig
from aec.elements import ClockTick, Record, Watermark, check_key, check_timestamp
from aec.errors import describe
from aec.functions import Context, KeyedProcessFunction, RuntimeContext
from aec.keygroups import KeyGroupRange, key_group_for
from aec.runtime import interpreter_tuning
from aec.runtime.bundle import BUNDLE_LIMIT, Bundle, BundleContext, OperatorBundles
from aec.runtime.controller import AsyncExecutionController
from aec.runtime.epochs import Epoch, EpochManager
from aec.runtime.executor import InlineExecutor, StateExecutor, ThreadPoolStateExecutor
from aec.runtime.external_calls import ExternalCalls
from aec.runtime.operator_checkpoints import OperatorCheckpoints
from aec.runtime.operator_failures import OperatorFailures
from aec.runtime.operator_timers import OperatorTimers
from aec.runtime.record_context import RecordContext
from aec.runtime.timers import TimerQueue
from aec.state.descriptors import StateDescriptor
from aec.state.future import _PENDING, StateFuture
from aec.state.handles import make_handle
from aec.state.ttl import with_ttl

_KEY_GROUP_CACHE = 1 << 16  # keys whose group is remembered; cleared when full


class KeyedProcessOperator(OperatorBundles, OperatorTimers, OperatorCheckpoints, OperatorFailures):
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
        key_group_range: the ``aec.keygroups.KeyGroupRange`` this operator owns
            (Flink's ``KeyGroupRange`` of a subtask); None: every key group of
            ``config.max_parallelism``. Records of other key groups are refused
            with ValueError; ``restore`` keeps only these key groups.

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
        *,
        key_group_range: KeyGroupRange | None = None,
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
        self.key_group_range = _owned_range(key_group_range, self.config.max_parallelism)
        self.synchronous = not self.config.async_state
        if executor is None:
            if self.synchronous or not getattr(backend, "blocking", True):
                executor = InlineExecutor(getattr(backend, "prefers_batches", True))
            else:
                executor = ThreadPoolStateExecutor(self.config.executor_threads)
        self.executor = executor
        self.epochs = EpochManager(self._fire_timers, self._emit_watermark)
        self.controller = AsyncExecutionController(
            self.config, backend, executor, self.epochs, self._run_entry, self._next_timer
        )
        self.external_calls = ExternalCalls(self.controller)  # Context.call_async
        self.event_timers = TimerQueue()
        self.processing_timers = TimerQueue()
        self.clock = clock if clock is not None else SystemClock()
        # poll the clock per input element: always for deterministic clocks, else
        # once processing-time timers or TTL state are in use
        self._poll = self.clock.deterministic
        self._now = -math.inf  # last clock reading
        self.context = Context(self)
        self._handles: dict[str, Any] = {}
        # states made in function.open(): what identifies the function in a checkpoint
        # (states made later on demand, e.g. a window trigger's, depend on the data seen)
        self.declared_states: list[str] = []
        # (kind, emitting RecordContext, value) per emission, for aec.testing.checker; None = off
        self.trace: list[tuple[str, Any, Any]] | None = None
        self._key_groups: dict[Any, int] = {}
        self._first_group = self.key_group_range.start
        self._last_group = self.key_group_range.end
        self._ticks = type(executor).tick is not StateExecutor.tick
        self._limit = self.config.in_flight_records_limit
        self._on_finished = self.controller.on_context_finished  # bound once, not per record
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
        self._bundle = None  # the function's mini-batch (aec.runtime.bundle)

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
            self.declared_states = list(self._handles)
            make_bundle = getattr(self.function, "open_bundle", None)
            if make_bundle is not None:  # the function offers one only to runs that may bundle
                self._bundle = make_bundle()
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
            self.external_calls.close()
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
        self.process_fields(record.key, record.value, record.timestamp)

    def process_fields(self, key: Any, value: Any, timestamp: float | None) -> None:
        """``process(Record(key, value, timestamp))`` without building the Record (the
        Spark glue's per-row call); the same checks and errors."""
        try:
            # a cached key was checked on its way in, its key group in this operator's
            # range (timers and bundles cache only keys of records admitted here)
            key_group = self._key_groups.get(key)
        except TypeError:  # unhashable
            key_group = None
        if key_group is None:
            check_key(key)
            key_group = self._key_group(key)
            if not self._first_group <= key_group <= self._last_group:
                del self._key_groups[key]
                raise ValueError(
                    f"record key {key!r} is in key group {key_group}, outside this "
                    f"operator's {self.key_group_range}: route records by key group "
                    "(operator_index_for)"
                )
        if timestamp is not None and (type(timestamp) is not float or timestamp != timestamp):
            check_timestamp(timestamp)
        if self._state != "open":
            self._require_open()
        bundle = self._bundle
        if bundle is not None:
            if self._poll:
                self._poll_clock_or_fail()
            if bundle.offer(key, value, timestamp, self._watermark):
                self._sequence += 1
                self._records_in += 1
                if bundle.size >= BUNDLE_LIMIT:
                    self._flush_bundle(math.inf)
                return
        controller = self.controller
        try:
            if self._ticks:
                self.executor.tick(controller)
            if controller.mails or controller.ready:
                controller.run_available()
            limit = self._limit
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
            context = RecordContext(
                value, key, key_group, timestamp, self._sequence,
                self.epochs.active, self._watermark, self._on_finished, None, self._now,
            )  # fmt: skip
            controller.admit(context, True)
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
            # what the watermark's timers could see goes to state first (records' watermark)
            self._flush_bundle(watermark.timestamp)
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
            self._flush_bundle(math.inf)
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

    def _run_until_epochs_done(self) -> None:
        controller = self.controller
        while not self.epochs.all_closed_done():
            if not controller.step():
                raise self._stuck()

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
            "inline_batches": getattr(self.executor, "inline_batches", 0),
            "blocked_requests": c.blocked,
            "timers_fired": self._timers_fired,
            "watermarks_out": self._watermarks_out,
            "elapsed_s": elapsed,
            "records_per_s": (self._records_in / elapsed) if elapsed > 0 else 0.0,
            # counters the function keeps (windows: late_records_dropped)
            **(getattr(self.function, "metric_counters", dict)()),
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

    def call_async(self, fn: Any, args: tuple[Any, ...], timeout: Any, retry: Any) -> StateFuture:
        """An external call of the running record (``Context.call_async``)."""
        return self.external_calls.call(fn, args, timeout, retry)

    def current_context(self) -> RecordContext:
        context = self.controller.current
        if context is None:
            raise RuntimeError(
                "no current record: called outside process_element, on_timer or callbacks"
            )
        return context

    def use_processing_time(self) -> None:
        """Something (TTL state) needs fresh clock readings per input element."""
        self._poll = True

    # -- engine hooks --------------------------------------------------------------------------
    def _run_entry(self, context: RecordContext) -> None:
        if context.timer is None:
            if type(context) is not RecordContext:  # a bundle's flush (a BundleContext)
                cast(Bundle, self._bundle).fold(
                    cast(BundleContext, context).share, cast(BundleContext, context), self.context
                )
                return
            result = self.function.process_element(context.value, self.context)
        else:
            self._timers_fired += 1
            result = self.function.on_timer(cast(float, context.timestamp), self.context)
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
        if awaited._result is not _PENDING:  # a custom awaitable yielded a done future
            self._drive(coroutine, awaited._result)
            return
        if awaited._context is None:
            # a future the user made: the awaiting record now depends on it
            awaited._context = self.controller.current
        # a partial, not a lambda: its call adds no Python frame (once per await)
        awaited._register(partial(self._drive, coroutine))

    def _emit_watermark(self, epoch: Epoch) -> None:
        if type(epoch.watermark) is not Watermark:  # a ClockTick is internal
            if self.trace is not None:
                self.trace.append(("tick", None, epoch.watermark))
            return
        self._watermarks_out += 1
        self._outputs.append(epoch.watermark)
        if self.trace is not None:
            self.trace.append(("watermark", None, epoch.watermark))


def _owned_range(key_groups: Any, max_parallelism: int) -> KeyGroupRange:
    """The operator's key groups: ``key_groups``, or all of ``max_parallelism``.

    Raises TypeError (not a KeyGroupRange) or ValueError (outside
    ``range(max_parallelism)``, or empty).
    """
    if key_groups is None:
        return KeyGroupRange.all(max_parallelism)
    if not isinstance(key_groups, KeyGroupRange):
        raise TypeError(
            f"key_group_range must be an aec.keygroups.KeyGroupRange, got {key_groups!r}"
        )
    if not key_groups.within(max_parallelism) or not len(key_groups):
        raise ValueError(
            f"key_group_range {key_groups} must be a non-empty range inside "
            f"range(max_parallelism={max_parallelism})"
        )
    return key_groups
