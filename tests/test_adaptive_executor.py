"""The thread-pool executor's inline choice (``BatchCostModel``): batches a backend
answers faster than a hand-off run on the mailbox thread, slow ones stay on I/O
threads, and the results are the synchronous run's either way."""

from __future__ import annotations

import random
import threading
import time

import pytest
from engine_helpers import Counter, FiringReads

from aec import (
    AecConfig,
    KeyedProcessFunction,
    Record,
    ValueStateDescriptor,
    Watermark,
    run_keyed,
)
from aec.runtime.batch_cost import BatchCostModel
from aec.runtime.executor import InlineExecutor, ThreadPoolStateExecutor
from aec.testing import run_sync
from backends import MemoryBackend


class BlockingMemory(MemoryBackend):
    """MemoryBackend declared blocking (so it gets the thread pool), recording
    which threads ran its batches, optionally sleeping per batch."""

    blocking = True

    def __init__(self, sleep: float = 0.0) -> None:
        super().__init__()
        self.sleep = sleep
        self.threads: list[str] = []

    def execute_batch(self, requests) -> None:
        self.threads.append(threading.current_thread().name)
        if self.sleep:
            time.sleep(self.sleep)
        super().execute_batch(requests)


def hot_key_source(n: int, seed: int = 3) -> list[Record]:
    rng = random.Random(seed)
    return [Record("hot" if rng.random() < 0.5 else rng.randrange(50), i) for i in range(n)]


def test_fast_backend_batches_run_inline_with_the_synchronous_answer():
    source = hot_key_source(3000)
    backend = BlockingMemory()
    result = run_keyed(source, Counter(), backend, AecConfig(in_flight_records_limit=200))
    expected = run_sync(source, Counter())
    assert per_key(result.outputs) == per_key(expected.outputs)
    assert backend.state_items("count") == _counts(source)
    mailbox = threading.current_thread().name
    inline = sum(1 for name in backend.threads if name == mailbox)
    assert result.metrics["inline_batches"] == inline
    assert inline > result.metrics["batches"] / 2  # a hot key: most batches are tiny


def test_slow_backend_batches_stay_on_io_threads():
    source = hot_key_source(60)
    backend = BlockingMemory(sleep=0.05)  # far slower than a hand-off, even on a busy machine
    result = run_keyed(source, Counter(), backend, AecConfig(in_flight_records_limit=20))
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    # only the occasional exploration of a size class runs inline
    assert result.metrics["inline_batches"] <= result.metrics["batches"] / 8 + 3


def test_adaptive_off_never_runs_inline():
    source = hot_key_source(500)
    backend = BlockingMemory()
    executor = ThreadPoolStateExecutor(2, adaptive=False)
    result = run_keyed(source, Counter(), backend, AecConfig(), executor=executor)
    assert result.metrics["inline_batches"] == 0
    assert threading.current_thread().name not in backend.threads
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)


def test_cost_model_follows_measured_costs():
    model = BatchCostModel(handoff_seconds=100e-6)
    decisions = [model.run_inline(8) for _ in range(64)]
    assert 0 < sum(decisions) < 4  # unknown class: explored now and then only
    model.record_inline(8, 10e-6)
    assert sum(model.run_inline(8) for _ in range(128)) >= 120  # cheap: inline
    for _ in range(60):
        model.record_inline(8, 2e-3)  # became slow (a cache went cold)
    assert sum(model.run_inline(8) for _ in range(128)) <= 4
    for _ in range(60):
        model.record_handoff(5e-3)  # hand-offs got dearer than that
    assert sum(model.run_inline(8) for _ in range(128)) >= 120


def _counts(source):
    counts: dict = {}
    for record in source:
        counts[record.key] = counts.get(record.key, 0) + 1
    return counts


def per_key(outputs):
    """Each key's output sequence (async runs interleave keys; each key keeps its order)."""
    keyed: dict = {}
    for output in outputs:
        if isinstance(output, tuple):
            keyed.setdefault(output[0], []).append(output)
    return keyed


