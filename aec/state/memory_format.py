"""The bytes of MemoryBackend's snapshot files: tables and deltas, state by state.

A file (a base, a delta, one segment of a segmented base) is a msgpack map
``{"format": FORMAT, "kind": "tables" | "delta", "states": {name: [serializer
name, payload]}}``; each state's payload is written by the serializer that state
is registered with (``StateBackend.register_state``; msgpack unless it opted in
to pickle): a table ``{key: value | list | dict}``, or a delta ``[updates,
deletions]``. Decoding reads the container with the safe serializer and each
payload only with the state's registered serializer, after checking that the
file names the same one (``StateSerializers.check_stored``): bytes from a
checkpoint never choose how they are decoded.
"""

from __future__ import annotations

from typing import Any

from aec.keygroups import plain_key
from aec.state.serialization import SAFE, StateSerializers

FORMAT = "aec-memory/2"
Tables = dict[str, dict[Any, Any]]
Delta = dict[str, tuple[dict[Any, Any], list[Any]]]


def encode_tables(tables: Tables, serializers: StateSerializers) -> bytes:
    """The bytes of ``{state: {key: value}}``."""
    return _encode("tables", {name: table for name, table in tables.items()}, serializers)


def encode_delta(delta: Delta, serializers: StateSerializers) -> bytes:
    """The bytes of ``{state: (updates, deletions)}``."""
    return _encode("delta", {name: list(pair) for name, pair in delta.items()}, serializers)


def _encode(kind: str, payloads: dict[str, Any], serializers: StateSerializers) -> bytes:
    states = {}
    for name, payload in payloads.items():
        serializer = serializers.of(name)
        try:
            data = serializer.dumps(payload)
        except TypeError as exc:
            # a key of a subclass of a built-in type (an enum, a named tuple) has no
            # form of its own in a safe serializer: its plain value keys the same state
            try:
                data = serializer.dumps(_with_plain_keys(kind, payload))
            except TypeError:
                raise TypeError(f"state {name!r} cannot be snapshotted: {exc}") from exc
        states[str(name)] = [serializer.name, data]
    return SAFE.dumps({"format": FORMAT, "kind": kind, "states": states})


def _with_plain_keys(kind: str, payload: Any) -> Any:
    """A table ``{key: ...}`` or a delta ``[updates, deletions]`` keyed by ``plain_key``s."""
    if kind == "tables":
        return {plain_key(key): value for key, value in payload.items()}
    updates, deletions = payload
    return [
        {plain_key(key): value for key, value in updates.items()},
        [plain_key(key) for key in deletions],
    ]


def decode_tables(data: bytes, serializers: StateSerializers, where: str) -> Tables:
    """``{state: {key: value}}`` from ``encode_tables`` bytes read from ``where``.

    Raises ValueError naming ``where``: not such a file, or a state stored with a
    serializer other than the one it is registered with (before decoding it)."""
    tables = {}
    for name, payload in _decode(data, "tables", serializers, where).items():
        if not isinstance(payload, dict):
            raise ValueError(f"{where}: state {name!r} is not a table")
        tables[name] = payload
    return tables


def decode_delta(data: bytes, serializers: StateSerializers, where: str) -> Delta:
    """``{state: (updates, deletions)}`` from ``encode_delta`` bytes (ValueError as
    ``decode_tables``)."""
    delta = {}
    for name, payload in _decode(data, "delta", serializers, where).items():
        if not (
            isinstance(payload, list)
            and len(payload) == 2
            and isinstance(payload[0], dict)
            and isinstance(payload[1], list)
        ):
            raise ValueError(f"{where}: state {name!r} is not a delta")
        delta[name] = (payload[0], payload[1])
    return delta


def _decode(data: bytes, kind: str, serializers: StateSerializers, where: str) -> dict[str, Any]:
    try:
        container = SAFE.loads(data)
    except ValueError as exc:
        raise ValueError(f"{where} is not a MemoryBackend snapshot: {exc}") from exc
    if (
        not isinstance(container, dict)
        or container.get("format") != FORMAT
        or container.get("kind") != kind
        or not isinstance(container.get("states"), dict)
    ):
        raise ValueError(f"{where} is not a MemoryBackend {kind} file of format {FORMAT}")
    decoded = {}
    for name, entry in container["states"].items():
        if not (
            isinstance(name, str)
            and isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], bytes)
        ):
            raise ValueError(f"{where} is not a MemoryBackend {kind} file (state {name!r})")
        serializer = serializers.check_stored(name, entry[0], where)
        try:
            decoded[name] = serializer.loads(entry[1])
        except Exception as exc:  # a serializer's many error types
            raise ValueError(f"{where}: state {name!r} cannot be decoded: {exc}") from exc
    return decoded
