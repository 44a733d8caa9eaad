"""State serializers: how state values become bytes, and which bytes may be trusted.

A ``Serializer`` turns a state value into bytes and back. Two are built in, chosen
by name per state descriptor (``ValueStateDescriptor(..., serializer="pickle")``)
or per job (``AecConfig(state_serializer=...)``):

* ``"msgpack"`` (the default, ``SAFE``): plain data only: None, bool, int, float,
  str, bytes, and tuples, lists, dicts, sets and frozensets of them,
  ``datetime.date``/``datetime``/``time``/``timedelta`` and ``decimal.Decimal``.
  Decoding builds nothing but those types, so bytes from a checkpoint, a Redis
  server or an object store cannot run code whoever wrote them. Tuples keep being
  tuples (an extension type), dict keys may be any of these types, integers of any
  size round-trip; a ``datetime`` keeps its UTC offset (a ``zoneinfo`` zone comes
  back as a fixed offset, ``fold`` is not kept); a named tuple comes back as a plain
  tuple. Types registered with ``register_type`` (a class, an extension code, and
  functions to and from plain data: the engine's ``TimeWindow``/``GlobalWindow``)
  are stored as their plain data and rebuilt by their function. Anything else
  raises ``TypeError`` naming the type, when it is written (RocksDB, Redis,
  SlateDB: the batch; MemoryBackend: the snapshot).
* ``"pickle"``: any picklable object. Unpickling runs code named by the bytes, so
  choose it only for states whose every byte comes from this job (a checkpoint
  location and a store only the job can write, or signed checkpoints:
  ``docs/security.md``). A backend decodes a state's stored bytes with the
  serializer that state is registered with, never with one the bytes name.

The same encoder writes checkpoint metadata (``aec.checkpoint``: timers, operator
state), so no checkpoint file the engine reads is a pickle unless a state opted in.

Cost: a scalar encodes in about 60 ns and decodes in about 75 ns (a reused packer
per thread; pickle: 180 ns and 130 ns); a tuple costs about 0.6 us to encode (an
extension type packed by a nested packer), about 0.3 us to decode.
"""

from __future__ import annotations

import datetime
import decimal
import pickle
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar, cast

import msgpack

from aec.state.typevars import V

__all__ = [
    "PICKLE",
    "SAFE",
    "SERIALIZERS",
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "StateSerializers",
    "dumps_exactly",
    "register_type",
    "resolve",
]

# msgpack extension type codes (0..127 are the application's)
_TUPLE, _SET, _FROZENSET, _DATE, _DATETIME, _TIME, _TIMEDELTA, _DECIMAL, _BIGINT = range(1, 10)
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1
_new_ext = tuple.__new__  # ExtType(code, data) without its Python-level checks (hot path)
_ExtType = msgpack.ExtType
_DATETIME_TYPE, _DATE_TYPE = datetime.datetime, datetime.date  # one global read each
_FIRST_REGISTERED = 32  # extension codes below are the built-in types
# registered types: class -> (code, to plain data); code -> from plain data
_REGISTERED: dict[type, tuple[int, Callable[[Any], object]]] = {}
_REBUILD: dict[int, Callable[[Any], object]] = {}
C = TypeVar("C")


def register_type(
    cls: type[C], code: int, to_plain: Callable[[C], object], from_plain: Callable[[Any], C]
) -> None:
    """Let the safe serializer store instances of exactly ``cls``: as the plain data
    ``to_plain(value)`` returns, under msgpack extension code ``code``; decoding
    calls ``from_plain(data)``, which must build nothing but a ``cls`` from plain
    data (it sees whatever bytes a store holds: validate, raise ValueError or
    TypeError on bad data). Register at import of ``cls``'s module, so every
    process that decodes has it. Codes 32..63 are the engine's, 64..127 free.

    Raises ValueError: a code out of 32..127, or taken by another class.
    """
    if not _FIRST_REGISTERED <= code <= 127:
        raise ValueError(f"extension code {code} is not in {_FIRST_REGISTERED}..127")
    owner = next((c for c, (known, _) in _REGISTERED.items() if known == code), None)
    if owner is not None and owner is not cls:
        raise ValueError(f"extension code {code} is taken by {owner.__qualname__}")
    _REGISTERED[cls] = (code, to_plain)
    _REBUILD[code] = from_plain


