"""BatchCostModel: when a batch is cheaper to run on the mailbox thread than to hand off.

A thread-pool hand-off costs a queue hop to an I/O thread and a wake-up of the
mailbox thread (GIL hand-overs included), tens to hundreds of microseconds on a
busy machine. A backend that answers from memory (RocksDB memtable or block-cache
hits, a warm cache) runs a small batch in less than that, so with skewed keys,
where a hot key forces thousands of tiny batches, the hand-offs cost more than the
state access itself. The model keeps, per batch-size class (``n.bit_length()``),
an exponentially weighted mean of the wall time a batch took *on the mailbox
thread*, and of the hand-off overhead measured on thread-pool batches; a batch
runs inline when its class is known to take no longer than a hand-off. Classes are
re-explored now and then (inline once every 64 batches when unknown or refused,
on a thread once every 256 when inline: each such hand-off costs what the model
saves), so the choice follows the backend as caches warm or latency changes.
Updates are plain float stores from several threads: a lost sample only delays
the estimate, so no lock is needed.
"""

from __future__ import annotations

_ALPHA = 0.1  # weight of a new sample in the moving means
_EXPLORE_EVERY = 64  # an unknown or refused class tries inline this often
_REFRESH_EVERY = 256  # an inline class goes to a thread this often (fresh hand-off cost)
_CLASSES = 32


class BatchCostModel:
    """Per batch-size class: inline wall seconds; overall: hand-off seconds."""

    __slots__ = ("inline_seconds", "handoff_seconds", "_decisions")

    def __init__(self, handoff_seconds: float = 100e-6) -> None:
        self.inline_seconds: list[float | None] = [None] * _CLASSES
        self.handoff_seconds = handoff_seconds
        self._decisions = [0] * _CLASSES

    def run_inline(self, size: int) -> bool:
        """Whether a batch of ``size`` requests should run on the mailbox thread."""
        cls = min(size.bit_length(), _CLASSES - 1)
        count = self._decisions[cls] = self._decisions[cls] + 1
        estimate = self.inline_seconds[cls]
        if estimate is None:
            return count % _EXPLORE_EVERY == 1  # never measured: try it once in a while
        if estimate <= self.handoff_seconds:
            return count % _REFRESH_EVERY != 0  # refresh the hand-off cost now and then
        return count % _EXPLORE_EVERY == 1

    def cheaper_inline(self, size: int) -> bool:
        """Whether batches of ``size`` measured no slower inline than a hand-off."""
        estimate = self.inline_seconds[min(size.bit_length(), _CLASSES - 1)]
        return estimate is not None and estimate <= self.handoff_seconds

    def record_inline(self, size: int, seconds: float) -> None:
        """A batch of ``size`` requests took ``seconds`` (wall) on the mailbox thread."""
        cls = min(size.bit_length(), _CLASSES - 1)
        old = self.inline_seconds[cls]
        self.inline_seconds[cls] = seconds if old is None else old + _ALPHA * (seconds - old)

    def record_handoff(self, seconds: float) -> None:
        """A thread-pool batch spent ``seconds`` in hand-offs (queue hop, wake-up)."""
        self.handoff_seconds += _ALPHA * (seconds - self.handoff_seconds)
