"""Restoring several checkpoints into one operator: rescaling by key group.

Flink restores a keyed operator of a new parallelism from the key-group ranges
of every old subtask that overlap its own (``StateAssignmentOperation``,
``KeyGroupRangeAssignment``). ``merge`` does the operator's part: it checks
that the checkpoints fit together and builds the restored operator state:
timers of the operator's key groups only, the minimum watermark, the latest
clock reading. The backend does its part (``StateBackend.restore(dirs,
key_groups, max_parallelism)``). Everything here is checked before anything
live changes.

Merge rules (``docs/checkpoints.md``):
- every checkpoint has the operator's ``max_parallelism`` and the same state
  names; their key-group ranges (recorded in each checkpoint; none recorded:
  every key group) are pairwise disjoint;
- watermark: the minimum (every checkpoint's due timers fired up to its own
  watermark, so its remaining timers are all above the minimum); a two-input
  operator's watermark of each input: the minimum per input (so the operator's,
  their minimum, is again the minimum of the checkpoints');
- clock reading: the maximum (processing time never goes back); clock polling:
  on if any was;
- epoch and record sequence: the maximum. A single checkpoint keeps its
  timers' registration order and epochs exactly; several checkpoints have
  independent epoch numbers, so their timers are renumbered as registered in
  the restored epoch, in (timestamp, registration) order. That is exact: a
  restored timer has not fired (the checkpoints were drained), so the only
  boundaries that can have fired it lie after the restore.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence

from aec.checkpoint.files import OperatorState, RestoredCheckpoint
from aec.keygroups import KeyGroupRange, key_group_for
from aec.runtime.timers import TimerQueue


@dataclasses.dataclass
class MergedCheckpoint:
    """What ``merge`` returns: the operator state to apply and how to restore the backend.

    Attributes:
        state: watermark, clock, epoch, sequence and filtered, merged timer queues.
        backend_dirs: the backend directories, in handle order.
        key_groups: the key-group range the backend must filter to, or None when
            every stored key belongs to the operator (no filtering needed).
        in_flight: each checkpoint's carried records (``OperatorState.in_flight``),
            for the operator to decode and keep its key groups' of.
        newly_due: a checkpoint holds a timer of an owned key due at the merged clock
            reading but not at its own reading: the restore closes an epoch with a
            clock tick, which fires every due timer (those already due at their own
            reading too). A single checkpoint has none: its timers due at its reading
            wait for the next advance (rule 8), as they would have.
    """

    state: OperatorState
    backend_dirs: list[str]
    key_groups: KeyGroupRange | None
    in_flight: list[bytes] = dataclasses.field(default_factory=list)
    newly_due: bool = False


def stored_range(state: OperatorState) -> KeyGroupRange:
    """The key groups a checkpoint holds (every group if it recorded none)."""
    if state.key_group_range is None:
        return KeyGroupRange(0, state.max_parallelism - 1)
    return KeyGroupRange(*state.key_group_range)


def merge(
    restored: Sequence[RestoredCheckpoint],
    max_parallelism: int,
    own: KeyGroupRange,
    inputs: int = 1,
) -> MergedCheckpoint:
    """Check that ``restored`` fit together and into an operator owning ``own`` with
    ``inputs`` inputs (1, or 2 for a ``KeyedCoProcessOperator``); their merged state.

    Raises:
        ValueError: no checkpoint; a ``max_parallelism`` other than the operator's;
            a checkpoint of an operator with another number of inputs; different
            state names; overlapping key-group ranges; a recorded range outside
            ``range(max_parallelism)``.
    """
    if not restored:
        raise ValueError("restore needs at least one checkpoint handle")
    ranges: list[tuple[KeyGroupRange, str]] = []
    first = restored[0]
    for item in restored:
        state, where = item.state, item.handle.path
        if state.max_parallelism != max_parallelism:
            raise ValueError(
                f"checkpoint {where} has max_parallelism {state.max_parallelism}, this "
                f"operator {max_parallelism}: key groups would not match"
            )
        if sorted(state.state_names) != sorted(first.state.state_names):
            raise ValueError(
                f"checkpoint {where} has states {sorted(state.state_names)}, checkpoint "
                f"{first.handle.path} {sorted(first.state.state_names)}: checkpoints of "
                "different operators cannot be merged"
            )
        theirs = 1 if state.input_watermarks is None else len(state.input_watermarks)
        if theirs != inputs:
            raise ValueError(
                f"checkpoint {where} is of an operator with {theirs} input(s), this one has "
                f"{inputs}: a KeyedProcessOperator and a KeyedCoProcessOperator do not "
                "restore each other's checkpoints"
            )
        stored = stored_range(state)
        if not stored.within(max_parallelism):
            raise ValueError(
                f"checkpoint {where} records key groups {stored} beyond {max_parallelism}"
            )
        for other, other_where in ranges:
            common = stored.intersection(other)
            if len(common):
                raise ValueError(
                    f"checkpoints {other_where} ({other}) and {where} ({stored}) both hold "
                    f"key groups {common}: restore checkpoints of disjoint key-group ranges "
                    "(one per operator of the previous run)"
                )
        ranges.append((stored, where))
    inside = all(own.intersection(r) == r for r, _ in ranges)
    states = [item.state for item in restored]
    if len(states) == 1:
        event = _filtered(states[0].event_timers, own, max_parallelism)
        processing = _filtered(states[0].processing_timers, own, max_parallelism)
        epoch = states[0].epoch
    else:
        epoch = max(s.epoch for s in states)
        event = _renumbered([s.event_timers for s in states], own, max_parallelism, epoch)
        processing = _renumbered([s.processing_timers for s in states], own, max_parallelism, epoch)
    merged = dataclasses.replace(
        first.state,
        watermark=min(s.watermark for s in states),
        processing_time=max(s.processing_time for s in states),
        poll_clock=any(s.poll_clock for s in states),
        epoch=epoch,
        record_sequence=max(s.record_sequence for s in states),
        event_timers=event,
        processing_timers=processing,
        key_group_range=(own.start, own.end),
        input_watermarks=None if inputs == 1 else _per_input_minimum(states, inputs),
        in_flight=b"",
    )
    now = merged.processing_time
    # one checkpoint's reading is the merged one: nothing can be newly due (and a
    # stream restores one per micro-batch: no queue filtered a second time)
    newly_due = len(states) > 1 and any(
        _filtered(s.processing_timers, own, max_parallelism).any_in(s.processing_time, now)
        for s in states
    )
    return MergedCheckpoint(
        merged,
        [item.backend_dir for item in restored],
        None if inside else own,
        [s.in_flight for s in states if s.in_flight],
        newly_due,
    )


def _per_input_minimum(states: list[OperatorState], inputs: int) -> tuple[float, ...]:
    """Each input's watermark: the minimum over the checkpoints (all have ``inputs``)."""
    return tuple(min((s.input_watermarks or ())[i] for s in states) for i in range(inputs))


