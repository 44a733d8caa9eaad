"""Keyed state handles (FLIP-424's State V2 API, snake_case).

Every ``async_*`` method returns a ``StateFuture``; the form without the prefix
blocks: it runs the mailbox until the future completes (discouraged on remote
backends: the record holds the mailbox thread meanwhile). State is scoped to
the key of the record (or timer) whose code is running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, ClassVar, Generic, NoReturn, Protocol, TypeVar

from aec.native import mypyc_attr
from aec.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.future import StateFuture, _as_future, combine_all
from aec.state.requests import DefaultedGet, Op, RmwRead, RmwWrite, StateRequest
from aec.state.typevars import ACC, IN, OUT, UK, UV, E, V

R = TypeVar("R")
D = TypeVar("D", bound=StateDescriptor)

# A chunk of a list or map as the backend stores it (list elements, or (user key,
# value) pairs), and where the next one starts (the backend's cursor; None at the end)
Chunk = tuple[list[Any], object]


class Submit(Protocol):
    """The controller's side of a handle: admits one request of the running record
    (``op`` on ``state``, with ``user_key`` and ``value`` as ``StateRequest`` takes
    them; ``kind`` the request class) and returns it: the future of its result."""

    def __call__(
        self,
        op: int,
        state: str,
        user_key: object = None,
        value: object = None,
        kind: type[StateRequest] = StateRequest,
        /,
    ) -> StateRequest: ...


class Wait(Protocol):
    """Runs the mailbox until ``future`` is done; its result (the blocking API)."""

    def __call__(self, future: StateFuture[R], /) -> R: ...


# -- iterator ------------------------------------------------------------------------------


ITERATOR_CHUNK = 1000  # elements per partial load of a list or map (Flink's ITERATOR_LOADING)


class StateIterator(Generic[E]):
    """The elements ``E`` of a list state or a map's entries/keys/values (FLIP-424).

    Loaded in chunks of ``ITERATOR_CHUNK`` elements: only the current chunk is
    held, and the next is requested (one state request) once it is consumed.
    Iterate with ``on_next(fn)``: a future of ``[fn(e) for e in elements]`` in
    order, where a result that is itself a StateFuture is awaited. Plain Python
    iteration also works; it loads further chunks with blocking requests.
    Removing map entries while iterating the map skips no entry still there on any
    backend; other changes of the state while iterating it may skip or repeat
    elements of later chunks (as in Flink).
    """

    __slots__ = ("_items", "_cursor", "_load", "_wait", "_project")

    def __init__(
        self,
        items: list[Any],
        cursor: object = None,
        load: Callable[[object], StateFuture[Chunk]] | None = None,
        wait: Wait | None = None,
        project: Callable[[Any], E] | None = None,
    ) -> None:
        self._items = items  # the current chunk, as stored (before ``project``)
        self._cursor = cursor  # where the next chunk starts; None: this is the last
        # cursor -> future of (items, next cursor); needed only when a cursor is given
        self._load: Callable[[object], StateFuture[Chunk]] = load or _no_further_chunk
        self._wait: Wait = wait or _no_further_chunk
        self._project = project

    def view(self, items: list[Any]) -> list[E]:
        """A chunk's elements as iterated (stored items, projected to keys or values)."""
        project = self._project
        return items if project is None else [project(i) for i in items]

    def load(self, cursor: object) -> StateFuture[Chunk]:
        """A future of ``(items, next cursor)``: the chunk at ``cursor`` (one request)."""
        return self._load(cursor)

    def on_next(self, fn: Callable[[E], StateFuture[R] | R]) -> StateFuture[list[R]]:
        """A future of ``[fn(e) for e in elements]`` in order; results that are
        StateFutures are awaited."""
        return _as_future(_Consumer(self, fn).consume(self._items, self._cursor), None)

    def is_empty(self) -> bool:
        """True when there are no elements (no request needed)."""
        return not self._items

    def __iter__(self) -> Iterator[E]:
        items, cursor = self._items, self._cursor
        while True:
            yield from self.view(items)
            if cursor is None:
                return
            items, cursor = self._wait(self._load(cursor))

    def __repr__(self) -> str:
        more = ", ..." if self._cursor is not None else ""
        return f"StateIterator({self.view(self._items)!r}{more})"


