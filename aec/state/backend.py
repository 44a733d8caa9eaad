"""The backend contract: what every state backend implements.

A backend stores keyed state and answers batches of ``aec.state.requests.StateRequest``.
``execute_batch`` is called on executor threads (never on the mailbox thread
for blocking backends) and must never call user code.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from aec.keygroups import KeyGroupRange
from aec.state.requests import StateRequest
from aec.state.serialization import Serializer, StateSerializers
from aec.state.ttl_cleanup import TtlCleanup

_MAKING = threading.Lock()  # held while a backend's TtlCleanup is made (once per backend)


class BackendSpec(ABC):
    """A picklable recipe for a backend, so a Spark executor builds its own.

    ``build(partition)`` returns a new, unopened backend for partition number
    ``partition`` (an int >= 0); a file-based backend puts each partition in its
    own directory.
    """

    @abstractmethod
    def build(self, partition: int) -> StateBackend: ...


class StateBackend(ABC):
    """Keyed state storage answering batches of state requests.

    Attributes:
        blocking: True when ``execute_batch`` waits on I/O with the GIL released,
            so the engine runs it on ``executor_threads`` I/O threads, where it
            overlaps the mailbox thread; False runs it on the mailbox thread
            (completions still arrive as mails): a store answering from memory, or
            one whose calls hold the GIL (an I/O thread could only take turns).
        prefers_batches: True when a call costs more than a request within one
            (a store call's own overhead, a round trip), so a request that could
            run at once (a hot key's next record) joins the records' batch when
            other records have requests waiting; False (a dict in memory) runs
            such requests at once. Default True.
        ttl_sweep_chunk: the fewest entries a TTL sweep examines (its fixed cost is
            spread over them); 0: ``aec.state.ttl_cleanup.SWEEP_CHUNK``.

    Values are stored with the serializer each state is registered with
    (``register_state``; ``aec.state.serialization``); a state never registered
    uses the safe default. A backend decodes stored bytes only with the registered
    serializer, never with one the bytes (or a snapshot file) name.

    TTL states (``register_ttl``) store values with their expiry time; the engine
    tells the backend how far it may remove expired ones (``expire``), and the
    backend does so without a record reading them (``aec.state.ttl_cleanup``).
    """

    blocking: bool = True
    prefers_batches: bool = True
    ttl_sweep_chunk: int = 0  # entries a TTL sweep takes at least (0: the default)
    # made on first use, so subclasses need not call an ``__init__``; plain attributes, not
    # ``self.__dict__`` (reading that makes CPython 3.11 look up every attribute of the
    # backend in a dict from then on, execute_batch's included)
    _state_serializers: StateSerializers | None = None
    _ttl_cleanup: TtlCleanup | None = None

    def open(self) -> None:
        """Acquire resources; called once before the first batch."""

    @property
    def serializers(self) -> StateSerializers:
        """The serializer of every registered state (made on first use)."""
        found = self._state_serializers
        if found is None:
            found = self._state_serializers = StateSerializers()
        return found

    def register_state(self, name: str, serializer: Serializer) -> None:
        """Store state ``name``'s values with ``serializer`` from now on.

        The engine calls it when a state's handle is made (before any request of
        that state) and, on restore, for every state the checkpoint records, before
        ``restore``. Wrapping backends pass it on to the backend they wrap.

        Raises ValueError when ``name`` is registered with another serializer.
        """
        self.serializers.register(name, serializer)

    @property
    def ttl_cleanup(self) -> TtlCleanup:
        """The TTL states and how far their expired entries may go (made on first use)."""
        found = self._ttl_cleanup
        if found is None:
            # once: an I/O thread's first table may ask while the mailbox thread
            # registers a TTL state, and a second object would lose the registration
            with _MAKING:
                found = self._ttl_cleanup
                if found is None:
                    found = self._ttl_cleanup = TtlCleanup(self.ttl_sweep_chunk)
        return found

    def register_ttl(self, name: str, ttl: float, kind: str) -> None:
        """State ``name`` stores its values with expiry times (``aec.state.ttl``): ``ttl``
        seconds of processing time, ``kind`` ``"value"``, ``"list"`` or ``"map"``
        (``aec.state.ttl_cleanup.TtlState``). The engine calls it when the state's
        handle is made, after ``register_state``. Wrapping backends pass it on.

        Raises ValueError for an unknown kind or a TTL that is not > 0.
        """
        self.ttl_cleanup.register(name, ttl, kind)

    def expire(self, now: float) -> None:
        """Entries of TTL states that expired at or before ``now`` (processing-time
        seconds) may be removed: no record that reads state from here on has an
        earlier processing time. Called by the engine on the mailbox thread (when
        an epoch finishes, and after a checkpoint's drain), possibly while batches
        run; it must be cheap: backends sweep in their own batches. Wrapping backends
        pass it on."""
        cleanup = self._ttl_cleanup
        if cleanup is not None:
            cleanup.advance(now)

    def stored_entries(self, state: str) -> int:
        """How many entries the store holds for ``state``, expired ones not removed
        yet included (keys; map entries on RocksDB, SlateDB and Redis count one each
        on the first two, one per key on Redis). For tests and benchmarks: O(state)."""
        raise NotImplementedError(f"{type(self).__name__} cannot count state")

    @abstractmethod
    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        """Apply ``requests`` in list order, filling ``result`` of each read.

        Blocking. Raises whatever the store raised; the engine then fails the
        run with ``aec.JobFailure``. Batches given to concurrent calls never
        hold requests of the same key.
        """

    def execute_batch_now(self, requests: Sequence[StateRequest]) -> bool:
        """Run ``requests`` as ``execute_batch`` would and return True if that needs no
        waiting on I/O (a cache holding every entry the batch reads); else change
        nothing and return False.

        A blocking backend's batch goes to an I/O thread; the engine asks this first,
        so a batch memory answers completes on the mailbox thread without a thread
        hand-off or the records it would let pile up in flight. Must not block; raises
        as ``execute_batch``. Default: False (always hand off).
        """
        return False

    def flush(self) -> None:
        """Make every acknowledged write durable (write-back caches, remote stores).

        Called by the engine at the end of input (a drain) and before snapshots,
        on the mailbox thread with no batch running. Raises on failure; the engine
        then fails the run, so no acknowledged write is silently lost.
        """

    @abstractmethod
    def snapshot(self, directory: str) -> None:
        """Write a consistent copy of all state into ``directory`` (created if missing)."""

    @abstractmethod
    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        """Replace all state with the union of the copies ``snapshot`` wrote to
        ``directory`` (one directory, or several: rescaling merges the snapshots of
        several operators), keeping only keys whose key group is in ``key_groups``
        (None: every key). ``max_parallelism`` is the one the key groups were computed
        with (required with ``key_groups`` by backends that do not store key groups).
        Byte stores read only the key-group range (keys are prefixed by key group);
        nothing live changes before every snapshot was found readable.

        Raises FileNotFoundError or ValueError when a directory holds no valid snapshot.
        """

    def scratch_parent(self) -> str | None:
        """Where a restore makes the private directory it puts a checkpoint's files in
        (verified there) before ``restore`` opens them: a directory on the file system
        this backend keeps its own files on, written by this user only, so the files
        are hard-linked there and linked again by the backend, never copied. None:
        the system's temporary directory."""
        return None

    def close(self) -> None:
        """Release resources; the backend is unusable afterwards. Idempotent."""

    def spec(self) -> BackendSpec:
        """A picklable recipe building an equivalent, empty backend per partition."""
        raise NotImplementedError(f"{type(self).__name__} has no picklable spec")

    def state_items(self, state: str) -> dict[Any, Any]:
        """All ``key -> stored value`` of state ``state`` (lists and dicts for list and
        map state); for tests and equivalence checks, not for the hot path. For a TTL
        state, as a read at the last ``expire`` time would see it: entries expired by
        then are left out, whether a sweep removed them yet or not."""
        raise NotImplementedError(f"{type(self).__name__} cannot list state")
