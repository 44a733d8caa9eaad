"""Nothing run: the trust boundary of checkpoints and stored state (``docs/security.md``).

State values go through a serializer chosen per state and per job, with a safe
default; checkpoint metadata is never pickled; a signed manifest is checked before
any byte is decoded; keys have one encoding in every process; a state name reused
for another kind of state is refused. Crafted pickles assert that nothing ran: each
payload would create a file.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aec import (
    AecConfig,
    JobFailure,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Record,
    ValueStateDescriptor,
    run_keyed,
)
from aec.checkpoint import digests, signing
from aec.config import STATE_SERIALIZERS
from aec.keygroups import key_group_for
from aec.runtime.operator import KeyedProcessOperator
from aec.state import serialization
from aec.state.serialization import PICKLE, SAFE, SERIALIZERS
from backends import MemoryBackend, RocksDBBackend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Point:
    """Not plain data: the safe serializer refuses it; pickle takes it."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x

    def __hash__(self) -> int:
        return hash(self.x)


class Counter(KeyedProcessFunction):
    def __init__(self, kind: str = "value", serializer: str | None = None, ttl=None) -> None:
        self.kind, self.serializer, self.ttl = kind, serializer, ttl

    def open(self, ctx):
        make = {"value": ValueStateDescriptor, "map": MapStateDescriptor}[self.kind]
        self.count = ctx.get_state(make("count", ttl=self.ttl, serializer=self.serializer))

    async def process_element(self, value, ctx):
        if self.kind == "map":
            n = (await self.count.async_get("n") or 0) + 1
            await self.count.async_put("n", n)
        else:
            n = (await self.count.async_value() or 0) + 1
            await self.count.async_update(n)
        ctx.output((ctx.current_key, n))


class Stores(KeyedProcessFunction):
    """Stores the record's value as the key's state (and a list of them)."""

    def __init__(self, serializer: str | None = None) -> None:
        self.serializer = serializer

    def open(self, ctx):
        self.value = ctx.get_state(ValueStateDescriptor("value", serializer=self.serializer))
        self.values = ctx.get_state(ListStateDescriptor("values", serializer=self.serializer))

    async def process_element(self, value, ctx):
        await self.value.async_update(value)
        await self.values.async_add(value)
        ctx.output(await self.value.async_value())


def backends_for(tmp_path):
    return {"memory": MemoryBackend(), "rocksdb": RocksDBBackend(tmp_path / "db")}


# --- the serializers ------------------------------------------------------------------------

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.dates()
    | st.datetimes()
    | st.datetimes(timezones=st.just(datetime.UTC))
    | st.times()
    | st.timedeltas()
    | st.decimals(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.integers() | st.text() | st.tuples(st.integers()), inner, max_size=4)
    | st.frozensets(st.integers(), max_size=3)
    | st.sets(st.text(), max_size=3),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (a tuple stays a tuple)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@given(value=plain)
def test_plain_data_round_trips_with_its_types(value):
    assert same(SAFE.loads(SAFE.dumps(value)), value)


@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_decode_as_plain_data_or_fail_with_a_value_error(data):
    try:
        decoded = SAFE.loads(data)
    except ValueError:
        return
    assert same(SAFE.loads(SAFE.dumps(decoded)), decoded)


def test_extension_values_nested_deeper_than_the_limit_fail_instead_of_overflowing_the_stack():
    """Crafted bytes of a few hundred nested tuples crashed the process (each level a C
    stack frame); 64 levels decode, more are a ValueError."""

    def nested(depth):
        value = 0
        for _ in range(depth):
            value = (value,)
        return value

    deep = nested(serialization.MAX_NESTING)
    assert SAFE.loads(SAFE.dumps(deep)) == deep
    with pytest.raises(TypeError, match="nested at most 64 deep"):  # refused when written
        SAFE.dumps((deep,))
    tuple_code = msgpack.unpackb(SAFE.dumps((0,)), ext_hook=lambda code, data: code)
    crafted = SAFE.dumps(deep)
    for _ in range(36):  # bytes written by something else: a 1-tuple holding them
        crafted = msgpack.packb(msgpack.ExtType(tuple_code, b"\x91" + crafted))
    with pytest.raises(ValueError, match="nested deeper than 64"):
        SAFE.loads(crafted)


