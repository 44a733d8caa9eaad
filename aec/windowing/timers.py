"""Window timers on the engine's per-key timers (Flink's ``InternalTimer`` with a
window namespace).

The engine keeps one timer per (key, time, domain). Which windows a timer is
for lives in state per key: MapState ``window-timers``, ``(domain, time) ->
windows``, so a firing reads one entry, never the key's other windows.
Windows whose timers the built-in trigger implies (``aec.windowing.builtin``: the
trigger timer at ``end``, the cleanup timer at ``end + allowed_lateness``, on a time
grid or a session set) skip the index: a firing rebuilds them from its time
(``implicit``).

Registrations of one invocation (a record or a timer) are buffered and written
at its end (``flush``): one read and at most one write per time touched.
"""

from __future__ import annotations

from typing import cast

from aec.functions import Context
from aec.state.future import StateFuture, combine_all, completed_future
from aec.state.handles import MapState

EVENT = "event-time"
PROCESSING = "processing-time"


class PendingTimers:
    """The timer changes of one invocation: ``{(domain, time): {window: keep}}``."""

    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes: dict[tuple[str, float], dict[object, bool]] = {}

    def set(self, domain: str, time: float, window: object, keep: bool) -> None:
        slot = self.changes.get((domain, time))
        if slot is None:
            self.changes[(domain, time)] = {window: keep}
        else:
            slot[window] = keep


class WindowTimers:
    """Registers and finds window timers of the current key.

    Args:
        index: the MapState handle of ``window-timers`` (None when every timer is implicit).
        implicit: every timer is implied by the assigner (no index).
    """

    def __init__(self, index: MapState | None, implicit: bool) -> None:
        self.index = index
        self.implicit = implicit

    def register(
        self, ctx: Context, pending: PendingTimers | None, domain: str, time: float,
        window: object,
    ) -> None:  # fmt: skip
        """``pending`` is None only with implicit timers (it buffers nothing then)."""
        _engine_register(ctx, domain, time)
        if not self.implicit:
            cast(PendingTimers, pending).set(domain, time, window, True)

    def delete(
        self, pending: PendingTimers | None, domain: str, time: float, window: object
    ) -> None:
        if not self.implicit:  # implicit engine timers stay: a firing checks the window exists
            cast(PendingTimers, pending).set(domain, time, window, False)

    def flush(self, ctx: Context, pending: PendingTimers) -> StateFuture:
        """Write the buffered changes into the index; an engine timer left without
        windows is deleted."""
        changes = pending.changes
        if not changes:
            return completed_future(None)
        pending.changes = {}
        slots = list(changes)
        index = cast(MapState, self.index)  # changes are buffered only with an index

        def apply(entries: list[tuple[object, ...] | None]) -> StateFuture:
            writes = []
            for slot, entry in zip(slots, entries, strict=True):
                windows = dict.fromkeys(entry or ())
                before = len(windows)
                added = False
                for window, keep in changes[slot].items():
                    if keep:
                        if window not in windows:
                            windows[window] = None
                            added = True
                    else:
                        windows.pop(window, None)
                if added or len(windows) != before:
                    if windows:
                        writes.append(index.async_put(slot, tuple(windows)))
                    else:
                        writes.append(index.async_remove(slot))
                        _engine_delete(ctx, *slot)
            return combine_all(writes)

        return combine_all([index.async_get(slot) for slot in slots]).then_compose(apply)

    def take(self, domain: str, time: float) -> StateFuture:
        """A future of the windows with a timer at ``(domain, time)``; removes the entry."""
        index, slot = cast(MapState, self.index), (domain, time)  # not implicit: an index

        def remove(entry: tuple[object, ...] | None) -> StateFuture:
            if entry is None:
                return completed_future(())
            return index.async_remove(slot).then_apply(lambda _: entry)

        return index.async_get(slot).then_compose(remove)


def _engine_register(ctx: Context, domain: str, time: float) -> None:
    if domain == EVENT:
        ctx.timer_service.register_event_time_timer(time)
    else:
        ctx.timer_service.register_processing_time_timer(time)


def _engine_delete(ctx: Context, domain: str, time: float) -> None:
    if domain == EVENT:
        ctx.timer_service.delete_event_time_timer(time)
    else:
        ctx.timer_service.delete_processing_time_timer(time)
