"""``window(...)``: windows as a ``KeyedProcessFunction`` (Flink's ``WindowOperator``,
``EvictingWindowOperator`` and ``AsyncWindowOperator``, merging windows included).

All window state is state of the function's backend, per key and window, reached
through the AEC like any state request: contents (``window-contents``), trigger and
``ProcessWindowFunction`` state (``window-trigger.<name>``, ``window-process.<name>``),
the timer index (``window-timers``) and, for sessions, the merging-window set
(``window-sessions``; on the session callback driver a key's sessions and their
contents are one value instead, ``window-sessions-contents``). Timers are the engine's
per-key timers. So windows batch, run asynchronously, checkpoint, rescale and pass
``assert_equivalent`` as any keyed function does. See ``docs/windows.md``.

The function opens its state, picks its path once (``choose_path``) and hands records
and timers to that path's driver; it owns the output of a firing (``emit``) and of a
late record (``late``), which every driver calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, cast

from aec.functions import Context, KeyedProcessFunction, RuntimeContext
from aec.runtime.bundle import Bundle
from aec.state.descriptors import (
    AggregateFunction,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.handles import MapState
from aec.windowing import sessions as session_driver
from aec.windowing.assigners import SlidingEventTimeWindows, WindowAssigner
from aec.windowing.builtin import BuiltinTrigger
from aec.windowing.bundles import PaneBundle, TumblingBundle
from aec.windowing.contents import Contents
from aec.windowing.evictors import Evictor
from aec.windowing.general import GeneralDriver
from aec.windowing.grid import Grid, Panes
from aec.windowing.namespaced import window_handle
from aec.windowing.panes import LIVE_PANES, PaneContents
from aec.windowing.path import Path, choose_path
from aec.windowing.process import ProcessWindowContext, ProcessWindowFunction
from aec.windowing.protocol import WindowFunction
from aec.windowing.session_bundle import SessionBundle
from aec.windowing.sessions import SessionsDriver
from aec.windowing.sliding import PanesDriver
from aec.windowing.spec import WindowSpec
from aec.windowing.timers import WindowTimers
from aec.windowing.triggers import Trigger
from aec.windowing.tumbling import TumblingDriver


class Driver(Protocol):
    """Runs a window function's records and timers (``aec.windowing.general`` and the
    callback drivers); returns what ``process_element``/``on_timer`` return."""

    def on_record(self, value: object, ctx: Context) -> Awaitable[None] | None: ...

    def on_timer(self, time: float, ctx: Context) -> Awaitable[None] | None: ...


# the start of the state name a window function declares for its assigner (never written)
ASSIGNER_MARKER = "window-assigner="
# + the allowed lateness in effect (seconds; 0.0 in processing time, which ignores it): a
# state name, so a restore into a function keeping windows for another lateness is refused
LATENESS_MARKER = "window-allowed-lateness="
CONTENTS = "window-contents"  # MapState: window key (or pane index) -> contents
TIMERS = "window-timers"  # MapState: window key -> its timers
SESSIONS_APART = "window-sessions"  # ValueState: a key's sessions, contents kept apart


def scoped_state_name(kind: str, name: str) -> str:
    """The MapState (per window) of a trigger's (``kind`` "trigger") or process
    function's ("process") own state ``name``."""
    return f"window-{kind}.{name}"


SCOPED_PREFIXES = tuple(scoped_state_name(kind, "") for kind in ("trigger", "process"))


