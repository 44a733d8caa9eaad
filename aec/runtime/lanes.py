"""Read-modify-write lanes: a record's requests on a state wait behind its
unfinished read-modify-write of that state.

A reducing or aggregating add, or a TTL read that may clean up, is a read
(``RmwRead``) whose write (``RmwWrite``) the record submits once the read is
back. Until then, later requests of the same record on the same state are held
in the record's lane (``RecordContext.lanes``: state name -> held requests), so
they reach the backend after the write, in program order. The write, or
``release`` when the record decides not to write, lets them go: in order, up to
the next read-modify-write read, which holds the rest again. Requests of other
states and other records never wait here. Mailbox thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from aec.runtime.record_context import RecordContext
from aec.state.requests import RmwRead, RmwWrite, StateRequest

Enqueue = Callable[[StateRequest], None]  # the AEC's: into the active buffer


def hold(enqueue: Enqueue, context: RecordContext, request: StateRequest, kind: type) -> bool:
    """True if ``request`` (of class ``kind``, submitted by ``context``) waits in a
    lane, or was enqueued here as a write that releases one; False: the caller
    enqueues it. A read-modify-write read opens its state's lane."""
    state = request.state
    if kind is RmwWrite:
        enqueue(request)
        release(enqueue, context, state)
        return True
    lanes = context.lanes
    held = None if lanes is None else lanes.get(state)
    if held is not None:
        held.append(request)
        return True
    if kind is RmwRead:
        if lanes is None:
            lanes = context.lanes = {}
        lanes[state] = deque()
    return False


def release(enqueue: Enqueue, context: RecordContext, state: str) -> None:
    """Close ``context``'s lane of ``state``: its held requests are enqueued in
    order until one is a read-modify-write read, which keeps the rest held."""
    lanes: dict[str, deque[StateRequest]] | None = context.lanes
    held = None if lanes is None else lanes.pop(state, None)
    while held:
        request = held.popleft()
        enqueue(request)
        if type(request) is RmwRead and lanes is not None:  # busy again
            lanes[state] = held
            return
    if lanes is not None and not lanes:
        context.lanes = None
