"""RedisBackend's batch plan: state requests -> Redis commands of one pipeline.

Each request becomes native commands queued in request order, so a read sees every
earlier write of its batch. ``VALUE_GET`` of a key with no earlier write in the
batch is hoisted into one ``MGET`` at the front; a value write or clear that is the
last access of its key is sunk into one ``MSET`` / one ``DEL`` at the end; identical
reads of one key are folded while no write to that key lies between them. After the
pipeline ran, each request's ``fill`` turns its replies into the request's result,
decoding values with the request's state's serializer (``loads``).
See ``backends.redis`` for the key layout and the chunked-iteration cursors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aec.state.requests import StateRequest, op_table
from aec.state.serialization import Serializer
from backends.keycodec import decode_key, encode_key

__all__ = ["PLAN_OPS", "Plan"]

Loads = Callable[[bytes], Any]
Fill = Callable[["Plan", list, Any, Any, Loads], Any]


class Plan:
    """Commands for one batch, in request order, and how to fill each result.

    ``fills`` holds ``(fill, request, a, b)``: ``request.result = fill(plan,
    replies, a, b, loads)`` once the pipeline returned (``a``/``b`` are reply
    positions or other per-request data, ``loads`` the request's state's decoder).
    ``serializer_of`` gives each state's serializer.
    """

    __slots__ = ("keys", "commands", "fills", "reads", "written", "mget_keys", "mget_pos",
                 "mget_reply", "mset", "deletes", "rescans", "serializer_of")  # fmt: skip

    def __init__(self, serializer_of: Callable[[str], Serializer]) -> None:
        self.serializer_of = serializer_of
        self.keys: list[bytes] = []  # the Redis key of each request
        self.commands: list[tuple] = []
        self.fills: list[tuple[Fill, StateRequest, Any, Any]] = []
        self.reads: dict[bytes, dict[tuple, int]] = {}  # foldable reads since the last write
        self.written: set[bytes] = set()
        self.mget_keys: list[bytes] = []
        self.mget_pos: dict[bytes, int] = {}
        self.mget_reply: list = []
        self.mset: dict[bytes, bytes] = {}  # sunk value writes (last access of their key)
        self.deletes: list[bytes] = []  # sunk deletes (last access of their key)
        self.rescans: list[StateRequest] = []  # map chunks that may read on if empty

    def read(self, key: bytes, command: tuple) -> int:
        """The reply position of ``command`` (a read of ``key``), folded if possible."""
        folded = self.reads.get(key)
        if folded is None:
            folded = self.reads[key] = {}
        else:
            position = folded.get(command)
            if position is not None:
                return position
        position = folded[command] = len(self.commands)
        self.commands.append(command)
        return position

    def write(self, key: bytes, command: tuple) -> None:
        self.commands.append(command)
        self.reads.pop(key, None)
        self.written.add(key)

    def delete(self, key: bytes, last: bool) -> None:
        if last:
            self.deletes.append(key)
        else:
            self.write(key, ("DEL", key))

    def dumps(self, request: StateRequest, value: Any) -> bytes:
        """``value``'s bytes by the serializer of ``request``'s state."""
        return self.serializer_of(request.state).dumps(value)

    def finish(self) -> list[tuple]:
        commands = self.commands
        if self.mget_keys:
            commands.insert(0, ("MGET", *self.mget_keys))
        if self.mset:
            commands.append(("MSET", *[part for pair in self.mset.items() for part in pair]))
        if self.deletes:
            commands.append(("DEL", *self.deletes))
        return commands


# fills
def _fill_mget(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> Any:
    raw = p.mget_reply[position]
    return None if raw is None else loads(raw)


def _fill_value(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> Any:
    raw = replies[position]
    return None if raw is None else loads(raw)


def _fill_list(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> list:
    return [loads(raw) for raw in replies[position]]


def _fill_not_none(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> bool:
    return replies[position] is not None


def _fill_bool(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> bool:
    return bool(replies[position])


def _fill_zero(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> bool:
    return replies[position] == 0


def _fill_entries(p: Plan, replies: list, position: int, _: Any, loads: Loads) -> list:
    return [(decode_key(field), loads(raw)) for field, raw in replies[position].items()]


def _fill_list_chunk(p: Plan, replies: list, position: int, window: tuple[int, int], loads: Loads) -> tuple:
    offset, limit = window
    found = replies[position]
    if len(found) > limit:
        return [loads(raw) for raw in found[:limit]], offset + limit
    return [loads(raw) for raw in found], None


def _fill_map_chunk(p: Plan, replies: list, positions: tuple, state: tuple, loads: Loads) -> tuple:
    carried_at, scan_at = positions
    carried, scan_cursor, limit = state
    candidates: list[tuple[bytes, bytes]] = []
    seen: set[bytes] = set()
    if carried_at is not None:
        for field, raw in zip(carried, replies[carried_at], strict=True):
            if raw is not None and field not in seen:  # removed since: skipped
                seen.add(field)
                candidates.append((field, raw))
    if scan_at is not None:
        scan_cursor, found = replies[scan_at]
        for field, raw in found.items():
            if field not in seen:
                seen.add(field)
                candidates.append((field, raw))
    items = [(decode_key(field), loads(raw)) for field, raw in candidates[:limit]]
    surplus = tuple(field for field, _ in candidates[limit:])
    if surplus:
        return items, (scan_cursor, surplus)
    return items, (None if scan_cursor == 0 else (scan_cursor, ()))


# ops: (plan, request, Redis key, last access of that key in the batch)
def _value_get(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if k in p.written:
        p.fills.append((_fill_value, r, p.read(k, ("GET", k)), None))
        return
    position = p.mget_pos.get(k)
    if position is None:
        position = p.mget_pos[k] = len(p.mget_keys)
        p.mget_keys.append(k)
    p.fills.append((_fill_mget, r, position, None))


def _value_put(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if r.value is None:
        p.delete(k, last)
    elif last:
        p.mset[k] = p.dumps(r, r.value)
    else:
        p.write(k, ("SET", k, p.dumps(r, r.value)))


def _clear(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.delete(k, last)


def _list_get(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_list, r, p.read(k, ("LRANGE", k, 0, -1)), None))


def _list_add(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.write(k, ("RPUSH", k, p.dumps(r, r.value)))


def _list_add_all(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if r.value:
        p.write(k, ("RPUSH", k, *[p.dumps(r, element) for element in r.value]))


def _list_put(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if not r.value:
        p.delete(k, last)
        return
    p.write(k, ("DEL", k))
    p.write(k, ("RPUSH", k, *[p.dumps(r, element) for element in r.value]))


def _list_get_chunk(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    offset, limit = r.value
    offset = offset or 0
    position = p.read(k, ("LRANGE", k, offset, offset + limit))
    p.fills.append((_fill_list_chunk, r, position, (offset, limit)))


def _map_get(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_value, r, p.read(k, ("HGET", k, encode_key(r.user_key))), None))


def _map_put(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.write(k, ("HSET", k, encode_key(r.user_key), p.dumps(r, r.value)))


def _map_put_all(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    if not r.value:
        return
    fields = []
    for user_key, value in dict(r.value).items():
        fields.append(encode_key(user_key))
        fields.append(p.dumps(r, value))
    p.write(k, ("HSET", k, *fields))


def _map_remove(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.write(k, ("HDEL", k, encode_key(r.user_key)))


def _map_contains(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    field = encode_key(r.user_key)
    folded = p.reads.get(k)
    position = None if folded is None else folded.get(("HGET", k, field))
    if position is not None:  # a stored None is not nil: present iff HGET found it
        p.fills.append((_fill_not_none, r, position, None))
    else:
        p.fills.append((_fill_bool, r, p.read(k, ("HEXISTS", k, field)), None))


def _map_is_empty(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_zero, r, p.read(k, ("HLEN", k)), None))


def _map_iter(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    p.fills.append((_fill_entries, r, p.read(k, ("HGETALL", k)), None))


def _map_iter_chunk(p: Plan, r: StateRequest, k: bytes, last: bool) -> None:
    cursor, limit = r.value
    scan_cursor, carried = (0, ()) if cursor is None else cursor
    carried_at = p.read(k, ("HMGET", k, *carried)) if carried else None
    scan_at = None
    if len(carried) < limit and (cursor is None or scan_cursor != 0):
        count = max(limit - len(carried), 1)
        scan_at = p.read(k, ("HSCAN", k, scan_cursor, "COUNT", count))
    p.fills.append((_fill_map_chunk, r, (carried_at, scan_at), (carried, scan_cursor, limit)))
    if last and limit > 0:  # no later write of this map in the batch: may read on after it
        p.rescans.append(r)


PLAN_OPS = op_table(globals())