class WindowOperatorFunction(KeyedProcessFunction, WindowFunction):
    """The function ``window(...)`` returns; see ``aec.windowing.window``. Once opened it
    is the ``WindowFunction`` its drivers see (the attributes are set in ``open``)."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.late_records_dropped = 0

    # -- set-up ------------------------------------------------------------------------------
    def open(self, ctx: RuntimeContext) -> None:
        spec = self.spec
        assigner = self.assigner = spec.assigner
        self.trigger, self.evictor, self.process_fn = spec.trigger, spec.evictor, spec.process
        self.event_time, self.lateness = assigner.event_time, spec.allowed_lateness
        self.rules = BuiltinTrigger(self.event_time, self.lateness)
        self._runtime = ctx
        self._stores: dict[str, MapState] = {}
        ctx.get_state(ValueStateDescriptor(self.assigner_marker()))  # a name, never written
        ctx.get_state(ValueStateDescriptor(self.lateness_marker()))  # (the same)
        path = self.path = choose_path(spec, ctx.config)
        together = path.sessions == "together"
        # the session driver keeps contents with the sessions, the chain mode panes as one
        # value per key: no window-contents then
        apart = not (together or path.chain)
        store = ctx.get_state(MapStateDescriptor(CONTENTS)) if apart else None
        index = None if path.implied else ctx.get_state(MapStateDescriptor(TIMERS))
        self.timers = WindowTimers(index, path.implied)
        self.session_contents = (
            ctx.get_state(ValueStateDescriptor(session_driver.STATE)) if together else None
        )
        merging = path.sessions == "apart"
        self.sessions = ctx.get_state(ValueStateDescriptor(SESSIONS_APART)) if merging else None
        live = ctx.get_state(ValueStateDescriptor(LIVE_PANES)) if path.chain else None
        self.grid = assigner.grid if isinstance(assigner, SlidingEventTimeWindows) else None
        contents = spec.make_contents(store)
        self.panes = None
        held: Contents | PaneContents = contents
        if path.panes is not None:
            self.panes = Panes(cast(Grid, self.grid), path.panes)
            held = PaneContents(contents, self.panes, live)
        self.contents = held
        process = self.process_fn
        if process is not None and hasattr(process, "open"):
            process.open(ctx)
        self._driver, self._bundle = self._drivers(path)

    def _drivers(self, path: Path) -> tuple[Driver, Bundle | None]:
        """The path's driver, and its bundle when the path bundles."""
        if path.driver == "tumbling":
            tumbling = TumblingDriver(self)
            return tumbling, TumblingBundle(self) if path.bundle else None
        if path.driver == "panes":
            panes = PanesDriver(self)
            return panes, PaneBundle(self, panes) if path.bundle else None
        if path.driver == "sessions":
            sessions = SessionsDriver(self)
            return sessions, SessionBundle(self, sessions) if path.bundle else None
        return GeneralDriver(self), None

    def open_bundle(self) -> Bundle | None:
        """The operator's hook (``aec.runtime.bundle``), called after ``open``: the
        bundle of on-time records of the chosen path (``aec.windowing.path``), or None."""
        return self._bundle

    def assigner_marker(self) -> str:
        """A state name naming the assigner: in the checkpoint's state names, so a
        restore into a function with another assigner is refused (``check_restore``)."""
        return f"{ASSIGNER_MARKER}{self.spec.assigner.describe()}"

    def lateness_marker(self) -> str:
        """A state name naming the allowed lateness in effect: the windows' cleanup timers
        are set at ``end + lateness``, so a restore into a function with another
        lateness is refused (``check_restore``)."""
        lateness = float(self.spec.allowed_lateness) if self.spec.assigner.event_time else 0.0
        return f"{LATENESS_MARKER}{lateness!r}"

    def check_restore(self, state_names: list[str]) -> None:
        """Called by the operator's ``restore`` with the checkpoint's state names.

        Raises:
            ValueError: the checkpoint was taken with another window assigner or another
                allowed lateness (event time), or keeps sessions in the other layout. A
                checkpoint naming no lateness (written before it was named) is restored.
        """
        theirs = [n for n in state_names if n.startswith(ASSIGNER_MARKER)]
        mine = self.assigner_marker()
        if theirs and theirs != [mine]:
            raise ValueError(
                f"the checkpoint holds windows of {theirs[0].split('=', 1)[1]}; this "
                f"function's assigner is {self.spec.assigner.describe()}: windows would not match"
            )
        # the other layout's state would restore unread: sessions are kept with their
        # contents on the session driver only, panes as one value in the chain mode only
        path = choose_path(self.spec, None)
        together = session_driver.STATE in state_names
        if (together or SESSIONS_APART in state_names) and together != (
            path.sessions == "together"
        ):
            layouts = ("apart from", "with")
            raise ValueError(
                f"the checkpoint keeps sessions {layouts[together]} their contents; this "
                f"function keeps them {layouts[not together]} theirs (trigger, evictor or "
                "process function changed, or a checkpoint of an earlier version)"
            )
        live = LIVE_PANES in state_names
        if live != path.chain and (live or CONTENTS in state_names):
            layouts = ("one entry per pane or window", "one value per key")
            raise ValueError(
                f"the checkpoint keeps sliding windows' panes as {layouts[live]}; this "
                f"function keeps them as {layouts[not live]} (allowed lateness, assigner "
                "or function changed, or a checkpoint of an earlier version)"
            )
        theirs = [n for n in state_names if n.startswith(LATENESS_MARKER)]
        mine = self.lateness_marker()
        if theirs and theirs != [mine]:
            then, now = (n[len(LATENESS_MARKER) :] for n in (theirs[0], mine))
            raise ValueError(
                f"the checkpoint's windows were kept for an allowed lateness of {then} s; "
                f"this function's is {now} s: their cleanup timers fire at end + {then}, "
                "which would not clean them (restore with the lateness it was taken with)"
            )

    def close(self) -> None:
        if self.process_fn is not None and hasattr(self.process_fn, "close"):
            self.process_fn.close()

    def metric_counters(self) -> dict[str, int]:
        """Added to the run's metrics: ``late_records_dropped``."""
        return {"late_records_dropped": self.late_records_dropped}

    # -- state per key and window -----------------------------------------------------------
    def window_store(self, descriptor: StateDescriptor, kind: str) -> MapState:
        name = scoped_state_name(kind, descriptor.name)
        store = self._stores.get(name)
        if store is None:
            store = self._stores[name] = self._runtime.get_state(MapStateDescriptor(name))
        return store

    def window_state(self, descriptor: StateDescriptor, window: object, kind: str) -> Any:
        return window_handle(descriptor, self.window_store(descriptor, kind), window)

    def global_state(self, descriptor: StateDescriptor) -> Any:
        return self._runtime.get_state(descriptor)

    # -- records and timers: the driver's --------------------------------------------------------
    def process_element(self, value: object, ctx: Context) -> Awaitable[None] | None:
        return self._driver.on_record(value, ctx)

    def on_timer(self, timestamp: float, ctx: Context) -> Awaitable[None] | None:
        return self._driver.on_timer(timestamp, ctx)

    # -- outputs ---------------------------------------------------------------------------------
    def missing_timestamp(self, value: object, ctx: Context) -> ValueError:
        return ValueError(
            f"record {value!r} of key {ctx.current_key!r} has no timestamp: the "
            f"event-time window assigner {self.assigner!r} needs Record(key, value, timestamp)"
        )

    def late(self, ctx: Context, value: object, timestamp: float, watermark: float) -> None:
        """A late record: to the side output ``late_data_tag`` (through ``late_output``,
        if given), else counted in ``late_records_dropped``."""
        tag = self.spec.late_data_tag
        if tag is None:
            self.late_records_dropped += 1
            return
        late_output = self.spec.late_output
        ctx.side_output(
            cast(str, tag),
            value if late_output is None else late_output(value, timestamp, watermark),
        )

    def emit(self, ctx: Context, window: object, stored: object) -> Awaitable[None] | None:
        """Emit a firing window's result (nothing when ``stored`` is None): the
        evictor's kept values (written back when it dropped any), then the process
        function's outputs, the aggregate's or reduced result, or the list of values.
        Returns None, or an awaitable when an ``async def`` process function must finish."""
        if stored is None:
            return None
        evictor = self.evictor
        contents = self.contents
        if evictor is not None:  # the window keeps (value, timestamp) pairs
            pairs = list(cast(Iterable[tuple[object, float]], stored))
            kept = evictor.evict_before(pairs, window)
            elements = contents.elements(kept)
            remaining = evictor.evict_after(kept, window)
            if remaining != pairs:
                # evictors keep every element, never panes; not awaited (see Contents.add)
                cast(Contents, contents).write(window, remaining)
        else:
            elements = contents.elements(stored)
        process = self.process_fn
        if process is not None:
            results = process.process(ctx.current_key, ProcessWindowContext(self, ctx, window), elements)
            if results is not None and hasattr(results, "__await__"):
                return _output_all(ctx, cast(Awaitable[Iterable[object] | None], results))
            for result in cast(Iterable[object], results or ()):
                ctx.output(result)
        elif self.spec.folds:
            for result in elements:
                ctx.output(result)
        else:
            ctx.output(elements)
        return None


