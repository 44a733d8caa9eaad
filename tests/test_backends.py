"""Backend conformance: every backend answers batches exactly as MemoryBackend does."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rocksdict import WriteOptions

from aec.keygroups import KeyGroupRange, key_group_for, key_group_range_for
from aec.state.requests import Op, StateRequest
from backends import LatencyBackend, MemoryBackend, RocksDBBackend, StateBackend
from backends.keycodec import decode_key, encode_key, key_prefix, split_db_key
from backends.latency import LatencySampler
from backends.rocksdb_batch import run_value_batch

MAX_PARALLELISM = 128


def req(op: int, state: str, key, user_key=None, value=None) -> StateRequest:
    return StateRequest(op, state, key, key_group_for(key, MAX_PARALLELISM), user_key, value)


def run(backend: StateBackend, *requests: StateRequest) -> list:
    """Execute ``requests`` as one batch; the results in order."""
    backend.execute_batch(list(requests))
    return [r.result for r in requests]


def assert_same_as_memory(backend: StateBackend, batches) -> None:
    """Run ``batches`` on ``backend`` and on a fresh MemoryBackend: every batch's
    results and, at the end, the states ``v``, ``l`` and ``m`` must be equal."""
    memory = MemoryBackend()
    for batch in batches:
        mine = [clone_request(r) for r in batch]
        memory.execute_batch(batch)
        backend.execute_batch(mine)
        assert [normalized(r) for r in mine] == [normalized(r) for r in batch], batch
    for state in ("v", "l", "m"):
        assert backend.state_items(state) == memory.state_items(state), state


BACKENDS: dict[str, Callable[[str], StateBackend]] = {
    "memory": lambda tmp: MemoryBackend(),
    "rocksdb": lambda tmp: RocksDBBackend(os.path.join(tmp, "db")),
    "latency": lambda tmp: LatencyBackend(MemoryBackend(), 0.001),
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, tmp_path) -> Iterator[StateBackend]:
    instance = BACKENDS[request.param](str(tmp_path))
    instance.open()
    yield instance
    instance.close()


# --- hand-written conformance ---------------------------------------------------------


class TestValueState:
    def test_absent_reads_none(self, backend):
        assert run(backend, req(Op.VALUE_GET, "v", "a")) == [None]

    def test_put_then_get_in_one_batch(self, backend):
        assert run(backend, req(Op.VALUE_PUT, "v", "a", value=1), req(Op.VALUE_GET, "v", "a")) == [
            None,
            1,
        ]

    def test_get_put_get_in_one_batch(self, backend):
        run(backend, req(Op.VALUE_PUT, "v", "a", value=1))
        results = run(
            backend,
            req(Op.VALUE_GET, "v", "a"),
            req(Op.VALUE_PUT, "v", "a", value=2),
            req(Op.VALUE_GET, "v", "a"),
        )
        assert results == [1, None, 2]

    def test_put_none_clears(self, backend):
        run(backend, req(Op.VALUE_PUT, "v", "a", value=1))
        run(backend, req(Op.VALUE_PUT, "v", "a", value=None))
        assert run(backend, req(Op.VALUE_GET, "v", "a")) == [None]
        assert backend.state_items("v") == {}

    def test_clear_and_clear_absent(self, backend):
        run(backend, req(Op.VALUE_PUT, "v", "a", value=1), req(Op.VALUE_CLEAR, "v", "a"))
        run(backend, req(Op.VALUE_CLEAR, "v", "never"))
        assert run(backend, req(Op.VALUE_GET, "v", "a")) == [None]
        assert backend.state_items("v") == {}

    def test_states_and_keys_are_separate(self, backend):
        run(
            backend,
            req(Op.VALUE_PUT, "v", "a", value=1),
            req(Op.VALUE_PUT, "w", "a", value=2),
            req(Op.VALUE_PUT, "v", ("a",), value=3),
        )
        assert backend.state_items("v") == {"a": 1, ("a",): 3}
        assert backend.state_items("w") == {"a": 2}

    def test_equal_keys_share_state(self, backend):
        # 1 == 1.0 == True as dict keys; every backend must agree.
        run(backend, req(Op.VALUE_PUT, "v", 1.0, value="x"))
        assert run(backend, req(Op.VALUE_GET, "v", 1), req(Op.VALUE_GET, "v", True)) == ["x", "x"]

    def test_values_of_any_picklable_type(self, backend):
        value = {"nested": [1, 2.5, None, ("t", b"b")]}
        run(backend, req(Op.VALUE_PUT, "v", "a", value=value))
        assert run(backend, req(Op.VALUE_GET, "v", "a")) == [value]


class TestListState:
    def test_absent_reads_empty(self, backend):
        assert run(backend, req(Op.LIST_GET, "l", "a")) == [[]]

    def test_add_to_absent_then_get(self, backend):
        assert run(backend, req(Op.LIST_ADD, "l", "a", value=1), req(Op.LIST_GET, "l", "a")) == [
            None,
            [1],
        ]

    def test_add_and_add_all_accumulate_across_batches(self, backend):
        run(
            backend,
            req(Op.LIST_ADD, "l", "a", value=1),
            req(Op.LIST_ADD_ALL, "l", "a", value=[2, 3]),
        )
        run(
            backend,
            req(Op.LIST_ADD, "l", "a", value=None),
            req(Op.LIST_ADD_ALL, "l", "a", value=[]),
        )
        assert run(backend, req(Op.LIST_GET, "l", "a")) == [[1, 2, 3, None]]

    def test_get_returns_a_copy(self, backend):
        (first,) = run(backend, req(Op.LIST_ADD, "l", "a", value=1), req(Op.LIST_GET, "l", "a"))[1:]
        first.append("mutated")
        results = run(
            backend,
            req(Op.LIST_GET, "l", "a"),
            req(Op.LIST_ADD, "l", "a", value=2),
            req(Op.LIST_GET, "l", "a"),
        )
        assert results == [[1], None, [1, 2]]

    def test_put_replaces_and_empty_put_clears(self, backend):
        run(backend, req(Op.LIST_ADD, "l", "a", value=1))
        assert run(
            backend, req(Op.LIST_PUT, "l", "a", value=[7, 8]), req(Op.LIST_GET, "l", "a")
        ) == [
            None,
            [7, 8],
        ]
        run(backend, req(Op.LIST_PUT, "l", "a", value=[]))
        assert backend.state_items("l") == {}

    def test_clear_and_clear_absent(self, backend):
        results = run(
            backend,
            req(Op.LIST_ADD, "l", "a", value=1),
            req(Op.LIST_CLEAR, "l", "a"),
            req(Op.LIST_GET, "l", "a"),
            req(Op.LIST_CLEAR, "l", "never"),
        )
        assert results == [None, None, [], None]
        assert backend.state_items("l") == {}


class TestMapState:
    def test_absent_map(self, backend):
        results = run(
            backend,
            req(Op.MAP_GET, "m", "a", user_key="x"),
            req(Op.MAP_CONTAINS, "m", "a", user_key="x"),
            req(Op.MAP_IS_EMPTY, "m", "a"),
            req(Op.MAP_ITER, "m", "a"),
            req(Op.MAP_REMOVE, "m", "a", user_key="x"),
            req(Op.MAP_CLEAR, "m", "a"),
        )
        assert results == [None, False, True, [], None, None]

    def test_put_get_contains_in_one_batch(self, backend):
        results = run(
            backend,
            req(Op.MAP_PUT, "m", "a", user_key="x", value=1),
            req(Op.MAP_GET, "m", "a", user_key="x"),
            req(Op.MAP_CONTAINS, "m", "a", user_key="x"),
            req(Op.MAP_CONTAINS, "m", "a", user_key="y"),
            req(Op.MAP_IS_EMPTY, "m", "a"),
        )
        assert results == [None, 1, True, False, False]

    def test_none_value_is_stored(self, backend):
        results = run(
            backend,
            req(Op.MAP_PUT, "m", "a", user_key="x", value=None),
            req(Op.MAP_GET, "m", "a", user_key="x"),
            req(Op.MAP_CONTAINS, "m", "a", user_key="x"),
        )
        assert results == [None, None, True]

    def test_put_all_and_iter(self, backend):
        run(backend, req(Op.MAP_PUT_ALL, "m", "a", value={"x": 1, 2: "two", (3, "t"): None}))
        run(
            backend,
            req(Op.MAP_PUT_ALL, "m", "a", value={}),
            req(Op.MAP_PUT, "m", "b", user_key="x", value=9),
        )
        (entries,) = run(backend, req(Op.MAP_ITER, "m", "a"))
        assert len(entries) == 3
        assert dict(entries) == {"x": 1, 2: "two", (3, "t"): None}
        assert backend.state_items("m") == {"a": {"x": 1, 2: "two", (3, "t"): None}, "b": {"x": 9}}

    def test_iter_sees_earlier_writes_of_the_batch(self, backend):
        run(backend, req(Op.MAP_PUT_ALL, "m", "a", value={"x": 1, "y": 2}))
        results = run(
            backend,
            req(Op.MAP_PUT, "m", "a", user_key="z", value=3),
            req(Op.MAP_REMOVE, "m", "a", user_key="x"),
            req(Op.MAP_PUT, "m", "a", user_key="y", value=20),
            req(Op.MAP_ITER, "m", "a"),
        )
        assert dict(results[3]) == {"y": 20, "z": 3}

    def test_remove_last_entry_makes_empty(self, backend):
        run(backend, req(Op.MAP_PUT, "m", "a", user_key="x", value=1))
        results = run(
            backend,
            req(Op.MAP_IS_EMPTY, "m", "a"),
            req(Op.MAP_REMOVE, "m", "a", user_key="x"),
            req(Op.MAP_IS_EMPTY, "m", "a"),
            req(Op.MAP_GET, "m", "a", user_key="x"),
        )
        assert results == [False, None, True, None]
        assert backend.state_items("m") == {}

    def test_clear_then_put_in_one_batch(self, backend):
        run(backend, req(Op.MAP_PUT_ALL, "m", "a", value={"x": 1, "y": 2}))
        results = run(
            backend,
            req(Op.MAP_PUT, "m", "a", user_key="w", value=0),
            req(Op.MAP_CLEAR, "m", "a"),
            req(Op.MAP_IS_EMPTY, "m", "a"),
            req(Op.MAP_CONTAINS, "m", "a", user_key="x"),
            req(Op.MAP_PUT, "m", "a", user_key="y", value=5),
            req(Op.MAP_ITER, "m", "a"),
        )
        assert results == [None, None, True, False, None, [("y", 5)]]
        assert backend.state_items("m") == {"a": {"y": 5}}

    def test_maps_of_neighbouring_keys_do_not_mix(self, backend):
        # "a" is a byte prefix of "ab": prefix scans must stop at the key's end.
        run(
            backend,
            req(Op.MAP_PUT, "m", "a", user_key="x", value=1),
            req(Op.MAP_PUT, "m", "ab", user_key="x", value=2),
            req(Op.MAP_PUT, "m", "b", user_key="x", value=3),
        )
        results = run(backend, req(Op.MAP_CLEAR, "m", "a"), req(Op.MAP_ITER, "m", "ab"))
        assert results == [None, [("x", 2)]]
        assert backend.state_items("m") == {"ab": {"x": 2}, "b": {"x": 3}}


def drain_chunks(backend, op, state, key, limit, *, batch_prefix=()):
    """All items of a chunked read, and how many chunks it took."""
    items, cursor, chunks = [], None, 0
    while True:
        *_, (chunk, cursor) = run(
            backend, *batch_prefix, req(op, state, key, value=(cursor, limit))
        )
        batch_prefix = ()
        items += chunk
        chunks += 1
        if cursor is None:
            return items, chunks


def test_list_chunks_concatenate_to_the_list(backend):
    run(backend, req(Op.LIST_ADD_ALL, "l", "a", value=list(range(7))))
    items, chunks = drain_chunks(backend, Op.LIST_GET_CHUNK, "l", "a", 3)
    assert items == list(range(7)) and chunks == 3
    assert drain_chunks(backend, Op.LIST_GET_CHUNK, "l", "nobody", 3) == ([], 1)
    items, chunks = drain_chunks(backend, Op.LIST_GET_CHUNK, "l", "a", 7)
    assert items == list(range(7)) and chunks == 1


def test_map_chunks_concatenate_to_the_map(backend):
    entries = {f"k{i}": i for i in range(9)}
    run(backend, req(Op.MAP_PUT_ALL, "m", "a", value=entries), req(Op.MAP_PUT, "m", "ab", "z", 1))
    (full,) = run(backend, req(Op.MAP_ITER, "m", "a"))
    items, chunks = drain_chunks(backend, Op.MAP_ITER_CHUNK, "m", "a", 4)
    assert items == full and sorted(items) == sorted(entries.items()) and chunks == 3
    # the first chunk sees writes earlier in its own batch (RocksDB's overlay path)
    items, _ = drain_chunks(
        backend, Op.MAP_ITER_CHUNK, "m", "a", 4,
        batch_prefix=(req(Op.MAP_REMOVE, "m", "a", "k0"), req(Op.MAP_PUT, "m", "a", "new", 5)),
    )  # fmt: skip
    want = {**entries, "new": 5}
    del want["k0"]
    assert sorted(items) == sorted(want.items())
    assert drain_chunks(backend, Op.MAP_ITER_CHUNK, "m", "nobody", 4) == ([], 1)


def test_removing_the_entries_read_between_map_chunks_skips_none(backend):
    entries = {f"k{i}": i for i in range(10)}
    run(backend, req(Op.MAP_PUT_ALL, "m", "a", value=entries))
    seen, cursor = [], None
    while True:
        ((chunk, cursor),) = run(backend, req(Op.MAP_ITER_CHUNK, "m", "a", value=(cursor, 3)))
        seen += chunk
        if chunk:
            run(backend, *[req(Op.MAP_REMOVE, "m", "a", user_key) for user_key, _ in chunk])
        if cursor is None:
            break
    assert sorted(seen) == sorted(entries.items())
    assert run(backend, req(Op.MAP_IS_EMPTY, "m", "a")) == [True]


def test_every_op_is_covered():
    # Guards the suite against a new Op without conformance cases.
    assert len(Op.NAMES) == 18 and Op.READS | Op.WRITES == frozenset(range(18))


# --- property: RocksDB == Memory for random batches -------------------------------------

# Few keys, so batches often touch one key several times; 1 == 1.0; "a" prefixes "ab".
KEYS = st.sampled_from([1, 1.0, "a", "ab", (1, "a")])
USER_KEYS = st.sampled_from([0, 1.0, "x", (2,), None])
VALUES = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3))
SMALL_LISTS = st.lists(VALUES, max_size=3)


NOTHING = st.none()


def one_op(op: int, state: str, keys, user_keys=NOTHING, value=NOTHING):
    return st.builds(req, st.just(op), st.just(state), keys, user_keys, value)


def value_ops(keys):
    return st.one_of(
        one_op(Op.VALUE_GET, "v", keys),
        one_op(Op.VALUE_PUT, "v", keys, value=VALUES),
        one_op(Op.VALUE_CLEAR, "v", keys),
    )


def list_ops(keys):
    return st.one_of(
        one_op(Op.LIST_GET, "l", keys),
        one_op(Op.LIST_ADD, "l", keys, value=VALUES),
        one_op(Op.LIST_ADD_ALL, "l", keys, value=SMALL_LISTS),
        one_op(Op.LIST_PUT, "l", keys, value=SMALL_LISTS),
        one_op(Op.LIST_CLEAR, "l", keys),
    )


def map_ops(keys):
    return st.one_of(
        one_op(Op.MAP_GET, "m", keys, USER_KEYS),
        one_op(Op.MAP_PUT, "m", keys, USER_KEYS, VALUES),
        one_op(Op.MAP_PUT_ALL, "m", keys, value=st.dictionaries(USER_KEYS, VALUES, max_size=3)),
        one_op(Op.MAP_REMOVE, "m", keys, USER_KEYS),
        one_op(Op.MAP_CONTAINS, "m", keys, USER_KEYS),
        one_op(Op.MAP_IS_EMPTY, "m", keys),
        one_op(Op.MAP_ITER, "m", keys),
        one_op(Op.MAP_CLEAR, "m", keys),
    )


def request_batches(requests: st.SearchStrategy[StateRequest]):
    return st.lists(st.lists(requests, min_size=1, max_size=16), min_size=1, max_size=5)


# "mixed" covers every op on neighbouring keys; the single-key mixes make same-key
# sequences inside one batch (write then read, write then scan) frequent.
MIXES = {
    "mixed": request_batches(st.one_of(value_ops(KEYS), list_ops(KEYS), map_ops(KEYS))),
    "one-map": request_batches(map_ops(st.sampled_from(["a", "ab"]))),
    "one-list": request_batches(list_ops(st.just("a"))),
    # value ops only: RocksDB's overlay-free path, and its fallback on a read after a write
    "values": request_batches(value_ops(st.sampled_from(["a", "b"]))),
}


def clone_request(request: StateRequest) -> StateRequest:
    return StateRequest(
        request.op, request.state, request.key, request.key_group, request.user_key, request.value
    )


def normalized(request: StateRequest):
    if request.op == Op.MAP_ITER:  # RocksDB iterates in key-byte order
        assert len(request.result) == len(dict(request.result))
        return dict(request.result)
    return request.result


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_rocksdb_matches_memory_on_random_batches(mix):
    @given(batches=MIXES[mix])
    def check(batches):
        directory = tempfile.mkdtemp(prefix="aec-rocks-prop-")
        rocks = RocksDBBackend(os.path.join(directory, "db"))
        rocks.open()
        try:
            assert_same_as_memory(rocks, batches)
        finally:
            rocks.close()
            shutil.rmtree(directory)

    check()


def test_a_value_only_batch_takes_the_path_without_the_overlay_until_a_read_follows_a_write(
    tmp_path,
):
    rocks = RocksDBBackend(str(tmp_path / "db"))
    rocks.open()
    try:
        run(rocks, req(Op.VALUE_PUT, "v", "a", value=1))
        first = [req(Op.VALUE_GET, "v", "a"), req(Op.VALUE_PUT, "v", "a", value=2),
                 req(Op.VALUE_PUT, "v", "b", value=3), req(Op.VALUE_PUT, "v", "b", value=4)]  # fmt: skip
        assert run_value_batch(rocks._live_db(), rocks._table_of, first, WriteOptions())
        assert first[0].result == 1  # read before the batch's write
        assert rocks.state_items("v") == {"a": 2, "b": 4}  # writes kept their order
        # a read after a write of its key, or a list request: the general path's to run
        assert not run_value_batch(rocks._live_db(), rocks._table_of,
                                   [req(Op.VALUE_CLEAR, "v", "a"), req(Op.VALUE_GET, "v", "a")],
                                   WriteOptions())  # fmt: skip
        assert not run_value_batch(rocks._live_db(), rocks._table_of,
                                   [req(Op.VALUE_PUT, "v", "b", value=5), req(Op.LIST_GET, "l", "a")],
                                   WriteOptions())  # fmt: skip
        assert rocks.state_items("v") == {"a": 2, "b": 4}  # a batch given up wrote nothing
    finally:
        rocks.close()


# --- key codec ---------------------------------------------------------------------------

def _on_one_instant(moment):
    """Not a wall time its zone skips or repeats (keys refuse those: see below)."""
    return moment.replace(fold=1 - moment.fold).utcoffset() == moment.utcoffset()


CODEC_KEYS = st.recursive(
    st.one_of(
        st.integers(),
        st.floats(allow_nan=False),
        st.text(),
        st.binary(),
        st.booleans(),
        st.none(),
        st.dates(),
        st.datetimes(),
        st.datetimes(timezones=st.timezones()).filter(_on_one_instant),
        st.decimals(allow_nan=False),
    ),
    lambda inner: st.tuples(inner, inner) | st.tuples(inner),
    max_leaves=6,
)


@given(key=CODEC_KEYS, key_group=st.integers(0, 2**15))
def test_key_codec_round_trips(key, key_group):
    assert decode_key(encode_key(key)) == key
    db_key = key_prefix(key_group, key) + encode_key("user")
    assert split_db_key(db_key) == (key, encode_key("user"))


@given(a=CODEC_KEYS, b=CODEC_KEYS)
def test_key_codec_is_canonical_for_equality(a, b):
    assert (encode_key(a) == encode_key(b)) == (a == b)


@pytest.mark.parametrize("key", [frozenset({1}), object(), [1], ("a", frozenset())])
def test_keys_without_a_stable_encoding_are_refused(key):
    with pytest.raises(TypeError, match=f"{type(key).__name__ if not isinstance(key, tuple) else 'frozenset'}.*convert it"):
        encode_key(key)


@given(keys=st.lists(CODEC_KEYS, max_size=8))
def test_remembered_key_bytes_are_the_encoding(keys):
    from backends import keycodec

    for key in keys + keys:  # the second pass reads what the first remembered
        assert encode_key(key) == keycodec._encode(key)


def test_an_equal_key_of_another_type_shares_its_bytes():
    from decimal import Decimal

    assert encode_key(1) == encode_key(1.0) == encode_key(True) == encode_key(Decimal(1)) == b"i1"
    assert encode_key(Decimal("1.5")) == encode_key(1.5)  # equal values, one key
    assert encode_key((Decimal(1), "a")) == encode_key((1, "a"))
    assert decode_key(encode_key((Decimal(1), "a"))) == (1, "a")


def test_a_wall_time_a_zone_skips_or_repeats_is_refused_as_a_key():
    import datetime
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("America/New_York")
    skipped = datetime.datetime(2021, 3, 14, 2, 30, tzinfo=zone)  # clocks jump 2:00 -> 3:00
    repeated = datetime.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=zone)
    for moment in (skipped, repeated):
        assert moment != moment.astimezone(datetime.UTC)  # why: equal to no other zone's time
        with pytest.raises(ValueError, match="skips or repeats"):
            encode_key(moment)
    plain = datetime.datetime(2021, 6, 1, 12, 0, tzinfo=zone)
    assert decode_key(encode_key(plain)) == plain


def test_a_decimal_key_keeps_every_digit_and_a_huge_one_is_refused():
    from decimal import Decimal

    long = Decimal("3.5245538770868666231190550347E-12")  # 29 digits: past the default 28
    assert decode_key(encode_key(long)) == long
    assert encode_key(Decimal("0.10")) == encode_key(Decimal("0.1000"))
    with pytest.raises(ValueError, match="integer digits"):
        encode_key(Decimal("1E+999999999"))  # would build a billion-digit int


@given(keys=st.lists(CODEC_KEYS, max_size=8), groups=st.lists(st.integers(0, 65535), min_size=1))
def test_remembered_key_prefixes_are_the_layout_for_each_key_group(keys, groups):
    # a key's prefix is remembered per key, but operators with another max_parallelism
    # put the same key in another key group: the group must still be the one asked for
    import struct

    for key in keys + keys:
        for group in groups:
            encoded = encode_key(key)
            assert key_prefix(group, key) == struct.pack(">HI", group, len(encoded)) + encoded


def test_decode_rejects_foreign_bytes():
    with pytest.raises(ValueError, match="not an encoded key"):
        decode_key(b"?junk")


# --- RocksDB lifecycle ---------------------------------------------------------------------


def test_rocksdb_reopen_keeps_state(tmp_path):
    path = str(tmp_path / "db")
    first = RocksDBBackend(path)
    first.open()
    run(
        first,
        req(Op.VALUE_PUT, "v", "a", value=1),
        req(Op.LIST_ADD, "l", "a", value=2),
        req(Op.MAP_PUT, "m", "a", user_key="x", value=3),
    )
    first.close()
    second = RocksDBBackend(path)
    second.open()
    try:
        assert second.state_items("v") == {"a": 1}
        assert run(second, req(Op.LIST_GET, "l", "a"), req(Op.MAP_ITER, "m", "a")) == [
            [2],
            [("x", 3)],
        ]
    finally:
        second.close()
    fresh = RocksDBBackend(path, fresh=True)
    fresh.open()
    assert fresh.state_items("v") == {}
    fresh.close()


def test_rocksdb_close_is_idempotent_and_final(tmp_path):
    backend = RocksDBBackend(str(tmp_path / "db"))
    with pytest.raises(RuntimeError, match="not open"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    backend.open()
    backend.close()
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        run(backend, req(Op.VALUE_GET, "v", "a"))
    with pytest.raises(RuntimeError, match="closed"):
        backend.open()


def test_rocksdb_rejects_a_foreign_database(tmp_path):
    from rocksdict import Options, Rdict

    path = str(tmp_path / "foreign")
    db = Rdict(path, Options(raw_mode=True))
    db[b"k"] = b"v"
    db.close()
    with pytest.raises(ValueError, match="did not write"):
        RocksDBBackend(path).open()


def test_rocksdb_options_hook_and_validation(tmp_path):
    with pytest.raises(TypeError, match="options"):
        RocksDBBackend(str(tmp_path / "db"), options="lz4")
    backend = RocksDBBackend(str(tmp_path / "db"), options=_tune)
    backend.open()
    assert run(backend, req(Op.VALUE_PUT, "v", 1, value=2), req(Op.VALUE_GET, "v", 1)) == [None, 2]
    backend.close()


def _tune(options) -> None:
    options.set_write_buffer_size(8 << 20)


def run_in_threads(worker, threads: int) -> None:
    """Run ``worker(t)`` for t in range(threads) on threads; raise the first error."""
    errors: list[BaseException] = []

    def guarded(thread: int) -> None:
        try:
            worker(thread)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    pool = [threading.Thread(target=guarded, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]


def check_concurrent_batches_of_disjoint_keys(backend, threads: int = 4, rounds: int = 50) -> None:
    """Batches on disjoint keys from several threads at once keep every write."""

    def worker(thread: int) -> None:
        for i in range(rounds):
            key = (thread, i % 5)
            run(
                backend,
                req(Op.LIST_ADD, "l", key, value=i),
                req(Op.MAP_PUT, f"m{i % 3}", key, user_key=i, value=thread),
                req(Op.VALUE_GET, "v", key),
            )

    run_in_threads(worker, threads)
    assert backend.state_items("l") == {
        (t, k): list(range(k, rounds, 5)) for t in range(threads) for k in range(5)
    }


def test_rocksdb_concurrent_batches_of_disjoint_keys(tmp_path):
    backend = RocksDBBackend(str(tmp_path / "db"))
    backend.open()
    try:
        check_concurrent_batches_of_disjoint_keys(backend)
    finally:
        backend.close()


# --- snapshots ---------------------------------------------------------------------------

SNAPSHOTTING = {
    "memory": BACKENDS["memory"],
    "rocksdb": BACKENDS["rocksdb"],
    "latency-rocksdb": lambda tmp: LatencyBackend(RocksDBBackend(os.path.join(tmp, "db")), 0),
}


@pytest.fixture(params=sorted(SNAPSHOTTING))
def snapshotting(request, tmp_path) -> Iterator[StateBackend]:
    instance = SNAPSHOTTING[request.param](str(tmp_path))
    instance.open()
    yield instance
    instance.close()


def test_snapshot_then_restore_rolls_back(snapshotting, tmp_path):
    backend = snapshotting
    run(
        backend,
        req(Op.VALUE_PUT, "v", "a", value=1),
        req(Op.LIST_ADD_ALL, "l", "a", value=[1, 2]),
        req(Op.MAP_PUT_ALL, "m", "a", value={"x": 1}),
    )
    snap = str(tmp_path / "snap")
    backend.snapshot(snap)
    expected = {s: backend.state_items(s) for s in ("v", "l", "m", "new")}
    run(
        backend,
        req(Op.VALUE_PUT, "v", "a", value=99),
        req(Op.VALUE_PUT, "v", "b", value=5),
        req(Op.LIST_ADD, "l", "a", value=3),
        req(Op.MAP_CLEAR, "m", "a"),
        req(Op.VALUE_PUT, "new", "a", value="later"),
    )
    backend.restore(snap)
    assert {s: backend.state_items(s) for s in expected} == expected
    # Still writable after a restore, and a second snapshot to the same directory replaces it.
    run(backend, req(Op.VALUE_PUT, "v", "c", value=3))
    backend.snapshot(snap)
    backend.restore(snap)
    assert backend.state_items("v") == {"a": 1, "c": 3}


def test_restore_from_missing_directory(snapshotting, tmp_path):
    with pytest.raises(FileNotFoundError):
        snapshotting.restore(str(tmp_path / "nowhere"))


def test_rocksdb_restore_rejects_invalid_snapshot(tmp_path):
    backend = RocksDBBackend(str(tmp_path / "db"))
    backend.open()
    run(backend, req(Op.VALUE_PUT, "v", "a", value=1))
    empty = tmp_path / "empty" / "rocksdb"
    empty.mkdir(parents=True)
    with pytest.raises(ValueError, match="CURRENT"):
        backend.restore(str(tmp_path / "empty"))
    assert backend.state_items("v") == {"a": 1}  # untouched
    backend.close()


def test_rocksdb_restore_into_a_new_backend(tmp_path):
    source = RocksDBBackend(str(tmp_path / "a"))
    source.open()
    run(source, req(Op.MAP_PUT, "m", "k", user_key=1, value="one"))
    source.snapshot(str(tmp_path / "snap"))
    source.close()
    target = RocksDBBackend(str(tmp_path / "b"))
    target.restore(str(tmp_path / "snap"))  # opens it
    assert run(target, req(Op.MAP_GET, "m", "k", user_key=1)) == ["one"]
    target.close()


# --- specs ---------------------------------------------------------------------------------


def test_rocksdb_spec_pickles_and_separates_partitions(tmp_path):
    spec = pickle.loads(pickle.dumps(RocksDBBackend(str(tmp_path / "base"), options=_tune).spec()))
    zero, one = spec.build(0), spec.build(1)
    assert zero.path != one.path
    assert zero.path == os.path.join(str(tmp_path / "base"), "partition-0")
    zero.open()
    one.open()
    run(zero, req(Op.VALUE_PUT, "v", "a", value=0))
    run(one, req(Op.VALUE_PUT, "v", "a", value=1))
    assert (zero.state_items("v"), one.state_items("v")) == ({"a": 0}, {"a": 1})
    zero.close()
    one.close()
    rebuilt = spec.build(0)  # a new task attempt starts empty
    rebuilt.open()
    assert rebuilt.state_items("v") == {}
    rebuilt.close()


def test_latency_spec_pickles_and_builds(tmp_path):
    backend = LatencyBackend(MemoryBackend(), ("uniform", 0, 0.001), per_request=0.0, seed=7)
    spec = pickle.loads(pickle.dumps(backend.spec()))
    built = spec.build(3)
    assert isinstance(built, LatencyBackend) and isinstance(built.inner, MemoryBackend)
    built.open()
    assert run(built, req(Op.VALUE_PUT, "v", 1, value=1), req(Op.VALUE_GET, "v", 1)) == [None, 1]
    built.close()
    # Partition p draws from seed + p: reproducible, different per partition.
    third = spec.build(3)
    assert [third.delay_for(0) for _ in range(5)] == _draws(("uniform", 0, 0.001), 10, 5)
    assert spec.build(4).delay_for(0) != spec.build(3).delay_for(0)
    assert LatencyBackend(MemoryBackend(), 0.001, 0.002).delay_for(10) == pytest.approx(0.021)


def _draws(latency, seed, n) -> list[float]:
    sampler = LatencySampler(latency, seed)
    return [sampler() for _ in range(n)]


# --- latency -----------------------------------------------------------------------------


def test_latency_delays_each_batch():
    backend = LatencyBackend(MemoryBackend(), 0.05, per_request=0.01)
    backend.open()
    started = time.perf_counter()
    run(backend, req(Op.VALUE_PUT, "v", 1, value=1), req(Op.VALUE_GET, "v", 1))
    assert time.perf_counter() - started >= 0.05 + 2 * 0.01
    assert backend.state_items("v") == {1: 1}


def test_latency_callable_is_drawn_once_per_batch():
    calls = []

    def latency() -> float:
        calls.append(1)
        return 0.0

    backend = LatencyBackend(MemoryBackend(), latency)
    run(backend, req(Op.VALUE_GET, "v", 1), req(Op.VALUE_GET, "v", 2))
    assert len(calls) == 1


def test_seeded_distributions_are_reproducible():
    for latency in (("uniform", 0.001, 0.002), ("exponential", 0.001)):
        first, second = _draws(latency, 42, 20), _draws(latency, 42, 20)
        assert first == second
        assert first != _draws(latency, 43, 20)
        assert all(d >= 0 for d in first)
    assert all(0.001 <= d <= 0.002 for d in _draws(("uniform", 0.001, 0.002), 1, 50))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"latency": -0.1}, ValueError, "latency"),
        ({"latency": 0.0, "per_request": -1}, ValueError, "per_request"),
        ({"latency": ("uniform", 0.2, 0.1)}, ValueError, "lo <= hi"),
        ({"latency": ("uniform", -1, 0.1)}, ValueError, "latency lo"),
        ({"latency": ("gamma", 1.0)}, ValueError, "uniform"),
        ({"latency": "fast"}, TypeError, "latency"),
        ({"latency": float("nan")}, ValueError, "latency"),
    ],
)
def test_latency_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        LatencyBackend(MemoryBackend(), **kwargs)


def test_latency_callable_returning_negative_fails_the_batch():
    backend = LatencyBackend(MemoryBackend(), lambda: -1.0)
    with pytest.raises(ValueError, match="latency"):
        run(backend, req(Op.VALUE_GET, "v", 1))


def test_latency_serializes_a_non_blocking_inner_backend():
    # MemoryBackend expects one batch at a time; the sleeps may still overlap.
    backend = LatencyBackend(MemoryBackend(), 0.02)
    threads = [
        threading.Thread(target=run, args=(backend, req(Op.LIST_ADD, f"s{t % 2}", t % 3, value=t)))
        for t in range(12)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.perf_counter() - started < 12 * 0.02  # sleeps overlapped
    total = sum(len(v) for s in ("s0", "s1") for v in backend.state_items(s).values())
    assert total == 12


def test_op_table_names_missing_handlers():
    from aec.state.requests import op_table

    def _clear(*_):
        pass

    with pytest.raises(LookupError, match="VALUE_GET.*MAP_ITER_CHUNK"):
        op_table({"__name__": "partial", "_clear": _clear})


# --- restore: the union of several snapshots, filtered by key group (rescaling) ----------

# Backends whose restore takes several snapshots and a key-group range.
RESCALING = {
    "memory": lambda tmp, name: MemoryBackend(),
    "rocksdb": lambda tmp, name: RocksDBBackend(os.path.join(tmp, name)),
    "latency-rocksdb": lambda tmp, name: LatencyBackend(RocksDBBackend(os.path.join(tmp, name)), 0),
}


@pytest.fixture(params=sorted(RESCALING))
def rescaling(request, tmp_path) -> Iterator[Callable[[str], StateBackend]]:
    """``make(name)``: a new, open backend of one kind; all closed after the test."""
    made: list[StateBackend] = []

    def make(name: str) -> StateBackend:
        instance = RESCALING[request.param](str(tmp_path), name)
        instance.open()
        made.append(instance)
        return instance

    yield make
    for instance in made:
        instance.close()


STATES = ("v", "l", "m")
RESCALE_KEYS = [*range(40), *(f"k{i}" for i in range(20)), *((i, "t") for i in range(10))]


def fill_owned(backend: StateBackend, owned: KeyGroupRange, salt: int) -> dict[str, dict]:
    """Write value, list and map state for every key of ``RESCALE_KEYS`` whose key group
    is in ``owned`` (as an operator owning that range would); what was written."""
    contents: dict[str, dict] = {state: {} for state in STATES}
    batch = []
    for key in RESCALE_KEYS:
        if key_group_for(key, MAX_PARALLELISM) not in owned:
            continue
        value = (salt, str(key))
        batch.append(req(Op.VALUE_PUT, "v", key, value=value))
        batch.append(req(Op.LIST_ADD_ALL, "l", key, value=[salt, value]))
        batch.append(req(Op.MAP_PUT_ALL, "m", key, value={"a": salt, 7: value}))
        contents["v"][key] = value
        contents["l"][key] = [salt, value]
        contents["m"][key] = {"a": salt, 7: value}
    backend.execute_batch(batch)
    return contents


def expected_union(parts: list[dict[str, dict]], key_groups: KeyGroupRange | None) -> dict:
    """The contract: the union of the snapshots' contents, keys filtered by key group."""
    union: dict[str, dict] = {state: {} for state in STATES}
    for contents in parts:
        for state in STATES:
            for key, value in contents[state].items():
                if key_groups is None or key_group_for(key, MAX_PARALLELISM) in key_groups:
                    union[state][key] = value
    return union


