"""One Spark partition's run of a keyed operator, shared by batch and streaming.

``PartitionJob`` is what the driver ships (the pickled function, the backend spec,
the config, the columns); ``PartitionRun`` turns a partition's Arrow batches into
records and watermarks, feeds the operator and writes the raw frame
(``spark_glue.raw_frame``). The caller decides how the operator starts and ends:
``open``/``finish`` for ``process_keyed``, ``restore``/``snapshot`` for
``process_keyed_stream``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import cloudpickle  # type: ignore[import-untyped]  # cloudpickle ships no type hints
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.compute as pc  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark import TaskContext

import aec
from aec.config import AecConfig
from aec.elements import Watermark
from aec.keygroups import KeyGroupRange, key_group_range_for
from aec.state.backend import BackendSpec, StateBackend
from spark_glue.convert import timestamp_seconds
from spark_glue.metrics import GaugeSamples, json_safe_hot_keys, per_batch
from spark_glue.raw_frame import RawLayout, RawWriter
from spark_glue.routing import keys_of, untagged
from spark_glue.watermarks import BoundedOutOfOrderness


@dataclass(frozen=True)
class PartitionJob:
    """Everything one partition needs; pickled into the ``mapInArrow`` closure."""

    function_bytes: bytes
    spec: BackendSpec
    config: AecConfig
    keys: list[str]
    timestamp: str | None
    delay: float
    interval: int
    layout: RawLayout
    partitions: int = 0  # rows routed by key group to this many partitions (0: not routed)
    values: list[str] | None = None  # the columns of each record's dict (None: all of them)

    def make_operator(
        self, function: Any, backend: StateBackend, key_group_range: KeyGroupRange | None
    ) -> Any:
        """The partition's operator (not opened); a two-input job makes its own kind."""
        return aec.KeyedProcessOperator(
            function, backend, self.config, key_group_range=key_group_range
        )

    def watermark_generator(self) -> Any:
        """A fresh generator of the partition's periodic watermarks."""
        return BoundedOutOfOrderness(self.delay, self.interval)

    def resume_watermarks(self, operator: Any, watermarks: Any) -> None:
        """``process_keyed_stream``'s start of a micro-batch: a watermark held back at
        the end of the previous one (records carried by its checkpoint) goes out."""
        held = watermarks.current
        if held > operator.watermark:
            operator.process_watermark(Watermark(held))

    def end_micro_batch(self, operator: Any, watermarks: Any, with_rows: bool) -> None:
        """``process_keyed_stream``'s end of a micro-batch: one more watermark
        (``max event time - delay``) if it advances; an operator whose checkpoint
        carries records finishes what runs in parallel, carries the hot keys' chains
        and holds the watermark back (without rows it runs to finish what it carried)."""
        mark = watermarks.check_now()
        if operator.carries_records:
            operator.drain(chains_only=with_rows)
        elif mark is not None:
            operator.process_watermark(Watermark(mark))

    def holds_watermark(self, operator: Any, watermarks: Any) -> bool:
        """Whether the end of the micro-batch held a watermark back."""
        return bool(watermarks.current > operator.watermark)

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function of ``process_keyed``: input batches in, raw
        batches out; end of input is ``finish()`` (every remaining timer fires).
        Routed input (``spark_glue.routing``): Spark partition ``p`` holds the rows of
        aec partition ``p``, whose operator owns ``key_group_range_for(mp, n, p)``."""
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        owned = None
        if self.partitions:
            owned = key_group_range_for(self.config.max_parallelism, self.partitions, partition)
        with PartitionRun(self, partition, key_group_range=owned) as run:
            # The operator opens at the first input batch: before it arrives the JVM
            # is still reading the shuffle and sorting, which is not the operator's
            # time (its elapsed_s); the partition's wall_s still counts from the start.
            batches = iter(batches)
            first = next(batches, None)
            run.operator.open()
            for batch in itertools.chain([first] if first is not None else [], batches):
                yield from run.feed(untagged(batch, partition) if self.partitions else batch)
            run.operator.finish()
            yield from run.drain()
        yield run.metrics_batch()

    def feed(
        self,
        operator: Any,
        watermarks: BoundedOutOfOrderness,
        batch: pa.RecordBatch,
        samples: GaugeSamples,
        fed: int,
    ) -> None:
        """Feed ``batch``'s rows to ``operator`` as records of this job's key, values
        and timestamp, with the watermarks ``watermarks`` emits between them; ``samples``
        takes the operator's gauges every so many rows (``fed``: rows fed before)."""
        # Columns are converted once per batch (pyarrow), records built with map();
        # watermarks are checked per interval over a slice of event times (the
        # interval's max by pyarrow), not per record: the same watermarks after
        # the same records as feeding on_record one record at a time. The gauges are
        # sampled between slices too (``fed``: records fed before this batch).
        keys = keys_of(batch, self.keys)
        # Rows as dicts cost per column and row (a timestamp column most: a datetime per
        # row); write_keyed's operators name the columns their functions read.
        values = (batch if self.values is None else batch.select(self.values)).to_pylist()
        process = operator.process_fields  # no Record built per row
        rows = len(values)
        timed = self.timestamp is not None
        stamps = timestamp_seconds(batch.column(self.timestamp)) if timed else [None] * rows
        seconds = pa.array(stamps, pa.float64()) if timed else None
        start = 0
        while start < rows:
            step = min(samples.until_next(), watermarks.until_check()) if timed else samples.until_next()
            end = min(rows, start + step)
            rows_now = zip(keys[start:end], values[start:end], stamps[start:end], strict=True)
            for key, value, stamp in rows_now:
                process(key, value, stamp)
            samples.take(operator, end - start, fed + end)  # before a watermark drains
            if seconds is not None:
                mark = watermarks.on_records(
                    end - start, pc.max(seconds.slice(start, end - start)).as_py()
                )
                if mark is not None:
                    operator.process_watermark(Watermark(mark))
            start = end


