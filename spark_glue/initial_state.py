"""Initial state for ``process_keyed_stream`` (Spark's ``handleInitialState`` of
``transformWithState``): rows of a DataFrame loaded into state before any input.

On the driver (``InitialState.check``, ``InitialState.read``): when the query starts
with no checkpoint yet, the DataFrame is read once (collected as Arrow, so this works on classic and
Connect sessions alike: the first micro-batch makes a DataFrame of it again on
whatever session runs ``foreachBatch``). A restart that finds a checkpoint ignores it,
as Spark does.

In the first micro-batch (``with_rows``): each initial row becomes a row of the
micro-batch holding only the key columns and the whole row as a struct in
``__aec_initial`` (null on input rows); the rows are routed with the input and sorted
first within each partition (``LEADING``). A partition (``split``) hands each
initial row to ``KeyedProcessOperator.process_initial`` (the function's
``process_initial_state(row, ctx)``, the row as a dict) before its first input record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.compute as pc  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from aec.functions import KeyedProcessFunction
from spark_glue.routing import keys_of

INITIAL = "__aec_initial"  # the initial-state row as a struct; null on input rows


def leading() -> list[Column]:
    """The sort key that puts initial rows first in a partition."""
    return [F.col(INITIAL).isNull()]


@dataclass(frozen=True)
class InitialState:
    """The initial state read at the query's start: an Arrow table and its schema."""

    table: pa.Table
    schema_json: str  # the DataFrame's Spark schema (StructType.json())

    @staticmethod
    def check(initial_state: Any, stream_df: DataFrame, keys: Sequence[str], function: Any) -> None:
        """Check ``initial_state`` against the stream and the function.

        Raises:
            TypeError: not a batch DataFrame, a key column of another type than the
                stream's, or a function that does not override ``process_initial_state``.
            ValueError: a key column missing from it.
        """
        if not isinstance(initial_state, DataFrame) or initial_state.isStreaming:
            raise TypeError(
                "initial_state must be a batch DataFrame with the stream's key columns, got "
                f"{type(initial_state).__name__}"
            )
        method = getattr(type(function), "process_initial_state", None)
        if method is None or method is KeyedProcessFunction.process_initial_state:
            raise TypeError(
                f"initial_state needs {type(function).__name__}.process_initial_state(row, ctx): "
                "the default ignores every row"
            )
        for key in keys:
            if key not in initial_state.columns:
                raise ValueError(
                    f"initial_state has no key column {key!r} (columns: {initial_state.columns})"
                )
            theirs, ours = initial_state.schema[key].dataType, stream_df.schema[key].dataType
            if theirs != ours:
                raise TypeError(
                    f"initial_state's key column {key!r} is {theirs.simpleString()}, the "
                    f"stream's is {ours.simpleString()}: equal keys must have equal types"
                )

    @staticmethod
    def read(initial_state: DataFrame) -> InitialState:
        """The rows of ``initial_state``, collected (a Spark action)."""
        return InitialState(initial_state.toArrow(), initial_state.schema.json())

    def with_rows(self, batch_df: DataFrame, keys: Sequence[str]) -> DataFrame:
        """``batch_df`` and the initial rows (key columns and ``__aec_initial``; the
        other columns null), as one DataFrame on ``batch_df``'s session."""
        schema = T.StructType.fromJson(json.loads(self.schema_json))
        frame = batch_df.sparkSession.createDataFrame(self.table, schema=schema)
        packed = frame.select(
            *[F.col(k) for k in keys], F.struct(*[F.col(c) for c in frame.columns]).alias(INITIAL)
        )
        return batch_df.unionByName(packed, allowMissingColumns=True)


def split(batch: pa.RecordBatch, keys: list[str]) -> tuple[list[tuple[Any, Any]], pa.RecordBatch]:
    """A routed batch's initial rows as ``(key, row dict)`` and its input rows without
    ``__aec_initial`` (a batch without that column: none, and the batch itself)."""
    if INITIAL not in batch.schema.names:
        return [], batch
    column = batch.column(INITIAL)
    marked = pc.is_valid(column)
    initial = batch.filter(marked)
    rows = list(zip(keys_of(initial, keys), initial.column(INITIAL).to_pylist(), strict=True))
    return rows, batch.filter(pc.invert(marked)).drop_columns([INITIAL])