def snapshots_at_parallelism(make, tmp_path, parallelism: int) -> tuple[list[str], list[dict]]:
    """Snapshots of ``parallelism`` operators, each owning its key-group range."""
    directories, parts = [], []
    for index in range(parallelism):
        source = make(f"source-{parallelism}-{index}")
        owned = key_group_range_for(MAX_PARALLELISM, parallelism, index)
        parts.append(fill_owned(source, owned, salt=index))
        directory = str(tmp_path / f"snap-{parallelism}-{index}")
        source.snapshot(directory)
        directories.append(directory)
    return directories, parts


def state_of(backend: StateBackend) -> dict[str, dict]:
    return {state: backend.state_items(state) for state in STATES}


@pytest.mark.parametrize(
    "key_groups",
    [None, KeyGroupRange(0, MAX_PARALLELISM - 1), KeyGroupRange(20, 70), KeyGroupRange(90, 90),
     KeyGroupRange(0, 0), KeyGroupRange(100, MAX_PARALLELISM - 1)],
    ids=repr,
)  # fmt: skip
def test_restore_is_the_union_of_snapshots_in_the_key_groups(rescaling, tmp_path, key_groups):
    directories, parts = snapshots_at_parallelism(rescaling, tmp_path, 3)
    target = rescaling("target")
    run(target, req(Op.VALUE_PUT, "v", "live-only", value=1), req(Op.VALUE_PUT, "x", 1, value=2))
    target.restore(directories, key_groups, MAX_PARALLELISM)
    expected = expected_union(parts, key_groups)
    assert state_of(target) == expected
    assert target.state_items("x") == {}  # a state no snapshot has is gone too
    # Reads through batches agree, and the restored backend keeps working.
    for key in RESCALE_KEYS:
        assert run(target, req(Op.VALUE_GET, "v", key)) == [expected["v"].get(key)]
    run(target, req(Op.MAP_PUT, "m", 0, user_key="new", value=1))
    assert target.state_items("m").get(0, {}).get("new") == 1


