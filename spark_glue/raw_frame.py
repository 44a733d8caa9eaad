"""The raw frame ``mapInArrow`` returns: every stream of a partition in one Arrow schema.

Layout (see ``spark_glue.keyed`` for why): ``__aec_stream`` names the row's stream
(``"main"``, ``"side:<tag>"``, ``"metrics"``), ``__aec_metrics`` holds a partition's
metrics as JSON, the main output's columns keep their names, side output ``i``'s
columns are ``__aec_s<i>_<name>``. ``RawLayout`` describes it, ``RawWriter`` builds
its Arrow batches on the executors.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
from pyspark.sql import types as T

from aec.elements import Watermark
from spark_glue.convert import arrow_schema, encode_rows

_STREAM = "__aec_stream"
_METRICS = "__aec_metrics"
_RESERVED = "__aec"


@dataclass(frozen=True)
class RawLayout:
    """Where each stream lives in the raw frame; travels to the executors."""

    main: T.StructType
    sides: dict[str, tuple[int, T.StructType]]  # tag -> (index, schema)
    raw: T.StructType

    @staticmethod
    def build(main: T.StructType, sides: dict[str, T.StructType]) -> RawLayout:
        fields = [T.StructField(_STREAM, T.StringType()), T.StructField(_METRICS, T.StringType())]
        fields += [T.StructField(f.name, f.dataType, True, f.metadata) for f in main.fields]
        numbered: dict[str, tuple[int, T.StructType]] = {}
        for index, (tag, schema) in enumerate(sides.items()):
            numbered[tag] = (index, schema)
            fields += [T.StructField(side_column(index, f.name), f.dataType) for f in schema.fields]
        return RawLayout(main, numbered, T.StructType(fields))


def side_column(index: int, name: str) -> str:
    return f"{_RESERVED}_s{index}_{name}"


def drained(
    operator: Any, declared: Collection[str], declared_in: str
) -> Iterator[tuple[str | None, list[Any]]]:
    """What ``operator`` emitted since the last drain: ``(None, values)`` for the main
    output (watermarks left out), then ``(tag, values)`` per side output, each only
    when not empty. Raises ValueError naming a side output tag not in ``declared``
    (``declared_in``: where the user declares them)."""
    values = [v for v in operator.drain_outputs() if not isinstance(v, Watermark)]
    if values:
        yield None, values
    for tag, side_values in operator.drain_side_outputs().items():
        if not side_values:
            continue
        if tag not in declared:
            raise ValueError(
                f"side output {tag!r} is not declared in {declared_in}; "
                f"declared: {sorted(declared)}"
            )
        yield tag, side_values


def encoded(values: list[Any], schema: T.StructType, target: Any, tag: str | None) -> list[Any]:
    """``encode_rows`` of one stream's values (``tag``: None for the main output);
    its TypeError reworded to name the stream."""
    try:
        return encode_rows(values, schema, target)
    except TypeError as exc:
        where = "main output" if tag is None else f"side output {tag!r}"
        raise TypeError(f"{where} does not fit its schema: {exc}") from None


class RawWriter:
    """Turns an operator's drained outputs into raw-frame batches."""

    def __init__(self, layout: RawLayout) -> None:
        self.layout = layout
        self.target = arrow_schema(layout.raw)
        self.main_rows = 0
        self.side_rows = 0

    def drain(self, operator: Any) -> Iterator[pa.RecordBatch]:
        """Batches for everything the operator emitted since the last drain."""
        sides = self.layout.sides
        for tag, values in drained(operator, sides, "process_keyed(side_outputs=...)"):
            if tag is None:
                self.main_rows += len(values)
                yield self._batch(None, self.layout.main, values, 2)
            else:
                index, schema = sides[tag]
                self.side_rows += len(values)
                yield self._batch(tag, schema, values, self._offset(index))

    def metrics_batch(self, metrics: dict[str, Any]) -> pa.RecordBatch:
        """The partition's single metrics row."""
        columns: list[pa.Array] = [
            pa.array(["metrics"], pa.string()),
            pa.array([json.dumps(metrics, default=str)], pa.string()),
        ]
        columns += [pa.nulls(1, f.type) for f in list(self.target)[2:]]
        return pa.RecordBatch.from_arrays(columns, schema=self.target)

    def _offset(self, index: int) -> int:
        offset = 2 + len(self.layout.main.fields)
        for _, (other, schema) in self.layout.sides.items():
            if other < index:
                offset += len(schema.fields)
        return offset

    def _batch(
        self, tag: str | None, schema: T.StructType, values: list[Any], offset: int
    ) -> pa.RecordBatch:
        width = len(schema.fields)
        target = pa.schema(list(self.target)[offset : offset + width])
        columns_of = encoded(values, schema, target, tag)
        stream = "main" if tag is None else f"side:{tag}"
        rows = len(values)
        columns: list[pa.Array] = [
            pa.array([stream] * rows, pa.string()),
            pa.nulls(rows, pa.string()),
        ]
        for position, field in enumerate(list(self.target)[2:], start=2):
            if offset <= position < offset + width:
                columns.append(columns_of[position - offset])
            else:
                columns.append(pa.nulls(rows, field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.target)
