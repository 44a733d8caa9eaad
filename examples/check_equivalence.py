"""Check your own keyed function with ``aec.testing.assert_equivalent`` under hypothesis.

Needs ``pip install 'aec[hypothesis]'``. Run: ``python examples/check_equivalence.py``
(in a test suite, keep the ``test_*`` functions and let pytest run them).

``assert_equivalent(factory, source)`` runs the function synchronously (the
reference) and then asynchronously under adversarial batch-completion orders, in
both watermark modes, and raises ``AssertionError`` naming the mode, the schedule
and the first diverging output if the answers differ. Given hypothesis' ``data``,
hypothesis draws (and shrinks) the completion orders too.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aec import (
    AecConfig,
    Context,
    KeyedProcessFunction,
    Record,
    RuntimeContext,
    ValueStateDescriptor,
    Watermark,
)
from aec.testing import assert_equivalent, configs, keyed_streams


class RunningTotal(KeyedProcessFunction):
    """Per key: the running sum of the values, and a report when the watermark passes."""

    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    async def process_element(self, value: Any, ctx: Context) -> None:
        total = await self.total.async_value() + value
        await self.total.async_update(total)
        ctx.output((ctx.current_key, total))
        if ctx.timestamp is not None:
            ctx.timer_service.register_event_time_timer(ctx.timestamp)

    async def on_timer(self, timestamp: float, ctx: Context) -> None:
        ctx.output((ctx.current_key, "at", timestamp, await self.total.async_value()))


class LeakyTotal(RunningTotal):
    """A bug the checker catches: a plain attribute shared by all keys, read across an
    await, so the answer depends on how records of different keys interleave."""

    def open(self, ctx: RuntimeContext) -> None:
        super().open(ctx)
        self.seen = 0  # not keyed state: every key sees every other key's records

    async def process_element(self, value: Any, ctx: Context) -> None:
        before = self.seen
        total = await self.total.async_value() + value
        self.seen = before + 1  # lost update when another key ran during the await
        await self.total.async_update(total)
        ctx.output((ctx.current_key, total, self.seen))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9)), max_size=20), st.data())
def test_running_total_is_equivalent(rows: list[tuple[str, int]], data: st.DataObject) -> None:
    assert_equivalent(RunningTotal, [Record(k, v) for k, v in rows], data=data)


@settings(max_examples=30, deadline=None)
@given(keyed_streams(), configs("serial"), st.data())
def test_running_total_on_any_stream(
    source: list[Record | Watermark], config: AecConfig, data: st.DataObject
) -> None:
    # records with event times and watermarks, small async configs. Serial watermark
    # mode only: on_timer reads state that later records of its key write, which the
    # "parallel" mode may let run first (docs/semantics.md rule 11); configs() would find that.
    assert_equivalent(RunningTotal, source, configs=[config], data=data)


def main() -> None:
    test_running_total_is_equivalent()
    test_running_total_on_any_stream()
    print("RunningTotal: the async runs equal the synchronous run")
    source = [Record(key, 1) for key in "abcabcabc"]
    try:
        assert_equivalent(LeakyTotal, source)
    except AssertionError as caught:
        print("LeakyTotal:", str(caught).splitlines()[0])
    else:
        raise SystemExit("the checker missed LeakyTotal's bug")


if __name__ == "__main__":
    main()
