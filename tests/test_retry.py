"""aec.retry: strategies, backoff arithmetic, predicates and argument validation."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aec.retry import (
    ExponentialBackoff,
    FixedDelay,
    NoRetry,
    RetryStrategy,
    empty_result,
    exception_type,
)

seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


def expected_exponential(initial: float, cap: float, multiplier: float, n: int) -> float:
    """The contract's formula; float overflow means "past the cap" (unless 0 * anything)."""
    if initial == 0:
        return 0.0
    try:
        return min(initial * multiplier ** (n - 1), cap)
    except OverflowError:
        return cap


# -- backoff ---------------------------------------------------------------------------------
@given(max_attempts=st.integers(1, 50), delay=seconds, n=st.integers(1, 10**6))
def test_fixed_delay_backoff_is_the_delay_for_every_retry(max_attempts, delay, n):
    strategy = FixedDelay(max_attempts, delay)
    assert strategy.backoff(n) == delay
    assert strategy.max_attempts == max_attempts


@given(
    initial=seconds,
    extra=seconds,
    multiplier=st.floats(min_value=1, max_value=100, allow_nan=False),
    n=st.integers(1, 5000),
)
def test_exponential_backoff_follows_the_formula(initial, extra, multiplier, n):
    cap = initial + extra
    strategy = ExponentialBackoff(3, initial, cap, multiplier)
    got = strategy.backoff(n)
    assert got == expected_exponential(initial, cap, multiplier, n)
    assert 0 <= got <= cap
    # non-decreasing in n, and never above the cap
    assert strategy.backoff(n + 1) >= got


@given(ns=st.lists(st.integers(1, 200), min_size=1, max_size=20))
def test_backoff_is_stateless(ns):
    strategy = ExponentialBackoff(5, 0.1, 3.0, 1.5)
    first = [strategy.backoff(n) for n in ns]
    # asking again, in reverse order, gives the same delays: no hidden counter
    again = [strategy.backoff(n) for n in reversed(ns)][::-1]
    assert first == again


