"""State backends for aec: memory, RocksDB, Redis, SlateDB, modelled latency, a local cache tier.

Each implements ``backends.base.StateBackend``: ``execute_batch`` answers a
batch of ``aec.requests.StateRequest`` in list order.
"""

from backends.base import BackendSpec, StateBackend
from backends.cache import CachedBackend, CachedSpec
from backends.latency import LatencyBackend
from backends.memory import MemoryBackend
from backends.redis import RedisBackend, RedisSpec
from backends.redis_server import LocalRedisServer
from backends.rocksdb import RocksDBBackend

__all__ = [
    "BackendSpec",
    "CachedBackend",
    "CachedSpec",
    "LatencyBackend",
    "LocalRedisServer",
    "MemoryBackend",
    "RedisBackend",
    "RedisSpec",
    "RocksDBBackend",
    "StateBackend",
]
