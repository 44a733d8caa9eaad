"""What a window holds, per key and window (Flink's window state: an
``AppendingState`` in the window's namespace).

One MapState ``window-contents`` per function, keyed by window: an
accumulator (``aggregate``), the reduced value (``reduce``), the list of
values, or, with an evictor, the list of ``(value, timestamp)`` pairs.
``PaneContents`` keeps sliding windows as panes (slices) of
``gcd(size, slide)`` seconds keyed by pane index and merges a window's panes
when it fires: one state update per record instead of one per window (Flink
SQL's slicing window operators).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from aec.state.future import combine_all
from aec.windowing.windows import window_key

MAX_PANES_PER_WINDOW = 4096  # beyond this (odd float sizes) windows keep their own state


class Contents:
    """Holds each window's contents in ``store`` (a MapState handle keyed by window)."""

    keeps_timestamps = False

    def __init__(self, store: Any) -> None:
        self.store = store

    def fold(self, stored: Any, value: Any, timestamp: float) -> Any:
        raise NotImplementedError

    def merge(self, values: list[Any]) -> Any:
        raise NotImplementedError

    def elements(self, stored: Any) -> list[Any]:
        """The function's input: ``[result]`` or the list of values."""
        raise NotImplementedError

    def merge_fresh(self, values: list[Any]) -> Any:
        """``merge`` without changing any of ``values`` (they may be stored objects)."""
        return self.merge(values)

    async def add(self, window: Any, value: Any, timestamp: float) -> bool:
        """Add a record to ``window``; True when the window held something before."""
        store, key = self.store, window_key(window)
        stored = await store.async_get(key)
        await store.async_put(key, self.fold(stored, value, timestamp))
        return stored is not None

    def read(self, window: Any) -> Any:
        """A future of the window's stored contents (None: empty)."""
        return self.store.async_get(window_key(window))

    def clear(self, window: Any) -> Any:
        return self.store.async_remove(window_key(window))

    def write(self, window: Any, stored: Any) -> Any:
        return self.store.async_put(window_key(window), stored)

    async def merge_windows(self, target: Any, sources: list[Any]) -> None:
        """Move the contents of ``sources`` into ``target`` (sessions)."""
        store = self.store
        values = await combine_all([store.async_get(window_key(w)) for w in [target, *sources]])
        present = [v for v in values if v is not None]
        await combine_all([store.async_remove(window_key(w)) for w in sources])
        if present:
            await store.async_put(window_key(target), self.merge(present))


class AggregateContents(Contents):
    """An ``AggregateFunction``'s accumulator per window."""

    def __init__(self, store: Any, function: Any) -> None:
        super().__init__(store)
        self.function = function

    def fold(self, stored: Any, value: Any, timestamp: float) -> Any:
        fn = self.function
        return fn.add(value, fn.create_accumulator() if stored is None else stored)

    def merge(self, values: list[Any]) -> Any:
        result = values[0]
        for value in values[1:]:
            result = self.function.merge(result, value)
        return result

    def elements(self, stored: Any) -> list[Any]:
        return [self.function.get_result(stored)]

    def merge_fresh(self, values: list[Any]) -> Any:
        fn = self.function
        result = fn.create_accumulator()
        for value in values:
            result = fn.merge(result, value)
        return result


class ReduceContents(Contents):
    """The reduced value per window (``reduce(a, b) -> a``)."""

    def __init__(self, store: Any, function: Any) -> None:
        super().__init__(store)
        self.function = function

    def fold(self, stored: Any, value: Any, timestamp: float) -> Any:
        return value if stored is None else self.function(stored, value)

    def merge(self, values: list[Any]) -> Any:
        result = values[0]
        for value in values[1:]:
            result = self.function(result, value)
        return result

    def elements(self, stored: Any) -> list[Any]:
        return [stored]


class ListContents(Contents):
    """Every value of the window, in arrival order."""

    def fold(self, stored: Any, value: Any, timestamp: float) -> Any:
        return [value] if stored is None else [*stored, value]

    def merge(self, values: list[Any]) -> Any:
        return [v for value in values for v in value]

    def elements(self, stored: Any) -> list[Any]:
        return list(stored)


class EvictingContents(ListContents):
    """``(value, timestamp)`` pairs for an evictor; ``aggregate``/``reduce`` (if
    any) run over the kept values at each firing (Flink's ``EvictingWindowOperator``)."""

    keeps_timestamps = True

    def __init__(self, store: Any, folder: Contents | None) -> None:
        super().__init__(store)
        self.folder = folder

    def fold(self, stored: Any, value: Any, timestamp: float) -> Any:
        return [(value, timestamp)] if stored is None else [*stored, (value, timestamp)]

    def elements(self, stored: Any) -> list[Any]:
        values = [value for value, _ in stored]
        folder = self.folder
        if folder is None:
            return values
        if isinstance(folder, AggregateContents):
            folded = folder.function.create_accumulator()  # Flink emits even an empty window's
        elif not values:
            return []
        else:
            folded = None
        for value in values:
            folded = folder.fold(folded, value, 0.0)
        return folder.elements(folded)


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

    def __init__(self, inner: Contents, assigner: Any, g: Fraction) -> None:
        self.inner = inner
        self.store = inner.store
        self.assigner = assigner
        self.g = float(g)
        self.n = int(Fraction(assigner.size) / g)
        self.r = int(Fraction(assigner.slide) / g)

    def pane(self, timestamp: float) -> int:
        offset, g = self.assigner.offset, self.g
        j = math.floor((timestamp - offset) / g)
        if offset + j * g > timestamp:
            j -= 1
        elif offset + (j + 1) * g <= timestamp:
            j += 1
        return j

    def windows_of_pane(self, j: int) -> list[Any]:
        """The windows holding pane ``j``, latest start first (like ``assign_windows``)."""
        r, n = self.r, self.n
        first = -((n - 1 - j) // r)  # ceil((j - n + 1) / r)
        grid = self.assigner.grid_window
        return [grid(k) for k in range(j // r, first - 1, -1)]

    def _first_pane(self, window: Any) -> int:
        return round((window.start - self.assigner.offset) / self.assigner.slide) * self.r

    async def add_pane(self, j: int, value: Any) -> bool:
        store = self.store
        stored = await store.async_get(j)
        await store.async_put(j, self.inner.fold(stored, value, 0.0))
        return stored is not None

    async def read(self, window: Any) -> Any:
        first = self._first_pane(window)
        store = self.store
        values = await combine_all([store.async_get(j) for j in range(first, first + self.n)])
        present = [v for v in values if v is not None]
        return self.inner.merge_fresh(present) if present else None

    def clear(self, window: Any) -> Any:
        first = self._first_pane(window)
        return combine_all([self.store.async_remove(j) for j in range(first, first + self.r)])

    def elements(self, stored: Any) -> list[Any]:
        return self.inner.elements(stored)
