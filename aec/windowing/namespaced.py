"""State per key *and window* (Flink's namespaced ``InternalKeyedState``).

A namespaced state is one MapState of the key whose map key is the window: a
window's state is one entry, so reading or clearing it touches only that
entry, never the key's other windows. The handles below give the State V2 API
(``async_*`` returning StateFutures, and the blocking forms) for one window;
``merge_into`` folds the entries of merged windows into their cover (sessions).

Each operation is a read of the entry, a pure change of its value, and a write: the
change is written once (``_added``, ``_reduced``, ...) and both forms call it, the
async one over the entry's futures, the blocking one over the store's blocking calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar, overload

from aec.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.future import StateFuture, combine_all, completed_future
from aec.state.handles import MapState, StateIterator
from aec.windowing.windows import window_key

D = TypeVar("D", bound=StateDescriptor)


class _WindowEntry(Generic[D]):
    """One window's entry of a namespaced state ``store`` (a MapState handle)."""

    __slots__ = ("descriptor", "_store", "_window")

    def __init__(self, descriptor: D, store: MapState, window: object) -> None:
        self.descriptor = descriptor
        self._store = store
        self._window = window_key(window)

    def _read(self) -> StateFuture:
        return self._store.async_get(self._window)

    def _write(self, value: object) -> StateFuture:
        if value is None:
            return self._store.async_remove(self._window)
        return self._store.async_put(self._window, value)

    def _change(self, change: Callable[[Any], object]) -> StateFuture:
        """Read the entry, write ``change(value)`` (None removes it)."""
        return self._read().then_compose(lambda old: self._write(change(old)))

    def _read_now(self) -> Any:
        return self._store.get(self._window)

    def _write_now(self, value: object) -> None:
        if value is None:
            self._store.remove(self._window)
        else:
            self._store.put(self._window, value)

    def async_clear(self) -> StateFuture:
        return self._store.async_remove(self._window)

    def clear(self) -> None:
        self._store.remove(self._window)


class WindowValueState(_WindowEntry[ValueStateDescriptor]):
    __slots__ = ()

    def _or_default(self, value: object) -> object:
        return self.descriptor.default if value is None else value

    def async_value(self) -> StateFuture:
        return self._read().then_apply(self._or_default)

    def async_update(self, value: object) -> StateFuture:
        return self._write(value)

    def value(self) -> object:
        return self._or_default(self._read_now())

    def update(self, value: object) -> None:
        self._write_now(value)


class WindowListState(_WindowEntry[ListStateDescriptor]):
    __slots__ = ()

    def async_get(self) -> StateFuture:
        return self._read().then_apply(_iterator)

    def async_add(self, value: object) -> StateFuture:
        return self._change(lambda old: [*(old or ()), value])

    def async_add_all(self, values: Iterable[object]) -> StateFuture:
        values = list(values)
        return self._change(lambda old: [*(old or ()), *values] or None)

    def async_update(self, values: Iterable[object] | None) -> StateFuture:
        return self._write(list(values or ()) or None)

    def get(self) -> StateIterator:
        return _iterator(self._read_now())

    def add(self, value: object) -> None:
        self._write_now([*(self._read_now() or ()), value])

    def add_all(self, values: Iterable[object]) -> None:
        self._write_now([*(self._read_now() or ()), *values] or None)

    def update(self, values: Iterable[object] | None) -> None:
        self._write_now(list(values or ()) or None)


def _iterator(stored: Iterable[object] | None) -> StateIterator:
    return StateIterator(list(stored or ()))


class WindowReducingState(_WindowEntry[ReducingStateDescriptor]):
    __slots__ = ()

    def _reduced(self, old: object, value: object) -> object:
        return value if old is None else self.descriptor.reduce_function(old, value)

    def async_get(self) -> StateFuture:
        return self._read()

    def async_add(self, value: object) -> StateFuture:
        return self._change(lambda old: self._reduced(old, value))

    def get(self) -> object:
        return self._read_now()

    def add(self, value: object) -> None:
        self._write_now(self._reduced(self._read_now(), value))


class WindowAggregatingState(_WindowEntry[AggregatingStateDescriptor]):
    __slots__ = ()

    def _result(self, accumulator: object) -> object:
        fn = self.descriptor.aggregate_function
        return None if accumulator is None else fn.get_result(accumulator)

    def _added(self, accumulator: object, value: object) -> object:
        fn = self.descriptor.aggregate_function
        return fn.add(value, fn.create_accumulator() if accumulator is None else accumulator)

    def async_get(self) -> StateFuture:
        return self._read().then_apply(self._result)

    def async_add(self, value: object) -> StateFuture:
        return self._change(lambda acc: self._added(acc, value))

    def get(self) -> object:
        return self._result(self._read_now())

    def add(self, value: object) -> None:
        self._write_now(self._added(self._read_now(), value))


