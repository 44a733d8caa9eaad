"""The synthetic records of bench_windows, without aec (the PyFlink peer imports this
in its own venv).

``synthetic_rows(records, keys, step, seed)`` yields ``(key, value, timestamp)`` tuples
and the string ``"watermark"`` every 1,000 records: timestamps rise ``step`` seconds
per record with up to 30 s of disorder (uniform), keys are uniform over ``range(keys)``,
values uniform in [0, 1). Seeded: the same arguments give the same rows everywhere.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

WATERMARK_EVERY = 1000  # records between watermarks
DISORDER = 30.0  # seconds of event-time disorder


def synthetic_rows(
    records: int, keys: int, step: float, seed: int = 7
) -> Iterator[tuple[int, float, float] | str]:
    """Rows ``(key, value, timestamp seconds)``, with ``"watermark"`` markers."""
    rng = random.Random(seed)
    for i in range(records):
        if i and i % WATERMARK_EVERY == 0:
            yield "watermark"
        t = i * step + rng.uniform(0, DISORDER)
        yield rng.randrange(keys), rng.random(), t
