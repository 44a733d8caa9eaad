"""Running declared chains: a record's progress is the name of its next step.

``DeclaredProgram`` holds a declaring function's steps (built once, at ``open``)
and runs each record (or timer firing) through them as a ``DeclaredRun``: the
next step, the record's declared variables and the future it waits for. A step
runs on the mailbox thread like any callback; when it returns a pending
``StateFuture`` the run subscribes to it (holding its record) and goes on with
the result when it completes. Because the next step of every waiting run is a
named step, a checkpoint can store the run instead of finishing it
(``aec.runtime.in_flight``) and a restore can resume it (``resume``).
"""

from __future__ import annotations

import copy
from functools import partial
from types import CoroutineType
from typing import TYPE_CHECKING, Any, TypeVar

from aec.declare.context import (
    DeclaredBranch,
    DeclaredChain,
    DeclaredStep,
    DeclaredVariable,
)
from aec.state.defaults import immutable
from aec.state.future import Owner, StateFuture

if TYPE_CHECKING:
    from aec.functions import Context

_S = TypeVar("_S", bound=DeclaredStep)


def _refuse_coroutine(step: DeclaredStep, coroutine: CoroutineType[Any, Any, Any]) -> None:
    """A step is a plain function: an ``async def`` one would run nowhere (and could
    not be stored mid-way by a checkpoint)."""
    coroutine.close()
    raise TypeError(
        f"declared step {step.name!r} returned a coroutine: a declared step is a plain "
        "function returning a value or a StateFuture (split an `async def` into steps, "
        "one per await)"
    )


class DeclaredRun:
    """One record's (or timer firing's) way through its chain (mailbox thread only).

    Attributes:
        record: the engine's context of the record (its key, its reference count).
        variables: the record's declared variables, name -> value (None: none declared).
        next: the step that runs when ``pending`` completes (None: the end).
        pending: the future the run waits for, or None while a step runs.
    """

    __slots__ = ("record", "variables", "next", "pending")

    def __init__(self, record: Owner, variables: dict[str, object] | None) -> None:
        self.record = record
        self.variables = variables
        self.next: DeclaredStep | None = None
        self.pending: StateFuture[object] | None = None