def test_restore_of_two_of_three_snapshots_in_another_order(rescaling, tmp_path):
    directories, parts = snapshots_at_parallelism(rescaling, tmp_path, 3)
    target = rescaling("target")
    # Scale 3 -> 2: operator 1 of 2 owns 64..127, held by snapshots 1 and 2 of 3.
    owned = key_group_range_for(MAX_PARALLELISM, 2, 1)
    target.restore([directories[2], directories[1]], owned, MAX_PARALLELISM)
    assert state_of(target) == expected_union([parts[1], parts[2]], owned)


def test_restore_of_one_snapshot_into_smaller_ranges(rescaling, tmp_path):
    directories, parts = snapshots_at_parallelism(rescaling, tmp_path, 1)
    for index in range(4):  # scale 1 -> 4: each new operator keeps its quarter
        owned = key_group_range_for(MAX_PARALLELISM, 4, index)
        target = rescaling(f"quarter-{index}")
        target.restore(directories[0], owned, MAX_PARALLELISM)
        assert state_of(target) == expected_union(parts, owned)
        assert state_of(target)["v"], "every quarter holds some keys of RESCALE_KEYS"


def test_restore_with_a_missing_snapshot_changes_nothing(rescaling, tmp_path):
    directories, _ = snapshots_at_parallelism(rescaling, tmp_path, 2)
    target = rescaling("target")
    run(target, req(Op.VALUE_PUT, "v", "live", value=1))
    with pytest.raises(FileNotFoundError):
        target.restore([directories[0], str(tmp_path / "missing"), directories[1]])
    assert target.state_items("v") == {"live": 1}


