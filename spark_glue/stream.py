"""``process_keyed_stream``: a ``KeyedProcessFunction`` over a Structured Streaming query.

Each micro-batch goes through ``foreachBatch``: the driver routes its rows by key
group into ``num_partitions`` partitions (``spark_glue.routing``: partition ``p``
of ``n`` owns ``key_group_range_for(max_parallelism, n, p)``), and ``mapInArrow``
runs one ``aec.KeyedProcessOperator`` with that key-group range per partition
(``spark_glue.stream_task``). Partition state is kept as aec checkpoints under
``<checkpoint_location>/state`` (a local path or an object-store URI;
``spark_glue.stream_state``): a partition restores its state as of the batch,
processes the batch's rows, takes ``chk-<batch id>`` and hands the outputs to the
sink. A micro-batch that Spark runs again after a failure (same batch id, same
rows) first deletes the ``chk-<batch id>`` the failed attempt may have left, so it
starts from the same state and computes the same outputs and state: exactly-once
state. A restart with another ``num_partitions`` starts a new era in the layout's
history and each new partition restores the overlapping old partitions' state,
filtered to its key groups. Decisions and limits: ``docs/streaming.md``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from aec.checkpoint import CheckpointStore
from aec.checkpoint.storage import is_uri
from aec.config import AecConfig
from aec.state.backend import BackendSpec, StateBackend
from aec.state.memory import MemorySpec
from spark_glue.keyed import (
    OrderLike,
    SchemaLike,
    arrange,
    output_of,
    persisted_result,
    plan_job,
)
from spark_glue.partition import PartitionJob
from spark_glue.routing import ROUTE, tag
from spark_glue.stream_state import Layout, StateStore
from spark_glue.stream_task import StreamTask, driver_aws_environment


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
    spark_checkpoint_location: str | os.PathLike[str] | None = None,
) -> StreamingQuery:
    """Start a streaming query that runs ``function`` per key over ``stream_df``.

    The arguments shared with ``process_keyed`` mean the same, per micro-batch
    (``order_by``: the arrival order inside a micro-batch; rows of later
    micro-batches arrive later). Differences:

    Args:
        stream_df: a streaming DataFrame (``spark.readStream...``).
        checkpoint_location: where the partitions' state goes (``<it>/state``): a
            directory every executor and the driver reach (local or a shared
            mount), or an object-store URI ``pyarrow.fs`` resolves
            (``s3://bucket/prefix``, ``gs://...``; S3 configured by the AWS
            environment variables). Restart with the same location to continue.
        spark_checkpoint_location: Spark's own query checkpoint (its
            ``checkpointLocation``); None: ``<checkpoint_location>/spark`` for a
            local location, and for a URI a local directory named after the URI
            under the system temp directory (one machine only: on a cluster, pass
            a durable location Spark's file system reaches, e.g. ``hdfs://`` or
            ``s3a://``).
        sink: ``sink(batch_df, batch_id)``, called on the driver once per
            micro-batch (again for a replayed one) with the main output as a
            batch DataFrame of ``output_schema``; ``spark_glue.side_output(batch_df,
            tag)`` and ``partition_metrics(batch_df)`` work on it during the call.
            The operator has already run when the sink is called.
        watermark_delay: with ``watermark_interval``, periodic watermarks as in
            ``process_keyed``, continuing across micro-batches, plus one at the end
            of every micro-batch (``max event time - watermark_delay`` if that
            advances). There is no final ``Watermark(inf)``: the stream never ends.
        num_partitions: the number of state partitions (at most
            ``config.max_parallelism``); None: the number of the last run on
            ``checkpoint_location``, else ``spark.sql.shuffle.partitions``. A
            different number than the last run's rescales the state by key group
            from the next micro-batch on (recorded in ``state/layout.json``).
        trigger: keyword arguments of ``DataStreamWriter.trigger`` (e.g.
            ``{"processingTime": "5 seconds"}`` or ``{"availableNow": True}``);
            None: Spark's default (a micro-batch as soon as the last one ended).

    Returns:
        The started ``StreamingQuery``. A failure in a micro-batch (user code,
        backend, sink) stops it; ``query.exception()`` has the error, and
        restarting with the same ``checkpoint_location`` re-runs that micro-batch.

    Raises:
        TypeError, ValueError: on the driver, for bad arguments (those of
            ``process_keyed``, plus: not a streaming DataFrame, no
            ``checkpoint_location`` or an unresolvable URI scheme, a sink that is not
            callable, key columns or ``max_parallelism`` different from the
            checkpoint's, ``num_partitions > max_parallelism``, state without Spark's
            checkpoint, speculative execution on).
    """
    if not isinstance(stream_df, DataFrame) or not stream_df.isStreaming:
        raise TypeError("process_keyed_stream needs a streaming DataFrame (spark.readStream...)")
    check_stream_arguments(checkpoint_location, sink, trigger)
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
    return start_stream(
        stream_df, job, job.keys, lambda routed, n: arrange(routed, [ROUTE], order_by, n),
        num_partitions=num_partitions, checkpoint_location=checkpoint_location,
        spark_checkpoint_location=spark_checkpoint_location, sink=sink, trigger=trigger,
    )  # fmt: skip


def check_stream_arguments(checkpoint_location: Any, sink: Any, trigger: Any) -> None:
    """The driver's checks of the streaming-only arguments (see ``process_keyed_stream``)."""
    _locations(checkpoint_location, None)
    if not callable(sink):
        raise TypeError(f"sink must be callable as sink(batch_df, batch_id), got {sink!r}")
    if trigger is not None and not isinstance(trigger, Mapping):
        raise TypeError(
            f"trigger must be a mapping of DataStreamWriter.trigger arguments, got {trigger!r}"
        )


def start_stream(
    stream_df: DataFrame,
    job: PartitionJob,
    layout_keys: list[str],
    arranged: Callable[[DataFrame, int], DataFrame],
    *,
    num_partitions: int | None,
    checkpoint_location: str | os.PathLike[str],
    spark_checkpoint_location: str | os.PathLike[str] | None,
    sink: Callable[[DataFrame, int], Any],
    trigger: Mapping[str, Any] | None,
) -> StreamingQuery:
    """Start the ``foreachBatch`` query running ``job`` per micro-batch over
    ``stream_df`` (arguments checked by the caller): the state layout is checked
    against ``layout_keys``; each micro-batch is routed by key group (``job.keys``)
    and ``arranged(routed, partitions)`` shuffles and sorts it (the arrival order)."""
    state_location, spark_root = _locations(checkpoint_location, spark_checkpoint_location)
    spark = stream_df.sparkSession
    if spark.sparkContext.getConf().get("spark.speculation", "false").lower() == "true":
        raise ValueError(
            "process_keyed_stream needs spark.speculation=false: two attempts of one "
            "partition would write the same checkpoint"
        )
    max_parallelism = job.config.max_parallelism
    state = StateStore(state_location, max_parallelism)
    layout = _open_layout(state, layout_keys, spark_root)
    partitions = (
        num_partitions
        or layout.partitions
        or int(cast(str, spark.conf.get("spark.sql.shuffle.partitions")))
    )
    if partitions > max_parallelism:
        raise ValueError(
            f"num_partitions={partitions} exceeds max_parallelism={max_parallelism}: a "
            "partition owns at least one key group"
        )
    task = StreamTask(job, state, uuid.uuid4().hex, keep=isinstance(job.spec, MemorySpec))
    keys, store = job.keys, state.store()

    def foreach_batch(batch_df: DataFrame, batch_id: int) -> None:
        if layout.enter(batch_id, partitions):
            layout.save(store)
        era = len(layout.history) - 1
        sources = {}
        for partition in range(partitions):  # clear a failed attempt's checkpoints first
            state.clear_attempt(partition, partitions, batch_id)
            sources[partition] = state.sources(layout.history, era, partition, batch_id)
        routed = tag(batch_df, keys, max_parallelism, partitions)
        run = task.for_batch(
            batch_id, partitions, layout.history[-1][0], sources, driver_aws_environment()
        )
        mapped = arranged(routed, partitions).mapInArrow(run, job.layout.raw)
        result = persisted_result(mapped, job.layout)
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
def _locations(location: Any, spark_location: Any) -> tuple[str, str]:
    """The state location (path or URI) and Spark's checkpoint location.

    Raises ValueError for a missing location or an unresolvable URI scheme.
    """
    if location is None or not isinstance(location, (str, os.PathLike)) or not os.fspath(location):
        raise ValueError(
            "process_keyed_stream needs checkpoint_location: a directory or object-store URI "
            f"for the partitions' state, got {location!r}"
        )
    text = os.fspath(location)
    root = CheckpointStore.at(text)  # ValueError for a scheme pyarrow.fs cannot resolve
    state = root.child("state").location
    if spark_location is not None:
        return state, os.fspath(spark_location)
    if root.local:
        return state, root.name_of("spark")
    digest = hashlib.sha256(root.location.encode()).hexdigest()[:16]
    return state, os.path.join(tempfile.gettempdir(), "aec-spark-checkpoints", digest)


def _open_layout(state: StateStore, keys: list[str], spark_root: str) -> Layout:
    """The stored layout, checked against this query, or a new one (saved at the
    first micro-batch)."""
    store = state.store()
    layout = Layout.load(store)
    if layout is None:
        return Layout(keys, state.max_parallelism)
    if layout.keys != keys:
        raise ValueError(
            f"key columns {keys} but the state in {store.location} is keyed by {layout.keys}"
        )
    if layout.max_parallelism != state.max_parallelism:
        raise ValueError(
            f"config.max_parallelism={state.max_parallelism} but the state in "
            f"{store.location} has {layout.max_parallelism} key groups (fixed for the life "
            "of a checkpoint, as in Flink)"
        )
    if (
        not is_uri(spark_root)
        and not _has_entries(os.path.join(spark_root, "offsets"))
        and _has_checkpoints(store)
    ):
        raise ValueError(
            f"{store.location} holds state but Spark's checkpoint {spark_root} has no "
            "micro-batch: it was deleted or moved; restore it or use a new checkpoint_location"
        )
    return layout


def _has_entries(directory: str) -> bool:
    try:
        return any(not name.startswith(".") for name in os.listdir(directory))
    except FileNotFoundError:
        return False


def _has_checkpoints(store: CheckpointStore) -> bool:
    return any(
        store.child(name).checkpoint_ids(complete=False)
        for name in store.list_names()
        if name.startswith("partition-")
    )

