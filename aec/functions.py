"""The user-facing function API: ``KeyedProcessFunction`` and its contexts (the
record's ``Context`` and ``TimerService`` live in ``aec.contexts``, re-exported here).

After Flink's ``KeyedProcessFunction`` (DataStream V2 async state variant).
``process_element`` and ``on_timer`` may return None, a ``StateFuture``, or be
``async def`` (awaiting StateFutures only; the engine drives the coroutine on
the mailbox thread, no asyncio). All of them run on the mailbox thread.
"""

from __future__ import annotations

from typing import Any, Generic, NoReturn, overload

from aec.config import AecConfig
from aec.contexts import BatchCalls as BatchCalls
from aec.contexts import Context as Context
from aec.contexts import OperatorHooks as OperatorHooks
from aec.contexts import TimerService as TimerService
from aec.elements import Time
from aec.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.handles import AggregatingState, ListState, MapState, ReducingState, ValueState
from aec.state.serialization import Serializer, resolve
from aec.state.ttl import ttl_kind
from aec.state.typevars import ACC, IN, OUT, UK, UV, V


class KeyedProcessFunction(Generic[IN]):
    """Subclass and override ``process_element`` (and ``on_timer`` for timers);
    ``IN`` is the records' value type (``KeyedProcessFunction[dict]``; untyped when
    not given)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Create state handles here: ``self.s = ctx.get_state(descriptor)``."""

    def process_element(self, value: IN, ctx: Context) -> object:
        """Handle one record of key ``ctx.current_key``: return None, a ``StateFuture``,
        or be ``async def``."""
        raise NotImplementedError(f"{type(self).__name__} must override process_element")

    def on_timer(self, timestamp: Time, ctx: Context) -> object:
        """A timer of key ``ctx.current_key`` at ``timestamp`` (seconds) fired."""

    def process_initial_state(self, row: Any, ctx: Context) -> Any:
        """One row of the initial state for key ``ctx.current_key`` (Spark's
        ``handleInitialState``; ``spark_glue.process_keyed_stream(..., initial_state=df)``
        passes each row of ``df`` as a dict, on a job's first start only, before any
        input). State, timers and outputs work as in ``process_element``, and so do
        the return rules; ``ctx.timestamp`` is None. Default: nothing (override it to
        load the row into state)."""

    def close(self) -> None:
        """Release what ``open`` acquired; called once at the end of the run, also of
        a failed one (its error is then a note on the run's ``JobFailure``)."""


class KeyedCoProcessFunction:
    """Two keyed inputs in one key space (Flink's ``KeyedCoProcessFunction``): override
    ``process_element1`` (input 1) and ``process_element2`` (input 2), and ``on_timer``
    for timers. Records of both inputs with the same key share state and timers and
    run one after another in arrival order, whichever input they came from. The return
    rules are ``KeyedProcessFunction.process_element``'s (None, a ``StateFuture``, or
    ``async def``). Run it with ``aec.run_keyed_co`` or ``aec.KeyedCoProcessOperator``.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Create state handles here: ``self.s = ctx.get_state(descriptor)``."""

    def process_element1(self, value: Any, ctx: Context) -> Any:
        """Handle one record of input 1 of key ``ctx.current_key``."""
        raise NotImplementedError(f"{type(self).__name__} must override process_element1")

    def process_element2(self, value: Any, ctx: Context) -> Any:
        """Handle one record of input 2 of key ``ctx.current_key``."""
        raise NotImplementedError(f"{type(self).__name__} must override process_element2")

    def on_timer(self, timestamp: Time, ctx: Context) -> Any:
        """A timer of key ``ctx.current_key`` at ``timestamp`` (seconds) fired."""

    def close(self) -> None:
        """Release what ``open`` acquired; called once at the end of the run, also of
        a failed one (its error is then a note on the run's ``JobFailure``)."""


def check_function_kind(function: Any, expected: type, takes: str) -> None:
    """Raise TypeError unless ``function`` is an instance of ``expected``
    (``KeyedProcessFunction`` or ``KeyedCoProcessFunction``); the message names both
    kinds and what runs each. ``takes`` names the caller (``"KeyedProcessOperator"``)."""
    if isinstance(function, expected):
        return
    raise TypeError(
        f"{takes} takes a {expected.__name__}, got {type(function).__name__}: a "
        "KeyedProcessFunction (one input) runs with run_keyed / KeyedProcessOperator, a "
        "KeyedCoProcessFunction (two inputs) with run_keyed_co / KeyedCoProcessOperator"
    )


class RuntimeContext:
    """Given to ``open``: makes state handles bound to the running operator."""

    def __init__(self, operator: OperatorHooks) -> None:
        self._operator = operator

    # one overload per descriptor type, so a type checker knows the handle's methods
    @overload
    def get_state(self, descriptor: ValueStateDescriptor[V]) -> ValueState[V]: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor[V]) -> ListState[V]: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor[UK, UV]) -> MapState[UK, UV]: ...
    @overload
    def get_state(self, descriptor: ReducingStateDescriptor[V]) -> ReducingState[V]: ...
    @overload
    def get_state(
        self, descriptor: AggregatingStateDescriptor[IN, ACC, OUT]
    ) -> AggregatingState[IN, ACC, OUT]: ...
    @overload
    def get_state(self, descriptor: StateDescriptor) -> Any: ...  # a descriptor kind of its own

    def get_state(self, descriptor: StateDescriptor) -> object:
        """The handle for ``descriptor`` (ValueState, ListState, MapState,
        ReducingState or AggregatingState). The same name twice returns the same
        handle. The backend is told how the state's values are stored (the
        descriptor's serializer, else ``AecConfig.state_serializer``) and, for a
        state with a TTL, that its values carry expiry times, before any request of it. Raises TypeError for a non-descriptor, ValueError when the
        name is already used by a different descriptor."""
        operator = self._operator
        handle = operator.state_handle(descriptor)
        backend = operator.backend
        backend.register_state(descriptor.name, state_serializer(descriptor, operator.config))
        if descriptor.ttl is not None:  # the backend removes what expires (ttl_cleanup)
            backend.register_ttl(descriptor.name, descriptor.ttl, ttl_kind(descriptor))
        return handle

    @property
    def max_parallelism(self) -> int:
        return self._operator.config.max_parallelism

    @property
    def config(self) -> AecConfig:
        """The running operator's configuration (read it; a function may choose how it
        runs by it, e.g. whether it can hold records in a mini-batch)."""
        return self._operator.config

    def call_async(self, fn: object, *args: object, **kwargs: object) -> NoReturn:
        """Always raises RuntimeError: external calls belong to a record
        (``Context.call_async`` in ``process_element`` / ``on_timer``), not to ``open``."""
        raise RuntimeError(
            "call_async() outside a record: call it on the Context of process_element or "
            "on_timer, not in open()"
        )

    def call_batched(self, batcher: object, arg: object, **kwargs: object) -> NoReturn:
        """Always raises RuntimeError, as ``call_async`` does here."""
        raise RuntimeError(
            "call_batched() outside a record: call it on the Context of process_element or "
            "on_timer, not in open()"
        )


def state_serializer(descriptor: StateDescriptor, config: AecConfig) -> Serializer:
    """How ``descriptor``'s values are stored: its own serializer, else the job's."""
    return resolve(descriptor.serializer, resolve(config.state_serializer))