def _keeps(own: KeyGroupRange, max_parallelism: int) -> Callable[[Hashable], bool]:
    cache: dict[Hashable, bool] = {}

    def keep(key: Hashable) -> bool:
        kept = cache.get(key)
        if kept is None:
            kept = cache[key] = key_group_for(key, max_parallelism) in own
        return kept

    return keep


def _filtered(queue: TimerQueue, own: KeyGroupRange, max_parallelism: int) -> TimerQueue:
    """``queue`` without the timers of keys outside ``own`` (order and epochs kept)."""
    keep = _keeps(own, max_parallelism)
    data = queue.export()
    data["timers"] = [t for t in data["timers"] if keep(t[2])]
    data["rearmed"] = [r for r in data["rearmed"] if keep(r[0])]
    return TimerQueue.from_export(data)


def _renumbered(
    queues: list[TimerQueue], own: KeyGroupRange, max_parallelism: int, epoch: int
) -> TimerQueue:
    """The timers of ``own``'s keys from every queue, registered in ``epoch`` in
    (timestamp, registration, queue) order; no boundaries (see the module doc)."""
    keep = _keeps(own, max_parallelism)
    timers, rearmed = [], []
    for index, queue in enumerate(queues):
        data = queue.export()
        timers += [(t, seq, index, key) for t, seq, key, _ in data["timers"] if keep(key)]
        rearmed += [(key, t, [epoch] * len(e)) for key, t, e in data["rearmed"] if keep(key)]
    timers.sort(key=lambda item: item[:3])
    exported = [(t, number, key, epoch) for number, (t, _, _, key) in enumerate(timers, 1)]
    return TimerQueue.from_export(
        {"timers": exported, "sequence": len(exported), "rearmed": rearmed, "boundaries": []}
    )
