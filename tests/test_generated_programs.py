"""Property: generated keyed functions give the synchronous answer.

Not one hand-written function: hypothesis draws *programs*, lists of steps that
read and write Value/List/Map/Reducing/Aggregating state, chain with
``then_compose``, join several reads and writes in flight at once with
``combine_all``, iterate a list with nested reads, write without waiting for
the write, emit outputs and side outputs of what they read, register (and
delete) timers, and, in ``on_timer``, read, clear and register more timers. ``GeneratedFunction(program)`` interprets a
program in callback style (one ``then_compose`` chain per entry) or as
``async def`` (one ``await`` per step), the style drawn per entry point.

Every program is checked with ``assert_equivalent`` in serial watermark order.
Programs that stay inside what parallel order promises (docs/ARCHITECTURE.md,
"Parallel order": ``on_timer`` reads no state records write, records register
timers only above ``current_watermark()``, nobody deletes timers) are checked
in parallel order too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aec import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ReducingStateDescriptor,
    StateFuture,
    StateIterator,
    ValueStateDescriptor,
    Watermark,
    combine_all,
    completed_future,
)
from aec.testing import assert_equivalent, run_sync
from aec.testing.strategies import configs, keyed_streams

MOD = 10_007  # the interpreter's register stays a small int
TIMER_CAP = 45  # on_timer registers timers only up to here, always later than itself
MAP_KEYS = 3  # map user keys are 0..MAP_KEYS-1
RECORD_STATES = ("v", "l", "m", "r", "g")  # what records use
STYLES = ("callback", "async")


# -- programs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    """What a ``GeneratedFunction`` runs.

    Attributes:
        process / timer: the steps of ``process_element`` and ``on_timer``; each a
            tuple ``(kind, *arguments)`` (see ``GeneratedFunction``).
        process_style / timer_style: ``"callback"`` or ``"async"``.
        returns: callback style returns its chain's future (else None: the record
            still finishes only when the chain has run).
        parallel_safe: records register timers only above the current watermark.
    """

    process: tuple[tuple, ...]
    timer: tuple[tuple, ...]
    process_style: str
    timer_style: str
    returns: bool
    parallel_safe: bool


def _accesses(states: st.SearchStrategy[str]) -> st.SearchStrategy[tuple]:
    """2-4 state accesses issued at once: ``(state, "read" | "write")``."""
    access = st.tuples(states, st.sampled_from(("read", "write")))
    return st.lists(access, min_size=2, max_size=4).map(tuple)


def _steps(parallel_safe: bool, in_timer: bool) -> st.SearchStrategy[tuple]:
    """One step. Simple ones first: hypothesis shrinks towards the first alternatives."""
    emit = [
        st.tuples(st.just("out")),
        st.tuples(st.just("side"), st.sampled_from(("s0", "s1"))),
        st.tuples(st.just("watermark")),
    ]
    if in_timer:
        timers = [st.tuples(st.just("later_timer"), st.integers(1, 6))]  # chains end
        if not parallel_safe:
            timers.append(st.tuples(st.just("delete_timer"), st.integers(1, 6)))
    else:
        timers = [st.tuples(st.just("timer"), st.integers(-3, 6))]
        if not parallel_safe:
            timers.append(st.tuples(st.just("delete_timer"), st.integers(-3, 6)))
    timer_log = [
        st.tuples(st.just("tlog_get")),
        st.tuples(st.just("tlog_add"), st.integers(0, 5)),
        st.tuples(st.just("combine"), _accesses(st.just("tlog"))),
    ]
    if in_timer and parallel_safe:  # on_timer touches only state that records never touch
        return st.one_of(*emit, *timers, *timer_log)
    states = st.sampled_from(RECORD_STATES)
    user_keys = st.integers(0, MAP_KEYS - 1)
    state_steps = [
        st.tuples(st.just("get"), states),
        st.tuples(st.just("put"), states, st.integers(0, 5)),
        st.tuples(st.just("clear"), states),
        st.tuples(st.just("map_get"), user_keys),
        st.tuples(st.just("map_contains"), user_keys),
        st.tuples(st.just("map_remove"), user_keys),
        st.tuples(st.just("map_view"), st.sampled_from(("keys", "values", "is_empty"))),
        st.tuples(st.just("map_put_all"), st.integers(0, 5)),
        st.tuples(st.just("list_add_all"), st.integers(0, 5)),
        st.tuples(st.just("list_update"), st.integers(0, 5)),
        st.tuples(st.just("value_none")),
        st.tuples(st.just("combine"), _accesses(states)),
        st.tuples(st.just("then_combine"), states, states),
        st.tuples(st.just("chain"), st.integers(1, 4)),
        st.tuples(st.just("conditional"), st.integers(0, 5)),
        st.tuples(st.just("iterate"), states),
        st.tuples(st.just("forget"), states, st.integers(0, 5)),
    ]
    extra = timer_log if in_timer else []
    return st.one_of(*emit, *state_steps, *timers, *extra)


@st.composite
def programs(draw, parallel_safe: bool) -> Program:
    """Programs for serial order (anything) or for both orders (``parallel_safe``).

    Most records register a timer (a step drawn separately and placed anywhere),
    so that most programs exercise ``on_timer`` too.
    """
    process = draw(st.lists(_steps(parallel_safe, False), max_size=8))
    delta = draw(st.one_of(st.integers(-3, 6), st.none()))
    if delta is not None:
        process.insert(draw(st.integers(0, len(process))), ("timer", delta))
    return Program(
        process=tuple(process),
        timer=tuple(draw(st.lists(_steps(parallel_safe, True), max_size=5))),
        process_style=draw(st.sampled_from(STYLES)),
        timer_style=draw(st.sampled_from(STYLES)),
        returns=draw(st.booleans()),
        parallel_safe=parallel_safe,
    )


# -- the interpreter -----------------------------------------------------------------------


def digest(value: Any) -> int:
    """A small int standing for what was read (stable across runs: no ``hash``)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return 1 + value
    if isinstance(value, (int, float)):
        return int(value) % MOD if math.isfinite(value) else MOD - 1
    if isinstance(value, (tuple, list, StateIterator)):
        h = 7
        for item in value:
            h = (h * 31 + digest(item)) % MOD
        return h
    raise TypeError(f"cannot digest {value!r}")


