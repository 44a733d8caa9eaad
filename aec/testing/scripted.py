"""``ScriptedExecutor``: completes batches in an adversarial, replayable order."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from aec.runtime.executor import Batch, Buffering, StateExecutor

if TYPE_CHECKING:
    from hypothesis.strategies import DataObject


class ScriptedExecutor(StateExecutor):
    """Holds submitted batches and completes them in an order a driver chooses.

    The driver is ``random.Random(seed)`` or, inside a hypothesis test, its
    ``data`` object (then hypothesis shrinks schedules too). Before each input
    element it completes a driver-chosen number of held batches, each chosen
    among all held, and may flush a partial active buffer; when the engine has
    nothing else to do it completes one. ``schedule`` records the choices:
    ``("tick", n_completed)``, ``("flush", n_buffered)`` and
    ``("complete", index, held)``, which with the seed replays the run.
    """

    def __init__(self, seed: int | None = 0, *, data: DataObject | None = None) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self._data = data
        self._held: list[Batch] = []
        self.schedule: list[tuple[str, int] | tuple[str, int, int]] = []

    def _integer(self, high: int) -> int:
        if self._data is not None:
            from hypothesis import strategies as st

            drawn: int = self._data.draw(st.integers(0, high), label="schedule")
            return drawn
        return self._rng.randint(0, high)

    def submit(self, batch: Batch) -> None:
        self.pending += 1
        self._held.append(batch)

    def _complete_one(self) -> None:
        index = self._integer(len(self._held) - 1)
        self.schedule.append(("complete", index, len(self._held)))
        if not hasattr(self, "_mailbox"):  # set by start()
            raise RuntimeError("ScriptedExecutor: no operator attached its mailbox yet")
        self._run(self._held.pop(index), self._mailbox.post_local)

    def tick(self, controller: Buffering) -> None:
        buffered = len(controller.active)
        if buffered and self._integer(3) == 0:
            self.schedule.append(("flush", buffered))
            controller.flush()
        if not self._held:
            return
        count = self._integer(len(self._held))
        self.schedule.append(("tick", count))
        for _ in range(count):
            self._complete_one()

    def wait(self, timeout: float | None) -> None:
        if self._held:
            self._complete_one()

    def close(self) -> None:
        self._held.clear()
