"""The raw frame ``mapInArrow`` returns: every stream of a partition in one Arrow schema.

Layout (see ``spark_glue.keyed`` for why): ``__aec_stream`` names the row's stream
(``"main"``, ``"side:<tag>"``, ``"metrics"``), ``__aec_metrics`` holds a partition's
metrics as JSON, the main output's columns keep their names, side output ``i``'s
columns are ``__aec_s<i>_<name>``. ``RawLayout`` describes it, ``RawWriter`` builds
its Arrow batches on the executors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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


class RawWriter:
    """Turns an operator's drained outputs into raw-frame batches."""

    def __init__(self, layout: RawLayout) -> None:
        self.layout = layout
        self.target = arrow_schema(layout.raw)
        self.main_rows = 0
        self.side_rows = 0

    def drain(self, operator: Any) -> Iterator[pa.RecordBatch]:
        """Batches for everything the operator emitted since the last drain."""
        values = [v for v in operator.drain_outputs() if not isinstance(v, Watermark)]
        if values:
            self.main_rows += len(values)
            yield self._batch("main", self.layout.main, values, 2)
        for tag, side_values in operator.drain_side_outputs().items():
            if not side_values:
                continue
            if tag not in self.layout.sides:
                raise ValueError(
                    f"side output {tag!r} is not declared in process_keyed(side_outputs=...); "
                    f"declared: {sorted(self.layout.sides)}"
                )
            index, schema = self.layout.sides[tag]
            self.side_rows += len(side_values)
            yield self._batch(f"side:{tag}", schema, side_values, self._offset(index))

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
        self, stream: str, schema: T.StructType, values: list[Any], offset: int
    ) -> pa.RecordBatch:
        width = len(schema.fields)
        target = pa.schema(list(self.target)[offset : offset + width])
        try:
            encoded = encode_rows(values, schema, target)
        except TypeError as exc:
            where = "main output" if stream == "main" else f"side output {stream[5:]!r}"
            raise TypeError(f"{where} does not fit its schema: {exc}") from None
        rows = len(values)
        columns: list[pa.Array] = [
            pa.array([stream] * rows, pa.string()),
            pa.nulls(rows, pa.string()),
        ]
        for position, field in enumerate(list(self.target)[2:], start=2):
            if offset <= position < offset + width:
                columns.append(encoded[position - offset])
            else:
                columns.append(pa.nulls(rows, field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.target)
