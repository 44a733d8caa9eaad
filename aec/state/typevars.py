"""The type variables of the state API, with defaults for type checkers (PEP 696).

``T`` is what a ``StateFuture`` delivers; ``E`` what a ``StateIterator`` yields; ``V`` a state's value (value, list element,
reduced value); ``UK``/``UV`` a map state's user keys and values; ``IN``/``ACC``/``OUT``
an ``AggregateFunction``'s input, accumulator and result (Flink's names).

Each defaults to the untyped ``typing.Any``: a descriptor made without a typed default
(``ValueStateDescriptor("seen")``) or a handle named without parameters
(``ValueState``) is as untyped as it always was, while
``ValueStateDescriptor("count", default=0)`` gives a ``ValueState[int]`` whose
``async_value()`` is a ``StateFuture[int]``. Python 3.11's ``TypeVar`` takes no
default, and defaults matter only to type checkers, so the runtime gets plain ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)
    E = TypeVar("E", default=Any)
    V = TypeVar("V", default=Any)
    UK = TypeVar("UK", default=Any)
    UV = TypeVar("UV", default=Any)
    IN = TypeVar("IN", default=Any)
    ACC = TypeVar("ACC", default=Any)
    OUT = TypeVar("OUT", default=Any)
else:
    from typing import TypeVar

    T = TypeVar("T")
    E = TypeVar("E")
    V = TypeVar("V")
    UK = TypeVar("UK")
    UV = TypeVar("UV")
    IN = TypeVar("IN")
    ACC = TypeVar("ACC")
    OUT = TypeVar("OUT")

__all__ = ["ACC", "E", "IN", "OUT", "T", "UK", "UV", "V"]