def fold(x: int, value: Any) -> int:
    return (x * 3 + digest(value) + 1) % MOD


def _future(value: Any) -> StateFuture:
    return value if isinstance(value, StateFuture) else completed_future(value)


class Pair(AggregateFunction):
    """Aggregates ints into (sum, count)."""

    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc):
        return acc

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


class GeneratedFunction(KeyedProcessFunction):
    """Interprets a ``Program``.

    A register ``x`` starts as the record's value (or the timer's timestamp);
    each step may fold what it read into ``x``, write ``x`` (plus a constant)
    to state, emit ``x``, or register a timer relative to ``ctx.timestamp``.
    State: ``v`` value, ``l`` list, ``m`` map, ``r`` reducing (sum),
    ``g`` aggregating ((sum, count)), ``tlog`` a list only ``on_timer`` uses.

    Each step kind has a callback implementation (``_cb_<kind>``: returns the new
    ``x`` or a future of it) and an async one (``_aw_<kind>``, falling back to
    awaiting the callback one).
    """

    def __init__(self, program: Program) -> None:
        self.program = program

    def open(self, ctx):
        self.states = {
            "v": ctx.get_state(ValueStateDescriptor("v")),
            "l": ctx.get_state(ListStateDescriptor("l")),
            "m": ctx.get_state(MapStateDescriptor("m")),
            "r": ctx.get_state(ReducingStateDescriptor("r", lambda a, b: a + b)),
            "g": ctx.get_state(AggregatingStateDescriptor("g", Pair())),
            "tlog": ctx.get_state(ListStateDescriptor("tlog")),
        }

    # -- entry points --------------------------------------------------------------------------
    def process_element(self, value, ctx):
        program = self.program
        return self._run(program.process, program.process_style, ctx, value)

    def on_timer(self, timestamp, ctx):
        program = self.program
        return self._run(program.timer, program.timer_style, ctx, int(timestamp))

    def _run(self, steps, style, ctx, x):
        if style == "async":
            return self._run_async(steps, ctx, x)
        future = None
        for step in steps:
            if future is None:
                result = self._callback(step, ctx, x)
                if isinstance(result, StateFuture):
                    future = result
                else:
                    x = result
            else:
                future = future.then_compose(lambda x, step=step: self._callback(step, ctx, x))
        return future if self.program.returns else None

    async def _run_async(self, steps, ctx, x):
        for step in steps:
            x = await self._awaitable(step, ctx, x)

    def _callback(self, step, ctx, x):
        return getattr(self, "_cb_" + step[0])(ctx, x, *step[1:])

    async def _awaitable(self, step, ctx, x):
        native = getattr(self, "_aw_" + step[0], None)
        if native is not None:
            return await native(ctx, x, *step[1:])
        return await _future(self._callback(step, ctx, x))

    # -- reads ---------------------------------------------------------------------------------
    def _read(self, name: str) -> StateFuture:
        """A future of what state ``name`` holds for the current key."""
        state = self.states[name]
        if name in ("l", "tlog"):
            return state.async_get()
        if name == "m":
            return state.async_entries()
        if name == "v":
            return state.async_value()
        return state.async_get()

    def _cb_get(self, ctx, x, name):
        return self._read(name).then_apply(lambda value: fold(x, value))

    async def _aw_get(self, ctx, x, name):
        return fold(x, await self._read(name))

    def _cb_tlog_get(self, ctx, x):
        return self._cb_get(ctx, x, "tlog")

    def _cb_map_get(self, ctx, x, user_key):
        return self.states["m"].async_get(user_key).then_apply(lambda value: fold(x, value))

    async def _aw_map_get(self, ctx, x, user_key):
        return fold(x, await self.states["m"].async_get(user_key))

    def _cb_map_contains(self, ctx, x, user_key):
        return self.states["m"].async_contains(user_key).then_apply(lambda found: fold(x, found))

    def _cb_map_view(self, ctx, x, view):
        return getattr(self.states["m"], "async_" + view)().then_apply(lambda v: fold(x, v))

    # -- writes --------------------------------------------------------------------------------
    def _write(self, name: str, x: int, c: int) -> StateFuture:
        state = self.states[name]
        if name == "v":
            return state.async_update(x + c)
        if name == "m":
            return state.async_put((x + c) % MAP_KEYS, x)
        return state.async_add(x + c)  # list, reducing, aggregating

    def _cb_put(self, ctx, x, name, c):
        return self._write(name, x, c).then_apply(lambda _: x)

    async def _aw_put(self, ctx, x, name, c):
        await self._write(name, x, c)
        return x

    def _cb_tlog_add(self, ctx, x, c):
        return self._cb_put(ctx, x, "tlog", c)

    def _cb_clear(self, ctx, x, name):
        return self.states[name].async_clear().then_apply(lambda _: x)

    def _cb_map_remove(self, ctx, x, user_key):
        return self.states["m"].async_remove(user_key).then_apply(lambda _: x)

    def _cb_map_put_all(self, ctx, x, c):
        entries = {c % MAP_KEYS: x, (c + 1) % MAP_KEYS: c}
        return self.states["m"].async_put_all(entries).then_apply(lambda _: x)

    def _cb_list_add_all(self, ctx, x, c):
        return self.states["l"].async_add_all([x, c]).then_apply(lambda _: x)

    def _cb_list_update(self, ctx, x, c):
        values = [] if c == 0 else [c, x]  # an empty update clears
        return self.states["l"].async_update(values).then_apply(lambda _: x)

    def _cb_value_none(self, ctx, x):
        return self.states["v"].async_update(None).then_apply(lambda _: x)  # None clears

    def _cb_forget(self, ctx, x, name, c):
        """A write nobody waits for: later requests of the record must still see it."""
        self._write(name, x, c)
        return x

    # -- composites ----------------------------------------------------------------------------
    def _access(self, name: str, kind: str, x: int) -> StateFuture:
        return self._read(name) if kind == "read" else self._write(name, x, 1)

    def _cb_combine(self, ctx, x, accesses):
        """Several reads and writes in flight at once, joined with ``combine_all``:
        the backend must still apply them in program order."""
        futures = [self._access(name, kind, x) for name, kind in accesses]
        return combine_all(futures).then_apply(lambda values: fold(x, values))

    async def _aw_combine(self, ctx, x, accesses):
        futures = [self._access(name, kind, x) for name, kind in accesses]  # before any await
        return fold(x, await combine_all(futures))

    def _cb_then_combine(self, ctx, x, first, second):
        return self._read(first).then_combine(self._read(second), lambda a, b: fold(x, (a, b)))

    def _cb_chain(self, ctx, x, length):
        """``length`` read-modify-writes of ``v`` as nested ``then_compose``."""
        value = self.states["v"]

        def bump(n, left):
            n = fold(x, n)
            if left == 0:
                return n
            return value.async_update(n).then_compose(
                lambda _: value.async_value().then_compose(lambda m: bump(m, left - 1))
            )

        return value.async_value().then_compose(lambda n: bump(n, length))

    async def _aw_chain(self, ctx, x, length):
        value = self.states["v"]
        n = fold(x, await value.async_value())
        for _ in range(length):
            await value.async_update(n)
            n = fold(x, await value.async_value())
        return n

    def _cb_conditional(self, ctx, x, c):
        """``then_conditionally_compose``: by the parity of ``v``, write ``l`` or ``m``."""
        return (
            self.states["v"]
            .async_value()
            .then_conditionally_compose(
                lambda n: digest(n) % 2 == 0,
                lambda n: self.states["l"].async_add(x + c).then_apply(lambda _: "list"),
                (lambda n: self.states["m"].async_put(c % MAP_KEYS, x)) if c % 2 else None,
            )
            .then_apply(lambda outcome: fold(x, outcome[0]))
        )

    def _cb_iterate(self, ctx, x, name):
        """Iterate the list ``l`` with a nested read of ``name`` per element."""

        def per_item(item):
            return self._read(name).then_apply(lambda value: digest((item, value)))

        return (
            self.states["l"]
            .async_get()
            .then_compose(lambda items: items.on_next(per_item))
            .then_apply(lambda values: fold(x, values))
        )

    # -- outputs and timers --------------------------------------------------------------------
    def _cb_out(self, ctx, x):
        ctx.output((ctx.current_key, "out", x))
        return x

    def _cb_side(self, ctx, x, tag):
        ctx.side_output(tag, (ctx.current_key, x))
        return x

    def _cb_watermark(self, ctx, x):
        ctx.output((ctx.current_key, "watermark", ctx.timer_service.current_watermark()))
        return x

    def _cb_timer(self, ctx, x, delta):
        """A record registers a timer (parallel-safe: only above its watermark)."""
        t = ctx.timestamp + delta
        if not self.program.parallel_safe or t > ctx.timer_service.current_watermark():
            ctx.timer_service.register_event_time_timer(t)
        return fold(x, t)

    def _cb_later_timer(self, ctx, x, delta):
        """A timer registers a later timer (up to ``TIMER_CAP``, so chains end)."""
        t = ctx.timestamp + delta
        if t <= TIMER_CAP:
            ctx.timer_service.register_event_time_timer(t)
        return fold(x, t)

    def _cb_delete_timer(self, ctx, x, delta):
        ctx.timer_service.delete_event_time_timer(ctx.timestamp + delta)
        return x