class _Consumer(Generic[R, E]):
    """``on_next``'s loop over the chunks. An object, not a closure calling itself:
    a self-referencing closure is a reference cycle per iteration, which only the
    cyclic GC frees (on the window benchmark's sliding panes, one scan per firing
    made 170,000 such objects and four collections, 15-20 % of the run)."""

    __slots__ = ("iterator", "fn", "results")

    def __init__(self, iterator: StateIterator[E], fn: Callable[[E], StateFuture[R] | R]) -> None:
        self.iterator = iterator
        self.fn = fn
        self.results: list[StateFuture[R] | R] = []

    def consume(self, items: list[Any], cursor: object) -> StateFuture[list[R]] | list[R]:
        results = self.results
        results.extend(map(self.fn, self.iterator.view(items)))
        if cursor is None:
            if any(isinstance(r, StateFuture) for r in results):
                return combine_all([_as_future(r, None) for r in results])
            return results  # type: ignore[return-value]  # no StateFuture among them
        return self.iterator.load(cursor).then_compose(self)

    def __call__(self, chunk: Chunk) -> StateFuture[list[R]] | list[R]:
        return self.consume(*chunk)


# -- handles -------------------------------------------------------------------------------


@mypyc_attr(allow_interpreted_subclasses=True)  # the TTL handles
class StateHandle(Generic[D]):
    """The base of every handle (Flink's ``State``): binds a state name to the
    controller's ``submit`` and ``wait_for``; ``descriptor`` is its descriptor ``D``."""

    __slots__ = ("_name", "_submit", "_wait", "_release", "descriptor")
    _clear_op: ClassVar[int]  # the Op that clears this kind of state

    def __init__(
        self,
        descriptor: D,
        submit: Submit,
        wait: Wait,
        release: Callable[[str], None] | None = None,
    ) -> None:
        self.descriptor = descriptor
        self._name = descriptor.name
        self._submit = submit  # (op, state, user_key=None, value=None, kind=...) -> StateFuture
        self._wait = wait  # (StateFuture) -> result, running the mailbox
        # (state) -> None: ends a read-modify-write that wrote nothing (see RmwRead)
        self._release = release or _no_lane

    def async_clear(self) -> StateFuture[None]:
        """Remove this key's value(s); a future of None."""
        return self._submit(self._clear_op, self._name)

    def clear(self) -> None:
        """Blocking ``async_clear``."""
        self._wait(self.async_clear())

    def _iterate(
        self, op: int, project: Callable[[Any], E] | None
    ) -> StateFuture[StateIterator[E]]:
        """A future of a chunked StateIterator over this state (list or map)."""
        # partials, not closures (compiled, a closure is a reference cycle: GC only)
        load = partial(_load_chunk, self._submit, op, self._name)
        return load(None).then_apply(partial(_iterator, load, self._wait, project))


def _load_chunk(submit: Submit, op: int, name: str, cursor: object) -> StateFuture[Chunk]:
    """A future of ``(items, next cursor)``: the chunk at ``cursor`` (one request)."""
    return submit(op, name, None, (cursor, ITERATOR_CHUNK))


def _iterator(
    load: Callable[[object], StateFuture[Chunk]],
    wait: Wait,
    project: Callable[[Any], E] | None,
    chunk: Chunk,
) -> StateIterator[E]:
    return StateIterator(chunk[0], chunk[1], load, wait, project)


@mypyc_attr(allow_interpreted_subclasses=True)
class ValueState(StateHandle[ValueStateDescriptor[V]]):
    """``async_value()``, ``async_update(v)`` (None clears), ``async_clear()``."""

    __slots__ = ()
    _clear_op = Op.VALUE_CLEAR

    def async_value(self) -> StateFuture[V]:
        """A future of this key's value, or the descriptor's ``default`` when absent."""
        default = self.descriptor.default
        if default is None:
            return self._submit(Op.VALUE_GET, self._name)
        return self._submit(Op.VALUE_GET, self._name, None, default, DefaultedGet)

    def async_update(self, value: V | None) -> StateFuture[None]:
        """Set this key's value (None clears it); a future of None."""
        return self._submit(Op.VALUE_PUT, self._name, None, value)

    def value(self) -> V:
        """Blocking ``async_value``."""
        return self._wait(self.async_value())

    def update(self, value: V | None) -> None:
        """Blocking ``async_update``."""
        self._wait(self.async_update(value))


