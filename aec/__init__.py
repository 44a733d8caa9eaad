"""aec: a keyed async-state execution engine (Flink's FLIP-424/425/426 model) in Python.

Data flow: source -> mailbox -> AEC -> executor -> backend -> completion ->
callback -> output. See README.md and docs/ARCHITECTURE.md.
"""

__version__ = "0.2.0.dev0"  # the one place: pyproject.toml reads it, ``aec --version`` prints it

from aec.config import AecConfig
from aec.elements import Record, Watermark
from aec.errors import JobFailure
from aec.functions import (
    Context,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    RuntimeContext,
    TimerService,
)
from aec.runtime import (
    KeyedCoProcessOperator,
    KeyedProcessOperator,
    RunResult,
    run_keyed,
    run_keyed_co,
)
from aec.runtime import controller as _kernel_module
from aec.state import (
    AggregateFunction,
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    StateFuture,
    StateIterator,
    ValueState,
    ValueStateDescriptor,
    combine_all,
    completed_future,
)

# True when the kernel imported is the mypyc-compiled build (``AEC_COMPILE=1``, setup.py),
# False for pure Python (docs/performance.md, "The compiled build").
compiled: bool = not _kernel_module.__file__.endswith(".py")

__all__ = [
    "AecConfig", "AggregateFunction", "AggregatingState", "AggregatingStateDescriptor",
    "Context", "JobFailure", "KeyedCoProcessFunction", "KeyedCoProcessOperator",
    "KeyedProcessFunction", "KeyedProcessOperator", "ListState",
    "ListStateDescriptor", "MapState", "MapStateDescriptor", "Record", "ReducingState",
    "ReducingStateDescriptor", "RunResult", "RuntimeContext", "StateFuture", "StateIterator",
    "TimerService", "ValueState", "ValueStateDescriptor", "Watermark", "combine_all",
    "__version__", "compiled", "completed_future", "run_keyed", "run_keyed_co",
]  # fmt: skip