# -- properties ----------------------------------------------------------------------------

# The program space is large and each example is cheap (a few ms): these properties
# run 5x the active profile's examples (ci: 200, thorough: 10,000).
MORE = settings(max_examples=5 * settings.default.max_examples)
SOURCES = keyed_streams(keys=("a", "b", 1), min_size=4, max_size=30, max_value=20)


@MORE
@given(program=programs(False), source=SOURCES, config=configs("serial"), data=st.data())
def test_generated_programs_equal_sync_in_serial_order(program, source, config, data):
    assert_equivalent(lambda: GeneratedFunction(program), source, configs=[config], data=data)


@MORE
@given(
    program=programs(True),
    source=SOURCES,
    serial=configs("serial"),
    parallel=configs("parallel"),
    data=st.data(),
)
def test_parallel_safe_programs_equal_sync_in_both_orders(program, source, serial, parallel, data):
    assert_equivalent(
        lambda: GeneratedFunction(program), source, configs=[serial, parallel], data=data
    )


@given(program=programs(False), source=SOURCES)
def test_callback_and_async_interpretations_agree(program, source):
    """The interpreter's two styles mean the same program (checks the generator itself)."""
    results = []
    for style in STYLES:
        styled = dataclasses.replace(program, process_style=style, timer_style=style)
        result = run_sync(source, GeneratedFunction(styled))
        results.append((result.outputs, result.side_outputs))
    assert results[0] == results[1]