@pytest.mark.parametrize("value", [Point(1), object(), [1, Point(2)], {"a": {1, 2, Point(3)}}])
def test_the_safe_serializer_refuses_other_objects_naming_their_type(value):
    with pytest.raises(TypeError, match="cannot store a .*(Point|object).*serializer='pickle'"):
        SAFE.dumps(value)


def test_serializers_are_chosen_by_name_and_the_config_knows_the_names():
    assert set(SERIALIZERS) == set(STATE_SERIALIZERS)
    assert ValueStateDescriptor("v", serializer="pickle").serializer is PICKLE
    assert ValueStateDescriptor("v").serializer is None
    with pytest.raises(ValueError, match="state 'v': unknown state serializer 'json'"):
        ValueStateDescriptor("v", serializer="json")
    with pytest.raises(ValueError, match="state_serializer must be one of"):
        AecConfig(state_serializer="json")


@pytest.mark.parametrize("backend_name", ["memory", "rocksdb"])
def test_the_default_refuses_objects_and_pickle_is_an_opt_in(tmp_path, backend_name):
    records = [Record("a", Point(1)), Record("a", Point(2))]
    backend = backends_for(tmp_path)[backend_name]
    operator = KeyedProcessOperator(Stores(), backend)
    with pytest.raises(JobFailure) as failure:  # RocksDB: the batch; memory: the snapshot
        for record in records:
            operator.process(record)
        operator.snapshot(1, tmp_path / "refused")
    assert isinstance(failure.value.__cause__, TypeError)
    assert "Point" in str(failure.value.__cause__)
    assert not os.path.exists(tmp_path / "refused" / "chk-1")
    backend.close()
    for config, function in [
        (AecConfig(), Stores(serializer="pickle")),  # per state
        (AecConfig(state_serializer="pickle"), Stores()),  # per job
    ]:
        backend = backends_for(tmp_path / f"{id(config)}")[backend_name]
        operator = KeyedProcessOperator(function, backend, config)
        for record in records:
            operator.process(record)
        handle = operator.snapshot(1, tmp_path / f"ok-{id(config)}")
        assert operator.drain_outputs() == [Point(1), Point(2)]
        restored_backend = backends_for(tmp_path / f"r{id(config)}")[backend_name]
        restored = KeyedProcessOperator(type(function)(function.serializer), restored_backend, config)
        restored.restore(handle)
        assert restored_backend.state_items("values") == {"a": [Point(1), Point(2)]}
        backend.close()
        restored_backend.close()


# --- crafted pickles: nothing runs -----------------------------------------------------------


