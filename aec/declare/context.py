"""Declaring a record's processing as named steps (FLIP-455's ``DeclarationContext``).

A declaring function describes what a record does as a chain of named steps
instead of anonymous callbacks, so the engine can tell, for a record in flight,
which step comes next: a checkpoint then stores the record with that name and
its declared variables instead of waiting for it (FLIP-425's "Faster Checkpoint
Drain"). The steps form a static graph built once, at ``open``:

- ``declare(name, fn)``: a step ``fn(input, ctx)``; what it returns (a value, or a
  ``StateFuture`` whose result is awaited) is the next step's input.
- ``chain(*steps)``: steps one after another; the chain of ``declare_process`` is
  a record's processing, its first step called with ``(value, ctx)``.
- ``branch(name, condition, if_true, if_false=None)``: a conditional step
  (Flink's ``thenConditionallyCompose``): ``condition(input, ctx)`` picks a chain,
  which gets the same input; after it the enclosing chain goes on with its result
  (without ``if_false``, a false condition passes the input on unchanged).
- ``declare_variable(name, default=None)``: a value per record in flight.

Every name is unique within a function (steps, branches and variables share
one namespace with ``declare_on_timer``'s); a step is placed in one chain only.
Flink: ``DeclarationContext``, ``DeclarationChain``, ``NamedFunction``,
``DeclaredVariable`` (``flink-runtime/.../asyncprocessing/declare``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from aec.state.future import StateFuture
from aec.state.typevars import V

if TYPE_CHECKING:
    from aec.functions import Context

# (input, ctx) -> value | StateFuture | None; each step takes what the one before gave
Step = Callable[[Any, "Context"], object]


class DeclaredStep:
    """A named step of a declared chain (``DeclarationContext.declare``).

    Attributes:
        name: unique within the function; stored with a record in flight.
        fn: ``fn(input, ctx)``.
        next: the step after this one (None: the end of the record's processing),
            set when the step is placed in a chain.
    """

    __slots__ = ("name", "fn", "next", "placed")

    def __init__(self, name: str, fn: Step) -> None:
        self.name = name
        self.fn = fn
        self.next: DeclaredStep | None = None
        self.placed = False

    def __repr__(self) -> str:
        return f"DeclaredStep({self.name!r})"


class DeclaredBranch(DeclaredStep):
    """A conditional step (``DeclarationContext.branch``): ``fn`` is the condition;
    the chosen chain's first step comes next, and the end of either chain leads to
    this step's ``next``."""

    __slots__ = ("if_true", "if_false")

    def __init__(
        self,
        name: str,
        condition: Step,
        if_true: DeclaredChain,
        if_false: DeclaredChain | None,
    ) -> None:
        super().__init__(name, condition)
        self.if_true = if_true
        self.if_false = if_false

    def choose(self, value: object, ctx: Context) -> DeclaredStep | None:
        """The step that runs next for ``value`` (its input, passed on unchanged).

        Raises TypeError when the condition returns a future or a coroutine (it would
        always count as true): read state in a step before the branch."""
        chosen = self.fn(value, ctx)
        if type(chosen) is not bool and (
            isinstance(chosen, StateFuture) or type(chosen) is CoroutineType
        ):
            if type(chosen) is CoroutineType:
                chosen.close()
            raise TypeError(
                f"the condition of branch {self.name!r} returned {type(chosen).__name__}, "
                "not a plain bool: read the state it needs in a step before the branch "
                "(its result is the condition's input)"
            )
        if chosen:
            return self.if_true.first
        return self.if_false.first if self.if_false is not None else self.next


class DeclaredChain:
    """Steps run one after another (``DeclarationContext.chain``).

    Attributes:
        steps: the chain's steps, in order (each placed here only).
        first: the first step.
    """

    __slots__ = ("steps", "first")

    def __init__(self, steps: tuple[DeclaredStep, ...]) -> None:
        self.steps = steps
        self.first = steps[0]

    def link(self, after: DeclaredStep | None) -> None:
        """Chain the steps, the last one to ``after`` (the enclosing chain's next
        step; None at the top), and the branches' chains to their successors."""
        for step, following in zip(self.steps, (*self.steps[1:], after), strict=True):
            step.next = following
            if isinstance(step, DeclaredBranch):
                step.if_true.link(following)
                if step.if_false is not None:
                    step.if_false.link(following)


_S = TypeVar("_S", bound=DeclaredStep)


class Declarations(Protocol):
    """What declaring writes into and variables read from (``DeclaredProgram``)."""

    def claim(self, name: str, kind: str = "step") -> str: ...
    def register(self, step: _S) -> _S: ...
    def add_variable(self, variable: DeclaredVariable) -> None: ...
    def variables(self) -> dict[str, Any]: ...  # each variable's own type


class DeclaredVariable(Generic[V]):
    """A value ``V`` per record in flight (``DeclarationContext.declare_variable``).

    Each record starts from ``default``; ``get()`` / ``set(v)`` read and write the
    running record's value (inside a declared step only). A checkpoint stores it
    with the record, so it must be serializable then (Flink's ``DeclaredVariable``).
    """

    __slots__ = ("name", "default", "_program")

    def __init__(self, name: str, default: V | None, program: Declarations) -> None:
        self.name = name
        self.default = default
        self._program = program

    def get(self) -> V:
        """The running record's value. Raises RuntimeError outside a declared step."""
        value: V = self._program.variables()[self.name]
        return value

    def set(self, value: V) -> None:
        """Set the running record's value. Raises RuntimeError outside a declared step."""
        self._program.variables()[self.name] = value

    def __repr__(self) -> str:
        return f"DeclaredVariable({self.name!r}, default={self.default!r})"


class DeclarationContext:
    """Given to ``declare_process`` and ``declare_on_timer``: declares the steps,
    chains, branches and variables of a declaring function (``open`` builds them
    once). Raises ValueError for a name declared twice and for a step placed in
    two chains, TypeError for a step that is not callable or a bad argument."""

    def __init__(self, program: Declarations) -> None:
        self._program = program

    def declare(self, name: str, fn: Step) -> DeclaredStep:
        """A step named ``name`` running ``fn(input, ctx)``."""
        if not callable(fn):
            raise TypeError(f"declared step {name!r} needs a callable, got {fn!r}")
        return self._program.register(DeclaredStep(self._program.claim(name), fn))

    def chain(self, *steps: DeclaredStep) -> DeclaredChain:
        """The steps, one after another (at least one)."""
        if not steps:
            raise ValueError("chain() needs at least one declared step")
        for step in steps:
            if not isinstance(step, DeclaredStep):
                raise TypeError(
                    f"chain() takes steps made by declare() or branch(), got {step!r}"
                )
            if step.placed:
                raise ValueError(f"declared step {step.name!r} is placed in two chains")
            step.placed = True
        return DeclaredChain(steps)

    def branch(
        self,
        name: str,
        condition: Step,
        if_true: DeclaredChain,
        if_false: DeclaredChain | None = None,
    ) -> DeclaredBranch:
        """A conditional step: ``condition(input, ctx)`` (a plain bool, not a
        future) picks ``if_true`` or ``if_false``, each getting the same input."""
        if not callable(condition):
            raise TypeError(f"branch {name!r} needs a callable condition, got {condition!r}")
        for chain in (if_true, if_false):
            if chain is not None and not isinstance(chain, DeclaredChain):
                raise TypeError(f"branch {name!r} takes chains made by chain(), got {chain!r}")
        step = DeclaredBranch(self._program.claim(name), condition, if_true, if_false)
        return self._program.register(step)

    def declare_variable(self, name: str, default: V | None = None) -> DeclaredVariable[V]:
        """A value per record in flight, starting from ``default`` for each record."""
        variable = DeclaredVariable(self._program.claim(name, "variable"), default, self._program)
        self._program.add_variable(variable)
        return variable
