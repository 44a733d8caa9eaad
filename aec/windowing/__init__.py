"""Windows on async state: Flink's WindowOperator semantics as a ``KeyedProcessFunction``.

    from aec.windowing import window, TumblingEventTimeWindows
    fn = window(TumblingEventTimeWindows.of(3600), aggregate=Count())
    aec.run_keyed(records_and_watermarks, fn)

Assigners (tumbling, sliding, session, global; event and processing time),
triggers, evictors, allowed lateness with late firings and a late side output,
and session windows merging on async state. See ``docs/windows.md``.
"""

from aec.windowing.assigners import (
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from aec.windowing.context import TriggerContext
from aec.windowing.evictors import CountEvictor, Evictor, TimeEvictor
from aec.windowing.operator import WindowOperatorFunction, window
from aec.windowing.process import ProcessWindowContext, ProcessWindowFunction
from aec.windowing.triggers import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
)
from aec.windowing.windows import GlobalWindow, TimeWindow

__all__ = [
    "ContinuousEventTimeTrigger", "CountEvictor", "CountTrigger", "EventTimeSessionWindows",
    "EventTimeTrigger", "Evictor", "GlobalWindow", "GlobalWindows", "NeverTrigger",
    "ProcessWindowContext", "ProcessWindowFunction", "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger", "PurgingTrigger", "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows", "TimeEvictor", "TimeWindow", "Trigger", "TriggerContext",
    "TriggerResult", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows",
    "WindowAssigner", "WindowOperatorFunction", "window",
]  # fmt: skip
