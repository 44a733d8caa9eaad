"""Joins of two keyed inputs on async state (``aec.KeyedCoProcessFunction``s).

``interval_join(lower, upper, process, ...)``: Flink's interval join (DESIGN.md's
"Two-input keyed operators"), its buffers in time buckets so that a record reads only the other
side's entries inside its interval. Modules: ``buffer`` (one side's buffered records),
``bundle`` (a key's records in mini-batches), ``interval`` (the join function),
``process`` (``ProcessJoinFunction``, ``JoinContext``).
"""

from aec.joins.interval import IntervalJoinFunction, interval_join
from aec.joins.process import JoinContext, ProcessJoinFunction

__all__ = ["IntervalJoinFunction", "JoinContext", "ProcessJoinFunction", "interval_join"]
