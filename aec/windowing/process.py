"""``ProcessWindowFunction`` and the context it sees (Flink / PyFlink's
``ProcessWindowFunction`` and ``ProcessWindowFunction.Context``)."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from aec.elements import Time
from aec.functions import Context, RuntimeContext
from aec.state.descriptors import StateDescriptor


class WindowStates(Protocol):
    """Where a window's and a key's state come from (the window function)."""

    def window_state(self, descriptor: StateDescriptor, window: object, kind: str) -> Any:
        """The handle of ``descriptor`` for the current key and ``window`` (``kind``:
        ``"trigger"`` or ``"process"``, a namespace of its own)."""
        ...

    def global_state(self, descriptor: StateDescriptor) -> Any:
        """The handle of ``descriptor`` for the current key."""
        ...


class ProcessWindowFunction:
    """Emits what a window holds when it fires (Flink / PyFlink's ``ProcessWindowFunction``).

    ``process(key, context, elements)`` returns an iterable of outputs (or is
    ``async def`` returning one); ``elements`` is a list: the aggregate's result
    or the reduced value alone, or every value of the window. ``clear(context)``
    runs when the window is cleaned up (at ``end + allowed_lateness``).
    ``open(runtime_context)`` / ``close()`` bracket the run.
    """

    def open(self, runtime_context: RuntimeContext) -> None:
        pass

    def process(
        self, key: Any, context: ProcessWindowContext, elements: list[Any]
    ) -> Iterable[Any] | Awaitable[Iterable[Any] | None] | None:
        raise NotImplementedError(f"{type(self).__name__} must override process")

    def clear(self, context: ProcessWindowContext) -> Awaitable[None] | None:
        pass

    def close(self) -> None:
        pass


def own_clear(process: object) -> bool:
    """Whether ``process`` (a ``ProcessWindowFunction`` or None) overrides ``clear``:
    the base class's is a no-op, so cleanup skips the call otherwise."""
    if process is None:
        return False
    return getattr(type(process), "clear", None) not in (None, ProcessWindowFunction.clear)


class _GlobalState:
    """``context.global_state()``: state per key, shared by its windows."""

    __slots__ = ("_states",)

    def __init__(self, states: WindowStates) -> None:
        self._states = states

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._states.global_state(descriptor)


class _WindowState:
    """``context.window_state()``: state per key and window."""

    __slots__ = ("_states", "_window")

    def __init__(self, states: WindowStates, window: object) -> None:
        self._states = states
        self._window = window

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._states.window_state(descriptor, self._window, "process")


class ProcessWindowContext:
    """What ``ProcessWindowFunction.process`` and ``clear`` see: the window, time, state
    per window and per key, and side outputs."""

    __slots__ = ("_states", "_ctx", "_window")

    def __init__(self, states: WindowStates, ctx: Context, window: object) -> None:
        self._states = states
        self._ctx = ctx
        self._window = window

    def window(self) -> Any:
        """The firing window (a ``TimeWindow``, the ``GlobalWindow``, or a custom one)."""
        return self._window

    def current_watermark(self) -> Time:
        return self._ctx.timer_service.current_watermark()

    def current_processing_time(self) -> Time:
        return self._ctx.timer_service.current_processing_time()

    def window_state(self) -> _WindowState:
        return _WindowState(self._states, self._window)

    def global_state(self) -> _GlobalState:
        return _GlobalState(self._states)

    def side_output(self, tag: Any, value: Any) -> None:
        """Emit ``value`` to the side output ``tag``."""
        self._ctx.side_output(tag, value)
