"""``Batcher``: batched external calls inside keyed functions (``Context.call_batched``).

Beyond Flink: FLINK-38825 batches the inputs of one async I/O operator; a
``Batcher`` batches the calls that keyed, stateful records make in the middle of
their processing, across keys, while same-key order, the in-flight limit and
exactly-once state hold (each call counts toward its record like ``call_async``).
The batches themselves are assembled by ``aec.runtime.batch_queue`` on the
operator's event-loop thread, one queue per batcher and operator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic

from aec.errors import describe, qualified_name
from aec.runtime.batch_queue import check_max_batch_size, check_max_wait
from aec.state.typevars import IN, OUT

__all__ = ["Batcher"]


class Batcher(Generic[IN, OUT]):
    """Calls ``fn`` with a list of arguments ``IN`` collected from ``ctx.call_batched``
    calls; one result ``OUT`` each.

    Args:
        fn: ``async def fn(args: list) -> list`` (or a callable returning an
            awaitable): one result per argument, in order. It runs on the operator's
            event-loop thread; it must be picklable to travel to Spark executors.
        max_batch_size: arguments per call, at most (int >= 1).
        max_wait: seconds a partial batch waits for more arguments after its first
            (>= 0; None or ``math.inf``: no time limit, the batch leaves when full or
            when nothing else can run). Progress never waits for it: a batch also
            leaves whenever the operator has nothing else to run.

    Raises:
        TypeError: ``fn`` is not callable; a non-int size or non-number wait.
        ValueError: ``max_batch_size`` < 1, ``max_wait`` < 0 or NaN.

    Make it once (in the function's ``__init__`` or ``open()``) and use it for every
    record: batches are per batcher and operator. Compared by identity.
    """

    __slots__ = ("fn", "max_batch_size", "max_wait")

    def __init__(
        self,
        fn: Callable[[list[IN]], Awaitable[list[OUT]]],
        *,
        max_batch_size: int,
        max_wait: float | None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"Batcher takes an async function of a list, got {describe(fn, 80)}")
        self.fn = fn
        self.max_batch_size = check_max_batch_size(max_batch_size)
        self.max_wait = check_max_wait(max_wait)

    def __repr__(self) -> str:
        return (
            f"Batcher({qualified_name(self.fn)}, max_batch_size={self.max_batch_size}, "
            f"max_wait={self.max_wait})"
        )