async def _output_all(ctx: Context, results: Awaitable[Iterable[object] | None]) -> None:
    for result in await results or ():
        ctx.output(result)


def window(
    assigner: WindowAssigner,
    *,
    aggregate: AggregateFunction | None = None,
    reduce: Callable[[Any, Any], Any] | None = None,
    process: ProcessWindowFunction | None = None,
    trigger: Trigger | None = None,
    evictor: Evictor | None = None,
    allowed_lateness: float = 0,
    late_data_tag: object = None,
    late_output: Callable[[Any, float, float], Any] | None = None,
) -> WindowOperatorFunction:
    """A ``KeyedProcessFunction`` running windows over its records (Flink's
    ``keyBy(..).window(assigner)[.trigger/.evictor/.allowedLateness/.sideOutputLateData]
    .aggregate/.reduce/.process``).

    Args:
        assigner: a ``WindowAssigner`` (``TumblingEventTimeWindows.of(size)``, ...).
        aggregate: an ``aec.AggregateFunction`` folded incrementally per window.
        reduce: ``fn(a, b) -> a`` folded incrementally per window.
        process: a ``ProcessWindowFunction``; its ``process(key, context, elements)``
            output is emitted at each firing (else the aggregate's ``get_result``,
            the reduced value, or the list of values).
        trigger: a ``Trigger`` (default: the assigner's).
        evictor: a ``CountEvictor``/``TimeEvictor`` (the window keeps every value).
        allowed_lateness: seconds of event time a window is kept after its end;
            records arriving then fire it again (late firing).
        late_data_tag: side-output tag for late records (else they are dropped and
            counted in the metric ``late_records_dropped``).
        late_output: aec extension: ``fn(value, timestamp, watermark)`` giving the
            side output's value for a late record (default: the value).

    Raises:
        TypeError: an argument of the wrong kind (named).
        ValueError: ``allowed_lateness < 0`` or NaN, both ``aggregate`` and
            ``reduce``, or a merging assigner with a trigger that cannot merge.
    """
    return WindowOperatorFunction(
        WindowSpec.of(
            assigner, aggregate, reduce, process, trigger, evictor, allowed_lateness,
            late_data_tag, late_output,
        )
    )  # fmt: skip
