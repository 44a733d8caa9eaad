"""The checkpoint side of a ``KeyedProcessOperator`` (docs/semantics.md, rule 9):
reading, checking and merging the checkpoints a restore names, and restoring the
backend from them. The operator drains and decides when; the file format is
``aec.checkpoint.files``'s, where checkpoints live ``aec.checkpoint.storage``'s,
the merge of several ``aec.runtime.operator_rescale``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from aec.checkpoint import files as checkpoint
from aec.checkpoint import private_copy, state_meta
from aec.checkpoint.files import CheckpointHandle
from aec.checkpoint.storage import local_copy
from aec.keygroups import KeyGroupRange
from aec.runtime.operator_rescale import MergedCheckpoint, merge
from aec.runtime.timers import TimerQueue

if TYPE_CHECKING:
    from aec.config import AecConfig
    from aec.state.backend import StateBackend
    from aec.state.descriptors import StateDescriptor
    from aec.state.serialization import Serializer

HandleLike = CheckpointHandle | str | os.PathLike[str]


@contextlib.contextmanager
def read_checkpoints(
    handle: HandleLike | Sequence[HandleLike],
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    check_state_names: Callable[[list[str]], None] | None = None,
    inputs: int = 1,
    scratch_parent: str | None = None,
) -> Iterator[tuple[MergedCheckpoint, str, list[checkpoint.RestoredCheckpoint]]]:
    """Verify every checkpoint ``handle`` names (manifest, sizes, SHA-256), check
    that they fit together and into an operator owning ``key_group_range``, and
    yield ``(merged, where, restored)`` while their local copies exist (``where``
    names them for messages, ``restored`` are the checkpoints one by one). Nothing
    live changes here. ``inputs``: the operator's (1, or 2 for a
    ``KeyedCoProcessOperator``), which every checkpoint must have.
    ``scratch_parent``: where the private copies of the backends' files go
    (``StateBackend.scratch_parent``; ``aec.checkpoint.private_copy``).

    ``check_state_names`` (the function's ``check_restore``) may refuse the stored
    state names with ValueError.

    Raises:
        TypeError: a handle that is not a handle, path or URI.
        FileNotFoundError: no checkpoint directory at a handle's location.
        ValueError: an empty list; an incomplete, corrupt or incompatible checkpoint;
            checkpoints that do not fit together (``operator_rescale.merge``).
        CheckpointStorageError: an object store could not be read.
    """
    handles: list[HandleLike] = (
        list(handle) if isinstance(handle, (list, tuple)) else [handle]  # type: ignore[list-item]
    )
    with contextlib.ExitStack() as copies:
        restored = []
        for original in handles:
            local = copies.enter_context(local_copy(original))
            private = copies.enter_context(private_copy.directory(scratch_parent))
            item = checkpoint.read(_relocated(original, local), TimerQueue.from_export, private)
            restored.append(dataclasses.replace(item, handle=_named(original, item.handle)))
        plan = merge(restored, max_parallelism, key_group_range, inputs)
        if check_state_names is not None:
            check_state_names(plan.state.state_names)
        yield plan, ", ".join(item.handle.path for item in restored), restored


def check_states(
    restored: Sequence[checkpoint.RestoredCheckpoint],
    descriptors: Sequence[StateDescriptor],
    config: AecConfig,
    backend: StateBackend,
) -> None:
    """Refuse checkpoints whose states the function (``descriptors``, made in
    ``open``) now makes differently: another type, serializer or TTL under a stored
    name (ValueError naming it, before anything live changes); tell ``backend`` the
    serializer of stored states the function makes later, on demand."""
    live = state_meta.describe(descriptors, config)
    later: dict[str, Serializer] = {}
    for item in restored:
        later.update(state_meta.check(item.state.states, live, config, item.handle.path))
    for name, serializer in later.items():
        backend.register_state(name, serializer)


def restore_backend(
    backend: StateBackend, plan: MergedCheckpoint, where: str, max_parallelism: int
) -> None:
    """Restore ``backend`` from ``plan``'s directories (filtered to its key groups
    when needed). A backend that cannot read them raises ValueError naming
    ``where``; backends leave live state untouched then. Other errors propagate."""
    try:
        if len(plan.backend_dirs) == 1 and plan.key_groups is None:
            backend.restore(plan.backend_dirs[0])
        else:
            backend.restore(plan.backend_dirs, plan.key_groups, max_parallelism)
    except (FileNotFoundError, ValueError) as exc:
        raise ValueError(
            f"the backend state of checkpoint {where} does not restore into {backend!r}: {exc}"
        ) from exc


def _relocated(original: HandleLike, local: str) -> CheckpointHandle | str:
    """What ``files.read`` takes for ``original`` now at ``local`` (the id is kept)."""
    if isinstance(original, CheckpointHandle):
        return CheckpointHandle(original.checkpoint_id, local)
    return local


def _named(original: HandleLike, read: CheckpointHandle) -> CheckpointHandle:
    """The handle as the user knows it (its URI, not the download directory)."""
    if isinstance(original, CheckpointHandle):
        return original
    text = os.fspath(original)
    return CheckpointHandle(read.checkpoint_id, text if "://" in text else read.path)
