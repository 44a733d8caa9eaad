"""Testing helpers for users: the synchronous reference run, an adversarial
executor, and the equivalence check (the async run gives the sync answer).

    from aec.testing import assert_equivalent
    assert_equivalent(MyFunction, records_and_watermarks)

``assert_equivalent`` runs ``function_factory()`` synchronously (the
reference, ``async_state=False``) and asynchronously under scripted batch
completion orders, and compares what docs/semantics.md rule 11 promises: the output
sequence per key (and per side-output tag and key), the watermark sequence,
each output's position relative to the watermarks, and the final state.
``assert_equivalent_co`` does the same for a two-input ``KeyedCoProcessFunction``
over ``(input, element)`` pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from aec.clock import ScriptedClock
from aec.config import AecConfig
from aec.elements import Record, Watermark
from aec.functions import KeyedCoProcessFunction, KeyedProcessFunction
from aec.runtime.co_operator import KeyedCoProcessOperator, co_element
from aec.runtime.executor import StateExecutor
from aec.runtime.operator import KeyedProcessOperator
from aec.runtime.output import Trace
from aec.runtime.run import default_backend
from aec.state.backend import StateBackend
from aec.testing.scripted import ScriptedExecutor

if TYPE_CHECKING:
    from hypothesis.strategies import DataObject

Element = Record | Watermark

DEFAULT_CONFIGS = (
    AecConfig(buffer_size=2, in_flight_records_limit=8),
    AecConfig(buffer_size=3, in_flight_records_limit=25, watermark_order="parallel"),
    AecConfig(buffer_size=1, in_flight_records_limit=1),
)


class _Observed:
    """What one run showed: outputs per key, watermarks, positions, final state.

    ``per_key`` maps (kind, tag, key) to the key's output sequence; ``per_origin``
    splits it further by (epoch, from a timer), which is what parallel watermark
    order preserves: there a record after a watermark may run before that
    watermark's timers of the same key.
    """

    def __init__(self, trace: Trace, backend: StateBackend, state_names: list[str]) -> None:
        self.watermarks: list[float] = []
        # (kind, tag, key) and, per origin, + (epoch, from a timer) -> outputs
        self.per_key: dict[tuple[Hashable, ...], list[object]] = {}
        self.per_origin: dict[tuple[Hashable, ...], list[object]] = {}
        self.positions: list[tuple[int, int, object]] = []  # (epoch, epochs done before, value)
        boundaries = 0  # epochs finished so far: watermarks and processing-time ticks
        for kind, context, value in trace:
            if kind == "watermark" or kind == "tick":
                boundaries += 1
                if kind == "watermark":
                    self.watermarks.append(value.timestamp)
                continue
            tag, item = value if kind == "side" else (None, value)
            slot = (kind, tag, context.key)
            self.per_key.setdefault(slot, []).append(item)
            origin = (*slot, context.epoch.sequence, context.timer is not None)
            self.per_origin.setdefault(origin, []).append(item)
            self.positions.append((context.epoch.sequence, boundaries, value))
        self.state = {name: _state_items(backend, name) for name in state_names}


def _state_items(backend: StateBackend, name: str) -> object:
    try:
        return backend.state_items(name)
    except NotImplementedError:
        return None


class _Inputs:
    """How a checked run is fed: the operator class and one source element's call."""

    def __init__(self, operator: type[KeyedProcessOperator], feed: Callable[..., None]) -> None:
        self.operator = operator
        self.feed = feed  # feed(operator, element, position)


def _feed_one(operator: Any, element: Any, position: int) -> None:
    if type(element) is Watermark:
        operator.process_watermark(element)
    else:
        operator.process(element)


def _feed_two(operator: Any, element: Any, position: int) -> None:
    operator.process_input(*co_element(element, position))


ONE_INPUT = _Inputs(KeyedProcessOperator, _feed_one)
TWO_INPUTS = _Inputs(KeyedCoProcessOperator, _feed_two)


