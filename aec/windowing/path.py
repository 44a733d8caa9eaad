"""How a window function runs: ``choose_path(spec, config)``, decided once in ``open``.

Every window runs Flink's ``WindowOperator`` semantics; the path decides only how:
which driver runs records and timers, where state lives, which timers exist, and
whether records are held in mini-batches. The one place these choices are made:

* **timers**: ``"grid"`` for tumbling and sliding assigners with the built-in trigger
  (``aec.windowing.builtin``: timers at a window's end and cleanup time, rebuilt from
  the grid at a firing), ``"sessions"`` for merging assigners with the built-in trigger
  (rebuilt from the key's session set), ``"index"`` otherwise (MapState
  ``window-timers``: ``(domain, time) -> windows``).
* **panes**: sliding windows over an aggregate or reduce on grid timers keep panes of
  ``gcd(size, slide)`` (``aec.windowing.grid.Panes``); in ``chain`` mode (no allowed
  lateness, or processing time) a key's live panes are few and its timers form a chain.
* **sessions**: ``"together"``, a key's sessions with their contents as one value
  (ValueState ``window-sessions-contents``), or ``"apart"``, the set
  (``window-sessions``) apart from the contents (``window-contents``).
* **driver**: a callback driver (``"tumbling"``, ``"panes"``, ``"sessions"``:
  StateFuture callbacks, no coroutine per record) where the function is *plain* (no
  evictor, a ``ProcessWindowFunction``, if any, neither ``async def`` nor with its
  own ``clear``) and the windows are a tumbling grid, panes in chain mode, or
  event-time sessions with the built-in trigger; else ``"general"`` (``async def``,
  every trigger and evictor).
* **bundle**: a callback driver in event time holds on-time records in a mini-batch
  (``aec.runtime.bundle``) in asynchronous runs with serial watermark order and record
  order: there nothing after a watermark can see a bundle not yet folded. The
  synchronous run never bundles: it is the reference.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from aec.config import AecConfig
from aec.windowing.assigners import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from aec.windowing.process import own_clear
from aec.windowing.spec import WindowSpec
from aec.windowing.triggers import EventTimeTrigger, ProcessingTimeTrigger

Driver = Literal["general", "tumbling", "panes", "sessions"]


@dataclass(frozen=True)
class Path:
    """How one window function runs (see the module).

    Attributes:
        driver: what runs records and timers.
        timers: ``"grid"``, ``"sessions"`` (both implied) or ``"index"``.
        panes: the pane size in seconds when sliding windows keep panes, else None.
        chain: panes in chain mode.
        sessions: where a merging assigner's session set lives, else None.
        clears: the ``ProcessWindowFunction`` has its own ``clear`` (run at cleanup).
        bundle: on-time records are held in mini-batches.
    """

    driver: Driver
    timers: Literal["grid", "sessions", "index"]
    panes: Fraction | None
    chain: bool
    sessions: Literal["together", "apart"] | None
    clears: bool
    bundle: bool

    @property
    def implied(self) -> bool:
        """The built-in trigger's timers are implied: no ``window-timers`` index."""
        return self.timers != "index"


# the built-in assigners whose windows are their grid's (``Grid.windows``)
_GRID_ASSIGNS = frozenset(
    {SlidingEventTimeWindows.assign_windows, TumblingEventTimeWindows.assign_windows}
)


def on_grid(assigner: WindowAssigner) -> bool:
    """Whether ``assigner``'s windows are its grid's: a sliding or tumbling assigner
    (event or processing time) whose ``assign_windows`` is the built-in one. A subclass
    with its own ``assign_windows`` takes the general path, which asks it per record."""
    return (
        isinstance(assigner, SlidingEventTimeWindows)
        and type(assigner).assign_windows in _GRID_ASSIGNS
    )


def choose_path(spec: WindowSpec, config: AecConfig | None) -> Path:
    """The path of a window function with ``spec`` in a run with ``config`` (None: the
    state layout only, e.g. to check a checkpoint before ``open``; never bundles)."""
    assigner, process = spec.assigner, spec.process
    event_time = assigner.event_time
    builtin = type(spec.trigger) is (EventTimeTrigger if event_time else ProcessingTimeTrigger)
    timers: Literal["grid", "sessions", "index"] = "index"
    if builtin and assigner.merging:
        timers = "sessions"
    elif builtin and on_grid(assigner):
        timers = "grid"
    clears = own_clear(process)
    plain = (
        spec.evictor is None
        and not clears
        and (process is None or not inspect.iscoroutinefunction(process.process))
    )
    panes = spec.pane if timers == "grid" else None
    chain = panes is not None and (spec.allowed_lateness == 0 or not event_time)
    sessions: Literal["together", "apart"] | None = None
    if assigner.merging:
        together = plain and timers == "sessions" and event_time
        sessions = "together" if together and type(assigner) is EventTimeSessionWindows else "apart"
    driver: Driver = "general"
    if plain and timers == "grid" and panes is None:
        if isinstance(assigner, TumblingEventTimeWindows):
            driver = "tumbling"
    elif plain and chain:
        driver = "panes"
    elif sessions == "together":
        driver = "sessions"
    bundle = (
        driver != "general"
        and event_time
        and config is not None
        and config.async_state
        and config.watermark_order == "serial"
        and not config.state_ordered
    )
    return Path(driver, timers, panes, chain, sessions, clears, bundle)