class CountingInline(InlineExecutor):
    """InlineExecutor counting flushed batches and requests run at once."""

    def __init__(self, prefers_batches: bool = False) -> None:
        super().__init__(prefers_batches)
        self.flushed = 0
        self.now = 0

    def submit(self, batch) -> None:
        self.flushed += 1
        super().submit(batch)

    def run_now(self, batch) -> bool:
        self.now += 1
        return super().run_now(batch)


def test_a_hot_keys_waiting_records_run_at_once_with_the_synchronous_answer():
    source = hot_key_source(2000)
    executor = CountingInline()
    result = run_keyed(source, Counter(), MemoryBackend(), AecConfig(in_flight_records_limit=100),
                       executor=executor)  # fmt: skip
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert result.metrics["blocked_requests"] > 0  # the hot key's records still wait for it
    # a waiting record's two requests run at once: no flush, no mail round trip each
    assert executor.now >= 2 * result.metrics["blocked_requests"] * 0.9
    assert executor.flushed + executor.now == result.metrics["batches"]


def test_a_refused_run_now_keeps_the_records_request_order():
    source = hot_key_source(400)
    backend = BlockingMemory(sleep=0.002)  # slower than a hand-off: run_now mostly refuses
    result = run_keyed(source, Counter(), backend, AecConfig(in_flight_records_limit=40))
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert backend.state_items("count") == _counts(source)


class ReadThenWrites(KeyedProcessFunction):
    """Reads, then writes 10 in the same call; the read's callback writes read + 1.
    The backend must see read, write 10, write read + 1: the last value wins."""

    def open(self, ctx) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("v", default=0))

    def process_element(self, value, ctx):
        read = self.value.async_value()
        self.value.async_update(10)  # submitted before the callback below can run
        return read.then_compose(lambda n: self.value.async_update(n + 1))


def test_a_callbacks_request_runs_at_once_only_behind_its_records_queued_ones():
    # buffer_size=3: record 1's read flushes with record 0's two requests, its write 10
    # stays queued in the active buffer when the read completes; the callback's write
    # must run after it (running at once would let "write 10" land last)
    backend = MemoryBackend()
    source = [Record(k, None) for k in range(7)]
    run_keyed(source, ReadThenWrites(), backend, AecConfig(buffer_size=3))
    assert backend.state_items("v") == {k: 1 for k in range(7)}


def test_callbacks_requests_of_a_uniform_run_run_at_once():
    # each record's write comes from the callback of its completed read: at once
    source = [Record(k, i) for i, k in enumerate(range(500))]
    executor = CountingInline()
    result = run_keyed(source, Counter(), MemoryBackend(), AecConfig(), executor=executor)
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert executor.now == 500  # the 500 writes
    assert result.metrics["blocked_requests"] == 0


def few_hot_keys_source(n: int, seed: int = 5) -> list[Record]:
    """Four hot keys holding 80 % of the records (Zipf-like skew), the rest spread."""
    rng = random.Random(seed)
    return [Record(f"hot{rng.randrange(4)}" if rng.random() < 0.8 else rng.randrange(200), i)
            for i in range(n)]  # fmt: skip


def test_a_store_preferring_batches_batches_the_hot_keys_records_together():
    # several hot keys have a waiting record ready at once: their requests share a
    # batch instead of one call each (RocksDB: a call costs about two batched requests)
    source = few_hot_keys_source(3000)
    config = AecConfig(in_flight_records_limit=200)
    at_once, joined = CountingInline(prefers_batches=False), CountingInline(prefers_batches=True)
    plain = run_keyed(source, Counter(), MemoryBackend(), config, executor=at_once)
    backend = MemoryBackend()
    batched = run_keyed(source, Counter(), backend, config, executor=joined)
    expected = run_sync(source, Counter())
    assert per_key(batched.outputs) == per_key(plain.outputs) == per_key(expected.outputs)
    assert backend.state_items("count") == _counts(source)
    assert batched.metrics["blocked_requests"] > 1000  # the hot keys' records still wait
    assert joined.now < at_once.now / 4  # most of them joined a batch
    assert batched.metrics["batches"] < plain.metrics["batches"] / 2
    assert joined.flushed + joined.now == batched.metrics["batches"]


