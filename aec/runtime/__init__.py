"""The runtime: FLIP-425's Async Execution Controller and the operator around it.

Modules in data-flow order: ``mailbox`` (the one user-code thread's queue),
``record_context`` (a record's reference count), ``key_accounting`` (which record
holds each key), ``buffers`` (active and blocking buffers), ``epochs`` (records
between watermarks), ``controller`` (the AEC), ``executor`` (batches to I/O
threads), ``timers`` (per-key timer queues), ``event_loop`` (one asyncio loop
thread for external calls), ``operator`` (``KeyedProcessOperator``), ``co_operator``
(``KeyedCoProcessOperator``: two inputs), ``run`` (``run_keyed``, ``run_keyed_co``), ``interpreter_tuning`` (GC and GIL settings while operators run).
"""

from aec.runtime.co_operator import KeyedCoProcessOperator
from aec.runtime.operator import KeyedProcessOperator
from aec.runtime.run import RunResult, run_keyed, run_keyed_co

__all__ = [
    "KeyedCoProcessOperator",
    "KeyedProcessOperator",
    "RunResult",
    "run_keyed",
    "run_keyed_co",
]
