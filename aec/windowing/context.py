"""The per-invocation ``Scope`` and the context handed to triggers (Flink's
``Trigger.TriggerContext`` / ``OnMergeContext``). ``ProcessWindowFunction`` and its
context are ``aec.windowing.process``'s (re-exported here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aec.elements import Time
from aec.functions import Context
from aec.state.descriptors import StateDescriptor
from aec.state.future import StateFuture
from aec.windowing.namespaced import merge_into
from aec.windowing.process import ProcessWindowContext, ProcessWindowFunction
from aec.windowing.protocol import WindowFunction
from aec.windowing.timers import EVENT, PROCESSING, PendingTimers

__all__ = ["ProcessWindowContext", "ProcessWindowFunction", "Scope", "TriggerContext"]


class Scope:
    """What one invocation (a record or a timer of one key) of the coroutine driver works
    with: the engine's ``Context`` and the timer changes it buffers (None when the
    path's timers are implied: nothing to buffer)."""

    __slots__ = ("ctx", "pending", "windowing")

    def __init__(self, ctx: Context, windowing: WindowFunction) -> None:
        self.ctx = ctx
        self.windowing = windowing
        self.pending: PendingTimers | None = None if windowing.path.implied else PendingTimers()


class TriggerContext:
    """A trigger's view of one window: timers, time, and state per key and window.

    ``register_*``/``delete_*`` take times in seconds; ``get_partitioned_state``
    returns a handle of the State V2 API scoped to the key and this window.
    In ``on_merge``, ``merge_partitioned_state(descriptor)`` folds the merged
    windows' state into this one (a StateFuture).
    """

    __slots__ = ("_scope", "window", "_merged")

    def __init__(
        self, scope: Scope, window: object, merged: Sequence[object] | None = None
    ) -> None:
        self._scope = scope
        self.window = window
        self._merged = merged

    def current_watermark(self) -> Time:
        return self._scope.ctx.timer_service.current_watermark()

    def current_processing_time(self) -> Time:
        return self._scope.ctx.timer_service.current_processing_time()

    def register_event_time_timer(self, time: float) -> None:
        s = self._scope
        s.windowing.timers.register(s.ctx, s.pending, EVENT, time, self.window)

    def delete_event_time_timer(self, time: float) -> None:
        self._scope.windowing.timers.delete(self._scope.pending, EVENT, time, self.window)

    def register_processing_time_timer(self, time: float) -> None:
        s = self._scope
        s.windowing.timers.register(s.ctx, s.pending, PROCESSING, time, self.window)

    def delete_processing_time_timer(self, time: float) -> None:
        self._scope.windowing.timers.delete(self._scope.pending, PROCESSING, time, self.window)

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        """The state of ``descriptor`` for the current key and this window (a handle of
        the descriptor's kind)."""
        return self._scope.windowing.window_state(descriptor, self.window, "trigger")

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> StateFuture:
        """Only in ``on_merge``: fold the merged windows' ``descriptor`` state into
        this window's. Raises RuntimeError elsewhere."""
        if self._merged is None:
            raise RuntimeError("merge_partitioned_state is only available in Trigger.on_merge")
        store = self._scope.windowing.window_store(descriptor, "trigger")
        return merge_into(descriptor, store, self.window, self._merged)