def test_restore_refuses_bad_arguments_before_changing_anything(rescaling, tmp_path):
    directories, _ = snapshots_at_parallelism(rescaling, tmp_path, 1)
    target = rescaling("target")
    run(target, req(Op.VALUE_PUT, "v", "live", value=1))
    if not isinstance(getattr(target, "remote", target), MemoryBackend):
        # The byte stores check restore's arguments themselves; the engine's MemoryBackend
        # is lenient (a tuple of key groups, an empty list), the operator checks first.
        with pytest.raises(ValueError, match="outside"):
            target.restore(directories, KeyGroupRange(0, MAX_PARALLELISM), MAX_PARALLELISM)
        with pytest.raises(TypeError, match="KeyGroupRange"):
            target.restore(directories, (0, 3), MAX_PARALLELISM)
        with pytest.raises(ValueError, match="at least one"):
            target.restore([])
    with pytest.raises(TypeError, match="(?i)path"):
        target.restore([directories[0], 7])
    assert target.state_items("v") == {"live": 1}


def test_rocksdb_restore_hard_links_the_snapshot_instead_of_copying(tmp_path):
    source = RocksDBBackend(str(tmp_path / "source"))
    source.open()
    source.execute_batch([req(Op.VALUE_PUT, "v", key, value=key) for key in range(2000)])
    source.snapshot(str(tmp_path / "snap"))
    source.close()
    snapshot_files = tmp_path / "snap" / "rocksdb"
    for key_groups in (None, KeyGroupRange(10, 50)):
        target = RocksDBBackend(str(tmp_path / "target"))
        target.restore(str(tmp_path / "snap"), key_groups, MAX_PARALLELISM)
        tables = [name for name in os.listdir(snapshot_files) if name.endswith(".sst")]
        assert tables, "the snapshot has SST files"
        for name in tables:  # the very same files: no state bytes copied
            assert os.path.samefile(os.path.join(target.path, name), snapshot_files / name)
        assert len(target.state_items("v")) == sum(
            1
            for key in range(2000)
            if key_groups is None or key_group_for(key, MAX_PARALLELISM) in key_groups
        )
        target.close()


