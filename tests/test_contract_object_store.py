"""Contract tests: checkpoint storage on object stores.

Black-box against a real S3 API (the ``s3`` fixture: a moto server on loopback).
"""

from __future__ import annotations

import os

import boto3
import pytest

import aec
from aec import (
    AecConfig,
    KeyedProcessFunction,
    KeyedProcessOperator,
    Record,
    ValueStateDescriptor,
    Watermark,
)
from aec.async_io import AsyncFunction, AsyncWaitOperator
from aec.keygroups import key_group_for, key_group_range_for
from backends import MemoryBackend


class Sum(KeyedProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    async def process_element(self, value, ctx):
        total = (await self.total.async_value()) + value
        await self.total.async_update(total)
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 2)
        ctx.output((ctx.current_key, value, total))

    async def on_timer(self, timestamp, ctx):
        ctx.output((ctx.current_key, "timer", timestamp, await self.total.async_value()))


SOURCE = [
    item
    for i in range(30)
    for item in ([Record(f"k{i % 4}", i, timestamp=float(i))]
                 + ([Watermark(float(i - 1))] if i % 5 == 4 else []))
]


def _client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region_name=os.environ["AWS_REGION"],
    )


def _first_half(location, checkpoint_id=7, cut=17):
    op = KeyedProcessOperator(Sum(), MemoryBackend())
    op.open()
    for element in SOURCE[:cut]:
        (op.process_watermark if isinstance(element, Watermark) else op.process)(element)
    handle = op.snapshot(checkpoint_id, location)
    before = op.drain_outputs()
    op.close()
    return handle, before


def _second_half(restore_from, cut=17):
    op = KeyedProcessOperator(Sum(), MemoryBackend())
    op.restore(restore_from)
    for element in SOURCE[cut:]:
        (op.process_watermark if isinstance(element, Watermark) else op.process)(element)
    op.finish()
    out = op.drain_outputs()
    op.close()
    return out


def _expected():
    return aec.run_keyed(SOURCE, Sum()).outputs


def test_snapshot_to_s3_has_local_layout_and_restores(s3):
    server, bucket = s3
    uri = f"s3://{bucket}/jobs/one"
    handle, before = _first_half(uri)
    keys = server.list_keys(bucket, "jobs/one/")
    assert keys and all(k.startswith("jobs/one/chk-7/") for k in keys), keys
    assert any(k.rsplit("/", 1)[-1].lower().startswith("manifest") for k in keys), keys
    after_handle = _second_half(handle)
    assert before + after_handle == _expected()
    # the chk-<id> URI restores too
    after_uri = _second_half(f"{uri}/chk-7")
    assert after_uri == after_handle


def test_file_uri_and_local_path_are_equivalent(tmp_path):
    handle, before = _first_half(f"file://{tmp_path}/a")
    assert os.path.isdir(tmp_path / "a" / "chk-7")
    assert before + _second_half(handle) == _expected()
    assert before + _second_half(f"file://{tmp_path}/a/chk-7") == _expected()
    assert before + _second_half(str(tmp_path / "a" / "chk-7")) == _expected()


def test_checkpoint_without_manifest_is_incomplete_and_never_restored(s3):
    server, bucket = s3
    uri = f"s3://{bucket}/inc"
    _first_half(uri, checkpoint_id=3)
    keys = server.list_keys(bucket, "inc/")
    manifests = [k for k in keys if k.rsplit("/", 1)[-1].lower().startswith("manifest")]
    assert len(manifests) == 1
    _client().delete_object(Bucket=bucket, Key=manifests[0])
    op = KeyedProcessOperator(Sum(), MemoryBackend())
    with pytest.raises(ValueError, match="(?i)manifest|incomplete"):
        op.restore(f"{uri}/chk-3")
    # nothing live changed: the operator still takes a good checkpoint
    handle, _ = _first_half(f"{uri}/again", checkpoint_id=4)
    op.restore(handle)
    op.close()


def test_incomplete_local_checkpoint_is_refused(tmp_path):
    handle, _ = _first_half(str(tmp_path), checkpoint_id=2)
    for name in os.listdir(handle.path):
        if name.lower().startswith("manifest"):
            os.remove(os.path.join(handle.path, name))
    with pytest.raises(ValueError, match="(?i)manifest|incomplete"):
        KeyedProcessOperator(Sum(), MemoryBackend()).restore(handle)


def test_unresolvable_scheme_is_value_error_naming_it_never_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    op = KeyedProcessOperator(Sum(), MemoryBackend())
    op.open()
    op.process(Record("a", 1, timestamp=1.0))
    with pytest.raises(ValueError, match="nosuchscheme"):
        op.snapshot(1, "nosuchscheme://bucket/prefix")
    assert os.listdir(tmp_path) == []  # nothing written under a local "nosuchscheme:" dir
    # the operator stays usable
    op.process(Record("a", 2, timestamp=2.0))
    op.finish()
    assert [o for o in op.drain_outputs() if not isinstance(o, Watermark)][:2] == [
        ("a", 1, 1), ("a", 2, 3)
    ]
    op.close()
    with pytest.raises(ValueError, match="nosuchscheme"):
        KeyedProcessOperator(Sum(), MemoryBackend()).restore("nosuchscheme://bucket/prefix/chk-1")
    assert os.listdir(tmp_path) == []


