"""Key groups: a stable key -> group assignment, the same in every process.

Python's ``hash()`` is salted per process for str/bytes, so it cannot place a
key in the same group on two Spark executors; we hash a canonical byte form
with CRC-32 instead (Flink uses murmur over ``hashCode()``;
``KeyGroupRangeAssignment.assignToKeyGroup``).
"""

from __future__ import annotations

import datetime
import decimal
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

_pack_double = struct.Struct(">d").pack
_UTC = datetime.UTC

KEY_TYPES = (
    "str, int, bool, float (not NaN), bytes, datetime.date, datetime.datetime, "
    "decimal.Decimal, and tuples of them (and of None)"
)


def stable_key_bytes(key: Any) -> bytes:  # Any: typed by the ``type(key)`` tests
    """A canonical byte form of ``key``, equal for equal keys in every process.

    Keys are ``KEY_TYPES``: values whose equality Python defines the same way in
    every process, encoded so that equal keys give equal bytes (``1``, ``1.0``,
    ``True`` and ``Decimal(1)`` share one form, as one dict key; an aware datetime
    is its UTC instant). Subclasses of str, int, float, bytes and tuple (an enum, a
    named tuple) encode as their base type, which they equal. No form depends on
    ``PYTHONHASHSEED`` or on pickle.

    Raises:
        TypeError: a key of another type (a frozenset iterates in an order that
            depends on the process's hash seed; an object compares by identity),
            naming the type and the fix.
        ValueError: a NaN (not equal to itself) anywhere in the key.
    """
    kind = type(key)
    if kind is str:
        text: str = key
        return b"s" + text.encode("utf-8", "surrogatepass")
    if kind is int or kind is bool:
        return b"i" + str(int(key)).encode()
    if kind is float:
        return _float_bytes(key)
    if kind is bytes:
        raw: bytes = key
        return b"b" + raw
    if kind is tuple:
        return b"t" + b"\x00".join(stable_key_bytes(k) for k in key)
    return _other_bytes(key)


def _float_bytes(number: float) -> bytes:
    if number != number:
        raise ValueError("a key holds NaN: NaN is not equal to itself, so it cannot key state")
    if number.is_integer():
        return b"i" + str(int(number)).encode()
    return b"f" + _pack_double(number)


def _other_bytes(key: object) -> bytes:
    """The forms of the less common key types (``stable_key_bytes``'s slow path)."""
    if key is None:  # inside a tuple, or a map's user key (a record key is never None)
        return b"n"
    if isinstance(key, datetime.datetime):  # before date: a datetime is a date
        if key.utcoffset() is None:
            return b"D" + key.isoformat().encode()
        if key.replace(fold=1 - key.fold).utcoffset() != key.utcoffset():
            raise ValueError(
                f"a key holds {key!r}, a wall time its zone skips or repeats (a DST "
                "change): Python compares it equal to no time of another zone, so it has "
                "no stable form; key by the UTC time or by the wall time without tzinfo"
            )
        instant = key.astimezone(_UTC).replace(tzinfo=None)
        return b"Z" + instant.isoformat().encode()
    if isinstance(key, datetime.date):
        return b"a" + key.isoformat().encode()
    if isinstance(key, decimal.Decimal):
        return _decimal_bytes(key)
    if isinstance(key, _PLAIN_BASES):  # an enum or a named tuple equals its plain value
        plain = plain_key(key)
        if plain is not key:
            return stable_key_bytes(plain)
    kind = type(key)
    raise TypeError(
        f"a key of type {kind.__module__}.{kind.__qualname__} has no encoding that is "
        f"the same in every process ({_why(key)}): keys must be {KEY_TYPES}; convert "
        "it, e.g. a frozenset to a sorted tuple, an object to a tuple of its fields"
    )


# the built-in types a key may subclass, and the plain value of such a key (what it
# equals): base methods, not str() or int(), which a subclass may redefine (str() of
# a ``class Color(str, Enum)`` member is "Color.RED", not the string it equals)
_PLAIN_BASES = (int, float, str, bytes, tuple)
_PLAIN: dict[type, Callable[..., object]] = {
    int: int.__int__, float: float.__float__, str: str.__str__, bytes: bytes.__bytes__,
}  # fmt: skip


def plain_key(key: Any) -> Any:  # Any: a key of any of ``KEY_TYPES``
    """``key`` as the built-in values it equals, with the same hash: a member of an
    ``IntEnum``, a ``StrEnum`` or a ``class C(str, Enum)`` as its int or str, a named
    tuple as a tuple (its elements too). Any other key is returned as it is, and so is
    one of a subclass with an equality or hash of its own (a case-insensitive str):
    its base value is another key. What a snapshot stores of a key that has no
    serialized form of its own type (restored as the plain value, which keys the same
    state)."""
    if type(key) in _EXACT:
        return key
    if isinstance(key, tuple):  # a named tuple too
        plain: object = tuple(plain_key(k) for k in key)
    else:
        for base, base_value in _PLAIN.items():
            if isinstance(key, base):
                plain = base_value(key)
                break
        else:
            return key
    return plain if plain == key and hash(plain) == hash(key) else key


_EXACT = frozenset({int, bool, float, str, bytes, type(None)})


def _why(key: object) -> str:
    if isinstance(key, (set, frozenset)):
        return "a set's order depends on PYTHONHASHSEED"
    if isinstance(key, _PLAIN_BASES):
        return "its equality or hash is not that of the plain value it holds"
    if getattr(type(key), "__eq__", None) is getattr(object, "__eq__"):  # noqa: B009
        return "it compares by identity"
    return "its bytes are not defined by its value"


