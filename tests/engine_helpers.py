"""Small functions and executors shared by the engine tests."""

from __future__ import annotations

import collections
import enum

from aec import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from aec.runtime.executor import StateExecutor


class ManualExecutor(StateExecutor):
    """Holds batches until the test completes them; FIFO when the engine must wait."""

    concurrent = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list = []
        self.submitted: list[int] = []  # batch sizes in submission order

    def submit(self, batch) -> None:
        self.pending += 1
        self.held.append(batch)
        self.submitted.append(len(batch))

    def complete(self, index: int = 0) -> None:
        self._run(self.held.pop(index), self._mailbox.post_local)

    def complete_all(self) -> None:
        while self.held:
            self.complete(0)

    def wait(self, timeout) -> None:
        if self.held:
            self.complete(0)


class FiringReads:
    """A mixin for a one- or two-input function that registers a timer per record: each
    firing reads state and outputs ``(timestamp, whether the read was answered before
    async_value() returned)``."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=0))

    def on_timer(self, timestamp, ctx):
        read = self.seen.async_value()
        ctx.output((timestamp, read.is_done()))
        return read


class Counter(KeyedProcessFunction):
    """Keyed counter in callback style: emits (key, count) per record."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process_element(self, value, ctx):
        count = self.count

        def bump(n):
            n = (n or 0) + 1
            return count.async_update(n).then_accept(lambda _: ctx.output((ctx.current_key, n)))

        return count.async_value().then_compose(bump)


class AsyncCounter(KeyedProcessFunction):
    """The same counter as ``async def``."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    async def process_element(self, value, ctx):
        n = (await self.count.async_value() or 0) + 1
        await self.count.async_update(n)
        ctx.output((ctx.current_key, n))


class Logged(KeyedProcessFunction):
    """Logs starts and finishes of each record and timer into ``log``.

    Each record reads and writes its key's state and registers a timer at its
    value (an event time) when the value is a number.
    """

    def __init__(self, log: list) -> None:
        self.log = log

    def open(self, ctx):
        self.seen = ctx.get_state(ListStateDescriptor("seen"))

    def process_element(self, value, ctx):
        key = ctx.current_key
        self.log.append(("start", key, value))
        if isinstance(value, (int, float)):
            ctx.timer_service.register_event_time_timer(value)

        def done(_):
            self.log.append(("done", key, value))
            ctx.output((key, value))

        return (
            self.seen.async_get()
            .then_compose(lambda _: self.seen.async_add(value))
            .then_accept(done)
        )

    def on_timer(self, timestamp, ctx):
        key = ctx.current_key
        self.log.append(("timer", key, timestamp))

        def done(items):
            self.log.append(("timer-done", key, timestamp))
            ctx.output(("timer", key, timestamp, list(items)))

        return self.seen.async_get().then_accept(done)


class Everything(KeyedProcessFunction):
    """Touches every state type, side outputs and timers (timers read state)."""

    def open(self, ctx):
        from aec import (
            AggregateFunction,
            AggregatingStateDescriptor,
            ReducingStateDescriptor,
        )

        class Mean(AggregateFunction):
            def create_accumulator(self):
                return (0, 0)

            def add(self, value, acc):
                return (acc[0] + value, acc[1] + 1)

            def get_result(self, acc):
                return acc[0] / acc[1]

            def merge(self, a, b):
                return (a[0] + b[0], a[1] + b[1])

        self.last = ctx.get_state(ValueStateDescriptor("last", default=-1))
        self.items = ctx.get_state(ListStateDescriptor("items"))
        self.by_parity = ctx.get_state(MapStateDescriptor("by_parity"))
        self.total = ctx.get_state(ReducingStateDescriptor("total", lambda a, b: a + b))
        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", Mean()))

    async def process_element(self, value, ctx):
        previous = await self.last.async_value()
        await self.last.async_update(value)
        await self.items.async_add(value)
        parity = value % 2
        old = await self.by_parity.async_get(parity)
        await self.by_parity.async_put(parity, (old or 0) + 1)
        await self.total.async_add(value)
        await self.mean.async_add(value)
        if value % 5 == 0:
            ctx.side_output("fives", (ctx.current_key, value))
            await self.by_parity.async_remove(1 - parity)
        if value % 7 == 0:
            await self.items.async_clear()
        ctx.output((ctx.current_key, previous, await self.total.async_get()))
        ctx.timer_service.register_event_time_timer(float(value % 10))

    def on_timer(self, timestamp, ctx):
        return self.by_parity.async_entries().then_compose(
            lambda entries: self.mean.async_get().then_accept(
                lambda mean: ctx.output(("timer", ctx.current_key, timestamp, list(entries), mean))
            )
        )


def cyclic_garbage(run) -> int:
    """Objects ``run()`` leaves in reference cycles (freed only by the cyclic GC): run
    with the collector off after a full collection, then count what a collection
    finds. ``run`` drops its results before it returns."""
    import gc

    gc.collect()
    gc.disable()
    try:
        run()
        return gc.collect()
    finally:
        gc.enable()


class Color(str, enum.Enum):  # noqa: UP042  # the mixin, not StrEnum: its str() differs
    """Key types that subclass built-in ones (``aec.keygroups.plain_key``)."""

    RED = "red"


class Shade(enum.StrEnum):
    DARK = "dark"


class Level(enum.IntEnum):
    HIGH = 2


Pair = collections.namedtuple("Pair", "color level")
