"""run_keyed and run_keyed_co: run a keyed function (one or two inputs) over an
in-memory source."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aec.clock import Clock
from aec.config import AecConfig
from aec.elements import Record, Watermark
from aec.functions import KeyedCoProcessFunction, KeyedProcessFunction
from aec.native import mypyc_attr
from aec.runtime.co_operator import KeyedCoProcessOperator, co_element
from aec.runtime.executor import StateExecutor
from aec.runtime.operator import KeyedProcessOperator
from aec.state.backend import StateBackend
from aec.state.memory import MemoryBackend


@mypyc_attr(native_class=False)  # a plain dataclass in both builds (users build and subclass it)
@dataclass
class RunResult:
    """What a run produced.

    Attributes:
        outputs: emitted values and ``Watermark``s in emission order (the last
            is ``Watermark(math.inf)``).
        side_outputs: ``{tag: [value, ...]}`` in emission order per tag.
        metrics: counters (records_in, records_out, max_in_flight, batches,
            requests, max_batch_size, mean_batch_size, blocked_requests,
            timers_fired, watermarks_out, elapsed_s, records_per_s).
        state_names: names of the states the function created.
    """

    outputs: list[Any]  # Any: each function knows its own outputs' types
    side_outputs: dict[Hashable, list[Any]]
    metrics: dict[str, Any]  # numbers, and summaries / lists for the histograms and hot keys
    state_names: list[str] = field(default_factory=list)


def default_backend() -> MemoryBackend:
    """A fresh ``MemoryBackend``: the engine's own in-memory state (the default backend)."""
    return MemoryBackend()


def run_keyed(
    source: Iterable[Record | Watermark],
    function: KeyedProcessFunction,
    backend: StateBackend | None = None,
    config: AecConfig | None = None,
    executor: StateExecutor | None = None,
    clock: Clock | None = None,
) -> RunResult:
    """Run ``function`` over ``source`` to the end of input.

    Args:
        source: ``aec.Record``s and ``aec.Watermark``s in arrival order.
        function: a ``KeyedProcessFunction`` (opened and closed here).
        backend: a ``StateBackend``; None uses a fresh ``MemoryBackend``. A given
            backend is opened and left open so its final state can be read.
        config: ``AecConfig``; None is ``AecConfig()``.
        executor: a ``StateExecutor`` (tests pass ``aec.testing.checker.ScriptedExecutor``).
        clock: the processing-time ``aec.clock.Clock`` (default: the system clock).

    Raises:
        TypeError / ValueError: bad input (an element that is not a Record or
            Watermark, a None or unhashable key, a non-numeric timestamp, a
            regressing watermark), after stopping the run.
        JobFailure: user code or the backend failed.
    """
    if backend is None:
        backend = default_backend()
    operator = KeyedProcessOperator(function, backend, config, executor, clock)
    operator.open()
    try:
        # compiled, a value typed Any is not checked against a type before aec's checks
        elements: Iterable[Any] = source
        for position, element in enumerate(elements):
            if type(element) is Record:
                fields: Any = element  # (narrowed to Record, its timestamp would be checked)
                operator.process_fields(fields.key, fields.value, fields.timestamp)
            elif type(element) is Watermark:
                operator.process_watermark(element)
            else:
                raise TypeError(
                    f"source element #{position} is a {type(element).__name__}; "
                    "expected aec.Record or aec.Watermark"
                )
        operator.finish()
    finally:
        operator.close()
    return _result(operator)


def run_keyed_co(
    source: Iterable[tuple[int, Record | Watermark]],
    function: KeyedCoProcessFunction,
    backend: Any = None,
    config: AecConfig | None = None,
    executor: StateExecutor | None = None,
    clock: Clock | None = None,
) -> RunResult:
    """Run a two-input ``function`` over ``source`` to the end of both inputs.

    Args:
        source: ``(input, element)`` pairs in arrival order: ``input`` is 1 or 2,
            ``element`` an ``aec.Record`` or ``aec.Watermark`` of that input.
        function: a ``KeyedCoProcessFunction`` (opened and closed here).
        backend, config, executor, clock: as ``run_keyed``'s.

    Returns a ``RunResult``; its watermarks are the operator's (the minimum of the
    two inputs', emitted when it advances), the last ``Watermark(math.inf)``.

    Raises:
        TypeError: ``function`` is not a ``KeyedCoProcessFunction``; a source element
            that is not such a pair (naming its position); a bad key or timestamp.
        ValueError: a watermark below its own input's previous one.
        JobFailure: user code or the backend failed.
    """
    if backend is None:
        backend = default_backend()
    operator = KeyedCoProcessOperator(function, backend, config, executor, clock)
    operator.open()
    try:
        items: Iterable[Any] = source  # compiled: not checked against a type before co_element
        for position, item in enumerate(items):
            operator.process_input(*co_element(item, position))
        operator.finish()
    finally:
        operator.close()
    return _result(operator)


def _result(operator: KeyedProcessOperator) -> RunResult:
    """What a finished (and closed) operator produced."""
    return RunResult(
        operator.drain_outputs(),
        operator.drain_side_outputs(),
        operator.metrics,
        operator.state_names,
    )
