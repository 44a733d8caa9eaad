"""The byte layout of state keys in the byte-store backends (RocksDB, SlateDB, Redis).

A DB key is ``key group (2 bytes, big-endian) | len(key bytes) (4 bytes, big-endian) |
key bytes``, followed by the encoded user key for map entries, so one key's map is one
prefix range and keys sort by key group first (Flink's RocksDB layout, simplified).
Key bytes come from ``encode_key``: canonical (equal keys give equal bytes, so ``1``
and ``1.0`` are one key, as in a dict) and decodable (``decode_key``).
"""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any

from aec.keygroups import stable_key_bytes

_HEAD = struct.Struct(">HI")  # key group, length of the key bytes
_LEN = struct.Struct(">I")


_PLAIN = frozenset((str, int, float, bytes, bool))  # types whose equal values encode alike
_ENCODED_LIMIT = 1 << 16  # keys whose bytes are remembered; cleared when full
_encoded: dict[Any, bytes] = {}


def encode_key(key: Any) -> bytes:
    """Canonical, decodable bytes for a state key or map user key.

    Every key type ``aec.keygroups.stable_key_bytes`` accepts uses its form (so
    ``1``, ``1.0``, ``True`` and ``Decimal(1)`` share one), except that tuples are
    encoded element by element with a length prefix each, so they decode
    unambiguously. Nothing is pickled: a key of another type raises TypeError
    (``stable_key_bytes``), so no key bytes read back can run code.

    Keys of those plain types, and flat tuples of them, are remembered (a bounded
    dict, safe from any thread under the GIL): every request encodes its key and
    user key, the flights job's window keys 3 million times. Only plain types are
    looked up, since a value of another type may equal a plain key (``Decimal(1)
    == 1``) and still encode differently; equal plain keys encode alike.
    """
    kind = type(key)
    if kind is tuple:
        for element in key:
            if type(element) not in _PLAIN:
                return _encode(key)
    elif kind not in _PLAIN:
        return _encode(key)
    data = _encoded.get(key)
    if data is None:
        if len(_encoded) >= _ENCODED_LIMIT:
            _encoded.clear()
        data = _encoded[key] = _encode(key)
    return data


def _encode(key: Any) -> bytes:
    if isinstance(key, tuple):  # a named tuple too: it equals the plain tuple
        parts = [encode_key(element) for element in key]
        return b"t" + b"".join(_LEN.pack(len(part)) + part for part in parts)
    return stable_key_bytes(key)


def decode_key(data: bytes) -> Any:
    """Inverse of ``encode_key`` up to equality (``1.0`` and ``Decimal(1)`` come back
    as ``1``, an aware datetime in UTC).

    Raises ValueError on bytes ``encode_key`` cannot produce.
    """
    tag, body = data[:1], data[1:]
    if tag == b"s":
        return body.decode("utf-8", "surrogatepass")
    if tag == b"i":
        return int(body)
    if tag == b"f":
        return struct.unpack(">d", body)[0]
    if tag == b"b":
        return bytes(body)
    if tag == b"t":
        elements, offset = [], 0
        while offset < len(body):
            if offset + _LEN.size > len(body):
                raise ValueError(f"not an encoded key: {data[:20]!r} (truncated tuple)")
            (size,) = _LEN.unpack_from(body, offset)
            offset += _LEN.size
            elements.append(decode_key(body[offset : offset + size]))
            offset += size
        return tuple(elements)
    if tag == b"n" and not body:
        return None
    try:
        if tag == b"a":
            return datetime.date.fromisoformat(body.decode("ascii"))
        if tag == b"D":
            return datetime.datetime.fromisoformat(body.decode("ascii"))
        if tag == b"Z":
            naive = datetime.datetime.fromisoformat(body.decode("ascii"))
            return naive.replace(tzinfo=datetime.UTC)
        if tag == b"d":
            return decimal.Decimal(body.decode("ascii"))
    except (ValueError, ArithmeticError) as exc:
        raise ValueError(f"not an encoded key: {data[:20]!r} ({exc})") from exc
    raise ValueError(f"not an encoded key: {data[:20]!r}")


def key_prefix(key_group: int, key: Any) -> bytes:
    """The DB key of ``key``'s value or list entry; the prefix of its map entries.

    Remembered like ``encode_key``'s bytes, for plain keys only (every request of a
    batch needs its key's prefix); the key group is checked, since operators with
    different ``max_parallelism`` may share the process."""
    if type(key) in _PLAIN:
        known = _prefixes.get(key)
        if known is not None and known[0] == key_group:
            return known[1]
        if len(_prefixes) >= _ENCODED_LIMIT:
            _prefixes.clear()
        encoded = encode_key(key)
        prefix = _HEAD.pack(key_group, len(encoded)) + encoded
        _prefixes[key] = (key_group, prefix)
        return prefix
    encoded = encode_key(key)
    return _HEAD.pack(key_group, len(encoded)) + encoded


_prefixes: dict[Any, tuple[int, bytes]] = {}  # plain key -> (key group, its prefix)


def split_db_key(db_key: bytes) -> tuple[Any, bytes]:
    """``(key, encoded user key)`` of a DB key; the user key part is b"" outside maps."""
    _, size = _HEAD.unpack_from(db_key)
    end = _HEAD.size + size
    return decode_key(db_key[_HEAD.size : end]), db_key[end:]


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


MAX_KEY_GROUPS = 1 << 16  # the key group is stored in 2 bytes


def key_group_bounds(start: int, end: int) -> tuple[bytes, bytes | None]:
    """``(low, high)``: DB keys of key groups ``start..end`` (inclusive) are exactly those
    with ``low <= key < high`` (``high`` None: no upper bound)."""
    low = _KEY_GROUP.pack(start)
    return low, (_KEY_GROUP.pack(end + 1) if end + 1 < MAX_KEY_GROUPS else None)


def key_group_of(db_key: bytes) -> int:
    """The key group a DB key (as ``key_prefix`` made it) belongs to."""
    return _KEY_GROUP.unpack_from(db_key)[0]


_KEY_GROUP = struct.Struct(">H")