class WindowMapState(_WindowEntry[MapStateDescriptor]):
    """A map per window, held as one dict entry (read and rewritten whole); the async
    API only."""

    __slots__ = ()

    def _map(self) -> StateFuture:
        return self._read().then_apply(lambda v: dict(v or {}))

    def _edit(self, change: Callable[[dict[Any, Any]], object]) -> StateFuture:
        def apply(current: dict[Any, Any]) -> StateFuture:
            change(current)
            return self._write(current or None)

        return self._map().then_compose(apply)

    def async_get(self, user_key: object) -> StateFuture:
        return self._map().then_apply(lambda m: m.get(user_key))

    def async_put(self, user_key: object, value: object) -> StateFuture:
        return self._edit(lambda m: m.__setitem__(user_key, value))

    def async_put_all(self, entries: dict[Any, Any]) -> StateFuture:
        return self._edit(lambda m: m.update(entries))

    def async_remove(self, user_key: object) -> StateFuture:
        return self._edit(lambda m: m.pop(user_key, None))

    def async_contains(self, user_key: object) -> StateFuture:
        return self._map().then_apply(lambda m: user_key in m)

    def async_is_empty(self) -> StateFuture:
        return self._map().then_apply(lambda m: not m)

    def async_entries(self) -> StateFuture:
        return self._map().then_apply(lambda m: StateIterator(list(m.items())))

    def async_keys(self) -> StateFuture:
        return self._map().then_apply(lambda m: StateIterator(list(m)))

    def async_values(self) -> StateFuture:
        return self._map().then_apply(lambda m: StateIterator(list(m.values())))


WindowHandle = (
    WindowValueState | WindowListState | WindowMapState | WindowReducingState
    | WindowAggregatingState
)  # fmt: skip

_KINDS: dict[type[StateDescriptor], type[_WindowEntry[Any]]] = {
    ValueStateDescriptor: WindowValueState,
    ListStateDescriptor: WindowListState,
    MapStateDescriptor: WindowMapState,
    ReducingStateDescriptor: WindowReducingState,
    AggregatingStateDescriptor: WindowAggregatingState,
}


@overload
def window_handle(
    descriptor: ValueStateDescriptor, store: MapState, window: object
) -> WindowValueState: ...
@overload
def window_handle(
    descriptor: ListStateDescriptor, store: MapState, window: object
) -> WindowListState: ...
@overload
def window_handle(
    descriptor: MapStateDescriptor, store: MapState, window: object
) -> WindowMapState: ...
@overload
def window_handle(
    descriptor: ReducingStateDescriptor, store: MapState, window: object
) -> WindowReducingState: ...
@overload
def window_handle(
    descriptor: AggregatingStateDescriptor, store: MapState, window: object
) -> WindowAggregatingState: ...
@overload
def window_handle(descriptor: StateDescriptor, store: MapState, window: object) -> Any: ...


def window_handle(descriptor: StateDescriptor, store: MapState, window: object) -> Any:
    """The per-window handle of ``descriptor`` over ``store`` (its MapState); TypeError
    for an object that is no state descriptor."""
    for kind in type(descriptor).__mro__:
        handle = _KINDS.get(kind)
        if handle is not None:
            return handle(descriptor, store, window)
    raise TypeError(f"get_state takes a state descriptor, got {type(descriptor).__name__}")


def merge_values(descriptor: StateDescriptor, values: list[Any]) -> object:
    """Fold the entries of merged windows (oldest first) into one entry; None if
    all are absent. Reducing: the reduce function; aggregating: ``merge``; list:
    concatenation; map: union. ValueState cannot merge (TypeError, as in Flink)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    fold: Callable[[Any, Any], object]
    if isinstance(descriptor, ReducingStateDescriptor):
        fold = descriptor.reduce_function
    elif isinstance(descriptor, AggregatingStateDescriptor):
        fold = descriptor.aggregate_function.merge
    elif isinstance(descriptor, ListStateDescriptor):
        return [v for value in present for v in value]
    elif isinstance(descriptor, MapStateDescriptor):
        return {k: v for value in present for k, v in value.items()}
    else:
        raise TypeError(f"state {descriptor.name!r}: a ValueState cannot be merged")
    result = present[0]
    for value in present[1:]:
        result = fold(result, value)
    return result


def merge_into(
    descriptor: StateDescriptor, store: MapState, target: object, sources: Sequence[object]
) -> StateFuture:
    """Merge the entries of ``sources`` windows into ``target``'s and remove theirs."""
    if not sources:
        return completed_future(None)
    keys = [window_key(w) for w in sources]
    reads = combine_all([store.async_get(k) for k in [window_key(target), *keys]])

    def write(values: list[object]) -> StateFuture:
        merged = merge_values(descriptor, values)
        writes = [store.async_remove(k) for k in keys]
        if merged is not None:
            writes.append(store.async_put(window_key(target), merged))
        return combine_all(writes)

    return reads.then_compose(write)
