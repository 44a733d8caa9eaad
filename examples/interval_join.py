"""Two keyed streams joined in time: ``aec.joins.interval_join`` with ``run_keyed_co``.

Engine only (``pip install aec``). Run: ``python examples/interval_join.py``.

Clicks (input 1, the left side) are paired with the ad impressions (input 2, the
right side) shown to the same user in the 10 seconds before the click:
``impression.ts`` in ``[click.ts - 10, click.ts]``. Each input sends its own
watermarks; the operator's watermark is their minimum, and a record below it is late
(here: to a side output per side). A buffered record leaves the state once the
watermark passes its cleanup time, so the state stays bounded.
"""

from __future__ import annotations

from aec import Record, Watermark, run_keyed_co
from aec.joins import JoinContext, ProcessJoinFunction, interval_join


class Attribute(ProcessJoinFunction):
    """One output per (click, impression) pair: the ad and how long before the click."""

    def process_element(self, click: str, impression: str, ctx: JoinContext) -> list:
        return [(ctx.current_key, click, impression, ctx.left_timestamp - ctx.right_timestamp)]


def main() -> None:
    source = [
        (2, Record("ann", "ad-shoes", 100.0)),
        (2, Record("bob", "ad-books", 101.0)),
        (1, Record("ann", "click-1", 104.0)),  # 4 s after ad-shoes
        (2, Record("ann", "ad-hats", 105.0)),
        (1, Record("bob", "click-2", 120.0)),  # ad-books was 19 s before: no pair
        (1, Watermark(118.0)),
        (2, Watermark(110.0)),  # the operator's watermark: min(118, 110) = 110
        (1, Record("ann", "click-3", 112.0)),  # ad-hats 7 s before; ad-shoes 12 s: too long
        (2, Record("bob", "ad-late", 99.0)),  # below 110: late
    ]
    join = interval_join(-10, 0, Attribute(), left_late_tag="late clicks",
                         right_late_tag="late impressions")  # fmt: skip
    result = run_keyed_co(source, join)
    for output in result.outputs:
        if not isinstance(output, Watermark):
            print("pair:", output)
    print("watermarks:", [w.timestamp for w in result.outputs if isinstance(w, Watermark)])
    print("late:", result.side_outputs)


if __name__ == "__main__":
    main()