class DeclaredProgram:
    """A declaring function's steps and the runs of its records in flight.

    Built by ``DeclaringKeyedProcessFunction.declarations()``: names are claimed
    while declaring (``claim``), then ``finish`` links the chains.

    Attributes:
        process: the chain of a record.
        on_timer: the chain of a timer firing, or None (``on_timer`` runs undeclared).
        runs: record context -> its ``DeclaredRun``, for every record in flight.
    """

    def __init__(self) -> None:
        # steps and branches share one namespace, variables have their own (as Flink's
        # DeclarationManager keeps its callbacks and its variables)
        self._names: dict[str, set[str]] = {"step": set(), "variable": set()}
        self._steps: dict[str, DeclaredStep] = {}
        self._defaults: dict[str, object] = {}
        # each record starts from the defaults: a mutable one (a list, a dict) is copied
        # per record (``copy.deepcopy``), else records would change each other's
        self._copy_defaults = False
        self._current: DeclaredRun | None = None
        self.process: DeclaredChain | None = None
        self.on_timer: DeclaredChain | None = None
        self.runs: dict[object, DeclaredRun] = {}  # by record identity

    # -- declaring ----------------------------------------------------------------------------
    def claim(self, name: str, kind: str = "step") -> str:
        """Reserve ``name`` for a ``kind`` ("step": a step or a branch, or "variable");
        ValueError if one of that kind has it already (in ``declare_process`` or
        ``declare_on_timer``)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a declared name must be a non-empty str, got {name!r}")
        names = self._names[kind]
        if name in names:
            what = "variable" if kind == "variable" else "step or branch"
            raise ValueError(
                f"declared {what} name {name!r} is used twice (declare_process and "
                "declare_on_timer share the names of steps and branches, and those of "
                "variables)"
            )
        names.add(name)
        return name

    def register(self, step: _S) -> _S:
        """Remember ``step`` by its (claimed) name; returns it."""
        self._steps[step.name] = step
        return step

    def add_variable(self, variable: DeclaredVariable) -> None:
        self._defaults[variable.name] = variable.default
        if not immutable(variable.default):
            self._copy_defaults = True

    def _fresh_defaults(self) -> dict[str, object]:
        """The declared variables' defaults, for one record's own use."""
        if self._copy_defaults:
            return copy.deepcopy(self._defaults)
        return dict(self._defaults)

    def finish(self, process: object, on_timer: object) -> None:
        """Link the chains ``declare_process`` and ``declare_on_timer`` returned.
        Raises TypeError for something that is not a chain."""
        for what, chain in (("declare_process", process), ("declare_on_timer", on_timer)):
            if chain is not None and not isinstance(chain, DeclaredChain):
                raise TypeError(f"{what} must return d.chain(...), got {chain!r}")
        if process is None:
            raise TypeError("declare_process must return d.chain(...), got None")
        assert isinstance(process, DeclaredChain)
        self.process = process
        process.link(None)
        if on_timer is not None:
            assert isinstance(on_timer, DeclaredChain)
            self.on_timer = on_timer
            on_timer.link(None)

    def step_named(self, name: str) -> DeclaredStep:
        """The declared step ``name``; ValueError naming it if this function has none
        (a checkpoint of another function)."""
        step = self._steps.get(name)
        if step is None:
            raise ValueError(
                f"the checkpoint holds records whose next step is {name!r}, which this "
                "function does not declare"
            )
        return step

    def variables(self) -> dict[str, Any]:  # each variable's own type
        """The running record's declared variables (``DeclaredVariable.get``/``set``)."""
        run = self._current
        if run is None or run.variables is None:
            raise RuntimeError("a declared variable is read or set outside a declared step")
        return run.variables

    # -- running ------------------------------------------------------------------------------
    def start(self, record: Owner, chain: DeclaredChain, value: object, ctx: Context) -> None:
        """Run ``record`` through ``chain`` from its first step with ``value``."""
        run = DeclaredRun(record, self._fresh_defaults() if self._defaults else None)
        self.runs[record] = run
        self._advance(run, chain.first, value, ctx)

    def resume(
        self,
        record: Owner,
        next_step: str | None,
        variables: dict[str, object] | None,
        pending: StateFuture[object] | None,
        ctx: Context,
    ) -> None:
        """Put a stored run back: it goes on at ``next_step`` (None: it ends) with
        ``pending``'s result (or at once, with None, when nothing is pending).
        Raises ValueError for a step this function does not declare."""
        step = None if next_step is None else self.step_named(next_step)
        if variables is not None:
            variables = {**self._fresh_defaults(), **variables}
        run = DeclaredRun(record, variables)
        self.runs[record] = run
        if pending is None:
            self._advance(run, step, None, ctx)
        else:
            self._wait(run, step, pending, ctx)

    def _advance(
        self, run: DeclaredRun, step: DeclaredStep | None, value: object, ctx: Context
    ) -> None:
        """Run steps from ``step`` while their results are at hand; subscribe to the
        first pending one, or end the run."""
        previous, self._current = self._current, run
        try:
            while step is not None:
                if type(step) is DeclaredBranch:
                    step = step.choose(value, ctx)
                    continue
                result = step.fn(value, ctx)
                if type(result) is CoroutineType:
                    _refuse_coroutine(step, result)
                step = step.next
                if isinstance(result, StateFuture):
                    if not result.is_done():
                        self._wait(run, step, result, ctx)
                        return
                    result = result.get()  # a failed call raises here
                value = result
            del self.runs[run.record]
        finally:
            self._current = previous

    def _wait(
        self, run: DeclaredRun, step: DeclaredStep | None, pending: StateFuture[object], ctx: Context
    ) -> None:
        run.next, run.pending = step, pending
        if not pending.subscribe(partial(self._continue, run, ctx), run.record):
            self._continue(run, ctx, None)

    def _continue(self, run: DeclaredRun, ctx: Context, _: object) -> None:
        """The awaited future completed: the run goes on with its result."""
        pending, run.pending = run.pending, None
        assert pending is not None
        self._advance(run, run.next, pending.get(), ctx)  # a failed call raises here