@given(
    keys=st.lists(st.one_of(st.integers(-50, 50), st.text(max_size=3)), max_size=40, unique=True),
    parallelism=st.integers(1, 3),
    target=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    order=st.randoms(use_true_random=False),
)
def test_rocksdb_restore_matches_the_contract_on_random_snapshots(keys, parallelism, target, order):
    """Random keys snapshotted by ``parallelism`` operators (each owning its key-group
    range), restored in a random order into operator ``index`` of ``q``."""
    q, index = target[0], min(target[1], target[0] - 1)
    owned = key_group_range_for(MAX_PARALLELISM, q, index)
    with tempfile.TemporaryDirectory(prefix="aec-rescale-") as tmp:
        directories, parts = [], []
        for source_index in range(parallelism):
            source = RocksDBBackend(os.path.join(tmp, f"source-{source_index}"))
            source.open()
            mine = key_group_range_for(MAX_PARALLELISM, parallelism, source_index)
            values = {
                k: (source_index, k) for k in keys if key_group_for(k, MAX_PARALLELISM) in mine
            }
            if values:
                source.execute_batch(
                    [req(Op.VALUE_PUT, "v", k, value=v) for k, v in values.items()]
                )
            directories.append(os.path.join(tmp, f"snap-{source_index}"))
            source.snapshot(directories[-1])
            source.close()
            parts.append({"v": values, "l": {}, "m": {}})
        order.shuffle(directories)
        target_backend = RocksDBBackend(os.path.join(tmp, "target"))
        try:
            target_backend.restore(directories, owned, MAX_PARALLELISM)
            assert target_backend.state_items("v") == expected_union(parts, owned)["v"]
        finally:
            target_backend.close()


