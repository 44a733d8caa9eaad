"""Incremental checkpoints on an object store (moto's S3 server, the ``s3`` fixture):
backend files are uploaded once and referenced by later checkpoints; retention
deletes only what no retained checkpoint references; a write failing (or the
process dying) at any step commits nothing a restore could take; an object this
process did not verify, or that changed, is uploaded again rather than referenced;
signed manifests cover the references; and a restore equals the live state on
every backend.

``shared.forget_all()`` plus ``digests.forget()`` stand for a new process: it knows
no registry, holds no cached object and has verified no file.
"""

from __future__ import annotations

import json

import pytest
import store_faults
from engine_helpers import Counter

from aec import AecConfig, KeyedProcessOperator, Record
from aec.checkpoint import (
    CheckpointStorageError,
    CheckpointStore,
    digests,
    latest_checkpoint,
    shared,
)
from aec.errors import JobFailure
from backends import MemoryBackend, RocksDBBackend

KEYS = 10_000


@pytest.fixture(autouse=True)
def new_process():
    """Every test starts (and ends) as a new process would."""
    shared.forget_all()
    digests.forget()
    yield
    shared.forget_all()
    digests.forget()


def make_backend(kind: str, tmp_path, name: str = "live"):
    if kind == "memory":
        return MemoryBackend()
    if kind == "rocksdb":
        return RocksDBBackend(str(tmp_path / name))
    from backends.slatedb import SlateDBBackend

    return SlateDBBackend(f"file://{tmp_path / 'slate'}", name)


def loaded(kind: str, tmp_path, keys: int = KEYS) -> KeyedProcessOperator:
    """A counter operator whose state holds ``keys`` keys."""
    operator = KeyedProcessOperator(Counter(), make_backend(kind, tmp_path), AecConfig())
    for key in range(keys):
        operator.process(Record(key, None))
    operator.drain_outputs()
    return operator


def feed(operator: KeyedProcessOperator, keys) -> None:
    for key in keys:
        operator.process(Record(key, None))
    operator.drain_outputs()


def restored_state(kind: str, tmp_path, handle, name: str) -> dict:
    """The counts a new operator (fresh backend) restores from ``handle``."""
    backend = make_backend(kind, tmp_path, name)
    operator = KeyedProcessOperator(Counter(), backend, AecConfig())
    operator.restore(handle)
    state = backend.state_items("count")
    operator.close()
    backend.close()
    return state


def manifest(server, bucket: str, prefix: str, checkpoint_id: int) -> dict:
    return json.loads(server.get_object(bucket, f"{prefix}/chk-{checkpoint_id}/MANIFEST.json"))


def referenced(data: dict) -> list[str]:
    return sorted(e["object"] for e in data["files"].values() if "object" in e)


def stored(server, bucket: str, prefix: str) -> list[str]:
    """The files under ``prefix`` (pyarrow's empty directory markers left out)."""
    return [k for k in server.list_keys(bucket, prefix) if not k.endswith("/")]


