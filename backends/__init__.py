"""State backends for aec: memory, RocksDB, Redis, SlateDB, modelled latency, a local cache tier.

Each implements ``aec.state.backend.StateBackend``: ``execute_batch`` answers a
batch of ``aec.state.requests.StateRequest`` in list order.
"""

from aec.state import BackendSpec, MemoryBackend, MemorySpec, StateBackend
from backends.cache import CachedBackend, CachedSpec
from backends.latency import LatencyBackend
from backends.redis import RedisBackend, RedisSpec
from backends.redis_server import LocalRedisServer
from backends.rocksdb import RocksDBBackend


def __getattr__(name: str):
    # SlateDB loads a 28 MB native library: import it only when asked for
    if name in ("SlateDBBackend", "SlateDBSpec"):
        from backends import slatedb

        return getattr(slatedb, name)
    raise AttributeError(f"module 'backends' has no attribute {name!r}")


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
