"""LatencyBackend: any backend behind a modelled network round trip.

Disaggregated state (FLIP-423) turns every state access into a remote call; the
async state model pays off by batching and overlapping those calls. This wrapper
models the cost: each batch first sleeps one round trip plus a per-request cost,
with ``time.sleep`` (which releases the GIL, so batches on different I/O threads
overlap as real remote calls would), then runs on the wrapped backend. An optional
``max_concurrency`` bounds how many batches are in their round trip at once (a
connection pool, or a store's request concurrency limit).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

from aec.keygroups import KeyGroupRange
from aec.state.backend import BackendSpec, StateBackend
from aec.state.requests import StateRequest
from aec.state.serialization import Serializer

# A latency: seconds, a zero-argument callable returning seconds, or a named
# distribution ("uniform", lo, hi) / ("exponential", mean).
Latency = float | Callable[[], float] | tuple


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be finite and >= 0 seconds, got {value!r}")
    return seconds


class LatencySampler:
    """Draws one round-trip time in seconds per call; thread-safe.

    ``latency`` is a number (constant), a zero-argument callable (called as is;
    its result is checked), ``("uniform", lo, hi)`` or ``("exponential", mean)``;
    named distributions draw from ``random.Random(seed)``, so a seed makes the
    sequence of draws reproducible (in call order). Raises TypeError/ValueError
    naming ``latency`` for a malformed or negative spec.
    """

    def __init__(self, latency: Latency, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()  # several I/O threads draw at once
        self._draw = self._compile(latency)

    def _compile(self, latency: Latency) -> Callable[[], float]:
        if callable(latency):
            return lambda: _check_seconds("latency() result", latency())
        if isinstance(latency, tuple) and latency:
            kind, *args = latency
            if kind == "uniform" and len(args) == 2:
                low = _check_seconds("latency lo", args[0])
                high = _check_seconds("latency hi", args[1])
                if low > high:
                    raise ValueError(f"latency ('uniform', lo, hi) needs lo <= hi, got {latency!r}")
                return lambda: self._rng.uniform(low, high)
            if kind == "exponential" and len(args) == 1:
                mean = _check_seconds("latency mean", args[0])
                if mean == 0:
                    return lambda: 0.0
                return lambda: self._rng.expovariate(1.0 / mean)
            raise ValueError(
                f"latency must be ('uniform', lo, hi) or ('exponential', mean), got {latency!r}"
            )
        seconds = _check_seconds("latency", latency)
        return lambda: seconds

    def __call__(self) -> float:
        with self._lock:
            return self._draw()


def _check_concurrency(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_concurrency must be an int or None, got {value!r}")
    if value < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {value!r}")
    return value


class LatencyBackend(StateBackend):
    """Wraps ``inner``; each batch sleeps ``latency`` + ``per_request * len(batch)`` seconds.

    Args:
        inner: the backend that stores the state (opened, closed, snapshotted and
            restored through this wrapper).
        latency: the round trip per batch, drawn once per batch: seconds, a
            zero-argument callable returning seconds, ``("uniform", lo, hi)`` or
            ``("exponential", mean)``.
        per_request: extra seconds per request of a batch (>= 0).
        seed: seeds the named distributions (``random.Random(seed)``).
        max_concurrency: at most this many batches in their modelled round trip
            (the sleep and the call into ``inner``) at once; further batches wait
            for a free slot (a ``threading.BoundedSemaphore``). None: unlimited.

    Always blocking. A non-blocking ``inner`` (such as ``MemoryBackend``) expects
    batches one at a time on the mailbox thread, so calls into it are serialized
    with a lock; the sleeps still overlap (up to ``max_concurrency``). ``flush``
    is passed on to ``inner``.

    Raises:
        TypeError/ValueError: malformed or negative ``latency`` or ``per_request``;
            ``max_concurrency`` not an int >= 1 or None.
    """

    blocking = True

    def __init__(
        self,
        inner: StateBackend,
        latency: Latency,
        per_request: float = 0.0,
        seed: int | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        if not isinstance(inner, StateBackend):
            raise TypeError(f"inner must be a StateBackend, got {type(inner).__name__}")
        self.inner = inner
        self.per_request = _check_seconds("per_request", per_request)
        self.max_concurrency = _check_concurrency(max_concurrency)
        self._latency = latency
        self._seed = seed
        self._sampler = LatencySampler(latency, seed)
        self._inner_lock = None if inner.blocking else threading.Lock()
        self._slots = (
            None if max_concurrency is None else threading.BoundedSemaphore(max_concurrency)
        )

    def __repr__(self) -> str:
        limit = "" if self.max_concurrency is None else f", max_concurrency={self.max_concurrency}"
        return f"LatencyBackend({self.inner!r}, latency={self._latency!r}{limit})"

    def delay_for(self, requests: int) -> float:
        """Seconds to sleep before a batch of ``requests`` requests (draws once)."""
        return self._sampler() + self.per_request * requests

    def execute_batch(self, requests: Sequence[StateRequest]) -> None:
        delay = self.delay_for(len(requests))  # drawn in call order: seeded runs repeat
        if self._slots is None:
            self._round_trip(delay, requests)
        else:
            with self._slots:
                self._round_trip(delay, requests)

    def _round_trip(self, delay: float, requests: Sequence[StateRequest]) -> None:
        if delay > 0:
            time.sleep(delay)  # releases the GIL
        if self._inner_lock is None:
            self.inner.execute_batch(requests)
        else:
            with self._inner_lock:
                self.inner.execute_batch(requests)

    def flush(self) -> None:
        if self._inner_lock is None:
            self.inner.flush()
        else:
            with self._inner_lock:
                self.inner.flush()

    def register_state(self, name: str, serializer: Serializer) -> None:
        super().register_state(name, serializer)
        self.inner.register_state(name, serializer)

    def register_ttl(self, name: str, ttl: float, kind: str) -> None:
        super().register_ttl(name, ttl, kind)
        self.inner.register_ttl(name, ttl, kind)

    def expire(self, now: float) -> None:
        self.inner.expire(now)  # the inner backend sweeps in its own batches

    def stored_entries(self, state: str) -> int:
        return self.inner.stored_entries(state)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def snapshot(self, directory: str) -> None:
        self.inner.snapshot(directory)

    def scratch_parent(self) -> str | None:
        return self.inner.scratch_parent()

    def restore(
        self,
        directory: str | Sequence[str],
        key_groups: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
    ) -> None:
        if key_groups is None and max_parallelism is None:  # also a backend of the old contract
            self.inner.restore(directory)
        else:
            self.inner.restore(directory, key_groups, max_parallelism)

    def spec(self) -> BackendSpec:
        return LatencySpec(
            self.inner.spec(),
            self._latency,
            self.per_request,
            self._seed,
            max_concurrency=self.max_concurrency,
        )

    def state_items(self, state: str) -> dict[Any, Any]:
        return self.inner.state_items(state)


class LatencySpec(BackendSpec):
    """Builds ``LatencyBackend(inner.build(p), latency, per_request, seed + p, max_concurrency)``.

    Each partition draws its own reproducible sequence (``seed + partition``; no
    seed stays unseeded) and has its own concurrency limit. A callable ``latency``
    must pickle (cloudpickle for lambdas).
    """

    def __init__(
        self,
        inner: BackendSpec,
        latency: Latency,
        per_request: float,
        seed: int | None,
        max_concurrency: int | None = None,
    ) -> None:
        self.inner = inner
        self.latency = latency
        self.per_request = per_request
        self.seed = seed
        self.max_concurrency = max_concurrency

    def build(self, partition: int) -> StateBackend:
        seed = None if self.seed is None else self.seed + partition
        return LatencyBackend(
            self.inner.build(partition),
            self.latency,
            self.per_request,
            seed,
            self.max_concurrency,
        )
