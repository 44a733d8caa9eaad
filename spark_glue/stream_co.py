"""``process_keyed_co_stream``: a ``KeyedCoProcessFunction`` over two Structured
Streaming queries' rows, with ``process_keyed_stream``'s state handling.

The two streams become one (``keyed_co.union_frame``: a streaming union, so a
micro-batch holds the new rows of both sides); each micro-batch is routed by key
group and sorted in the two-input arrival order (``keyed_co.arranged``: each side
in its order, merged by that value, ties left first), and each partition's
``KeyedCoProcessOperator`` restores its state, processes the rows, ends the
micro-batch with one more watermark per input, and snapshots: exactly-once state,
rescaling on restart and state on object stores exactly as ``process_keyed_stream``
(``spark_glue.stream``, ``docs/streaming.md``). Each checkpoint holds both inputs'
watermarks, and the watermark generators' progress is saved per input.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from aec.config import AecConfig
from aec.functions import KeyedCoProcessFunction
from aec.state.backend import BackendSpec, StateBackend
from spark_glue.keyed import SchemaLike
from spark_glue.keyed_co import ColumnPair, arranged, plan_co
from spark_glue.routing import ROUTE
from spark_glue.stream import check_stream_arguments, start_stream


def process_keyed_co_stream(
    left_stream: DataFrame,
    right_stream: DataFrame,
    function: KeyedCoProcessFunction,
    key: ColumnPair,
    output_schema: SchemaLike,
    *,
    checkpoint_location: str | os.PathLike[str],
    sink: Callable[[DataFrame, int], Any],
    timestamp: ColumnPair | None = None,
    watermark_delay: float | dt.timedelta | None = None,
    order_by: ColumnPair | None = None,
    watermark_interval: int = 1000,
    backend: StateBackend | BackendSpec | None = None,
    config: AecConfig | None = None,
    num_partitions: int | None = None,
    side_outputs: Mapping[str, SchemaLike] | None = None,
    trigger: Mapping[str, Any] | None = None,
    spark_checkpoint_location: str | os.PathLike[str] | None = None,
    metrics_listener: Callable[[int, dict[str, Any]], Any] | None = None,
) -> StreamingQuery:
    """Start a streaming query running ``function`` per key over two streams:
    ``left_stream``'s rows are input 1, ``right_stream``'s input 2.

    The arguments are ``process_keyed_co``'s (per micro-batch: the arrival order
    inside one; rows of later micro-batches arrive later) and
    ``process_keyed_stream``'s (``checkpoint_location``, ``sink``,
    ``num_partitions`` (a different one on restart rescales the state), ``trigger``,
    ``spark_checkpoint_location``, ``metrics_listener``). Watermarks: per input, periodic as in
    ``process_keyed_co`` and continuing across micro-batches, plus one per input at
    the end of every micro-batch if it advances; the operator's is their minimum, so
    an input that has sent no row holds back every timer.

    Returns the started ``StreamingQuery`` (see ``process_keyed_stream``).

    Raises:
        TypeError, ValueError: on the driver: a side that is not a streaming DataFrame,
            and the errors of ``process_keyed_co`` and ``process_keyed_stream`` (a
            key, timestamp or order column missing on one side names the side and
            the column; a checkpoint location keyed by other columns is refused).
    """
    for name, frame in (("left_stream", left_stream), ("right_stream", right_stream)):
        if not isinstance(frame, DataFrame) or not frame.isStreaming:
            raise TypeError(
                f"process_keyed_co_stream needs a streaming DataFrame as {name} "
                "(spark.readStream...)"
            )
    check_stream_arguments(checkpoint_location, sink, trigger, metrics_listener)
    job, union, sides = plan_co(
        left_stream, right_stream, function, key, output_schema, timestamp=timestamp,
        watermark_delay=watermark_delay, order_by=order_by,
        watermark_interval=watermark_interval, backend=backend, config=config,
        num_partitions=num_partitions, side_outputs=side_outputs,
        name="process_keyed_co_stream",
    )  # fmt: skip
    layout_keys = [f"{side.name}:{column}" for side in sides for column in side.keys]
    return start_stream(
        union, job, layout_keys, lambda routed, n, _: arranged(routed, [ROUTE], n),
        num_partitions=num_partitions, checkpoint_location=checkpoint_location,
        spark_checkpoint_location=spark_checkpoint_location, sink=sink, trigger=trigger,
        metrics_listener=metrics_listener,
    )  # fmt: skip
