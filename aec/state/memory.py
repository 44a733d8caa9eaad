"""MemoryBackend: state in Python dicts, answered on the mailbox thread."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from itertools import islice
from typing import Any

from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import StateRequest, op_table

_SNAPSHOT_FILE = "memory-state.pickle"


class MemoryBackend(StateBackend):
    """Heap state: ``{state name: {key: value | list | dict}}``.

    Non-blocking (``blocking = False``): batches run on the mailbox thread.
    Values are stored by reference, as in Flink's heap backend: mutate a value
    read from state only through the state API. Reads of list and map state
    return fresh containers.
    """

    blocking = False

    def __init__(self) -> None:
        self._tables: dict[str, dict[Any, Any]] = {}

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        tables = self._tables
        for request in requests:
            table = tables.get(request.state)
            if table is None:
                table = tables[request.state] = {}
            _APPLY[request.op](table, request)

    def snapshot(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, _SNAPSHOT_FILE)
        tmp = path + ".tmp"
        with open(tmp, "wb") as out:
            pickle.dump(self._tables, out, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    def restore(self, directory: str) -> None:
        path = os.path.join(directory, _SNAPSHOT_FILE)
        with open(path, "rb") as src:
            tables = pickle.load(src)
        if not isinstance(tables, dict):
            raise ValueError(f"{path} is not a MemoryBackend snapshot")
        self._tables = tables

    def spec(self) -> BackendSpec:
        return MemorySpec()

    def state_items(self, state: str) -> dict[Any, Any]:
        return {key: _copy(value) for key, value in self._tables.get(state, {}).items()}


class MemorySpec(BackendSpec):
    """Builds an empty ``MemoryBackend`` for any partition."""

    def build(self, partition: int) -> StateBackend:
        return MemoryBackend()


def _copy(value: Any) -> Any:
    if type(value) is list:
        return list(value)
    if type(value) is dict:
        return dict(value)
    return value


# One small function per op; indexed by the Op constant.
def _value_get(t: dict[Any, Any], r: StateRequest) -> None:
    r.result = t.get(r.key)


def _value_put(t: dict[Any, Any], r: StateRequest) -> None:
    if r.value is None:
        t.pop(r.key, None)
    else:
        t[r.key] = r.value


def _clear(t: dict[Any, Any], r: StateRequest) -> None:
    t.pop(r.key, None)


def _list_get(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = list(stored) if stored else []


def _list_add(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = [r.value]
    else:
        stored.append(r.value)


def _list_add_all(t: dict[Any, Any], r: StateRequest) -> None:
    if not r.value:
        return
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = list(r.value)
    else:
        stored.extend(r.value)


def _list_put(t: dict[Any, Any], r: StateRequest) -> None:
    if r.value:
        t[r.key] = list(r.value)
    else:
        t.pop(r.key, None)


def _map_get(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = None if stored is None else stored.get(r.user_key)


def _map_put(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = {r.user_key: r.value}
    else:
        stored[r.user_key] = r.value


def _map_put_all(t: dict[Any, Any], r: StateRequest) -> None:
    if not r.value:
        return
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = dict(r.value)
    else:
        stored.update(r.value)


def _map_remove(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    if stored is not None:
        stored.pop(r.user_key, None)
        if not stored:
            del t[r.key]


def _map_contains(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = stored is not None and r.user_key in stored


def _map_is_empty(t: dict[Any, Any], r: StateRequest) -> None:
    r.result = not t.get(r.key)


def _map_iter(t: dict[Any, Any], r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = list(stored.items()) if stored else []


def _list_get_chunk(t: dict[Any, Any], r: StateRequest) -> None:
    offset, limit = r.value
    offset = offset or 0
    stored = t.get(r.key) or ()
    end = offset + limit
    r.result = (list(stored[offset:end]), end if end < len(stored) else None)


def _map_iter_chunk(t: dict[Any, Any], r: StateRequest) -> None:
    offset, limit = r.value
    offset = offset or 0
    stored = t.get(r.key) or {}
    end = offset + limit
    # insertion order; a cursor is an offset, so entries added while iterating may shift it
    r.result = (list(islice(stored.items(), offset, end)), end if end < len(stored) else None)


_APPLY = op_table(globals())