@mypyc_attr(allow_interpreted_subclasses=True)
class ListState(StateHandle[ListStateDescriptor[V]]):
    """``async_get()`` -> StateIterator, ``async_add``, ``async_add_all``, ``async_update``."""

    __slots__ = ()
    _clear_op = Op.LIST_CLEAR

    def async_get(self) -> StateFuture[StateIterator[V]]:
        """A future of a ``StateIterator`` over this key's list (empty when absent)."""
        return self._iterate(Op.LIST_GET_CHUNK, None)

    def async_add(self, value: V) -> StateFuture[None]:
        """Append ``value``; a future of None."""
        return self._submit(Op.LIST_ADD, self._name, None, value)

    def async_add_all(self, values: Iterable[V]) -> StateFuture[None]:
        """Append every value of ``values``, in order; a future of None."""
        return self._submit(Op.LIST_ADD_ALL, self._name, None, list(values))

    def async_update(self, values: Iterable[V] | None) -> StateFuture[None]:
        """Replace the list with ``values`` (None or empty clears it); a future of None."""
        return self._submit(Op.LIST_PUT, self._name, None, [] if values is None else list(values))

    def get(self) -> StateIterator[V]:
        """Blocking ``async_get``."""
        return self._wait(self.async_get())

    def add(self, value: V) -> None:
        """Blocking ``async_add``."""
        self._wait(self.async_add(value))

    def add_all(self, values: Iterable[V]) -> None:
        """Blocking ``async_add_all``."""
        self._wait(self.async_add_all(values))

    def update(self, values: Iterable[V] | None) -> None:
        """Blocking ``async_update``."""
        self._wait(self.async_update(values))


@mypyc_attr(allow_interpreted_subclasses=True)
class MapState(StateHandle[MapStateDescriptor[UK, UV]]):
    """Map state; iteration order is the backend's (insertion order in memory)."""

    __slots__ = ()
    _clear_op = Op.MAP_CLEAR

    def async_get(self, user_key: UK) -> StateFuture[UV | None]:
        """A future of the value under ``user_key``, or None."""
        return self._submit(Op.MAP_GET, self._name, user_key)

    def async_put(self, user_key: UK, value: UV) -> StateFuture[None]:
        """Map ``user_key`` to ``value``; a future of None."""
        return self._submit(Op.MAP_PUT, self._name, user_key, value)

    def async_put_all(self, entries: Mapping[UK, UV] | Iterable[tuple[UK, UV]]) -> StateFuture[None]:
        """Put every entry of ``entries`` (a mapping, or ``(key, value)`` pairs as
        ``dict()`` takes); a future of None."""
        return self._submit(Op.MAP_PUT_ALL, self._name, None, dict(entries))

    def async_remove(self, user_key: UK) -> StateFuture[None]:
        """Remove ``user_key`` (no-op if absent); a future of None."""
        return self._submit(Op.MAP_REMOVE, self._name, user_key)

    def async_contains(self, user_key: UK) -> StateFuture[bool]:
        """A future of True when ``user_key`` is present."""
        return self._submit(Op.MAP_CONTAINS, self._name, user_key)

    def async_is_empty(self) -> StateFuture[bool]:
        """A future of True when this key's map has no entries."""
        return self._submit(Op.MAP_IS_EMPTY, self._name)

    def async_entries(self) -> StateFuture[StateIterator[tuple[UK, UV]]]:
        """A future of a StateIterator of ``(user_key, value)`` tuples."""
        return self._iterate(Op.MAP_ITER_CHUNK, None)

    def async_keys(self) -> StateFuture[StateIterator[UK]]:
        """A future of a StateIterator of the user keys."""
        return self._iterate(Op.MAP_ITER_CHUNK, _first)

    def async_values(self) -> StateFuture[StateIterator[UV]]:
        """A future of a StateIterator of the values."""
        return self._iterate(Op.MAP_ITER_CHUNK, _second)

    def get(self, user_key: UK) -> UV | None:
        """Blocking ``async_get``."""
        return self._wait(self.async_get(user_key))

    def put(self, user_key: UK, value: UV) -> None:
        """Blocking ``async_put``."""
        self._wait(self.async_put(user_key, value))

    def put_all(self, entries: Mapping[UK, UV] | Iterable[tuple[UK, UV]]) -> None:
        """Blocking ``async_put_all``."""
        self._wait(self.async_put_all(entries))

    def remove(self, user_key: UK) -> None:
        """Blocking ``async_remove``."""
        self._wait(self.async_remove(user_key))

    def contains(self, user_key: UK) -> bool:
        """Blocking ``async_contains``."""
        return bool(self._wait(self.async_contains(user_key)))

    def is_empty(self) -> bool:
        """Blocking ``async_is_empty``."""
        return bool(self._wait(self.async_is_empty()))

    def entries(self) -> StateIterator[tuple[UK, UV]]:
        """Blocking ``async_entries``."""
        return self._wait(self.async_entries())

    def keys(self) -> StateIterator[UK]:
        """Blocking ``async_keys``."""
        return self._wait(self.async_keys())

    def values(self) -> StateIterator[UV]:
        """Blocking ``async_values``."""
        return self._wait(self.async_values())