class PartitionRun:
    """One partition's operator with its backend, watermark generator and writer.

    A context manager: entering builds the backend from the job's spec and the
    operator (not opened: the caller opens, or restores, it); leaving closes the
    operator, then the backend (the operator leaves closing its backend to the
    owner). ``feed`` and ``drain`` yield raw batches; ``metrics_batch`` the
    partition's metrics row, with ``extra`` entries.
    """

    def __init__(
        self,
        job: PartitionJob,
        partition: int,
        key_group_range: KeyGroupRange | None = None,
        writer: Any = None,
    ) -> None:
        self.job = job
        self.partition = partition
        self.key_group_range = key_group_range
        self.started = time.perf_counter()
        self.cpu_started = time.process_time()
        # RawWriter by default; write_keyed passes a spark_glue.parquet_out.ParquetStreams
        self.writer: Any = writer if writer is not None else RawWriter(job.layout)
        self.watermarks = job.watermark_generator()
        self.rows_in = 0
        self.samples = GaugeSamples()
        self.before: dict[str, Any] = {}  # a kept operator's metrics as the micro-batch began
        self.backend: StateBackend | None = None
        self.operator: Any = None
        self.final_metrics: dict[str, Any] = {}

    def __enter__(self) -> PartitionRun:
        self.backend = self.job.spec.build(self.partition)
        try:
            self.operator = self.job.make_operator(
                cloudpickle.loads(self.job.function_bytes), self.backend, self.key_group_range
            )
        except BaseException:
            self.backend.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.final_metrics = dict(self.operator.metrics)
        try:
            self.operator.close()
        finally:
            cast(StateBackend, self.backend).close()  # built by __enter__

    def next_batch(self) -> None:
        """Start counting a new micro-batch on a kept operator (``process_keyed_stream``
        keeps a partition's live operator between micro-batches): fresh writer,
        row count and wall clock; the operator and watermark generator go on."""
        self.started = time.perf_counter()
        self.writer = RawWriter(self.job.layout)
        self.rows_in = 0
        self.samples = GaugeSamples()
        self.before = dict(self.operator.metrics)  # its counters count on across micro-batches
        self.operator.controller.new_metrics_window()  # its histograms and hot keys start afresh
        self.watermarks = self.watermarks.restarted()  # the count of watermark_interval

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Process one input batch (records and periodic watermarks); its outputs."""
        fed = self.rows_in
        self.rows_in += batch.num_rows
        self.job.feed(self.operator, self.watermarks, batch, self.samples, fed)
        yield from self.writer.drain(self.operator)

    def drain(self) -> Iterator[pa.RecordBatch]:
        """Raw batches for everything emitted since the last drain."""
        yield from self.writer.drain(self.operator)

    def metrics_batch(self, **extra: Any) -> pa.RecordBatch:
        """The metrics row; call after leaving the context (or on a kept operator)."""
        return cast(pa.RecordBatch, self.writer.metrics_batch(self.metrics(**extra)))

    def metrics(self, **extra: Any) -> dict[str, Any]:
        """The operator's metrics and the glue's (see ``partition_metrics``): counters
        of this run (of this micro-batch for an operator kept from the previous one,
        ``spark_glue.metrics``), ``hot_keys`` JSON-safe, ``gauge_samples`` the sampled
        gauges (``spark_glue.metrics.SAMPLE_FIELDS`` per sample)."""
        metrics = per_batch(self.final_metrics or self.operator.metrics, self.before)
        metrics.update(
            partition=self.partition,
            rows_in=self.rows_in,
            watermarks_in=self.watermarks.emitted,
            main_rows=self.writer.main_rows,
            side_rows=self.writer.side_rows,
            wall_s=time.perf_counter() - self.started,
            cpu_s=time.process_time() - self.cpu_started,
            hot_keys=json_safe_hot_keys(metrics.get("hot_keys", ())),
            gauge_samples=self.samples.points,
            **extra,
        )
        return metrics
