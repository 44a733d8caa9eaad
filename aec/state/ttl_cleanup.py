"""Expired TTL state removed without being read (Flink's incremental TTL cleanup).

TTL state (``aec.state.ttl``) stores each value, list element and map entry with
its expiry time (processing-time seconds). A read never returns an expired entry,
but a key that is never read again would keep it forever: a job writing ever new
keys under a TTL would grow without bound. So backends remove expired entries on
their own, in the background of the batches they run:

- **When it is safe.** The engine calls ``StateBackend.expire(now)`` when no
  record that reads state from then on has a processing time below ``now``: when
  an epoch finishes (every record before its closing watermark or clock advance
  has finished, and later ones arrived after it) and after a checkpoint's drain.
  An entry that expired at or before ``now`` could never be returned again, so
  removing it changes no answer: the sync and async runs still agree.
- **How much.** As Flink's ``cleanupIncrementally(cleanupSize)``, each write
  request lets the backend examine ``CLEANUP_SIZE`` stored entries; the credit
  accumulates and a sweep runs once it reaches ``SWEEP_CHUNK`` entries (so a
  batch of one request does not pay a sweep's fixed cost). Each TTL state has a
  cursor that continues where the last sweep stopped: a round examines every
  entry once, and a new round starts only after ``now`` moved past the time the
  last round used (before that, nothing new can have expired). The states take
  turns: a state whose round ended waits until every other TTL state had its turn,
  so each state gets a round in every cycle, however many there are.
- **The bound.** A write adds at most one entry (a new key, list element or map
  entry; ``put_all``/``add_all`` aside) and lets ``CLEANUP_SIZE`` (c) be examined, so
  a cycle over the S entries all TTL states store takes at most S / c writes, and an
  entry is removed at most one cycle after it expired: S <= live + S / c, so the
  stored state stays within c / (c - 1) times the live state (1.5x with c = 3), plus
  what expires while ``now`` does not advance.

Which backend sweeps how: MemoryBackend walks a copy of each TTL state's key list,
RocksDB reads an expiry index of its writes up to ``now`` (only what expired), SlateDB
scans its key ranges from a cursor key (one ``WriteBatch`` of deletes and rewrites
per sweep), Redis lets the server expire keys (``PEXPIRE``).
``state_items`` shows state as a read at the last ``now`` would: entries expired by
then are left out whether or not a sweep removed them yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from aec.state.requests import Op, StateRequest

KINDS = ("value", "list", "map")
K = TypeVar("K")  # a state's key type
CLEANUP_SIZE = 3  # stored entries examined per write request (Flink's cleanupSize; its default is 5)
SWEEP_CHUNK = 256  # the credit, in entries, at which a sweep runs


class TtlState(NamedTuple):
    """A state stored with expiry times: its name, TTL (seconds) and kind: ``"value"``
    (value, reducing and aggregating state: one ``(value, expiry)`` pair per key),
    ``"list"`` (a list of pairs) or ``"map"`` (a pair per map entry)."""

    name: str
    ttl: float
    kind: str


def expired(expiry: float, now: float) -> bool:
    """Whether an entry with this expiry has expired at processing time ``now``: at
    its expiry it has. The one rule every read and every sweep applies."""
    return expiry <= now


def alive(pair: Any, now: float) -> bool:
    """Whether a stored ``(value, expiry)`` pair is alive at ``now`` (``expired``)."""
    return not expired(pair[1], now)


def prune(kind: str, stored: Any, now: float) -> Any:
    """What remains at processing time ``now`` of a TTL state's stored value of one
    key: ``stored`` itself when nothing in it expired, a new list or dict of the
    entries alive, or None when nothing remains (the key goes). ``kind``: ``"value"``
    (a ``(value, expiry)`` pair; also one map entry of a byte store), ``"list"`` (a
    list of pairs), ``"map"`` (a dict of pairs). An entry is expired when its expiry
    is at or before ``now`` (``aec.state.ttl``: alive while ``expiry > now``)."""
    if kind == "value":
        return stored if alive(stored, now) else None
    if kind == "list":
        kept = [pair for pair in stored if alive(pair, now)]
        return stored if len(kept) == len(stored) else (kept or None)
    entries = {key: pair for key, pair in stored.items() if alive(pair, now)}
    return stored if len(entries) == len(stored) else (entries or None)


def writes_in(requests: Sequence[StateRequest]) -> int:
    """How many of ``requests`` write (what ``TtlCleanup.charge`` credits)."""
    writes = Op.WRITES
    return sum(1 for request in requests if request.op in writes)


# (state, cursor, limit, now) -> (entries examined, the next cursor; None: the round ended)
Step = Callable[[TtlState, object, int, float], tuple[int, object]]


class TtlCleanup:
    """One backend's TTL states, the time up to which it may remove expired entries,
    and its sweep credit and cursors.

    ``advance`` runs on the mailbox thread; ``charge`` and ``sweep`` on the thread
    that runs the backend's batches (the backend keeps them from overlapping a batch
    that writes the same keys).
    """

    def __init__(self, chunk: int = 0) -> None:
        self.chunk = chunk  # the credit at which a sweep runs (0: ``SWEEP_CHUNK``)
        self.states: dict[str, TtlState] = {}
        self.now = -math.inf  # entries expired at or before this may be removed
        self._credit = 0
        self._cursors: dict[str, object] = {}  # state -> where its round goes on
        self._rounds: dict[str, float] = {}  # state -> ``now`` of its last full round
        # the position (in ``states``' order) of the state whose turn it is: a sweep
        # starts there, and moves on when that state's round ends or it has none to do
        self._turn = 0

    def register(self, name: str, ttl: float, kind: str) -> None:
        """State ``name`` is stored with expiry times (``TtlState``).

        Raises ValueError for an unknown kind or a TTL that is not a positive number."""
        if kind not in KINDS:
            raise ValueError(f"TTL state {name!r}: kind must be one of {KINDS}, got {kind!r}")
        if not (isinstance(ttl, (int, float)) and ttl > 0):
            raise ValueError(f"TTL state {name!r}: ttl must be > 0 seconds, got {ttl!r}")
        self.states[name] = TtlState(name, float(ttl), kind)

    def advance(self, now: float) -> None:
        """No record reads state below processing time ``now`` from here on."""
        if now > self.now:
            self.now = now

    def kind(self, state: str) -> str | None:
        """The kind of a TTL state; None for a state without TTL."""
        found = self.states.get(state)
        return None if found is None else found.kind

    def charge(self, writes: int) -> int:
        """Credit ``writes`` write requests; the entries to examine now (0: no sweep
        yet: no TTL state, nothing may expire yet, or too little credit). Lock-free:
        a credit lost to a race between I/O threads only delays a sweep."""
        if not self.may_sweep():
            return 0
        credit = self._credit + CLEANUP_SIZE * writes
        if credit < (self.chunk or SWEEP_CHUNK):
            self._credit = credit
            return 0
        self._credit = 0
        return credit

    def charge_requests(self, requests: Sequence[StateRequest]) -> int:
        """``charge`` for the writes among ``requests``; they are counted only when a
        sweep may come (a job without TTL states pays one check per batch)."""
        if not self.may_sweep():
            return 0
        return self.charge(writes_in(requests))

    def may_sweep(self) -> bool:
        """Whether anything may expire: a TTL state exists and time has started."""
        return bool(self.states) and self.now != -math.inf

    def sweep(self, budget: int, step: Step) -> int:
        """Examine up to ``budget`` entries, state after state from the one whose turn
        it is, each from its cursor: ``step(state, cursor, limit, now)`` examines up to
        ``limit`` entries from ``cursor`` (None: the start), removes or rewrites the
        expired ones and returns how many it examined and where to go on (None: the
        round is over). A state whose last round already used this ``now`` is skipped.
        The entries examined."""
        now, examined = self.now, 0
        states = list(self.states.values())
        count = len(states)
        for offset in range(count):
            turn = (self._turn + offset) % count
            if examined >= budget:
                self._turn = turn  # its turn comes first next time
                break
            state = states[turn]
            cursor = self._cursors.get(state.name)
            if cursor is None and self._rounds.get(state.name, -math.inf) >= now:
                continue  # nothing expired since its last round
            done, cursor = step(state, cursor, budget - examined, now)
            examined += done
            self._cursors[state.name] = cursor
            if cursor is not None:  # the budget ran out inside its round: on next time
                self._turn = turn
                break
            self._rounds[state.name] = now  # its round is over: the next state's turn
        return examined

    def restart(self) -> None:
        """State was replaced (a restore): rounds start again from the beginning."""
        self._cursors.clear()
        self._rounds.clear()

    def visible(self, state: str, items: dict[K, Any]) -> dict[K, Any]:
        """``items`` (``{key: stored value}`` of ``state``, as ``state_items`` gives
        them: pairs, lists of pairs, dicts of pairs) without what expired by ``now``;
        unchanged for a state without TTL."""
        found = self.states.get(state)
        if found is None or self.now == -math.inf:
            return items
        kind, now = found.kind, self.now
        kept = {}
        for key, stored in items.items():
            alive = prune(kind, stored, now)
            if alive is not None:
                kept[key] = alive
        return kept
