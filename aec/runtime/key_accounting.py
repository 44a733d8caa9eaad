"""KeyAccountingUnit: which record currently holds each key (FLIP-425).

Invariant: at most one RecordContext per key is past key accounting; it holds
the key from when it occupied it (``try_occupy``, or ``transfer`` from the
record before it) until it ``release``s it or hands it on. The controller asks;
only this class edits the map (Flink's ``KeyAccountingUnit``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aec.runtime.record_context import RecordContext


class KeyAccountingUnit:
    """Maps each occupied key to the RecordContext holding it (mailbox thread only)."""

    __slots__ = ("_holders", "claim")

    def __init__(self) -> None:
        self._holders: dict[Hashable, RecordContext] = {}
        # claim(key, context): the key's holder after the call, ``context`` itself if
        # the key was free (it holds it now). The map's setdefault, bound once: the
        # AEC asks once per admitted record, and a C call costs no Python frame.
        self.claim: Callable[[Hashable, RecordContext], RecordContext] = self._holders.setdefault

    def try_occupy(self, context: RecordContext) -> bool:
        """Let ``context`` hold its key if free; False if another record holds it. O(1)."""
        return self.claim(context.key, context) is context

    def occupy(self, context: RecordContext) -> None:
        """``context`` holds its key, which must be free (RuntimeError otherwise)."""
        if not self.try_occupy(context):
            raise RuntimeError(f"{context.describe()} took a key another record holds")

    def release(self, context: RecordContext) -> None:
        """Free the key ``context`` holds. Raises RuntimeError if it does not hold it."""
        if self._holders.pop(context.key, None) is not context:
            raise RuntimeError(f"{context.describe()} released a key it did not hold")

    def transfer(self, context: RecordContext, successor: RecordContext) -> None:
        """Hand the key from ``context`` straight to ``successor`` (same key), as
        when the next waiting record of the key starts. Raises RuntimeError if
        ``context`` does not hold it."""
        holders = self._holders
        if holders.get(context.key) is not context:
            raise RuntimeError(f"{context.describe()} handed on a key it did not hold")
        holders[context.key] = successor

    def holder(self, key: Hashable) -> RecordContext | None:
        """The record holding ``key``, or None."""
        return self._holders.get(key)

    def items(self) -> list[tuple[Hashable, RecordContext]]:
        """``(key, holder)`` pairs (a copy; for inspection and tests)."""
        return list(self._holders.items())

    def held_keys(self) -> list[Hashable]:
        """Every occupied key (for the stuck-run error and metrics)."""
        return list(self._holders)

    def __len__(self) -> int:
        return len(self._holders)
