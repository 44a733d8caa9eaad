"""The glue's columnar paths give exactly the per-row answers.

``encode_rows`` (per-column output builder with pyarrow fast paths) against
``encode_columns(rows_as_dicts(...))`` (the per-value reference), and
``BoundedOutOfOrderness.on_records`` (one check per interval) against
``on_record`` per record. No Spark session: only pyspark's types.
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import types as T

from spark_glue.convert import arrow_schema, encode_columns, encode_rows, rows_as_dicts
from spark_glue.watermarks import BoundedOutOfOrderness

SCHEMA = T.StructType(
    [
        T.StructField("i", T.LongType()),
        T.StructField("b", T.ByteType()),
        T.StructField("ts", T.TimestampNTZType()),
        T.StructField("tz", T.TimestampType()),
        T.StructField("s", T.StringType()),
    ]
)
TARGET = arrow_schema(SCHEMA)

seconds = st.one_of(
    st.integers(-(10**10), 10**10),
    st.floats(-1e10, 1e10, allow_nan=False),
    st.floats(0, 2e9).map(lambda x: round(x, 6)),
)
integers = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-200, 200))
values = {
    "i": st.one_of(st.none(), integers, st.floats(-1e6, 1e6), st.booleans()),
    "b": st.one_of(st.none(), st.integers(-200, 200), st.integers(-5, 5).map(float)),
    "ts": st.one_of(st.none(), seconds, st.just(math.nan), st.datetimes()),
    "tz": st.one_of(st.none(), seconds, st.datetimes(timezones=st.just(dt.UTC))),
    "s": st.one_of(st.none(), st.text(max_size=3), st.integers()),
}
column_of = {name: st.lists(strategy, min_size=1, max_size=8) for name, strategy in values.items()}


def outcome(function, rows):
    try:
        return [array.to_pylist() for array in function(rows)], None
    except TypeError as exc:
        return None, str(exc)


@given(st.fixed_dictionaries(column_of), st.booleans())
def test_encode_rows_equals_the_per_value_reference(columns, as_tuples):
    rows_count = min(len(c) for c in columns.values())
    names = SCHEMA.fieldNames()
    rows = [{name: columns[name][r] for name in names} for r in range(rows_count)]
    if as_tuples:
        rows = [tuple(row[name] for name in names) for row in rows]
    reference = outcome(lambda r: encode_columns(rows_as_dicts(r, SCHEMA), SCHEMA, TARGET), rows)
    fast = outcome(lambda r: encode_rows(r, SCHEMA, TARGET), rows)
    assert fast == reference


def test_encode_rows_keeps_the_row_errors():
    with pytest.raises(TypeError, match="not in the schema"):
        encode_rows([{"i": 1, "typo": 2}], SCHEMA, TARGET)
    with pytest.raises(TypeError, match="2 values"):
        encode_rows([(1, 2)], SCHEMA, TARGET)
    with pytest.raises(TypeError, match="'b'"):
        encode_rows([{"b": 1000}], SCHEMA, TARGET)  # out of a byte's range


def test_timestamps_from_seconds_round_like_timedelta():
    stamps = [0.0000005, 0.0000015, 1.25e-6, 1_700_000_000.123456, 86_399.9999996, 7]
    got = encode_rows([{"ts": s} for s in stamps], SCHEMA, TARGET)[2].to_pylist()
    epoch = dt.datetime(1970, 1, 1)
    assert got == [epoch + dt.timedelta(seconds=s) for s in stamps]
    assert pa.types.is_timestamp(TARGET.field("ts").type)


@given(
    st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)), max_size=60),
    st.integers(1, 7),
    st.floats(0, 100),
    st.lists(st.integers(1, 9), min_size=1, max_size=10),
)
def test_on_records_matches_on_record(stamps, interval, delay, chunking):
    one = BoundedOutOfOrderness(delay, interval)
    per_record = [(i, m) for i, s in enumerate(stamps) if (m := one.on_record(s)) is not None]
    many = BoundedOutOfOrderness(delay, interval)
    chunked, start, turn = [], 0, 0
    while start < len(stamps):
        size = min(chunking[turn % len(chunking)], many.until_check(), len(stamps) - start)
        turn += 1
        present = [s for s in stamps[start : start + size] if s is not None]
        mark = many.on_records(size, max(present) if present else None)
        start += size
        if mark is not None:
            chunked.append((start - 1, mark))
    assert chunked == per_record
    assert (many.current, many.emitted) == (one.current, one.emitted)


def test_an_infinite_event_time_never_ends_the_input():
    """A row at event time +inf would make ``max - delay`` infinite: that is no
    watermark (only the end of the data ends an input), per record, per chunk and at a
    micro-batch's end."""
    import math

    for interval in (1, 3):
        generator = BoundedOutOfOrderness(5.0, interval)
        marks = [generator.on_record(t) for t in (10.0, math.inf, 20.0)]
        assert math.inf not in marks and generator.check_now() is None
        chunked = BoundedOutOfOrderness(5.0, interval)
        assert chunked.on_records(1, 10.0) in (None, 5.0)
        assert chunked.on_records(1, math.inf) is None and chunked.check_now() is None
