"""LatencyBackend: modelled round trips, the concurrency limit, determinism, arguments.

Timing checks are behaviour checks with generous margins (sleeps never end early;
overlap is compared against the fully serial time), not performance goals.
"""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from aec.keygroups import key_group_for
from aec.state.backend import BackendSpec, StateBackend
from aec.state.memory import MemoryBackend, MemorySpec
from aec.state.requests import Op, StateRequest
from backends.latency import LatencyBackend, LatencySampler, LatencySpec


def req(op: int, state: str, key, user_key=None, value=None) -> StateRequest:
    return StateRequest(op, state, key, key_group_for(key, 128), user_key, value)


class Probe(StateBackend):
    """An inner backend that records how many calls overlap (and may sleep or fail)."""

    def __init__(self, blocking: bool = True, work: float = 0.0) -> None:
        self.blocking = blocking
        self.work = work
        self.memory = MemoryBackend()
        self.active = 0
        self.peak = 0
        self.calls = 0
        self.flushes = 0
        self.fail = False
        self._lock = threading.Lock()

    def execute_batch(self, requests) -> None:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
        try:
            if self.work:
                time.sleep(self.work)
            if self.fail:
                raise OSError("remote unavailable")
            self.memory.execute_batch(requests)
        finally:
            with self._lock:
                self.active -= 1

    def flush(self) -> None:
        self.flushes += 1

    def snapshot(self, directory: str) -> None:
        self.memory.snapshot(directory)

    def restore(self, directory: str) -> None:
        self.memory.restore(directory)


def run_concurrently(backend: StateBackend, batches: int) -> float:
    """One single-request batch per thread, all released together; the elapsed seconds."""
    barrier = threading.Barrier(batches + 1)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        barrier.wait()
        try:
            backend.execute_batch([req(Op.VALUE_PUT, "v", index, value=index)])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(batches)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert not errors
    return elapsed


LATENCY = 0.05
BATCHES = 6


def test_max_concurrency_one_serializes_round_trips():
    backend = LatencyBackend(MemoryBackend(), LATENCY, max_concurrency=1)
    assert run_concurrently(backend, BATCHES) >= BATCHES * LATENCY - 0.002
    assert backend.state_items("v") == {i: i for i in range(BATCHES)}


def test_unlimited_concurrency_overlaps_round_trips():
    backend = LatencyBackend(MemoryBackend(), LATENCY)
    assert run_concurrently(backend, BATCHES) < 0.75 * BATCHES * LATENCY
    assert backend.state_items("v") == {i: i for i in range(BATCHES)}


