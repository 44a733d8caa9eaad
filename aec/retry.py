"""Retry strategies for async I/O (FLIP-232's ``AsyncRetryStrategy``).

A strategy answers three questions about one input's calls, and keeps no state
between them (so one strategy object serves every input, thread and run):

- ``max_attempts``: how many calls an input may get, the first one included
  (Flink's ``maxAttempts`` counts retries only; here 3 means 1 call + 2 retries).
- ``backoff(n)``: the delay in seconds before retry ``n`` (``n = 1`` is the first
  retry, the second call), defined for every ``n >= 1``, no jitter.
- ``retry_on_exception(exc)`` / ``retry_on_result(results)``: whether an attempt
  that failed with ``exc`` / completed with the list ``results`` is retried
  (Flink's ``RetryPredicates``). Defaults: every ``Exception``; never.

The driver (``aec.async_io.waits``) also stops retrying when attempts are used up or the
next call would not start before the input's timeout; see docs/async_io.md.

Follows Flink's ``AsyncRetryStrategies.FixedDelayRetryStrategy``,
``ExponentialBackoffDelayRetryStrategy``, ``NO_RETRY_STRATEGY`` and
``RetryPredicates.EMPTY_RESULT_PREDICATE`` / ``ExceptionTypePredicate``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any, Final, overload

__all__ = [
    "ExponentialBackoff",
    "FixedDelay",
    "NoRetry",
    "RetryStrategy",
    "check_strategy",
    "check_timeout",
    "empty_result",
    "exception_type",
]

ExceptionPredicate = Callable[[BaseException], bool]
# gets an attempt's results: the list an async I/O input completed with, or the result
# of a ``call_async`` / ``call_batched`` call (whatever the called function returns)
ResultPredicate = Callable[[Any], bool]

_NO_ARGUMENT: Final[Any] = object()  # stands for "called bare"; compared by identity


# -- predicates --------------------------------------------------------------------------
@overload
def empty_result() -> Callable[[Sized], bool]: ...
@overload
def empty_result(results: Sized) -> bool: ...


def empty_result(results: Sized = _NO_ARGUMENT) -> Callable[[Sized], bool] | bool:
    """Result predicate: True when an attempt completed with no results.

    Use it as ``retry_on_result=empty_result`` (Flink's ``EMPTY_RESULT_PREDICATE``).
    Called with no argument it returns itself, so ``retry_on_result=empty_result()``
    works too.

    Args:
        results: the list of results one attempt completed with.

    Returns:
        ``len(results) == 0`` (a bool), or the predicate itself when called bare.
    """
    if results is _NO_ARGUMENT:
        return empty_result
    return len(results) == 0


@dataclass(frozen=True, slots=True)
class ExceptionTypePredicate:
    """Exception predicate: True for instances of any of ``types`` (subclasses too).

    Built by ``exception_type(*types)``; picklable, so strategies travel to Spark
    executors.
    """

    types: tuple[type[BaseException], ...]

    def __call__(self, exc: BaseException) -> bool:
        return isinstance(exc, self.types)


def exception_type(*types: type[BaseException]) -> ExceptionTypePredicate:
    """Build an exception predicate that retries only the given exception types.

    Example: ``FixedDelay(3, 0.1, retry_on_exception=exception_type(ConnectionError))``.

    Raises:
        ValueError: no type given.
        TypeError: an argument is not an exception class.
    """
    if not types:
        raise ValueError("exception_type() needs at least one exception class")
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"exception_type() takes exception classes, got {t!r}")
    return ExceptionTypePredicate(tuple(types))


def _any_exception(exc: BaseException) -> bool:
    # BaseExceptions that are not Exceptions (cancellation, KeyboardInterrupt) mean "stop"
    return isinstance(exc, Exception)


def _never(results: object) -> bool:
    return False


# -- validation --------------------------------------------------------------------------
def _check_attempts(max_attempts: object) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(
            f"max_attempts must be an int (calls including the first), got {max_attempts!r}"
        )
    if max_attempts < 1:
        raise ValueError(
            f"max_attempts must be >= 1 (it counts every call, the first included), "
            f"got {max_attempts}"
        )


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _check_predicate(name: str, predicate: object) -> None:
    if predicate is not None and not callable(predicate):
        raise TypeError(f"{name} must be a callable or None, got {predicate!r}")


def _check_retry_number(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"backoff(n) takes the retry number as an int, got {n!r}")
    if n < 1:
        raise ValueError(f"backoff(n) is defined for n >= 1 (n = 1 is the first retry), got {n}")


def check_timeout(timeout: object) -> float | None:
    """Validate a call timeout in seconds: finite and > 0, or None / ``math.inf`` for
    none (returned as None). Flink treats ``<= 0`` as "no timeout"; aec raises.

    Raises TypeError for a non-number, ValueError for ``<= 0`` or NaN.
    """
    if timeout is None:
        return None
    if type(timeout) is float and 0 < timeout < math.inf:  # the common case, fast
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    try:
        seconds = float(timeout)  # numpy scalars and Fractions as the floats they are
    except OverflowError:  # an int beyond the floats: longer than any run
        seconds = math.inf
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"timeout must be > 0 seconds (or None for none), got {timeout!r}")
    return None if math.isinf(seconds) else seconds


def check_strategy(retry: object) -> RetryStrategy:
    """Return ``retry`` if it is a ``RetryStrategy``; TypeError naming it otherwise."""
    if not isinstance(retry, RetryStrategy):
        raise TypeError(
            f"retry must be an aec.retry strategy (NoRetry, FixedDelay, ExponentialBackoff), "
            f"got {retry!r}"
        )
    return retry


# -- strategies --------------------------------------------------------------------------
class RetryStrategy:
    """Base of the strategies: ``max_attempts``, ``backoff(n)`` and the two predicates.

    Subclasses set ``max_attempts``, ``retry_on_exception`` and ``retry_on_result``
    and implement ``backoff``. Every method is pure (safe to share across threads).
    """

    __slots__ = ()
    max_attempts: int
    retry_on_exception: ExceptionPredicate | None
    retry_on_result: ResultPredicate | None

    def backoff(self, n: int) -> float:
        """Seconds to wait before retry ``n`` (``n >= 1``; 1 is the first retry)."""
        raise NotImplementedError

    def should_retry_exception(self, exc: BaseException) -> bool:
        """Whether an attempt that failed with ``exc`` may be retried (the predicate's
        answer, as a bool; the attempt budget and the timeout are checked elsewhere)."""
        predicate = self.retry_on_exception or _any_exception
        return bool(predicate(exc))

    def should_retry_result(self, results: Any) -> bool:  # Any: subclasses narrow it
        """Whether an attempt that completed with ``results`` (an async I/O input's list,
        or an external call's result) may be retried."""
        predicate = self.retry_on_result or _never
        return bool(predicate(results))


@dataclass(frozen=True, slots=True)
class NoRetry(RetryStrategy):
    """Never retry: one call per input (Flink's ``NO_RETRY_STRATEGY``)."""

    max_attempts: int = field(default=1, init=False)
    retry_on_exception: ExceptionPredicate | None = field(default=None, init=False)
    retry_on_result: ResultPredicate | None = field(default=None, init=False)

    def backoff(self, n: int) -> float:
        """0.0 for every ``n >= 1`` (never used: there is no retry)."""
        _check_retry_number(n)
        return 0.0

    def should_retry_exception(self, exc: BaseException) -> bool:
        return False

    def should_retry_result(self, results: Any) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class FixedDelay(RetryStrategy):
    """Retry after the same delay each time (Flink's ``FixedDelayRetryStrategy``).

    Args:
        max_attempts: calls per input including the first (int >= 1).
        delay: seconds before each retry (finite, >= 0).
        retry_on_exception: ``(exc) -> bool``; None retries every ``Exception``.
        retry_on_result: ``(results: list) -> bool``; None never retries on a result.

    Raises:
        TypeError / ValueError: a bad argument (the message names it).
    """

    max_attempts: int
    delay: float
    retry_on_exception: ExceptionPredicate | None = field(default=None, kw_only=True)
    retry_on_result: ResultPredicate | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _check_attempts(self.max_attempts)
        object.__setattr__(self, "delay", _check_seconds("delay", self.delay))
        _check_predicate("retry_on_exception", self.retry_on_exception)
        _check_predicate("retry_on_result", self.retry_on_result)

    def backoff(self, n: int) -> float:
        """``delay`` seconds, for every retry ``n >= 1``."""
        _check_retry_number(n)
        return self.delay


@dataclass(frozen=True, slots=True)
class ExponentialBackoff(RetryStrategy):
    """Retry after delays growing by ``multiplier`` up to ``max_delay`` (Flink's
    ``ExponentialBackoffDelayRetryStrategy``, without its state).

    ``backoff(n) == min(initial_delay * multiplier ** (n - 1), max_delay)`` seconds.

    Args:
        max_attempts: calls per input including the first (int >= 1).
        initial_delay: seconds before the first retry (finite, >= 0).
        max_delay: the cap in seconds (finite, >= initial_delay).
        multiplier: growth per retry (finite, >= 1).
        retry_on_exception: ``(exc) -> bool``; None retries every ``Exception``.
        retry_on_result: ``(results: list) -> bool``; None never retries on a result.

    Raises:
        TypeError / ValueError: a bad argument (the message names it).
    """

    max_attempts: int
    initial_delay: float
    max_delay: float
    multiplier: float = 2.0
    retry_on_exception: ExceptionPredicate | None = field(default=None, kw_only=True)
    retry_on_result: ResultPredicate | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _check_attempts(self.max_attempts)
        initial = _check_seconds("initial_delay", self.initial_delay)
        cap = _check_seconds("max_delay", self.max_delay)
        if cap < initial:
            raise ValueError(f"max_delay ({cap!r} s) must be >= initial_delay ({initial!r} s)")
        multiplier = self.multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise TypeError(f"multiplier must be a number, got {multiplier!r}")
        if math.isnan(multiplier) or math.isinf(multiplier) or multiplier < 1:
            raise ValueError(f"multiplier must be a finite number >= 1, got {multiplier!r}")
        _check_predicate("retry_on_exception", self.retry_on_exception)
        _check_predicate("retry_on_result", self.retry_on_result)
        object.__setattr__(self, "initial_delay", initial)
        object.__setattr__(self, "max_delay", cap)
        # a float multiplier keeps ``multiplier ** n`` cheap: it overflows instead of
        # building a huge int for large n
        object.__setattr__(self, "multiplier", float(multiplier))

    def backoff(self, n: int) -> float:
        """``min(initial_delay * multiplier ** (n - 1), max_delay)`` seconds, n >= 1."""
        _check_retry_number(n)
        if self.initial_delay == 0.0 or self.multiplier == 1.0:
            return self.initial_delay
        try:
            delay = self.initial_delay * self.multiplier ** (n - 1)
        except OverflowError:  # past the float range the cap has long been reached
            return self.max_delay
        return min(delay, self.max_delay)