def test_exponential_backoff_examples():
    strategy = ExponentialBackoff(6, 0.1, 1.0)
    assert [strategy.backoff(n) for n in range(1, 7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )
    assert ExponentialBackoff(2, 0.5, 4.0, multiplier=3).backoff(3) == 4.0
    assert ExponentialBackoff(2, 0.0, 4.0).backoff(10) == 0.0
    # huge retry numbers are still defined (no OverflowError, no huge ints)
    assert ExponentialBackoff(2, 0.001, 7.0).backoff(10**9) == 7.0
    assert ExponentialBackoff(2, 2.0, 2.0, multiplier=1).backoff(10**9) == 2.0


@pytest.mark.parametrize(
    "strategy", [NoRetry(), FixedDelay(3, 0.1), ExponentialBackoff(3, 0.1, 1.0)]
)
def test_backoff_rejects_retry_numbers_below_one(strategy):
    with pytest.raises(ValueError, match="n >= 1"):
        strategy.backoff(0)
    with pytest.raises(TypeError, match="int"):
        strategy.backoff(1.0)


# -- attempts and predicates -----------------------------------------------------------------
def test_no_retry_is_one_attempt_and_never_retries():
    strategy = NoRetry()
    assert strategy.max_attempts == 1
    assert strategy.should_retry_exception(ConnectionError()) is False
    assert strategy.should_retry_result([]) is False
    assert strategy.backoff(1) == 0.0
    assert NoRetry() == NoRetry()


def test_default_predicates_retry_every_exception_and_no_result():
    for strategy in (FixedDelay(2, 0.0), ExponentialBackoff(2, 0.0, 1.0)):
        assert strategy.should_retry_exception(ValueError("x")) is True
        assert strategy.should_retry_exception(TimeoutError()) is True
        # cancellation and interrupts are not failures to retry
        assert strategy.should_retry_exception(KeyboardInterrupt()) is False
        assert strategy.should_retry_result([]) is False
        assert strategy.should_retry_result([1, 2]) is False


def test_custom_predicates_are_used():
    strategy = FixedDelay(
        3,
        0.01,
        retry_on_exception=exception_type(ConnectionError, TimeoutError),
        retry_on_result=lambda results: None in results,
    )
    assert strategy.should_retry_exception(ConnectionResetError()) is True  # a subclass
    assert strategy.should_retry_exception(TimeoutError()) is True
    assert strategy.should_retry_exception(ValueError()) is False
    assert strategy.should_retry_result([1, None]) is True
    assert strategy.should_retry_result([1]) is False


@given(results=st.lists(st.integers(), max_size=5))
def test_empty_result_predicate(results):
    assert empty_result(results) is (len(results) == 0)
    # usable bare or called: both give the predicate
    assert empty_result() is empty_result
    assert FixedDelay(2, 0, retry_on_result=empty_result).should_retry_result(results) == (
        not results
    )


def test_exception_type_validation():
    with pytest.raises(ValueError, match="at least one"):
        exception_type()
    with pytest.raises(TypeError, match="exception classes"):
        exception_type(ValueError, "OSError")
    with pytest.raises(TypeError, match="exception classes"):
        exception_type(int)


def test_max_attempts_counts_the_first_call():
    # 1 attempt = no retry: the contract differs from Flink's maxAttempts (retries only)
    assert FixedDelay(1, 0.5).max_attempts == 1
    assert ExponentialBackoff(4, 0.1, 1.0).max_attempts == 4


# -- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: FixedDelay(0, 0.1), ValueError, "max_attempts must be >= 1"),
        (lambda: FixedDelay(-3, 0.1), ValueError, "max_attempts"),
        (lambda: FixedDelay(2.0, 0.1), TypeError, "max_attempts must be an int"),
        (lambda: FixedDelay(True, 0.1), TypeError, "max_attempts must be an int"),
        (lambda: FixedDelay(2, -0.1), ValueError, "delay must be a finite number"),
        (lambda: FixedDelay(2, math.nan), ValueError, "delay"),
        (lambda: FixedDelay(2, math.inf), ValueError, "delay"),
        (lambda: FixedDelay(2, "1"), TypeError, "delay must be a number"),
        (lambda: FixedDelay(2, 0.1, retry_on_exception=3), TypeError, "retry_on_exception"),
        (lambda: FixedDelay(2, 0.1, retry_on_result="x"), TypeError, "retry_on_result"),
        (lambda: ExponentialBackoff(0, 0.1, 1.0), ValueError, "max_attempts"),
        (lambda: ExponentialBackoff(2, -1, 1.0), ValueError, "initial_delay"),
        (lambda: ExponentialBackoff(2, 0.1, -1), ValueError, "max_delay"),
        (lambda: ExponentialBackoff(2, 1.0, 0.5), ValueError, "max_delay .* >= initial_delay"),
        (lambda: ExponentialBackoff(2, 0.1, 1.0, 0.5), ValueError, "multiplier must be"),
        (lambda: ExponentialBackoff(2, 0.1, 1.0, math.inf), ValueError, "multiplier"),
        (lambda: ExponentialBackoff(2, 0.1, 1.0, "2"), TypeError, "multiplier must be a number"),
        (lambda: ExponentialBackoff(2, 0.1, 1.0, retry_on_result=1), TypeError, "retry_on_result"),
    ],
)
def test_bad_arguments_are_rejected_with_clear_messages(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_predicates_are_keyword_only():
    with pytest.raises(TypeError):
        FixedDelay(2, 0.1, empty_result)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ExponentialBackoff(2, 0.1, 1.0, 2.0, empty_result)  # type: ignore[misc]


def test_no_retry_takes_no_arguments():
    with pytest.raises(TypeError):
        NoRetry(3)  # type: ignore[call-arg]


# -- value semantics -------------------------------------------------------------------------
def test_strategies_are_frozen_and_picklable():
    strategy = ExponentialBackoff(
        4, 0.1, 2.0, retry_on_exception=exception_type(OSError), retry_on_result=empty_result
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategy.max_attempts = 9  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(strategy))
    assert copy == strategy
    assert copy.backoff(3) == strategy.backoff(3) == 0.4
    assert copy.should_retry_exception(FileNotFoundError()) is True
    assert copy.should_retry_result([]) is True
    assert all(isinstance(s, RetryStrategy) for s in (NoRetry(), strategy, FixedDelay(1, 0)))


def test_numbers_are_stored_as_floats():
    strategy = ExponentialBackoff(2, 1, 8, 2)
    assert (strategy.initial_delay, strategy.max_delay, strategy.multiplier) == (1.0, 8.0, 2.0)
    assert type(FixedDelay(2, 1).delay) is float