def test_aws_variables_are_read_when_the_call_is_made(s3, monkeypatch):
    server, bucket = s3
    good_endpoint = os.environ["AWS_ENDPOINT_URL"]
    op = KeyedProcessOperator(Sum(), MemoryBackend())
    op.open()
    op.process(Record("a", 1, timestamp=1.0))
    # an endpoint nobody listens on: the call fails, nothing is committed
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(OSError):
        op.snapshot(1, f"s3://{bucket}/late")
    monkeypatch.setenv("AWS_ENDPOINT_URL", good_endpoint)
    assert not any("manifest" in k.lower() for k in server.list_keys(bucket, "late/"))
    # the same operator, same URI, the good endpoint now: works
    handle = op.snapshot(2, f"s3://{bucket}/late")
    assert any(k.startswith("late/chk-2/") for k in server.list_keys(bucket, "late/"))
    op.close()
    restored = KeyedProcessOperator(Sum(), MemoryBackend())
    restored.restore(handle)
    restored.process(Record("a", 5, timestamp=5.0))
    restored.finish()
    assert [o for o in restored.drain_outputs() if not isinstance(o, Watermark)][0] == ("a", 5, 6)
    restored.close()


def test_rescale_through_s3(s3):
    _, bucket = s3
    max_p = 8
    config = AecConfig(max_parallelism=max_p)
    handles, outputs = [], []
    for i in range(2):
        r = key_group_range_for(max_p, 2, i)
        op = KeyedProcessOperator(Sum(), MemoryBackend(), config, key_group_range=r)
        op.open()
        for element in SOURCE[:17]:
            if isinstance(element, Watermark):
                op.process_watermark(element)
            elif key_group_for(element.key, max_p) in r:
                op.process(element)
        handles.append(op.snapshot(1, f"s3://{bucket}/scale/op{i}"))
        outputs += op.drain_outputs()
        op.close()
    op = KeyedProcessOperator(Sum(), MemoryBackend(), config)
    op.restore([f"s3://{bucket}/scale/op0/chk-1", handles[1]])
    for element in SOURCE[17:]:
        (op.process_watermark if isinstance(element, Watermark) else op.process)(element)
    op.finish()
    outputs += op.drain_outputs()
    op.close()

    def per_key(items):
        grouped = {}
        for item in items:
            if not isinstance(item, Watermark):
                grouped.setdefault(item[0], []).append(item)
        return grouped

    assert per_key(outputs) == per_key(_expected())


class Echo(AsyncFunction):
    def async_invoke(self, value, result_future):
        result_future.complete([value * 10])


def test_async_wait_operator_checkpoint_on_s3(s3):
    _, bucket = s3
    op = AsyncWaitOperator(Echo(), 5.0, 10)
    op.open()
    for v in range(5):
        op.process(v)
    handle = op.snapshot(1, f"s3://{bucket}/async")
    emitted = op.drain_outputs()
    op.close()
    restored = AsyncWaitOperator(Echo(), 5.0, 10)
    restored.restore(f"s3://{bucket}/async/chk-1")
    restored.process(5)
    restored.finish()
    assert emitted + restored.drain_outputs() == [v * 10 for v in range(6)]
    restored.close()
    assert handle.checkpoint_id == 1


def test_restore_from_a_chk_uri_with_a_trailing_slash(s3):
    _, bucket = s3
    uri = f"s3://{bucket}/slash"
    handle, before = _first_half(uri)
    assert before + _second_half(f"{uri}/chk-7/") == _expected()
    assert _second_half(handle) == _second_half(f"{uri}/chk-7")


def test_async_wait_operator_refuses_an_unresolvable_scheme(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    op = AsyncWaitOperator(Echo(), 5.0, 4)
    op.open()
    op.process(1)
    with pytest.raises(ValueError, match="nosuchscheme"):
        op.snapshot(1, "nosuchscheme://b/p")
    with pytest.raises(ValueError, match="nosuchscheme"):
        AsyncWaitOperator(Echo(), 5.0, 4).restore("nosuchscheme://b/p/chk-1")
    assert os.listdir(tmp_path) == []
    op.process(2)  # still usable
    op.finish()
    assert op.drain_outputs() == [10, 20]


def test_restore_reads_the_aws_variables_when_called(s3, monkeypatch):
    _, bucket = s3
    handle, before = _first_half(f"s3://{bucket}/env")
    good_endpoint = os.environ["AWS_ENDPOINT_URL"]
    op = KeyedProcessOperator(Sum(), MemoryBackend())
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(OSError):
        op.restore(handle)
    monkeypatch.setenv("AWS_ENDPOINT_URL", good_endpoint)
    op.close()
    assert before + _second_half(handle) == _expected()


@pytest.mark.parametrize("kind", ["rocksdb", "slatedb"])
def test_s3_checkpoints_of_disk_backends(kind, s3, tmp_path):
    from backends import RocksDBBackend, SlateDBBackend

    _, bucket = s3
    made = iter(range(10))

    def backend():
        if kind == "rocksdb":
            return RocksDBBackend(str(tmp_path / f"db{next(made)}"))
        return SlateDBBackend(f"file://{tmp_path}/slate", f"db{next(made)}")

    first = backend()
    op = KeyedProcessOperator(Sum(), first)
    op.open()
    for element in SOURCE[:17]:
        (op.process_watermark if isinstance(element, Watermark) else op.process)(element)
    handle = op.snapshot(1, f"s3://{bucket}/{kind}")
    before = op.drain_outputs()
    op.close()
    first.close()
    second = backend()
    op = KeyedProcessOperator(Sum(), second)
    op.restore(f"s3://{bucket}/{kind}/chk-1")
    for element in SOURCE[17:]:
        (op.process_watermark if isinstance(element, Watermark) else op.process)(element)
    op.finish()
    after = op.drain_outputs()
    op.close()
    second.close()
    assert before + after == _expected()
    assert handle.checkpoint_id == 1
