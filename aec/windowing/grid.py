"""The window grid: where time windows start and end, as pure arithmetic.

Tumbling and sliding windows lie on the grid ``start = offset + k * slide``,
``end = start + size`` (an integer index ``k``; tumbling: ``slide == size``). Every
time window of the package is computed here from its index, never as ``t - t % size``
(float drift), so a window rebuilt from a timer's time is bit-for-bit the window a
record was put in. A tumbling slot takes the contract's start formula as written:
``offset + floor((t - offset) / slide) * slide``, evaluated in floats, no nudging
(``slot``, ``index``), or exactly when all are ints. Sliding windows and panes follow the contract's rule that
their bounds hold ``t`` as the floats compute them (``_holding_index``).

Sliding windows over an aggregate or a reduce are kept as panes (slices) of
``g = gcd(size, slide)`` seconds (``Panes``, Flink SQL's slicing): pane ``j`` holds
``offset + j * g <= t < offset + (j + 1) * g``; window ``k`` is panes
``k * r .. k * r + n - 1`` with ``r = slide / g`` and ``n = size / g``; the first
``r`` of them are its last-use panes (no later window holds them). ``Panes.chain``
is the chain of firings of a key's windows over its live panes.

Nothing here reads state or registers timers: the drivers do, with these answers.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from fractions import Fraction

from aec.elements import Time
from aec.windowing.windows import TimeWindow

MAX_PANES_PER_WINDOW = 4096  # beyond this (odd float sizes) windows keep their own state
_EXACT_STEPS = 2**52  # grid steps from the offset whose bounds a float still tells apart

Fired = tuple[Time, Time, int, int, int]
"""A window of a chain firing: ``(start, end, lo, hi, cut)``; it merges the live panes
``indexes[lo:hi]`` and ``indexes[lo:cut]`` are its last-use panes (see ``Panes.chain``)."""


def _floor_index(timestamp: Time, offset: Time, step: Time) -> int:
    """``floor((timestamp - offset) / step)``, exact when all three are ints (nanosecond
    timestamps beyond 2**53); ValueError naming a timestamp that is not a finite number
    (no window or pane holds it). An ``int`` subclass is an int here: beyond 2**53 it
    must not round either."""
    if isinstance(timestamp, int) and isinstance(offset, int) and isinstance(step, int):
        return int(timestamp - offset) // int(step)
    try:
        index: int = math.floor((timestamp - offset) / step)
        return index
    except (OverflowError, ValueError):
        raise ValueError(
            f"timestamp {timestamp!r} is not a finite number: time windows need one"
        ) from None


def _holding_index(timestamp: Time, offset: Time, step: Time) -> int:
    """The ``k`` with ``offset + k * step <= timestamp < offset + (k + 1) * step`` as the
    floats compute those bounds: the floor of the quotient, corrected when it rounded
    up (a timestamp just below a start) or down (one exactly on a start, as 4.1 on the
    grid ``0.1 + k``). ValueError as ``_floor_index``. Exact when all three are ints."""
    if isinstance(timestamp, int) and isinstance(offset, int) and isinstance(step, int):
        return int(timestamp - offset) // int(step)
    try:  # _floor_index's floor, inline: the pane path asks once per record
        k: int = math.floor((timestamp - offset) / step)
    except (OverflowError, ValueError):
        return _floor_index(timestamp, offset, step)  # raises, naming the timestamp
    if not -_EXACT_STEPS < k < _EXACT_STEPS:  # the bounds below would not move (or hang)
        raise ValueError(
            f"timestamp {timestamp!r} is {k} steps of {step!r} s from the window grid's "
            f"offset, beyond the 2**52 a float counts exactly: give timestamps in seconds "
            "(not nanoseconds), or larger windows"
        )
    while offset + k * step > timestamp:
        k -= 1
    while offset + (k + 1) * step <= timestamp:
        k += 1
    return k


class Grid:
    """Windows of ``size`` seconds starting every ``slide`` seconds at ``offset + k * slide``
    (all in seconds; ``slide == size``: tumbling). Immutable.

    >>> g = Grid(0, 300, 3600)
    >>> g.index(4000.0), g.slot(4000.0), g.ending_at(7800.0)
    (13, (3900.0, 7500.0), 14)
    """

    __slots__ = ("offset", "slide", "size")

    def __init__(self, offset: Time, slide: Time, size: Time) -> None:
        self.offset = offset
        self.slide = slide
        self.size = size

    def index(self, timestamp: Time) -> int:
        """The index of the latest window starting at or before ``timestamp`` (seconds):
        ``floor((timestamp - offset) / slide)``. O(1). Raises ValueError naming an
        infinite or NaN timestamp."""
        return _floor_index(timestamp, self.offset, self.slide)

    def start(self, k: int) -> Time:
        """The start of window ``k``: ``offset + k * slide``."""
        return self.offset + k * self.slide

    def end(self, k: int) -> Time:
        """The end of window ``k``: its start plus ``size`` (exclusive; it fires there)."""
        return self.offset + k * self.slide + self.size

    def slot(self, timestamp: Time) -> tuple[Time, Time]:
        """``(start, end)`` of the latest window starting at or before ``timestamp``: a
        tumbling window's (the map key of its contents)."""
        offset, slide = self.offset, self.slide
        start = offset + _floor_index(timestamp, offset, slide) * slide  # index's, one call
        return start, start + self.size

    def window(self, k: int) -> TimeWindow:
        """Window ``k`` as a ``TimeWindow``."""
        start = self.offset + k * self.slide
        return TimeWindow.trusted(start, start + self.size)

    def windows(self, timestamp: Time) -> list[TimeWindow]:
        """Every window holding ``timestamp``, the latest start first (Flink's
        ``SlidingEventTimeWindows.assignWindows``): ``size / slide`` windows, rounded."""
        k = _holding_index(timestamp, self.offset, self.slide)
        windows: list[TimeWindow] = []
        while True:
            window = self.window(k)
            if window.end <= timestamp:
                return windows
            windows.append(window)
            k -= 1

    def ending_near(self, end: Time) -> int:
        """The index of the window whose end is nearest ``end`` (``end`` finite; exact
        when all are ints)."""
        start, slide = end - self.size - self.offset, self.slide
        if isinstance(start, int) and isinstance(slide, int):
            return int(2 * start + slide) // int(2 * slide)
        k: int = round(start / slide)
        return k

    def ending_at(self, end: Time) -> int | None:
        """The index of the window whose end is exactly ``end``, or None (``end`` finite)."""
        k = self.ending_near(end)
        return k if self.end(k) == end else None

    def first_open(self, k: int, time: Time) -> int:
        """The first index ``>= k`` whose window ends after ``time``: the first window a
        watermark (or clock reading) ``time`` has not fired yet. O(1): an estimate, then
        the float boundary checked both ways. Raises ValueError for ``time = inf``."""
        if time == math.inf:
            raise ValueError("no window ends after inf")
        if time == -math.inf:
            return k
        offset, slide, size = self.offset, self.slide, self.size
        lowest = k
        k = max(k, math.floor((time - offset - size) / slide))
        while offset + k * slide + size <= time:
            k += 1
        while k > lowest and offset + (k - 1) * slide + size > time:
            k -= 1  # float rounding of the estimate
        return k

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.offset!r}, {self.slide!r}, {self.size!r})"

    def __reduce__(self) -> tuple[type[Grid], tuple[Time, Time, Time]]:
        # the compiled class pickles only through its constructor's arguments
        return Grid, (self.offset, self.slide, self.size)


