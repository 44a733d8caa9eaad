"""A state location that lost its history is refused, never started over from empty.

``process_keyed_stream`` records in ``layout.json`` which checkpoints make up the
state before and after each micro-batch, and compares that record with Spark's
committed micro-batches when a query starts and before each micro-batch restores
(``spark_glue.stream_state.verify_history``). Spark's checkpoint survives each
fault below while the state does not: the restart must fail naming the location
and the last committed micro-batch, on every backend the stream keeps state in.
"""

from __future__ import annotations

import os
import shutil

import pytest
from test_stream import RunningCount, Stream, _expected_per_key, _rows

from backends import RocksDBBackend
from spark_glue.stream_state import (
    HistoryRecord,
    Layout,
    StateHistoryError,
    verify_history,
)

BACKENDS = ["memory", "rocksdb"]


def _backend(name, tmp_path):
    return RocksDBBackend(str(tmp_path / "rocks")).spec() if name == "rocksdb" else None


def _two_batches(spark, tmp_path, backend, **kwargs) -> Stream:
    """A stream that committed micro-batches 0 and 1, then stopped."""
    stream = Stream(spark, tmp_path, num_partitions=2, backend=_backend(backend, tmp_path), **kwargs)
    stream.start(RunningCount())
    try:
        stream.add(_rows(0, 30, 1))
        stream.add(_rows(30, 30, 2))
    finally:
        stream.stop()
    return stream


@pytest.mark.spark
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_removed_state_directory_is_refused_at_restart(spark, tmp_path, backend):
    stream = _two_batches(spark, tmp_path, backend)
    state = os.path.join(stream.location, "state")
    shutil.rmtree(state)
    with pytest.raises(StateHistoryError) as failure:
        stream.start(RunningCount())
    message = str(failure.value)
    assert f"the state at {state} has lost its history" in message
    assert "committed micro-batches up to 1" in message
    assert "holds no layout.json" in message
    assert "new checkpoint_location" in message
    assert not os.path.exists(state)  # nothing written by the refused start


@pytest.mark.spark
def test_state_replaced_by_an_older_copy_is_refused(spark, tmp_path):
    stream = Stream(spark, tmp_path, num_partitions=2)
    state = os.path.join(stream.location, "state")
    stream.start(RunningCount())
    try:
        stream.add(_rows(0, 30, 1))
        shutil.copytree(state, tmp_path / "backup")  # the state as of micro-batch 0
        stream.add(_rows(30, 30, 2))
    finally:
        stream.stop()
    shutil.rmtree(state)
    shutil.copytree(tmp_path / "backup", state)
    with pytest.raises(StateHistoryError, match="newest finished micro-batch is 0"):
        stream.start(RunningCount())


@pytest.mark.spark
def test_a_lost_partition_is_refused_before_the_micro_batch_restores(spark, tmp_path):
    from pyspark.errors import StreamingQueryException

    stream = _two_batches(spark, tmp_path, "memory")
    state = os.path.join(stream.location, "state")
    partition = os.path.join(state, "partition-1-of-2")
    lost = sorted(n for n in os.listdir(partition) if n.startswith("chk-"))[-1]
    shutil.rmtree(partition)
    stream.start(RunningCount())  # the layout is intact: the micro-batch finds the hole
    try:
        with pytest.raises(StreamingQueryException) as failure:
            stream.add(_rows(60, 10, 3))
    finally:
        stream.stop()
    assert f"these checkpoints are missing: partition-1-of-2/{lost}" in str(failure.value)
    assert [batch_id for batch_id, _ in stream.calls] == [0, 1]  # batch 2 never reached the sink


