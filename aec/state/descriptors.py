"""State descriptors (Flink's State V2 names) and ``AggregateFunction``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic

from aec.state.serialization import Serializer, resolve
from aec.state.typevars import ACC, IN, OUT, UK, UV, V


class AggregateFunction(Generic[IN, ACC, OUT]):
    """Incremental aggregation for ``AggregatingState`` (Flink's
    ``AggregateFunction<IN, ACC, OUT>``): inputs ``IN`` fold into an accumulator
    ``ACC`` whose result is ``OUT``.

    ``add`` and ``merge`` return the new accumulator (they may also mutate and
    return the given one).
    """

    def create_accumulator(self) -> ACC:
        raise NotImplementedError

    def add(self, value: IN, accumulator: ACC) -> ACC:
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> OUT:
        raise NotImplementedError

    def merge(self, a: ACC, b: ACC) -> ACC:
        raise NotImplementedError


@dataclass(frozen=True)
class StateDescriptor:
    """Base of all descriptors: a state ``name`` unique within one function, an
    optional ``ttl`` in seconds of processing time (see ``aec.state.ttl``) and an
    optional ``serializer`` (keyword-only): how the state's values are stored, a
    name (``"msgpack"``, the safe default for plain data, or ``"pickle"``, an
    explicit opt-in for any object) or an ``aec.state.serialization.Serializer``;
    None takes the job's ``AecConfig.state_serializer``. A name is kept as its
    ``Serializer``.

    Raises ValueError / TypeError (a bad name, ttl or serializer)."""

    name: str
    ttl: float | None = None
    serializer: Serializer | str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"state name must be a non-empty str, got {self.name!r}")
        if self.serializer is not None:
            try:
                object.__setattr__(self, "serializer", resolve(self.serializer))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"state {self.name!r}: {exc}") from None
        ttl = self.ttl
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0
        ):
            raise ValueError(
                f"state {self.name!r}: ttl must be a number of seconds > 0, got {ttl!r}"
            )


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor, Generic[V]):
    """A single value ``V`` per key; ``default`` is what an absent value reads as
    (None without one: declare ``ValueStateDescriptor[int | None]`` to have a type
    checker see that)."""

    default: V | None = None

    def __init__(
        self,
        name: str,
        default: V | None = None,
        ttl: float | None = None,
        *,
        serializer: str | Serializer | None = None,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "default", default)
        object.__setattr__(self, "serializer", serializer)
        self.__post_init__()


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor, Generic[V]):
    """A list of ``V`` per key."""


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor, Generic[UK, UV]):
    """A map (user key ``UK`` -> value ``UV``) per key."""


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[V]):
    """A value ``V`` per key folded with ``reduce_function(old, new) -> combined``."""

    reduce_function: Callable[[V, V], V] = field(kw_only=True)  # set by __init__

    def __init__(
        self,
        name: str,
        reduce_function: Callable[[V, V], V],
        ttl: float | None = None,
        *,
        serializer: str | Serializer | None = None,
    ) -> None:
        if not callable(reduce_function):
            raise TypeError(f"state {name!r}: reduce_function must be callable")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "reduce_function", reduce_function)
        object.__setattr__(self, "serializer", serializer)
        self.__post_init__()


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, ACC, OUT]):
    """An accumulator ``ACC`` per key driven by an ``AggregateFunction[IN, ACC, OUT]``."""

    aggregate_function: AggregateFunction[IN, ACC, OUT] = field(kw_only=True)  # set by __init__

    def __init__(
        self,
        name: str,
        aggregate_function: AggregateFunction[IN, ACC, OUT],
        ttl: float | None = None,
        *,
        serializer: str | Serializer | None = None,
    ) -> None:
        for method in ("create_accumulator", "add", "get_result"):
            if not callable(getattr(aggregate_function, method, None)):
                raise TypeError(f"state {name!r}: aggregate_function lacks {method}()")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "aggregate_function", aggregate_function)
        object.__setattr__(self, "serializer", serializer)
        self.__post_init__()