def _observe(
    inputs: _Inputs, source: Sequence[Any], function: Any, backend: StateBackend,
    config: AecConfig,
    executor: StateExecutor | None, clock_advances: Sequence[float],
) -> _Observed:  # fmt: skip
    clock = ScriptedClock(clock_advances)
    operator = inputs.operator(function, backend, config, executor, clock)
    operator.trace = []
    try:
        operator.open()
        try:
            for position, element in enumerate(source):
                inputs.feed(operator, element, position)
            operator.finish()
        finally:
            operator.close()
        return _Observed(operator.trace, backend, operator.state_names)
    finally:
        backend.close()  # made by the factory for this one run: its threads stop here


def _divergence(reference: _Observed, run: _Observed, serial: bool) -> str | None:
    """A description of the first difference, or None when equivalent."""
    if run.watermarks != reference.watermarks:
        return f"watermarks differ: sync {reference.watermarks}, async {run.watermarks}"
    expected, observed = (
        (reference.per_key, run.per_key) if serial else (reference.per_origin, run.per_origin)
    )
    for slot in sorted(set(expected) | set(observed), key=repr):
        want, got = expected.get(slot, []), observed.get(slot, [])
        if want != got:
            kind, tag, key = slot[:3]
            where = f"side output {tag!r} of key {key!r}" if kind == "side" else f"key {key!r}"
            index = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            return (
                f"outputs of {where} differ at position {index}: "
                f"sync {want[index : index + 3]!r}..., async {got[index : index + 3]!r}... "
                f"(sync {len(want)} outputs, async {len(got)})"
            )
    for epoch, before, value in run.positions:
        if before > epoch or (serial and before < epoch):
            return (
                f"output {value!r} of a record in epoch {epoch} left after {before} epoch(s) "
                "had finished (watermarks and processing-time advances): "
                + (
                    "serial mode requires exactly"
                    if serial
                    else "it must leave before epoch boundary"
                )
                + f" {epoch}"
            )
    for name in reference.state:
        if reference.state[name] != run.state[name]:
            return f"final state {name!r} differs: sync {reference.state[name]!r}, async {run.state[name]!r}"
    return None


def assert_equivalent(
    function_factory: Callable[[], KeyedProcessFunction],
    source: Iterable[Record | Watermark],
    *,
    backend_factory: Callable[[], StateBackend] | None = None,
    configs: Iterable[AecConfig] | None = None,
    data: DataObject | None = None,
    seeds: Iterable[int] = (0, 1, 2),
    executor_factory: Callable[[int | None], StateExecutor] | None = None,
    clock_advances: Sequence[float] = (),
) -> None:
    """Raise AssertionError unless every async run equals the synchronous run.

    Args:
        function_factory: makes a fresh function per run (a class works).
        source: ``Record``s and ``Watermark``s (materialized once).
        backend_factory: makes a fresh backend per run (default MemoryBackend); each
            is closed after its run.
        configs: async configs to check (default: a small-buffer serial config,
            a parallel-watermark config, and buffer/in-flight 1); ``async_state``
            is forced True.
        data: a hypothesis ``data`` object: schedules are drawn from it (and
            shrunk by hypothesis) instead of from ``seeds``.
        seeds: seeds of the scripted schedules when ``data`` is None.
        executor_factory: ``fn(seed) -> StateExecutor`` replacing the scripted
            executor, e.g. a real thread pool (then the schedule is the OS's).
        clock_advances: seconds the processing-time clock advances at each input
            element (element i: ``clock_advances[i]``, 0 past the end); every run
            gets the same ``ScriptedClock``, starting at 0.

    The message names the config (so the watermark mode that diverges), the
    seed or schedule, the input size and the first divergence.
    """
    _check(
        ONE_INPUT, function_factory, source, backend_factory, configs, data, seeds,
        executor_factory, clock_advances,
    )  # fmt: skip


