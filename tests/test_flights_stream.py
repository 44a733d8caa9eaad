"""aec flights --stream: the year as a file stream through process_keyed_stream, compared
with the batch job on a sample."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from spark_glue.cli import main
from spark_glue.flights import data as flights_data
from spark_glue.flights import job as batch_job
from spark_glue.flights import stream_job

LIMIT = 600
# 3 files of 200 rows + the end-of-input file, 2 files per micro-batch: 2 micro-batches
SMALL = ["--limit", str(LIMIT), "--file-rows", "200", "--files-per-trigger", "2"]


def test_files_keep_the_arrival_order_and_end_with_one_marker_per_key(tmp_path):
    prepared = flights_data.load(LIMIT)
    names, markers = stream_job.write_files(prepared, str(tmp_path / "files"), 250)
    assert names == [f"part-{i:06d}.parquet" for i in range(4)]  # 250 + 250 + 100 + markers
    paths = [tmp_path / "files" / name for name in names]
    mtimes = [os.stat(p).st_mtime for p in paths]
    assert mtimes == sorted(mtimes) and len(set(mtimes)) == len(mtimes)
    rows = pd.concat(pd.read_parquet(p) for p in paths[:-1]).reset_index(drop=True)
    expected = flights_data.in_arrival_order(prepared)
    assert rows["row"].tolist() == expected["row"].tolist()
    end = pd.read_parquet(paths[-1])
    assert len(end) == markers == max(prepared["route"].nunique(), prepared["aircraft"].nunique())
    assert set(end["route"]) == set(prepared["route"])
    assert set(end["aircraft"]) == set(prepared["aircraft"])
    assert (end["row"] < 0).all() and (end["event_time"] == stream_job.END_TIME).all()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--file-rows", "10"], "--file-rows applies to --stream only"),
        (["--stream", "--backend", "redis"], "--stream needs a backend"),
        (["--stream", "--rescale-at", "3"], "expected BATCH:N"),
        (["--stream", "--rescale-at", "0:2"], "must be >= 1"),
        (["--stream", "--compare-sync"], "leave out --stream"),
    ],
)
def test_stream_arguments_are_checked(tmp_path, capsys, argv, message):
    try:
        status = main(["flights", "--out", str(tmp_path), *argv])
    except SystemExit as exc:  # argparse's errors
        status = exc.code
    assert status == 2
    assert message in capsys.readouterr().err


DATASETS = ["route_hourly", "late", "rotations", "no_tailnum"]


def _same(stream_out, batch_out, dataset):
    return batch_job.dataset_rows(os.path.join(stream_out, dataset)) == batch_job.dataset_rows(
        os.path.join(batch_out, dataset)
    )


@pytest.mark.spark
@pytest.mark.timeout(1800)  # a busy 2-core machine; about 2 minutes when idle
def test_stream_equals_batch_when_nothing_is_late_across_a_rescale(spark, tmp_path):
    out = tmp_path / "out"
    argv = ["flights", "--stream", "--compare-batch", "--backend", "memory", *SMALL]
    argv += ["--rescale-at", "1:3"]  # 2 state partitions, then 3 from micro-batch 1 on
    assert main([*argv, "--out", str(out), "--watermark-delay", "24h"]) == 0
    batch_out = out / stream_job.BATCH_DIR
    for dataset in DATASETS:  # read back here, not taken from the summary
        assert _same(out, batch_out, dataset), dataset
    assert (
        len(pd.read_parquet(out / "rotations")) + len(pd.read_parquet(out / "no_tailnum")) == LIMIT
    )
    summary = (out / "summary.md").read_text()
    assert "All four datasets are identical" in summary
    assert "| route_hourly | 2 |" in summary and "| rotations | 2 |" in summary
    assert "restarted on 3 state partition(s) (from 2)" in summary
    section = summary.split("## AEC metrics", 1)[1].split("\n## ", 1)[0]
    assert "| route_hourly |" in section and "| rotations |" in section
    assert "`route_hourly` 0 of 2 micro-batches" in section  # it drains: nothing carried
    assert (out / "aec_metrics.png").read_bytes().startswith(b"\x89PNG")
    layout = out / "stream" / "checkpoint" / "rotations" / "state"
    assert {p.name for p in layout.iterdir() if p.name.startswith("partition-")} >= {
        "partition-0-of-2",
        "partition-2-of-3",
    }


@pytest.mark.spark
@pytest.mark.timeout(1800)
def test_stream_with_a_short_delay_differs_only_in_late_records(spark, tmp_path):
    out = tmp_path / "out"
    argv = ["flights", "--stream", "--compare-batch", "--backend", "rocksdb", *SMALL]
    assert main([*argv, "--out", str(out), "--watermark-delay", "5m"]) == 0
    batch_out = out / stream_job.BATCH_DIR
    assert _same(out, batch_out, "rotations") and _same(out, batch_out, "no_tailnum")
    late = pd.read_parquet(out / "late")
    # the batch run's one watermark per partition is the final one (fewer than 1,000
    # records each); the stream's end-of-micro-batch watermark makes records late
    assert len(late) > len(pd.read_parquet(batch_out / "late"))
    # per route and hour, window flights + late records agree between the two runs
    assert stream_job._with_late(str(out)).equals(stream_job._with_late(str(batch_out)))
    summary = (out / "summary.md").read_text()
    assert "the runs differ only in which records are late" in summary
