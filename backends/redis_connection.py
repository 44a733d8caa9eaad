"""RedisBackend's connection helpers: error naming, key scans, bulk deletes, URL redaction.

Sockets time out and redis-py retries are off (a pipeline is never re-sent: a
resent ``RPUSH`` would apply twice), so a dead server raises
``redis.ConnectionError`` or ``redis.TimeoutError``; ``ConnectionErrors`` re-raises
them naming the backend and what it was doing, without the URL's password.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import redis

SCAN_COUNT = 1000  # keys per SCAN step and per DUMP/RESTORE pipeline
_GLOB_SPECIAL = re.compile(rb"([*?\[\]\\])")


class ConnectionErrors:
    """Re-raises redis-py connection and timeout errors with the backend named.

    ``backend`` is anything with a ``url`` attribute and a useful ``repr``.
    """

    __slots__ = ("backend", "doing")

    def __init__(self, backend: Any, doing: str) -> None:
        self.backend = backend
        self.doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            timeout = isinstance(exc, redis.TimeoutError)
            what = "timed out" if timeout else "lost its connection"
            raise (redis.TimeoutError if timeout else redis.ConnectionError)(
                f"{self.backend!r} {what} while {self.doing} "
                f"(connection to {redact(self.backend.url)}): {exc}"
            ) from exc
        return False


def scan_keys(client: redis.Redis, prefix: bytes) -> Iterator[bytes]:
    """Every key starting with ``prefix`` (glob characters in it are escaped)."""
    pattern = _GLOB_SPECIAL.sub(rb"\\\1", prefix) + b"*"
    return client.scan_iter(match=pattern, count=SCAN_COUNT)


def delete_keys(client: redis.Redis, keys: Iterator[bytes]) -> None:
    """``UNLINK`` ``keys``, ``SCAN_COUNT`` at a time."""
    for chunk in chunks(sorted(set(keys))):
        client.unlink(*chunk)


def chunks(items: list) -> Iterator[list]:
    """``items`` in slices of ``SCAN_COUNT``."""
    for start in range(0, len(items), SCAN_COUNT):
        yield items[start : start + SCAN_COUNT]


def redact(url: str) -> str:
    """``url`` without its password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))
