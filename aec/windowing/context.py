"""Contexts handed to triggers and to ``ProcessWindowFunction`` (Flink's
``Trigger.TriggerContext`` / ``OnMergeContext`` and
``ProcessWindowFunction.Context``), and the per-invocation ``Scope``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from aec.functions import Context
from aec.state.descriptors import StateDescriptor
from aec.state.future import StateFuture
from aec.windowing.namespaced import handle_kind, merge_into
from aec.windowing.timers import EVENT, PROCESSING, PendingTimers, WindowTimers


class Windowing(Protocol):
    """What the contexts use of the ``WindowOperatorFunction`` (``aec.windowing.operator``,
    which imports this module)."""

    fast: bool
    timers: WindowTimers

    def window_state(self, descriptor: StateDescriptor, window: Any, kind: str) -> Any: ...

    def window_store(self, descriptor: StateDescriptor, kind: str) -> Any: ...

    def global_state(self, descriptor: StateDescriptor) -> Any: ...


class Scope:
    """What one invocation (a record or a timer of one key) works with: the
    engine's ``Context`` and the timer changes it buffers."""

    __slots__ = ("ctx", "pending", "windowing")

    def __init__(self, ctx: Context, windowing: Windowing) -> None:
        self.ctx = ctx
        self.windowing = windowing  # the WindowOperatorFunction
        # implicit timers (the fast path) buffer nothing
        self.pending: PendingTimers | None = None if windowing.fast else PendingTimers()


class TriggerContext:
    """A trigger's view of one window: timers, time, and state per key and window.

    ``register_*``/``delete_*`` take times in seconds; ``get_partitioned_state``
    returns a handle of the State V2 API scoped to the key and this window.
    In ``on_merge``, ``merge_partitioned_state(descriptor)`` folds the merged
    windows' state into this one (a StateFuture).
    """

    __slots__ = ("_scope", "window", "_merged")

    def __init__(self, scope: Scope, window: Any, merged: list[Any] | None = None) -> None:
        self._scope = scope
        self.window = window
        self._merged = merged

    def current_watermark(self) -> float:
        return self._scope.ctx.timer_service.current_watermark()

    def current_processing_time(self) -> float:
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
        """The state of ``descriptor`` for the current key and this window."""
        return self._scope.windowing.window_state(descriptor, self.window, "trigger")

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> StateFuture:
        """Only in ``on_merge``: fold the merged windows' ``descriptor`` state into
        this window's. Raises RuntimeError elsewhere."""
        if self._merged is None:
            raise RuntimeError("merge_partitioned_state is only available in Trigger.on_merge")
        store = self._scope.windowing.window_store(descriptor, "trigger")
        return merge_into(descriptor, store, self.window, self._merged)


class ProcessWindowFunction:
    """Emits what a window holds when it fires (Flink / PyFlink's ``ProcessWindowFunction``).

    ``process(key, context, elements)`` returns an iterable of outputs (or is
    ``async def`` returning one); ``elements`` is a list: the aggregate's result
    or the reduced value alone, or every value of the window. ``clear(context)``
    runs when the window is cleaned up (at ``end + allowed_lateness``).
    ``open(runtime_context)`` / ``close()`` bracket the run.
    """

    def open(self, runtime_context: Any) -> None:
        pass

    def process(
        self, key: Any, context: ProcessWindowContext, elements: list[Any]
    ) -> Iterable[Any]:
        raise NotImplementedError(f"{type(self).__name__} must override process")

    def clear(self, context: ProcessWindowContext) -> Any:
        pass

    def close(self) -> None:
        pass


class _GlobalState:
    """``context.global_state()``: state per key, shared by its windows."""

    __slots__ = ("_scope",)

    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._scope.windowing.global_state(descriptor)


class _WindowState:
    """``context.window_state()``: state per key and window."""

    __slots__ = ("_scope", "_window")

    def __init__(self, scope: Scope, window: Any) -> None:
        self._scope = scope
        self._window = window

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._scope.windowing.window_state(descriptor, self._window, "process")


class ProcessWindowContext:
    """What ``ProcessWindowFunction.process`` and ``clear`` see."""

    __slots__ = ("_scope", "_window")

    def __init__(self, scope: Scope, window: Any) -> None:
        self._scope = scope
        self._window = window

    def window(self) -> Any:
        return self._window

    def current_watermark(self) -> float:
        return self._scope.ctx.timer_service.current_watermark()

    def current_processing_time(self) -> float:
        return self._scope.ctx.timer_service.current_processing_time()

    def window_state(self) -> _WindowState:
        return _WindowState(self._scope, self._window)

    def global_state(self) -> _GlobalState:
        return _GlobalState(self._scope)

    def side_output(self, tag: Any, value: Any) -> None:
        """Emit ``value`` to the side output ``tag``."""
        self._scope.ctx.side_output(tag, value)


def window_handle(descriptor: StateDescriptor, store: Any, window: Any) -> Any:
    """A per-window handle of ``descriptor`` over ``store`` (its MapState)."""
    return handle_kind(descriptor)(descriptor, store, window)
