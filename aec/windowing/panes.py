"""Sliding windows as panes (slices) of ``gcd(size, slide)`` seconds (Flink SQL's
slicing window operators; Flink's DataStream windows pay one state update per window).

A record updates one pane (MapState ``window-contents``: pane index -> accumulator);
a firing window merges its ``size / gcd`` panes with ``merge`` into a fresh
accumulator (stored accumulators are never changed); cleaning window ``k`` removes
the panes whose last window it is.

Without allowed lateness (or in processing time) a key's live panes are those of its
next window to fire and the few ahead of the watermark, so a firing scans them in one
request, and the timers form a chain: a new pane registers only the end of its first
window, and each firing registers the end of the next window that holds a pane.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from aec.state.future import combine_all
from aec.windowing.contents import Contents

if TYPE_CHECKING:
    from aec.windowing.assigners import SlidingEventTimeWindows
    from aec.windowing.windows import TimeWindow

MAX_PANES_PER_WINDOW = 4096  # beyond this (odd float sizes) windows keep their own state


def pane_size(size: float, slide: float) -> Fraction | None:
    """``gcd(size, slide)`` as an exact fraction, or None when a window would span
    more than ``MAX_PANES_PER_WINDOW`` panes."""
    a, b = Fraction(size), Fraction(slide)
    denominator = math.lcm(a.denominator, b.denominator)
    g = Fraction(math.gcd(int(a * denominator), int(b * denominator)), denominator)
    return g if a / g <= MAX_PANES_PER_WINDOW else None


class PaneContents:
    """Sliding windows over an aggregate or reduce kept as panes (slices).

    A record updates only its pane ``j = floor((t - offset) / g)``; window ``k``
    (``start = offset + k * slide``) is panes ``k*r .. k*r + n - 1`` with
    ``r = slide / g``, ``n = size / g``, merged when read. Cleaning window
    ``k`` removes panes ``k*r .. k*r + r - 1``, whose last window it is.
    """

    keeps_timestamps = False

    def __init__(
        self, inner: Contents, assigner: SlidingEventTimeWindows, g: Fraction, chain: bool = False
    ) -> None:
        self.chain = chain
        self.inner = inner
        self.store = inner.store
        self.assigner = assigner
        self.g = float(g)
        self.offset, self.slide, self.size = assigner.offset, assigner.slide, assigner.size
        self.n = int(Fraction(assigner.size) / g)
        self.r = int(Fraction(assigner.slide) / g)

    def pane(self, timestamp: float) -> int:
        offset, g = self.offset, self.g
        j = math.floor((timestamp - offset) / g)
        if offset + j * g > timestamp:
            j -= 1
        elif offset + (j + 1) * g <= timestamp:
            j += 1
        return j

    def window_range(self, j: int) -> tuple[int, int]:
        """Grid indexes ``(first, last)`` of the windows holding pane ``j``."""
        return -((self.n - 1 - j) // self.r), j // self.r  # ceil((j - n + 1) / r), floor(j / r)

    def _first_pane(self, window: TimeWindow) -> int:
        return round((window.start - self.assigner.offset) / self.assigner.slide) * self.r

    async def add_pane(self, j: int, value: Any) -> bool:
        store = self.store
        stored = await store.async_get(j)
        store.async_put(j, self.inner.fold(stored, value, 0.0))  # not awaited, as in add
        return stored is not None

    async def read(self, window: Any) -> Any:
        """The merged panes of ``window`` (None: all empty), one read per pane."""
        first = self._first_pane(window)
        store = self.store
        values = await combine_all([store.async_get(j) for j in range(first, first + self.n)])
        return self._merged([v for v in values if v is not None])

    async def scan(self, window: Any) -> tuple[Any, int | None]:
        """``(merged panes of window, the smallest pane index after them or None)`` from
        one iteration of the key's panes (the chain mode: only live panes exist)."""
        first = self._first_pane(window)
        last = first + self.n
        entries = await (await self.store.async_entries()).on_next(_same)
        entries.sort(key=_pane_index)
        present = [v for j, v in entries if first <= j < last]
        later = [j for j, _ in entries if j >= first + self.r]
        return self._merged(present), (later[0] if later else None)

    def _merged(self, present: list[Any]) -> Any:
        return self.inner.merge_fresh(present) if present else None

    def clear(self, window: Any) -> Any:
        first = self._first_pane(window)
        return combine_all([self.store.async_remove(j) for j in range(first, first + self.r)])

    def elements(self, stored: Any) -> list[Any]:
        return self.inner.elements(stored)


def _same(item: Any) -> Any:
    return item


def _pane_index(entry: tuple[int, Any]) -> int:
    return entry[0]


async def on_record(function: Any, scope: Any, value: Any, timestamp: float, now: float,
                    watermark: float) -> bool:  # fmt: skip
    """A record of a sliding window kept as panes (the built-in trigger); False if late."""
    panes = function.contents
    pane = panes.pane(timestamp if function.event_time else now)
    first, last = panes.window_range(pane)
    grid = function.assigner.grid_window
    if function.is_late(grid(last), watermark):
        return False  # the pane's latest window is cleaned: so are all the others
    existed = await panes.add_pane(pane, value)
    if existed and grid(first).end > now:
        return True  # the pane's windows have their timers and none fires yet
    if panes.chain:
        if not existed:  # no lateness: no window of the pane fires now; start its chain
            k = first
            while function.is_late(grid(k), watermark):
                k += 1
            _register(function, scope.ctx, grid(k).end)
        return True
    for k in range(last, first - 1, -1):
        window = grid(k)
        if function.is_late(window, watermark):
            continue
        if function._builtin_element(scope, window, now):
            pending = function._emit(scope, window, await panes.read(window))
            if pending is not None:
                await pending
        if not existed:
            function._register_cleanup(scope, window)
    return True


async def on_chain_timer(function: Any, scope: Any, time: float) -> None:
    """The chain's firing: the window ending at ``time`` fires and goes; the next window
    holding a pane gets its timer."""
    panes, assigner = function.contents, function.assigner
    window = assigner.window_ending_at(time)
    if window is None:
        return
    stored, later = await panes.scan(window)
    if stored is not None:
        pending = function._emit(scope, window, stored)
        if pending is not None:
            await pending
        pending = function._clear_all(scope, window)
        if pending is not None:
            await pending
    if later is not None:
        k = round((window.start - assigner.offset) / assigner.slide) + 1
        _register(
            function, scope.ctx, assigner.grid_window(max(k, panes.window_range(later)[0])).end
        )


def _register(function: Any, ctx: Any, time: float) -> None:
    if function.event_time:
        ctx.timer_service.register_event_time_timer(time)
    else:
        ctx.timer_service.register_processing_time_timer(time)
