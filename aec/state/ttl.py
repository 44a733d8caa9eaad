"""State TTL: values that expire after ``ttl`` seconds of processing time.

Like Flink's ``StateTtlConfig`` with ``OnCreateAndWrite`` updates and
``NeverReturnExpired`` visibility (Spark's ``ttlDurationMs`` is the same idea):
each value (each list element, each map entry) is stored with its expiry time
``written_at + ttl``, as a ``(value, expiry)`` pair; reads leave expired ones out.
Reads do not write: the backend removes expired entries itself, whether a record
reads them again or not (``aec.state.ttl_cleanup``), so a TTL read costs a plain
read and a job writing ever new keys keeps a bounded state.
Time is the record's arrival reading of the operator clock (``aec.clock``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aec.state.defaults import fresh
from aec.state.descriptors import StateDescriptor
from aec.state.future import StateFuture
from aec.state.handles import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    StateIterator,
    Submit,
    ValueState,
    Wait,
    _Handle,
    handle_class,
)
from aec.state.requests import Op, RmwRead, RmwWrite, StateRequest
from aec.state.ttl_cleanup import alive


class _Ttl:
    """Stamping and checking (value, expires_at) pairs for one state."""

    __slots__ = ("ttl", "now")

    def __init__(self, ttl: float, now: Callable[[], float]) -> None:
        self.ttl = ttl
        self.now = now  # -> the running record's processing time, seconds

    def stamp(self, value: Any) -> tuple[Any, float]:
        return (value, self.now() + self.ttl)

    def alive(self, pair: Any) -> bool:
        return pair is not None and alive(pair, self.now())


class TtlGet(StateRequest):
    """A VALUE_GET or MAP_GET of TTL state whose future completes with the stored
    value when it is alive, else with the default: ``value`` is ``(default, now)``,
    ``now`` the record's processing time (taken when it asked). No extra future per
    read (``aec.state.requests.DefaultedGet`` does the same for defaults)."""

    __slots__ = ()

    def resolve(self) -> None:
        pair = self.result
        default, now = self.value
        self.complete(pair[0] if pair is not None and alive(pair, now) else fresh(default))


class TtlContains(TtlGet):
    """A MAP_GET of TTL state whose future completes with whether the entry is there
    and alive (a live entry whose value is None is there)."""

    __slots__ = ()

    def resolve(self) -> None:
        pair = self.result
        self.complete(pair is not None and alive(pair, self.value[1]))


class _Expiring:
    """What every TTL handle adds: its ``_Ttl`` (a slot of the concrete class)."""

    __slots__ = ()
    _ttl: _Ttl

    def bind_ttl(self, ttl: _Ttl) -> None:
        """Set the expiry rule (once, right after construction by ``with_ttl``)."""
        self._ttl = ttl  # type: ignore[misc]  # the slot is the concrete class's


class TtlValueState(_Expiring, ValueState):
    __slots__ = ("_ttl",)

    def async_value(self) -> StateFuture:
        asked = (self.descriptor.default, self._ttl.now())
        return self._submit(Op.VALUE_GET, self._name, None, asked, TtlGet)

    def async_update(self, value: Any) -> StateFuture:
        stored = None if value is None else self._ttl.stamp(value)
        return self._submit(Op.VALUE_PUT, self._name, None, stored)


class TtlListState(_Expiring, ListState):
    __slots__ = ("_ttl",)

    def async_get(self) -> StateFuture:
        ttl = self._ttl
        return self._submit(Op.LIST_GET, self._name, None, None).then_apply(
            lambda pairs: StateIterator([p[0] for p in pairs if ttl.alive(p)])
        )

    def async_add(self, value: Any) -> StateFuture:
        return self._submit(Op.LIST_ADD, self._name, None, self._ttl.stamp(value))

    def async_add_all(self, values: Iterable[Any]) -> StateFuture:
        stamped = [self._ttl.stamp(v) for v in values]
        return self._submit(Op.LIST_ADD_ALL, self._name, None, stamped)

    def async_update(self, values: Iterable[Any] | None) -> StateFuture:
        stamped = [self._ttl.stamp(v) for v in (() if values is None else values)]
        return self._submit(Op.LIST_PUT, self._name, None, stamped)


class TtlMapState(_Expiring, MapState):
    __slots__ = ("_ttl",)

    def async_get(self, user_key: Any) -> StateFuture:
        return self._submit(Op.MAP_GET, self._name, user_key, (None, self._ttl.now()), TtlGet)

    def async_put(self, user_key: Any, value: Any) -> StateFuture:
        return self._submit(Op.MAP_PUT, self._name, user_key, self._ttl.stamp(value))

    def async_put_all(self, entries: Any) -> StateFuture:
        stamped = {k: self._ttl.stamp(v) for k, v in dict(entries).items()}
        return self._submit(Op.MAP_PUT_ALL, self._name, None, stamped)

    def async_contains(self, user_key: Any) -> StateFuture:
        asked = (None, self._ttl.now())
        return self._submit(Op.MAP_GET, self._name, user_key, asked, TtlContains)

    def _alive_entries(self) -> StateFuture:
        """A future of the alive ``(user_key, value)`` list."""
        ttl = self._ttl
        return self._submit(Op.MAP_ITER, self._name, None, None).then_apply(
            lambda entries: [(k, p[0]) for k, p in entries if ttl.alive(p)]
        )

    def async_is_empty(self) -> StateFuture:
        return self._alive_entries().then_apply(lambda alive: not alive)

    def async_entries(self) -> StateFuture:
        return self._alive_entries().then_apply(StateIterator)

    def async_keys(self) -> StateFuture:
        return self._alive_entries().then_apply(lambda es: StateIterator([k for k, _ in es]))

    def async_values(self) -> StateFuture:
        return self._alive_entries().then_apply(lambda es: StateIterator([v for _, v in es]))


class _TtlFolding(_Handle[Any]):
    """Shared by reducing and aggregating TTL state: the stored value is the
    (accumulator, expiry) pair; an expired accumulator reads as absent."""

    __slots__ = ()
    _ttl: _Ttl  # a slot of the concrete class

    def _read_alive(self, kind: type = StateRequest) -> StateFuture:
        """A future of the alive accumulator; ``kind=RmwRead`` when a ``_write`` follows."""
        ttl = self._ttl
        return self._submit(Op.VALUE_GET, self._name, None, None, kind).then_apply(
            lambda pair: pair[0] if ttl.alive(pair) else None
        )

    def _write(self, value: Any) -> StateFuture:
        return self._submit(Op.VALUE_PUT, self._name, None, self._ttl.stamp(value), RmwWrite)


class TtlReducingState(_Expiring, _TtlFolding, ReducingState):
    __slots__ = ("_ttl",)

    def async_get(self) -> StateFuture:
        return self._read_alive()

    def async_add(self, value: Any) -> StateFuture:
        reduce = self.descriptor.reduce_function
        return self._read_alive(RmwRead).then_compose(
            lambda old: self._write(value if old is None else reduce(old, value))
        )


class TtlAggregatingState(_Expiring, _TtlFolding, AggregatingState):
    __slots__ = ("_ttl",)

    def async_get(self) -> StateFuture:
        fn = self.descriptor.aggregate_function
        return self._read_alive().then_apply(
            lambda acc: None if acc is None else fn.get_result(acc)
        )

    def async_add(self, value: Any) -> StateFuture:
        fn = self.descriptor.aggregate_function
        return self._read_alive(RmwRead).then_compose(
            lambda acc: self._write(fn.add(value, fn.create_accumulator() if acc is None else acc))
        )


TtlHandle = TtlValueState | TtlListState | TtlMapState | TtlReducingState | TtlAggregatingState

# plain handle class -> its TTL class, built with (descriptor, submit, wait, release)
TTL_HANDLES: dict[type[_Handle[Any]], Callable[..., TtlHandle]] = {
    ValueState: TtlValueState,
    ListState: TtlListState,
    MapState: TtlMapState,
    ReducingState: TtlReducingState,
    AggregatingState: TtlAggregatingState,
}


def ttl_kind(descriptor: StateDescriptor) -> str:
    """How a TTL state stores expiry times (``aec.state.ttl_cleanup.TtlState.kind``):
    ``"list"``, ``"map"``, or ``"value"`` (value, reducing and aggregating state).

    Raises TypeError for an unknown descriptor type."""
    kind = handle_class(descriptor)
    return "list" if kind is ListState else "map" if kind is MapState else "value"


def with_ttl(
    descriptor: StateDescriptor,
    submit: Submit,
    wait: Wait,
    release: Callable[[str], None] | None,
    now: Callable[[], float],
) -> TtlHandle:
    """The TTL handle for ``descriptor`` (``make_handle``'s arguments, plus ``now``:
    the running record's processing time, seconds).

    Raises ValueError if ``descriptor`` has no ``ttl``, TypeError for an unknown
    descriptor type.
    """
    if descriptor.ttl is None:
        raise ValueError(f"state {descriptor.name!r} has no ttl")
    handle = TTL_HANDLES[handle_class(descriptor)](descriptor, submit, wait, release)
    handle.bind_ttl(_Ttl(descriptor.ttl, now))
    return handle
