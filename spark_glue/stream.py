"""``process_keyed_stream``: a ``KeyedProcessFunction`` over a Structured Streaming query.

Each micro-batch goes through ``foreachBatch``: the driver repartitions it by key
into a fixed number of partitions, and ``mapInArrow`` runs one
``aec.KeyedProcessOperator`` per partition (the code of ``process_keyed``:
``spark_glue.keyed``). Partition ``p`` keeps its state as aec checkpoints under
``checkpoint_location/state/partition-<p>/chk-<batch id>``: a partition restores
its latest checkpoint older than the batch, processes the batch's rows, takes
``chk-<batch id>`` and hands the outputs to the sink. A micro-batch that Spark
runs again after a failure (same batch id, same rows) first deletes the
``chk-<batch id>`` the failed attempt may have left, so it starts from the same
state and computes the same outputs and state: exactly-once state. Decisions
and limits: ``docs/streaming.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from aec.checkpoint import CheckpointHandle, latest_checkpoint
from aec.config import AecConfig
from aec.elements import Watermark
from aec.state.backend import BackendSpec, StateBackend
from spark_glue.keyed import (
    OrderLike,
    SchemaLike,
    arrange,
    output_of,
    persisted_result,
    plan_job,
)
from spark_glue.partition import PartitionJob, PartitionRun
from spark_glue.watermarks import BoundedOutOfOrderness

_PARTITION = "__aec_partition"  # pmod(hash(keys), n): Spark's own hash partitioning
_LAYOUT = "layout.json"
_KEEP = 2  # checkpoints kept per partition: the newest and the base of its replay
_FORMAT = 1


def process_keyed_stream(
    stream_df: DataFrame,
    function: Any,
    key: str | Sequence[str],
    output_schema: SchemaLike,
    *,
    checkpoint_location: str | os.PathLike[str],
    sink: Callable[[DataFrame, int], Any],
    timestamp: str | None = None,
    watermark_delay: float | dt.timedelta | None = None,
    order_by: OrderLike | None = None,
    watermark_interval: int = 1000,
    backend: StateBackend | BackendSpec | None = None,
    config: AecConfig | None = None,
    num_partitions: int | None = None,
    side_outputs: Mapping[str, SchemaLike] | None = None,
    trigger: Mapping[str, Any] | None = None,
) -> StreamingQuery:
    """Start a streaming query that runs ``function`` per key over ``stream_df``.

    The arguments shared with ``process_keyed`` mean the same, per micro-batch
    (``order_by``: the arrival order inside a micro-batch; rows of later
    micro-batches arrive later). Differences:

    Args:
        stream_df: a streaming DataFrame (``spark.readStream...``).
        checkpoint_location: a directory every executor and the driver can reach
            through the file system (local, or a shared mount). Spark's own
            checkpoint goes to ``<it>/spark``, the partitions' state to
            ``<it>/state``. Restart a query with the same location to continue.
        sink: ``sink(batch_df, batch_id)``, called on the driver once per
            micro-batch (again for a replayed one) with the main output as a
            batch DataFrame of ``output_schema``; ``spark_glue.side_output(batch_df,
            tag)`` and ``partition_metrics(batch_df)`` work on it during the call.
            The operator has already run when the sink is called.
        watermark_delay: with ``watermark_interval``, periodic watermarks as in
            ``process_keyed``, continuing across micro-batches, plus one at the end
            of every micro-batch (``max event time - watermark_delay`` if that
            advances). There is no final ``Watermark(inf)``: the stream never ends.
        num_partitions: the number of state partitions; None: the number stored
            in ``checkpoint_location`` by an earlier run, else
            ``spark.sql.shuffle.partitions``. Fixed for the life of the
            checkpoint: a different number is refused.
        trigger: keyword arguments of ``DataStreamWriter.trigger`` (e.g.
            ``{"processingTime": "5 seconds"}`` or ``{"availableNow": True}``);
            None: Spark's default (a micro-batch as soon as the last one ended).

    Returns:
        The started ``StreamingQuery``. A failure in a micro-batch (user code,
        backend, sink) stops it; ``query.exception()`` has the error, and
        restarting with the same ``checkpoint_location`` re-runs that micro-batch.

    Raises:
        TypeError, ValueError: on the driver, for bad arguments (those of
            ``process_keyed``, plus: not a streaming DataFrame, no or a non-local
            ``checkpoint_location``, a sink that is not callable, ``num_partitions``
            or key columns different from the checkpoint's, state without Spark's
            checkpoint, speculative execution on).
    """
    if not isinstance(stream_df, DataFrame) or not stream_df.isStreaming:
        raise TypeError("process_keyed_stream needs a streaming DataFrame (spark.readStream...)")
    root = _local_directory(checkpoint_location)
    if not callable(sink):
        raise TypeError(f"sink must be callable as sink(batch_df, batch_id), got {sink!r}")
    if trigger is not None and not isinstance(trigger, Mapping):
        raise TypeError(
            f"trigger must be a mapping of DataStreamWriter.trigger arguments, got {trigger!r}"
        )
    job = plan_job(
        stream_df,
        function,
        key,
        output_schema,
        timestamp=timestamp,
        watermark_delay=watermark_delay,
        watermark_interval=watermark_interval,
        backend=backend,
        config=config,
        num_partitions=num_partitions,
        side_outputs=side_outputs,
        name="process_keyed_stream",
    )
    spark = stream_df.sparkSession
    if spark.sparkContext.getConf().get("spark.speculation", "false").lower() == "true":
        raise ValueError(
            "process_keyed_stream needs spark.speculation=false: two attempts of one "
            "partition would write the same checkpoint"
        )
    state_root = os.path.join(root, "state")
    spark_root = os.path.join(root, "spark")
    partitions = _fix_layout(state_root, spark_root, job.keys, num_partitions, spark)
    task = _StreamTask(job, state_root, partitions)
    keys = job.keys

    def foreach_batch(batch_df: DataFrame, batch_id: int) -> None:
        for partition in range(partitions):  # clear a failed attempt's checkpoints first
            _base_checkpoint(_partition_dir(state_root, partition), batch_id)
        tagged = {_PARTITION: F.pmod(F.hash(*keys), F.lit(partitions))}
        arranged = arrange(batch_df, keys, order_by, partitions, extra=tagged)
        result = persisted_result(
            arranged.mapInArrow(task.for_batch(batch_id), job.layout.raw), job.layout
        )
        raw = output_of(result).raw
        try:
            raw.count()  # every partition runs (and snapshots) once, whatever the sink reads
            sink(result, batch_id)
        finally:
            raw.unpersist()

    writer = stream_df.writeStream.foreachBatch(foreach_batch).option(
        "checkpointLocation", spark_root
    )
    if trigger is not None:
        writer = writer.trigger(**dict(trigger))
    return writer.start()


# -- driver: arguments and the state layout ------------------------------------------------------
def _local_directory(location: Any) -> str:
    if location is None or not isinstance(location, (str, os.PathLike)) or not os.fspath(location):
        raise ValueError(
            "process_keyed_stream needs checkpoint_location: a directory for Spark's "
            f"checkpoint and the partitions' state, got {location!r}"
        )
    path = os.fspath(location)
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        raise ValueError(
            f"checkpoint_location must be a file system path (local or a shared mount) that "
            f"the driver and every executor can reach, got {path!r}"
        )
    return os.path.abspath(path)


def _fix_layout(
    state_root: str,
    spark_root: str,
    keys: list[str],
    requested: int | None,
    spark: Any,
) -> int:
    """The number of state partitions, recorded in ``state/layout.json`` on the first
    start and checked on every later one."""
    path = os.path.join(state_root, _LAYOUT)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            stored = json.load(handle)
        if requested is not None and requested != stored["num_partitions"]:
            raise ValueError(
                f"num_partitions={requested} but the state in {state_root} has "
                f"{stored['num_partitions']} partitions (fixed for the life of a checkpoint)"
            )
        if stored["keys"] != keys:
            raise ValueError(
                f"key columns {keys} but the state in {state_root} is keyed by {stored['keys']}"
            )
        if not _has_entries(os.path.join(spark_root, "offsets")) and _has_checkpoints(
            state_root, stored["num_partitions"]
        ):
            raise ValueError(
                f"{state_root} holds state but Spark's checkpoint {spark_root} has no "
                "micro-batch: it was deleted or moved; restore it or use a new checkpoint_location"
            )
        return int(stored["num_partitions"])
    partitions = requested or int(spark.conf.get("spark.sql.shuffle.partitions"))
    os.makedirs(state_root, exist_ok=True)
    staging = path + ".tmp"
    with open(staging, "w", encoding="utf-8") as handle:
        json.dump({"format": _FORMAT, "num_partitions": partitions, "keys": keys}, handle)
    os.replace(staging, path)
    return partitions


def _has_entries(directory: str) -> bool:
    try:
        return any(not name.startswith(".") for name in os.listdir(directory))
    except FileNotFoundError:
        return False


def _has_checkpoints(state_root: str, partitions: int) -> bool:
    return any(_checkpoint_ids(_partition_dir(state_root, p)) for p in range(partitions))


# -- per partition: checkpoint files ---------------------------------------------------------------
def _partition_dir(state_root: str, partition: int) -> str:
    return os.path.join(state_root, f"partition-{partition}")


def _checkpoint_ids(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[4:]) for n in names if n.startswith("chk-") and n[4:].isdigit())


def _watermarks_file(directory: str, checkpoint_id: int) -> str:
    return os.path.join(directory, f"watermarks-{checkpoint_id}.json")


def _delete_checkpoint(directory: str, checkpoint_id: int) -> None:
    # raise if it cannot go: a surviving manifest would make it the base of a replay
    path = os.path.join(directory, f"chk-{checkpoint_id}")
    if os.path.lexists(path):
        shutil.rmtree(path)
    try:
        os.remove(_watermarks_file(directory, checkpoint_id))
    except FileNotFoundError:
        pass


def _base_checkpoint(directory: str, batch_id: int) -> CheckpointHandle | None:
    """Make ``directory`` ready for micro-batch ``batch_id``; the checkpoint to restore.

    Deletes ``chk-<batch_id>`` (left by a failed attempt of this batch) and any
    abandoned staging directory; the base is then the newest complete checkpoint,
    all older than the batch (None: the partition starts empty).

    Raises:
        RuntimeError: a checkpoint newer than ``batch_id`` exists, so Spark runs
            a micro-batch this state has gone past (its checkpoint was reset).
    """
    ids = _checkpoint_ids(directory)
    if ids and ids[-1] > batch_id:
        raise RuntimeError(
            f"{directory} has checkpoint {ids[-1]} but Spark runs micro-batch {batch_id}: "
            "Spark's checkpoint is older than the state (reset or replaced); refusing to "
            "rewind the state"
        )
    if batch_id in ids:
        _delete_checkpoint(directory, batch_id)
    try:
        for name in os.listdir(directory):
            if name.startswith(".chk-") and ".staging-" in name:
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    except FileNotFoundError:
        pass
    return latest_checkpoint(directory)


def _prune(directory: str) -> None:
    """Keep the newest ``_KEEP`` checkpoints (a replay of the newest batch restores the
    one before it)."""
    for checkpoint_id in _checkpoint_ids(directory)[:-_KEEP]:
        _delete_checkpoint(directory, checkpoint_id)


def _save_watermarks(directory: str, checkpoint_id: int, watermarks: BoundedOutOfOrderness) -> None:
    """The generator's progress beside ``chk-<id>``, written before it (the checkpoint's
    rename commits both)."""
    path = _watermarks_file(directory, checkpoint_id)
    data = {"max_timestamp": watermarks.max_timestamp, "current": watermarks.current}
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle)  # infinities as -Infinity, which json.load reads back
    os.replace(path + ".tmp", path)


def _load_watermarks(directory: str, checkpoint_id: int, watermarks: BoundedOutOfOrderness) -> None:
    path = _watermarks_file(directory, checkpoint_id)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise RuntimeError(
            f"{path} is missing: checkpoint {checkpoint_id} cannot continue its watermarks"
        ) from None
    watermarks.max_timestamp = float(data["max_timestamp"])
    watermarks.current = float(data["current"])


# -- per partition: one micro-batch ------------------------------------------------------------
@dataclass(frozen=True)
class _StreamTask:
    """What a partition needs for any micro-batch; ``for_batch`` binds the batch id."""

    job: PartitionJob
    state_root: str
    partitions: int

    def for_batch(self, batch_id: int) -> Callable[[Iterator[pa.RecordBatch]], Any]:
        return _BatchTask(self, batch_id).run


@dataclass(frozen=True)
class _BatchTask:
    task: _StreamTask
    batch_id: int

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: restore, process the rows, snapshot, emit.

        A partition without rows does nothing: its newest checkpoint stays its
        state (the base of its next micro-batch).
        """
        batches = iter(batches)
        first = next((b for b in batches if b.num_rows), None)
        if first is None:
            return
        partition = _partition_of(first)
        directory = _partition_dir(self.task.state_root, partition)
        os.makedirs(directory, exist_ok=True)
        base = _base_checkpoint(directory, self.batch_id)  # again: a retried task
        with PartitionRun(self.task.job, partition) as run:
            if base is None:
                run.operator.open()
            else:
                run.operator.restore(base)
                _load_watermarks(directory, base.checkpoint_id, run.watermarks)
            yield from run.feed(_without_partition(first, partition))
            for batch in batches:
                if batch.num_rows:
                    yield from run.feed(_without_partition(batch, partition))
            mark = run.watermarks.check_now()
            if mark is not None:
                run.operator.process_watermark(Watermark(mark))
            _save_watermarks(directory, self.batch_id, run.watermarks)
            run.operator.snapshot(self.batch_id, directory)
            yield from run.drain()
        _prune(directory)
        yield run.metrics_batch(
            batch_id=self.batch_id,
            restored_from=None if base is None else base.checkpoint_id,
        )


def _partition_of(batch: pa.RecordBatch) -> int:
    return int(batch.column(_PARTITION)[0].as_py())


def _without_partition(batch: pa.RecordBatch, partition: int) -> pa.RecordBatch:
    """``batch`` without the partition column, after checking every row has ``partition``
    (the rows of one task must be one state partition)."""
    column = batch.column(_PARTITION)
    if not pc.all(pc.equal(column, partition)).as_py():
        raise RuntimeError(
            f"rows of state partitions {sorted(set(column.to_pylist()))} reached one task: "
            "the micro-batch was not hash-partitioned by key as planned"
        )
    return batch.drop_columns([_PARTITION])
