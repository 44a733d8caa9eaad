"""Checkpoints: the on-disk format of a keyed operator's snapshot (DESIGN rule 9).

``files`` stages, checksums and commits a checkpoint and verifies it on read.
``KeyedProcessOperator.snapshot`` / ``restore`` (``aec.runtime.operator``) use it.
"""

from aec.checkpoint.files import CheckpointHandle, OperatorState, latest_checkpoint

__all__ = ["CheckpointHandle", "OperatorState", "latest_checkpoint"]
