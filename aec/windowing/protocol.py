"""What the drivers, the bundles and the contexts see of a window function: one protocol.

``aec.windowing.operator.WindowOperatorFunction`` implements it. A driver reads the
function's path, rules, grid and state handles (all set once in ``open``) and calls
its public ``emit`` and ``late``; it never reaches into the function's private parts.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from aec.elements import Time
from aec.functions import Context
from aec.state.descriptors import StateDescriptor
from aec.state.handles import MapState, ValueState
from aec.windowing.assigners import WindowAssigner
from aec.windowing.builtin import BuiltinTrigger
from aec.windowing.contents import Contents
from aec.windowing.evictors import Evictor
from aec.windowing.grid import Grid, Panes
from aec.windowing.panes import PaneContents
from aec.windowing.path import Path
from aec.windowing.process import ProcessWindowFunction
from aec.windowing.spec import WindowSpec
from aec.windowing.timers import WindowTimers
from aec.windowing.triggers import Trigger


class WindowFunction(Protocol):
    """An opened window function (see the module).

    Attributes:
        spec: what ``window(...)`` was given.
        path: how it runs (``aec.windowing.path``).
        rules: the built-in trigger's decisions for its domain and lateness.
        grid: the assigner's grid (tumbling and sliding), else None.
        panes: the pane grid when sliding windows keep panes, else None.
        contents: what a window (or pane) holds, over ``window-contents``.
        timers: the window timers (an index unless the path's timers are implied).
        sessions: the session set (sessions kept apart from their contents), else None.
        session_contents: a key's sessions with their contents (``"together"``), else None.
    """

    spec: WindowSpec
    path: Path
    rules: BuiltinTrigger
    assigner: WindowAssigner
    trigger: Trigger
    evictor: Evictor | None
    process_fn: ProcessWindowFunction | None
    event_time: bool
    lateness: Time
    grid: Grid | None
    panes: Panes | None
    contents: Contents | PaneContents
    timers: WindowTimers
    sessions: ValueState | None
    session_contents: ValueState | None

    def emit(self, ctx: Context, window: object, stored: object) -> Awaitable[None] | None:
        """Emit a firing window's result (nothing when ``stored`` is None); an awaitable
        when an ``async def`` process function must finish, else None."""
        ...

    def late(self, ctx: Context, value: object, timestamp: Time, watermark: Time) -> None:
        """A late record: to the late side output, or counted dropped."""
        ...

    def missing_timestamp(self, value: object, ctx: Context) -> ValueError:
        """The error for a record without a timestamp in event time."""
        ...

    def window_store(self, descriptor: StateDescriptor, kind: str) -> MapState:
        """The MapState holding ``descriptor``'s state per window (``kind``: namespace)."""
        ...

    def window_state(self, descriptor: StateDescriptor, window: object, kind: str) -> Any:
        """``descriptor``'s handle for the current key and ``window``."""
        ...

    def global_state(self, descriptor: StateDescriptor) -> Any:
        """``descriptor``'s handle for the current key."""
        ...
