"""State per key *and window* (Flink's namespaced ``InternalKeyedState``).

A namespaced state is one MapState of the key whose map key is the window: a
window's state is one entry, so reading or clearing it touches only that
entry, never the key's other windows. The handles below give the State V2 API
(``async_*`` returning StateFutures) for one window; ``merge_into`` folds the
entries of merged windows into their cover (sessions).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from aec.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.future import StateFuture, combine_all, completed_future
from aec.state.handles import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    StateIterator,
    ValueState,
)
from aec.windowing.windows import window_key

D = TypeVar("D", bound=StateDescriptor)


class _WindowEntry(Generic[D]):
    """One window's entry of a namespaced state ``store`` (a MapState handle)."""

    __slots__ = ("descriptor", "_store", "_window")

    def __init__(self, descriptor: D, store: MapState, window: Any) -> None:
        self.descriptor = descriptor
        self._store = store
        self._window = window_key(window)

    def _read(self) -> StateFuture:
        return self._store.async_get(self._window)

    def _write(self, value: Any) -> StateFuture:
        if value is None:
            return self._store.async_remove(self._window)
        return self._store.async_put(self._window, value)

    def async_clear(self) -> StateFuture:
        return self._store.async_remove(self._window)

    def _wait(self, future: StateFuture) -> Any:
        return self._store._wait(future)

    def clear(self) -> None:
        self._wait(self.async_clear())


class WindowValueState(_WindowEntry[ValueStateDescriptor]):
    __slots__ = ()

    def async_value(self) -> StateFuture:
        default = self.descriptor.default
        return self._read().then_apply(lambda v: default if v is None else v)

    def async_update(self, value: Any) -> StateFuture:
        return self._write(value)

    value = ValueState.value  # the blocking forms: the engine handles' own
    update = ValueState.update


class WindowListState(_WindowEntry[ListStateDescriptor]):
    __slots__ = ()

    def async_get(self) -> StateFuture:
        return self._read().then_apply(lambda v: StateIterator(list(v or ())))

    def async_add(self, value: Any) -> StateFuture:
        return self._read().then_compose(lambda old: self._write([*(old or ()), value]))

    def async_add_all(self, values: Iterable[Any]) -> StateFuture:
        values = list(values)
        return self._read().then_compose(lambda old: self._write([*(old or ()), *values] or None))

    def async_update(self, values: Iterable[Any] | None) -> StateFuture:
        return self._write(list(values or ()) or None)

    get = ListState.get
    add = ListState.add
    add_all = ListState.add_all
    update = ListState.update


class WindowReducingState(_WindowEntry[ReducingStateDescriptor]):
    __slots__ = ()

    def async_get(self) -> StateFuture:
        return self._read()

    def async_add(self, value: Any) -> StateFuture:
        reduce = self.descriptor.reduce_function
        return self._read().then_compose(
            lambda old: self._write(value if old is None else reduce(old, value))
        )

    get = ReducingState.get
    add = ReducingState.add


class WindowAggregatingState(_WindowEntry[AggregatingStateDescriptor]):
    __slots__ = ()

    def async_get(self) -> StateFuture:
        fn = self.descriptor.aggregate_function
        return self._read().then_apply(lambda acc: None if acc is None else fn.get_result(acc))

    def async_add(self, value: Any) -> StateFuture:
        fn = self.descriptor.aggregate_function
        return self._read().then_compose(
            lambda acc: self._write(fn.add(value, fn.create_accumulator() if acc is None else acc))
        )

    get = AggregatingState.get
    add = AggregatingState.add


class WindowMapState(_WindowEntry[MapStateDescriptor]):
    """A map per window, held as one dict entry (read and rewritten whole)."""

    __slots__ = ()

    def _map(self) -> StateFuture:
        return self._read().then_apply(lambda v: dict(v or {}))

    def _change(self, change: Any) -> StateFuture:
        def apply(current: dict[Any, Any]) -> StateFuture:
            change(current)
            return self._write(current or None)

        return self._map().then_compose(apply)

    def async_get(self, user_key: Any) -> StateFuture:
        return self._map().then_apply(lambda m: m.get(user_key))

    def async_put(self, user_key: Any, value: Any) -> StateFuture:
        return self._change(lambda m: m.__setitem__(user_key, value))

    def async_put_all(self, entries: dict[Any, Any]) -> StateFuture:
        return self._change(lambda m: m.update(entries))

    def async_remove(self, user_key: Any) -> StateFuture:
        return self._change(lambda m: m.pop(user_key, None))

    def async_contains(self, user_key: Any) -> StateFuture:
        return self._map().then_apply(lambda m: user_key in m)

    def async_is_empty(self) -> StateFuture:
        return self._map().then_apply(lambda m: not m)

    def async_entries(self) -> StateFuture:
        return self._map().then_apply(lambda m: StateIterator(list(m.items())))

    def async_keys(self) -> StateFuture:
        return self._map().then_apply(lambda m: StateIterator(list(m)))

    def async_values(self) -> StateFuture:
        return self._map().then_apply(lambda m: StateIterator(list(m.values())))


_KINDS: dict[type, type] = {
    ValueStateDescriptor: WindowValueState,
    ListStateDescriptor: WindowListState,
    MapStateDescriptor: WindowMapState,
    ReducingStateDescriptor: WindowReducingState,
    AggregatingStateDescriptor: WindowAggregatingState,
}


def handle_kind(descriptor: StateDescriptor) -> type:
    """The per-window handle class for ``descriptor``; TypeError for other objects."""
    for kind in type(descriptor).__mro__:
        if kind in _KINDS:
            return _KINDS[kind]
    raise TypeError(f"get_state takes a state descriptor, got {type(descriptor).__name__}")


def merge_values(descriptor: StateDescriptor, values: list[Any]) -> Any:
    """Fold the entries of merged windows (oldest first) into one entry; None if
    all are absent. Reducing: the reduce function; aggregating: ``merge``; list:
    concatenation; map: union. ValueState cannot merge (TypeError, as in Flink)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
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
    descriptor: StateDescriptor, store: Any, target: Any, sources: list[Any]
) -> StateFuture:
    """Merge the entries of ``sources`` windows into ``target``'s and remove theirs."""
    if not sources:
        return completed_future(None)
    keys = [window_key(w) for w in sources]
    reads = combine_all([store.async_get(k) for k in [window_key(target), *keys]])

    def write(values: list[Any]) -> StateFuture:
        merged = merge_values(descriptor, values)
        writes = [store.async_remove(k) for k in keys]
        if merged is not None:
            writes.append(store.async_put(window_key(target), merged))
        return combine_all(writes)

    return reads.then_compose(write)