_INT_DIGITS = 4300  # sys.int_info.default_max_str_digits


def _decimal_bytes(number: decimal.Decimal) -> bytes:
    """A Decimal equal to an int or a float takes their form (it equals them)."""
    if number.is_nan():
        raise ValueError("a key holds a NaN Decimal: it is not equal to itself")
    if number.is_finite() and number.adjusted() >= _INT_DIGITS:
        raise ValueError(
            f"a key holds a Decimal of {number.adjusted() + 1} integer digits; keys take "
            f"at most {_INT_DIGITS} (Python's limit for an int's decimal string)"
        )
    if number.is_finite() and number == number.to_integral_value():
        return b"i" + str(int(number)).encode()
    as_float = float(number)
    if as_float == number:
        return _float_bytes(as_float)
    # normalize in a context as precise as the number: the default 28 digits round
    exact = decimal.Context(
        prec=max(1, len(number.as_tuple().digits)),
        Emax=decimal.MAX_EMAX,
        Emin=decimal.MIN_EMIN,
    )
    return b"d" + str(number.normalize(exact)).encode()


def key_group_for(key: object, max_parallelism: int) -> int:
    """The key group of ``key``: an int in ``range(max_parallelism)``.

    Raises TypeError / ValueError for a ``max_parallelism`` that is not an int >= 1
    (as ``key_group_range_for``), TypeError for a key of no stable encoding."""
    if type(max_parallelism) is not int or max_parallelism < 1:
        _check_max_parallelism(max_parallelism)  # raises, unless an int subclass >= 1
    return zlib.crc32(stable_key_bytes(key)) % max_parallelism


class KeyGroupRange:
    """A contiguous range of key groups, inclusive on both ends (Flink's ``KeyGroupRange``).

    ``KeyGroupRange(start, end)`` holds ``start..end``; ``end == start - 1`` is the
    empty range. Supports ``kg in r``, ``len(r)``, iteration in order, equality and
    hashing; ``.start`` and ``.end`` are the bounds.

    Raises:
        TypeError: a bound is not an int.
        ValueError: ``start < 0`` or ``end < start - 1``.
    """

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int) -> None:
        for name, bound in (("start", start), ("end", end)):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise TypeError(f"KeyGroupRange {name} must be an int, got {bound!r}")
        if start < 0:
            raise ValueError(f"KeyGroupRange start must be >= 0, got {start}")
        if end < start - 1:
            raise ValueError(f"KeyGroupRange end must be >= start - 1, got {start}..{end}")
        self.start = start
        self.end = end

    @classmethod
    def all(cls, max_parallelism: int) -> KeyGroupRange:
        """Every key group of ``max_parallelism``: ``0..max_parallelism - 1``."""
        _check_max_parallelism(max_parallelism)
        return cls(0, max_parallelism - 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyGroupRange):
            return NotImplemented
        return (self.start, self.end) == (other.start, other.end)

    def __hash__(self) -> int:
        return hash((KeyGroupRange, self.start, self.end))

    def __repr__(self) -> str:
        return f"KeyGroupRange({self.start}, {self.end})"

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges (possibly empty)."""
        start = max(self.start, other.start)
        return KeyGroupRange(start, max(min(self.end, other.end), start - 1))

    def within(self, max_parallelism: int) -> bool:
        """Whether every key group of this range is in ``range(max_parallelism)``."""
        return self.end < max_parallelism


def _check_max_parallelism(max_parallelism: int) -> None:
    if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int):
        raise TypeError(f"max_parallelism must be an int, got {max_parallelism!r}")
    if max_parallelism < 1:
        raise ValueError(f"max_parallelism must be >= 1, got {max_parallelism}")


def key_group_range_for(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """The key groups operator ``index`` of ``parallelism`` owns (Flink's
    ``KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex``): contiguous,
    disjoint ranges that cover ``range(max_parallelism)`` and differ in size by at most 1.

    Raises:
        TypeError: an argument is not an int.
        ValueError: ``max_parallelism < 1``, ``parallelism`` not in
            ``1..max_parallelism``, or ``index`` not in ``range(parallelism)``.
    """
    _check_max_parallelism(max_parallelism)
    for name, value in (("parallelism", parallelism), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in 1..max_parallelism ({max_parallelism}), got {parallelism}"
        )
    if not 0 <= index < parallelism:
        raise ValueError(f"index must be in range({parallelism}), got {index}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def operator_index_for(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """The operator index of ``parallelism`` that owns ``key_group`` (Flink's
    ``computeOperatorIndexForKeyGroup``): inverse of ``key_group_range_for``."""
    return key_group * parallelism // max_parallelism


def owned_range(key_groups: object, max_parallelism: int) -> KeyGroupRange:
    """An operator's key groups: ``key_groups``, or all of ``max_parallelism``.

    Raises TypeError (not a KeyGroupRange) or ValueError (outside
    ``range(max_parallelism)``, or empty).
    """
    if key_groups is None:
        return KeyGroupRange.all(max_parallelism)
    if not isinstance(key_groups, KeyGroupRange):
        raise TypeError(
            f"key_group_range must be an aec.keygroups.KeyGroupRange, got {key_groups!r}"
        )
    if not key_groups.within(max_parallelism) or not len(key_groups):
        raise ValueError(
            f"key_group_range {key_groups} must be a non-empty range inside "
            f"range(max_parallelism={max_parallelism})"
        )
    return key_groups
