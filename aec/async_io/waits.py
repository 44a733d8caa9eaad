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

Each is a lazy iterator front-end over an ``aec.async_io.operator.AsyncWaitOperator``:
it pulls from ``source`` only while the operator has room, and yields results as
they are emitted. Decisions where the contract is silent: docs/async_io.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator

from aec.async_io.batch_function import AsyncBatchFunction
from aec.async_io.batch_operator import AsyncBatchWaitOperator
from aec.async_io.function import AsyncFunction, ResultFuture
from aec.async_io.operator import AsyncWaitOperator, check_arguments
from aec.elements import Watermark
from aec.retry import NoRetry, RetryStrategy
from aec.state.typevars import IN, OUT

__all__ = [
    "AsyncFunction",
    "ResultFuture",
    "batch_wait",
    "key_ordered_wait",
    "ordered_wait",
    "unordered_wait",
]

_NO_RETRY = NoRetry()


def ordered_wait(
    source: Iterable[IN | Watermark],
    function: AsyncFunction[IN, OUT],
    timeout: float | None,
    capacity: int,
    retry: RetryStrategy = _NO_RETRY,
) -> Iterator[OUT | Watermark]:
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
    check_arguments(function, timeout, capacity, retry)
    return _iterate(source, AsyncWaitOperator(function, timeout, capacity, retry=retry))


def unordered_wait(
    source: Iterable[IN | Watermark],
    function: AsyncFunction[IN, OUT],
    timeout: float | None,
    capacity: int,
    retry: RetryStrategy = _NO_RETRY,
) -> Iterator[OUT | Watermark]:
    """Like ``ordered_wait``, but results leave as their inputs complete.

    Watermarks are barriers: the results of every input before a watermark leave
    before it, those of inputs after it only after it (Flink's
    ``UnorderedStreamElementQueue``). Arguments, return value and errors as in
    ``ordered_wait``.
    """
    check_arguments(function, timeout, capacity, retry)
    return _iterate(
        source, AsyncWaitOperator(function, timeout, capacity, mode="unordered", retry=retry)
    )


def key_ordered_wait(
    source: Iterable[IN | Watermark],
    function: AsyncFunction[IN, OUT],
    timeout: float | None,
    capacity: int,
    retry: RetryStrategy = _NO_RETRY,
    *,
    key_selector: Callable[[IN], Hashable],
) -> Iterator[OUT | Watermark]:
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
    check_arguments(function, timeout, capacity, retry)
    if not callable(key_selector):
        raise TypeError(f"key_selector must be a callable value -> key, got {key_selector!r}")
    operator = AsyncWaitOperator(
        function, timeout, capacity, mode="key_ordered", retry=retry, key_selector=key_selector
    )
    return _iterate(source, operator)


def batch_wait(
    source: Iterable[IN | Watermark],
    function: AsyncBatchFunction[IN, OUT],
    *,
    max_batch_size: int,
    batch_timeout: float | None,
    timeout: float | None,
    capacity: int,
    mode: str = "ordered",
    retry: RetryStrategy = _NO_RETRY,
) -> Iterator[OUT | Watermark]:
    """Call ``function.async_invoke_batch`` with batches of the values of ``source``.

    FLINK-38825's batched async I/O over ``AsyncBatchWaitOperator``: like
    ``ordered_wait`` (``mode="ordered"``) or ``unordered_wait`` (``"unordered"``),
    but inputs travel up to ``max_batch_size`` per call. A batch is sent when full,
    when ``batch_timeout`` seconds passed since its first input, at once when a
    watermark arrives behind it, and when nothing else can run (``capacity``
    reached, end of input). Watermarks stay boundaries.

    Args:
        source: iterable of input values and ``aec.Watermark``s, pulled lazily while
            fewer than ``capacity`` elements are admitted and not yet emitted.
        function: an ``AsyncBatchFunction`` (``async def async_invoke_batch(self,
            values) -> list``: one iterable of outputs per input, in order).
        max_batch_size: inputs per call, at most (int >= 1).
        batch_timeout: seconds a partial batch waits (>= 0), or None for no limit.
        timeout: seconds per input from its admission, spanning every attempt
            (finite and > 0), or None.
        capacity: max elements admitted and not yet emitted (int >= 1).
        mode: ``"ordered"`` or ``"unordered"``.
        retry: an ``aec.retry`` strategy, per input: a retried input travels in a
            later batch, possibly with others.

    Returns:
        A lazy iterator of outputs and watermarks, as ``ordered_wait``'s.

    Raises:
        TypeError / ValueError: bad arguments (at once), or while iterating a
            regressing or non-numeric watermark.
        JobFailure: while iterating, when an input's final outcome is an exception
            (as in ``ordered_wait``), and at once for a batch result whose length
            differs from the batch (its message names the function as
            ``module.qualname`` and both lengths).
    """
    operator = AsyncBatchWaitOperator(
        function,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout,
        timeout=timeout,
        capacity=capacity,
        mode=mode,
        retry=retry,
    )
    return _iterate(source, operator)


def _iterate(
    source: Iterable[IN | Watermark], operator: AsyncWaitOperator[IN, OUT]
) -> Iterator[OUT | Watermark]:
    """``_drive`` over ``iter(source)``, taken now (not at the first ``next()``): a
    ``TypeError`` names a ``source`` that is no iterable."""
    try:
        elements = iter(source)
    except TypeError:
        raise TypeError(
            f"source must be an iterable of inputs and watermarks, got {source!r}"
        ) from None
    return _drive(elements, operator)


def _drive(
    elements: Iterator[IN | Watermark], operator: AsyncWaitOperator[IN, OUT]
) -> Iterator[OUT | Watermark]:
    """Drive ``operator`` over ``source``: completions first, then emission, then new
    input only while there is room (so ``source`` is never pulled ahead of capacity)."""
    try:
        operator.open()
        exhausted = False
        while True:
            operator.advance()
            outputs = operator.drain_outputs()
            if outputs:
                yield from outputs
                continue  # mails may have arrived while the consumer ran
            if not exhausted and operator.has_room():
                if operator.has_completions():
                    continue  # completions before new input
                # advance just ran: no mail waits, there is room
                exhausted = operator.admit_from(elements)
                continue
            if exhausted and operator.idle():
                break
            operator.wait()
        operator.finish()
    except BaseException as exc:  # GeneratorExit too: an abandoned iterator cleans up
        operator.abandon(exc)
        raise
    yield from operator.drain_outputs()