def assert_equivalent_co(
    function_factory: Callable[[], KeyedCoProcessFunction],
    source: Iterable[tuple[int, Record | Watermark]],
    *,
    backend_factory: Callable[[], StateBackend] | None = None,
    configs: Iterable[AecConfig] | None = None,
    data: DataObject | None = None,
    seeds: Iterable[int] = (0, 1, 2),
    executor_factory: Callable[[int | None], StateExecutor] | None = None,
    clock_advances: Sequence[float] = (),
) -> None:
    """``assert_equivalent`` for a two-input ``KeyedCoProcessFunction``: ``source`` is
    ``(input, element)`` pairs as ``aec.run_keyed_co`` takes them (input 1 or 2, a
    ``Record`` or ``Watermark`` of that input); the runs are
    ``KeyedCoProcessOperator``s and the comparison is the same (per key across both
    inputs, the operator's watermarks, final state). Raises AssertionError."""
    _check(
        TWO_INPUTS, function_factory, source, backend_factory, configs, data, seeds,
        executor_factory, clock_advances,
    )  # fmt: skip


def _check(
    inputs: _Inputs, function_factory: Callable[[], Any], source: Iterable[Any],
    backend_factory: Callable[[], StateBackend] | None, configs: Iterable[AecConfig] | None,
    data: DataObject | None, seeds: Iterable[int],
    executor_factory: Callable[[int | None], StateExecutor] | None,
    clock_advances: Sequence[float],
) -> None:  # fmt: skip
    source = list(source)
    backend_factory = backend_factory or default_backend

    def problem_with(
        elements: list[Element], config: AecConfig, seed: int | None
    ) -> tuple[str | None, StateExecutor]:
        reference = _observe(
            inputs, elements, function_factory(), backend_factory(), AecConfig(async_state=False),
            None, clock_advances,
        )  # fmt: skip
        executor: StateExecutor
        if executor_factory is None:
            executor = ScriptedExecutor(seed, data=data)
        else:
            executor = executor_factory(seed)
        run = _observe(
            inputs,
            elements,
            function_factory(),
            backend_factory(),
            config,
            executor,
            clock_advances,
        )
        return _divergence(reference, run, config.watermark_order == "serial"), executor

    configs = list(configs) if configs is not None else list(DEFAULT_CONFIGS)
    clock_advances = list(clock_advances)
    for config in configs:
        if not config.async_state:
            continue
        for seed in [None] if data is not None else list(seeds):
            problem, executor = problem_with(source, config, seed)
            if not problem:
                continue
            smallest = source
            if data is None:  # hypothesis shrinks its own draws; shrink seeded runs here

                def fails(e: list[Element], c: AecConfig = config, s: int | None = seed) -> bool:
                    return bool(problem_with(e, c, s)[0])

                smallest = _shrink(source, fails)
                if len(smallest) < len(source):
                    problem, executor = problem_with(smallest, config, seed)
            schedule = getattr(executor, "schedule", ["(not scripted)"])[:40]
            raise AssertionError(
                f"async run differs from the synchronous run in {config.watermark_order} "
                f"watermark mode ({config}), seed {seed}, input of {len(source)} elements; "
                f"smallest failing input found ({len(smallest)} elements): {smallest!r}\n"
                f"{problem}\nschedule (first 40 choices): {schedule}"
            )


def _shrink(
    source: list[Element], fails: Callable[[list[Element]], bool], budget: int = 200
) -> list[Element]:
    """A smaller input that still ``fails``: drop ever smaller slices while the
    failure remains, trying at most ``budget`` candidates (a simple ddmin)."""
    current = list(source)
    size = max(1, len(current) // 2)
    while size >= 1 and budget > 0:
        start, removed = 0, False
        while start < len(current) and budget > 0:
            candidate = current[:start] + current[start + size :]
            budget -= 1
            try:
                still = fails(candidate)
            except Exception:  # e.g. a candidate the function rejects: not a smaller example
                still = False
            if still:
                current, removed = candidate, True
            else:
                start += size
        if not removed:
            size //= 2
    return current
