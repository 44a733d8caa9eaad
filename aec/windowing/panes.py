"""Sliding windows kept as panes (slices) of ``gcd(size, slide)`` seconds (Flink SQL's
slicing window operators; Flink's DataStream windows pay one state update per window).

A record updates one pane (MapState ``window-contents``: pane index -> accumulator);
a firing window merges its ``size / gcd`` panes with ``merge`` into a fresh
accumulator (stored accumulators are never changed); cleaning window ``k`` removes
the panes whose last window it is. The pane arithmetic is ``aec.windowing.grid.Panes``.

Without allowed lateness (or in processing time: the *chain mode*) a key's live panes
are those of its next window to fire and the few ahead of the watermark, so they are
kept as one value (ValueState ``window-panes``: ``{pane index: accumulator}``, written
whole, never changed in place): a record, a firing or a bundle's flush reads it once
and writes it at most once. The timers form a chain (``Panes.chain``): a new pane
registers only the end of its first window not fired yet, and each firing registers
the end of the next window that holds a pane.
"""

from __future__ import annotations

from aec.state.future import StateFuture, combine_all
from aec.state.handles import ValueState
from aec.windowing.contents import Contents
from aec.windowing.grid import Panes
from aec.windowing.windows import Window

LIVE_PANES = "window-panes"
"""The ValueState of the chain mode: a key's live panes (see the module)."""

LivePanes = dict[int, object]
"""A key's live panes in chain mode: pane index -> accumulator."""


class PaneContents:
    """Sliding windows over an aggregate or reduce (``inner``) kept as panes of ``panes``:
    one ``window-contents`` entry per pane (``inner.store``), or in the chain mode a
    key's live panes as one value (``live``, see the module)."""

    keeps_timestamps = False

    def __init__(self, inner: Contents, panes: Panes, live: ValueState | None) -> None:
        self.inner = inner
        self.store = inner.store
        self.panes = panes
        self.live = live
        self.chain = live is not None

    def live_state(self) -> ValueState:
        """The chain mode's value (RuntimeError otherwise)."""
        if self.live is None:
            raise RuntimeError("the key's panes are one value only in the chain mode")
        return self.live

    def first_pane(self, window: Window) -> int:
        """The first pane of a grid ``window``: its index times ``r``."""
        panes = self.panes
        k: int = round((window.start - panes.offset) / panes.slide)
        return k * panes.r

    async def add_pane(self, j: int, value: object) -> bool:
        """Fold a record into pane ``j``; True when the pane held something before."""
        store = self.store
        stored = await store.async_get(j)
        store.async_put(j, self.inner.fold(stored, value, 0.0))  # not awaited, as in add
        return stored is not None

    async def read(self, window: Window) -> object:
        """The merged panes of ``window`` (None: all empty), one read per pane."""
        first = self.first_pane(window)
        store = self.store
        reads = [store.async_get(j) for j in range(first, first + self.panes.n)]
        values: list[object] = await combine_all(reads)
        return self.merged([v for v in values if v is not None])

    def merged(self, present: list[object]) -> object:
        """Panes' accumulators merged into a fresh one (None: no pane)."""
        return self.inner.merge_fresh(present) if present else None

    def clear(self, window: Window) -> StateFuture:
        """Remove the last-use panes of ``window``."""
        first = self.first_pane(window)
        return combine_all(
            [self.store.async_remove(j) for j in range(first, first + self.panes.r)]
        )

    def elements(self, stored: object) -> list[object]:
        return self.inner.elements(stored)
