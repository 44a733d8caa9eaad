"""Outputs written as Parquet by the partitions themselves, committed by the driver.

``process_keyed`` hands every output row back to the JVM (Arrow to rows), which
caches the raw frame and then writes each stream with Spark's Parquet writer: per
operator a cache build, one Parquet job per dataset and a count per dataset. Here
a partition writes its streams itself (pyarrow, one file per stream and
partition) and returns only its metrics row, so the JVM never sees an output row.

Commit protocol (Spark's ``FileOutputCommitter`` in miniature): a task attempt
writes ``<dataset>/_temporary/<attempt>/<file>`` and names its files in its
metrics row; after the Spark job the driver moves the files of the attempts whose
rows it collected (Spark returns each partition's result from one successful
attempt) to ``<dataset>/<file>``, drops ``_temporary`` and writes ``_SUCCESS``.
Files of failed or retried attempts stay in ``_temporary`` and go with it. A
failed job leaves each dataset directory empty but for ``_temporary``, which
``abort`` removes. Datasets are local paths (or a mount every executor reaches):
the driver moves files with ``os.replace``.

Every partition writes a file per stream, empty ones too, so a dataset without
rows still carries its schema (what ``pd.read_parquet`` and Spark read back).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

from spark_glue.convert import arrow_schema
from spark_glue.raw_frame import RawLayout, drained, encoded

TEMPORARY = "_temporary"
SUCCESS = "_SUCCESS"
ROW_GROUP_ROWS = 1 << 17  # rows buffered per Parquet row group (few, large groups)


class ParquetStreams:
    """A partition's streams written to Parquet: the ``RawWriter`` of ``write_keyed``.

    Args:
        layout: the operator's streams (``"main"`` and its side output tags).
        targets: stream (``"main"`` or a tag) -> dataset directory; every stream
            of ``layout`` must have one.
        file_name: this partition's file name in each dataset.
        attempt: the task attempt's directory under ``_temporary``.
    """

    def __init__(
        self, layout: RawLayout, targets: Mapping[str, str], file_name: str, attempt: str
    ) -> None:
        schemas = {"main": layout.main, **{tag: s for tag, (_, s) in layout.sides.items()}}
        missing = sorted(set(schemas) - set(targets))
        if missing:
            raise ValueError(f"no output directory for the streams {missing}")
        self.main_rows = 0
        self.side_rows = 0
        self._streams: dict[str, _StreamFile] = {
            stream: _StreamFile(
                stream, schema, os.path.join(targets[stream], TEMPORARY, attempt, file_name)
            )
            for stream, schema in schemas.items()
        }
        self._sides = frozenset(layout.sides)

    def drain(self, operator: Any) -> Iterator[pa.RecordBatch]:
        """Write everything the operator emitted since the last drain; yields nothing
        (the batches went to the files). Raises TypeError for rows that do not fit."""
        streams = self._streams
        for tag, values in drained(operator, self._sides, "the operator's side_outputs"):
            if tag is None:
                self.main_rows += len(values)
                streams["main"].add(values)
            else:
                self.side_rows += len(values)
                streams[tag].add(values)
        return iter(())

    def close(self) -> dict[str, tuple[str, int]]:
        """Flush and close every file: stream -> (its path, its rows)."""
        return {name: stream.close() for name, stream in self._streams.items()}

    def abort(self) -> None:
        """Close the files without caring about their contents (a failing attempt)."""
        for stream in self._streams.values():
            stream.abort()


class _StreamFile:
    """One stream's file: rows encoded per drain, written a row group at a time."""

    def __init__(self, stream: str, schema: Any, path: str) -> None:
        self.stream = stream
        self.schema = schema
        self.path = path
        self.target = arrow_schema(schema)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.writer: Any = pq.ParquetWriter(path, self.target, compression="snappy")
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.rows = 0

    def add(self, values: list[Any]) -> None:
        tag = None if self.stream == "main" else self.stream
        columns = encoded(values, self.schema, self.target, tag)
        self.pending.append(pa.RecordBatch.from_arrays(columns, schema=self.target))
        self.pending_rows += len(values)
        self.rows += len(values)
        if self.pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, self.target))
        self.pending, self.pending_rows = [], 0

    def close(self) -> tuple[str, int]:
        self._flush()
        self.writer.close()
        return self.path, self.rows

    def abort(self) -> None:
        self.pending = []
        self.writer.close()


# --- the driver's side ------------------------------------------------------------------


def prepare(directories: Iterable[str]) -> None:
    """Empty (overwrite) and create each dataset directory before the job."""
    for directory in directories:
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        elif os.path.exists(directory):
            os.remove(directory)
        os.makedirs(os.path.join(directory, TEMPORARY))


def commit(directories: Iterable[str], files: Iterable[str]) -> None:
    """Move the collected attempts' ``files`` into their datasets, then drop each
    dataset's ``_temporary`` and write its ``_SUCCESS``.

    Raises:
        ValueError: a file that is not ``<dataset>/_temporary/<attempt>/<name>`` of
            one of ``directories``.
    """
    known = {os.path.abspath(d) for d in directories}
    for path in files:
        attempt_dir = os.path.dirname(os.path.abspath(path))
        temporary = os.path.dirname(attempt_dir)
        dataset = os.path.dirname(temporary)
        if os.path.basename(temporary) != TEMPORARY or dataset not in known:
            raise ValueError(f"{path!r} is not a task file of the datasets written")
        os.replace(path, os.path.join(dataset, os.path.basename(path)))
    for dataset in known:
        shutil.rmtree(os.path.join(dataset, TEMPORARY), ignore_errors=True)
        with open(os.path.join(dataset, SUCCESS), "wb"):
            pass


def abort(directories: Iterable[str]) -> None:
    """After a failed job: remove what its attempts wrote."""
    for directory in directories:
        shutil.rmtree(os.path.join(directory, TEMPORARY), ignore_errors=True)
