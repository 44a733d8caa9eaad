"""The one error a failed run raises."""

from __future__ import annotations

from typing import Any


class JobFailure(Exception):
    """A run failed: user code or a backend raised (DESIGN rule 10).

    The message names the key and the record being processed; the original
    exception is ``__cause__``. Raised by ``run_keyed`` and every
    ``KeyedProcessOperator`` entry point after all engine threads have stopped.

    Attributes:
        key: the key of the failing record or timer (None if none was current).
        record: the record value or a ``"timer@<t>"`` description (None if none).
    """

    def __init__(self, message: str, *, key: Any = None, record: Any = None) -> None:
        super().__init__(message)
        self.key = key
        self.record = record


def describe(value: Any, limit: int = 200) -> str:
    """Short ``repr`` for error messages; long values are cut at ``limit`` characters."""
    try:
        text = repr(value)
    except Exception as exc:  # a user __repr__ that fails must not hide the real error
        text = f"<unrepresentable {type(value).__name__}: {exc}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
