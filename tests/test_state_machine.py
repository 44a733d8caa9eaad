"""Property: one KeyedProcessOperator driven step by step by hypothesis.

A ``RuleBasedStateMachine`` plays the outside world of one operator: records and
watermarks arrive, held state batches complete in an order hypothesis chooses,
the active buffer is flushed, a drain (what a checkpoint does) is requested.
Whenever the engine itself must wait (at the in-flight limit, while a serial
watermark drains) the executor completes a batch hypothesis chooses too.

After every step the engine's internals are checked against the invariants
their module docstrings promise (key accounting, blocking FIFO, reference
counts, in-flight and overdraft, epochs), and the outputs drained so far are
replayed through a model of docs/semantics.md rules 7 and 8 (watermark order, outputs and
timers relative to watermarks). At the end the operator finishes and its
answer is compared with ``run_sync`` on the same input.

Four machines: serial and parallel watermark order, each with a callback-style
and an ``async def`` function that uses state and timers (timers that register
timers included). In parallel mode the function stays inside what parallel
order promises (docs/ARCHITECTURE.md, "Parallel order"): records register
timers only above their current watermark and timers read only state that
records never touch.
"""

from __future__ import annotations

import functools
import math
import random
from collections import Counter, defaultdict
from contextlib import contextmanager
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from aec import (
    AecConfig,
    KeyedProcessFunction,
    KeyedProcessOperator,
    ListStateDescriptor,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.runtime.epochs import CLOSED, FIRING, OPEN
from aec.runtime.executor import StateExecutor
from aec.testing import run_sync
from backends import MemoryBackend

KEYS = ("a", "b", "c")  # few keys: same-key records collide
MAX_TIME = 24  # record event times are 0..MAX_TIME
TIMER_STEP = 3  # a timer at t < CHAIN_END registers one at t + TIMER_STEP
CHAIN_END = 20
RECORDS = st.tuples(st.sampled_from(KEYS), st.integers(0, MAX_TIME))


# -- the function under test ----------------------------------------------------------------
#
# Outputs are tagged tuples so the model can place each one:
#   ("record", key, (index, t))       a record finished (index = arrival number)
#   ("register", key, t, index|None)  a timer was registered by record ``index`` or a timer
#   ("timer", key, t)                 a timer at t fired


class Probe(KeyedProcessFunction):
    """Records read and bump a per-key count and register a timer at their event
    time; timers read and append to a timer-only list and, below ``CHAIN_END``,
    register a timer ``TIMER_STEP`` later."""

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.fired = ctx.get_state(ListStateDescriptor("fired"))  # timers only

    def register(self, ctx, t, origin):
        # parallel order: a record registers only above its watermark (timers are state)
        if origin is None or not self.parallel or t > ctx.timer_service.current_watermark():
            ctx.timer_service.register_event_time_timer(t)
            ctx.output(("register", ctx.current_key, t, origin))

    def timer_done(self, ctx, timestamp):
        ctx.output(("timer", ctx.current_key, timestamp))
        if timestamp < CHAIN_END:
            self.register(ctx, timestamp + TIMER_STEP, None)


class CallbackProbe(Probe):
    def process_element(self, value, ctx):
        index, t = value

        def bump(n):
            self.register(ctx, t, index)
            return self.count.async_update(n + 1)

        return (
            self.count.async_value()
            .then_compose(bump)
            .then_accept(lambda _: ctx.output(("record", ctx.current_key, value)))
        )

    def on_timer(self, timestamp, ctx):
        return (
            self.fired.async_get()
            .then_compose(lambda items: self.fired.async_add(timestamp))
            .then_accept(lambda _: self.timer_done(ctx, timestamp))
        )


class AsyncProbe(Probe):
    async def process_element(self, value, ctx):
        index, t = value
        n = await self.count.async_value()
        self.register(ctx, t, index)
        await self.count.async_update(n + 1)
        ctx.output(("record", ctx.current_key, value))

    async def on_timer(self, timestamp, ctx):
        await self.fired.async_get()
        await self.fired.async_add(timestamp)
        self.timer_done(ctx, timestamp)


STYLES = {"callback": CallbackProbe, "async": AsyncProbe}


# -- the executor: batches wait until a rule (or an adversarial wait) completes them ------------


class HeldExecutor(StateExecutor):
    """Holds submitted batches; ``complete(i)`` runs held batch ``i`` on the backend
    and posts its completion mail. When the engine waits, ``choose(n)`` picks
    which of the ``n`` held batches completes."""

    concurrent = True
    BUDGET = 20_000

    def __init__(self) -> None:
        super().__init__()
        self.held: list = []
        self.submitted = 0
        self.choose = lambda n: 0

    def submit(self, batch) -> None:
        self.pending += 1
        self.submitted += 1
        if self.submitted > self.BUDGET:  # a runaway engine fails instead of hanging
            raise AssertionError(f"more than {self.BUDGET} batches in one run: runaway work")
        self.held.append(batch)

    def complete(self, index: int) -> None:
        self._run(self.held.pop(index), self._mailbox.post_local)

    def wait(self, timeout) -> None:
        if self.held:
            self.complete(self.choose(len(self.held)))

    def close(self) -> None:
        self.held.clear()


# -- a model of what may leave when (docs/semantics.md rules 7, 8) -----------------------------------------


class OutputModel:
    """Replays an operator's output stream and checks where each output may be.

    ``record_epoch[i]`` is the number of watermarks that arrived before record i;
    ``watermarks`` the watermarks that arrived, in order. A timer registered while
    ``m`` watermarks had left is due at the first watermark ``n >= m`` with
    ``t <= watermarks[n]``: it must fire while exactly ``n`` watermarks have left.
    """

    def __init__(self, serial: bool, record_epoch: dict[int, int], watermarks: list[float]):
        self.serial = serial
        self.record_epoch = record_epoch
        self.watermarks = watermarks  # shared with the machine: grows as watermarks arrive
        self.left = 0  # watermarks that have left
        self.finished: set[int] = set()  # records whose output left
        # (key, t) of registered, unfired timers -> watermarks that had left at registration
        self.pending: dict[tuple[Any, float], int] = {}
        self.timers_fired = 0

    def watermark_at(self, n: int, finishing: bool) -> float | None:
        if n < len(self.watermarks):
            return self.watermarks[n]
        return math.inf if finishing else None

    def absorb(self, outputs: list[Any], finishing: bool = False) -> None:
        for item in outputs:
            if isinstance(item, Watermark):
                self._watermark(item, finishing)
            elif item[0] == "record":
                self._record(item)
            elif item[0] == "register":
                self._register(item)
            elif item[0] == "timer":
                self._timer(item, finishing)
            else:
                raise AssertionError(f"unexpected output {item!r}")

    def _watermark(self, item: Watermark, finishing: bool) -> None:
        n = self.left
        expected = self.watermark_at(n, finishing)
        assert expected is not None, f"{item} left but only {n} watermark(s) arrived"
        assert item.timestamp == expected, (
            f"watermark #{n} left as {item.timestamp}, arrived as {expected}: out of order"
        )
        unfinished = sorted(
            i for i, e in self.record_epoch.items() if e <= n and i not in self.finished
        )
        assert not unfinished, (
            f"{item} left before records {unfinished} that arrived before it finished"
        )
        overdue = sorted(
            (repr(k), t) for (k, t), m in self.pending.items() if m <= n and t <= expected
        )
        assert not overdue, f"{item} left before the timers {overdue} it makes due fired"
        self.left += 1

    def _record(self, item: tuple) -> None:
        _, key, (index, t) = item
        epoch = self.record_epoch[index]
        assert index not in self.finished, f"record {index} emitted twice"
        self._place(f"record {index} (key {key!r}, t={t})", epoch)
        self.finished.add(index)

    def _place(self, what: str, epoch: int) -> None:
        if self.serial:
            assert self.left == epoch, (
                f"serial mode: output of {what}, which arrived after {epoch} watermark(s), "
                f"left after {self.left}"
            )
        else:
            assert self.left <= epoch, (
                f"output of {what}, which arrived before watermark #{epoch}, left after it"
            )

    def _register(self, item: tuple) -> None:
        _, key, t, origin = item
        if origin is not None:
            assert origin not in self.finished, f"record {origin} registered after it finished"
            self._place(f"record {origin}'s timer registration", self.record_epoch[origin])
        slot = (key, t)
        self.pending[slot] = min(self.pending.get(slot, self.left), self.left)

    def _timer(self, item: tuple, finishing: bool) -> None:
        _, key, t = item
        slot = (key, t)
        assert slot in self.pending, f"timer {t} of key {key!r} fired but was not registered"
        registered = self.pending.pop(slot)
        n = self.left
        firing = self.watermark_at(n, finishing)
        assert firing is not None and registered <= n and t <= firing, (
            f"timer {t} of key {key!r} (registered after {registered} watermark(s) left) "
            f"fired after {n} watermark(s) left, before a watermark made it due"
        )
        self.timers_fired += 1


def observed(outputs: list[Any], record_epoch: dict[int, int], serial: bool):
    """What equivalence compares: the watermarks, and outputs per key (serial) or per
    (key, epoch, record-or-timer) (parallel: a record after a watermark may run
    before that watermark's timers of its key)."""
    watermarks: list[float] = []
    per: defaultdict[tuple, list] = defaultdict(list)
    for item in outputs:
        if isinstance(item, Watermark):
            watermarks.append(item.timestamp)
            continue
        kind, key = item[0], item[1]
        if kind == "record":
            origin, epoch = "record", record_epoch[item[2][0]]
        elif kind == "register" and item[3] is not None:
            origin, epoch = "record", record_epoch[item[3]]
        else:
            origin, epoch = "timer", len(watermarks)
        per[(key,) if serial else (key, epoch, origin)].append(item)
    return watermarks, dict(per)


# -- the machine ---------------------------------------------------------------------------------


def _step(method):
    """Marks the machine unhealthy while a rule or invariant runs, so teardown
    finishes and compares only after steps that succeeded."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self.healthy = False
        result = method(self, *args, **kwargs)
        self.healthy = True
        return result

    return run


class OperatorMachine(RuleBasedStateMachine):
    """Drives one operator; subclasses fix ``mode`` (watermark order) and ``style``."""

    mode = "serial"
    style = "callback"

    def __init__(self) -> None:
        super().__init__()
        self.op: KeyedProcessOperator | None = None
        self.healthy = False

    @initialize(
        limit=st.integers(1, 6),
        buffer_size=st.integers(1, 4),
        finish_seed=st.integers(0, 2**16),
        prefix=st.lists(RECORDS, max_size=6),
        data=st.data(),
    )
    @_step
    def start(self, limit, buffer_size, finish_seed, prefix, data):
        self.serial = self.mode == "serial"
        self.config = AecConfig(
            in_flight_records_limit=limit,
            buffer_size=buffer_size,
            buffer_timeout=3600.0,  # flushes only by size, the flush rule, or need
            watermark_order=self.mode,
        )
        self.finish_seed = finish_seed
        self.executor = HeldExecutor()
        self.backend = MemoryBackend()
        self.op = KeyedProcessOperator(
            STYLES[self.style](not self.serial), self.backend, self.config, self.executor
        )
        self.source: list[Any] = []
        self.record_epoch: dict[int, int] = {}
        self.watermarks: list[float] = []
        self.outputs: list[Any] = []
        self.model = OutputModel(self.serial, self.record_epoch, self.watermarks)
        self.finished_contexts: list[Any] = []  # every context that finished, in order
        self.finish_problems: list[str] = []
        self._instrument()
        self.op.open()
        with self.adversary(data):
            for key, t in prefix:  # some work even when the rules drawn are all no-ops
                self.arrive(key, t)

    def _instrument(self) -> None:
        """Observe every finish: each context finishes once, with reference count 0.

        Wraps the operator's ``on_finished`` hook before any input (every
        RecordContext is created with it; it is the controller's
        ``on_context_finished``)."""
        original = self.op._on_finished
        seen: set[int] = set()

        def on_context_finished(context):
            if context.ref_count != 0:
                self.finish_problems.append(
                    f"{context.describe()} finished with reference count {context.ref_count}"
                )
            if id(context) in seen:
                self.finish_problems.append(f"{context.describe()} finished twice")
            seen.add(id(context))
            self.finished_contexts.append(context)
            original(context)

        self.op._on_finished = on_context_finished

    @contextmanager
    def adversary(self, data):
        """While the engine waits inside this block, hypothesis picks the batch."""
        self.executor.choose = lambda n: data.draw(st.integers(0, n - 1), label="wait completes")
        try:
            yield
        finally:
            self.executor.choose = lambda n: 0

    # -- rules -------------------------------------------------------------------------------
    def arrive(self, key, t) -> None:
        index = len(self.source)
        record = Record(key, (index, t), timestamp=t)
        self.source.append(record)
        self.record_epoch[index] = len(self.watermarks)
        self.op.process(record)

    @rule(key=st.sampled_from(KEYS), t=st.integers(0, MAX_TIME), data=st.data())
    @_step
    def record_arrives(self, key, t, data):
        with self.adversary(data):
            self.arrive(key, t)

    @rule(records=st.lists(RECORDS, min_size=2, max_size=5), data=st.data())
    @_step
    def records_arrive(self, records, data):
        """A burst: several records in one step (more same-key collisions)."""
        with self.adversary(data):
            for key, t in records:
                self.arrive(key, t)

    @rule(advance=st.integers(0, 8), data=st.data())
    @_step
    def watermark_arrives(self, advance, data):
        timestamp = (self.watermarks[-1] if self.watermarks else -1) + advance
        self.watermarks.append(timestamp)
        self.source.append(Watermark(timestamp))
        with self.adversary(data):
            self.op.process_watermark(Watermark(timestamp))
        if self.serial:
            assert self.op.epochs.all_closed_done(), "serial process_watermark returned early"

    @rule(data=st.data())
    @_step
    def batch_completes(self, data):
        held = self.executor.held
        if not held:
            return
        self.executor.complete(data.draw(st.integers(0, len(held) - 1), label="batch"))
        self.op.controller.run_available()

    @rule()
    @_step
    def buffer_flushes(self):
        before = len(self.op.controller.active.requests)
        if not before:
            return
        self.op.controller.flush()
        assert len(self.op.controller.active.requests) < before, "flush sent nothing"

    @rule(data=st.data())
    @_step
    def drain(self, data):
        """What a checkpoint does first: run until nothing is in flight."""
        controller, epochs = self.op.controller, self.op.epochs
        with self.adversary(data):
            for _ in range(100_000):
                if not controller.in_flight and epochs.all_closed_done():
                    break
                assert controller.step(), (
                    f"drain stuck with {controller.in_flight} in flight, "
                    f"keys {controller.stuck_keys()}"
                )
            else:
                raise AssertionError("drain did not end after 100,000 steps")
        assert controller.in_flight == 0
        assert not len(controller.keys) and not controller.blocking.keys()
        assert not controller.ready and not controller.active.requests
        assert not self.executor.held and self.executor.pending == 0
        self.absorb()
        assert self.model.left == len(self.watermarks), "a drain left a watermark behind"
        assert len(self.model.finished) == len(self.record_epoch), "a drain left a record behind"

    # -- invariants --------------------------------------------------------------------------
    def absorb(self, finishing: bool = False) -> None:
        new = self.op.drain_outputs()
        self.outputs.extend(new)
        self.model.absorb(new, finishing)

    @invariant()
    @_step
    def outputs_so_far_are_in_order(self):
        if self.op is not None:
            self.absorb()

    @invariant()
    @_step
    def engine_internals_are_consistent(self):
        if self.op is None:
            return
        assert not self.finish_problems, self.finish_problems
        controller = self.op.controller
        holders = dict(controller.keys.items())
        queues = {key: controller.blocking.waiting(key) for key in controller.blocking.keys()}
        ready = list(controller.ready)
        ready_ids = {id(c) for c in ready}
        assert len(ready_ids) == len(ready), "a context is twice in the ready deque"
        assert not controller.mailbox, "a completion mail was left unhandled between steps"
        assert self.executor.pending == len(self.executor.held)
        assert controller.current is None or controller.current.ref_count >= 0

        # key accounting: one context per key; waiting keys are held; ready ones hold
        for key, context in holders.items():
            assert context.key == key, f"key {key!r} held by a context of {context.key!r}"
            if id(context) in ready_ids:
                assert context.ref_count == 0, f"{context.describe()} is ready but started"
            else:
                assert context.ref_count > 0, (
                    f"{context.describe()} holds its key, is not ready, and has "
                    f"reference count {context.ref_count}"
                )
        for context in ready:
            assert holders.get(context.key) is context, (
                f"ready {context.describe()} does not hold its key"
            )

        # blocking buffer: per-key FIFO of unstarted contexts behind the holder
        queued = []
        for key, queue in queues.items():
            assert queue, f"empty blocking queue kept for key {key!r}"
            assert key in holders, f"key {key!r} has waiting contexts but nobody holds it"
            sequences = [c.sequence for c in queue]
            assert sequences == sorted(set(sequences)), (
                f"blocking queue of key {key!r} is not FIFO: {sequences}"
            )
            holder = holders[key]
            if holder.timer is None:  # a record holder took the key before these arrived
                assert holder.sequence < sequences[0], (
                    f"record holder {holder.sequence} of {key!r} is newer than waiter {sequences[0]}"
                )
            for context in queue:
                assert context.key == key and context is not holder
                assert context.ref_count == 0, f"waiting {context.describe()} has started"
                assert id(context) not in ready_ids
            queued.extend(queue)
        assert controller.blocking.size == len(queued)

        # in flight = holders + waiters; records never above the limit (timers overdraw)
        alive = list(holders.values()) + queued
        assert controller.in_flight == len(alive), (
            f"in_flight {controller.in_flight} but {len(alive)} contexts hold or wait"
        )
        timers_alive = sum(1 for c in alive if c.timer is not None)
        limit = self.config.in_flight_records_limit
        assert len(alive) - timers_alive <= limit, "records in flight above the limit"
        assert controller.in_flight <= limit + timers_alive
        for context in alive:
            assert context.ref_count >= 0 and context.in_batches >= 0

        # finished contexts stay at 0 and never hold or wait again
        alive_ids = {id(c) for c in alive}
        for context in self.finished_contexts:
            assert context.ref_count == 0, (
                f"{context.describe()} finished but its reference count is {context.ref_count}"
            )
            assert id(context) not in alive_ids, f"{context.describe()} finished but is alive"

        # epochs: counts match the live contexts, statuses are in order
        epochs = self.op.epochs
        closed = list(epochs.closed)
        assert epochs.active.status == OPEN
        for i, epoch in enumerate(closed):  # only the head may be firing
            assert epoch.status in ((CLOSED, FIRING) if i == 0 else (CLOSED,)), closed
            assert epoch.sequence + len(closed) - i == epochs.active.sequence, closed
        counts = Counter(id(c.epoch) for c in alive)
        known = {id(e) for e in [*closed, epochs.active]}
        assert set(counts) <= known, "a live context counts in a finished epoch"
        for epoch in [*closed, epochs.active]:
            assert epoch.ongoing == counts.get(id(epoch), 0), (
                f"{epoch} counts {epoch.ongoing}, but {counts.get(id(epoch), 0)} live contexts"
            )
        if self.serial:
            assert not closed, "serial mode: a watermark is still pending between steps"
            assert all(c.timer is None for c in alive), (
                "serial mode: a timer outlived its watermark"
            )

    # -- the end: finish and compare with the synchronous run --------------------------------
    def teardown(self):
        if self.op is None:
            return
        if not self.healthy:
            self.op.close()
            return
        rng = random.Random(self.finish_seed)
        self.executor.choose = rng.randrange
        self.op.finish()
        self.absorb(finishing=True)
        assert not self.finish_problems, self.finish_problems
        assert self.model.left == len(self.watermarks) + 1, "end of input left no watermark"
        assert self.outputs[-1] == Watermark(math.inf)
        assert not self.model.pending, f"timers never fired: {self.model.pending}"
        assert len(self.model.finished) == len(self.record_epoch)
        assert len(self.finished_contexts) == len(self.record_epoch) + self.model.timers_fired

        sync_backend = MemoryBackend()
        reference = run_sync(self.source, STYLES[self.style](not self.serial), sync_backend)
        sync_model = OutputModel(self.serial, self.record_epoch, self.watermarks)
        sync_model.absorb(reference.outputs, finishing=True)  # the model agrees with sync
        expected = observed(reference.outputs, self.record_epoch, self.serial)
        got = observed(self.outputs, self.record_epoch, self.serial)
        assert got[0] == expected[0], f"watermarks: sync {expected[0]}, async {got[0]}"
        for slot in sorted(set(expected[1]) | set(got[1]), key=repr):
            assert got[1].get(slot) == expected[1].get(slot), (
                f"outputs of {slot} differ: sync {expected[1].get(slot)}, async {got[1].get(slot)}"
            )
        for name in ("count", "fired"):
            assert self.backend.state_items(name) == sync_backend.state_items(name), name

        # coverage, visible with --hypothesis-show-statistics
        metrics = self.op.metrics
        event(f"records: {_bucket(len(self.record_epoch))}")
        event(f"timers fired: {_bucket(self.model.timers_fired)}")
        event(f"blocked records: {_bucket(metrics['blocked_requests'])}")
        if metrics["max_in_flight"] >= self.config.in_flight_records_limit:
            event("reached the in-flight limit")
        if metrics["max_in_flight"] > self.config.in_flight_records_limit:
            event("timer overdraft above the limit")


def _bucket(n: int) -> str:
    return "0" if n == 0 else "1-4" if n < 5 else "5-14" if n < 15 else "15+"


def _machine(mode: str, style: str):
    machine = type(f"Operator_{mode}_{style}", (OperatorMachine,), {"mode": mode, "style": style})
    case = machine.TestCase
    case.settings = settings(stateful_step_count=50)
    return case


TestSerialCallback = _machine("serial", "callback")
TestSerialAsync = _machine("serial", "async")
TestParallelCallback = _machine("parallel", "callback")
TestParallelAsync = _machine("parallel", "async")
