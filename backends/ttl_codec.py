"""How the byte stores (RocksDB, SlateDB) keep a TTL state's ``(value, expiry)`` pairs.

A value, reducing or aggregating state, and each map entry, stores one pair per DB
key (``aec.state.ttl``). Encoding the pair as one value by the state's serializer
would make the expiry readable only by decoding the value (a tuple: a msgpack
extension type), and the sweep that removes expired entries
(``aec.state.ttl_cleanup``) reads every entry it passes. So the pair is stored as
``0xC1 | expiry (8 bytes, big-endian double) | the value by the state's serializer``:
the sweep reads the expiry from the first 9 bytes and decodes nothing. ``0xC1`` is
a byte msgpack never writes and no pickle starts with, so a pair stored whole (by
an earlier version) is still told apart and decoded as it was written. A list
state's list of pairs is one value and keeps the state's serializer.
"""

from __future__ import annotations

import struct
from typing import Any

from aec.state.serialization import Serializer

_MARK = 0xC1
_HEAD = struct.Struct(">Bd")  # the mark, the expiry (processing-time seconds)


class TtlPairs(Serializer):
    """A TTL state's pair codec over the state's own serializer ``inner`` (whose
    ``name`` and ``safe`` it keeps: checkpoints record the state's serializer)."""

    def __init__(self, inner: Serializer) -> None:
        self.inner = inner
        self.name = inner.name
        self.safe = inner.safe

    def dumps(self, value: Any) -> bytes:
        return _HEAD.pack(_MARK, value[1]) + self.inner.dumps(value[0])

    def loads(self, data: bytes) -> Any:
        if data[:1] != b"\xc1":
            return self.inner.loads(data)  # a pair encoded whole
        if len(data) < _HEAD.size:
            raise ValueError(f"a TTL entry of {len(data)} bytes: too short for its expiry")
        return (self.inner.loads(data[_HEAD.size :]), _HEAD.unpack_from(data)[1])

    def expiry(self, data: bytes) -> float | None:
        """The expiry stored in ``data`` without decoding the value; None for a pair
        encoded whole (decode it with ``loads``)."""
        if data[:1] != b"\xc1" or len(data) < _HEAD.size:
            return None
        return float(_HEAD.unpack_from(data)[1])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TtlPairs) and self.inner == other.inner

    def __hash__(self) -> int:
        return hash((TtlPairs, self.inner))


def stored_codec(serializer: Serializer, ttl_kind: str | None) -> Serializer:
    """The codec a byte store uses for a state: ``TtlPairs`` for a TTL state of kind
    ``"value"`` or ``"map"`` (a pair per DB key), else the state's serializer."""
    return TtlPairs(serializer) if ttl_kind in ("value", "map") else serializer
