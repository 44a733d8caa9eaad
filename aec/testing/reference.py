"""The synchronous reference run (docs/semantics.md rule 11): ``async_state=False``."""

from __future__ import annotations

from collections.abc import Iterable

from aec.clock import Clock
from aec.config import AecConfig
from aec.elements import Record, Watermark
from aec.functions import KeyedProcessFunction
from aec.runtime.run import RunResult, run_keyed
from aec.state.backend import StateBackend


def run_sync(
    source: Iterable[Record | Watermark],
    function: KeyedProcessFunction,
    backend: StateBackend | None = None,
    clock: Clock | None = None,
) -> RunResult:
    """The reference run: ``run_keyed`` with ``AecConfig(async_state=False)``."""
    return run_keyed(source, function, backend, AecConfig(async_state=False), clock=clock)
