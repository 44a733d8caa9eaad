"""Checkpoints of a ``KeyedProcessOperator`` (DESIGN rule 9): drain, then snapshot or restore.

The file format is ``aec.checkpoint.files``'s; this module is the operator's side:
the barrier (drain to zero in-flight records), what operator state goes in, and
how a restored checkpoint replaces the live state.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from aec.checkpoint import files as checkpoint
from aec.checkpoint.files import CheckpointHandle, OperatorState
from aec.runtime.epochs import Epoch
from aec.runtime.timers import TimerQueue


class OperatorCheckpoints:
    """``snapshot`` / ``restore`` of ``KeyedProcessOperator`` (a mixin: it reads the
    operator's fields; see that class for them)."""

    _state: str
    _restorable: bool
    _records_in: int
    backend: Any
    config: Any
    controller: Any
    epochs: Any
    _timers_fired: int

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
        check = getattr(self.function, "check_restore", None)  # e.g. windows: same assigner
        if check is not None:
            check(state.state_names)  # raises ValueError before anything live changes
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
