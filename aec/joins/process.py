"""``ProcessJoinFunction`` and the context it sees (Flink's ``ProcessJoinFunction`` and
``ProcessJoinFunction.Context``). Interpreted in both builds: users subclass the function,
and a compiled class would pickle only its own attributes, not a subclass's."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from aec.elements import Time
from aec.functions import Context, RuntimeContext


class ProcessJoinFunction:
    """Flink's ``ProcessJoinFunction``: ``process_element(left, right, ctx)`` for every
    joined pair, returning an iterable of outputs (or None: none). ``ctx`` is a
    ``JoinContext``. ``open(ctx)`` and ``close()`` run with the join's."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once before the first pair (``ctx`` makes state handles)."""

    def process_element(self, left: Any, right: Any, ctx: JoinContext) -> Iterable[object] | None:
        """The outputs of one pair."""
        raise NotImplementedError(f"{type(self).__name__} must override process_element")

    def close(self) -> None:
        """Called once at the end of the run, also of a failed one."""


class JoinContext:
    """What ``ProcessJoinFunction.process_element`` sees of a pair: ``left_timestamp``,
    ``right_timestamp``, ``timestamp`` (the larger; Flink's output timestamp), the
    ``current_key`` and ``side_output(tag, value)``."""

    __slots__ = ("_context", "left_timestamp", "right_timestamp")

    def __init__(self, context: Context, left_timestamp: Time, right_timestamp: Time) -> None:
        self._context = context
        self.left_timestamp = left_timestamp
        self.right_timestamp = right_timestamp

    @property
    def timestamp(self) -> Time:
        return max(self.left_timestamp, self.right_timestamp)

    @property
    def current_key(self) -> Any:
        return self._context.current_key

    def side_output(self, tag: Hashable, value: object) -> None:
        """Emit ``value`` to the side output ``tag``."""
        self._context.side_output(tag, value)
