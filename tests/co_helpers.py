"""Two-input functions shared by the co-process tests."""

from __future__ import annotations

from aec import (
    KeyedCoProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
    Watermark,
)


class Enrich(KeyedCoProcessFunction):
    """Input 1 sets the key's profile (a ValueState), input 2 events are enriched with
    it and counted per value (MapState); an event without a profile waits in a list
    until one arrives. Both inputs register an event-time timer that reports the
    count. Callback style on input 1, ``async def`` on input 2 and in the timer."""

    def open(self, ctx):
        self.profile = ctx.get_state(ValueStateDescriptor("profile"))
        self.waiting = ctx.get_state(ListStateDescriptor("waiting"))
        self.counts = ctx.get_state(MapStateDescriptor("counts"))

    def process_element1(self, value, ctx):
        key = ctx.current_key
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 2)

        def flush(waiting):
            for event in waiting:
                ctx.output(("late-enriched", key, event, value))
            return self.waiting.async_clear()

        return (
            self.profile.async_update(value)
            .then_compose(lambda _: self.waiting.async_get())
            .then_compose(lambda it: it.on_next(lambda e: e))
            .then_compose(flush)
        )

    async def process_element2(self, value, ctx):
        key = ctx.current_key
        profile = await self.profile.async_value()
        seen = (await self.counts.async_get(value) or 0) + 1
        await self.counts.async_put(value, seen)
        if profile is None:
            await self.waiting.async_add(value)
            ctx.side_output("unmatched", (key, value))
        else:
            ctx.output(("enriched", key, value, profile, seen))
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 3)

    async def on_timer(self, timestamp, ctx):
        profile = await self.profile.async_value()
        ctx.output(("timer", ctx.current_key, timestamp, profile))


def values(outputs):
    """The outputs without watermarks."""
    return [o for o in outputs if not isinstance(o, Watermark)]


def watermarks(outputs):
    return [o.timestamp for o in outputs if isinstance(o, Watermark)]
