"""The user side of batched async I/O: ``AsyncBatchFunction``.

After FLINK-38825's ``AsyncBatchFunction`` (a batch of inputs per call, for services
that cost far more per request than per item: model inference, feature stores, bulk
lookups). ``aec.async_io.batch_wait`` and ``AsyncBatchWaitOperator`` call it; each
input of a batch keeps its own timeout, retries and ``timeout()`` fallback, exactly as
an ``AsyncFunction``'s input does.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from aec.async_io.function import AsyncFunctionBase
from aec.state.typevars import IN, OUT

__all__ = ["AsyncBatchFunction", "check_batch_function"]


class AsyncBatchFunction(AsyncFunctionBase[IN, OUT]):
    """A function that looks up or computes a batch of inputs in one call.

    Override ``async def async_invoke_batch(self, values: list) -> list``: it runs on
    the operator's event-loop thread with up to ``max_batch_size`` input values, in
    arrival order, and returns one iterable of outputs per input, in the same order
    (``[[]]`` for an input without output). A result of another length fails the job
    at once, without retries, naming the function and both lengths. An exception
    fails that call: each of its inputs is retried (or fails) on its own, under the
    retry strategy, possibly in a later batch with other inputs.

    ``open()``, ``close()`` and ``timeout(value, result_future)`` (per input; the
    default fails the job with ``TimeoutError``) are those of ``AsyncFunction``, on
    the mailbox thread.
    """

    async def async_invoke_batch(self, values: list[IN]) -> list[Iterable[OUT]]:
        """Call the service for ``values``; see the class docstring."""
        raise NotImplementedError(f"{type(self).__name__} must override async_invoke_batch")


def check_batch_function(function: object) -> bool:
    """Check that ``function`` has an ``async def async_invoke_batch(self, values)``;
    returns True (batch functions are always asyncio style).

    Raises:
        TypeError: ``function`` is not an ``AsyncBatchFunction``, does not override
            ``async_invoke_batch``, or declares it without ``async`` or with other
            arguments.
    """
    if not isinstance(function, AsyncBatchFunction):
        raise TypeError(
            "a batch wait needs an aec.async_io.AsyncBatchFunction (async def "
            f"async_invoke_batch(self, values) -> list), got {type(function).__name__}"
        )
    name = type(function).__name__
    if type(function).async_invoke_batch is AsyncBatchFunction.async_invoke_batch:
        raise TypeError(f"{name} must override async_invoke_batch(self, values)")
    invoke = function.async_invoke_batch
    if not inspect.iscoroutinefunction(invoke):
        raise TypeError(
            f"{name}.async_invoke_batch must be declared `async def "
            "async_invoke_batch(self, values) -> list`"
        )
    try:
        inspect.signature(invoke).bind([])
    except TypeError:
        raise TypeError(
            f"{name}.async_invoke_batch{inspect.signature(invoke)} does not take one list "
            "of values: expected async def async_invoke_batch(self, values)"
        ) from None
    return True
