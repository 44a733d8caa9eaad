"""Evictors: drop values from a window before or after its function runs (Flink's
``Evictor``, ``CountEvictor``, ``TimeEvictor``).

A window with an evictor keeps its values as ``(value, timestamp)`` pairs; at
each firing ``evict_before`` and ``evict_after`` return the pairs to keep.
"""

from __future__ import annotations

import math
from typing import Any

Pairs = list[tuple[Any, float]]
"""A window's kept values with their timestamps (seconds), in the window's order: arrival
order; after a session merge, the merged windows' values by window start, then the
values that arrive later (Flink leaves that order undefined)."""


class Evictor:
    """Base class. ``do_evict_after``: evict after the function instead of before."""

    def __init__(self, do_evict_after: bool = False) -> None:
        self.do_evict_after = bool(do_evict_after)

    def evict(self, elements: Pairs, window: Any) -> Pairs:
        """The ``(value, timestamp)`` pairs to keep (``window``: the firing one)."""
        raise NotImplementedError

    def evict_before(self, elements: Pairs, window: object) -> Pairs:
        return elements if self.do_evict_after else self.evict(elements, window)

    def evict_after(self, elements: Pairs, window: object) -> Pairs:
        return self.evict(elements, window) if self.do_evict_after else elements


class CountEvictor(Evictor):
    """Keeps the last ``n`` values of the window (in the window's order: ``Pairs``).

    Raises:
        ValueError: ``n < 1``.
    """

    def __init__(self, n: int, do_evict_after: bool = False) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"CountEvictor.of: n must be an int, got {n!r}")
        if n < 1:
            raise ValueError(f"CountEvictor.of: n must be >= 1, got {n!r}")
        super().__init__(do_evict_after)
        self.n = n

    @classmethod
    def of(cls, n: int, do_evict_after: bool = False) -> CountEvictor:
        return cls(n, do_evict_after)

    def evict(self, elements: Pairs, window: object) -> Pairs:
        return elements[-self.n :]

    def __repr__(self) -> str:
        return f"CountEvictor.of({self.n}, do_evict_after={self.do_evict_after})"


class TimeEvictor(Evictor):
    """Keeps the values whose timestamp is > (the window's newest timestamp -
    ``window_size`` seconds).

    Raises:
        ValueError: ``window_size`` <= 0.
    """

    def __init__(self, window_size: float, do_evict_after: bool = False) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, (int, float)):
            raise TypeError(f"TimeEvictor.of: window_size must be seconds, got {window_size!r}")
        if not (window_size > 0 and math.isfinite(window_size)):
            raise ValueError(
                f"TimeEvictor.of: window_size must be > 0 seconds, got {window_size!r}"
            )
        super().__init__(do_evict_after)
        self.window_size = window_size

    @classmethod
    def of(cls, window_size: float, do_evict_after: bool = False) -> TimeEvictor:
        return cls(window_size, do_evict_after)

    def evict(self, elements: Pairs, window: object) -> Pairs:
        if not elements:
            return elements
        cutoff = max(t for _, t in elements) - self.window_size
        return [(v, t) for v, t in elements if t > cutoff]

    def __repr__(self) -> str:
        return f"TimeEvictor.of({self.window_size!r}, do_evict_after={self.do_evict_after})"
