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
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from aec.checkpoint import CheckpointStore
from aec.checkpoint.storage import is_uri
from aec.config import AecConfig
from aec.state.backend import BackendSpec, StateBackend
from aec.state.memory import MemorySpec
from spark_glue.initial_state import InitialState, leading
from spark_glue.keyed import (
    OrderLike,
    SchemaLike,
    arrange,
    order_list,
    output_of,
    persisted_result,
    plan_job,
)
from spark_glue.metrics import carries_work, log_line, merge
from spark_glue.partition import PartitionJob
from spark_glue.raw_frame import _METRICS, _STREAM
from spark_glue.routing import ROUTE, tag
from spark_glue.session_conf import conf_flag, conf_value, is_connect, runs_on_one_machine
from spark_glue.stream_state import (
    Layout,
    StateStore,
    batch_ids,
    locations,
    relative_names,
    verify_history,
)
from spark_glue.stream_task import StreamTask, store_environment
from spark_glue.workers import carried, check_reachable

_LOG = logging.getLogger("aec.stream")  # one INFO line per micro-batch


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
    metrics_listener: Callable[[int, dict[str, Any]], Any] | None = None,
    initial_state: DataFrame | None = None,
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
        metrics_listener: ``metrics_listener(batch_id, metrics)``, called on the driver
            (on Connect: in the server's ``foreachBatch`` process) after each
            micro-batch's sink returned, with the partitions' metrics merged
            (``spark_glue.metrics.merge``: counters of the micro-batch summed, Flink's
            AEC gauges ``num_in_flight_records``, ``active_buffer_size``,
            ``blocking_buffer_size``, ``num_blocking_keys`` summed, the histograms
            ``batch_size``, ``state_request_latency_s``, ``record_latency_s`` as
            ``{"count", "p50", "p95", "p99", "max"}``, ``hot_keys`` the 10 keys with
            the most blocked records as ``[(key, blocked), ...]``,
            ``checkpoint_pending_records``, ``checkpoint_pause_s``, ...). An error it
            raises fails the micro-batch. Each micro-batch is also logged as one
            INFO line on the logger ``aec.stream``.
        initial_state: a batch DataFrame with the stream's key columns (of the same
            types): on the first start only (no checkpoint yet), each of its rows is
            passed, as a dict, to ``function.process_initial_state(row, ctx)`` with
            its key as the current key, before any input (Spark's
            ``handleInitialState``). Read once when the query starts (collected to
            the driver); ignored when the location holds a checkpoint.

    Returns:
        The started ``StreamingQuery``. A failure in a micro-batch (user code,
        backend, sink) stops it; ``query.exception()`` has the error, and
        restarting with the same ``checkpoint_location`` re-runs that micro-batch.

    Raises:
        TypeError, ValueError: on the driver, for bad arguments (those of
            ``process_keyed``, plus: not a streaming DataFrame, no
            ``checkpoint_location`` or an unresolvable URI scheme, a sink or
            ``metrics_listener`` that is not callable, an ``initial_state`` that does
            not fit the stream or a function without ``process_initial_state``, key columns or ``max_parallelism`` different from the
            checkpoint's, ``num_partitions > max_parallelism``, state without Spark's
            checkpoint, speculative execution on).
    """
    if not isinstance(stream_df, DataFrame) or not stream_df.isStreaming:
        raise TypeError("process_keyed_stream needs a streaming DataFrame (spark.readStream...)")
    check_stream_arguments(checkpoint_location, sink, trigger, metrics_listener)
    order_by = order_list(order_by)
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
        order_by=order_by,
    )
    if initial_state is not None:
        InitialState.check(initial_state, stream_df, job.keys, function)

    def arranged(routed: DataFrame, partitions: int, first_start: bool) -> DataFrame:
        return arrange(
            routed, [ROUTE], order_by, partitions, leading=leading() if first_start else ()
        )

    return start_stream(
        stream_df, job, job.keys, arranged, num_partitions=num_partitions,
        checkpoint_location=checkpoint_location,
        spark_checkpoint_location=spark_checkpoint_location, sink=sink, trigger=trigger,
        metrics_listener=metrics_listener, initial_state=initial_state,
    )  # fmt: skip


def check_stream_arguments(
    checkpoint_location: Any, sink: Any, trigger: Any, metrics_listener: Any
) -> None:
    """The driver's checks of the streaming-only arguments (see ``process_keyed_stream``).

    Raises TypeError / ValueError naming the argument."""
    locations(checkpoint_location, None)
    if not callable(sink):
        raise TypeError(f"sink must be callable as sink(batch_df, batch_id), got {sink!r}")
    if metrics_listener is not None and not callable(metrics_listener):
        raise TypeError(
            "metrics_listener must be callable as metrics_listener(batch_id, metrics), got "
            f"{metrics_listener!r}"
        )
    if trigger is not None and not isinstance(trigger, Mapping):
        raise TypeError(
            f"trigger must be a mapping of DataStreamWriter.trigger arguments, got {trigger!r}"
        )


def start_stream(
    stream_df: DataFrame,
    job: PartitionJob,
    layout_keys: list[str],
    arranged: Callable[[DataFrame, int, bool], DataFrame],
    *,
    num_partitions: int | None,
    checkpoint_location: str | os.PathLike[str],
    spark_checkpoint_location: str | os.PathLike[str] | None,
    sink: Callable[[DataFrame, int], Any],
    trigger: Mapping[str, Any] | None,
    metrics_listener: Callable[[int, dict[str, Any]], Any] | None,
    initial_state: DataFrame | None = None,
) -> StreamingQuery:
    """Start the ``foreachBatch`` query running ``job`` per micro-batch over
    ``stream_df`` (arguments checked by the caller): the state layout is checked
    against ``layout_keys``; each micro-batch is routed by key group (``job.keys``)
    and ``arranged(routed, partitions, first_start)`` shuffles and sorts it (the
    arrival order; ``first_start``: the initial state's rows lead). ``initial_state``
    (checked by the caller) is read only when the location holds no state yet.

    Raises ValueError (on the driver) as ``process_keyed_stream`` documents."""
    state_location, spark_root = locations(checkpoint_location, spark_checkpoint_location)
    spark = stream_df.sparkSession
    if conf_flag(spark, "spark.speculation"):
        raise ValueError(
            "process_keyed_stream needs spark.speculation=false: two attempts of one "
            "partition would write the same checkpoint"
        )
    max_parallelism = job.config.max_parallelism
    state = StateStore(state_location, max_parallelism)
    if not is_uri(state_location) and (is_connect(spark) or not runs_on_one_machine(spark)):
        check_reachable(spark, state_location, "process_keyed_stream's checkpoint_location")
    stored = Layout.load(state.store())
    if not is_connect(spark):  # a Connect server's Spark checkpoint is on its own machine
        next_batch = _next_batch(spark_root)
        if next_batch is not None:
            verify_history(state_location, stored, next_batch, None, spark_root)
    kinds = [key_kind(stream_df.schema[k].dataType) for k in job.keys]
    layout = _open_layout(
        state, stored, layout_keys, kinds, None if is_connect(spark) else spark_root
    )
    partitions = (
        num_partitions
        or layout.partitions
        or int(cast(str, conf_value(spark, "spark.sql.shuffle.partitions", "200")))
    )
    if partitions > max_parallelism:
        raise ValueError(
            f"num_partitions={partitions} exceeds max_parallelism={max_parallelism}: a "
            "partition owns at least one key group"
        )
    task = StreamTask(job, state, uuid.uuid4().hex, keep=isinstance(job.spec, MemorySpec))
    keys, store = job.keys, state.store()
    initial = None
    if initial_state is not None and (stored is None or stored.may_start_empty()):
        initial = InitialState.read(initial_state)  # else ignored, as Spark does
    caller_environment = store_environment()  # this process's, for the micro-batches'

    def foreach_batch(batch_df: DataFrame, batch_id: int) -> None:
        # On Spark Connect this runs in a Python process of the server, not the caller's:
        # the store variables it lacks come from the caller, as they do on executors.
        for name, value in caller_environment.items():
            os.environ.setdefault(name, value)
        verify_history(state.location, layout, batch_id, None, spark_root)  # as stored
        if layout.enter(batch_id, partitions):
            layout.save(store)
        era = len(layout.history) - 1
        sources = {}
        for partition in range(partitions):  # clear a failed attempt's checkpoints first
            state.clear_attempt(partition, partitions, batch_id)
            sources[partition] = state.sources(layout.history, era, partition, batch_id)
        planned = {p: relative_names(state, handles) for p, handles in sources.items()}
        verify_history(state.location, layout, batch_id, planned, spark_root)
        pending = layout.pending(batch_id)
        first_start = initial is not None and not any(sources.values())  # no state yet
        frame = initial.with_rows(batch_df, keys) if initial is not None and first_start else batch_df
        routed = tag(frame, keys, max_parallelism, partitions)
        run = task.for_batch(
            batch_id, partitions, layout.history[-1][0], sources, store_environment(),
            frozenset(pending),
        )  # fmt: skip
        mapped = arranged(routed, partitions, first_start).mapInArrow(run, job.layout.raw)
        result = persisted_result(mapped, job.layout)
        raw = output_of(result).raw
        try:
            # every partition runs (and snapshots) once, whatever the sink reads; the
            # metrics rows say which partitions took chk-<batch_id>, and which carry work
            rows = raw.filter(F.col(_STREAM) == "metrics").select(_METRICS).collect()
            metrics = [json.loads(row[0]) for row in rows]
            snapshotted = {m["partition"]: carries_work(m) for m in metrics}
            layout.finish(store, batch_id, planned, snapshotted, pending)
            sink(result, batch_id)
            merged = merge(batch_id, metrics)
            _LOG.info(log_line(merged))
            if metrics_listener is not None:
                metrics_listener(batch_id, merged)
        finally:
            raw.unpersist()

    writer = stream_df.writeStream.foreachBatch(carried(spark, foreach_batch)).option(
        "checkpointLocation", spark_root
    )
    if trigger is not None:
        writer = writer.trigger(**dict(trigger))
    return writer.start()


# -- driver: arguments and the state layout ------------------------------------------------------
def key_kind(data_type: T.DataType) -> str:
    """The kind of values a key column of ``data_type`` gives: keys of one kind that
    are equal share a key group (``aec.keygroups``: ``1``, ``1.0`` and ``True`` do), keys
    of two kinds never do, so a restart keyed by another kind would not find its state."""
    if isinstance(data_type, (T.NumericType, T.BooleanType)):
        return "number"
    return str(data_type.simpleString())


def _open_layout(
    state: StateStore, layout: Layout | None, keys: list[str], kinds: list[str],
    spark_root: str | None,
) -> Layout:  # fmt: skip
    """The stored layout, checked against this query (key columns ``keys`` of
    ``kinds``), or a new one (saved at the first micro-batch). ``spark_root``: Spark's
    checkpoint when this process can read it (None: a Connect server's)."""
    store = state.store()
    if layout is None:
        return Layout(keys, state.max_parallelism, kinds=kinds)
    if layout.keys != keys:
        raise ValueError(
            f"key columns {keys} but the state in {store.location} is keyed by {layout.keys}"
        )
    if layout.kinds is not None and layout.kinds != kinds:
        raise ValueError(
            f"key columns {keys} are of kinds {kinds} but the state in {store.location} was "
            f"keyed by kinds {layout.kinds}: keys of another kind fall in other key groups, "
            "so the state would not be found (cast the key columns back, or start a new "
            "checkpoint_location)"
        )
    if layout.max_parallelism != state.max_parallelism:
        raise ValueError(
            f"config.max_parallelism={state.max_parallelism} but the state in "
            f"{store.location} has {layout.max_parallelism} key groups (fixed for the life "
            "of a checkpoint, as in Flink)"
        )
    if (
        spark_root is not None
        and not is_uri(spark_root)
        and not _has_entries(os.path.join(spark_root, "offsets"))
        and _has_checkpoints(store)
    ):
        raise ValueError(
            f"{store.location} holds state but Spark's checkpoint {spark_root} has no "
            "micro-batch: it was deleted or moved; restore it or use a new checkpoint_location"
        )
    return layout


def _next_batch(spark_root: str) -> int | None:
    """The micro-batch Spark will run next on a local checkpoint (the newest
    uncommitted one in ``offsets/``, else the one after the newest in ``commits/``),
    or None when that cannot be read here (a URI) or nothing ran yet."""
    if is_uri(spark_root):
        return None
    offsets = batch_ids(os.path.join(spark_root, "offsets"))
    commits = batch_ids(os.path.join(spark_root, "commits"))
    if offsets and (not commits or offsets[-1] > commits[-1]):
        return offsets[-1]
    return commits[-1] + 1 if commits else None


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

