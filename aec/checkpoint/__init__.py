"""Checkpoints: the format of a keyed operator's snapshot (docs/semantics.md rule 9) and where it lives.

``files`` stages, checksums and commits a checkpoint and verifies it on read;
``storage`` puts it in a local directory or on an object store (``pyarrow.fs``
URIs, the manifest written last as the commit).
``KeyedProcessOperator.snapshot`` / ``restore`` (``aec.runtime.operator``) use them.
"""

from aec.checkpoint.files import CheckpointHandle, OperatorState
from aec.checkpoint.storage import CheckpointStorageError, CheckpointStore, latest_checkpoint

__all__ = [
    "CheckpointHandle",
    "CheckpointStorageError",
    "CheckpointStore",
    "OperatorState",
    "latest_checkpoint",
]
