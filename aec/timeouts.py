"""Bounded waits on remote stores: the one place their defaults live.

Every store aec talks to over a network gets a connect timeout and a request
timeout from here: checkpoint locations on object stores (``aec.checkpoint.storage``
through ``pyarrow.fs``'s S3 options), ``backends.RedisBackend`` (its socket
timeouts) and ``backends.SlateDBBackend`` (its object store client). A stalled
store (a server that accepts connections and never answers) then fails the call
within about ``request * attempts`` seconds with an error naming the store and
the operation, instead of holding a task for as long as the TCP stack allows.

Change the defaults in one place: the environment variables below, read on
every call (so a Spark executor uses the values its task sets; the Spark glue
forwards the driver's ``AEC_STORE_*`` variables to executors that lack them),
or pass ``StoreTimeouts(...)`` where an API takes one.

==============================  ==========  ==========================================
variable                        default     meaning
==============================  ==========  ==========================================
``AEC_STORE_CONNECT_TIMEOUT``   5           seconds to open a connection
``AEC_STORE_REQUEST_TIMEOUT``   10          seconds a request may go without progress
``AEC_STORE_ATTEMPTS``          3           tries per object-store request (1 = no retry)
``AEC_STORE_SLOW_REQUEST``      1           a checkpoint-store request slower than this
                                            is logged (logger ``aec.checkpoint.storage``)
==============================  ==========  ==========================================
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

CONNECT_ENV = "AEC_STORE_CONNECT_TIMEOUT"
REQUEST_ENV = "AEC_STORE_REQUEST_TIMEOUT"
ATTEMPTS_ENV = "AEC_STORE_ATTEMPTS"
SLOW_ENV = "AEC_STORE_SLOW_REQUEST"
ENVIRONMENT = (CONNECT_ENV, REQUEST_ENV, ATTEMPTS_ENV, SLOW_ENV)


@dataclass(frozen=True)
class StoreTimeouts:
    """Timeouts of one store client.

    Attributes:
        connect: seconds to open a connection (> 0).
        request: seconds one request may go without progress (> 0): no reply from
            Redis for this long, or no byte moving on an object-store transfer
            (curl's low-speed time under pyarrow's S3 client on Linux).
        attempts: tries per object-store request, the first included (>= 1);
            a stalled request fails after about ``request * attempts`` seconds.
        slow_request: seconds above which a checkpoint-store request is logged
            as slow (> 0; ``inf`` never logs).

    Raises:
        ValueError: a value out of range (named).
    """

    connect: float = 5.0
    request: float = 10.0
    attempts: int = 3
    slow_request: float = 1.0

    def __post_init__(self) -> None:
        for name in ("connect", "request", "slow_request"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"StoreTimeouts.{name} must be > 0 seconds, got {value!r}")
        for name in ("connect", "request"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"StoreTimeouts.{name} must be finite, got {getattr(self, name)}")
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ValueError(f"StoreTimeouts.attempts must be an int >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"StoreTimeouts.attempts must be >= 1, got {self.attempts}")

    @property
    def bound(self) -> float:
        """Seconds after which a stalled request has failed (all attempts), roughly."""
        return self.request * self.attempts

    def describe(self) -> str:
        """``"request timeout 10 s x 3 attempts, connect timeout 5 s"``, for errors."""
        return (
            f"request timeout {self.request:g} s x {self.attempts} attempt"
            f"{'s' if self.attempts != 1 else ''}, connect timeout {self.connect:g} s"
        )


def store_timeouts() -> StoreTimeouts:
    """The defaults, with the ``AEC_STORE_*`` environment variables of the moment
    applied.

    Raises:
        ValueError: a variable that is not a number in range (named).
    """
    defaults = StoreTimeouts()
    values: dict[str, float | int] = {}
    for variable, field, kind in (
        (CONNECT_ENV, "connect", float),
        (REQUEST_ENV, "request", float),
        (ATTEMPTS_ENV, "attempts", int),
        (SLOW_ENV, "slow_request", float),
    ):
        text = os.environ.get(variable, "").strip()
        if not text:
            continue
        try:
            values[field] = kind(text)
        except ValueError:
            raise ValueError(
                f"{variable}={text!r} is not a {'whole ' if kind is int else ''}number"
            ) from None
    try:
        return StoreTimeouts(**{**defaults.__dict__, **values})
    except ValueError as exc:
        raise ValueError(f"{exc} (from the {', '.join(ENVIRONMENT)} variables)") from None


def timeout_environment() -> dict[str, str]:
    """The ``AEC_STORE_*`` variables set in this process (to forward to executors)."""
    return {name: os.environ[name] for name in ENVIRONMENT if name in os.environ}