def test_rocksdb_restore_of_a_foreign_database_puts_the_live_one_back(tmp_path):
    from rocksdict import Options, Rdict

    foreign = Rdict(str(tmp_path / "snap" / "rocksdb"), Options(raw_mode=True))
    foreign[b"k"] = b"v"
    foreign.close()
    backend = RocksDBBackend(str(tmp_path / "db"))
    backend.open()
    run(backend, req(Op.VALUE_PUT, "v", "live", value=1))
    with pytest.raises(ValueError, match="did not write"):
        backend.restore(str(tmp_path / "snap"))
    assert backend.state_items("v") == {"live": 1}  # the previous live directory is back
    run(backend, req(Op.VALUE_PUT, "v", "after", value=2))
    assert backend.state_items("v") == {"live": 1, "after": 2}
    backend.close()
    assert sorted(os.listdir(tmp_path)) == ["db", "snap"]  # no staging or aside left


def test_rocksdb_fresh_backend_starts_empty_used_or_not(tmp_path):
    path = str(tmp_path / "db")
    first = RocksDBBackend(path)
    first.open()
    run(first, req(Op.VALUE_PUT, "v", "old", value=1))
    first.snapshot(str(tmp_path / "snap"))
    first.close()
    unused = RocksDBBackend(path, fresh=True)
    unused.open()
    unused.close()  # the deferred destruction still happens
    reopened = RocksDBBackend(path)
    reopened.open()
    assert reopened.state_items("v") == {}
    reopened.close()
    restored = RocksDBBackend(path, fresh=True)  # a restarted task
    restored.open()
    restored.restore(str(tmp_path / "snap"))
    assert restored.state_items("v") == {"old": 1}
    restored.close()