def pane_size(size: Time, slide: Time) -> Fraction | None:
    """``gcd(size, slide)`` as an exact fraction (exact on the binary fractions of the
    floats), or None when a window would span more than ``MAX_PANES_PER_WINDOW`` panes."""
    a, b = Fraction(size), Fraction(slide)
    denominator = math.lcm(a.denominator, b.denominator)
    g = Fraction(math.gcd(int(a * denominator), int(b * denominator)), denominator)
    return g if a / g <= MAX_PANES_PER_WINDOW else None


class Panes(Grid):
    """A sliding grid cut into panes of ``g = gcd(size, slide)`` seconds (see the module).

    >>> p = Panes(Grid(0, 300, 3600), Fraction(300))
    >>> p.pane(4000.0), p.windows_of(13), p.due(13)
    (13, (2, 13), 4200.0)
    """

    __slots__ = ("g", "n", "r")

    def __init__(self, grid: Grid, g: Fraction) -> None:
        super().__init__(grid.offset, grid.slide, grid.size)
        # an int pane of an int grid keeps int timestamps exact (nanoseconds beyond 2**53)
        whole = all(isinstance(v, int) for v in (grid.offset, grid.slide, grid.size))
        self.g: Time = int(g) if whole and g.denominator == 1 else float(g)
        self.n = int(Fraction(grid.size) / g)  # panes per window
        self.r = int(Fraction(grid.slide) / g)  # panes per slide

    def __reduce__(self) -> tuple[type[Panes], tuple[Grid, Fraction]]:  # type: ignore[override]
        return Panes, (Grid(self.offset, self.slide, self.size), Fraction(self.g))

    def pane(self, timestamp: Time) -> int:
        """The index ``j`` of the pane holding ``timestamp``: ``offset + j * g <= t <
        offset + (j + 1) * g`` (the float estimate checked both ways)."""
        return _holding_index(timestamp, self.offset, self.g)

    def windows_of(self, j: int) -> tuple[int, int]:
        """Grid indexes ``(first, last)`` of the windows holding pane ``j``."""
        return -((self.n - 1 - j) // self.r), j // self.r  # ceil((j - n + 1) / r), floor(j / r)

    def first_window(self, j: int) -> int:
        """The index of the first window holding pane ``j``: ``ceil((j - n + 1) / r)``."""
        return -((self.n - 1 - j) // self.r)

    def due(self, j: int) -> Time:
        """When pane ``j`` is first read: the end of its first window."""
        return self.offset + -((self.n - 1 - j) // self.r) * self.slide + self.size

    def chain(self, indexes: list[int], k: int, due: Time) -> tuple[list[Fired], Time | None]:
        """A chain firing: window ``k`` and, in order, every later window holding one of a
        key's live panes ``indexes`` (ascending; none lies before window ``k``, whose
        predecessors fired and took their last-use panes) whose end is at or before
        ``due`` (seconds).

        Returns ``(fired, next_end)``: ``fired`` lists ``(start, end, lo, hi, cut)`` per
        window that holds a pane, in order of end: it merges ``indexes[lo:hi]`` and its
        last-use panes ``indexes[lo:cut]`` go (the next window's ``lo`` is this ``cut``);
        ``next_end`` is the end of the first window holding a pane that does not fire
        (the chain's next timer), None when no pane is left. O(windows fired + log panes).
        """
        offset, slide, size, n, r = self.offset, self.slide, self.size, self.n, self.r
        fired: list[Fired] = []
        i, m = 0, len(indexes)
        while True:
            start = offset + k * slide
            end = start + size  # as Grid.end computes it: bit-for-bit the same
            if end > due:
                return fired, end
            first = k * r
            hi = bisect_left(indexes, first + n, i)
            if hi > i:
                lo, cut = i, first + r
                while i < m and indexes[i] < cut:
                    i += 1
                fired.append((start, end, lo, hi, i))
            if i == m:
                return fired, None
            k = max(k + 1, -((n - 1 - indexes[i]) // r))  # the first window of the next pane
