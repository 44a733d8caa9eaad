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

import math
import struct
from collections.abc import Callable
from typing import Any

from aec.state.serialization import Serializer
from aec.state.ttl_cleanup import expired, prune

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


# --- the expiry index -------------------------------------------------------------------
# A byte store keeps, beside a TTL state, an index of its writes ordered by expiry:
# key ``head(expiry) | DB key``, empty value. A sweep reads the index from where the
# last one stopped up to ``head(now)``, so it touches only entries that expired and
# never passes the tombstones of entries removed before (a scan of the state
# itself passed every one of them, every round). ``head`` is 9 bytes that sort as
# the expiry does: for an expiry >= 0 the first 9 bytes of its stored pair (the mark
# and the big-endian double), so the write path only slices; for a negative one
# ``0xC0`` and the double's bits inverted. An index entry may be stale (the key was
# written again later, or removed): the sweep checks the stored expiry before it
# removes anything.

_EXPIRY = struct.Struct(">d")
HEAD_SIZE = _HEAD.size


def head(expiry: float) -> bytes:
    """The index's 9-byte head of ``expiry``: byte order is expiry order."""
    packed = _EXPIRY.pack(expiry)
    if packed[0] < 0x80:
        return b"\xc1" + packed
    return b"\xc0" + bytes(byte ^ 0xFF for byte in packed)


def pair_head(value: Any, raw: bytes) -> bytes:
    """The index head of a stored pair ``value`` (``raw``: ``TtlPairs.dumps(value)``)."""
    return raw[:9] if raw[1] < 0x80 else head(value[1])


def list_head(value: Any, raw: bytes) -> bytes:
    """The index head of a stored list of pairs: its newest expiry (each write of the
    list adds an entry; when one falls due, the list is pruned of all that expired)."""
    return head(max((pair[1] for pair in value), default=-math.inf))


def index_head(ttl_kind: str) -> Callable[[Any, bytes], bytes]:
    """``pair_head`` or ``list_head`` for a TTL state of ``ttl_kind``."""
    return list_head if ttl_kind == "list" else pair_head


def row_head(ttl_kind: str, stored: Any) -> bytes:
    """The index head of a decoded row of a TTL state of ``ttl_kind`` (when indexing
    rows written without their index entries)."""
    return list_head(stored, b"") if ttl_kind == "list" else head(stored[1])


# --- a sweep's verdict on one row -----------------------------------------------------------


class Unchanged:
    """The type of ``UNCHANGED``."""

    __slots__ = ()


UNCHANGED = Unchanged()  # nothing in the row expired: it stays as it is


def swept_row(
    codec: Serializer, ttl_kind: str, raw: bytes, now: float, bound: bytes
) -> bytes | None | Unchanged:
    """What a sweep at processing time ``now`` (``bound``: ``head(now)``) leaves of the
    stored row ``raw`` of a TTL state of ``ttl_kind`` whose values ``codec`` encodes
    (``stored_codec``): ``UNCHANGED``, None (everything in it expired: the row goes)
    or the row's new bytes (a list's live elements). A pair's expiry is read from its
    head without decoding its value: for an expiry >= 0 the head's bytes compare as
    ``expired`` does."""
    if isinstance(codec, TtlPairs) and raw[:1] == b"\xc1":
        if raw[1] < 0x80:  # its head is ``head(expiry)``
            return None if raw[:HEAD_SIZE] <= bound else UNCHANGED
        expiry = codec.expiry(raw)
        if expiry is not None:
            return None if expired(expiry, now) else UNCHANGED
    stored = codec.loads(raw)
    alive = prune("list" if ttl_kind == "list" else "value", stored, now)
    if alive is None:
        return None
    return UNCHANGED if alive is stored else codec.dumps(alive)
