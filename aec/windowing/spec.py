"""``WindowSpec``: what ``window(...)`` was given, checked (``WindowSpec.of``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

from aec.state.descriptors import AggregateFunction
from aec.state.handles import MapState
from aec.windowing.assigners import SlidingEventTimeWindows, WindowAssigner
from aec.windowing.contents import (
    AggregateContents,
    Contents,
    EvictingContents,
    ListContents,
    ReduceContents,
)
from aec.windowing.evictors import Evictor
from aec.windowing.grid import pane_size
from aec.windowing.process import ProcessWindowFunction
from aec.windowing.triggers import Trigger


@dataclass(frozen=True)
class WindowSpec:
    """Everything ``window`` was given, checked (picklable with the function)."""

    assigner: WindowAssigner
    aggregate: AggregateFunction | None
    reduce: Callable[[Any, Any], Any] | None
    process: ProcessWindowFunction | None
    trigger: Trigger
    evictor: Evictor | None
    allowed_lateness: float
    late_data_tag: object
    late_output: Callable[[Any, float, float], Any] | None

    @property
    def folds(self) -> bool:
        return self.aggregate is not None or self.reduce is not None

    @property
    def pane(self) -> Fraction | None:
        """The pane size for sliding windows over an aggregate or reduce (else None;
        also for a slide longer than the size: a pane in a gap between windows would
        be folded into the next window; and for an aggregate without its own ``merge``,
        which combining panes needs and Flink calls only for merging windows)."""
        a = self.assigner
        if not self.folds or self.evictor is not None or a.merging:
            return None
        if self.aggregate is not None and type(self.aggregate).merge is AggregateFunction.merge:
            return None
        if not isinstance(a, SlidingEventTimeWindows) or a.size <= a.slide:
            return None
        return pane_size(a.size, a.slide)

    def make_contents(self, store: MapState | None) -> Contents:
        if self.aggregate is not None:
            folder: Contents | None = AggregateContents(store, self.aggregate)
        elif self.reduce is not None:
            folder = ReduceContents(store, self.reduce)
        else:
            folder = None
        if self.evictor is not None:
            return EvictingContents(store, folder)
        return folder or ListContents(store)

    @classmethod
    def of(
        cls, assigner: object, aggregate: object, reduce: object, process: object,
        trigger: object, evictor: object, allowed_lateness: object, late_data_tag: object,
        late_output: object,
    ) -> WindowSpec:  # fmt: skip
        """``window(...)``'s arguments, checked (the errors: ``window``'s)."""
        if not isinstance(assigner, WindowAssigner):
            raise TypeError(f"window: assigner must be a WindowAssigner, got {assigner!r}")
        if aggregate is not None and reduce is not None:
            raise ValueError("window: give aggregate or reduce, not both")
        if aggregate is not None:
            for method in ("create_accumulator", "add", "get_result", "merge"):
                if not callable(getattr(aggregate, method, None)):
                    raise TypeError(f"window: aggregate lacks {method}(): {aggregate!r}")
        if reduce is not None and not callable(reduce):
            raise TypeError(f"window: reduce must be callable, got {reduce!r}")
        if process is not None and not callable(getattr(process, "process", None)):
            raise TypeError(f"window: process must be a ProcessWindowFunction, got {process!r}")
        if trigger is None:
            trigger = assigner.default_trigger()
        elif not isinstance(trigger, Trigger):
            raise TypeError(f"window: trigger must be a Trigger, got {trigger!r}")
        if evictor is not None and not isinstance(evictor, Evictor):
            raise TypeError(f"window: evictor must be an Evictor, got {evictor!r}")
        if isinstance(allowed_lateness, bool) or not isinstance(allowed_lateness, (int, float)):
            raise TypeError(f"window: allowed_lateness must be seconds, got {allowed_lateness!r}")
        if math.isnan(allowed_lateness) or allowed_lateness < 0:
            raise ValueError(f"window: allowed_lateness must be >= 0 seconds, got {allowed_lateness!r}")
        if assigner.merging and not trigger.can_merge():
            raise ValueError(
                f"window: the merging assigner {assigner!r} needs a trigger that can merge; "
                f"{trigger!r} cannot"
            )
        if late_output is not None and not callable(late_output):
            raise TypeError(f"window: late_output must be callable, got {late_output!r}")
        return cls(
            assigner, cast(AggregateFunction | None, aggregate),
            cast("Callable[[Any, Any], Any] | None", reduce),
            cast(ProcessWindowFunction | None, process), trigger, evictor, allowed_lateness,
            late_data_tag, cast("Callable[[Any, float, float], Any] | None", late_output),
        )  # checked above  # fmt: skip
