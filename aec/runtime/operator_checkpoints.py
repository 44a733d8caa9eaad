"""Checkpoints of a ``KeyedProcessOperator`` (DESIGN rule 9): drain, then snapshot or restore.

The file format is ``aec.checkpoint.files``'s; this module is the operator's side:
the barrier (drain to zero in-flight records), what operator state goes in, and
how a restored checkpoint replaces the live state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from aec.checkpoint import files as checkpoint
from aec.checkpoint import state_meta
from aec.checkpoint.files import CheckpointHandle, OperatorState
from aec.checkpoint.storage import CheckpointStorageError, CheckpointStore, local_copy
from aec.keygroups import KeyGroupRange
from aec.runtime.epochs import Epoch
from aec.runtime.operator_rescale import merge
from aec.runtime.timers import TimerQueue

if TYPE_CHECKING:
    from aec.config import AecConfig
    from aec.functions import KeyedProcessFunction
    from aec.runtime.controller import AsyncExecutionController, StuckError
    from aec.runtime.epochs import EpochManager

HandleLike = CheckpointHandle | str | os.PathLike[str]


class OperatorCheckpoints:
    """``snapshot`` / ``restore`` of ``KeyedProcessOperator`` (a mixin: it reads the
    operator's fields; see that class for them)."""

    _state: str
    _restorable: bool
    _records_in: int
    backend: Any
    config: AecConfig
    controller: AsyncExecutionController
    epochs: EpochManager
    _timers_fired: int
    _records_out: int
    _watermarks_out: int
    _watermark: float
    _now: float
    _poll: bool
    _sequence: int
    event_timers: TimerQueue
    processing_timers: TimerQueue
    function: KeyedProcessFunction
    declared_states: list[str]
    key_group_range: KeyGroupRange
    _handles: dict[str, Any]  # state name -> handle (its ``descriptor``)

    if TYPE_CHECKING:  # the operator's methods (KeyedProcessOperator, OperatorFailures)

        def open(self) -> None: ...

        def _raise_failure(self, exc: BaseException, where: str | None = None) -> NoReturn: ...

        def _stuck(self) -> StuckError: ...

    def snapshot(self, checkpoint_id: int, directory: str | os.PathLike[str]) -> CheckpointHandle:
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
                ``directory`` is not a path, or its URI scheme cannot be resolved
                (the operator stays usable).
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
            return store.write(checkpoint_id, self.backend, self._checkpoint_state())
        except CheckpointStorageError:
            raise  # the upload failed: nothing committed, the drained operator goes on
        except BaseException as exc:
            self._raise_failure(exc, f"checkpoint {checkpoint_id}")

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
            RuntimeError: the operator took input already, was restored, or is
                not usable.
            TypeError: a handle that is none of the above.
            FileNotFoundError: no checkpoint directory at a handle's location.
            ValueError: an empty list; a missing manifest (incomplete checkpoint),
                a corrupt, missing or unlisted file (named); an unsigned or
                wrongly signed checkpoint with ``AEC_CHECKPOINT_KEY`` set; a
                ``max_parallelism`` other than this operator's; checkpoints of
                different state names or overlapping key-group ranges; a state
                name reused for another type, serializer or TTL (named); an
                unresolvable URI scheme; a backend snapshot this backend cannot
                read; nothing changed.
            CheckpointStorageError: an object store could not be read.
            JobFailure: the backend failed otherwise while restoring.
        """
        if not self._restorable or self._records_in or self._state not in ("new", "open"):
            raise RuntimeError(
                f"restore() needs a fresh operator (the operator is {self._state} and has "
                "taken input, a snapshot or a restore): restore before processing"
            )
        handles = _handle_list(handle)
        with contextlib.ExitStack() as copies:
            restored = []
            for original in handles:
                local = copies.enter_context(local_copy(original))
                item = checkpoint.read(_relocated(original, local), TimerQueue.from_export)
                restored.append(dataclasses.replace(item, handle=_named(original, item.handle)))
            plan = merge(restored, self.config.max_parallelism, self.key_group_range)
            check = getattr(self.function, "check_restore", None)  # e.g. windows: same assigner
            if check is not None:
                check(plan.state.state_names)  # raises ValueError before anything live changes
            self.open()
            self._check_states(restored)  # raises ValueError before anything live changes
            where = ", ".join(item.handle.path for item in restored)
            try:
                if len(plan.backend_dirs) == 1 and plan.key_groups is None:
                    self.backend.restore(plan.backend_dirs[0])
                else:
                    self.backend.restore(
                        plan.backend_dirs, plan.key_groups, self.config.max_parallelism
                    )
            except (FileNotFoundError, ValueError) as exc:  # backends leave live state untouched
                raise ValueError(
                    f"the backend state of checkpoint {where} does not restore "
                    f"into {self.backend!r}: {exc}"
                ) from exc
            except BaseException as exc:
                self._raise_failure(exc, f"restore of {where}")
        state = plan.state
        self._restorable = False
        self.event_timers = state.event_timers
        self.processing_timers = state.processing_timers
        self._watermark = state.watermark
        self._now = max(self._now, state.processing_time)
        self._poll = self._poll or state.poll_clock or len(self.processing_timers) > 0
        self.epochs.active = Epoch(state.epoch)
        self._sequence = state.record_sequence

    def _check_states(self, restored: Sequence[checkpoint.RestoredCheckpoint]) -> None:
        """Refuse checkpoints whose states the function now makes differently; tell the
        backend the serializer of recorded states the function makes later."""
        live = state_meta.describe(self._descriptors(), self.config)
        later: dict[str, Any] = {}
        for item in restored:
            later.update(state_meta.check(item.state.states, live, self.config, item.handle.path))
        for name, serializer in later.items():
            self.backend.register_state(name, serializer)

    def _descriptors(self) -> list[Any]:
        return [handle.descriptor for handle in self._handles.values()]

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
            state_names=self.declared_states,
            states=state_meta.describe(self._descriptors(), self.config),
            config=dataclasses.asdict(self.config),
            counts={
                "records_in": self._records_in,
                "records_out": self._records_out,
                "timers_fired": self._timers_fired,
                "watermarks_out": self._watermarks_out,
            },
            backend=type(self.backend).__name__,
            key_group_range=(self.key_group_range.start, self.key_group_range.end),
        )


def _handle_list(handle: Any) -> list[Any]:
    """One handle, path or URI, or a list/tuple of them, as a list."""
    if isinstance(handle, (list, tuple)):
        return list(handle)
    return [handle]


def _relocated(original: Any, local: str) -> Any:
    """What ``files.read`` takes for ``original`` now at ``local`` (the id is kept)."""
    if isinstance(original, CheckpointHandle):
        return CheckpointHandle(original.checkpoint_id, local)
    return local


def _named(original: Any, read: CheckpointHandle) -> CheckpointHandle:
    """The handle as the user knows it (its URI, not the download directory)."""
    if isinstance(original, CheckpointHandle):
        return original
    text = os.fspath(original)
    return CheckpointHandle(read.checkpoint_id, text if "://" in text else read.path)
