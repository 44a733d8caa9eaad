"""One partition's micro-batch of ``process_keyed_stream`` (runs in a Python worker).

``BatchTask.run`` is the ``mapInArrow`` function: restore the partition's state
(the checkpoints the driver planned, ``stream_state.StateStore.sources``), feed
the rows (after the initial state's, in a first start: ``spark_glue.initial_state``),
end the micro-batch with a watermark, snapshot ``chk-<batch id>``, emit the outputs
and a metrics row.

Carried micro-batches. An operator whose checkpoints carry the records in flight
(a ``DeclaringKeyedProcessFunction``: ``KeyedProcessOperator.carries_records``)
ends its micro-batch without waiting for them: the snapshot stores them and they
finish in the next micro-batch, their outputs going to that micro-batch's sink. Its
end-of-micro-batch watermark would wait for them (in serial order a watermark
leaves after every record before it), so it is held back: generated and saved with
the watermark generator's progress, applied at the start of the next micro-batch
after the carried records are back (a watermark still follows every record that
arrived before it; its timers and output come one micro-batch later). A partition
whose checkpoint holds such work runs the next micro-batch even without rows
(``stream_state.HistoryRecord.pending_after``) and then drains it.

Kept operators (per micro-batch cost flat in state size). For in-process
backends (``MemoryBackend``: nothing on disk that another process could lock) a
Python worker keeps the partition's live operator (and backend) after its
snapshot, keyed by query, partitioning and partition. The next micro-batch reuses it when the planned
base is exactly the checkpoint that operator took, which is then its state:
nothing is restored, and an incremental backend writes only its changelog.
Anything else (another worker ran the partition, a replay, a rescale, a failure)
closes it and restores from the checkpoints. A failed or abandoned task never
leaves an operator behind.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark import TaskContext

from aec.checkpoint import CheckpointHandle
from aec.elements import Watermark
from aec.keygroups import key_group_range_for
from aec.timeouts import timeout_environment
from spark_glue.initial_state import split
from spark_glue.partition import PartitionJob, PartitionRun
from spark_glue.routing import partition_of, untagged
from spark_glue.stream_state import StateStore, load_watermarks, save_watermarks

_AWS = (
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP",
)  # fmt: skip

# (query token, partitions, partition) -> (live run, the checkpoint it holds)
_KEPT: dict[tuple[str, int, int], tuple[PartitionRun, CheckpointHandle]] = {}


def store_environment() -> dict[str, str]:
    """This process's AWS variables and store timeouts (``aec.timeouts``), applied on
    executors that lack them (a local Spark's workers inherit the JVM's environment,
    not the driver's later one)."""
    found = {name: os.environ[name] for name in _AWS if name in os.environ}
    return {**found, **timeout_environment()}


@contextlib.contextmanager
def caller_environment(variables: dict[str, str]) -> Iterator[None]:
    """Set, for one task, the caller's ``variables`` this process lacks; remove them
    after it. A Python worker runs tasks of many queries and tests: values a task
    brought must not outlive it (they would shadow the next caller's)."""
    added = [name for name in variables if name not in os.environ]
    for name in added:
        os.environ[name] = variables[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@dataclass(frozen=True)
class StreamTask:
    """What every micro-batch's tasks share; ``for_batch`` binds one micro-batch."""

    job: PartitionJob
    state: StateStore
    token: str  # one per process_keyed_stream call: kept operators never cross queries
    keep: bool  # keep live operators between micro-batches (in-process backends only)

    def for_batch(
        self,
        batch_id: int,
        partitions: int,
        era_start: int,
        sources: dict[int, list[CheckpointHandle]],
        environment: dict[str, str],
        pending: frozenset[int] = frozenset(),
    ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
        """The ``mapInArrow`` function of micro-batch ``batch_id``; the partitions in
        ``pending`` (work carried by their checkpoint) run even without rows."""
        inherited = frozenset(
            p for p, handles in sources.items() if self.state.inherited(handles, p, partitions)
        )
        return BatchTask(
            self, batch_id, partitions, era_start, sources, environment, inherited | pending
        ).run


@dataclass(frozen=True)
class BatchTask:
    task: StreamTask
    batch_id: int
    partitions: int
    era_start: int
    sources: dict[int, list[CheckpointHandle]]
    environment: dict[str, str]
    materialize: frozenset[int]  # partitions that snapshot even without rows

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Restore (or keep), process, snapshot, emit. A partition without rows does
        nothing (its newest checkpoint stays its state) unless its state is inherited
        from an older era (then it restores and snapshots it, ``stream_state``) or its
        checkpoint holds pending work (then it finishes that work)."""
        batches = iter(batches)
        first = next((b for b in batches if b.num_rows), None)
        if first is None:
            context = TaskContext.get()
            partition = context.partitionId() if context is not None else -1
            if partition not in self.materialize:
                return
        else:
            partition = partition_of(first)
        with caller_environment(self.environment):
            yield from self._run(partition, first, batches)

    def _run(
        self, partition: int, first: pa.RecordBatch | None, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        state = self.task.state
        directory = state.partition(partition, self.partitions)
        state.clear_attempt(partition, self.partitions, self.batch_id)  # again: a retried task
        sources = self.sources.get(partition, [])
        run, kept = self._operator(partition, sources)
        operator = run.operator
        initial_rows = 0
        try:
            run.next_batch()
            held = run.watermarks.current
            if held > operator.watermark:  # held back at the end of the previous micro-batch
                operator.process_watermark(Watermark(held))
            for batch in itertools.chain([first] if first is not None else [], batches):
                if not batch.num_rows:
                    continue
                initial, rows = split(untagged(batch, partition), self.task.job.keys)
                for key, row in initial:  # sorted first: before any input record
                    operator.process_initial(key, row)
                initial_rows += len(initial)
                yield from run.feed(rows) if rows.num_rows else run.drain()
            mark = run.watermarks.check_now()
            if operator.carries_records:
                # finish what runs in parallel, carry the hot keys' chains and hold the
                # watermark back; without rows the partition runs to finish what it carried
                operator.drain(chains_only=first is not None)
            elif mark is not None:
                operator.process_watermark(Watermark(mark))
            run.samples.sample(operator, run.rows_in)
            save_watermarks(directory, self.batch_id, run.watermarks)
            handle = operator.snapshot(self.batch_id, directory.location)
            yield from run.drain()
        except BaseException:
            run.__exit__(None, None, None)
            raise
        held_back = run.watermarks.current > operator.watermark
        if self.task.keep:
            _KEPT[(self.task.token, self.partitions, partition)] = (run, handle)
        else:
            run.__exit__(None, None, None)
        state.prune(
            partition, self.partitions, self.era_start, self.task.job.config.checkpoints_retained
        )
        restored = [s.checkpoint_id for s in sources]
        yield run.metrics_batch(
            batch_id=self.batch_id,
            restored_from=None if not restored or kept else max(restored),
            kept_operator=kept,
            initial_rows=initial_rows,
            held_watermark=held_back,
        )

    def _operator(self, partition: int, sources: list[CheckpointHandle]) -> tuple[Any, bool]:
        """The partition's live run at ``sources``: a kept one, else a restored one."""
        key = (self.task.token, self.partitions, partition)
        for other in [k for k in _KEPT if k[0] != self.task.token]:  # a finished query's
            _KEPT.pop(other)[0].__exit__(None, None, None)
        kept = _KEPT.pop(key, None)
        if kept is not None:
            run, holds = kept
            if sources == [holds]:
                return run, True
            run.__exit__(None, None, None)
        owned = key_group_range_for(self.task.state.max_parallelism, self.partitions, partition)
        run = PartitionRun(self.task.job, partition, key_group_range=owned).__enter__()
        try:
            if sources:
                run.operator.restore(sources)
                load_watermarks(sources, run.watermarks)
            else:
                run.operator.open()
        except BaseException:
            run.__exit__(None, None, None)
            raise
        return run, False