def check_no_garbage(server, bucket: str, prefix: str) -> None:
    """Every stored file belongs to a committed checkpoint or is referenced by one, and
    every reference exists (pyarrow's empty directory markers, ``.../``, are no files)."""
    keys = {k for k in stored(server, bucket, prefix + "/") if "/chk-" in k}
    committed = {int(k.split("/")[-2][4:]) for k in keys if k.endswith("/MANIFEST.json")}
    used = set()
    for checkpoint_id in committed:
        used |= {
            f"{prefix}/{r}" for r in referenced(manifest(server, bucket, prefix, checkpoint_id))
        }
    assert used <= keys, sorted(used - keys)
    for key in keys:
        owner = int(key[len(prefix) + 1 :].split("/")[0][4:])
        assert owner in committed or key in used, f"{key} is garbage"


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_unchanged_backend_files_are_uploaded_once_and_referenced(s3, monkeypatch, tmp_path, kind):
    server, bucket = s3
    uri = f"s3://{bucket}/inc"
    faults = store_faults.install(monkeypatch)
    operator = loaded(kind, tmp_path)
    operator.snapshot(1, uri)
    first = sum(h.written for h in faults)
    feed(operator, range(10))
    handle = operator.snapshot(2, uri)
    second = sum(h.written for h in faults) - first
    assert second * 5 < first, (first, second)  # the state's files were not sent again
    data = manifest(server, bucket, "inc", 2)
    refs = referenced(data)
    assert refs and all(r.startswith("chk-1/backend/") for r in refs)
    assert all(data["registry"][r] == 2 for r in refs)  # referenced by chk-1 and chk-2
    # the referenced objects are not in chk-2's own directory
    assert not any(
        k.startswith("inc/chk-2/" + r[6:])
        for r in refs
        for k in server.list_keys(bucket, "inc/chk-2/")
    )
    live = operator.backend.state_items("count")
    shared.forget_all()
    digests.forget()
    assert restored_state(kind, tmp_path, handle, "restored") == live
    assert live[0] == 2 and live[KEYS - 1] == 1
    operator.close()
    operator.backend.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_retention_deletes_what_no_retained_checkpoint_references(s3, tmp_path, kind):
    server, bucket = s3
    uri = f"s3://{bucket}/keep"
    store = CheckpointStore.at(uri)
    operator = loaded(kind, tmp_path)
    states = {}
    for checkpoint_id in range(1, 7):
        feed(operator, range(checkpoint_id * 7, checkpoint_id * 7 + 50))
        operator.snapshot(checkpoint_id, uri)
        states[checkpoint_id] = operator.backend.state_items("count")
        deleted = store.retain(2)
        assert deleted == ([checkpoint_id - 2] if checkpoint_id > 2 else [])
        assert store.checkpoint_ids() == list(range(max(1, checkpoint_id - 1), checkpoint_id + 1))
        check_no_garbage(server, bucket, "keep")
    assert any(r.startswith("chk-1/") for r in referenced(manifest(server, bucket, "keep", 6)))
    for checkpoint_id in (5, 6):  # each retained checkpoint restores as it was taken
        shared.forget_all()
        digests.forget()
        handle = CheckpointStore.at(uri).latest() if checkpoint_id == 6 else f"{uri}/chk-5"
        assert restored_state(kind, tmp_path, handle, f"r{checkpoint_id}") == states[checkpoint_id]
    operator.close()
    operator.backend.close()


def _writes_of_second_checkpoint(s3, monkeypatch, tmp_path) -> int:
    """How many writes the second (incremental) checkpoint of the scenario makes."""
    _, bucket = s3
    uri = f"s3://{bucket}/count"
    operator = loaded("memory", tmp_path, 500)
    operator.snapshot(1, uri)
    feed(operator, range(5))
    with monkeypatch.context() as patch:
        faults = store_faults.install(patch)
        operator.snapshot(2, uri)
    operator.close()
    return sum(h.writes for h in faults)


