"""What the engine refuses or names instead of losing: a record after the final
watermark, a returned future nothing completes, an asyncio awaitable in user code."""

from __future__ import annotations

import asyncio
import math

import pytest

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    Record,
    StateFuture,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.runtime.controller import StuckError
from aec.runtime.operator import KeyedProcessOperator
from backends import MemoryBackend

MODES = [AecConfig(), AecConfig(async_state=False), AecConfig(watermark_order="parallel")]
IDS = ["async", "sync", "parallel"]


class Counter(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        n = await self.count.async_value()
        await self.count.async_update(n + 1)
        ctx.output((ctx.current_key, n + 1))


@pytest.mark.parametrize("config", MODES, ids=IDS)
def test_a_record_after_the_final_watermark_is_refused(config):
    source = [Record("a", 1), Watermark(math.inf), Record("a", 2)]
    with pytest.raises(ValueError, match=r"after Watermark\(inf\)"):
        run_keyed(source, Counter(), config=config)


@pytest.mark.parametrize("config", MODES, ids=IDS)
def test_the_final_watermark_may_repeat_and_the_run_still_finishes(config):
    result = run_keyed(
        [Record("a", 1), Watermark(math.inf), Watermark(math.inf)], Counter(), config=config
    )
    assert result.outputs == [("a", 1), Watermark(math.inf), Watermark(math.inf)]


class MyFuture(StateFuture):
    """A user's subclass: held like a StateFuture."""


class NeverCompletes(KeyedProcessFunction):
    def __init__(self, kind=StateFuture):
        self.kind = kind

    def process_element(self, value, ctx):
        return self.kind()  # made outside the engine: nothing will ever complete it


@pytest.mark.parametrize("kind", [StateFuture, MyFuture])
@pytest.mark.parametrize("config", MODES, ids=IDS)
def test_a_returned_future_nothing_completes_is_stuck_naming_the_record(config, kind):
    with pytest.raises(JobFailure) as failure:
        run_keyed([Record("k", "v1")], NeverCompletes(kind), config=config)
    cause = failure.value.__cause__
    assert isinstance(cause, StuckError)
    assert "record 'v1' of key 'k'" in str(cause)


class ReturnsItsOwnFuture(KeyedProcessFunction):
    """A user-made future the function completes itself, later, is waited for."""

    def open(self, ctx):
        self.pending = []

    def process_element(self, value, ctx):
        if value == "complete":
            for future in self.pending:
                future.complete(None)
            ctx.output("completed")
            return None
        future = StateFuture()
        self.pending.append(future)
        return future.then_accept(lambda _: ctx.output(("done", value)))


def test_a_returned_user_future_holds_its_record_until_completed():
    result = run_keyed(
        [Record("a", "x"), Record("b", "complete")], ReturnsItsOwnFuture(), config=AecConfig()
    )
    assert result.outputs[:2] == [("done", "x"), "completed"]  # completed inside record b


class SleepsWithAsyncio(KeyedProcessFunction):
    async def process_element(self, value, ctx):
        await asyncio.sleep(0.01)
        ctx.output(value)


class AwaitsAnAsyncioFuture(KeyedProcessFunction):
    async def process_element(self, value, ctx):
        await asyncio.Future()


@pytest.mark.parametrize("function", [SleepsWithAsyncio, AwaitsAnAsyncioFuture])
@pytest.mark.parametrize("config", MODES, ids=IDS)
def test_awaiting_asyncio_names_what_may_be_awaited(function, config):
    with pytest.raises(JobFailure) as failure:
        run_keyed([Record("a", 1)], function(), config=config)
    message = str(failure.value.__cause__)
    assert isinstance(failure.value.__cause__, TypeError)
    assert "may await only aec StateFutures" in message and "ctx.call_async" in message


def test_awaiting_asyncio_with_no_current_loop_names_what_may_be_awaited():
    """After asyncio.run, the main thread has no current loop: an asyncio.Future()
    made in user code raises there, and the engine still names what may be awaited."""
    asyncio.run(asyncio.sleep(0))
    asyncio.set_event_loop(None)
    with pytest.raises(JobFailure) as failure:
        run_keyed([Record("a", 1)], AwaitsAnAsyncioFuture())
    assert isinstance(failure.value.__cause__, TypeError)
    assert "ctx.call_async" in str(failure.value.__cause__)


def test_an_operator_refuses_what_is_not_a_record_or_a_clock_naming_it():
    """Operators used directly: a tuple given as a record, an object given as a clock,
    are TypeErrors naming them (not an AttributeError from inside)."""
    operator = KeyedProcessOperator(Counter(), MemoryBackend())
    with pytest.raises(TypeError, match=r"process takes a Record, got \('k', 1, None\)"):
        operator.process(("k", 1, None))
    operator.close()
    with pytest.raises(TypeError, match=r"clock must be an aec.clock.Clock .*got <object"):
        run_keyed([Record("k", 1)], Counter(), clock=object())


def test_then_combine_with_what_is_not_a_future_is_a_type_error_at_the_call():
    class Combines(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        def process_element(self, value, ctx):
            return self.count.async_value().then_combine(5, lambda a, b: a + b)

    with pytest.raises(JobFailure) as failure:
        run_keyed([Record("k", 1)], Combines())
    assert isinstance(failure.value.__cause__, TypeError)