class Serializer(ABC, Generic[V]):
    """Turns state values ``V`` into bytes and back.

    Attributes:
        name: recorded in checkpoints beside each state; a restore refuses a state
            whose recorded serializer differs from the live descriptor's.
        safe: True when ``loads`` cannot run code, whatever the bytes.

    Subclasses must be picklable (they travel to Spark executors with the function).
    """

    name: str = ""
    safe: bool = False

    @abstractmethod
    def dumps(self, value: V) -> bytes:
        """The bytes of ``value``. Raises TypeError for a value it cannot encode."""

    @abstractmethod
    def loads(self, data: bytes) -> V:
        """The value of ``data``. Raises ValueError (or a subclass) for bytes ``dumps``
        cannot have produced."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Serializer) and (type(self), self.name) == (
            type(other),
            other.name,
        )

    def __hash__(self) -> int:
        return hash((type(self), self.name))


# extension values inside extension values, at most (each level decoded is a C stack
# frame: crafted bytes nested hundreds deep would exhaust the stack)
MAX_NESTING = 64


class _Packers(threading.local):
    """Per-thread msgpack packers (a ``Packer`` is not thread-safe): ``top`` for a
    value, ``nested[d]`` for the contents of an extension type at depth ``d``."""

    def __init__(self) -> None:
        self.top = _packer()
        self.nested: list[msgpack.Packer] = []
        self.depth = 0


def _packer() -> msgpack.Packer:
    # strict_types: a tuple (or a subclass of a native type) reaches ``_default``
    # instead of being packed as a list, so it comes back as what it was
    return msgpack.Packer(use_bin_type=True, strict_types=True, default=_default)


def _pack_nested(value: object) -> bytes:
    packers = _PACKERS
    depth = packers.depth
    nested = packers.nested
    if depth >= MAX_NESTING:  # what loads() would refuse: refused when written
        raise TypeError(
            f"the 'msgpack' state serializer stores extension values (tuples, sets, "
            f"dates...) nested at most {MAX_NESTING} deep; this value nests them deeper"
        )
    if depth == len(nested):
        nested.append(_packer())
    packers.depth = depth + 1
    try:
        packed: bytes = nested[depth].pack(value)
        return packed
    finally:
        packers.depth = depth


def _default(value: Any) -> object:
    """Encodes what msgpack has no native type for, as an extension type (``value``
    is typed by the ``type()`` tests below, the kinds state holds most first)."""
    kind = type(value)
    if kind is tuple:
        return _new_ext(_ExtType, (_TUPLE, _pack_nested(list(value))))
    if kind is _DATETIME_TYPE:  # rows from Spark carry them (timestamp columns)
        return _new_ext(_ExtType, (_DATETIME, value.isoformat().encode()))
    if kind is _DATE_TYPE:
        return _new_ext(_ExtType, (_DATE, value.isoformat().encode()))
    if kind is int:  # beyond 64 bits: two's complement, big-endian
        size = (value.bit_length() + 8) // 8
        return _new_ext(_ExtType, (_BIGINT, value.to_bytes(size, "big", signed=True)))
    if kind is set or kind is frozenset:
        code = _SET if kind is set else _FROZENSET
        return _new_ext(_ExtType, (code, _pack_nested(list(value))))
    if kind is datetime.time:
        return _new_ext(_ExtType, (_TIME, value.isoformat().encode()))
    if kind is datetime.timedelta:
        parts = [value.days, value.seconds, value.microseconds]
        return _new_ext(_ExtType, (_TIMEDELTA, _pack_nested(parts)))
    if kind is decimal.Decimal:
        return _new_ext(_ExtType, (_DECIMAL, str(value).encode()))
    registered = _REGISTERED.get(kind)
    if registered is not None:
        return _new_ext(_ExtType, (registered[0], _pack_nested(registered[1](value))))
    if isinstance(value, tuple):  # a named tuple: its fields, as a plain tuple
        return _new_ext(_ExtType, (_TUPLE, _pack_nested(list(value))))
    raise TypeError(
        f"the 'msgpack' state serializer cannot store a {describe_type(value)} "
        "(it keeps plain data: None, bool, int, float, str, bytes, tuples, lists, dicts, "
        "sets, dates, times and Decimal); convert the value to plain data, or opt in to "
        "pickle for this state (serializer='pickle' on its descriptor) or for the job "
        "(AecConfig(state_serializer='pickle')), trusting whoever can write its stored bytes"
    )


_PACKERS = _Packers()


def _ext_value(unpack: Callable[[bytes], Any], code: int, data: bytes) -> object:
    """The value of extension ``code`` holding ``data`` (nested values through
    ``unpack``; the kinds state holds most first)."""
    if code == _TUPLE:
        return tuple(unpack(data))
    if code == _DATETIME:
        return _DATETIME_TYPE.fromisoformat(data.decode("ascii"))
    if code == _DATE:
        return _DATE_TYPE.fromisoformat(data.decode("ascii"))
    if code == _BIGINT:
        number = int.from_bytes(data, "big", signed=True)
        if _INT64_MIN <= number <= _UINT64_MAX:  # msgpack writes these natively
            raise ValueError(f"an oversized integer holds a 64-bit one ({number})")
        return number
    if code == _SET:
        return set(unpack(data))
    if code == _FROZENSET:
        return frozenset(unpack(data))
    if code == _TIME:
        return datetime.time.fromisoformat(data.decode("ascii"))
    if code == _TIMEDELTA:
        days, seconds, microseconds = unpack(data)
        return datetime.timedelta(days, seconds, microseconds)
    if code == _DECIMAL:
        return decimal.Decimal(data.decode("ascii"))
    rebuild = _REBUILD.get(code)
    if rebuild is not None:
        return rebuild(unpack(data))
    raise ValueError(f"unknown msgpack extension type {code}")


def _unpacker(depth: int) -> Callable[[bytes], Any]:
    """bytes -> value, with extension values nested at most ``MAX_NESTING - depth`` deep
    (crafted bytes nested hundreds deep would overflow the C stack: ValueError); a
    partial, not a def: every state read calls it, and a C call costs no Python frame."""
    if depth > MAX_NESTING:

        def too_deep(data: bytes) -> Any:
            raise ValueError(f"msgpack extension values nested deeper than {MAX_NESTING}")

        return too_deep
    # a C call with no frame of its own; positional, as a keyword would cost a dict
    # merged per extension value
    hook = partial(_ext_value, _unpacker(depth + 1))
    return partial(msgpack.unpackb, raw=False, strict_map_key=False, ext_hook=hook)


_unpack = _unpacker(0)


class MsgpackSerializer(Serializer):
    """The safe default: plain data through msgpack (see the module doc for the types).

    ``dumps`` raises TypeError naming a type it cannot store; ``loads`` raises
    ValueError for bytes it did not write (truncated, trailing data, an unknown
    extension type, invalid UTF-8), never runs code.
    """

    name = "msgpack"
    safe = True

    def dumps(self, value: object) -> bytes:
        packed: bytes = _PACKERS.top.pack(value)
        return packed

    def loads(self, data: bytes) -> Any:
        try:
            return _unpack(data)
        except Exception as exc:  # msgpack's errors (FormatError, ExtraData, ...), ours
            raise ValueError(f"not msgpack state bytes ({type(exc).__name__}: {exc})") from exc


class PickleSerializer(Serializer):
    """Any picklable value (highest protocol). Opt-in: unpickling runs code named by
    the bytes (``docs/security.md``)."""

    name = "pickle"
    safe = False

    def dumps(self, value: object) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


SAFE = MsgpackSerializer()
PICKLE = PickleSerializer()
SERIALIZERS: dict[str, Serializer] = {SAFE.name: SAFE, PICKLE.name: PICKLE}


def dumps_exactly(serializer: Serializer, value: object) -> bytes:
    """``serializer.dumps(value)``, checked to come back as ``value`` itself: equal, and
    of the same types all the way down (msgpack gives a named tuple back as a tuple,
    a ``bytearray`` as ``bytes``). For what must be restored as it was, not as state
    is (a record in flight, a declared variable, an async I/O input).

    Raises:
        TypeError: the value would come back changed (naming the first part that would,
            and its type after the round trip).
        Exception: the serializer's own error for a value it cannot store.
    """
    data = serializer.dumps(value)
    change = _change(value, serializer.loads(data))
    if change is not None:
        raise TypeError(f"the {serializer.name!r} serializer would give {change}")
    return data


def _change(a: object, b: object) -> str | None:
    """The first part of ``a`` that ``b`` does not give back as it is (``"<type> back as
    <type>"``), or None: ``a == b`` with the same types at every level (NaN equals NaN)."""
    if type(a) is not type(b):
        return f"{describe_type(a)} back as {describe_type(b)}"
    if isinstance(a, (list, tuple)):
        other = cast("list[object] | tuple[object, ...]", b)
        if len(a) != len(other):
            return f"a {describe_type(a)} of {len(a)} back with {len(other)}"
        return next((c for x, y in zip(a, other, strict=True) if (c := _change(x, y))), None)
    if isinstance(a, dict):
        mapping = cast("dict[object, object]", b)
        if len(a) != len(mapping):
            return f"a dict of {len(a)} entries back with {len(mapping)}"
        for (ka, va), (kb, vb) in zip(a.items(), mapping.items(), strict=True):
            change = _change(ka, kb) or _change(va, vb)
            if change is not None:
                return change
        return None
    if isinstance(a, (set, frozenset)):
        if a != b or sorted(map(repr, a)) != sorted(map(repr, cast("set[object]", b))):
            return f"a {describe_type(a)} back changed"
        return None
    if isinstance(a, float) and a != a:
        return None if b != b else f"{a!r} back as {b!r}"
    return None if a == b else f"{a!r} back as {b!r}"


def describe_type(value: object) -> str:
    """``module.qualname`` of ``value``'s type (builtins without the module)."""
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def resolve(choice: str | Serializer | None, default: Serializer = SAFE) -> Serializer:
    """The serializer ``choice`` names: a ``Serializer``, a name in ``SERIALIZERS``, or
    None for ``default``.

    Raises:
        ValueError: an unknown name (the names are listed).
        TypeError: neither a name nor a ``Serializer``.
    """
    if choice is None:
        return default
    if isinstance(choice, Serializer):
        return choice
    if isinstance(choice, str):
        found = SERIALIZERS.get(choice)
        if found is None:
            raise ValueError(
                f"unknown state serializer {choice!r}: use one of {sorted(SERIALIZERS)} "
                "or a Serializer instance"
            )
        return found
    raise TypeError(
        f"a state serializer is a name ({sorted(SERIALIZERS)}) or a Serializer, "
        f"got {type(choice).__name__}"
    )


class StateSerializers:
    """The serializer each state of one backend is registered with (unregistered:
    ``SAFE``). Backends own one (``StateBackend.serializers``); the engine registers
    every state when its handle is made (``RuntimeContext.get_state``)."""

    __slots__ = ("_by_state",)

    def __init__(self) -> None:
        self._by_state: dict[str, Serializer] = {}

    def register(self, state: str, serializer: Serializer) -> None:
        """Register ``state`` with ``serializer``; ValueError if it has another one."""
        known = self._by_state.get(state)
        if known is not None and known != serializer:
            raise ValueError(
                f"state {state!r} is stored with the {known.name!r} serializer; it cannot "
                f"also use {serializer.name!r} (use another state name)"
            )
        self._by_state[state] = serializer

    def of(self, state: str) -> Serializer:
        """The serializer of ``state`` (``SAFE`` when it was never registered)."""
        return self._by_state.get(state, SAFE)

    def check_stored(self, state: str, stored: str, where: str) -> Serializer:
        """The serializer to decode ``state``'s bytes with, which ``where`` says were
        written by the serializer named ``stored``: the registered one, only if the
        names agree. Raises ValueError naming the state before any byte is decoded."""
        serializer = self.of(state)
        if serializer.name != stored:
            raise ValueError(
                f"{where}: state {state!r} was stored with the {stored!r} serializer, this "
                f"job reads it with {serializer.name!r}: refusing to decode it (declare the "
                "state with the serializer it was written with)"
            )
        return serializer