@pytest.mark.parametrize(
    "crash, midway",
    [(False, False), (True, False), (True, True)],
    ids=["failed-write", "process-died", "interrupted-in-stream"],
)
def test_a_checkpoint_failing_at_each_write_commits_nothing(
    s3, monkeypatch, tmp_path, crash, midway
):
    server, bucket = s3
    writes = _writes_of_second_checkpoint(s3, monkeypatch, tmp_path)
    assert writes >= 3  # own files, then the manifest (and more)
    for k in range(1, writes + 1):
        shared.forget_all()
        digests.forget()
        prefix = f"crash-{k}"
        uri = f"s3://{bucket}/{prefix}"
        operator = loaded("memory", tmp_path, 500)
        operator.snapshot(1, uri)
        first = operator.backend.state_items("count")
        feed(operator, range(5))
        with monkeypatch.context() as patch:
            faults = store_faults.install(patch, fail_at=k, crash=crash, midway=midway)
            with pytest.raises(JobFailure if crash else CheckpointStorageError, match="injected"):
                operator.snapshot(2, uri)
            assert faults[-1].writes == k
        # nothing a restore could take: chk-1 is still the newest committed checkpoint
        assert latest_checkpoint(uri).checkpoint_id == 1
        assert not any(
            k_.endswith("chk-2/MANIFEST.json") for k_ in server.list_keys(bucket, prefix)
        )
        # leftovers (a died process's) are an incomplete checkpoint; a handled failure
        # cleans up after itself
        leftovers = stored(server, bucket, f"{prefix}/chk-2/")
        assert not leftovers or crash
        with pytest.raises(
            ValueError if leftovers else FileNotFoundError, match="incomplete|no check"
        ):
            KeyedProcessOperator(Counter(), MemoryBackend()).restore(f"{uri}/chk-2")
        assert restored_state("memory", tmp_path, latest_checkpoint(uri), f"a{k}") == first
        # the job goes on (a died process: a new operator restored from chk-1)
        if crash:
            operator = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
            operator.restore(latest_checkpoint(uri))
        feed(operator, range(5))
        handle = operator.snapshot(3, uri)
        live = operator.backend.state_items("count")
        CheckpointStore.at(uri).retain(1)
        check_no_garbage(server, bucket, prefix)
        assert not stored(server, bucket, f"{prefix}/chk-2/")
        shared.forget_all()
        digests.forget()
        assert restored_state("memory", tmp_path, handle, f"b{k}") == live
        # a handled failure kept the operator and its 5 records; a died one replays from chk-1
        assert live[0] == (2 if crash else 3) and live[499] == 1
        operator.close()


def test_an_object_that_changed_is_uploaded_again_not_referenced(s3, tmp_path):
    server, bucket = s3
    uri = f"s3://{bucket}/changed"
    operator = loaded("memory", tmp_path)
    first = operator.snapshot(1, uri)
    base = next(k for k in server.list_keys(bucket, "changed/chk-1/backend/"))
    original = server.get_object(bucket, base)
    server.put_object(bucket, base, b"x" + original[1:])  # damaged in the store
    feed(operator, range(3))
    handle = operator.snapshot(2, uri)
    refs = referenced(manifest(server, bucket, "changed", 2))
    assert base[len("changed/") :] not in refs  # never referenced again
    assert any(k.startswith("changed/chk-2/backend/") for k in server.list_keys(bucket, "changed/"))
    live = operator.backend.state_items("count")
    shared.forget_all()
    digests.forget()
    with pytest.raises(ValueError, match="SHA-256"):  # a new process downloads the damage
        restored_state("memory", tmp_path, first, "bad")
    assert restored_state("memory", tmp_path, handle, "ok") == live


def test_a_process_references_only_objects_it_verified(s3, tmp_path):
    server, bucket = s3
    uri = f"s3://{bucket}/verify"
    operator = loaded("memory", tmp_path)
    first = operator.snapshot(1, uri)
    shared.forget_all()  # another process: it has not verified chk-1's files
    digests.forget()
    feed(operator, range(3))
    operator.snapshot(2, uri)
    assert referenced(manifest(server, bucket, "verify", 2)) == []  # uploaded again
    # a process that restored chk-1 (downloading and hashing its files) references them
    shared.forget_all()
    digests.forget()
    again = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
    again.restore(first)
    feed(again, range(3))
    again.snapshot(3, uri)
    refs = referenced(manifest(server, bucket, "verify", 3))
    assert refs and all(r.startswith("chk-1/backend/") for r in refs)
    operator.close()
    again.close()


