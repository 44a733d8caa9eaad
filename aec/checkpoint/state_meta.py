"""What a checkpoint records about each state, and the check a restore makes with it.

A state is stored by its name; what the bytes under that name mean depends on the
state's type (one value, a list, a map, a reducing or aggregating accumulator),
on its serializer and on whether it has a TTL (values stored with their expiry).
A checkpoint records ``{name: {"type", "serializer", "ttl"}}`` for every state the
operator made (``describe``); ``check`` compares it with the states the restoring
function made in ``open()`` before anything live changes, so a name reused for
another kind of state is a ``ValueError`` naming it instead of state read as
something else (Flink: the ``StateMetaInfoSnapshot`` compatibility check).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aec.config import AecConfig
from aec.functions import state_serializer
from aec.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from aec.state.serialization import Serializer, resolve

_TYPES = (
    (ReducingStateDescriptor, "reducing"),
    (AggregatingStateDescriptor, "aggregating"),
    (ValueStateDescriptor, "value"),
    (ListStateDescriptor, "list"),
    (MapStateDescriptor, "map"),
)


def state_type(descriptor: StateDescriptor) -> str:
    """``"value"``, ``"list"``, ``"map"``, ``"reducing"`` or ``"aggregating"`` (the
    descriptor's class otherwise)."""
    for kind, name in _TYPES:
        if isinstance(descriptor, kind):
            return name
    return type(descriptor).__qualname__


def describe(
    descriptors: Iterable[StateDescriptor], config: AecConfig
) -> dict[str, dict[str, object]]:
    """``{name: {"type", "serializer", "ttl"}}`` of ``descriptors`` (JSON-able)."""
    return {
        d.name: {
            "type": state_type(d),
            "serializer": state_serializer(d, config).name,
            "ttl": d.ttl is not None,
        }
        for d in descriptors
    }


def check(
    recorded: Mapping[str, Mapping[str, object]],
    live: Mapping[str, Mapping[str, object]],
    config: AecConfig,
    where: str,
) -> list[tuple[str, Serializer]]:
    """Check the states a checkpoint at ``where`` recorded against the ``live`` ones
    (``describe`` of the restoring function's states).

    Returns the ``(name, serializer)`` of every recorded state the function has not
    made yet (made later on demand, as a window trigger's state), for the backend
    to decode them with: the job's serializer, which must be the recorded one.

    Raises ValueError naming the state: a live state recorded with another type,
    serializer or TTL; a state not made yet recorded with a serializer other than
    the job's (``AecConfig.state_serializer``; make such a state in ``open()``).
    """
    later: list[tuple[str, Serializer]] = []
    default = resolve(config.state_serializer)
    for name, about in sorted(recorded.items()):
        now = live.get(name)
        if now is None:
            stored = about.get("serializer")
            if stored != default.name:
                raise ValueError(
                    f"checkpoint {where}: state {name!r} was stored with the {stored!r} "
                    f"serializer, and this job stores states it makes later with "
                    f"{default.name!r}; make the state in open() with serializer={stored!r}"
                )
            later.append((name, default))
            continue
        for field in ("type", "serializer", "ttl"):
            if about.get(field) != now[field]:
                raise ValueError(
                    f"checkpoint {where}: state {name!r} was a {_what(about)}, the "
                    f"function now makes a {_what(now)} of that name: a state name "
                    "cannot be reused for another kind of state (rename the new state)"
                )
    return later


def _what(about: Mapping[str, object]) -> str:
    ttl = " with TTL" if about.get("ttl") else ""
    return f"{about.get('type')} state{ttl} stored with {about.get('serializer')!r}"
