"""What a window holds, per key and window (Flink's window state: an
``AppendingState`` in the window's namespace).

One MapState ``window-contents`` per function, keyed by window: an
accumulator (``aggregate``), the reduced value (``reduce``), the list of
values, or, with an evictor, the list of ``(value, timestamp)`` pairs.
Sliding windows over an aggregate or reduce keep panes instead
(``aec.windowing.panes``). Values are the user's: ``object`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from aec.elements import Time
from aec.state.descriptors import AggregateFunction
from aec.state.future import StateFuture, combine_all
from aec.state.handles import MapState
from aec.windowing.windows import window_key


class Contents:
    """Holds each window's contents in ``store`` (a MapState handle keyed by window;
    None on the session path, whose contents live with the session set)."""

    keeps_timestamps = False

    def __init__(self, store: MapState | None) -> None:
        # Any: None on the session path, whose readers never read it
        self.store: MapState | Any = store

    def fold(self, stored: object, value: object, timestamp: Time) -> object:
        """``stored`` (None: empty) with one more record folded in."""
        raise NotImplementedError

    def merge(self, values: list[object]) -> object:
        """The contents of windows merged into one (sessions), oldest first."""
        raise NotImplementedError

    def elements(self, stored: object) -> list[object]:
        """The function's input: ``[result]`` or the list of values."""
        raise NotImplementedError

    def merge_fresh(self, values: list[object]) -> object:
        """``merge`` without changing any of ``values`` (they may be stored objects)."""
        return self.merge(values)

    async def add(self, window: object, value: object, timestamp: Time) -> bool:
        """Add a record to ``window``; True when the window held something before."""
        store, key = self.store, window_key(window)
        stored = await store.async_get(key)
        # not awaited: the write counts toward the record, and later requests queue after it
        store.async_put(key, self.fold(stored, value, timestamp))
        return stored is not None

    def read(self, window: object) -> StateFuture:
        """A future of the window's stored contents (None: empty)."""
        return self.store.async_get(window_key(window))

    def clear(self, window: object) -> StateFuture:
        return self.store.async_remove(window_key(window))

    def write(self, window: object, stored: object) -> StateFuture:
        return self.store.async_put(window_key(window), stored)

    async def merge_windows(self, target: object, sources: Sequence[object]) -> None:
        """Move the contents of ``sources`` into ``target`` (sessions)."""
        store = self.store
        values = await combine_all([store.async_get(window_key(w)) for w in [target, *sources]])
        present = [v for v in values if v is not None]
        await combine_all([store.async_remove(window_key(w)) for w in sources])
        if present:
            await store.async_put(window_key(target), self.merge(present))


class AggregateContents(Contents):
    """An ``AggregateFunction``'s accumulator per window."""

    def __init__(self, store: MapState | None, function: AggregateFunction) -> None:
        super().__init__(store)
        self.function = function

    def fold(self, stored: object, value: object, timestamp: Time) -> object:
        fn = self.function
        return fn.add(value, fn.create_accumulator() if stored is None else stored)

    def merge(self, values: list[object]) -> object:
        result = values[0]
        for value in values[1:]:
            result = self.function.merge(result, value)
        return result

    def elements(self, stored: object) -> list[object]:
        return [self.function.get_result(stored)]

    def merge_fresh(self, values: list[object]) -> object:
        fn = self.function
        result = fn.create_accumulator()
        for value in values:
            result = fn.merge(result, value)
        return result


class ReduceContents(Contents):
    """The reduced value per window (``reduce(a, b) -> a``)."""

    def __init__(self, store: MapState | None, function: Callable[[Any, Any], Any]) -> None:
        super().__init__(store)
        self.function = function

    def fold(self, stored: object, value: object, timestamp: Time) -> object:
        return value if stored is None else self.function(stored, value)

    def merge(self, values: list[object]) -> object:
        result = values[0]
        for value in values[1:]:
            result = self.function(result, value)
        return result

    def elements(self, stored: object) -> list[object]:
        return [stored]


class ListContents(Contents):
    """Every value of the window, in arrival order."""

    def fold(self, stored: object, value: object, timestamp: Time) -> object:
        return [value] if stored is None else [*cast(list[object], stored), value]

    def merge(self, values: list[object]) -> object:
        return [v for value in values for v in cast(list[object], value)]

    def elements(self, stored: object) -> list[object]:
        return list(cast(list[object], stored))


class EvictingContents(ListContents):
    """``(value, timestamp)`` pairs for an evictor; ``aggregate``/``reduce`` (if
    any) run over the kept values at each firing (Flink's ``EvictingWindowOperator``)."""

    keeps_timestamps = True

    def __init__(self, store: MapState | None, folder: Contents | None) -> None:
        super().__init__(store)
        self.folder = folder

    def fold(self, stored: object, value: object, timestamp: Time) -> object:
        pair = (value, timestamp)
        return [pair] if stored is None else [*cast(list[tuple[object, Time]], stored), pair]

    def elements(self, stored: object) -> list[object]:
        values = [value for value, _ in cast(list[tuple[object, Time]], stored)]
        folder = self.folder
        if folder is None:
            return values
        folded: object
        if isinstance(folder, AggregateContents):
            folded = folder.function.create_accumulator()  # Flink emits even an empty window's
        elif not values:
            return []
        else:
            folded = None
        for value in values:
            folded = folder.fold(folded, value, 0.0)
        return folder.elements(folded)
