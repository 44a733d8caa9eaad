"""Interpreter settings while operators run: the young-generation GC threshold
and the GIL switch interval.

GC: in async mode thousands of records are in flight, each holding a few small
objects (context, requests, callbacks) that live for one batch round trip.
With CPython's default threshold (700) they trigger a young collection every
hundred records, and the promotions that follow make older collections walk
everything the process holds (a large source list included). Measured on the
keyed counter: async ran at 0.5x of synchronous with the default, 0.85x with a
threshold of 10,000; 50,000 gained another 6-10% on every async row of
perf/bench_remote.py (13% with 1 ms of modelled latency, where more records are
in flight).

Switch interval: I/O threads release the GIL inside backend calls (a RocksDB
multi-get or write, a socket read, the modelled latency's sleep) and must take
it back from the busy mailbox thread to finish the batch. CPython makes a
waiting thread wait a whole switch interval (5 ms by default) before it asks
the running thread to drop the GIL, so every hand-back could cost up to 5 ms
of a batch's round trip. 1 ms measured 1.12-1.19x faster on async RocksDB
(perf/bench_remote.py); with a single thread the interval costs nothing, since
the GIL is only dropped when another thread waits for it.

Both settings are changed while at least one operator is open (a keyed
operator, or an async I/O operator: ``ordered_wait``, ``batch_wait``, Spark's
``async_udf``, whose loop thread and thousands of calls in flight meet the same
two costs: on perf/bench_batch_calls.py the GC threshold made ``unordered_wait``
about 1.3x and ``batch_wait`` 1.15x faster) and restored when the last one
closes; a larger GC threshold or a shorter switch interval set by the
application is left alone.
"""

from __future__ import annotations

import gc
import sys
import threading

YOUNG_THRESHOLD = 50_000  # allocations between young collections while operators run
SWITCH_INTERVAL = 0.001  # seconds a thread runs before yielding the GIL to a waiting one

_lock = threading.Lock()
_users = 0
_saved_threshold: tuple[int, ...] | None = None
_saved_interval: float | None = None


def acquire() -> None:
    """One more open operator: apply the settings on the first."""
    global _users, _saved_threshold, _saved_interval
    with _lock:
        _users += 1
        if _users > 1:
            return
        threshold = gc.get_threshold()
        if threshold[0] < YOUNG_THRESHOLD:
            _saved_threshold = threshold
            gc.set_threshold(YOUNG_THRESHOLD, *threshold[1:])
        interval = sys.getswitchinterval()
        if interval > SWITCH_INTERVAL:
            _saved_interval = interval
            sys.setswitchinterval(SWITCH_INTERVAL)


def release() -> None:
    """An operator closed: restore the saved settings after the last one."""
    global _users, _saved_threshold, _saved_interval
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users > 0:
            return
        if _saved_threshold is not None:
            gc.set_threshold(*_saved_threshold)
            _saved_threshold = None
        if _saved_interval is not None:
            sys.setswitchinterval(_saved_interval)
            _saved_interval = None
