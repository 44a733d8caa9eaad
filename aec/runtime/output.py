"""What an operator emits: records, side outputs and watermarks, in emission order
(Flink's ``Output`` / ``TimestampedCollector`` of an operator).

The operator's ``emit`` and ``emit_side`` are this object's methods, bound once, so
``Context.output`` costs one call. ``trace`` (None: off) records each emission
with the context that made it, for ``aec.testing.checker``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from aec.elements import ClockTick, Watermark

if TYPE_CHECKING:
    from aec.runtime.record_context import RecordContext

Trace = list[tuple[str, Any, Any]]  # (kind, emitting RecordContext or None, value)


class OperatorOutput:
    """The operator's collector (mailbox thread only).

    Args:
        current: returns the running record's context (for the trace).

    Attributes:
        records_out: values emitted downstream (side outputs not counted).
        watermarks_out: watermarks emitted downstream.
        trace: None, or a list the checker reads.
    """

    __slots__ = ("_outputs", "_side", "_current", "records_out", "watermarks_out", "trace")

    def __init__(self, current: Callable[[], RecordContext | None]) -> None:
        self._outputs: list[object] = []
        self._side: dict[Hashable, list[object]] = {}
        self._current = current
        self.records_out = 0
        self.watermarks_out = 0
        self.trace: Trace | None = None

    def emit(self, value: object) -> None:
        """``value`` downstream."""
        self.records_out += 1
        self._outputs.append(value)
        if self.trace is not None:
            self.trace.append(("out", self._current(), value))

    def emit_side(self, tag: Hashable, value: object) -> None:
        """``value`` to the side output ``tag``."""
        if self.trace is not None:
            self.trace.append(("side", self._current(), (tag, value)))
        bucket = self._side.get(tag)
        if bucket is None:
            self._side[tag] = [value]
        else:
            bucket.append(value)

    def emit_watermark(self, element: Watermark | ClockTick) -> None:
        """A finished epoch's closing element: a ``Watermark`` goes downstream, a
        ``ClockTick`` (internal) only to the trace."""
        if type(element) is not Watermark:
            if self.trace is not None:
                self.trace.append(("tick", None, element))
            return
        self.watermarks_out += 1
        self._outputs.append(element)
        if self.trace is not None:
            self.trace.append(("watermark", None, element))

    def drain(self) -> list[object]:
        """Values and ``Watermark``s emitted since the last call, in emission order."""
        outputs, self._outputs = self._outputs, []
        return outputs

    def drain_side(self) -> dict[Hashable, list[object]]:
        """Side outputs emitted since the last call: ``{tag: [value, ...]}``."""
        side, self._side = self._side, {}
        return side
