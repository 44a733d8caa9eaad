"""KeyAccountingUnit: which record currently holds each key (FLIP-425).

Invariant: at most one RecordContext per key is past key accounting; it holds
the key from its admission until its reference count reaches 0.
"""

from __future__ import annotations

from typing import Any


class KeyAccountingUnit:
    """Maps each occupied key to the RecordContext holding it."""

    __slots__ = ("holders",)

    def __init__(self) -> None:
        self.holders: dict[Any, Any] = {}

    def try_occupy(self, context: Any) -> bool:
        """Let ``context`` hold its key if free; False if another record holds it."""
        holders = self.holders
        if context.key in holders:
            return False
        holders[context.key] = context
        return True

    def release(self, context: Any) -> None:
        """Free the key ``context`` holds. Raises RuntimeError if it does not hold it."""
        if self.holders.pop(context.key, None) is not context:
            raise RuntimeError(f"{context.describe()} released a key it did not hold")

    def transfer(self, context: Any, successor: Any) -> None:
        """Hand the key from ``context`` straight to ``successor`` (same key)."""
        self.holders[context.key] = successor

    def __len__(self) -> int:
        return len(self.holders)
