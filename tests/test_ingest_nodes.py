"""`ingest` of a folder of rank traces writes node files (one Parquet file per host and cycle for a
block of ranks, `_capture/ingest_nodes.py`), read in a pool of processes, and reading them back
gives the report the ranks' summaries give in this process."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import artifact_files
from mlflow.tracking import MlflowClient
from rank3d import Job3D, generate

from mlflow_neuron._analysis.ranks.analysis import analyze
from mlflow_neuron._capture.ingest_nodes import RankBlocks, blocks_of
from mlflow_neuron._readback.ranks import read_ranks
from mlflow_neuron._record.model import node_file_of
from mlflow_neuron._trace.collectives import rank_summary_from_chrome
from mlflow_neuron.cli import main as cli_main


def test_an_ingested_job_s_node_files_give_the_report_of_its_summaries(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "job"
    truth = generate(Job3D(tp=4, pp=2, dp=8, slow_rank=37, clock_skew_ms=5), folder)  # 64 ranks, 8 of them a file
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)  # the store's artifact root, ./mlruns, lands in tmp_path
    assert cli_main(["ingest", str(folder), "--experiment", "job", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    run_id = out.rsplit("into run ", 1)[1].split()[0]
    files = sorted(p.removeprefix("profiler/ranks/") for p in artifact_files(MlflowClient(uri), run_id, "profiler/ranks"))
    assert [node_file_of(f) for f in files] == [("unknown", 16, first) for first in sorted(range(0, 64, 8), key=str)]
    assert out.count("-> its rank summary, step 16") == 63  # every rank but the lowest, logged in full
    read = read_ranks(run_id, uri)
    assert read.notes == [] and sorted(s["rank"] for s in read.summaries) == list(range(64))
    summaries = [rank_summary_from_chrome(truth["files"][r], rank=r, world_size=64, cycle_step=16) for r in range(64)]
    mine = analyze(summaries, expected_world_size=64)
    assert read.report.straggler["rank"] == mine.straggler["rank"] == 37
    pd.testing.assert_frame_equal(read.report.table, mine.table)
    assert read.report.to_json() == mine.to_json()


def test_ranks_are_read_in_blocks_of_whole_hosts_the_lowest_rank_in_the_first():
    ranks = [5, *range(6, 4096)]  # the lowest rank first, as `RankBlocks` has it
    blocks = blocks_of(ranks, workers=2)
    assert len(blocks) == 64 and blocks[0][0] == 0 and {len(b) for b in blocks[1:]} == {64}
    assert all(len({ranks[i] // 64 for i in block}) == 1 for block in blocks)
    assert [len(b) for b in blocks_of(list(range(64)), workers=2)] == [8] * 8  # a few: small blocks, for both workers
    assert [len(b) for b in blocks_of([0, 0, 1, 1], workers=2)] == [4]  # two cycles a rank


def test_a_worker_that_dies_is_said_at_once_and_the_others_are_stopped(tmp_path):
    truth = generate(Job3D(tp=4, pp=2, dp=8), tmp_path / "job")
    others = [(truth["files"][r], r) for r in range(1, 64)]
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")  # where each block's files should go: every task fails, and its worker ends
    with pytest.raises(RuntimeError, match="a process reading rank traces ended"):
        with RankBlocks(others, 64, not_a_folder, 0, workers=2) as blocks:
            list(blocks.results([]))
    assert all(process.poll() is not None for process, _ in blocks.workers)
