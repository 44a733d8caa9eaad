"""KeyedProcessOperator: one keyed operator instance (the embedding API).

Feeds records and watermarks to a ``KeyedProcessFunction`` through the AEC,
fires timers per epoch, and collects outputs in emission order. Entry points
(``process``, ``process_watermark``, ``snapshot``, ``finish``) run the mailbox on
the caller's thread, which is the mailbox thread for the operator's life.

The operator is its lifecycle, its input, its sense of time (the watermark, the clock
reading, the record sequence) and the user entry; its collaborators own the rest:
``AsyncExecutionController`` (state requests, keys, buffers), ``EpochManager`` (epochs),
``OperatorTimers`` (timers), ``OperatorOutput`` (the collector), ``BundleFlusher`` (a
function's mini-batches), ``ExternalCalls`` (``Context.call_async``),
``operator_checkpoints`` (reading and merging checkpoints) and ``operator_failures``
(how a failure reads). Flink: ``AsyncKeyedProcessOperator`` over
``AbstractAsyncStateStreamOperator``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Awaitable, Callable, Container, Hashable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, SupportsFloat, TypeVar, cast

from aec.checkpoint import state_meta
from aec.checkpoint.files import CheckpointHandle, OperatorState
from aec.checkpoint.storage import CheckpointStorageError, CheckpointStore
from aec.clock import Clock, SystemClock, check_clock, read_clock
from aec.config import AecConfig
from aec.declare.function import DeclaringKeyedProcessFunction
from aec.declare.program import DeclaredProgram
from aec.elements import ClockTick, Record, Time, Watermark, check_key, check_timestamp
from aec.errors import JobFailure
from aec.functions import Context, KeyedProcessFunction, RuntimeContext, check_function_kind
from aec.keygroups import KeyGroupRange, key_group_for, owned_range
from aec.native import mypyc_attr
from aec.runtime import interpreter_tuning
from aec.runtime.bundle import BUNDLE_LIMIT, Bundle, BundleContext, BundleFlusher
from aec.runtime.controller import new_controller
from aec.runtime.epochs import Epoch, EpochManager
from aec.runtime.executor import InlineExecutor, StateExecutor, ThreadPoolStateExecutor
from aec.runtime.external_calls import ExternalCalls
from aec.runtime.in_flight import Unserializable, carry, check_steps, decode, readmitted
from aec.runtime.operator_checkpoints import (
    HandleLike,
    check_states,
    read_checkpoints,
    restore_backend,
)
from aec.runtime.operator_failures import cause_of, close_function, job_failure, stuck_error
from aec.runtime.operator_timers import OperatorTimers
from aec.runtime.output import OperatorOutput, Trace
from aec.runtime.record_context import RecordContext
from aec.runtime.user_code import DeclaredEntryRunner, EntryRunner, InitialStateRow
from aec.state.descriptors import StateDescriptor
from aec.state.future import StateFuture
from aec.state.handles import StateHandle, make_handle
from aec.state.serialization import Serializer, StateSerializers, resolve
from aec.state.ttl import with_ttl

if TYPE_CHECKING:
    from aec.retry import RetryStrategy
    from aec.state.backend import StateBackend

_KEY_GROUP_CACHE = 1 << 16  # keys whose group is remembered; cleared when full
TTL_TICK = 1.0  # s between the epochs TTL state closes, at most (or a quarter of its TTL)
R = TypeVar("R")  # an external call's result


@mypyc_attr(allow_interpreted_subclasses=True)  # users' and tests' subclasses
class KeyedProcessOperator:
    """Runs ``function`` over keyed records with state in ``backend``.

    Args:
        function: a ``KeyedProcessFunction`` (opened by ``open``).
        backend: a ``backends.StateBackend``; opened here, never closed here
            (its owner closes it, so final state stays readable).
        config: ``AecConfig`` (default ``AecConfig()``).
        executor: a ``StateExecutor`` (else TypeError); default inline for non-blocking
            backends, a thread pool of ``config.executor_threads`` for blocking ones.
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

    inputs = 1  # a two-input operator (KeyedCoProcessOperator) has 2; checkpoints record it
    entry_runner: ClassVar[type[EntryRunner]] = EntryRunner  # runs the function's entries

    # slots: the per-record path reads these (fixed offsets, no instance dict)
    __slots__ = (
        "function", "backend", "config", "key_group_range", "synchronous", "executor",
        "epochs", "_declaring", "entries", "controller", "timers", "output", "emit",
        "emit_side", "external_calls", "clock", "_poll", "_now", "context", "_handles",
        "declared_states", "_key_groups", "_first_group", "_last_group", "_ticks", "_limit",
        "_on_finished", "_waits_for_epochs", "_watermark", "_sequence", "_records_in",
        "_started", "_elapsed", "_state", "_restorable", "_bundles", "_program",
        "_checkpoint_pending", "_checkpoint_pause", "_ttl_tick", "_next_ttl_tick",
        "__weakref__",
    )  # fmt: skip

    def __init__(
        self,
        function: KeyedProcessFunction,
        backend: StateBackend,
        config: AecConfig | None = None,
        executor: StateExecutor | None = None,
        clock: Clock | None = None,
        *,
        key_group_range: KeyGroupRange | None = None,
    ) -> None:
        self._check_function(function)
        if backend is None or not callable(getattr(backend, "execute_batch", None)):
            raise TypeError(f"backend must be a StateBackend, got {backend!r}")
        self.function = function
        self.backend = backend
        self.config = config if config is not None else AecConfig()
        if not isinstance(self.config, AecConfig):
            raise TypeError(f"config must be an AecConfig, got {type(self.config).__name__}")
        self.key_group_range = owned_range(key_group_range, self.config.max_parallelism)
        self.synchronous = not self.config.async_state
        if executor is not None and not isinstance(executor, StateExecutor):
            raise TypeError(f"executor must be a StateExecutor, got {type(executor).__name__}")
        if executor is None:
            if self.synchronous or not getattr(backend, "blocking", True):
                executor = InlineExecutor(getattr(backend, "prefers_batches", True))
            else:
                executor = ThreadPoolStateExecutor(self.config.executor_threads)
        self.executor = executor
        self.epochs = EpochManager(self._fire_timers, self._emit_epoch)
        self._declaring = isinstance(function, DeclaringKeyedProcessFunction)
        runner = DeclaredEntryRunner if self._declaring else self.entry_runner
        self.entries = runner(function)
        self.controller = new_controller(
            self.config, backend, executor, self.epochs, self.entries.run, self._next_timer
        )
        self.timers = OperatorTimers(
            self.controller, self.synchronous, self._timer_context, self.current_context,
            self.use_processing_time,
        )  # fmt: skip
        self.output = OperatorOutput(self._running)
        self.emit = self.output.emit  # the Context's hooks, bound once
        self.emit_side = self.output.emit_side
        self.context = self.entries.context = Context(self)
        self.entries.records = self.controller
        if isinstance(self.entries, DeclaredEntryRunner):
            self.entries.submit = self.controller.submit
        self.external_calls = ExternalCalls(self.controller)  # Context.call_async
        self.clock = check_clock(clock) if clock is not None else SystemClock()
        # poll the clock per element: a deterministic one always, else once timers or TTL use it
        self._poll = self.clock.deterministic
        self._now: Time = -math.inf  # last clock reading (Time: a user's clock's type, kept)
        # TTL state closes an epoch every _ttl_tick s of clock: expiry needs no watermark
        self._ttl_tick, self._next_ttl_tick = math.inf, math.inf
        self._handles: dict[str, StateHandle[Any]] = {}
        # states made in open(): the function's identity in a checkpoint (later ones: data's)
        self.declared_states: list[str] = []
        self._key_groups: dict[Hashable, int] = {}
        self._first_group, self._last_group = self.key_group_range.start, self.key_group_range.end
        self._ticks = type(executor).tick is not StateExecutor.tick
        self._limit = self.config.in_flight_records_limit
        self._on_finished = self.controller.on_context_finished  # bound once, not per record
        # serial watermark order (and sync runs): an entry returns once its epochs have left
        self._waits_for_epochs = self.config.watermark_order == "serial" or self.synchronous
        self._watermark: Time = -math.inf  # last watermark (Time: numpy's compare to np.bool_)
        self._sequence = 0  # last number given to a record, timer firing or bundle fold
        self._records_in = 0
        self._started = self._elapsed = 0.0  # perf_counter seconds: the run's start, length
        self._state = "new"  # -> open -> (ended: after Watermark(inf)) -> finished | failed -> closed
        self._restorable = True  # until the first input, snapshot or restore
        self._bundles: BundleFlusher | None = None  # the function's mini-batches, if any
        self._program: DeclaredProgram | None = None  # a declaring function's, from open
        # the last checkpoint: the records it carried, the seconds it held the operator
        self._checkpoint_pending, self._checkpoint_pause = 0, 0.0

    def _check_function(self, function: object) -> None:  # compiled, a static one binds early
        """Raise TypeError unless ``function`` is a ``KeyedProcessFunction``."""
        check_function_kind(function, KeyedProcessFunction, "KeyedProcessOperator")

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
                self._now = read_clock(self.clock)
            self.backend.open()
            self.function.open(RuntimeContext(self))
            self.declared_states = list(self._handles)
            make_bundle = getattr(self.function, "open_bundle", None)
            if make_bundle is not None:  # offered only to runs that may bundle
                bundle: Bundle | None = make_bundle()
                if bundle is not None:
                    self._bundles = BundleFlusher(bundle, self.controller, self._bundle_context)
                    self.entries.bundle = bundle
        except BaseException as exc:
            self._raise_failure(exc)
        if self._declaring:
            self._declare()

    def _declare(self) -> None:
        """Build a declaring function's steps; a bad declaration (a name used twice)
        raises its ValueError / TypeError as it is, the operator failed."""
        assert isinstance(self.function, DeclaringKeyedProcessFunction)
        assert isinstance(self.entries, DeclaredEntryRunner)
        try:
            self._program = self.entries.program = self.function.declarations()
        except BaseException as exc:
            self._state = "failed"
            self.executor.close()
            close_function(self.function, exc)
            raise

    def close(self) -> None:
        """Stop the engine threads, close the function (JobFailure if that fails). Idempotent."""
        if self._state == "closed":
            return
        was_open = self._state in ("open", "ended", "finished")
        held_gc = self._state != "new"
        self._state = "closed"
        try:
            self.executor.close()
            self.external_calls.close()
            if was_open:
                close_function(self.function, None)
        finally:
            if held_gc:
                interpreter_tuning.release()

    def __enter__(self) -> KeyedProcessOperator:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- input ---------------------------------------------------------------------------------
    def process(self, record: Record) -> None:
        """Admit one record, first waiting (running mails) while at the in-flight limit;
        TypeError/ValueError for a bad key or timestamp, JobFailure on failure."""
        if not isinstance(record, Record):
            raise TypeError(f"process takes a Record, got {record!r:.200} ({type(record).__name__})")
        self.process_fields(record.key, record.value, cast(Any, record).timestamp)

    def process_fields(
        self, key: Hashable, value: object, timestamp: Time | None, input: int = 0
    ) -> None:
        """``process(Record(key, value, timestamp))`` without building the Record (the
        Spark glue's per-row call); the same checks and errors. ``input``: the input
        it came from, 1 or 2 on a two-input operator (``KeyedCoProcessOperator``).

        1. the key and its key group (cached keys were checked on their way in);
        2. the timestamp; 3. the function's bundle may take it; 4. wait for room
        (at the in-flight limit); 5. admit it as a new ``RecordContext``."""
        try:
            key_group = self._key_groups.get(key)
        except TypeError:  # unhashable
            key_group = None
        if key_group is None:
            key_group = self._checked_key_group(key)
        if timestamp is not None and (type(timestamp) is not float or timestamp != timestamp):
            check_timestamp(timestamp)
        if self._state != "open":
            self._require_open(taking_records=True)
        if self._bundles is not None and self._offer(key, value, timestamp):
            return
        controller = self.controller
        try:
            if self._ticks:
                self.executor.tick(controller)
            if controller.mails or controller.ready:
                controller.run_available()
            if controller.in_flight >= self._limit:
                self._wait_for_room()
            # the buffer timeout, stated here only: a partial batch that waited that long goes
            active = controller.active
            if active.requests and monotonic() - active.first_time >= controller.buffer_timeout:
                controller.flush()
            if self._poll:
                self._poll_clock()
            self._sequence += 1
            self._records_in += 1
            context = RecordContext(
                value, key, key_group, timestamp, self._sequence,
                self.epochs.active, self._watermark, self._on_finished, None, self._now, input,
            )  # fmt: skip
            controller.admit(context, True)
        except BaseException as exc:
            self._raise_failure(exc)

    def _wait_for_room(self) -> None:
        """Run mails until a record finished and input may be admitted (rule 5)."""
        controller = self.controller
        while controller.in_flight >= self._limit:
            if not controller.step():
                raise stuck_error(self.controller)

    def process_initial(self, key: Hashable, row: Any) -> None:
        """Admit a row of ``key``'s initial state (Spark's ``handleInitialState``): a record
        of that key whose entry is ``function.process_initial_state(row, ctx)``, under every
        rule of records; no timestamp, not in ``records_in``. Before any record or
        watermark only (else RuntimeError; a ``restore`` after it is refused); TypeError
        / ValueError for a bad or foreign key; JobFailure when user code or the backend fails."""
        key_group = self._checked_key_group(key)
        if self._records_in or self._watermark > -math.inf or self._state not in ("new", "open"):
            raise RuntimeError(
                "process_initial() goes before any record or watermark (the operator is "
                f"{self._state}, {self._records_in} records in, watermark {self._watermark})"
            )
        self._require_open()
        self._restorable = False
        try:
            if self.controller.in_flight >= self._limit:
                self._wait_for_room()
            self._sequence += 1
            self.controller.admit(InitialStateRow(
                row, key, key_group, None, self._sequence, self.epochs.active,
                self._watermark, self._on_finished, None, self._now,
            ), True)  # fmt: skip
        except BaseException as exc:
            self._raise_failure(exc)

    def _checked_key_group(self, key: Hashable) -> int:
        """Check a key not seen before; its key group (cached), which must lie in
        this operator's range. Raises TypeError/ValueError."""
        check_key(key)
        key_group = self._key_group(key)
        if not self._first_group <= key_group <= self._last_group:
            del self._key_groups[key]
            raise ValueError(
                f"record key {key!r} is in key group {key_group}, outside this operator's "
                f"{self.key_group_range}: route records by key group (operator_index_for)"
            )
        return key_group

    def _offer(self, key: Hashable, value: object, timestamp: float | int | None) -> bool:
        """Offer a checked record to the function's bundle; True if it took it."""
        bundles = self._bundles
        assert bundles is not None
        if self._poll:
            try:
                self._poll_clock()
            except BaseException as exc:
                self._raise_failure(exc)
        if not bundles.bundle.offer(key, value, timestamp, self._watermark):
            self._flush_bundle(math.inf)  # a declined record runs after the held (rule 2)
            return False
        self._sequence += 1
        self._records_in += 1
        if bundles.bundle.size >= BUNDLE_LIMIT:
            self._flush_bundle(math.inf)
        return True

    def _key_group(self, key: Hashable) -> int:
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
        now = read_clock(self.clock)
        if now <= self._now:
            return
        first, self._now = self._now == -math.inf, now
        if first:
            return
        if self.clock.deterministic or (
            (due := self.timers.processing.peek_time()) is not None and due <= now
        ):
            self._close_epoch(ClockTick(now, self._watermark))
            if self._waits_for_epochs:
                self._run_until_epochs_done()
        elif now >= self._next_ttl_tick:  # no wait: TTL entries may go once it is done
            self._next_ttl_tick = now + self._ttl_tick
            self._close_epoch(ClockTick(now, self._watermark))

    def process_watermark(self, watermark: Watermark) -> None:
        """Close the current epoch with ``watermark``; in serial mode wait until it left.

        Raises TypeError for a non-Watermark, ValueError for NaN or a regressing
        watermark, JobFailure on failure.
        """
        if not isinstance(watermark, Watermark):
            raise TypeError(f"expected an aec.Watermark, got {type(watermark).__name__}")
        timestamp = cast(Any, watermark).timestamp  # compiled: read unchecked, checked by aec
        check_timestamp(timestamp, "watermark timestamp")
        if timestamp is None:
            raise TypeError("watermark timestamp must be a number, got None")
        if timestamp < self._watermark:
            raise ValueError(
                f"watermark {timestamp!r} arrived after {self._watermark!r}: "
                "watermarks must not go backwards"
            )
        self._require_open()
        self._restorable = False
        try:
            if self._poll:
                self._poll_clock()
            # what the watermark's timers could see goes to state first (records' watermark)
            self._flush_bundle(timestamp)
            self._watermark = timestamp
            self._close_epoch(watermark)
            self.external_calls.flush_batches()  # now: in parallel order none waits for them
            if timestamp == math.inf:
                self._state = "ended"  # the final watermark: no record may follow
            if self._waits_for_epochs:
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
                self._close_epoch(Watermark(math.inf))
            self._run_until_epochs_done()
            if self.controller.in_flight:
                raise stuck_error(self.controller)
            flush = getattr(self.backend, "flush", None)
            if flush is not None:  # write-back tiers and remote stores make writes durable
                flush()
        except BaseException as exc:
            self._raise_failure(exc)
        self._elapsed = time.perf_counter() - self._started
        self._state = "finished"
        self.close()

    def _close_epoch(self, element: Watermark | ClockTick) -> None:
        """Close the open epoch with ``element``; its domain's timers note the boundary."""
        self.timers.close_epoch(self.epochs.active, element)
        self.epochs.close(element, self._now)

    def _run_until_epochs_done(self) -> None:
        controller = self.controller
        while not self.epochs.all_closed_done():
            if not controller.step():
                raise stuck_error(self.controller)

    def _flush_bundle(self, watermark: float | int) -> None:
        """Fold the function's bundle up to ``watermark`` (inf: all); JobFailure on failure."""
        try:
            if self._bundles is not None:
                self._bundles.flush(watermark)
        except BaseException as exc:
            self._raise_failure(exc)

    # -- checkpoints (docs/semantics.md, rule 9) ----------------------------------------------
    def snapshot(self, checkpoint_id: Any, directory: str | os.PathLike[str]) -> CheckpointHandle:
        """Take checkpoint ``checkpoint_id`` into ``directory/chk-<id>``; its handle.

        ``directory`` is a local path or a URI (``file://``, ``s3://bucket/prefix``,
        whatever ``pyarrow.fs`` resolves; ``aec.checkpoint.storage``): on an object
        store the checkpoint is staged locally, uploaded, and its manifest uploaded
        last (the commit).

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
            TypeError / ValueError: ``checkpoint_id`` is not an int >= 0,
                ``directory`` is not a path (NotADirectoryError: a file), or its URI
                scheme cannot be resolved (the operator stays usable).
            FileExistsError: ``chk-<id>`` exists already (ids are never reused).
            CheckpointStorageError (an OSError): the object store cannot be
                reached, refuses access, or an upload fails; no manifest is
                written and the operator stays usable (its state is unchanged;
                Flink declines the checkpoint likewise).
            RuntimeError: the operator failed, finished or was closed.
            JobFailure: user code or the backend failed while draining, or the
                backend's snapshot or the writing failed; no checkpoint is left
                and the operator is failed.
        """
        store = CheckpointStore.at(directory)
        store.prepare(checkpoint_id)
        if self._state not in ("open", "ended"):
            if self._state != "new":
                raise RuntimeError(
                    f"cannot take checkpoint {checkpoint_id}: the operator is {self._state}"
                    + (" (a failed run commits no checkpoint)" if self._state == "failed" else "")
                )
            self.open()
        self._restorable = False
        started = time.perf_counter()
        try:
            program = self._program if self.carries_records else None
            carried, in_flight = (
                carry(self.controller, self.epochs, program, *self._serializers())
                if program is not None
                else (None, b"")
            )
            if carried is None:
                self._drain()
            state = self._checkpoint_state(in_flight)
            flush = getattr(self.backend, "flush", None)
            if flush is not None:
                flush()
            handle = store.write(checkpoint_id, self.backend, state)
        except (CheckpointStorageError, Unserializable):
            raise  # nothing committed; the operator goes on as if no snapshot was asked
        except BaseException as exc:
            self._raise_failure(exc, f"checkpoint {checkpoint_id}")
        finally:
            self.controller.holding = False
        self._checkpoint_pending = len(carried or ())
        self._checkpoint_pause = time.perf_counter() - started
        return handle

    def drain(self, *, chains_only: bool = False) -> None:
        """Run the mailbox until no record, callback or timer firing is in flight and every
        closed epoch's watermark has left (what a draining checkpoint waits for, rule 9);
        what it emits is in ``drain_outputs()``. With ``chains_only``, stop once the records
        in flight are only same-key chains (a held key's record and those waiting behind
        it: a hot key), all parallel work done: a declaring function's checkpoint then
        carries the rest. RuntimeError when not open, JobFailure on failure."""
        self._require_open()
        self._restorable = False
        try:
            if not chains_only:
                self._drain()
                return
            self._flush_bundle(math.inf)
            controller, blocking = self.controller, self.controller.blocking
            while controller.in_flight > blocking.size + blocking.key_count():  # a chain: 1 + waiting
                if not controller.step():
                    raise stuck_error(self.controller)
            controller.current = None
        except BaseException as exc:
            self._raise_failure(exc)

    @property
    def carries_records(self) -> bool:
        """Whether a checkpoint may carry the records in flight instead of draining: an
        open operator running a declaring function, asynchronous and record-ordered."""
        return self._program is not None and not self.synchronous and not self.config.state_ordered

    def restore(self, handle: HandleLike | Sequence[HandleLike]) -> None:
        """Replace state, timers, watermark and clock reading with a checkpoint's, or
        with the union of several (rescaling, Flink's restore from key-group ranges).

        Call it on a new operator (it opens it: the backend, then the function)
        or right after ``open()``, before any record, watermark or snapshot,
        then replay the input that came after the checkpoint. Every checkpoint is
        verified (manifest, sizes, SHA-256) and the set is checked to fit
        together before anything live changes. Only the key groups of this
        operator's ``key_group_range`` are kept (state and timers), also from a
        single checkpoint. Merge rules (``aec.runtime.operator_rescale``): the
        watermark is the minimum of the checkpoints', the clock reading the
        maximum; key groups of the range that no checkpoint holds start empty.
        Metrics start from zero. (Flink: ``initializeState`` on restore.)

        Args:
            handle: a ``CheckpointHandle`` from ``snapshot``, the path or URI of a
                ``chk-<id>`` directory, or a list of those (the checkpoints of
                every operator of the previous run).

        Raises:
            RuntimeError: the operator took input already, was restored, or is unusable.
            TypeError: a handle that is none of the above.
            FileNotFoundError: no checkpoint directory at a handle's location.
            ValueError: an empty list; a missing manifest (incomplete checkpoint), a
                corrupt, missing or unlisted file (named); a ``max_parallelism`` other
                than this operator's; checkpoints of different state names or
                overlapping key-group ranges; an unresolvable URI scheme; a backend
                snapshot this backend cannot read; nothing changed.
            CheckpointStorageError: an object store could not be read.
            OSError: no private directory under ``backend.scratch_parent()``.
            JobFailure: the backend failed otherwise, or user code of a timer the
                restored clock made due failed (the operator is failed then).
        """
        if not self._restorable or self._records_in or self._state not in ("new", "open"):
            raise RuntimeError(
                f"restore() needs a fresh operator (the operator is {self._state} and has "
                "taken input, a snapshot or a restore): restore before processing"
            )
        config, parent = self.config, self.backend.scratch_parent()  # of the verified copies
        check = getattr(self.function, "check_restore", None)  # e.g. windows: same assigner
        reading = read_checkpoints(
            handle, config.max_parallelism, self.key_group_range, check, self.inputs, parent
        )
        with reading as (plan, where, restored):
            self.open()
            # first: a serializer change is named by its state, not by undecodable records
            check_states(restored, self._descriptors(), config, self.backend)
            carried = decode(plan.in_flight, where, self.key_group_range, *self._serializers())
            if carried:
                if self._program is None:
                    raise ValueError(
                        f"checkpoint {where} carries records in flight of a declaring "
                        f"function; {type(self.function).__name__} declares no steps"
                    )
                check_steps(carried, self._program)  # ValueError before any state changes
            try:
                restore_backend(self.backend, plan, where, config.max_parallelism)
            except ValueError:
                raise  # nothing live changed
            except BaseException as exc:
                self._raise_failure(exc, f"restore of {where}")
        self._apply_restored(plan.state)
        try:  # user code may run here (timers newly due): its failure is the job's
            active, admit = self.epochs.active, self.controller.admit
            for record in carried:  # before any input: they arrived before the checkpoint
                self._key_groups[record.key] = record.key_group
                admit(readmitted(record, active, self._on_finished), False)
            if plan.newly_due:
                self._close_epoch(ClockTick(self._now, self._watermark))
                if self._waits_for_epochs:
                    self._run_until_epochs_done()
        except BaseException as exc:
            self._raise_failure(exc)

    def _apply_restored(self, state: OperatorState) -> None:
        """Take the restored operator state (the backend is restored already)."""
        self._restorable = False
        self.timers.replace(state.event_timers, state.processing_timers)
        self._watermark = state.watermark
        if state.watermark == math.inf:
            self._state = "ended"  # taken after the final watermark: no record may follow
        self._now = max(self._now, state.processing_time)
        self._poll = self._poll or state.poll_clock or len(self.timers.processing) > 0
        self.epochs.restart_at(state.epoch)
        self._sequence = state.record_sequence

    def _serializers(self) -> tuple[Serializer, StateSerializers]:
        """Carried records': the job's (``AecConfig.state_serializer``), each state's."""
        return resolve(self.config.state_serializer), self.backend.serializers

    def _descriptors(self) -> list[StateDescriptor]:
        """The descriptors of the states the function made (in ``open`` and since)."""
        return [handle.descriptor for handle in self._handles.values()]

    def _drain(self) -> None:
        """Run the mailbox until nothing is in flight and every closed epoch has left
        (a bundle's records first: a checkpoint holds every record before its barrier)."""
        self._flush_bundle(math.inf)
        controller = self.controller
        while controller.in_flight or not self.epochs.all_closed_done():
            if not controller.step():
                raise stuck_error(self.controller)
        controller.current = None  # nothing runs now: a failure from here on is the checkpoint's
        self.backend.expire(self._now)  # nothing in flight: later records read at >= now

    def _checkpoint_state(self, in_flight: bytes = b"") -> OperatorState:
        return OperatorState(
            watermark=self._watermark,
            processing_time=self._now,
            poll_clock=self._poll,
            epoch=self.epochs.active.sequence,
            record_sequence=self._sequence,
            max_parallelism=self.config.max_parallelism,
            event_timers=self.timers.event,
            processing_timers=self.timers.processing,
            state_names=self.declared_states,
            states=state_meta.describe(self._descriptors(), self.config),
            config=dataclasses.asdict(self.config),
            counts={
                "records_in": self._records_in,
                "records_out": self.output.records_out,
                "timers_fired": self.entries.timers_fired,
                "watermarks_out": self.output.watermarks_out,
            },
            backend=type(self.backend).__name__,
            key_group_range=(self.key_group_range.start, self.key_group_range.end),
            in_flight=in_flight,
        )

    # -- output --------------------------------------------------------------------------------
    def drain_outputs(self) -> list[Any]:
        """Values and ``Watermark``s emitted since the last call, in emission order."""
        return self.output.drain()

    def drain_side_outputs(self) -> dict[Hashable, list[Any]]:
        """Side outputs emitted since the last call: ``{tag: [value, ...]}``."""
        return self.output.drain_side()

    @property
    def trace(self) -> Trace | None:
        """Every emission with the context that made it (None: off); for
        ``aec.testing.checker``, which sets it to a list before ``open``."""
        return self.output.trace

    @trace.setter
    def trace(self, trace: Trace | None) -> None:
        self.output.trace = trace

    @property
    def watermark(self) -> float | int:
        """The last watermark that arrived, seconds (-inf before the first)."""
        return cast("float | int", self._watermark)

    @property
    def status(self) -> str:
        """``"new"``, ``"open"``, ``"ended"`` (the final watermark arrived: no more
        records), ``"finished"``, ``"failed"`` or ``"closed"``."""
        return self._state

    @property
    def metrics(self) -> dict[str, Any]:
        """Counters of this run (records, batches, requests, in-flight, seconds)."""
        elapsed = self._elapsed or (time.perf_counter() - self._started if self._started else 0.0)
        return {
            "records_in": self._records_in,
            "records_out": self.output.records_out,
            **self.controller.counters(),
            "inline_batches": self.executor.inline_batches,
            "timers_fired": self.entries.timers_fired,
            "watermarks_out": self.output.watermarks_out,
            "elapsed_s": elapsed,
            "records_per_s": (self._records_in / elapsed) if elapsed > 0 else 0.0,
            "checkpoint_pending_records": self._checkpoint_pending,
            "checkpoint_pause_s": self._checkpoint_pause,
            **self.controller.gauges(),
            **self.external_calls.metrics,
            # counters the function keeps (windows: late_records_dropped)
            **(getattr(self.function, "metric_counters", dict)()),
        }

    @property
    def in_flight_gauges(self) -> tuple[int, int, int]:
        """``(num_in_flight_records, num_blocking_keys, blocking_buffer_size)`` now: O(1)
        (state order: O(keys with timers waiting)), cheap to sample while records flow."""
        controller = self.controller
        return (controller.in_flight, *controller.blocking_gauges())

    # -- state and timers (called by handles and the timer service: OperatorHooks) --------------
    def state_handle(self, descriptor: StateDescriptor) -> StateHandle[Any]:
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
        submit, wait, release = controller.submit, controller.wait_for, controller.release_lane
        if descriptor.ttl is None:
            handle = make_handle(descriptor, submit, wait, release)
        else:
            self.use_processing_time()
            self._ttl_tick = min(self._ttl_tick, TTL_TICK, descriptor.ttl / 4)
            self._next_ttl_tick = min(self._next_ttl_tick, self._now + self._ttl_tick)
            handle = with_ttl(
                descriptor, submit, wait, release, lambda: self.current_context().processing_time
            )
        self._handles[descriptor.name] = handle
        return handle

    @property
    def state_names(self) -> list[str]:
        """Names of the states the function created."""
        return list(self._handles)

    def register_timer(self, domain: str, timestamp: float | int) -> None:
        """Register a timer of the current key in ``domain`` (event or processing time)."""
        self.timers.register(domain, timestamp)

    def delete_timer(self, domain: str, timestamp: float | int) -> None:
        """Delete the current key's timer at ``timestamp`` in ``domain`` (no-op if absent)."""
        self.timers.delete(domain, timestamp)

    def timer_times(self, domain: str) -> Container[float | int]:
        """Timestamps of the current key's timers in ``domain``."""
        return self.timers.times(domain)

    def due_timers(self, domain: str, until: Time) -> list[Time]:
        """The current key's timer timestamps in ``domain`` at or before ``until``."""
        return self.timers.due(domain, until)

    def call_async(
        self, fn: Callable[..., Awaitable[R]], args: tuple[object, ...], timeout: SupportsFloat | None,
        retry: RetryStrategy,
    ) -> StateFuture[R]:  # fmt: skip
        """An external call of the running record (``Context.call_async``)."""
        return self.external_calls.call(fn, args, timeout, retry)

    def current_context(self) -> RecordContext:
        context = self.controller.current
        if context is None:
            raise RuntimeError(
                "no current record: called outside process_element, on_timer or callbacks"
            )
        return context

    def _running(self) -> RecordContext | None:
        return self.controller.current

    def use_processing_time(self) -> None:
        """Something (TTL state, a processing-time timer) needs fresh clock readings
        per input element."""
        self._poll = True

    # -- engine hooks --------------------------------------------------------------------------
    def _fire_timers(self, epoch: Epoch) -> None:
        """The EpochManager's ``on_records_done``: the epoch's due timers fire."""
        self.timers.fire(epoch)

    def _next_timer(self, context: RecordContext) -> RecordContext | None:
        """The AEC's ``timer_successor``."""
        return self.timers.next_in_chain(context)

    def _emit_epoch(self, epoch: Epoch) -> None:
        """The EpochManager's ``on_epoch_done``: its closing element leaves. Every later
        record arrived after the epoch closed, so no read sees a processing time below
        its closing one: TTL entries expired by then may go (``StateBackend.expire``)."""
        self.output.emit_watermark(epoch.watermark)
        self.backend.expire(epoch.processing_time)

    def _timer_context(
        self, domain: str, key: Hashable, timestamp: float | int, epoch: Epoch
    ) -> RecordContext:
        """A timer firing as a record of its key, counting in ``epoch`` and seeing
        the watermark (event time) or the last watermark before the tick that fired
        it (processing time); as a fold, it starts holding its key (``start_holding``)."""
        self._sequence += 1
        element = epoch.watermark
        watermark = element.timestamp if type(element) is Watermark else element.watermark
        return self.controller.start_holding(RecordContext(
            None, key, self._key_group(key), timestamp, self._sequence, epoch, watermark,
            self._on_finished, (domain, timestamp), epoch.processing_time,
        ))  # fmt: skip

    def _bundle_context(self, key: Hashable, share: object, records: int) -> BundleContext:
        """One key's fold of the bundle, in the open epoch."""
        self._sequence += 1
        return self.controller.start_holding(BundleContext(
            share, records, key, self._key_group(key), self._sequence, self.epochs.active,
            self._watermark, self._on_finished, self._now,
        ))  # fmt: skip

    # -- failures (docs/semantics.md, rule 10) ------------------------------------------------
    def _require_open(self, taking_records: bool = False) -> None:
        """Open a new operator; refuse a done one (RuntimeError), records at the end (ValueError)."""
        if self._state == "new":
            self.open()
        elif self._state == "ended":
            if taking_records:
                raise ValueError(
                    "a record arrived after Watermark(inf), the end of input: no record "
                    "may follow the final watermark"
                )
        elif self._state != "open":
            raise RuntimeError(f"operator is {self._state}; it takes no more input")

    def _raise_failure(self, exc: BaseException, where: str | None = None) -> NoReturn:
        """Stop every engine thread, close the function (once), then raise ``JobFailure``
        (``where`` names the action when no record is current: a checkpoint). As they are:
        KeyboardInterrupt, SystemExit, a JobFailure raised here before (not a user's)."""
        context, first = self.controller.current, self._state != "failed"
        self._state = "failed"
        self.executor.close()
        self.external_calls.close()
        interrupt = isinstance(exc, (KeyboardInterrupt, SystemExit))
        as_is = interrupt or (not first and isinstance(exc, JobFailure))
        failure = exc if as_is else job_failure(exc, context, where)
        if first:
            close_function(self.function, failure)  # its error a note on the failure
        if as_is:
            raise exc
        failure.__cause__ = cause_of(exc)  # set here: compiled, ``raise ... from`` drops it
        raise failure
