"""State backends for aec: memory, RocksDB, modelled latency (more to come).

Each implements ``backends.base.StateBackend``: ``execute_batch`` answers a
batch of ``aec.requests.StateRequest`` in list order.
"""

from backends.base import BackendSpec, StateBackend
from backends.latency import LatencyBackend
from backends.memory import MemoryBackend
from backends.rocksdb import RocksDBBackend

__all__ = ["BackendSpec", "LatencyBackend", "MemoryBackend", "RocksDBBackend", "StateBackend"]