def test_a_store_preferring_batches_still_runs_a_lone_hot_key_at_once():
    # one key, nothing else waiting: joining a batch would only delay it
    source = [Record("hot", i) for i in range(300)]
    executor = CountingInline(prefers_batches=True)
    result = run_keyed(source, Counter(), MemoryBackend(), AecConfig(in_flight_records_limit=50),
                       executor=executor)  # fmt: skip
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert executor.now >= 2 * 299 * 0.9  # every waiting record's read and write


def test_rocksdb_batches_run_on_the_mailbox_thread(tmp_path):
    # rocksdict holds the GIL in every call: an I/O thread could only take turns
    from aec import KeyedProcessOperator
    from backends import RocksDBBackend

    operator = KeyedProcessOperator(Counter(), RocksDBBackend(str(tmp_path / "db")), AecConfig())
    assert type(operator.executor) is InlineExecutor and operator.executor.prefers_batches
    assert type(KeyedProcessOperator(Counter(), MemoryBackend()).executor) is InlineExecutor
    assert not KeyedProcessOperator(Counter(), MemoryBackend()).executor.prefers_batches
    backend = RocksDBBackend(str(tmp_path / "db2"))
    source = few_hot_keys_source(2000)
    result = run_keyed(source, Counter(), backend, AecConfig(in_flight_records_limit=200))
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert backend.state_items("count") == _counts(source)
    assert result.metrics["inline_batches"] == result.metrics["batches"]
    assert result.metrics["mean_batch_size"] > 2


def test_a_store_preferring_batches_batches_the_callbacks_requests_of_a_batch():
    # the 500 reads go out as one batch; each read's callback writes: the writes of
    # one completed batch share the next call instead of one call each
    source = [Record(k, i) for i, k in enumerate(range(500))]
    executor = CountingInline(prefers_batches=True)
    backend = MemoryBackend()
    result = run_keyed(source, Counter(), backend, AecConfig(), executor=executor)
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert backend.state_items("count") == _counts(source)
    assert executor.now == 0
    assert result.metrics["batches"] == executor.flushed == 2


def skewed_source(n: int, seed: int = 9) -> list[Record]:
    """Keys 0-9 hold 60 % of the records, the rest spread over 5,000 keys."""
    rng = random.Random(seed)
    return [Record(rng.randrange(10) if rng.random() < 0.6 else rng.randrange(10, 5010), i)
            for i in range(n)]  # fmt: skip


def test_records_blocked_behind_the_buffer_flush_it_on_a_store_answering_from_memory():
    # the buffer (1,000 requests) fills slowly while hot keys' records pile up blocked;
    # BLOCKED_FLUSH blocked records make the flush due, so few stay in flight
    from aec.runtime.controller import BLOCKED_FLUSH

    source = skewed_source(20_000)
    backend = MemoryBackend()
    result = run_keyed(source, Counter(), backend, AecConfig())
    assert per_key(result.outputs) == per_key(run_sync(source, Counter()).outputs)
    assert backend.state_items("count") == _counts(source)
    assert result.metrics["blocked_requests"] > 5 * BLOCKED_FLUSH
    # every record admitted after a flush runs at once (distinct key) or waits: at most
    # BLOCKED_FLUSH waiting plus the records with requests in the active buffer
    assert result.metrics["max_in_flight"] <= BLOCKED_FLUSH + 1000
    # a store preferring batches keeps filling the buffer: far more records in flight
    batched = run_keyed(source, Counter(), MemoryBackend(), AecConfig(),
                        executor=CountingInline(prefers_batches=True))  # fmt: skip
    assert per_key(batched.outputs) == per_key(result.outputs)
    assert batched.metrics["max_in_flight"] > 2 * result.metrics["max_in_flight"]


