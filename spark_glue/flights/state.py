"""Where the flights job's state lives: one backend per operator, built on the executors.

``FlightsOptions.backend`` (``BACKENDS``): ``memory``, ``rocksdb`` (under ``out/state``),
``remote-latency`` (``LatencyBackend`` over that RocksDB: every batch pays a modelled
round trip), ``slatedb`` (an LSM on an object store, by default the local directory
``out/object-store``) and ``redis`` (a given server, or a throwaway local
``redis-server`` started for the run: ``state_service``). The glue ships each backend's
picklable spec; every partition builds its own instance.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from backends import LatencyBackend, LocalRedisServer, MemoryBackend, RedisBackend, RocksDBBackend

BACKENDS = ("memory", "rocksdb", "remote-latency", "slatedb", "redis")
DEFAULT_LATENCY = 0.001  # seconds per batch round trip (remote-latency)
OBJECT_STORE_DIR = "object-store"  # the default SlateDB store: a directory in out


@dataclass(frozen=True)
class StateService:
    """What a run's backends need beyond its options: the Redis server in use."""

    redis_url: str | None = None
    redis_note: str = ""


@contextlib.contextmanager
def state_service(options: Any) -> Iterator[StateService]:
    """Starts (and finally stops) a throwaway redis-server when ``redis`` has no URL."""
    if options.backend != "redis":
        yield StateService()
    elif options.redis_url is not None:
        yield StateService(options.redis_url, f"Redis at {redact_url(options.redis_url)}")
    else:
        with LocalRedisServer() as server:
            note = (
                f"a throwaway local redis-server on 127.0.0.1:{server.port}, stopped after the run"
            )
            yield StateService(server.url, note)


class Backends:
    """Builds each operator's backend (the glue ships its picklable ``spec()``)."""

    def __init__(self, options: Any, service: StateService, state_dir: str) -> None:
        self.options = options
        self.service = service
        self.state_dir = state_dir
        self.mode = "sync" if options.sync else "async"  # fresh state per mode
        kind = options.backend
        if kind == "memory":
            self.note = "in-process dicts"
        elif kind == "rocksdb":
            self.note = f"RocksDB under {state_dir}"
        elif kind == "remote-latency":
            self.note = (
                f"RocksDB under {state_dir} behind LatencyBackend: a modelled "
                f"{format_seconds(options.latency)} round trip per state batch"
            )
        elif kind == "slatedb":
            self.note = f"SlateDB on {self.object_store}, databases under aec-flights/{self.mode}"
        else:
            self.note = service.redis_note

    @property
    def object_store(self) -> str:
        if self.options.object_store is not None:
            return self.options.object_store
        return "file://" + os.path.join(os.path.abspath(self.options.out), OBJECT_STORE_DIR)

    def build(self, name: str) -> Any:
        kind = self.options.backend
        if kind == "memory":
            return MemoryBackend()
        if kind == "rocksdb":
            return RocksDBBackend(os.path.join(self.state_dir, name))
        if kind == "remote-latency":
            return LatencyBackend(
                RocksDBBackend(os.path.join(self.state_dir, name)), self.options.latency
            )
        if kind == "slatedb":
            return slatedb_backend()(self.object_store, f"aec-flights/{self.mode}/{name}")
        if kind == "redis":
            if self.service.redis_url is None:
                raise AssertionError("no Redis server: state_service provides one")
            return RedisBackend(self.service.redis_url, prefix=f"aec-flights.{self.mode}.{name}")
        raise ValueError(f"unknown backend {kind!r}")  # validate() rejects it first


def slatedb_backend() -> Any:
    """``backends.slatedb.SlateDBBackend``, imported when needed (it loads SlateDB's
    native library)."""
    try:
        from backends.slatedb import SlateDBBackend
    except ImportError as exc:
        raise ValueError(f"the slatedb backend is not available: {exc}") from exc
    return SlateDBBackend


def format_seconds(seconds: float) -> str:
    """``0.001`` -> ``"1 ms"``, ``0.00025`` -> ``"250 us"``, ``2.5`` -> ``"2.5 s"``."""
    if seconds == 0:
        return "0 s"
    if seconds < 0.001:
        return f"{seconds * 1e6:g} us"
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    return f"{seconds:g} s"


def redact_url(url: str) -> str:
    """``url`` without its password (for notes and error messages)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable url>"
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))
