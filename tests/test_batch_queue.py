"""``aec.runtime.batch_queue.BatchQueue``: inputs handed from an owner thread to batch calls
on an event loop thread. Driven step by step here: each owner action, then a barrier that
waits until the loop has run everything handed to it."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from aec.runtime.batch_queue import (
    BatchItem,
    BatchQueue,
    BatchResultError,
    batch_results,
    check_max_batch_size,
    check_max_wait,
)
from aec.runtime.event_loop import EventLoopThread

pytestmark = pytest.mark.timeout(60)


class Harness:
    """A queue over a real loop thread, recording calls and outcomes."""

    def __init__(self, max_batch_size: int, max_wait: float | None, fn: Any = None) -> None:
        self.loop = EventLoopThread(grace=0.5)
        self.calls: list[list[Any]] = []
        self.outcomes: list[tuple[list[Any], Any, Any, bool]] = []
        self.delivered = threading.Semaphore(0)
        self.queue = BatchQueue(self.loop, fn or self.echo, max_batch_size, max_wait,
                                self.deliver)  # fmt: skip

    async def echo(self, values: list[Any]) -> list[Any]:
        self.calls.append(list(values))
        return [v * 10 for v in values]

    def deliver(self, batch: Any, results: Any, error: Any, fatal: bool) -> None:
        self.outcomes.append(([i.value for i in batch.items], results, error, fatal))
        self.delivered.release()

    def barrier(self) -> None:
        """Wait until the loop ran everything handed to it so far (and one more turn)."""
        done = threading.Event()
        self.loop.call_soon(lambda: asyncio.get_running_loop().call_soon(done.set))
        assert done.wait(5.0)

    def wait_outcomes(self, n: int) -> None:
        while len(self.outcomes) < n:
            assert self.delivered.acquire(timeout=5.0), f"{len(self.outcomes)} of {n} batches"

    def submit(self, *values: Any) -> list[BatchItem]:
        items = [BatchItem(v, None) for v in values]
        for item in items:
            self.queue.submit(item)
        return items

    def close(self) -> None:
        self.loop.stop()


@pytest.fixture
def harness_of():
    made: list[Harness] = []

    def make(*args: Any, **kwargs: Any) -> Harness:
        made.append(Harness(*args, **kwargs))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_full_batches_leave_at_once_and_a_partial_one_waits_for_a_flush(harness_of):
    h = harness_of(3, None)
    h.submit(1, 2, 3, 4)
    h.barrier()
    h.wait_outcomes(1)
    assert h.calls == [[1, 2, 3]]  # 4 waits: no time limit, the owner is busy
    h.barrier()
    assert h.calls == [[1, 2, 3]]
    h.queue.flush()
    h.wait_outcomes(2)
    assert h.calls == [[1, 2, 3], [4]]
    assert h.outcomes[1][1] == [40]


def test_max_wait_sends_a_partial_batch_without_the_owner(harness_of):
    h = harness_of(10, 0.05)
    h.submit(1, 2)
    h.wait_outcomes(1)
    assert h.calls == [[1, 2]]


def test_a_retry_pending_when_the_owner_flushes_is_sent(harness_of):
    h = harness_of(2, None)
    h.submit(1, 2)  # a full batch
    h.wait_outcomes(1)
    h.loop.call_soon(h.queue.add_again, BatchItem(99, None))  # a retry, owner busy
    h.barrier()
    h.submit(3, 4)  # 99 and 3 fill a batch; 4 is left pending
    h.wait_outcomes(2)
    h.barrier()
    assert h.calls == [[1, 2], [99, 3]]
    h.queue.flush()  # nothing handed since the last batch's worth, but 4 is pending
    h.wait_outcomes(3)
    assert h.calls[2] == [4]


def test_retries_due_while_the_owner_sleeps_leave_together(harness_of):
    h = harness_of(10, None)
    h.queue.flush()  # the owner sleeps
    h.loop.call_soon(lambda: [h.queue.add_again(BatchItem(v, None)) for v in (7, 8, 9)])
    h.wait_outcomes(1)
    assert h.calls == [[7, 8, 9]]


def test_a_dropped_input_is_not_sent_and_a_batch_nobody_waits_for_is_cancelled(harness_of):
    started, cancelled = threading.Event(), threading.Event()

    async def hang(values: list[Any]) -> list[Any]:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return values

    h = harness_of(2, None, fn=hang)
    kept, gone = h.submit(1, 2)  # a full batch: sent
    assert started.wait(5.0)
    kept.cancel()
    h.barrier()
    assert not cancelled.is_set()  # 2 is still waited for
    gone.cancel()
    assert cancelled.wait(5.0)
    (alone,) = h.submit(3)
    alone.cancel()
    h.queue.flush()
    h.barrier()
    h.barrier()
    assert h.outcomes == []  # cancelled batches report nothing; 3 was never sent


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([1], "returned 1 results for a batch of 2 inputs"),
        ([1, 2, 3], "returned 3 results for a batch of 2 inputs"),
        (None, "returned None"),
        ({1: 1, 2: 2}, "returned {1: 1, 2: 2}"),
        (5, "returned int"),
    ],
)
def test_results_must_be_one_per_input(returned, message):
    async def fn(values):
        return returned

    with pytest.raises(BatchResultError, match=message) as info:
        batch_results(fn, 2, returned)
    assert "test_batch_queue.test_results_must_be_one_per_input.<locals>.fn" in str(info.value)
    assert batch_results(fn, 2, (x for x in "ab")) == ["a", "b"]


class _Lookup:
    async def __call__(self, values, extra=0):
        return values[1:]


async def _short(values, extra=0):
    return values[1:]


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (_Lookup(), "test_batch_queue._Lookup.__call__"),
        (functools.partial(_short, extra=1), "test_batch_queue._short"),
        (functools.partial(functools.partial(_Lookup(), extra=1)), "test_batch_queue._Lookup"),
    ],
)
def test_a_wrong_length_names_a_callable_object_or_partial_as_module_qualname(fn, name):
    with pytest.raises(BatchResultError, match="returned 1 results for a batch of 2") as info:
        batch_results(fn, 2, [1])
    assert name in str(info.value)
    assert " object at 0x" not in str(info.value)


def test_misuse_is_fatal_and_a_raising_call_is_not(harness_of):
    async def short(values):
        return values[1:]

    def not_async(values):
        return values

    async def raises(values):
        raise ConnectionError("down")

    for fn, fatal, error in [(short, True, BatchResultError), (not_async, True, TypeError),
                             (raises, False, ConnectionError)]:  # fmt: skip
        h = harness_of(2, None, fn=fn)
        h.submit(1, 2)
        h.wait_outcomes(1)
        values, results, got, is_fatal = h.outcomes[0]
        assert (values, results, is_fatal) == ([1, 2], None, fatal)
        assert isinstance(got, error)


def test_limits_are_checked():
    assert check_max_batch_size(1) == 1
    assert check_max_wait(0) == 0.0 and check_max_wait(float("inf")) is None
    for bad, error in [(0, ValueError), (True, TypeError), (1.5, TypeError)]:
        with pytest.raises(error, match="max_batch_size"):
            check_max_batch_size(bad)
    for bad, error in [(-1, ValueError), (float("nan"), ValueError), ("1", TypeError)]:
        with pytest.raises(error, match="max_wait"):
            check_max_wait(bad)