def test_max_concurrency_two_halves_the_serial_time():
    backend = LatencyBackend(MemoryBackend(), LATENCY, max_concurrency=2)
    elapsed = run_concurrently(backend, BATCHES)
    assert elapsed >= (BATCHES // 2) * LATENCY - 0.002
    assert elapsed < 0.9 * BATCHES * LATENCY


@pytest.mark.parametrize(("limit", "expected"), [(1, 1), (2, 2), (None, None)])
def test_the_limit_covers_the_call_into_a_blocking_inner(limit, expected):
    inner = Probe(blocking=True, work=0.03)
    backend = LatencyBackend(inner, 0.0, max_concurrency=limit)
    run_concurrently(backend, BATCHES)
    assert inner.calls == BATCHES
    if expected is None:
        assert inner.peak >= 3  # six threads released together mostly overlap
    else:
        assert inner.peak == expected


def test_a_non_blocking_inner_is_never_called_concurrently():
    inner = Probe(blocking=False, work=0.002)
    backend = LatencyBackend(inner, 0.02)
    assert backend.blocking
    run_concurrently(backend, 8)
    assert inner.calls == 8 and inner.peak == 1


def test_a_failing_batch_releases_its_slot():
    inner = Probe()
    backend = LatencyBackend(inner, 0.001, max_concurrency=1)
    inner.fail = True
    for _ in range(3):
        with pytest.raises(OSError, match="unavailable"):
            backend.execute_batch([req(Op.VALUE_GET, "v", 1)])
    inner.fail = False
    batch = [req(Op.VALUE_PUT, "v", 1, value=2), req(Op.VALUE_GET, "v", 1)]
    backend.execute_batch(batch)  # would block forever if a slot had leaked
    assert batch[1].result == 2


def test_per_request_cost_grows_with_the_batch():
    per_request = 0.004
    backend = LatencyBackend(MemoryBackend(), 0.0, per_request=per_request)

    def timed(size: int) -> float:
        batch = [req(Op.VALUE_GET, "v", i) for i in range(size)]
        started = time.perf_counter()
        backend.execute_batch(batch)
        return time.perf_counter() - started

    small, large = timed(1), timed(25)
    assert large >= 25 * per_request
    assert small < 0.5 * 25 * per_request
    assert backend.delay_for(10) == pytest.approx(10 * per_request)


@pytest.mark.parametrize("latency", [("uniform", 0.001, 0.003), ("exponential", 0.002)])
def test_seeded_backends_draw_the_same_round_trips(latency):
    def draws(seed, **kwargs) -> list[float]:
        backend = LatencyBackend(MemoryBackend(), latency, seed=seed, **kwargs)
        return [backend.delay_for(0) for _ in range(30)]

    first = draws(11)
    assert first == draws(11) == draws(11, max_concurrency=3)
    assert first != draws(12)
    assert all(d >= 0 for d in first)
    sampler = LatencySampler(latency, 11)
    assert first == [sampler() for _ in range(30)]


def test_seeded_draws_are_taken_once_per_batch_in_call_order():
    seen: list[float] = []
    backend = LatencyBackend(MemoryBackend(), ("uniform", 0.0, 0.001), seed=3, max_concurrency=1)
    reference = LatencySampler(("uniform", 0.0, 0.001), 3)
    original = backend.delay_for

    def spy(requests: int) -> float:
        delay = original(requests)
        seen.append(delay)
        return delay

    backend.delay_for = spy
    for i in range(5):
        backend.execute_batch([req(Op.VALUE_PUT, "v", i, value=i), req(Op.VALUE_GET, "v", i)])
    assert seen == [reference() for _ in range(5)]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_concurrency": 0}, ValueError, "max_concurrency"),
        ({"max_concurrency": -2}, ValueError, "max_concurrency"),
        ({"max_concurrency": 2.5}, TypeError, "max_concurrency"),
        ({"max_concurrency": "4"}, TypeError, "max_concurrency"),
        ({"max_concurrency": True}, TypeError, "max_concurrency"),
        ({"per_request": -0.1}, ValueError, "per_request"),
        ({"per_request": float("inf")}, ValueError, "per_request"),
        ({"latency": -1}, ValueError, "latency"),
        ({"latency": ("exponential", -1.0)}, ValueError, "latency mean"),
        ({"latency": ("uniform", 0.1)}, ValueError, "uniform"),
    ],
)
def test_bad_arguments_are_rejected_by_name(kwargs, error, match):
    arguments = {"latency": 0.0, **kwargs}
    with pytest.raises(error, match=match):
        LatencyBackend(MemoryBackend(), **arguments)


def test_inner_must_be_a_backend():
    with pytest.raises(TypeError, match="inner"):
        LatencyBackend({}, 0.0)


def test_spec_keeps_the_concurrency_limit():
    backend = LatencyBackend(MemoryBackend(), 0.001, per_request=0.0001, seed=1, max_concurrency=3)
    assert "max_concurrency=3" in repr(backend)
    spec = pickle.loads(pickle.dumps(backend.spec()))
    assert isinstance(spec, LatencySpec) and isinstance(spec, BackendSpec)
    built = spec.build(2)
    assert built.max_concurrency == 3 and built.per_request == 0.0001
    assert LatencySpec(MemorySpec(), 0.0, 0.0, None).build(0).max_concurrency is None


def test_flush_and_lifecycle_reach_the_inner_backend(tmp_path):
    inner = Probe()
    backend = LatencyBackend(inner, 0.0)
    backend.flush()
    assert inner.flushes == 1
    backend.execute_batch([req(Op.VALUE_PUT, "v", "a", value=1)])
    backend.snapshot(str(tmp_path))
    backend.execute_batch([req(Op.VALUE_PUT, "v", "a", value=2)])
    backend.restore(str(tmp_path))
    batch = [req(Op.VALUE_GET, "v", "a")]
    backend.execute_batch(batch)
    assert batch[0].result == 1