def test_a_signed_manifest_covers_its_references(s3, monkeypatch, tmp_path):
    server, bucket = s3
    monkeypatch.setenv("AEC_CHECKPOINT_KEY", "secret")
    uri = f"s3://{bucket}/signed"
    operator = loaded("memory", tmp_path)
    operator.snapshot(1, uri)
    feed(operator, range(3))
    operator.snapshot(2, uri)
    feed(operator, range(3))
    handle = operator.snapshot(3, uri)
    live = operator.backend.state_items("count")
    data = manifest(server, bucket, "signed", 3)
    refs = referenced(data)
    assert refs
    shared.forget_all()
    digests.forget()
    assert restored_state("memory", tmp_path, handle, "ok") == live
    # point a reference at another stored file: the signature no longer matches
    for entry in data["files"].values():
        if entry.get("object", "").startswith("chk-1/"):
            entry["object"] = "chk-2/" + entry["object"][6:]
    key = "signed/chk-3/MANIFEST.json"
    server.put_object(bucket, key, json.dumps(data, indent=1, sort_keys=True).encode())
    shared.forget_all()
    with pytest.raises(ValueError, match="signature"):
        restored_state("memory", tmp_path, handle, "tampered")


@pytest.mark.parametrize("kind", ["memory", "rocksdb", "slatedb", "redis"])
def test_micro_batches_restore_the_live_state_on_every_backend(s3, tmp_path, request, kind):
    _, bucket = s3
    uri = f"s3://{bucket}/{kind}"
    if kind == "redis":
        from backends.redis import RedisBackend

        server = request.getfixturevalue("redis_server")
        make = lambda name: RedisBackend(server.url, prefix=f"{kind}-{name}")  # noqa: E731
    else:
        make = lambda name: make_backend(kind, tmp_path, name)  # noqa: E731
    live = make("live")
    operator = KeyedProcessOperator(Counter(), live, AecConfig())
    store = CheckpointStore.at(uri)
    for batch in range(1, 5):
        feed(operator, [k % (40 * batch) for k in range(150)])
        handle = operator.snapshot(batch, uri)
        store.retain(2)
        shared.forget_all()  # the next micro-batch may run in another process
        digests.forget()
        copy = make(f"copy-{batch}")
        restored = KeyedProcessOperator(Counter(), copy, AecConfig())
        restored.restore(handle)
        assert copy.state_items("count") == live.state_items("count")
        restored.close()
        if kind == "redis":
            copy.clear()
        copy.close()
    assert store.checkpoint_ids() == [3, 4]
    operator.close()
    if kind == "redis":
        live.clear()
    live.close()


def test_a_stream_partition_keeps_the_configured_checkpoints_on_s3(s3, tmp_path):
    """``process_keyed_stream``'s task (without Spark): RocksDB micro-batches restore
    the previous checkpoint from S3, snapshot, and keep ``checkpoints_retained``."""
    import uuid

    import cloudpickle
    from pyspark.sql import types as T
    from test_stream import RunningCount, _expected_per_key, _rows, _run_task

    from backends.rocksdb import RocksDBSpec
    from spark_glue.partition import PartitionJob
    from spark_glue.raw_frame import RawLayout
    from spark_glue.stream_state import StateStore
    from spark_glue.stream_task import StreamTask

    server, bucket = s3
    main = T.StructType(
        [T.StructField("k", T.StringType())]
        + [T.StructField(name, T.LongType()) for name in ("seq", "count", "total")]
    )
    config = AecConfig(checkpoints_retained=3)
    job = PartitionJob(cloudpickle.dumps(RunningCount()), RocksDBSpec(str(tmp_path / "db")),
                       config, ["k"], None, 0.0, 1000, RawLayout.build(main, {}), partitions=1)  # fmt: skip
    state = StateStore(f"s3://{bucket}/stream", 128)
    task = StreamTask(job, state, uuid.uuid4().hex, keep=False)
    own = state.partition(0, 1)
    steps = [_rows(20 * b, 20, 40 + b) for b in range(6)]
    got: dict[str, list[tuple]] = {}
    for batch_id, rows in enumerate(steps):
        latest = own.latest()
        out, _ = _run_task(task, batch_id, rows, [latest] if latest else [])
        for k, seq, count, total in out:
            got.setdefault(k, []).append((seq, count, total))
        assert own.checkpoint_ids() == list(range(max(0, batch_id - 2), batch_id + 1))
        check_no_garbage(server, bucket, "stream/partition-0-of-1")
        marks = [k for k in server.list_keys(bucket, "stream/") if "watermarks-" in k]
        assert len(marks) == min(batch_id + 1, 3)  # pruned with their checkpoints
    assert got == _expected_per_key([r for step in steps for r in step])


