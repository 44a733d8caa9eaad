"""Records carried by a checkpoint that does not drain (FLIP-425's "Faster Checkpoint
Drain", on FLIP-455's declarations).

A checkpoint of an operator running a ``DeclaringKeyedProcessFunction`` waits only
for the work already handed out (batches at the executor, external calls), then
``capture`` describes every record still in flight: the name of its next step, its
declared variables and its state requests not yet sent to the backend (in
submission order, one of them the future its next step waits for), and the
records still waiting for their key, in per-key order. ``resume`` puts them back
on a restored operator, before any new input. Both run on the mailbox thread.

``capture`` returns None, and the checkpoint drains instead (rule 9), when a
record waits for anything else: a future derived by a callback, an undeclared
timer firing, a read-modify-write lane, a closed epoch still finishing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from aec.declare.program import DeclaredProgram
from aec.functions import Context
from aec.keygroups import KeyGroupRange
from aec.runtime.controller import AsyncExecutionController
from aec.runtime.epochs import Epoch, EpochManager
from aec.runtime.record_context import RecordContext
from aec.state.handles import Submit
from aec.state.requests import DefaultedGet, StateRequest
from aec.state.serialization import SAFE, Serializer, StateSerializers, dumps_exactly

# request classes a stored request may have (by name in the checkpoint)
_KINDS: dict[str, type[StateRequest]] = {"get": DefaultedGet, "": StateRequest}
_NAMES = {kind: name for name, kind in _KINDS.items()}


@dataclass
class StoredRequest:
    """A state request not yet sent to the backend: what re-submits it."""

    op: int
    state: str
    user_key: object
    value: object
    kind: str  # "" (a plain request) or "get" (a read with a default)


@dataclass
class CarriedRecord:
    """A record a checkpoint carries (plain data, serialized with the checkpoint).

    Attributes:
        key, key_group, value, timestamp, sequence, watermark, processing_time: the
            record as it arrived (``RecordContext``'s fields).
        started: False for a record still waiting for its key (it starts anew).
        next_step: the declared step that runs next (None: it ends after its requests).
        variables: its declared variables (None: none declared).
        requests: its requests not yet sent, in submission order.
        awaited: the index in ``requests`` of the one its next step waits for, or None.
    """

    key: Hashable
    key_group: int
    value: object
    timestamp: float | None
    sequence: int
    watermark: float
    processing_time: float
    started: bool = False
    next_step: str | None = None
    variables: dict[str, object] | None = None
    requests: list[StoredRequest] = field(default_factory=list)
    awaited: int | None = None


class ResumedRecord(RecordContext):
    """A carried record on the restored operator: its entry resumes the run."""

    __slots__ = ("carried",)

    def __init__(
        self,
        carried: CarriedRecord,
        epoch: Epoch,
        on_finished: Callable[[RecordContext], None],
    ) -> None:
        super().__init__(
            carried.value, carried.key, carried.key_group, carried.timestamp,
            carried.sequence, epoch, carried.watermark, on_finished, None,
            carried.processing_time,
        )  # fmt: skip
        self.carried = carried


class Unserializable(ValueError):
    """A carried record holds a value the checkpoint cannot store (named).

    Attributes:
        variable: the declared variable's name, or None for the record's own
            value or request payload.
    """

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


def carry(
    controller: AsyncExecutionController,
    epochs: EpochManager,
    program: DeclaredProgram,
    serializer: Serializer,
    states: StateSerializers,
) -> tuple[list[CarriedRecord] | None, bytes]:
    """The checkpoint side of a declaring function's operator: wait only for the
    work handed out (the AEC holds its buffered requests back meanwhile), then
    ``capture`` and ``encode``: the carried records and their bytes. ``(None, b"")``
    (the AEC no longer holding) when the checkpoint must drain: a closed epoch is
    still finishing, a record cannot be carried, a record's key or value is one
    ``serializer`` cannot store exactly, or a request payload one its state's serializer
    (in ``states``) cannot store. A declared variable it cannot store exactly raises
    ``Unserializable`` (the contract: declared variables are storable). The caller
    sets ``controller.holding`` back to False once the checkpoint is written."""
    if not epochs.all_closed_done():
        return None, b""
    controller.holding = True
    controller.finish_handed_over()
    carried = capture(controller, program) if epochs.all_closed_done() else None
    if not carried:
        controller.holding = carried is not None
        return carried, b""
    try:
        return carried, encode(carried, serializer, states)
    except Unserializable as exc:
        if exc.variable is not None:
            raise
        controller.holding = False
        return None, b""


def capture(
    controller: AsyncExecutionController, program: DeclaredProgram
) -> list[CarriedRecord] | None:
    """Describe every record in flight and waiting, ordered by key then arrival; None
    when one of them cannot be carried (the checkpoint must drain). The caller has
    run every completion of the work handed out (``finish_handed_over``)."""
    buffered: dict[int, list[StateRequest]] = {}
    for request in controller.active.requests:
        buffered.setdefault(id(request.context), []).append(request)
    carried: list[CarriedRecord] = []
    ready = {id(context) for context in controller.ready}
    for key, holder in sorted(controller.keys.items(), key=lambda item: item[1].sequence):
        waiting = controller.blocking.waiting(key)
        if any(c.timer is not None or type(c) is not RecordContext for c in waiting):
            return None  # a timer firing or a bundle's fold waits: it is not a record
        if id(holder) in ready:
            if holder.timer is not None or type(holder) is not RecordContext:
                return None
            carried.append(_waiting(holder))
        else:
            record = _started(holder, program, buffered.get(id(holder), []))
            if record is None:
                return None
            carried.append(record)
        carried.extend(_waiting(context) for context in waiting)
    return carried


def _waiting(context: RecordContext) -> CarriedRecord:
    return CarriedRecord(
        context.key, context.key_group, context.value, context.timestamp, context.sequence,
        context.watermark, context.processing_time,
    )  # fmt: skip


def _started(
    context: RecordContext, program: DeclaredProgram, requests: list[StateRequest]
) -> CarriedRecord | None:
    """A started record's run, or None if what it waits for is not its declared
    run's next step on one of its own plain requests."""
    if type(context) is not RecordContext and type(context) is not ResumedRecord:
        return None  # a bundle's fold
    if context.timer is not None or context.lanes or context.deferred:
        return None
    run = program.runs.get(context)
    awaited: int | None = None
    if run is not None and run.pending is not None:
        awaited = next((i for i, r in enumerate(requests) if r is run.pending), None)
        if awaited is None:
            return None  # it waits for a future a callback derived, or a call
    # every reference is accounted for: one per buffered request (whose callbacks ride
    # on it); anything more is an undeclared future; no callback but the run's
    # continuation waits on a request
    if context.ref_count != len(requests):
        return None
    for index, request in enumerate(requests):
        if request.pending_callbacks() != (1 if index == awaited else 0):
            return None
    stored = []
    for request in requests:
        kind = _NAMES.get(type(request))
        if kind is None:
            return None
        stored.append(StoredRequest(request.op, request.state, request.user_key, request.value, kind))
    record = _waiting(context)
    record.started = True
    record.next_step = None if run is None or run.next is None else run.next.name
    record.variables = None if run is None else run.variables
    record.requests = stored
    record.awaited = awaited
    return record


def resume(
    record: ResumedRecord,
    program: DeclaredProgram,
    submit: Submit,
    ctx: Context,
) -> None:
    """The entry of a carried, started record: re-submit its requests in order (it
    is the running record), then let its run go on at its next step when the
    awaited one completes. Raises ValueError for an undeclared step name."""
    carried = record.carried
    futures = [
        submit(r.op, r.state, r.user_key, r.value, _KINDS[r.kind]) for r in carried.requests
    ]
    pending = None if carried.awaited is None else futures[carried.awaited]
    if carried.awaited is None and carried.next_step is None:
        return  # it only waits for its unawaited requests
    program.resume(record, carried.next_step, carried.variables, pending, ctx)


def check_steps(records: list[CarriedRecord], program: DeclaredProgram) -> None:
    """Raise ValueError naming a stored next step ``program`` does not declare."""
    for record in records:
        if record.next_step is not None:
            program.step_named(record.next_step)


_FORMAT = "aec-in-flight/2"
_FORMAT_1 = "aec-in-flight/1"  # request payloads by the job's serializer, not their state's


def encode(
    records: list[CarriedRecord], serializer: Serializer, states: StateSerializers
) -> bytes:
    """The carried records as checkpoint bytes: the envelope in msgpack (``SAFE``),
    record values and declared variables by the job's ``serializer``, request
    payloads by their state's serializer in ``states`` (as the backend stores them).
    A key, value or variable must come back exactly as it is (``dumps_exactly``: a
    named tuple must not return a tuple). ``Unserializable`` (a ValueError) names the
    declared variable, or the record, it cannot encode."""
    rows = []
    for r in records:
        try:
            variables = None
            if r.variables is not None:
                variables = {}
                for name, value in r.variables.items():
                    try:
                        variables[name] = dumps_exactly(serializer, value)
                    except Exception as exc:
                        raise Unserializable(
                            f"declared variable {name!r} of the record of key {r.key!r} in "
                            f"flight cannot be serialized ({type(value).__name__}, "
                            f"{serializer.name}: {exc}): no checkpoint was taken",
                            name,
                        ) from exc
            dumps_exactly(SAFE, r.key)  # the envelope stores it: it must come back as it is
            requests = []
            for q in r.requests:
                dumps = states.of(q.state).dumps
                requests.append([q.op, q.state, dumps(q.user_key), dumps(q.value), q.kind])
            rows.append([
                r.key, r.key_group, dumps_exactly(serializer, r.value), r.timestamp,
                r.sequence, r.watermark, r.processing_time, r.started, r.next_step,
                variables, requests, r.awaited,
            ])  # fmt: skip
        except Unserializable:
            raise
        except Exception as exc:
            raise Unserializable(
                f"the record of key {r.key!r} in flight cannot be serialized for the "
                f"checkpoint ({serializer.name}): {exc}"
            ) from exc
    return SAFE.dumps({"format": _FORMAT, "records": rows})


def decode(
    blobs: list[bytes],
    where: str,
    owned: KeyGroupRange,
    serializer: Serializer,
    states: StateSerializers,
) -> list[CarriedRecord]:
    """The carried records of restored checkpoints (one blob each) whose key group
    ``owned`` holds, each checkpoint's in their stored order (``encode``'s
    serializers). Raises ValueError for data that does not read."""
    loads = serializer.loads
    records: list[CarriedRecord] = []
    for blob in blobs:
        try:
            data = SAFE.loads(blob)
            version = data.get("format") if isinstance(data, dict) else None
            if version not in (_FORMAT, _FORMAT_1):
                raise ValueError(f"not {_FORMAT} data")
            payloads = states.of if version == _FORMAT else lambda _: serializer
            for row in data["records"]:
                (key, key_group, value, timestamp, sequence, watermark, processing_time,
                 started, next_step, variables, requests, awaited) = row  # fmt: skip
                if key_group not in owned:
                    continue
                if type(watermark) not in (int, float):  # kept as stored: float() rounds big ints
                    raise TypeError(f"watermark {watermark!r} is not a number")
                records.append(CarriedRecord(
                    key, int(key_group), loads(value), timestamp, int(sequence),
                    watermark, float(processing_time), bool(started), next_step,
                    None if variables is None else {n: loads(v) for n, v in variables.items()},
                    [_stored(payloads(state), op, state, uk, v, kind)
                     for op, state, uk, v, kind in requests],
                    awaited,
                ))  # fmt: skip
        except Exception as exc:  # the serializer's own errors too (an UnpicklingError)
            raise ValueError(
                f"the in-flight records of {where} cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
    for record in records:
        for request in record.requests:
            if request.kind not in _KINDS:
                raise ValueError(f"the in-flight records of {where} hold a request of kind "
                                 f"{request.kind!r}")
    return records


def _stored(
    payload: Serializer, op: Any, state: object, user_key: bytes, value: bytes, kind: object
) -> StoredRequest:
    """A stored request read back (fields as ``encode`` wrote them), its payloads by
    ``payload``."""
    return StoredRequest(
        int(op), str(state), payload.loads(user_key), payload.loads(value), str(kind)
    )


def readmitted(
    record: CarriedRecord, epoch: Epoch, on_finished: Callable[[RecordContext], None]
) -> RecordContext:
    """The context a restored operator admits for ``record``: a started one resumes
    its run (``ResumedRecord``), one that waited for its key starts anew."""
    if record.started:
        return ResumedRecord(record, epoch, on_finished)
    return RecordContext(
        record.value, record.key, record.key_group, record.timestamp, record.sequence,
        epoch, record.watermark, on_finished, None, record.processing_time,
    )  # fmt: skip
