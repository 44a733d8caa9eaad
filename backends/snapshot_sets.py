"""The arguments of ``StateBackend.restore``, checked once for every backend.

``restore(directory, key_groups=None, max_parallelism=None)`` takes one snapshot
directory or several (rescaling merges the snapshots of several operators) and an
optional ``aec.keygroups.KeyGroupRange`` to keep. The byte-store backends store the
key group in every key (``backends.keycodec``), so they filter without
``max_parallelism``; it is checked when given.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from aec.keygroups import KeyGroupRange
from backends.keycodec import MAX_KEY_GROUPS


def snapshot_directories(directory: Any) -> list[str]:
    """``directory`` (a path, or a non-empty sequence of paths) as a list of str.

    Raises:
        TypeError: not a path or a sequence of paths.
        ValueError: an empty sequence.
    """
    if isinstance(directory, (str, os.PathLike)):
        return [os.fspath(directory)]
    if not isinstance(directory, Sequence):
        raise TypeError(
            f"restore takes a snapshot directory or a list of them, got {type(directory).__name__}"
        )
    directories = []
    for item in directory:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"a snapshot directory must be a path, got {item!r}")
        directories.append(os.fspath(item))
    if not directories:
        raise ValueError("restore needs at least one snapshot directory, got an empty list")
    return directories


def checked_key_groups(key_groups: Any, max_parallelism: Any = None) -> KeyGroupRange | None:
    """``key_groups`` if it is a usable range (or None).

    Raises:
        TypeError: ``key_groups`` is not a KeyGroupRange or None; ``max_parallelism``
            is not an int or None.
        ValueError: ``max_parallelism < 1``, or a key group outside
            ``range(max_parallelism)`` (or beyond the 65536 groups a key can store).
    """
    if max_parallelism is not None:
        if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int):
            raise TypeError(f"max_parallelism must be an int or None, got {max_parallelism!r}")
        if max_parallelism < 1:
            raise ValueError(f"max_parallelism must be >= 1, got {max_parallelism}")
    if key_groups is None:
        return None
    if not isinstance(key_groups, KeyGroupRange):
        raise TypeError(f"key_groups must be a KeyGroupRange or None, got {key_groups!r}")
    limit = MAX_KEY_GROUPS if max_parallelism is None else max_parallelism
    if not key_groups.within(limit):
        raise ValueError(f"{key_groups!r} is outside range({limit}) (max_parallelism)")
    return key_groups
