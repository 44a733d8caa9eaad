"""The state API (FLIP-424's State V2): descriptors, handles, futures, requests, TTL,
the backend contract and the engine's own in-memory backend.

Modules, in the order a state access flows through them: ``descriptors`` (what a
function declares), ``handles`` (what it calls: ``async_value()``, ...), ``future``
(``StateFuture``), ``requests`` (``StateRequest``: the engine-backend contract),
``ttl`` (expiring handles), ``backend`` (``StateBackend``, ``BackendSpec``) and
``memory`` (``MemoryBackend``: the default, part of the engine as Flink's heap
backend is part of its runtime).
"""

from aec.state.backend import BackendSpec, StateBackend
from aec.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.future import StateFuture, combine_all, completed_future
from aec.state.handles import (
    ITERATOR_CHUNK,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    StateIterator,
    ValueState,
    make_handle,
)
from aec.state.memory import MemoryBackend, MemorySpec

__all__ = [
    "ITERATOR_CHUNK", "AggregateFunction", "AggregatingState", "AggregatingStateDescriptor",
    "BackendSpec", "ListState", "ListStateDescriptor", "MapState", "MapStateDescriptor",
    "MemoryBackend", "MemorySpec", "ReducingState", "ReducingStateDescriptor", "StateBackend",
    "StateDescriptor", "StateFuture", "StateIterator", "ValueState", "ValueStateDescriptor",
    "combine_all", "completed_future", "make_handle",
]  # fmt: skip
