"""A keyed counter, written twice: as a Flink-style callback chain and as ``async def``.

Needs only the engine (``pip install aec``). Run: ``python examples/keyed_counter.py``.

Both functions count records per key in a ``ValueState``. ``run_keyed`` feeds the
records through the Async Execution Controller: records of one key run one after
another, records of different keys overlap while their state requests travel in
batches. The answer is the synchronous one, whichever style you write.
"""

from __future__ import annotations

from typing import Any

from aec import (
    AecConfig,
    Context,
    KeyedProcessFunction,
    Record,
    RuntimeContext,
    StateFuture,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)


class CountState(KeyedProcessFunction):
    """The state both counters use: one ValueState per key, 0 when absent."""

    def open(self, ctx: RuntimeContext) -> None:
        # state handles are made in open(): on Spark, on the executor that runs them
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))


class Counter(CountState):
    """Callback chain (Flink's State V2 style): each step returns a StateFuture."""

    def process_element(self, value: Any, ctx: Context) -> StateFuture:
        return self.count.async_value().then_compose(
            lambda n: self.count.async_update(n + 1).then_accept(
                lambda _: ctx.output((ctx.current_key, n + 1))
            )
        )


class AsyncCounter(CountState):
    """The same in ``async def``: await aec StateFutures only (no asyncio here)."""

    async def process_element(self, value: Any, ctx: Context) -> None:
        n = await self.count.async_value()
        await self.count.async_update(n + 1)
        ctx.output((ctx.current_key, n + 1))


def main() -> None:
    source: list[Record | Watermark] = [
        Record("a", 1),
        Record("b", 2),
        Record("a", 3),
        Watermark(10),
        Record("b", 4),
    ]
    chained = run_keyed(source, Counter())
    awaited = run_keyed(source, AsyncCounter(), config=AecConfig(buffer_size=2))
    synchronous = run_keyed(source, AsyncCounter(), config=AecConfig(async_state=False))
    print("callbacks:", chained.outputs)
    print("async def:", awaited.outputs)
    assert chained.outputs == awaited.outputs == synchronous.outputs
    print("batches:", awaited.metrics["batches"], "requests:", awaited.metrics["requests"])


if __name__ == "__main__":
    main()