class _Plant:
    """Unpickling this creates ``path``: proof that a pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def payload(path) -> bytes:
    return pickle.dumps(_Plant(str(path)))


def rewrite(checkpoint: str, name: str, data: bytes) -> None:
    """Replace a checkpoint file and its manifest entry, as someone who can write the
    checkpoint location but holds no key would."""
    with open(os.path.join(checkpoint, name), "wb") as out:
        out.write(data)
    manifest_path = os.path.join(checkpoint, "MANIFEST.json")
    manifest = json.loads(open(manifest_path).read())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(manifest_path, "w") as out:
        out.write(json.dumps(manifest))


def counted(tmp_path, backend=None, function=None):
    operator = KeyedProcessOperator(function or Counter(), backend or MemoryBackend())
    for key in ("a", "b", "a"):
        operator.process(Record(key, 1, 1.0))
    return operator.snapshot(1, tmp_path / "ckpt")


def test_crafted_timers_are_refused_and_never_run(tmp_path):
    handle = counted(tmp_path)
    planted = tmp_path / "ran"
    rewrite(handle.path, "timers.msgpack", payload(planted))
    with pytest.raises(ValueError, match="timers.msgpack cannot be read"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    assert not planted.exists()


def test_an_old_pickled_checkpoint_is_refused_and_never_run(tmp_path):
    handle = counted(tmp_path)
    planted = tmp_path / "ran"
    os.remove(os.path.join(handle.path, "timers.msgpack"))
    manifest_path = os.path.join(handle.path, "MANIFEST.json")
    manifest = json.loads(open(manifest_path).read())
    del manifest["files"]["timers.msgpack"]
    manifest["format"] = "aec-checkpoint/1"
    with open(manifest_path, "w") as out:
        out.write(json.dumps(manifest))
    rewrite(handle.path, "timers.pickle", payload(planted))
    with pytest.raises(ValueError, match="MANIFEST.json is not an aec-checkpoint/2 manifest"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    assert not planted.exists()


def test_no_manifest_entry_can_skip_a_files_digest(tmp_path):
    handle = counted(tmp_path)
    manifest_path = os.path.join(handle.path, "MANIFEST.json")
    manifest = json.loads(open(manifest_path).read())
    name = "backend/memory-base.msgpack"
    manifest["files"][name] = {"size": manifest["files"][name]["size"], "verify": "backend"}
    with open(manifest_path, "w") as out:
        out.write(json.dumps(manifest))
    with pytest.raises(ValueError, match="memory-base.msgpack has no SHA-256"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)


@pytest.mark.parametrize("claims", ["backend only", "backend and operator.json"])
def test_a_state_file_naming_pickle_is_never_unpickled(tmp_path, claims):
    handle = counted(tmp_path)
    planted = tmp_path / "ran"
    container = {
        "format": "aec-memory/2",
        "kind": "tables",
        "states": {"count": ["pickle", payload(planted)]},
    }
    rewrite(handle.path, "backend/memory-base.msgpack", msgpack.packb(container))
    if claims == "backend and operator.json":
        metadata = json.loads(open(os.path.join(handle.path, "operator.json")).read())
        metadata["states"]["count"]["serializer"] = "pickle"
        rewrite(handle.path, "operator.json", json.dumps(metadata).encode())
    with pytest.raises(ValueError, match="'count'.*'pickle'"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    assert not planted.exists()


def test_rocksdb_values_written_by_someone_else_decode_as_data_or_fail(tmp_path):
    from rocksdict import Options, Rdict

    path = str(tmp_path / "db")
    writer = RocksDBBackend(path)
    run_keyed([Record("a", 1)], Counter(), writer)
    writer.close()
    planted = tmp_path / "ran"
    options = Options(raw_mode=True)
    names = [n for n in Rdict.list_cf(path, options) if n != "default"]
    db = Rdict(path, options, column_families={n: Options(raw_mode=True) for n in names})
    table = db.get_column_family("state/count")
    for db_key in list(table.keys()):
        table.put(db_key, payload(planted))  # a pickle where a count was
    table.close()
    db.close()
    backend = RocksDBBackend(path)
    with pytest.raises(JobFailure) as failure:
        run_keyed([Record("a", 1)], Counter(), backend)
    assert "not msgpack state bytes" in str(failure.value.__cause__)
    assert not planted.exists()
    backend.close()


# --- signed manifests -----------------------------------------------------------------------


def test_a_signed_checkpoint_restores_and_any_change_is_refused_before_parsing(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(signing.KEY_VARIABLE, "a secret only the job holds")
    handle = counted(tmp_path)
    assert os.path.exists(os.path.join(handle.path, signing.SIGNATURE))
    restored = KeyedProcessOperator(Counter(), MemoryBackend())
    restored.restore(handle)  # signed with the key: fine
    planted = tmp_path / "ran"
    rewrite(handle.path, "timers.msgpack", payload(planted))  # digests recomputed, no key
    with pytest.raises(ValueError, match="signature .* does not match"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    with open(os.path.join(handle.path, "MANIFEST.json"), "w") as out:
        out.write("{ not even json")  # refused for its signature, before it is parsed
    with pytest.raises(ValueError, match="signature"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    os.remove(os.path.join(handle.path, signing.SIGNATURE))
    with pytest.raises(ValueError, match="is not signed"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    assert not planted.exists()


def test_unsigned_or_otherwise_signed_checkpoints_are_refused_when_a_key_is_set(
    tmp_path, monkeypatch
):
    unsigned = counted(tmp_path / "unsigned")
    monkeypatch.setenv(signing.KEY_VARIABLE, "key one")
    other = counted(tmp_path / "one")
    monkeypatch.setenv(signing.KEY_VARIABLE, "key two")
    for handle, message in [(unsigned, "is not signed"), (other, "does not match")]:
        with pytest.raises(ValueError, match=message):
            KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
    monkeypatch.delenv(signing.KEY_VARIABLE)
    KeyedProcessOperator(Counter(), MemoryBackend()).restore(other)  # no key: checksums only


# --- check, then use: what a backend opens is what was verified ------------------------------


def _changed_after_verifying(monkeypatch, suffix: str, change) -> list[str]:
    """Make every check of a checkpoint file ending in ``suffix`` call ``change(path)``
    on the checkpoint's file right after the check passed, as someone writing the
    checkpoint directory during the restore would; the paths changed."""
    changed: list[str] = []

    def after(check):
        def checked(path, *args, **kwargs):
            found = check(path, *args, **kwargs)
            source = kwargs.get("name") or path  # a private copy's check names its source
            if source.endswith(suffix) and source not in changed:
                changed.append(source)
                change(source)
            return found

        return checked

    monkeypatch.setattr(digests, "verify", after(digests.verify))
    copy = getattr(digests, "copy_verified", None)
    if copy is not None:
        monkeypatch.setattr(digests, "copy_verified", after(copy))
    return changed


def _swap(path: str, data: bytes) -> None:
    """Replace the directory entry ``path`` by a new file holding ``data``."""
    with open(f"{path}.new", "wb") as out:
        out.write(data)
    os.replace(f"{path}.new", path)


def _overwrite(path: str, data: bytes) -> None:
    """Write ``data`` over the file ``path`` in place (its inode kept)."""
    with open(path, "r+b") as out:
        out.write(data)
        out.truncate()


@pytest.mark.parametrize(
    ("mode", "change"),
    [(0o644, _swap), (0o666, _overwrite)],
    ids=["swapped", "others may write it: overwritten"],
)
def test_a_state_file_changed_after_its_check_is_never_read(tmp_path, monkeypatch, mode, change):
    handle = counted(tmp_path, function=Counter(serializer="pickle"))
    base = os.path.join(handle.path, "backend", "memory-base.msgpack")
    os.chmod(base, mode)
    planted = tmp_path / "ran"
    crafted = {
        "format": "aec-memory/2",
        "kind": "tables",
        "states": {"count": ["pickle", payload(planted)]},
    }
    digests.forget()  # a restarted task
    changed = _changed_after_verifying(
        monkeypatch, "memory-base.msgpack", lambda path: change(path, msgpack.packb(crafted))
    )
    backend = MemoryBackend()
    KeyedProcessOperator(Counter(serializer="pickle"), backend).restore(handle)
    assert changed == [base]  # the change happened between the check and the use...
    assert not planted.exists()  # ...and the changed bytes were never unpickled
    assert backend.state_items("count") == {"a": 2, "b": 1}


def test_a_symbolic_link_in_a_state_files_place_is_refused(tmp_path):
    handle = counted(tmp_path)
    base = os.path.join(handle.path, "backend", "memory-base.msgpack")
    elsewhere = tmp_path / "elsewhere"
    os.replace(base, elsewhere)
    os.symlink(elsewhere, base)  # the same bytes, but they may change at any time
    with pytest.raises(ValueError, match="memory-base.msgpack is a symbolic link"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)



@pytest.mark.parametrize("name", ["MANIFEST.json", "MANIFEST.hmac"])
def test_a_fifo_in_the_manifests_place_is_refused_not_waited_on(name, tmp_path, monkeypatch):
    monkeypatch.setenv("AEC_CHECKPOINT_KEY", "k")
    handle = counted(tmp_path)
    path = os.path.join(handle.path, name)
    os.remove(path)
    os.mkfifo(path)  # opening it for reading would wait for a writer
    failures = []

    def restore():
        try:
            KeyedProcessOperator(Counter(), MemoryBackend()).restore(handle)
        except ValueError as exc:
            failures.append(str(exc))

    thread = threading.Thread(target=restore, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock it: the restore waited on the FIFO
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
    assert failures and f"{name} is not a regular file" in failures[0]


def test_a_restored_file_of_one_link_is_not_trusted_by_its_identity_later(tmp_path):
    """A file with one link may be deleted and its inode reused by other bytes of the
    same size and time: only files with other links are remembered, and the restore's
    own private link does not count."""
    handle = counted(tmp_path)
    copy = tmp_path / "copy" / os.path.basename(handle.path)
    shutil.copytree(handle.path, copy)  # new inodes, one link each
    base = copy / "backend" / "memory-base.msgpack"
    assert base.exists() and os.stat(base).st_nlink == 1
    os.utime(base, ns=(10**18, 10**18))  # long before its digest: not a racy one
    digests.forget()
    KeyedProcessOperator(Counter(), MemoryBackend()).restore(str(copy))
    data = bytearray(base.read_bytes())
    data[-1] ^= 1  # other bytes at the same identity (size, inode, mtime)
    base.write_bytes(bytes(data))
    os.utime(base, ns=(10**18, 10**18))
    with pytest.raises(ValueError, match="memory-base.msgpack does not match its SHA-256"):
        KeyedProcessOperator(Counter(), MemoryBackend()).restore(str(copy))

def test_a_table_swapped_after_its_check_is_not_the_one_rocksdb_opens(tmp_path, monkeypatch):
    written = RocksDBBackend(tmp_path / "written")
    handle = counted(tmp_path, backend=written)
    written.close()
    tables = os.path.join(handle.path, "backend", "rocksdb")
    names = sorted(name for name in os.listdir(tables) if name.endswith(".sst"))
    inodes = {name: os.stat(os.path.join(tables, name)).st_ino for name in names}
    changed = _changed_after_verifying(
        monkeypatch, ".sst", lambda path: _swap(path, b"\0" * os.path.getsize(path))
    )
    backend = RocksDBBackend(tmp_path / "restored")
    KeyedProcessOperator(Counter(), backend).restore(handle)
    assert changed and all(os.path.basename(path) in names for path in changed)
    assert backend.state_items("count") == {"a": 2, "b": 1}
    # the live tables are the verified inodes, linked (not copied), not the swapped ones
    live = {name: os.stat(os.path.join(backend.path, name)).st_ino for name in names}
    assert live == inodes
    backend.close()


# --- keys: one encoding in every process ----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "named"),
    [(frozenset({1, 2}), "frozenset"), (object(), "object"), (("a", frozenset()), "frozenset")],
)
def test_a_key_without_a_stable_encoding_is_refused_at_the_boundary(key, named):
    operator = KeyedProcessOperator(Counter(), MemoryBackend())
    with pytest.raises(TypeError, match=f"builtins.{named} has no encoding .*convert it"):
        operator.process(Record(key, 1))
    operator.process(Record("fine", 1))  # the operator stays usable
    operator.finish()
    assert operator.drain_outputs()[0] == ("fine", 1)


def test_distinct_objects_are_never_merged_into_one_key(tmp_path):
    backend = RocksDBBackend(tmp_path / "db")
    with pytest.raises(TypeError, match="compares by identity"):
        run_keyed([Record(object(), 1), Record(object(), 1)], Counter(), backend)
    backend.close()


def test_equal_keys_of_different_types_are_one_key_on_every_backend(tmp_path):
    keys = [1, 1.0, True, decimal.Decimal(1), ("a", 2), ("a", 2.0)]
    for backend in backends_for(tmp_path).values():
        result = run_keyed([Record(k, 1) for k in keys], Counter(), backend)
        assert sorted(n for _, n in result.outputs[:-1]) == [1, 1, 2, 2, 3, 4]
        assert backend.state_items("count") == {1: 4, ("a", 2): 2}
        backend.close()


def test_an_enum_or_named_tuple_key_is_the_key_it_equals_in_every_key_group():
    """A key whose type subclasses a built-in one is in the key group of the plain
    value it equals (a ``class C(str, Enum)`` member's ``str()`` is "C.RED", not the
    string it equals: its group must not follow that)."""
    from engine_helpers import Color, Level, Pair, Shade

    from aec.keygroups import key_group_for, plain_key, stable_key_bytes
    for key, plain in [
        (Color.RED, "red"),
        (Shade.DARK, "dark"),
        (Level.HIGH, 2),
        (Pair(Color.RED, Level.HIGH), ("red", 2)),
        (("x", Shade.DARK), ("x", "dark")),
    ]:
        assert key == plain and hash(key) == hash(plain)
        assert stable_key_bytes(key) == stable_key_bytes(plain), key
        assert key_group_for(key, 32768) == key_group_for(plain, 32768), key
        assert plain_key(key) == plain and type(plain_key(key)) is type(plain), key

    class CaseInsensitive(str):  # equal to other strings than the one it holds
        def __eq__(self, other):
            return isinstance(other, str) and self.lower() == other.lower()

        def __hash__(self):
            return hash(self.lower())

    key = CaseInsensitive("Alice")
    assert plain_key(key) is key  # its plain value "Alice" is another key
    with pytest.raises(TypeError, match="equality or hash is not that of the plain value"):
        stable_key_bytes(key)
    with pytest.raises(TypeError, match="CaseInsensitive"):
        run_keyed([Record(key, 1)], Counter())


_GROUPS = textwrap.dedent(
    """
    import datetime, decimal, json, sys
    from aec.keygroups import key_group_for
    from aec import Record
    from aec.runtime.operator import KeyedProcessOperator
    from backends import RocksDBBackend
    sys.path.insert(0, sys.argv[3])
    from test_trust import Counter

    keys = ["flight", b"raw", 7, 2.5, ("JFK", "LAX", 2013), ("a", None, (1, "b")),
            datetime.date(2013, 1, 1), datetime.datetime(2013, 1, 1, 6, 30),
            decimal.Decimal("12.34"), frozenset({"x", "y", "z"})]
    groups = []
    for key in keys:
        try:
            groups.append(key_group_for(key, 128))
        except TypeError as exc:
            groups.append(type(exc).__name__)
    operator = KeyedProcessOperator(Counter(), RocksDBBackend(sys.argv[1]))
    if sys.argv[2] != "-":
        operator.restore(sys.argv[2])
    for key in keys[:-1]:
        operator.process(Record(key, 1))
    handle = operator.snapshot(1, sys.argv[1] + "-ckpt")
    print(json.dumps({"groups": groups, "counts": [n for _, n in operator.drain_outputs()],
                      "checkpoint": handle.path}))
    """
)


def _in_process(seed: str, directory: str, restore: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", _GROUPS, directory, restore, os.path.dirname(__file__)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_key_groups_and_restored_state_do_not_depend_on_the_hash_seed(tmp_path):
    first = _in_process("1", str(tmp_path / "one"), "-")
    second = _in_process("2", str(tmp_path / "two"), first["checkpoint"])
    assert first["groups"] == second["groups"]
    assert first["groups"][-1] == "TypeError"  # a frozenset: refused in both processes
    assert first["counts"] == [1] * 9
    assert second["counts"] == [2] * 9  # every key found its state in the other process
    assert first["groups"][0] == key_group_for("flight", 128)  # and this process's seed


# --- state metadata is checked on restore ---------------------------------------------------


@pytest.mark.parametrize("backend_name", ["memory", "rocksdb"])
@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        ({}, {"kind": "map"}, "was a value state .* now makes a map state"),
        ({}, {"serializer": "pickle"}, "was .* with 'msgpack', .* now makes .* with 'pickle'"),
        ({}, {"ttl": 60.0}, "was a value state stored .* now makes a value state with TTL"),
    ],
)
def test_a_state_name_reused_for_another_kind_is_refused(tmp_path, backend_name, before, after, message):
    handle = counted(tmp_path, backends_for(tmp_path / "w")[backend_name], Counter(**before))
    backend = backends_for(tmp_path / "r")[backend_name]
    operator = KeyedProcessOperator(Counter(**after), backend)
    with pytest.raises(ValueError, match=f"state 'count' {message}"):
        operator.restore(handle)
    assert backend.state_items("count") == {}  # nothing restored
    again = KeyedProcessOperator(Counter(**before), backends_for(tmp_path / "ok")[backend_name])
    again.restore(handle)  # the same kind restores
    again.process(Record("a", 1))
    again.finish()
    assert again.drain_outputs()[:-1] == [("a", 3)]


def test_states_made_later_are_decoded_with_the_jobs_serializer_only(tmp_path):
    handle = counted(tmp_path, function=Counter(serializer="pickle"))

    class Later(Counter):
        def open(self, ctx):
            self.ctx = ctx  # makes its state on first use, as a window trigger does

        async def process_element(self, value, ctx):
            self.count = self.ctx.get_state(ValueStateDescriptor("count", serializer="pickle"))
            return await super().process_element(value, ctx)

    with pytest.raises(ValueError, match="make the state in open"):
        KeyedProcessOperator(Later(), MemoryBackend()).restore(handle)
    job = AecConfig(state_serializer="pickle")
    operator = KeyedProcessOperator(Later(), MemoryBackend(), job)
    operator.restore(handle)  # the job stores states it makes later with pickle: allowed
    operator.process(Record("a", 1))
    operator.finish()
    assert operator.drain_outputs()[:-1] == [("a", 3)]


# --- SlateDB replies are checked ------------------------------------------------------------


def test_slatedb_replies_outside_the_range_or_out_of_order_fail(monkeypatch):
    from backends import slatedb_store
    from backends.keycodec import key_prefix

    prefix = slatedb_store.state_prefix("count")
    rows = [(prefix + key_prefix(3, "a"), b"\x01"), (prefix + key_prefix(5, "b"), b"\x02")]

    class Iterator:
        def __init__(self, found):
            self.found = found

        async def next_batch(self, want):
            found, self.found = self.found[:want], self.found[want:]
            return [type("KV", (), {"key": k, "value": v}) for k, v in found]

    class Db:
        def __init__(self, found):
            self.found = found

        async def scan(self, _range):
            return Iterator(list(self.found))

    import asyncio

    assert asyncio.run(slatedb_store.scan(Db(rows), prefix)) == rows
    for bad in (rows[::-1], [(b"elsewhere", b"\x01")], [(rows[0][0], "text")]):
        with pytest.raises(Exception, match="SlateDB gave a reply .*state 'count'|outside"):
            asyncio.run(slatedb_store.scan(Db(bad), prefix))
    with pytest.raises(Exception, match="state 'count', key group 3: a str"):
        slatedb_store.checked_value(rows[0][0], "not bytes")
    assert serialization.SAFE.loads(rows[0][1]) == 1


class _Progress:
    """A watermark generator's progress, as ``save_watermarks`` / ``load_watermarks``
    see it."""

    def __init__(self, seen=None):
        self.seen = seen
        self.resumed = None

    def progress(self):
        return self.seen

    def resume(self, progress):
        self.resumed = progress


def test_a_streams_watermark_progress_is_signed_with_its_checkpoint(tmp_path, monkeypatch):
    """The progress beside ``chk-<n>`` is signed like the manifest when a key is set: a
    changed file, an unsigned one, or another checkpoint's signed file in its place is
    refused before it is parsed."""
    from aec.checkpoint import CheckpointHandle, CheckpointStore
    from spark_glue.stream_state import load_watermarks, save_watermarks

    store = CheckpointStore.at(str(tmp_path))
    monkeypatch.setenv(signing.KEY_VARIABLE, "a secret only the job holds")
    save_watermarks(store, 6, _Progress({"max_timestamp": 50.0}))
    save_watermarks(store, 7, _Progress({"max_timestamp": 100.0}))
    seven = [CheckpointHandle(7, str(tmp_path / "chk-7"))]
    marks = _Progress()
    load_watermarks(seven, marks)
    assert marks.resumed == [{"max_timestamp": 100.0}]
    file = tmp_path / "watermarks-7.json"
    file.write_bytes(b'{"max_timestamp": 1e15}')  # forged progress: every record late
    with pytest.raises(ValueError, match="signature"):
        load_watermarks(seven, _Progress())
    file.write_bytes((tmp_path / "watermarks-6.json").read_bytes())  # another one's, signed
    (tmp_path / "watermarks-7.json.hmac").write_bytes(
        (tmp_path / "watermarks-6.json.hmac").read_bytes()
    )
    with pytest.raises(ValueError, match="signature"):
        load_watermarks(seven, _Progress())
    (tmp_path / "watermarks-7.json.hmac").unlink()
    with pytest.raises(ValueError, match=r"not signed \(watermarks-7\.json\.hmac is missing"):
        load_watermarks(seven, _Progress())
    monkeypatch.delenv(signing.KEY_VARIABLE)
    load_watermarks(seven, marks)  # without the key: read as it is
    assert marks.resumed == [{"max_timestamp": 50.0}]
