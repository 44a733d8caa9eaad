"""MemoryBackend: state in Python dicts, answered on the mailbox thread."""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import islice
from typing import Any, Final, cast

from aec.keygroups import KeyGroupRange, key_group_for
from aec.native import mypyc_attr
from aec.state import memory_changelog as changelog
from aec.state.backend import BackendSpec, StateBackend
from aec.state.memory_changelog import Changelog
from aec.state.memory_segments import LazyBase
from aec.state.requests import Op, StateRequest, op_table
from aec.state.serialization import StateSerializers
from aec.state.ttl_cleanup import TtlCleanup, TtlState, expired, prune

_WRITES = Op.WRITES
_VALUE_GET: Final = Op.VALUE_GET
_VALUE_PUT: Final = Op.VALUE_PUT

# one state's table: key -> stored value (a value, a list, or a dict of map entries)
Table = dict[Any, Any]


# a Python class (compiled methods): its base keeps caches in the instance ``__dict__``,
# and users subclass it (setup.py lets its compiled methods take their instances)
@mypyc_attr(native_class=False)
class MemoryBackend(StateBackend):
    """Heap state: ``{state name: {key: value | list | dict}}``.

    Non-blocking (``blocking = False``): batches run on the mailbox thread.
    Snapshots are incremental by default (``incremental=True``): each writes only
    the keys changed since the previous one, against a base, and folds the
    changelog after ``max_deltas`` snapshots (``aec.state.memory_changelog``).
    Values are stored by reference, as in Flink's heap backend: mutate a value
    read from state only through the state API. Reads of list and map state
    return fresh containers. Serialization happens at snapshots only, each
    state's values by its registered serializer (``register_state``; the safe
    msgpack one by default: a value it cannot store fails the snapshot with a
    ``TypeError`` naming the state, and restoring decodes nothing with pickle
    unless the state opted in).

    A large base is written segmented (``aec.state.memory_segments``); restoring
    one snapshot without key-group filtering then reads only the segment index
    and the changelog, and a segment is merged into the live tables the first
    time a request touches one of its keys (``state_items`` and a new base merge
    them all). A corrupt segment fails the batch that reads it (``ValueError``).

    TTL state (``aec.state.ttl_cleanup``): after a batch whose writes earned a
    sweep, expired entries are removed from a copy of each TTL state's key list,
    continued from batch to batch (removals go into the next snapshot's delta like
    any write); segments of a restored base not merged yet are merged as the sweep
    goes, so they are swept too.
    """

    blocking = False
    prefers_batches = False  # a call costs what its requests cost: nothing to share

    def __init__(self, *, incremental: bool = True, max_deltas: int = 16) -> None:
        self._tables: dict[str, Table] = {}
        self.incremental = incremental
        self._changelog = Changelog(max_deltas)
        self._lazy: LazyBase | None = None  # base segments of a restore not merged yet

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        if self._lazy is not None:
            self._lazy.load_keys([request.key for request in requests], self._tables)
            self._settle()
        tables = self._tables
        dirty = self._changelog.dirty  # None: no base yet, the next snapshot is whole
        writes = 0
        for request in requests:
            table = tables.get(request.state)
            if table is None:
                table = tables[request.state] = {}
            op = request.op
            # the two commonest ops called by name: compiled, a direct call, where the
            # table's entry is a call through Python's calling convention
            if op == _VALUE_GET:
                _value_get(table, request)
            elif op == _VALUE_PUT:
                _value_put(table, request)
            else:
                _APPLY[op](table, request)
            if op in _WRITES:
                writes += 1
                if dirty is not None:
                    dirty.add((request.state, request.key))
        cleanup = self._ttl_cleanup
        if writes and cleanup is not None and (budget := cleanup.charge(writes)):
            self._sweep(cleanup, budget)

    def _sweep(self, cleanup: TtlCleanup, budget: int) -> None:
        """Remove expired TTL entries, ``budget`` entries examined at most."""
        if self._lazy is not None:  # a restored base: swept as its segments come in
            self._lazy.load_some(self._tables, budget)
            self._settle()
        cleanup.sweep(budget, self._sweep_step)

    def _sweep_step(
        self, state: TtlState, cursor: object, limit: int, now: float
    ) -> tuple[int, list[Any] | None]:
        """``TtlCleanup.sweep``'s step: ``cursor`` is ``[keys, position]`` (a copy of the
        table's keys made when the round began)."""
        table = self._tables.get(state.name)
        if not table:
            return 0, None
        position: list[Any] = [list(table), 0] if cursor is None else cast("list[Any]", cursor)
        keys, start = position
        end = min(len(keys), start + limit)
        get, kind, name, dirty = table.get, state.kind, state.name, self._changelog.dirty
        if kind == "value":  # most TTL state: a pair per key, dropped whole
            for key in [k for k in islice(keys, start, end) if (p := get(k)) and expired(p[1], now)]:
                del table[key]
                if dirty is not None:
                    dirty.add((name, key))
        else:
            for key in islice(keys, start, end):
                stored = get(key)
                if stored is None or (kept := prune(kind, stored, now)) is stored:
                    continue
                if kept is None:
                    del table[key]
                else:
                    table[key] = kept
                if dirty is not None:
                    dirty.add((name, key))
        position[1] = end
        return end - start, (position if end < len(keys) else None)

    def stored_entries(self, state: str) -> int:
        """Keys holding ``state`` (a restored base's segments are merged first)."""
        self._load_all()
        return len(self._tables.get(state, ()))

    def snapshot(self, directory: str) -> None:
        """Write the state into ``directory``: incrementally (a base plus the
        changelog, hard-linked; ``aec.state.memory_changelog``) or, with
        ``incremental=False``, as one full pickle."""
        if not self.incremental:
            self._changelog.reset()
        self._changelog.snapshot(self._tables, directory, self.serializers, self._lazy)
        self._settle()
        if not self.incremental:
            self._changelog.close()

    def close(self) -> None:
        self._drop_lazy()
        self._changelog.close()

    def _settle(self) -> None:
        """Close the restored base once every segment is merged."""
        if self._lazy is not None and self._lazy.done:
            self._drop_lazy()

    def _drop_lazy(self) -> None:
        lazy, self._lazy = self._lazy, None
        if lazy is not None:
            lazy.close()

    def _load_all(self) -> None:
        if self._lazy is not None:
            self._lazy.load_all(self._tables)
            self._drop_lazy()

    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        """Replace all state with the union of the snapshots in ``directory`` (one or
        several), keeping only keys of ``key_groups`` (None: all). Every snapshot is
        loaded and merged before the live tables are swapped.

        Raises:
            FileNotFoundError: a directory without a snapshot.
            ValueError: a file that is not a MemoryBackend snapshot, a state stored
                with a serializer other than its registered one, ``key_groups``
                without ``max_parallelism``, or a key stored in two snapshots.
        """
        directories = [directory] if isinstance(directory, (str, os.PathLike)) else list(directory)
        if key_groups is not None and max_parallelism is None:
            raise ValueError("restore with key_groups needs the max_parallelism they use")
        touched: set[tuple[str, Any]] = set()
        whole = len(directories) == 1 and key_groups is None
        if whole:  # a segmented base is merged on first access
            merged, lazy = changelog.load(
                os.fspath(directories[0]), self.serializers, touched, lazy=True
            )
        else:
            merged = _merged(directories, key_groups, max_parallelism, touched, self.serializers)
            lazy = None
        try:
            if self.incremental and whole:
                self._changelog.adopt(os.fspath(directories[0]), touched)
            else:
                self._changelog.reset()
        except BaseException:
            if lazy is not None:
                lazy.close()
            raise
        self._drop_lazy()
        self._tables, self._lazy = merged, lazy
        self.ttl_cleanup.restart()

    def spec(self) -> BackendSpec:
        return MemorySpec(self.incremental, self._changelog.max_deltas)

    def state_items(self, state: str) -> Table:
        self._load_all()
        items = {key: _copy(value) for key, value in self._tables.get(state, {}).items()}
        return self.ttl_cleanup.visible(state, items)


