"""The session cover: the merging-window set of a key (Flink's ``MergingWindowSet`` with
``TimeWindow.mergeWindows``), as a plain list the operator keeps in ValueState.

Windows merge when they intersect or touch: ``a.start <= b.end and a.end >= b.start``
(``TimeWindow.intersects``, ``aec.windowing.intervals.touch``). The set's windows never
intersect each other, so a new window merges with the ones it intersects into their
cover.
"""

from __future__ import annotations

from typing import Any

from aec.windowing.intervals import touch
from aec.windowing.windows import TimeWindow


def add_session(
    sessions: list[TimeWindow], window: TimeWindow
) -> tuple[TimeWindow, list[TimeWindow]]:
    """Add ``window`` to ``sessions`` (a list, changed in place, kept sorted by start).

    Returns ``(actual, merged)``: the window the record belongs to and the
    existing windows merged into it. ``merged`` is empty when the window is new
    or lies inside one existing window (no merge, as in Flink: a pre-existing
    window merged only with the new one and not extended is not a merge).

    Raises TypeError when ``window`` is not a ``TimeWindow`` (a subclass's is one):
    sessions merge by its ``intersects`` and ``cover``.
    """
    if type(window) is not TimeWindow and not isinstance(window, TimeWindow):
        raise TypeError(
            f"a merging window assigner must give TimeWindows (or a subclass's), got "
            f"{window!r:.200} ({type(window).__name__}): sessions merge by TimeWindow's "
            "intersects and cover"
        )
    start, end = window.start, window.end
    # the rule on the numbers, not a method call per held window (compiled: no call into
    # the interpreted dataclass; a subclass's own intersects is asked); positions, so
    # merged windows leave without an __eq__ each
    at = [
        i
        for i, w in enumerate(sessions)
        if (touch(w.start, w.end, start, end) if type(w) is TimeWindow else w.intersects(window))
    ]
    if not at:
        _insert(sessions, window)
        return window, []
    touching = [sessions[i] for i in at]
    cover = window
    for other in touching:
        cover = cover.cover(other)
    first: Any = touching[0]  # untyped: a 3.13 dataclass __eq__ gives numpy.bool
    if len(touching) == 1 and first == cover:
        return cover, []
    for i in reversed(at):
        del sessions[i]
    _insert(sessions, cover)
    return cover, touching


def _insert(sessions: list[TimeWindow], window: TimeWindow) -> None:
    """Insert by (start, end): the numbers, so windows of two classes (a TimeWindow and
    a subclass's, whose dataclass order refuses the other) compare too."""
    position = len(sessions)
    held: Any = sessions
    # untyped: numpy times compare to numpy.bool, which compiled code refuses as a bool
    key: Any = (window.start, window.end)
    while position and key < (held[position - 1].start, held[position - 1].end):
        position -= 1
    sessions.insert(position, window)


def decode_sessions(held: tuple[object, ...] | None) -> list[TimeWindow]:
    """The session set as stored (``window-sessions``) -> a list of windows.

    Stored as ``(start, end)`` pairs (``encode_sessions``): plain tuples encode
    cheaply, a frozen dataclass does not (pickled on RocksDB: a third of the set's cost).
    Sets written as ``TimeWindow`` objects (checkpoints of earlier versions) still read.
    """
    if not held:
        return []
    trusted = TimeWindow.trusted
    return [trusted(w[0], w[1]) if type(w) is tuple else w for w in held]  # type: ignore[misc]


def encode_sessions(sessions: list[TimeWindow]) -> tuple[object, ...] | None:
    """A list of windows -> the stored session set (None: empty, the state is cleared);
    windows of custom assigners are kept as they are."""
    return tuple((w.start, w.end) if type(w) is TimeWindow else w for w in sessions) or None
