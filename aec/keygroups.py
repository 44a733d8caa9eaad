"""Key groups: a stable key -> group assignment, the same in every process.

Python's ``hash()`` is salted per process for str/bytes, so it cannot place a
key in the same group on two Spark executors; we hash a canonical byte form
with CRC-32 instead (Flink uses murmur over ``hashCode()``;
``KeyGroupRangeAssignment.assignToKeyGroup``).
"""

from __future__ import annotations

import pickle
import struct
import zlib
from typing import Any

_pack_double = struct.Struct(">d").pack


def stable_key_bytes(key: Any) -> bytes:
    """A canonical byte form of ``key``, equal for equal keys in every process.

    str, bytes, int, float and tuples of those have a canonical form (so
    ``1 == 1.0`` keys land in the same group as Python equality demands); other
    keys fall back to pickle protocol 4, which is deterministic for plain values.
    """
    kind = type(key)
    if kind is str:
        return b"s" + key.encode("utf-8", "surrogatepass")
    if kind is int or kind is bool:
        return b"i" + str(int(key)).encode()
    if kind is float:
        if key.is_integer():
            return b"i" + str(int(key)).encode()
        return b"f" + _pack_double(key)
    if kind is bytes:
        return b"b" + key
    if kind is tuple:
        return b"t" + b"\x00".join(stable_key_bytes(k) for k in key)
    return b"p" + pickle.dumps(key, protocol=4)


def key_group_for(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``: an int in ``range(max_parallelism)``."""
    return zlib.crc32(stable_key_bytes(key)) % max_parallelism
