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

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the gate for one batch (waits while a sweep is inside or waiting)."""
        with self._changed:
            while self._sweeping:
                self._changed.wait()
            self._batches += 1
        try:
            yield
        finally:
            with self._changed:
                self._batches -= 1
                if not self._batches:
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
        cleanup: TtlCleanup,
        requests: Sequence[StateRequest],
        step: Step,
        execute: Callable[[], None],
    ) -> None:
        """One batch of a backend with TTL states: the sweep its writes earned first,
        alone (``cleanup.sweep(budget, step)``), then ``execute()`` (the batch) beside
        other batches."""
        budget = cleanup.charge_requests(requests)
        if budget:
            with self.sweep() as alone:
                if alone:
                    cleanup.sweep(budget, step)
        with self.batch():
            execute()