def test_a_rocksdb_restore_survives_a_table_compacted_away_while_it_is_stamped(
    tmp_path, monkeypatch
):
    """After a restore the live tables are stamped (a listing, then a ``stat`` each);
    an open database's compaction may delete one between the two. The restore then
    failed with ``FileNotFoundError`` after swapping the live directory in."""
    from engine_helpers import Counter

    from aec import KeyedProcessOperator, Record
    from backends import rocksdb_snapshots

    source = RocksDBBackend(str(tmp_path / "source"))
    operator = KeyedProcessOperator(Counter(), source)
    operator.open()
    for i in range(300):
        operator.process(Record(i % 30, i))
    handle = operator.snapshot(1, tmp_path / "checkpoints")
    operator.close()
    real_stat = os.stat
    compacted: list[str] = []

    def stat_after_a_compaction(path, *args, **kwargs):
        if str(path).endswith(".sst") and "restored" in str(path) and not compacted:
            compacted.append(str(path))
            raise FileNotFoundError(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(rocksdb_snapshots.os, "stat", stat_after_a_compaction)
    target = RocksDBBackend(str(tmp_path / "restored"))
    restored = KeyedProcessOperator(Counter(), target)
    restored.restore(handle)
    monkeypatch.undo()
    assert compacted
    assert target.state_items("count") == {k: 10 for k in range(30)}
    restored.close()
