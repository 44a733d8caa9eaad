"""Async I/O: call an external service per input with bounded concurrency.

Flink's ``AsyncDataStream.orderedWait`` / ``unorderedWait`` (FLIP-12), with
FLIP-232 retries and FLIP-519's key-ordered mode, as three generator functions::

    from aec.async_io.waits import AsyncFunction, ordered_wait
    from aec.retry import FixedDelay

    class Lookup(AsyncFunction):
        async def async_invoke(self, value):
            return [await client.get(value)]

    for out in ordered_wait(values, Lookup(), timeout=1.0, capacity=100,
                            retry=FixedDelay(3, 0.1)):
        ...

Modules: ``aec.async_io.function`` (``AsyncFunction``, ``ResultFuture``),
``aec.async_io.queue`` (emission order), ``aec.async_io.driver`` (the mailbox loop,
timers, retries), ``aec.runtime.event_loop`` (the asyncio thread). Decisions where the
contract is silent: docs/async_io.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aec.async_io.driver import AsyncWaitDriver, is_asyncio_style
from aec.async_io.function import AsyncFunction, ResultFuture
from aec.async_io.queue import OrderedQueue, UnorderedQueue
from aec.retry import NoRetry, RetryStrategy

__all__ = [
    "AsyncFunction",
    "ResultFuture",
    "key_ordered_wait",
    "ordered_wait",
    "unordered_wait",
]

_NO_RETRY = NoRetry()


def ordered_wait(
    source: Iterable[Any],
    function: AsyncFunction,
    timeout: float | None,
    capacity: int,
    retry: RetryStrategy = _NO_RETRY,
) -> Iterator[Any]:
    """Call ``function`` for every value of ``source``; emit results in input order.

    Flink's ``AsyncDataStream.orderedWait`` (``OrderedStreamElementQueue``), with
    ``AsyncDataStream.orderedWaitWithRetry``'s retries.

    Args:
        source: iterable of input values and ``aec.Watermark``s (watermarks must not
            go backwards). Pulled lazily, only while fewer than ``capacity`` elements
            are admitted and not yet emitted.
        function: an ``AsyncFunction`` (Flink style or asyncio style).
        timeout: seconds from an input's first call to its timeout, spanning all
            attempts (finite and > 0), or None for no timeout.
        capacity: max elements (records and watermarks) admitted and not yet
            emitted (int >= 1); bounds the calls in flight.
        retry: a ``aec.retry`` strategy (default ``NoRetry()``).

    Returns:
        A lazy iterator. Each input's results (the iterable it completed with) are
        yielded element by element, inputs in arrival order, watermarks in place.
        End of input adds no watermark. ``function.open()`` runs at the first
        ``next()``, ``function.close()`` when the iterator ends, fails or is closed.

    Raises:
        TypeError / ValueError: bad arguments (at once), or while iterating a
            regressing or non-numeric watermark.
        JobFailure: while iterating, when an input's final outcome is an exception
            (raised or completed, retries exhausted, or the timeout, whose default
            ``timeout()`` gives a ``TimeoutError``); ``__cause__`` is that exception,
            ``record`` the input value. Raised after the event-loop thread stopped
            and ``close()`` ran.
    """
    timeout = _check_common(function, timeout, capacity, retry)
    return AsyncWaitDriver(source, function, timeout, capacity, retry, OrderedQueue()).run()


def unordered_wait(
    source: Iterable[Any],
    function: AsyncFunction,
    timeout: float | None,
    capacity: int,
    retry: RetryStrategy = _NO_RETRY,
) -> Iterator[Any]:
    """Like ``ordered_wait``, but results leave as their inputs complete.

    Watermarks are barriers: the results of every input before a watermark leave
    before it, those of inputs after it only after it (Flink's
    ``UnorderedStreamElementQueue``). Arguments, return value and errors as in
    ``ordered_wait``.
    """
    timeout = _check_common(function, timeout, capacity, retry)
    return AsyncWaitDriver(source, function, timeout, capacity, retry, UnorderedQueue()).run()


def key_ordered_wait(
    source: Iterable[Any],
    function: AsyncFunction,
    timeout: float | None,
    capacity: int,
    retry: RetryStrategy = _NO_RETRY,
    *,
    key_selector: Callable[[Any], Any],
) -> Iterator[Any]:
    """Like ``unordered_wait``, but an input's first call starts only after the
    previous input with the same key completed (all its attempts, or its timeout);
    different keys run concurrently (FLIP-519).

    Output order: completion order, with watermarks as barriers as in
    ``unordered_wait``; so per key, results leave in input order. An input waiting
    for its key counts towards ``capacity``; its timeout starts with its first call.

    Args:
        key_selector: ``value -> key``; the key must be hashable and not None
            (a bad key raises TypeError/ValueError while iterating; the selector
            raising fails the job with ``JobFailure``).

    The other arguments are those of ``ordered_wait``.
    """
    timeout = _check_common(function, timeout, capacity, retry)
    if not callable(key_selector):
        raise TypeError(f"key_selector must be a callable value -> key, got {key_selector!r}")
    return AsyncWaitDriver(
        source, function, timeout, capacity, retry, UnorderedQueue(), key_selector
    ).run()


def _check_common(function: Any, timeout: Any, capacity: Any, retry: Any) -> float | None:
    """Validate the shared arguments; returns the timeout (None: no timeout)."""
    is_asyncio_style(function)  # raises TypeError for a function it cannot call
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
        if math.isnan(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds (or None for none), got {timeout!r}")
        if math.isinf(timeout):
            timeout = None
        else:
            timeout = float(timeout)
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int >= 1, got {capacity!r}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if not isinstance(retry, RetryStrategy):
        raise TypeError(
            f"retry must be an aec.retry strategy (NoRetry, FixedDelay, ExponentialBackoff), "
            f"got {retry!r}"
        )
    return timeout
