"""State backends for aec: memory, RocksDB, Redis, SlateDB, modelled latency, a local cache tier.

Each implements ``aec.state.backend.StateBackend``: ``execute_batch`` answers a
batch of ``aec.state.requests.StateRequest`` in list order.

The backends on a third-party store load it only when first asked for, and
without it raise ``aec.errors.MissingExtraError`` (an ``ImportError``) naming
the extra to install: ``RocksDBBackend`` needs ``aec[rocksdb]``,
``RedisBackend`` ``aec[redis]``, ``SlateDBBackend`` ``aec[slatedb]``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aec.errors import needs_extra
from aec.state import BackendSpec, MemoryBackend, MemorySpec, StateBackend
from backends.cache import CachedBackend, CachedSpec
from backends.latency import LatencyBackend
from backends.redis_server import LocalRedisServer

if TYPE_CHECKING:
    from backends.redis import RedisBackend, RedisSpec
    from backends.rocksdb import RocksDBBackend
    from backends.slatedb import SlateDBBackend, SlateDBSpec

# name -> (module, extra, the extra's top-level modules)
_OPTIONAL = {
    "RocksDBBackend": ("backends.rocksdb", "rocksdb", ("rocksdict",)),
    "RedisBackend": ("backends.redis", "redis", ("redis",)),
    "RedisSpec": ("backends.redis", "redis", ("redis",)),
    # SlateDB also loads a 28 MB native library: one more reason to wait until asked
    "SlateDBBackend": ("backends.slatedb", "slatedb", ("slatedb",)),
    "SlateDBSpec": ("backends.slatedb", "slatedb", ("slatedb",)),
}


def __getattr__(name: str) -> Any:
    if name not in _OPTIONAL:
        raise AttributeError(f"module 'backends' has no attribute {name!r}")
    module, extra, modules = _OPTIONAL[name]
    with needs_extra(extra, f"backends.{name}", *modules):
        return getattr(importlib.import_module(module), name)


__all__ = [
    "BackendSpec",
    "CachedBackend",
    "CachedSpec",
    "LatencyBackend",
    "LocalRedisServer",
    "MemoryBackend",
    "MemorySpec",
    "RedisBackend",
    "RedisSpec",
    "RocksDBBackend",
    "SlateDBBackend",
    "SlateDBSpec",
    "StateBackend",
]