def _merged(
    directories: list[Any],
    key_groups: KeyGroupRange | None,
    max_parallelism: int | None,
    touched: set[tuple[str, Any]],
    serializers: StateSerializers,
) -> dict[str, Table]:
    """The union of the snapshots in ``directories``, filtered to ``key_groups``.

    Raises ValueError: a key stored in two of the snapshots."""
    merged: dict[str, Table] = {}
    for source in directories:
        tables, _ = changelog.load(os.fspath(source), serializers, touched)
        if key_groups is not None and max_parallelism is not None:  # restore checked both
            tables = _only(tables, key_groups, max_parallelism)
        if len(directories) == 1:
            return tables
        for name, table in tables.items():
            target = merged.setdefault(name, {})
            if not target.keys().isdisjoint(table):
                raise ValueError(
                    f"state {name!r}: a key is stored in two of the snapshots {directories}"
                )
            target.update(table)
    return merged


def _only(
    tables: dict[str, Table], key_groups: KeyGroupRange, max_parallelism: int
) -> dict[str, Table]:
    """``tables`` with the keys of ``key_groups`` only."""
    groups: dict[object, bool] = {}
    kept = {}
    for name, table in tables.items():
        own = {}
        for key, value in table.items():
            inside = groups.get(key)
            if inside is None:
                inside = groups[key] = key_group_for(key, max_parallelism) in key_groups
            if inside:
                own[key] = value
        kept[name] = own
    return kept


