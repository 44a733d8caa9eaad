"""The synthetic two-input records of bench_joins, without aec (the PyFlink peer imports
this in its own venv).

``co_rows(records, keys, seed)`` yields ``(input, key, value, timestamp)`` tuples (input 1
or 2 alternating at random), timestamps rising ~1 s per record per key with up to
``DISORDER`` seconds of disorder, keys uniform over ``range(keys)``, and the string
``"watermark"`` every ``WATERMARK_EVERY`` records. ``steady_rows`` is the buffer-size
workload: every key gets a left and a right record each second, in order. Seeded: the
same arguments give the same rows everywhere.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

WATERMARK_EVERY = 1000  # records between watermarks
DISORDER = 5.0  # seconds of event-time disorder
LOWER, UPPER = -5.0, 5.0  # the benchmarks' interval: right.ts - left.ts in [-5, 5] s


def co_rows(records: int, keys: int, seed: int = 7) -> Iterator[tuple[int, int, int, float] | str]:
    """Rows ``(input, key, value, timestamp seconds)``, ``"watermark"`` markers between."""
    rng = random.Random(seed)
    step = keys / 2.0  # each key sees about one record of each input per second
    for i in range(records):
        if i and i % WATERMARK_EVERY == 0:
            yield "watermark"
        t = i / step + rng.uniform(0, DISORDER)
        yield rng.choice((1, 2)), rng.randrange(keys), i, t


def steady_rows(seconds: int, keys: int) -> Iterator[tuple[int, int, int, float]]:
    """Every key: a left and a right record at each whole second ``0..seconds-1``."""
    value = 0
    for t in range(seconds):
        for key in range(keys):
            for side in (1, 2):
                value += 1
                yield side, key, value, float(t)
