"""State requests: what the AEC hands to a backend, in batches (FLIP-426).

This module is the whole contract between the engine and a backend. A backend
receives a list of ``StateRequest`` and, for each in list order, applies the
operation ``op`` to the state named ``state`` of user key ``key`` and stores
what it reads in ``result``. Requests of one record are in submission order
inside a batch and never spread over two batches that run at once, so a
backend that applies each batch in list order gives the sequential answer.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar, Final

from aec.native import mypyc_attr
from aec.state.defaults import fresh
from aec.state.future import _PENDING, Owner, StateFuture


class Op:
    """Request kinds (Flink's ``StateRequestType``), small ints for fast dispatch.

    Value state: ``state[key]`` is one object or absent.
    List state: a list; absent reads as ``[]``; storing ``[]`` or None clears.
    Map state: a dict of user keys (``user_key``) to values; absent reads as empty.
    """

    # result: the value or None (value: a default the engine applies; ignore it)
    VALUE_GET: Final = 0
    VALUE_PUT: Final = 1  # value: the new value; None clears
    VALUE_CLEAR: Final = 2
    LIST_GET: Final = 3  # result: a new list (empty if absent)
    LIST_ADD: Final = 4  # value: one element
    LIST_ADD_ALL: Final = 5  # value: a list of elements
    LIST_PUT: Final = 6  # value: a list replacing the state; empty clears
    LIST_CLEAR: Final = 7
    MAP_GET: Final = 8  # user_key; result: the value or None
    MAP_PUT: Final = 9  # user_key, value
    MAP_PUT_ALL: Final = 10  # value: a dict
    MAP_REMOVE: Final = 11  # user_key
    MAP_CONTAINS: Final = 12  # user_key; result: bool
    MAP_IS_EMPTY: Final = 13  # result: bool
    MAP_ITER: Final = 14  # result: a list of (user_key, value) tuples
    MAP_CLEAR: Final = 15
    # Partial loading (Flink's ITERATOR_LOADING): value = (cursor, limit); cursor None
    # starts; result = (up to ``limit`` items, next cursor or None at the end).
    LIST_GET_CHUNK: Final = 16  # items: list elements; cursor: the backend's position
    MAP_ITER_CHUNK: Final = 17  # items: (user_key, value) tuples in the backend's map order

    NAMES: Final = (
        "VALUE_GET", "VALUE_PUT", "VALUE_CLEAR",
        "LIST_GET", "LIST_ADD", "LIST_ADD_ALL", "LIST_PUT", "LIST_CLEAR",
        "MAP_GET", "MAP_PUT", "MAP_PUT_ALL", "MAP_REMOVE", "MAP_CONTAINS",
        "MAP_IS_EMPTY", "MAP_ITER", "MAP_CLEAR", "LIST_GET_CHUNK", "MAP_ITER_CHUNK",
    )  # fmt: skip

    READS: Final = frozenset({0, 3, 8, 12, 13, 14, 16, 17})
    WRITES: Final = frozenset({1, 2, 4, 5, 6, 7, 9, 10, 11, 15})


def op_table(namespace: Mapping[str, Any]) -> tuple[Callable[..., object], ...]:
    """A backend's handlers indexed by ``Op`` code, found by name in ``namespace``
    (the backend module's ``globals()``): ``_value_get`` for VALUE_GET and so on;
    VALUE_CLEAR, LIST_CLEAR and MAP_CLEAR fall back to ``_clear``.

    Raises LookupError naming every op without a handler.
    """
    table: list[Callable[..., object]] = []
    missing: list[str] = []
    for name in Op.NAMES:
        handler = namespace.get("_" + name.lower())
        if handler is None and name.endswith("_CLEAR"):
            handler = namespace.get("_clear")
        if handler is None:
            missing.append(name)
        else:
            table.append(handler)
    if missing:
        raise LookupError(f"no handler for {', '.join(missing)} in {namespace.get('__name__')}")
    return tuple(table)


@mypyc_attr(allow_interpreted_subclasses=True)  # TTL's TtlGet
class StateRequest(StateFuture):
    """One state access of one record; it is also the future of its own result.

    Being the future saves an allocation per access on the hot path; backends
    see only the request attributes below.

    Attributes:
        op: an ``Op`` constant.
        state: the state's name (unique within an operator).
        key: the record's key (hashable, not None).
        key_group: ``key_group_for(key, max_parallelism)``.
        user_key: the map key for MAP_GET/PUT/REMOVE/CONTAINS, else None.
        value: the payload for writes, else None.
        result: filled by the backend for reads.
        context: the engine's ``RecordContext`` (backends must not touch it).

    The engine completes the request's future with ``resolve()`` once the backend
    has run it (on the mailbox thread).
    """

    __slots__ = ("op", "state", "key", "key_group", "user_key", "value", "result")
    # a pending request holds a reference on its record (the AEC's) until its
    # callbacks ran: they need none of their own
    callbacks_hold_record = False
    # RmwRead and RmwWrite: the AEC's lanes hold requests behind it
    read_modify_write: ClassVar[bool] = False

    def __init__(
        self,
        op: int,
        state: str,
        key: Hashable,
        key_group: int,
        user_key: Any = None,
        value: Any = None,
        context: Owner | None = None,
    ) -> None:
        self._result = _PENDING
        self._callbacks = None
        self.context = context
        self.op = op
        self.state = state
        self.key = key
        self.key_group = key_group
        self.user_key = user_key
        self.value = value
        self.result: Any = None

    def resolve(self) -> None:
        """Engine side: complete this future with the ``result`` the backend stored
        (the pending callbacks run now, on the mailbox thread)."""
        if self._callbacks is None:  # nothing waits (an unawaited write, a fresh request)
            self._result = self.result
        else:
            self.complete(self.result)

    @property
    def future(self) -> StateFuture:
        """The future the engine completes with ``result`` (the request itself)."""
        return self

    def __repr__(self) -> str:
        extra = "" if self.user_key is None else f", user_key={self.user_key!r}"
        return f"StateRequest({Op.NAMES[self.op]}, {self.state!r}, key={self.key!r}{extra})"


class RmwRead(StateRequest):
    """The read of a read-modify-write (reducing/aggregating add, a TTL read that
    may clean up): until its write (``RmwWrite``) is submitted, or the lane is
    released without one, later requests of the same record on the same state
    are held, so they reach the backend after the write, as in program order."""

    __slots__ = ()
    read_modify_write = True


class RmwWrite(StateRequest):
    """The write that ends a read-modify-write; it releases the held requests."""

    __slots__ = ()
    read_modify_write = True


class DefaultedGet(StateRequest):
    """A VALUE_GET whose future completes with ``value`` (the descriptor's default, a
    fresh copy of a mutable one: ``aec.state.defaults``) when the backend finds
    nothing: no extra future per read for defaults."""

    __slots__ = ()

    def resolve(self) -> None:
        result = self.result
        if result is None:
            result = fresh(self.value)
        if self._callbacks is None:  # nothing waits: as StateRequest.resolve
            self._result = result
        else:
            self.complete(result)


def new_request(
    kind: type[StateRequest],
    op: int,
    state: str,
    key: Hashable,
    key_group: int,
    user_key: object,
    value: object,
    context: Owner,
) -> StateRequest:
    """``kind(op, state, key, key_group, user_key, value, context)``. Compiled, a class
    held in a variable is called through ``type.__call__``, which parses its arguments
    from a tuple (about 600 instructions): the two kinds of nearly every request are
    named here, so their constructors are called directly."""
    if kind is StateRequest:
        return StateRequest(op, state, key, key_group, user_key, value, context)
    if kind is DefaultedGet:
        return DefaultedGet(op, state, key, key_group, user_key, value, context)
    return kind(op, state, key, key_group, user_key, value, context)
