"""Shared pieces of the windowing tests: functions, backends, and a runner that
cuts the output into epochs (what Flink's harness compares with
``assertOutputEqualsSorted`` after each watermark)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import aec
from aec import AecConfig, AggregateFunction, Record, Watermark
from aec.clock import ManualClock
from aec.windowing import ProcessWindowFunction
from backends import MemoryBackend, RocksDBBackend

SYNC = AecConfig(async_state=False)
ASYNC = AecConfig(buffer_size=3, in_flight_records_limit=10)
CONFIGS = {"sync": SYNC, "async": ASYNC}
BACKENDS = ("memory", "rocksdb")


def make_backend(kind: str, tmp_path: Any) -> Any:
    if kind == "memory":
        return MemoryBackend()
    path = tmp_path / f"rocks-{len(list(tmp_path.iterdir()))}"
    return RocksDBBackend(str(path))


class SumAggregate(AggregateFunction):
    """Sums the second field of ``(key, n)`` tuples into ``(key, total)``."""

    def create_accumulator(self) -> list:
        return [None, 0]

    def add(self, value: tuple, acc: list) -> list:
        return [value[0], acc[1] + value[1]]

    def get_result(self, acc: list) -> tuple:
        return (acc[0], acc[1])

    def merge(self, a: list, b: list) -> list:
        return [a[0] or b[0], a[1] + b[1]]


def sum_reduce(a: tuple, b: tuple) -> tuple:
    return (a[0], a[1] + b[1])


class SumWithWindow(ProcessWindowFunction):
    """``(f"{key}-{sum}", start, end)`` like Flink's session-test window function."""

    def process(self, key: Any, context: Any, elements: list) -> list:
        total = sum(v[1] for v in elements)
        window = context.window()
        return [(f"{key}-{total}", window.start, window.end)]


class SumList(ProcessWindowFunction):
    """Sums a window's list of ``(key, n)``: Flink's ``RichSumReducer`` (apply)."""

    def process(self, key: Any, context: Any, elements: list) -> list:
        return [(key, sum(v[1] for v in elements))]


def rec(key: str, n: int, t: float) -> Record:
    return Record(key, (key, n), t)


def run(source: list, function: Any, config: AecConfig = SYNC, backend: Any = None,
        clock: Any = None) -> aec.RunResult:  # fmt: skip
    return aec.run_keyed(source, function, backend=backend, config=config, clock=clock)


def epochs(outputs: list) -> list[tuple[list, Any]]:
    """``[(sorted outputs before watermark w, w), ...]``: per-epoch multisets."""
    result, current = [], []
    for item in outputs:
        if type(item) is Watermark:
            result.append((sorted(current, key=repr), item.timestamp))
            current = []
        else:
            current.append(item)
    if current:
        result.append((sorted(current, key=repr), None))
    return result


__all__ = [
    "ASYNC", "BACKENDS", "CONFIGS", "SYNC", "ManualClock", "Record", "SumAggregate", "SumList",
    "SumWithWindow", "Watermark", "epochs", "make_backend", "rec", "run",
    "sum_reduce",
]  # fmt: skip


@st.composite
def window_sources(draw, max_size: int = 30, watermark_odds: int = 5, max_value: int = 5) -> list:
    """Records of keys a/b/c, values 1..``max_value``, timestamps in [0, 60), and rising
    watermarks (about one element in ``watermark_odds``)."""
    elements, watermark = [], 0
    for _ in range(draw(st.integers(1, max_size))):
        if draw(st.integers(0, watermark_odds - 1)) == 0:
            watermark += draw(st.integers(1, 15))
            elements.append(Watermark(watermark))
        else:
            key = draw(st.sampled_from("abc"))
            elements.append(rec(key, draw(st.integers(1, max_value)), draw(st.integers(0, 59))))
    return elements