def test_a_warm_cache_answers_its_batches_on_the_mailbox_thread():
    """``StateBackend.execute_batch_now``: a cache over a slow store, holding every key,
    completes its batches without an I/O thread; a cold one hands them off."""
    from backends.cache import CachedBackend

    remote = BlockingMemory(sleep=0.001)
    cache = CachedBackend(remote, capacity_entries=100)
    rng = random.Random(5)
    source = [Record(rng.randrange(40), i) for i in range(2000)]
    cold = run_keyed(source, Counter(), cache)
    reads = len(remote.threads)  # the cold run's misses (and its final flush)
    assert any(name.startswith("aec-io") for name in remote.threads)
    warm = run_keyed(source, Counter(), cache)  # every key cached now
    # no read reached the remote: its one call is the end of input's write-back flush
    assert remote.threads[reads:] == [threading.current_thread().name]
    assert warm.metrics["inline_batches"] == warm.metrics["batches"] > 0
    assert cold.metrics["inline_batches"] < cold.metrics["batches"]
    expected = run_sync(source + source, Counter())  # the two runs are one run's halves
    assert per_key(cold.outputs + warm.outputs) == per_key(expected.outputs)


class RaisingNow(BlockingMemory):
    def execute_batch_now(self, requests) -> bool:
        raise OSError("the cache's lookup broke")


def test_an_error_answering_a_batch_now_fails_the_job_naming_a_record():
    from aec import JobFailure

    with pytest.raises(JobFailure, match="the cache's lookup broke") as failure:
        # a full buffer's flush (not an idle one, which the cost model may run inline)
        source = [Record(k, k) for k in range(10)]
        run_keyed(source, Counter(), RaisingNow(), AecConfig(buffer_size=2))
    assert "record" in str(failure.value)


class ReadCallWrite(KeyedProcessFunction):
    """Reads its count, awaits an external call, writes the count + 1."""

    def open(self, ctx) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    async def process_element(self, value, ctx):
        seen = await self.count.async_value()
        doubled = await ctx.call_async(_double, value)
        await self.count.async_update(seen + 1)
        ctx.output((ctx.current_key, doubled, seen + 1))


async def _double(value: int) -> int:
    return 2 * value


@pytest.mark.parametrize("prefers_batches", [False, True])
def test_requests_after_an_external_calls_completion(prefers_batches):
    # the write follows the call's completion mail: its record holds its key with
    # nothing queued, so on a store answering from memory it runs at once, as the write
    # in a completed read's callback does; a store preferring batches keeps it batched
    # (more calls' mails may follow with writes to share its call)
    source = [Record(k, k) for k in range(400)]
    executor = CountingInline(prefers_batches)
    backend = MemoryBackend()
    result = run_keyed(source, ReadCallWrite(), backend, AecConfig(), executor=executor)
    assert per_key(result.outputs) == per_key(run_sync(source, ReadCallWrite()).outputs)
    assert backend.state_items("count") == {k: 1 for k in range(400)}
    if prefers_batches:
        assert executor.now == 0
        assert executor.flushed < 400
    else:  # every write at once; the reads (records on free keys) in batches
        assert executor.now == 400
        assert executor.flushed < 10


class TimerReads(FiringReads, KeyedProcessFunction):
    """Registers a timer per record (``FiringReads``)."""

    def process_element(self, value, ctx):
        ctx.timer_service.register_event_time_timer(value)


@pytest.mark.parametrize(
    ("config", "pool", "prefers_batches", "at_once"),
    [
        (AecConfig(), False, False, True),  # the inline store answers on the mailbox thread
        (AecConfig(), False, True, False),  # a store preferring batches (RocksDB) batches them
        (AecConfig(), True, False, False),  # a thread pool keeps requests batched
        (AecConfig(state_ordered=True), False, False, False),  # never runs one at once
    ],
    ids=["inline", "prefers-batches", "thread-pool", "state-ordered"],
)
def test_a_one_input_timer_firing_runs_its_requests_at_once_where_a_two_input_one_does(
    config, pool, prefers_batches, at_once
):
    """A firing starts holding its key, nothing of its key unfinished before it
    (``start_holding``), in the one-input operator as in the two-input one."""
    executor = (
        ThreadPoolStateExecutor(2) if pool else InlineExecutor(prefers_batches=prefers_batches)
    )
    source = [Record(key, t, t) for t in (1, 2, 3) for key in ("k", "j")] + [Watermark(10)]
    result = run_keyed(source, TimerReads(), MemoryBackend(), config, executor=executor)
    outputs = [o for o in result.outputs if isinstance(o, tuple)]
    assert sorted(t for t, _ in outputs) == [1, 1, 2, 2, 3, 3]
    assert {done for _, done in outputs} == {at_once}
