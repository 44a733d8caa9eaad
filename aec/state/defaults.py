"""Defaults handed to one reader: a state's default for an absent key, a declared
variable's for a new record. Each reader gets its own, as Flink copies a descriptor's
default value (``StateDescriptor.getDefaultValue``): a mutable default (a list, a
dict) changed in place by one key or record must not change another's. Immutable
values are handed out as they are (no copy on the read path).
"""

from __future__ import annotations

import copy
from typing import TypeVar

__all__ = ["fresh", "immutable"]

T = TypeVar("T")

# values no reader can change in place (a tuple of them too)
_IMMUTABLE = frozenset((type(None), bool, int, float, complex, str, bytes, frozenset))


def immutable(value: object) -> bool:
    """Whether ``value`` cannot be changed in place (tuples of such values included)."""
    if type(value) is tuple:
        return all(immutable(item) for item in value)
    return type(value) in _IMMUTABLE


def fresh(value: T) -> T:
    """``value`` itself when it is immutable, else a deep copy of it."""
    return value if type(value) in _IMMUTABLE or immutable(value) else copy.deepcopy(value)