@pytest.mark.spark
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_emptied_bucket_is_refused_and_the_restored_one_continues(
    spark, tmp_path, s3, backend
):
    """The bucket is emptied and recreated (a re-provisioned store) on the same moto
    server while Spark's checkpoint survives: refused. Put back, the stream continues
    exactly."""
    server, bucket = s3
    stream = Stream(
        spark, tmp_path, num_partitions=2, backend=_backend(backend, tmp_path),
        spark_checkpoint_location=str(tmp_path / "spark"),
    )  # fmt: skip
    stream.location = f"s3://{bucket}/job"
    steps = [_rows(0, 30, 1), _rows(30, 30, 2), _rows(60, 20, 3)]
    stream.start(RunningCount())
    try:
        stream.add(steps[0])
        stream.add(steps[1])
    finally:
        stream.stop()
    saved = {key: server.get_object(bucket, key) for key in server.list_keys(bucket)}
    server.delete_bucket(bucket)
    server.create_bucket(bucket)
    with pytest.raises(StateHistoryError) as failure:
        stream.start(RunningCount())
    assert f"the state at s3://{bucket}/job/state has lost its history" in str(failure.value)
    assert "committed micro-batches up to 1" in str(failure.value)
    for key, body in saved.items():  # the store restored: the query continues exactly
        server.put_object(bucket, key, body)
    stream.start(RunningCount())
    try:
        stream.add(steps[2])
    finally:
        stream.stop()
    assert stream.per_key() == _expected_per_key([r for step in steps for r in step])


# -- the history check without Spark ---------------------------------------------------------
def _layout(record: HistoryRecord | None) -> Layout:
    return Layout(["k"], 128, [[0, 2]], record)


RECORD = HistoryRecord(
    4,
    ("partition-0-of-2/chk-3", "partition-1-of-2/chk-2"),
    ("partition-0-of-2/chk-4", "partition-1-of-2/chk-2"),
)


def test_the_next_batch_and_a_replay_each_start_from_their_recorded_state():
    after = {0: ["partition-0-of-2/chk-4"], 1: ["partition-1-of-2/chk-2"]}
    before = {0: ["partition-0-of-2/chk-3"], 1: ["partition-1-of-2/chk-2"]}
    verify_history("/s", _layout(RECORD), 5, after, "/spark")  # the next micro-batch
    verify_history("/s", _layout(RECORD), 4, before, "/spark")  # a replay of 4
    verify_history("/s", _layout(None), 9, after, "/spark")  # a layout without records
    verify_history("/s", None, 0, {}, "/spark")  # nothing committed yet: a new query
    with pytest.raises(StateHistoryError, match="missing: partition-0-of-2/chk-4"):
        verify_history("/s", _layout(RECORD), 5, before, "/spark")
    with pytest.raises(StateHistoryError, match="not committed with it: partition-0-of-2/chk-3"):
        verify_history("/s", _layout(RECORD), 5, {**after, 0: ["partition-0-of-2/chk-3"]}, "/x")


def test_state_older_or_newer_than_sparks_checkpoint_is_refused():
    with pytest.raises(StateHistoryError, match="up to 6, but the state's newest finished"):
        verify_history("/s", _layout(RECORD), 7, None, "/spark")
    with pytest.raises(StateHistoryError, match="Spark's checkpoint is older than the state"):
        verify_history("/s", _layout(RECORD), 3, None, "/spark")
    with pytest.raises(StateHistoryError, match="no layout.json"):
        verify_history("/s", Layout(["k"], 128), 2, None, "/spark")


def test_finish_records_the_partitions_that_snapshotted():
    layout = Layout(["k"], 128, [[3, 2]])
    store = _NoStore()
    before = {0: ["partition-0-of-2/chk-3"], 1: ["partition-1-of-2/chk-2"]}
    layout.finish(store, 4, before, {0: False})  # partition 0 snapshotted, nothing pending
    assert layout.last == RECORD
    assert store.saved == 1


class _NoStore:
    saved = 0

    def write_bytes(self, data, *parts):
        self.saved += 1


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (b"{not json", "is not JSON"),
        (b"[1, 2]", "holds a JSON list, not a layout"),
        (b'{"format": 2}', "is not a complete layout"),
        (b'{"format": 2, "keys": ["k"], "max_parallelism": "x", "history": []}', "complete"),
    ],
)
def test_a_corrupt_layout_is_refused_naming_its_file(tmp_path, stored, message):
    from aec.checkpoint.storage import CheckpointStore

    store = CheckpointStore.at(tmp_path)
    Layout(["k"], 128).save(store)
    assert Layout.load(store) == Layout(["k"], 128, [], None)  # what a good one gives
    (tmp_path / "layout.json").write_bytes(stored)
    with pytest.raises(ValueError, match=message) as info:
        Layout.load(store)
    assert "layout.json" in str(info.value)
