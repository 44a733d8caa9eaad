"""Running the user function's entries: the AEC's ``start``.

A context the AEC starts is a record (``process_element``), a timer firing
(``on_timer``), the fold of a function's bundle or a row of the initial state
(``process_initial_state``). An entry may return None, a
``StateFuture`` (its callbacks hold the record), or a coroutine (``async def``),
which this module drives: each ``await`` of a pending future suspends it until
that future completes on the mailbox thread (no asyncio on the state path).
"""

from __future__ import annotations

from collections.abc import Coroutine
from functools import partial
from types import CoroutineType
from typing import Any, Protocol

from aec.declare.program import DeclaredProgram
from aec.errors import describe
from aec.functions import Context, KeyedProcessFunction
from aec.runtime.bundle import Bundle, BundleContext
from aec.runtime.in_flight import ResumedRecord, resume
from aec.runtime.record_context import RecordContext
from aec.state.future import StateFuture
from aec.state.handles import Submit

_AWAITABLES = (
    "async user code awaited {what}; process_element and on_timer may await only aec "
    "StateFutures: state access (async_value(), ...), combine_all(...), and "
    "ctx.call_async(fn, ...) / ctx.call_batched(...) for asyncio code such as "
    "asyncio.sleep or an HTTP call (it runs on the operator's event loop)"
)


def _ignore(_: object) -> None:
    """A callback that only keeps its record waiting until the future completes."""


class _Records(Protocol):
    current: RecordContext | None


class InitialStateRow(RecordContext):
    """A row of the initial state (Spark's ``handleInitialState``): a record of its key in
    every respect (same-key order, state, timers, outputs) whose entry is
    ``function.process_initial_state(row, ctx)`` (``KeyedProcessOperator.process_initial``).
    Never carried by a checkpoint: one still in flight makes the checkpoint drain."""

    __slots__ = ()

    def describe(self) -> str:
        return "initial state " + super().describe()


class EntryRunner:
    """Calls a ``KeyedProcessFunction``'s entries for the AEC (mailbox thread only).

    Args:
        function: the user function.

    Attributes:
        context: the ``aec.Context`` user code gets (set by the operator before use).
        records: where the running record is (the AEC's ``current``; set by the
            operator before use): a coroutine's awaits bind to it.
        timers_fired: ``on_timer`` calls so far (metric ``timers_fired``).
        bundle: the function's ``Bundle`` when it folds mini-batches (set at open).
    """

    __slots__ = ("function", "context", "records", "timers_fired", "bundle")

    def __init__(self, function: KeyedProcessFunction) -> None:
        self.function = function
        self.context: Context
        self.records: _Records
        self.timers_fired = 0
        self.bundle: Bundle | None = None

    def run(self, record: RecordContext) -> None:
        """Run the entry of ``record`` and follow what it returned.

        Raises TypeError for a return value that is none of None, a StateFuture, a
        coroutine; whatever the user code raises propagates (the job fails)."""
        timer = record.timer
        if timer is not None:
            self.timers_fired += 1
            result = self.function.on_timer(timer[1], self.context)
            entry = "on_timer"
        elif type(record) is RecordContext:
            result = self.function.process_element(record.value, self.context)
            entry = "process_element"
        elif type(record) is BundleContext:
            self._fold(record)
            return
        elif type(record) is InitialStateRow:
            result = self.function.process_initial_state(record.value, self.context)
            entry = "process_initial_state"
        else:
            raise RuntimeError(f"{record.describe()} has no entry of {type(self.function)}")
        if type(result) is CoroutineType:  # the common ``async def`` case: one call less
            self.drive(result, None)
        elif result is not None:
            self.follow(result, entry, record)

    def follow(self, result: object, entry: str, record: RecordContext | None = None) -> None:
        """Drive what ``entry`` of ``record`` returned: a coroutine, or any StateFuture
        (its callbacks hold the record; one made outside any record holds ``record``
        until it completes); anything else is a TypeError naming ``entry``."""
        if type(result) is StateFuture or isinstance(result, StateFuture):  # a subclass too
            if result.context is None and record is not None:
                # a future made outside any record: the record waits for it (and a
                # future nobody completes leaves it stuck, named, not lost)
                result.subscribe(_ignore, record)
        elif type(result) is CoroutineType or hasattr(result, "send"):
            self.drive(result, None)  # type: ignore[arg-type]  # a generator-based coroutine
        else:
            raise TypeError(
                f"{entry} returned {describe(result)}; return None, a StateFuture, or use async def"
            )

    def drive(self, coroutine: Coroutine[object, object, object], value: object) -> None:
        """Advance an ``async def`` entry until it awaits a pending future."""
        try:
            awaited = coroutine.send(value)
        except StopIteration:
            return
        except RuntimeError as exc:
            if "event loop" not in str(exc):  # no running, or no current, one
                raise
            # an asyncio awaitable (asyncio.sleep, an aiohttp call) looked for its loop
            error = TypeError(_AWAITABLES.format(what="an asyncio awaitable"))
            error.__cause__ = exc  # compiled, ``raise ... from`` sets no cause
            raise error from exc
        if not isinstance(awaited, StateFuture):
            coroutine.close()
            raise TypeError(_AWAITABLES.format(what=describe(awaited)))
        # a partial, not a lambda: its call adds no Python frame (once per await)
        if not awaited.subscribe(partial(self.drive, coroutine), self.records.current):
            self.drive(coroutine, awaited.get())  # a custom awaitable yielded a done future

    def _fold(self, record: BundleContext) -> None:
        bundle = self.bundle
        if bundle is None:
            raise RuntimeError(f"{record.describe()} runs without a bundle")
        bundle.fold(record.share, record, self.context)


class DeclaredEntryRunner(EntryRunner):
    """The entries of a ``DeclaringKeyedProcessFunction``: records (and timer firings,
    when it declares ``declare_on_timer``) run through its declared chains; a record
    a checkpoint carried resumes at its next step (``aec.runtime.in_flight``).

    Attributes:
        program: the function's ``DeclaredProgram`` (set at open).
        submit: the AEC's ``submit`` (re-submits a carried record's requests).
    """

    __slots__ = ("program", "submit")

    def __init__(self, function: KeyedProcessFunction) -> None:
        super().__init__(function)
        self.program: DeclaredProgram
        self.submit: Submit

    def run(self, record: RecordContext) -> None:
        timer = record.timer
        program = self.program
        if timer is None:
            if type(record) is ResumedRecord:
                resume(record, program, self.submit, self.context)
            elif type(record) is InitialStateRow:
                super().run(record)  # not declared: its checkpoints drain
            else:
                assert program.process is not None
                program.start(record, program.process, record.value, self.context)
        elif program.on_timer is not None:
            self.timers_fired += 1
            program.start(record, program.on_timer, timer[1], self.context)
        else:
            super().run(record)


class CoEntryRunner(EntryRunner):
    """The entries of a ``KeyedCoProcessFunction``: a record calls ``process_element1``
    or ``process_element2`` after its input (``RecordContext.input``); timer firings
    and bundle folds run as ``EntryRunner``'s."""

    __slots__ = ()

    def run(self, record: RecordContext) -> None:
        if record.timer is not None or type(record) is not RecordContext:
            super().run(record)
            return
        function: Any = self.function  # a KeyedCoProcessFunction (the operator checked)
        if record.input == 1:
            result = function.process_element1(record.value, self.context)
        else:
            result = function.process_element2(record.value, self.context)
        if result is not None:
            self.follow(result, f"process_element{record.input}", record)
