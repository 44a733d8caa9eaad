"""One batch's requests applied in order over an overlay of the batch's own writes.

Shared by the backends that store serialized values under encoded byte keys (RocksDB,
SlateDB; each state's values by its registered serializer): the backend prefetches what the batch reads, then ``APPLY_OPS[op](view,
table, DB key, request)`` runs each request against a ``BatchView`` (reads see the
batch's earlier writes), and the backend writes the view's dirty entries once.
Value and list state are one entry per key (a list is one serialized list); map state
is one entry per ``(key, user key)`` under the key's prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aec.state.requests import Op, StateRequest, op_table
from backends.keycodec import decode_key, encode_key

ABSENT = object()  # "no entry" in a batch's overlay (None is a legal map value)


class BatchView(Protocol):
    """What the op functions need from a backend's per-batch view of its state.

    ``table`` is the backend's handle of the request's state (unused by stores that
    put the state name in the key); DB keys are ``backends.keycodec`` keys; values
    are decoded, ``ABSENT`` when there is no entry.
    """

    def get(self, table: Any, db_key: bytes) -> Any: ...

    def set(
        self, table: Any, db_key: bytes, value: Any, map_prefix: bytes | None = None
    ) -> None: ...

    def map_entries(self, table: Any, prefix: bytes) -> list[tuple[bytes, Any]]: ...

    def map_chunk(
        self, table: Any, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, Any]], bytes | None]: ...

    def map_is_empty(self, table: Any, prefix: bytes) -> bool: ...

    def map_clear(self, table: Any, prefix: bytes) -> None: ...


def merge_map_overlay(
    stored: Iterable[tuple[bytes, bytes]], dirty: dict[bytes, Any], loads: Callable[[bytes], Any]
) -> list[tuple[bytes, Any]]:
    """A map's ``(DB key, value)`` entries in DB key order: the stored entries
    (decoded by ``loads``) with a batch's own writes applied (``ABSENT`` deletes)."""
    entries = {db_key: loads(raw) for db_key, raw in stored}
    for db_key, value in dirty.items():
        if value is ABSENT:
            entries.pop(db_key, None)
        else:
            entries[db_key] = value
    return sorted(entries.items(), key=_first)


def _first(pair: tuple[bytes, Any]) -> bytes:
    return pair[0]


# --- ops: one small function per Op, (view, table, DB key, request) ------------------


def _value_get(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    value = v.get(t, k)
    r.result = None if value is ABSENT else value


def _value_put(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    v.set(t, k, ABSENT if r.value is None else r.value)


def _clear(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    v.set(t, k, ABSENT)


def _list_get(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    stored = v.get(t, k)
    r.result = [] if stored is ABSENT else list(stored)


def _list_add(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    stored = v.get(t, k)
    if stored is ABSENT:
        v.set(t, k, [r.value])
    else:
        # The overlay owns the lists it holds (decoded or copied): extend in place.
        stored.append(r.value)
        v.set(t, k, stored)


def _list_add_all(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    if not r.value:
        return
    stored = v.get(t, k)
    if stored is ABSENT:
        v.set(t, k, list(r.value))
    else:
        stored.extend(r.value)
        v.set(t, k, stored)


def _list_put(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    v.set(t, k, list(r.value) if r.value else ABSENT)


def _map_get(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    value = v.get(t, k)
    r.result = None if value is ABSENT else value


def _map_put(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    v.set(t, k + encode_key(r.user_key), r.value, k)


def _map_put_all(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    if not r.value:
        return
    for user_key, value in dict(r.value).items():
        v.set(t, k + encode_key(user_key), value, k)


def _map_remove(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    v.set(t, k + encode_key(r.user_key), ABSENT, k)


def _map_contains(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    r.result = v.get(t, k) is not ABSENT


def _map_is_empty(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    r.result = v.map_is_empty(t, k)


def _map_iter(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    skip = len(k)
    r.result = [(decode_key(db_key[skip:]), value) for db_key, value in v.map_entries(t, k)]


def _map_clear(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    v.map_clear(t, k)


def _list_get_chunk(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    # the list is one value: read whole, hand out a slice (bounded on the engine side)
    offset, limit = r.value
    offset = offset or 0
    stored = v.get(t, k)
    stored = () if stored is ABSENT else stored
    end = offset + limit
    r.result = (list(stored[offset:end]), end if end < len(stored) else None)


def _map_iter_chunk(v: BatchView, t: Any, k: bytes, r: StateRequest) -> None:
    after, limit = r.value
    skip = len(k)
    entries, last = v.map_chunk(t, k, None if after is None else k + after, limit)
    items = [(decode_key(db_key[skip:]), value) for db_key, value in entries]
    r.result = (items, None if last is None else last[skip:])


APPLY_OPS = op_table(globals())

# Ops that read one DB key (prefetched); the key is prefix + user key for map gets.
POINT_READS = frozenset(
    {
        Op.VALUE_GET,
        Op.LIST_GET,
        Op.LIST_ADD,
        Op.LIST_ADD_ALL,
        Op.LIST_GET_CHUNK,
        Op.MAP_GET,
        Op.MAP_CONTAINS,
    }
)
USER_KEY_OPS = frozenset({Op.MAP_GET, Op.MAP_CONTAINS})
