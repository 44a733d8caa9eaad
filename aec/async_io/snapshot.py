"""The checkpoint contents of an ``AsyncWaitOperator`` (FLIP-12's queued inputs).

Flink's ``AsyncWaitOperator.snapshotState`` keeps every queued input in operator
state and re-invokes them on restore. aec writes them with the keyed checkpoints'
format primitives (``aec.checkpoint.files``: staging, SHA-256 manifest, atomic
commit), as two files::

    chk-<n>/operator.json   {"format", "operator": "AsyncWaitOperator", "mode",
                             "serializer", ...}
    chk-<n>/inputs.bin      {"elements": [("record", value, attempts) |
                                          ("watermark", timestamp), ...],
                             "watermark": last watermark (seconds, -inf if none)}
    chk-<n>/MANIFEST.json

``inputs.bin`` is written by the operator's serializer (``aec.state.serialization``:
msgpack by default, so reading a checkpoint runs nothing its bytes name; pickle only
when the operator opted in) and read only by the reading operator's own, which must
be the one the checkpoint records. A keyed checkpoint has no ``inputs.bin``, so each
kind refuses the other with ``ValueError``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TypedDict

from aec.async_io.queue import AsyncEntry
from aec.checkpoint import files as checkpoint
from aec.checkpoint.files import CheckpointHandle
from aec.checkpoint.storage import local_copy
from aec.elements import Watermark
from aec.state.serialization import Serializer, dumps_exactly

__all__ = ["encode", "files", "read"]

KIND = "AsyncWaitOperator"
INPUTS = "inputs.bin"


class Inputs(TypedDict):
    """What ``inputs.bin`` holds."""

    # ("record", value, attempts) or ("watermark", timestamp), in arrival order
    elements: list[tuple[str, object, int] | tuple[str, float]]
    watermark: float


def encode(queued: Iterable[AsyncEntry | Watermark], watermark: float) -> Inputs:
    """The stored form of the queued elements, in arrival order."""
    elements: list[tuple[str, object, int] | tuple[str, float]] = []
    for element in queued:
        if isinstance(element, AsyncEntry):
            elements.append(("record", element.value, element.attempts))
        else:
            elements.append(("watermark", element.timestamp))
    return {"elements": elements, "watermark": watermark}


def files(mode: str, capacity: int, inputs: Inputs, serializer: Serializer) -> dict[str, bytes]:
    """``name -> bytes`` of the checkpoint (``aec.checkpoint.files.write_files``).

    Raises TypeError for an input value ``serializer`` cannot store, or would give
    back changed (a named tuple as a tuple: ``dumps_exactly``), naming it, with the way
    to opt in to pickle.
    """
    metadata = {
        "format": checkpoint.FORMAT,
        "operator": KIND,
        "mode": mode,
        "capacity": capacity,
        "serializer": serializer.name,
        "inputs": sum(1 for e in inputs["elements"] if e[0] == "record"),
    }
    try:  # restored inputs are re-invoked: they must come back as they were
        stored = dumps_exactly(serializer, inputs)
    except TypeError as exc:
        raise TypeError(
            f"an input cannot be stored by the {serializer.name!r} serializer ({exc}); "
            "AsyncWaitOperator(..., serializer='pickle') stores any picklable input "
            "(restore then only checkpoints no one else writes)"
        ) from None
    return {
        checkpoint.METADATA: json.dumps(metadata, indent=1, sort_keys=True).encode(),
        INPUTS: stored,
    }


def read(
    handle: CheckpointHandle | str | os.PathLike[str], mode: str, serializer: Serializer
) -> tuple[list[tuple[object, int]], float]:
    """Verify and parse an async I/O checkpoint taken in ``mode`` (a handle, or the
    path or URI of its ``chk-<id>``; a remote one is downloaded first).

    Returns ``([(value or Watermark, attempts), ...], last_watermark)``.

    Raises:
        TypeError / FileNotFoundError: as ``aec.checkpoint.files.read_files``.
        ValueError: incomplete or corrupt, a keyed-operator checkpoint (no
            ``inputs.bin``), another mode or serializer, or malformed contents.
        CheckpointStorageError: an object store could not be read.
    """
    with local_copy(handle) as local:
        located = (
            CheckpointHandle(handle.checkpoint_id, local)
            if isinstance(handle, CheckpointHandle)
            else local
        )
        _, contents = checkpoint.read_files(located, (checkpoint.METADATA, INPUTS))
    path = handle.path if isinstance(handle, CheckpointHandle) else os.fspath(handle)
    try:
        metadata = json.loads(contents[checkpoint.METADATA])
    except Exception as exc:
        raise ValueError(f"{path}: async I/O checkpoint cannot be read: {exc}") from exc
    if not isinstance(metadata, dict) or metadata.get("operator") != KIND:
        raise ValueError(f"{path} is not an AsyncWaitOperator checkpoint")
    if metadata.get("mode") != mode:
        raise ValueError(
            f"{path} is an async I/O checkpoint of mode {metadata.get('mode')!r}; this "
            f"operator's mode is {mode!r} (restore into an operator of the same mode)"
        )
    if metadata.get("serializer") != serializer.name:  # decoded only by the reader's own
        raise ValueError(
            f"{path} stores its inputs with the {metadata.get('serializer')!r} serializer; "
            f"this operator's is {serializer.name!r} (restore with serializer="
            f"{metadata.get('serializer')!r})"
        )
    try:
        inputs = serializer.loads(contents[INPUTS])
    except Exception as exc:
        raise ValueError(f"{path}: async I/O checkpoint cannot be read: {exc}") from exc
    try:
        elements: list[tuple[object, int]] = []
        for element in inputs["elements"]:
            if element[0] == "record":
                elements.append((element[1], int(element[2])))
            elif element[0] == "watermark":
                elements.append((Watermark(element[1]), 0))
            else:
                raise ValueError(f"unknown element {element[0]!r}")
        watermark = inputs["watermark"]
        if type(watermark) not in (int, float):  # kept as stored: float() rounds big ints
            raise TypeError(f"the last watermark {watermark!r} is not a number")
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: async I/O checkpoint is malformed: {exc}") from exc
    return elements, watermark