def test_generated_programs_do_something():
    """A fixed program exercises state, timers, and outputs (guards the interpreter)."""
    program = Program(
        process=(
            ("put", "l", 1),
            ("combine", (("v", "read"), ("l", "write"), ("l", "read"))),
            ("timer", 2),
            ("out",),
        ),
        timer=(("get", "l"), ("clear", "l"), ("later_timer", 30), ("out",)),
        process_style="async",
        timer_style="callback",
        returns=True,
        parallel_safe=False,
    )
    source = [Record("a", 1, 1), Record("a", 2, 2), Watermark(3), Record("b", 5, 5)]
    result = run_sync(source, GeneratedFunction(program))
    outs = [o for o in result.outputs if not isinstance(o, Watermark)]
    # key a: two records, their timers at 3 and 4, and those timers' timers at 33 and 34
    assert len([o for o in outs if o[0] == "a"]) == 6
    assert_equivalent(lambda: GeneratedFunction(program), source, seeds=range(3))


@pytest.mark.parametrize(
    "accesses",
    [
        (("r", "write"), ("r", "read")),  # a stale read
        (("r", "write"), ("r", "write")),  # a lost update
        (("g", "write"), ("g", "read")),
    ],
    ids=["reducing-add-then-get", "reducing-add-twice", "aggregating-add-then-get"],
)
def test_adds_in_flight_with_other_requests_keep_program_order(accesses):
    """Regression: the smallest divergence the generator found (engine at 14ac418).

    ``ReducingState.async_add`` and ``AggregatingState.async_add`` are a VALUE_GET
    and, from its callback, a VALUE_PUT. A request the same record issued before
    the add completed (here through ``combine_all``) ran between the two, while
    the synchronous run finishes the add first: the read missed the add, or one
    of two adds was lost, with one record and any schedule. Fixed by the
    read-modify-write lanes of 6a765fa.
    """
    program = Program(
        process=(("combine", accesses), ("out",)),
        timer=(),
        process_style="async",
        timer_style="async",
        returns=True,
        parallel_safe=True,
    )
    assert_equivalent(lambda: GeneratedFunction(program), [Record("a", 0, 0)], seeds=[0])