@mypyc_attr(native_class=False)
class MemorySpec(BackendSpec):
    """Builds an empty ``MemoryBackend`` for any partition (same options)."""

    def __init__(self, incremental: bool = True, max_deltas: int = 16) -> None:
        self.incremental = incremental
        self.max_deltas = max_deltas

    def build(self, partition: int) -> StateBackend:
        return MemoryBackend(incremental=self.incremental, max_deltas=self.max_deltas)


def _copy(value: Any) -> Any:
    if type(value) is list:
        return list(value)
    if type(value) is dict:
        return dict(value)
    return value


# One small function per op; indexed by the Op constant.
def _value_get(t: Table, r: StateRequest) -> None:
    r.result = t.get(r.key)


def _value_put(t: Table, r: StateRequest) -> None:
    if r.value is None:
        t.pop(r.key, None)
    else:
        t[r.key] = r.value


def _clear(t: Table, r: StateRequest) -> None:
    t.pop(r.key, None)


def _list_get(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = list(stored) if stored else []


def _list_add(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = [r.value]
    else:
        stored.append(r.value)


def _list_add_all(t: Table, r: StateRequest) -> None:
    if not r.value:
        return
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = list(r.value)
    else:
        stored.extend(r.value)


def _list_put(t: Table, r: StateRequest) -> None:
    if r.value:
        t[r.key] = list(r.value)
    else:
        t.pop(r.key, None)


def _map_get(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = None if stored is None else stored.get(r.user_key)


def _map_put(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = {r.user_key: r.value}
    else:
        stored[r.user_key] = r.value


def _map_put_all(t: Table, r: StateRequest) -> None:
    if not r.value:
        return
    stored = t.get(r.key)
    if stored is None:
        t[r.key] = dict(r.value)
    else:
        stored.update(r.value)


def _map_remove(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    if stored is not None:
        stored.pop(r.user_key, None)
        if not stored:
            del t[r.key]


def _map_contains(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = stored is not None and r.user_key in stored


def _map_is_empty(t: Table, r: StateRequest) -> None:
    r.result = not t.get(r.key)


def _map_iter(t: Table, r: StateRequest) -> None:
    stored = t.get(r.key)
    r.result = list(stored.items()) if stored else []


def _list_get_chunk(t: Table, r: StateRequest) -> None:
    offset, limit = r.value
    offset = offset or 0
    stored = t.get(r.key) or ()
    end = offset + limit
    r.result = (list(stored[offset:end]), end if end < len(stored) else None)


def _map_iter_chunk(t: Table, r: StateRequest) -> None:
    # insertion order; a map longer than one chunk is walked over the keys it held at
    # the first chunk (the cursor: those keys and a position), so entries removed while
    # iterating shift nothing (none is skipped) and entries added are not visited
    cursor, limit = r.value
    stored = t.get(r.key) or {}
    if cursor is None:
        if len(stored) <= limit:
            r.result = (list(stored.items()), None)
            return
        cursor = (list(stored), 0)
    keys, start = cursor
    end = start + limit
    items = [(key, stored[key]) for key in keys[start:end] if key in stored]
    r.result = (items, (keys, end) if end < len(keys) else None)


_APPLY = op_table(globals())
