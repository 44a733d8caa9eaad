"""RecordContext: one record (or firing timer) in flight, with its reference count.

After Flink's ``RecordContext``/``ReferenceCounted`` (FLIP-425). Invariants:
- ``ref_count`` counts what keeps the record unfinished: +1 while its entry call
  (``process_element`` / ``on_timer``) runs, +1 per pending state future, +1 per
  registered callback or coroutine step. It never goes below 0.
- When it reaches 0 the record is finished: ``on_finished(context)`` runs once,
  which releases the key and lets the next record of that key start.
- ``in_batches`` counts this record's requests inside submitted, uncompleted
  batches; while it is > 0, newer requests wait in ``deferred`` so that one
  record's requests are never in two batches that run at once.
- ``queued`` counts this record's requests that went through the active buffer
  and are not completed; only at 0 may a request of it run at once
  (``StateExecutor.run_now``), after every earlier request of the record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from aec.native import mypyc_attr

if TYPE_CHECKING:
    from aec.runtime.epochs import Epoch
    from aec.state.requests import StateRequest


@mypyc_attr(allow_interpreted_subclasses=True)
class RecordContext:
    """The engine's handle on one record or timer firing (mailbox thread only).

    Attributes:
        value: the record's value (None for a timer).
        key, key_group: the key and its key group.
        timestamp: event time in seconds, or None.
        sequence: arrival number (records) or firing number (timers).
        epoch: the ``Epoch`` it counts in.
        timer: None for a record; for a timer firing, ``(domain, timestamp)``.
        watermark: the watermark current when it arrived (what user code sees).
        processing_time: the clock reading when it arrived (what user code and
            state TTL see), seconds.
        input: which input of a two-input operator it came from (1 or 2); 0 for a
            one-input operator's record and for a timer.
    """

    __slots__ = (
        "value", "key", "key_group", "timestamp", "sequence", "epoch", "timer",
        "watermark", "processing_time", "ref_count", "in_batches", "batch_id", "deferred",
        "on_finished", "lanes", "waited", "queued", "admitted", "input",
    )  # fmt: skip

    def __init__(
        self,
        value: object,
        key: Hashable,
        key_group: int,
        timestamp: float | None,
        sequence: int,
        epoch: Epoch,
        watermark: float | int,  # "| int": compiled, a bare float annotation makes ints floats
        on_finished: Callable[[RecordContext], None],
        timer: tuple[str, float | int] | None = None,
        processing_time: float | int = 0.0,
        input: int = 0,
    ) -> None:
        self.value = value
        self.key = key
        self.key_group = key_group
        self.timestamp = timestamp
        self.sequence = sequence
        self.epoch = epoch
        self.watermark = watermark
        self.timer = timer
        self.processing_time = processing_time
        self.ref_count = 0
        self.in_batches = 0
        self.batch_id = -1
        self.deferred: list[StateRequest] | None = None
        self.on_finished = on_finished
        # state name -> requests held behind an unfinished read-modify-write (see RmwRead)
        self.lanes: dict[str, deque[StateRequest]] | None = None
        self.waited = False  # it waited for its key (see the AEC's invariants)
        self.queued = 0  # see the module invariants
        self.input = input
        self.admitted = 0.0  # monotonic seconds of admission, for sampled records only

    def retain(self) -> None:
        """One more thing this record waits for (the engine's hottest sites add to
        ``ref_count`` directly: the entry call, a pending request, a callback)."""
        self.ref_count += 1

    def release(self) -> None:
        """Drop one reference; at 0 the record is finished (``on_finished`` runs:
        the controller passes its key on and counts it out of its epoch).
        Raises RuntimeError below 0."""
        count = self.ref_count - 1
        self.ref_count = count
        if count == 0:
            on_finished = self.on_finished  # a slot read, then a call: CPython 3.11 caches both
            on_finished(self)
        elif count < 0:
            raise RuntimeError(f"reference count of {self.describe()} went below 0")

    def describe(self) -> str:
        """``record <value> of key <key>`` or ``timer@<t> of key <key>``, for messages."""
        from aec.errors import describe

        if self.timer is not None:
            return f"{self.timer[0]} timer@{self.timer[1]!r} of key {describe(self.key)}"
        return f"record {describe(self.value)} of key {describe(self.key)}"

    def named(self) -> object:
        """What ``JobFailure.record`` holds for a failure here: the record's value, or
        ``"timer@<t>"`` for a timer firing."""
        return self.value if self.timer is None else f"timer@{self.timer[1]!r}"
