"""A gate between a backend's batches and its TTL sweep (``aec.state.ttl_cleanup``).

A backend whose batches may run on several I/O threads at once (SlateDB, RocksDB
with a thread pool) may not
sweep a key while a batch writes it: the sweep could read an expired value, the
batch write a new one, and the sweep delete the new one. Batches of different
keys may overlap each other (the engine never runs two batches of one key at once),
so batches pass the gate together and a sweep passes it alone: it waits for the
batches running to end, and batches arriving meanwhile wait for it. A sweep is
short (a bounded number of entries), and runs only when requests earned one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from aec.state.requests import StateRequest
from aec.state.ttl_cleanup import Step, TtlCleanup


class SweepGate:
    """Shared passage for batches, exclusive for sweeps (a sweep wanted goes first)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._batches = 0  # batches inside
        self._sweeping = False  # a sweep is inside or waiting for the batches to leave

    def enter_batch(self) -> None:
        """A batch passes the gate (waits while a sweep is inside or waiting)."""
        with self._changed:
            while self._sweeping:
                self._changed.wait()
            self._batches += 1

    def leave_batch(self) -> None:
        """A batch that entered has ended."""
        with self._changed:
            self._batches -= 1
            # only a sweep waits for the batches to leave (and batches for it to end)
            if not self._batches and self._sweeping:
                self._changed.notify_all()

    @contextlib.contextmanager
    def sweep(self) -> Iterator[bool]:
        """Hold the gate alone; yields False (and holds nothing) when another sweep is
        inside or waiting already: then there is nothing to do."""
        with self._changed:
            if self._sweeping:
                alone = False
            else:
                self._sweeping = alone = True
                while self._batches:
                    self._changed.wait()
        try:
            yield alone
        finally:
            if alone:
                with self._changed:
                    self._sweeping = False
                    self._changed.notify_all()

    def run_batch(
        self,
        cleanup: TtlCleanup | None,
        requests: Sequence[StateRequest],
        step: Step,
        execute: Callable[[Sequence[StateRequest]], None],
    ) -> None:
        """One batch: with TTL states, the sweep its writes earned first, alone
        (``cleanup.sweep(budget, step)``), then ``execute(requests)`` (the batch)
        beside other batches; without, ``execute(requests)`` alone.

        A batch that finds no TTL state needs no gate: it holds no request of a TTL
        state (a state is registered before its first request is made), so no sweep
        can touch its keys, and a sweep only waits for batches that may."""
        if cleanup is None or not cleanup.states:
            execute(requests)
            return
        budget = cleanup.charge_requests(requests)
        if budget:
            with self.sweep() as alone:
                if alone:
                    cleanup.sweep(budget, step)
        self.enter_batch()  # not a context manager: a generator's frames per batch cost
        try:
            execute(requests)
        finally:
            self.leave_batch()
