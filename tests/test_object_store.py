"""Checkpoints on an object store,
against a real S3 API server on loopback (moto in server mode, the ``s3`` fixture).

The manifest, uploaded last, is the commit: listing ignores a directory without
one, restoring it is refused, and a store failing on any write leaves no
manifest while the operator keeps its state and stays usable.
"""

from __future__ import annotations

import math
import os

import pytest
import store_faults
from engine_helpers import AsyncCounter
from s3_server import S3Server, _free_port

from aec import (
    AecConfig,
    KeyedProcessOperator,
    Record,
    Watermark,
)
from aec.checkpoint import CheckpointHandle, CheckpointStorageError, latest_checkpoint, storage
from aec.keygroups import key_group_range_for
from backends import MemoryBackend


class Count(AsyncCounter):
    """Counts per key; a non-zero value also sets an event-time timer at it."""

    async def process_element(self, value, ctx):
        await super().process_element(value, ctx)
        if value:
            ctx.timer_service.register_event_time_timer(value)

    def on_timer(self, timestamp, ctx):
        ctx.output(("timer", ctx.current_key, timestamp))


def operator_with(records, backend=None, **kwargs):
    operator = KeyedProcessOperator(Count(), backend or MemoryBackend(), AecConfig(), **kwargs)
    for key, value in records:
        operator.process(Record(key, value))
    operator.drain_outputs()
    return operator


def test_snapshot_restore_round_trip_on_s3(s3):
    server, bucket = s3
    uri = f"s3://{bucket}/jobs/one"
    first = operator_with([("a", 5), ("b", 0), ("a", 0)])
    first.process_watermark(Watermark(1.0))
    handle = first.snapshot(4, uri)
    assert handle == CheckpointHandle(4, f"{uri}/chk-4")
    keys = server.list_keys(bucket, "jobs/one/")
    assert "jobs/one/chk-4/MANIFEST.json" in keys
    assert {"jobs/one/chk-4/operator.json", "jobs/one/chk-4/timers.msgpack"} <= set(keys)
    assert any(k.startswith("jobs/one/chk-4/backend/") for k in keys)
    assert not os.path.exists("s3:")  # never a local directory named after the scheme
    assert latest_checkpoint(uri) == handle
    for restore_from in (handle, f"{uri}/chk-4"):
        backend = MemoryBackend()
        second = KeyedProcessOperator(Count(), backend, AecConfig())
        second.restore(restore_from)
        assert backend.state_items("count") == {"a": 2, "b": 1}
        second.process(Record("b", 0))
        second.finish()
        assert second.drain_outputs() == [("b", 2), ("timer", "a", 5), Watermark(math.inf)]


def test_listing_ignores_and_restore_refuses_a_checkpoint_without_manifest(s3):
    server, bucket = s3
    uri = f"s3://{bucket}/p"
    handle = operator_with([("a", 0)]).snapshot(1, uri)
    fs, root = storage.resolve_filesystem(uri)
    with fs.open_output_stream(f"{root}/chk-9/operator.json") as out:
        out.write(b"{}")  # a newer checkpoint whose upload never finished
    assert latest_checkpoint(uri) == handle
    with pytest.raises(ValueError, match="incomplete"):
        KeyedProcessOperator(Count(), MemoryBackend()).restore(f"{uri}/chk-9")
    with pytest.raises(FileNotFoundError):
        KeyedProcessOperator(Count(), MemoryBackend()).restore(f"{uri}/chk-10")
    with pytest.raises(FileExistsError):
        operator_with([]).snapshot(9, uri)  # the leftover still holds id 9


def test_several_s3_checkpoints_restore_into_a_rescaled_operator(s3):
    _, bucket = s3
    mp = AecConfig().max_parallelism
    keys = [f"k{i}" for i in range(30)]
    from aec.keygroups import key_group_for, operator_index_for

    handles = []
    for index in range(2):
        own = key_group_range_for(mp, 2, index)
        mine = [(k, 0) for k in keys if operator_index_for(key_group_for(k, mp), mp, 2) == index]
        handles.append(
            operator_with(mine, key_group_range=own).snapshot(1, f"s3://{bucket}/op{index}")
        )
    backend = MemoryBackend()
    KeyedProcessOperator(Count(), backend).restore([h.path for h in handles])
    assert backend.state_items("count") == {k: 1 for k in keys}


@pytest.mark.parametrize("location", ["foo://bucket/x", "nosuchscheme://a"])
def test_an_unresolvable_scheme_is_refused_by_name(location, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    operator = operator_with([("a", 0)])
    scheme = location.split(":")[0]
    with pytest.raises(ValueError, match=f"'{scheme}'"):
        operator.snapshot(1, location)
    with pytest.raises(ValueError, match=f"'{scheme}'"):
        KeyedProcessOperator(Count(), MemoryBackend()).restore(location + "/chk-1")
    with pytest.raises(ValueError, match=f"'{scheme}'"):
        latest_checkpoint(location)
    assert os.listdir(tmp_path) == []  # nothing written locally
    assert operator.snapshot(1, tmp_path / "ok").checkpoint_id == 1  # still usable


def test_an_unreachable_endpoint_is_a_clear_error(s3, monkeypatch, tmp_path):
    _, bucket = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    operator = operator_with([("a", 0)])
    with pytest.raises(CheckpointStorageError, match=f"s3://{bucket}/x.*unreachable"):
        operator.snapshot(1, f"s3://{bucket}/x")
    assert operator.snapshot(2, tmp_path).checkpoint_id == 2  # the operator is still usable


def test_bad_credentials_are_a_clear_error(monkeypatch):
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")  # moto checks credentials
    server = S3Server().start()
    try:
        for name, value in server.environ().items():
            monkeypatch.setenv(name, value)
        operator = operator_with([("a", 0)])
        with pytest.raises(CheckpointStorageError, match="refused access.*ACCESS_DENIED"):
            operator.snapshot(1, "s3://any-bucket/x")
        with pytest.raises(CheckpointStorageError, match="ACCESS_DENIED"):
            KeyedProcessOperator(Count(), MemoryBackend()).restore("s3://any-bucket/x/chk-1")
    finally:
        server.stop()


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])
def test_a_store_failing_on_the_kth_write_commits_nothing_and_keeps_state(s3, monkeypatch, fail_at):
    server, bucket = s3
    real = storage.resolve_filesystem
    handler = store_faults.install(monkeypatch, fail_at)
    backend = MemoryBackend()
    operator = operator_with([("a", 0), ("b", 0)], backend)
    uri = f"s3://{bucket}/f"
    with pytest.raises(CheckpointStorageError, match="injected failure"):
        operator.snapshot(1, uri)
    assert handler[-1].writes == fail_at  # the k-th write failed, nothing after it was tried
    assert not [k for k in server.list_keys(bucket) if k.endswith("MANIFEST.json")]
    assert latest_checkpoint(uri) is None
    assert backend.state_items("count") == {"a": 1, "b": 1}
    monkeypatch.setattr(storage, "resolve_filesystem", real)
    operator.process(Record("a", 0))  # still usable; the next checkpoint commits
    handle = operator.snapshot(2, uri)
    restored = MemoryBackend()
    KeyedProcessOperator(Count(), restored).restore(handle)
    assert restored.state_items("count") == {"a": 2, "b": 1}