@mypyc_attr(allow_interpreted_subclasses=True)
class ReducingState(StateHandle[ReducingStateDescriptor[V]]):
    """``async_get()``, ``async_add(v)`` folds with the reduce function, ``async_clear()``."""

    __slots__ = ()
    _clear_op = Op.VALUE_CLEAR

    def async_get(self) -> StateFuture[V | None]:
        """A future of the reduced value, or None when empty."""
        return self._submit(Op.VALUE_GET, self._name)

    def async_add(self, value: V) -> StateFuture[None]:
        """Fold ``value`` in with ``reduce_function(old, value)``; a future of None."""
        reduce = self.descriptor.reduce_function
        submit, name = self._submit, self._name
        return submit(Op.VALUE_GET, name, None, None, RmwRead).then_compose(
            lambda old: submit(
                Op.VALUE_PUT, name, None, value if old is None else reduce(old, value), RmwWrite
            )
        )

    def get(self) -> V | None:
        """Blocking ``async_get``."""
        return self._wait(self.async_get())

    def add(self, value: V) -> None:
        """Blocking ``async_add``."""
        self._wait(self.async_add(value))


@mypyc_attr(allow_interpreted_subclasses=True)
class AggregatingState(StateHandle[AggregatingStateDescriptor[IN, ACC, OUT]]):
    """``async_get()`` -> ``get_result(acc)`` (None if empty), ``async_add(v)``, ``async_clear()``."""

    __slots__ = ()
    _clear_op = Op.VALUE_CLEAR

    def async_get(self) -> StateFuture[OUT | None]:
        """A future of ``get_result(accumulator)``, or None when empty."""
        fn = self.descriptor.aggregate_function
        return self._submit(Op.VALUE_GET, self._name).then_apply(
            lambda acc: None if acc is None else fn.get_result(acc)
        )

    def async_add(self, value: IN) -> StateFuture[None]:
        """Fold ``value`` into the accumulator with ``add``; a future of None."""
        fn = self.descriptor.aggregate_function
        submit, name = self._submit, self._name

        def fold(acc: ACC | None) -> StateFuture[None]:
            if acc is None:
                acc = fn.create_accumulator()
            return submit(Op.VALUE_PUT, name, None, fn.add(value, acc), RmwWrite)

        return submit(Op.VALUE_GET, name, None, None, RmwRead).then_compose(fold)

    def get(self) -> OUT | None:
        """Blocking ``async_get``."""
        return self._wait(self.async_get())

    def add(self, value: IN) -> None:
        """Blocking ``async_add``."""
        self._wait(self.async_add(value))


def _first(pair: tuple[UK, object]) -> UK:
    return pair[0]


def _second(pair: tuple[object, UV]) -> UV:
    return pair[1]


_Handle = StateHandle  # the name aec.state.ttl imports

_HANDLES: dict[type[StateDescriptor], type[StateHandle[Any]]] = {
    ValueStateDescriptor: ValueState,
    ListStateDescriptor: ListState,
    MapStateDescriptor: MapState,
    ReducingStateDescriptor: ReducingState,
    AggregatingStateDescriptor: AggregatingState,
}


def _no_lane(state: str) -> None:
    pass


def _no_further_chunk(_: object) -> NoReturn:
    raise RuntimeError("StateIterator: no further chunk to load (the iterator was complete)")


def make_handle(
    descriptor: StateDescriptor,
    submit: Submit,
    wait: Wait,
    release: Callable[[str], None] | None = None,
) -> StateHandle[Any]:
    """The handle for ``descriptor``. Raises TypeError for an unknown descriptor type."""
    return handle_class(descriptor)(descriptor, submit, wait, release)


def handle_class(descriptor: StateDescriptor) -> type[StateHandle[Any]]:
    """The handle class for ``descriptor``'s type (the nearest registered base).

    Raises TypeError for an unknown descriptor type."""
    for kind in type(descriptor).__mro__:
        handle = _HANDLES.get(kind)
        if handle is not None:
            return handle
    raise TypeError(f"get_state takes a state descriptor, got {type(descriptor).__name__}")
