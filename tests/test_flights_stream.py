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

LIMIT = 800
SMALL = ["--limit", str(LIMIT), "--file-rows", "150", "--files-per-trigger", "2"]


def test_files_keep_the_arrival_order_and_end_with_one_marker_per_key(tmp_path):
    prepared = flights_data.load(LIMIT)
    names, markers = stream_job.write_files(prepared, str(tmp_path / "files"), 300)
    assert names == [f"part-{i:06d}.parquet" for i in range(4)]  # 300 + 300 + 200 + markers
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
    return batch_job._rows(os.path.join(stream_out, dataset)) == batch_job._rows(
        os.path.join(batch_out, dataset)
    )


@pytest.mark.spark
def test_stream_equals_batch_when_nothing_is_late(spark, tmp_path):
    out = tmp_path / "out"
    argv = ["flights", "--stream", "--compare-batch", "--backend", "memory", *SMALL]
    assert main([*argv, "--out", str(out), "--watermark-delay", "24h"]) == 0
    batch_out = out / stream_job.BATCH_DIR
    for dataset in DATASETS:  # read back here, not taken from the summary
        assert _same(out, batch_out, dataset), dataset
    assert (
        len(pd.read_parquet(out / "rotations")) + len(pd.read_parquet(out / "no_tailnum")) == LIMIT
    )
    summary = (out / "summary.md").read_text()
    assert "All four datasets are identical" in summary
    # 800 rows in files of 150 + the end-of-input file: 7 files, 2 per micro-batch
    assert "| route_hourly | 4 |" in summary and "| rotations | 4 |" in summary


@pytest.mark.spark
def test_stream_with_the_default_delay_differs_only_in_late_records(spark, tmp_path):
    out = tmp_path / "out"
    argv = ["flights", "--stream", "--compare-batch", "--backend", "rocksdb", *SMALL]
    assert main([*argv, "--out", str(out), "--watermark-delay", "20m"]) == 0
    batch_out = out / stream_job.BATCH_DIR
    assert _same(out, batch_out, "rotations") and _same(out, batch_out, "no_tailnum")
    late = pd.read_parquet(out / "late")
    assert len(late) > 0  # the sample has late records with a 20 minute delay
    # per route and hour, window flights + late records agree between the two runs
    assert stream_job._with_late(str(out)).equals(stream_job._with_late(str(batch_out)))
    summary = (out / "summary.md").read_text()
    assert "the runs differ only in which records are late" in summary or (
        "All four datasets are identical" in summary
    )
