"""Hypothesis strategies for testing keyed functions with aec (optional: needs hypothesis).

    from hypothesis import given, strategies as st
    from aec.testing.strategies import configs, keyed_streams
    from aec.testing.checker import assert_equivalent

    @given(keyed_streams(), configs(), st.data())
    def test_my_function(source, config, data):
        assert_equivalent(MyFunction, source, configs=[config], data=data)

- ``keyed_streams`` draws input: ``Record``s over a few keys (so records of one
  key collide and wait for each other), integer values that double as event
  times, and non-decreasing ``Watermark``s interleaved among them.
- ``configs`` draws async ``AecConfig``s with small in-flight limits and
  buffers, in one or both watermark modes.

hypothesis is imported by this module only; ``import aec`` never needs it.
Importing this module without hypothesis raises ImportError saying so.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from aec.errors import needs_extra

with needs_extra("hypothesis", "aec.testing.strategies", "hypothesis"):
    from hypothesis import strategies as st

from aec.config import AecConfig
from aec.elements import Record, Watermark

__all__ = ["DEFAULT_KEYS", "configs", "keyed_streams"]

#: Keys ``keyed_streams`` draws from by default: few, of mixed types (str, int, tuple).
DEFAULT_KEYS: tuple[Hashable, ...] = ("a", "b", "c", 1, (2, "x"))

_WATERMARK_MODES = ("serial", "parallel")


def keyed_streams(
    keys: Sequence[Hashable] = DEFAULT_KEYS,
    max_size: int = 40,
    max_value: int = 30,
    *,
    min_size: int = 0,
    watermarks: bool = True,
    max_watermark_step: int | None = None,
) -> st.SearchStrategy[list[Record | Watermark]]:
    """A strategy for input streams: lists of ``Record``s and ``Watermark``s.

    Args:
        keys: the keys records are drawn from; keep it small so same-key records
            collide (default ``DEFAULT_KEYS``).
        max_size: at most this many elements (records plus watermarks).
        max_value: each record is ``Record(key, v, timestamp=v)`` with ``v`` an int in
            ``0..max_value``, so values double as event times.
        min_size: at least this many elements.
        watermarks: interleave watermarks (about one element in six) when True.
        max_watermark_step: the largest increase from one watermark to the next
            (default ``max(1, max_value // 3 + 2)``); the first watermark is at
            least -1. Watermarks never decrease and may repeat.

    Late records (event time at or below the last watermark) are generated too,
    as in real streams. Shrinks towards fewer elements, records rather than
    watermarks, the first key and small values.

    Raises:
        ValueError: for an empty ``keys``, negative sizes or values, or
            ``min_size > max_size``.
    """
    keys = tuple(keys)
    if not keys:
        raise ValueError("keyed_streams needs at least one key")
    if min_size < 0 or max_size < min_size:
        raise ValueError(f"need 0 <= min_size <= max_size, got {min_size}, {max_size}")
    if max_value < 0:
        raise ValueError(f"max_value must be >= 0, got {max_value}")
    step = max(1, max_value // 3 + 2) if max_watermark_step is None else max_watermark_step
    if step < 0:
        raise ValueError(f"max_watermark_step must be >= 0, got {step}")
    # (kind, key, value, watermark step): kind 0..4 is a record, 5 a watermark, so
    # shrinking turns watermarks into records before removing elements.
    element = st.tuples(
        st.integers(0, 5 if watermarks else 0),
        st.sampled_from(keys),
        st.integers(0, max_value),
        st.integers(0, step),
    )
    return _streams(st.lists(element, min_size=min_size, max_size=max_size))


@st.composite
def _streams(
    draw: st.DrawFn, elements: st.SearchStrategy[list[tuple[int, Hashable, int, int]]]
) -> list[Record | Watermark]:
    # composite rather than .map(), so failing examples print as Records and Watermarks
    stream: list[Record | Watermark] = []
    watermark = -1
    for kind, key, value, step in draw(elements):
        if kind == 5:
            watermark += step
            stream.append(Watermark(watermark))
        else:
            stream.append(Record(key, value, timestamp=value))
    return stream


def configs(
    watermark_order: str | None = None,
    *,
    max_in_flight: int = 50,
    max_buffer_size: int = 20,
) -> st.SearchStrategy[AecConfig]:
    """A strategy for async ``AecConfig``s.

    Args:
        watermark_order: ``"serial"``, ``"parallel"``, or None for both modes.
        max_in_flight: ``in_flight_records_limit`` is drawn from ``1..max_in_flight``.
        max_buffer_size: ``buffer_size`` is drawn from ``1..max_buffer_size``.

    Other options keep their defaults (``async_state=True``). Shrinks towards an
    in-flight limit and a buffer of 1 and serial mode.

    Raises:
        ValueError: for an unknown ``watermark_order`` or a bound below 1.
    """
    if watermark_order is None:
        orders = st.sampled_from(_WATERMARK_MODES)
    elif watermark_order in _WATERMARK_MODES:
        orders = st.just(watermark_order)
    else:
        raise ValueError(
            f"watermark_order must be 'serial', 'parallel' or None, got {watermark_order!r}"
        )
    if max_in_flight < 1 or max_buffer_size < 1:
        raise ValueError(
            f"max_in_flight and max_buffer_size must be >= 1, got {max_in_flight}, {max_buffer_size}"
        )
    return st.builds(
        AecConfig,
        in_flight_records_limit=st.integers(1, max_in_flight),
        buffer_size=st.integers(1, max_buffer_size),
        watermark_order=orders,
    )