def test_retained_checkpoints_are_at_least_two():
    with pytest.raises(ValueError, match="checkpoints_retained"):
        AecConfig(checkpoints_retained=1)
    assert AecConfig().checkpoints_retained == 2


def test_deleting_rereads_manifests_another_process_rewrote(s3, monkeypatch, tmp_path):
    """A retried attempt elsewhere deletes chk-2 and takes it again as a delta on
    chk-1's base (``spark_glue``'s ``clear_attempt``); this process still holds the old
    chk-2 (a base of its own). Its ``retain(1)`` must not delete chk-1's base, which
    the new chk-2 references."""
    server, bucket = s3
    uri = f"s3://{bucket}/rewritten"
    operator = loaded("memory", tmp_path, 2000)
    operator.snapshot(1, uri)
    feed(operator, range(2000, 8000))  # grown: chk-2 is a new base
    operator.snapshot(2, uri)
    store = CheckpointStore.at(uri)
    mine = shared.registry(store.location)  # this process's view, read before the rewrite
    shared.forget_all()  # the other process
    digests.forget()
    other = KeyedProcessOperator(Counter(), MemoryBackend(), AecConfig())
    other.restore(f"{uri}/chk-1")
    store.delete(2)
    feed(other, range(5))
    other.snapshot(2, uri)
    live = other.backend.state_items("count")
    other.close()
    new_chk2 = json.loads(server.get_object(bucket, "rewritten/chk-2/MANIFEST.json"))
    assert any(e.get("object", "").startswith("chk-1/") for e in new_chk2["files"].values())
    shared.forget_all()
    monkeypatch.setitem(shared._REGISTRIES, store.location, mine)  # back to this process
    assert CheckpointStore.at(uri).retain(1) == [1]
    shared.forget_all()
    digests.forget()
    assert restored_state("memory", tmp_path, latest_checkpoint(uri), "after") == live


def test_a_checkpoint_whose_uploaded_files_vanished_is_not_committed(s3, monkeypatch, tmp_path):
    """Another writer's garbage collection deleted files this checkpoint uploaded,
    before its manifest: the commit fails instead of naming missing files."""
    server, bucket = s3
    uri = f"s3://{bucket}/vanished"
    operator = loaded("memory", tmp_path, 500)
    store = CheckpointStore.at(uri)
    real_stamps = CheckpointStore.stamps

    def stamps_after_a_deletion(self, paths):
        for path in paths:  # the other writer deletes them now
            server.client().delete_object(Bucket=bucket, Key=f"vanished/{path}")
        return real_stamps(self, paths)

    monkeypatch.setattr(CheckpointStore, "stamps", stamps_after_a_deletion)
    with pytest.raises(CheckpointStorageError, match="vanished"):
        operator.snapshot(1, uri)
    monkeypatch.undo()
    assert store.checkpoint_ids() == []
    operator.close()


def test_retain_deletes_nothing_while_a_kept_manifest_cannot_be_read(s3, tmp_path):
    server, bucket = s3
    uri = f"s3://{bucket}/unreadable"
    operator = loaded("memory", tmp_path, 200)
    operator.snapshot(1, uri)
    first = operator.backend.state_items("count")
    feed(operator, range(5))
    operator.snapshot(2, uri)
    operator.close()
    server.put_object(bucket, "unreadable/chk-2/MANIFEST.json", b"")  # damaged in the store
    shared.forget_all()
    assert CheckpointStore.at(uri).retain(1) == []
    assert CheckpointStore.at(uri).checkpoint_ids() == [1, 2]
    digests.forget()
    assert restored_state("memory", tmp_path, f"{uri}/chk-1", "kept") == first
