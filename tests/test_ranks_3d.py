"""Ranks at a 3D-parallel job's shape: process groups, waits within groups, the root-cause straggler.

Two sources: a real 4-rank gloo job with tensor-, data- and pipeline-parallel groups recorded under
torchrun (tests/rank3d_worker.py; gloo writes no group, so the placement rule in
`_analysis/ranks/lanes.py` places each collective), and 3D NCCL-format traces from the generator
(tests/rank3d.py) at 256 ranks, with host clocks off by milliseconds, a planted slow rank and a
dead one, checked against the generator's truth.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from rank3d import Job3D, generate

from mlflow_neuron._analysis.ranks.analysis import analyze
from mlflow_neuron._trace.collectives import rank_summary_from_chrome

MULTI = Path(__file__).parent / "fixtures" / "multi_rank"
STAGE_1 = {2, 3}


def gloo_job(name: str) -> list[dict]:
    return [rank_summary_from_chrome(MULTI / name / f"rank{r}.json.gz", cycle_step=8) for r in range(4)]


def test_a_gloo_job_s_collectives_are_placed_in_the_groups_the_job_issued_them_in():
    for name in ("gloo_3d_slow", "gloo_3d_even"):
        report = analyze(gloo_job(name))
        assert report.unmatched == [] and report.missing == [], report.unmatched[:3]
        for rank in range(4):
            issued = json.loads((MULTI / name / f"truth_rank{rank}.json").read_text())["issued"]
            wanted = [(i["desc"], i["ranks"]) for i in issued if i["op"] == "all_reduce"]
            mine = report.instances[report.instances["rank"] == rank].sort_values("start_us")
            got = [(desc, [int(x) for x in group.split("group ")[1].split(",")]) for desc, group
                   in zip(mine["desc"], mine["group"])]  # fmt: skip
            assert got == wanted, (name, rank)


def test_the_slow_rank_is_named_with_its_tp_group_not_its_peer_and_every_other_rank_waits_30_ms_more():
    slow, even = analyze(gloo_job("gloo_3d_slow")), analyze(gloo_job("gloo_3d_even"))
    s = slow.straggler
    assert s is not None and s["rank"] == 2 and s["group_ranks"] == [2, 3] and s["group_desc"] == "tp", slow.sentence
    assert slow.sentence.startswith("rank 2 on vm (tp group 2,3) was late by its own time in 6 of 6 steps")
    assert s["peers_wait_us"] == pytest.approx(30_000, rel=0.2)

    def waited(report):  # in collectives and in receives (the pipeline's bubble), a step
        t = report.table.set_index("rank")
        return t["wait_us"] + t["bubble_us"].fillna(0.0)

    more = waited(slow) - waited(even)
    for rank in (0, 1, 3):
        assert more[rank] == pytest.approx(30_000, rel=0.3), more.to_dict()
    assert abs(more[2]) < 5_000, more.to_dict()
    # the receives' wait is the pipeline's bubble, shown apart from the wait in collectives
    assert slow.table.set_index("rank").loc[[2, 3], "bubble_us"].min() > 20_000


def test_without_the_sleep_no_rank_of_the_second_stage_is_named():
    report = analyze(gloo_job("gloo_3d_even"))
    # stage 1 starts when stage 0's activations arrive and so reaches the dp all_reduce last in
    # every step: arriving last is not being late, and ranks doing the same work arrive together
    assert report.straggler is None or report.straggler["rank"] not in STAGE_1, report.sentence


@pytest.fixture(scope="module")
def job_256(tmp_path_factory):
    """TP 8 x PP 4 x DP 8 = 256 ranks on 8 hosts with clocks up to 5 ms apart; rank 37 slow
    (15 ms before each of its TP collectives); rank 200 dead (no file)."""
    out = tmp_path_factory.mktemp("job256")
    truth = generate(Job3D(tp=8, pp=4, dp=8, slow_rank=37, clock_skew_ms=5, missing_ranks=[200]), out)
    summaries = [rank_summary_from_chrome(f, cycle_step=10) for f in sorted(out.glob("*.pt.trace.json"))]
    return truth, analyze(summaries, expected_world_size=256)


def test_at_256_ranks_the_slow_rank_is_named_with_its_tp_group_and_the_dead_rank_missing(job_256):
    truth, report = job_256
    s = report.straggler
    assert s is not None and s["rank"] == truth["straggler"]["rank"] == 37, report.sentence
    assert s["group_ranks"] == truth["straggler"]["tp_group"] and s["group_desc"] == "tp"
    assert report.missing == [200] and "rank 200 sent no summary" in report.sentence
    assert report.unmatched == []
    assert any(n.startswith("tp group 200-207 matched among 7 of its 8 members (200 sent no summary)") for n in report.notes)


def test_at_256_ranks_host_clocks_are_aligned_and_each_ranks_wait_is_the_true_wait(job_256):
    truth, report = job_256
    assert report.clock == "aligned" and max(abs(v) for v in truth["host_offsets_us"].values()) > 1000
    per_rank = report.steps.groupby("rank")["wait_us"].sum()
    true = {int(r): sum(step.get(k, 0.0) for step in steps for k in ("tp", "dp", "world"))
            for r, steps in truth["wait_us_by_kind"].items() if int(r) in per_rank.index}  # fmt: skip
    largest = max(true.values())
    for rank, wait in true.items():
        assert abs(per_rank[rank] - wait) <= 0.01 * largest, (rank, per_rank[rank], wait)


def test_at_256_ranks_without_a_slow_rank_none_is_named(tmp_path):
    generate(Job3D(tp=8, pp=4, dp=8, clock_skew_ms=5, seed=3), tmp_path)
    summaries = [rank_summary_from_chrome(f, cycle_step=10) for f in sorted(tmp_path.glob("*.pt.trace.json"))]
    report = analyze(summaries, expected_world_size=256)
    assert report.straggler is None, report.sentence
    assert report.matched > 0 and report.unmatched == []


def test_a_rank_that_disagrees_about_its_groups_members_is_named_and_the_rest_still_match(tmp_path):
    generate(Job3D(tp=4, pp=2, dp=2, slow_rank=5), tmp_path)
    summaries = [rank_summary_from_chrome(f, cycle_step=10) for f in sorted(tmp_path.glob("*.pt.trace.json"))]
    liar = next(s for s in summaries if s["rank"] == 6)
    tp = liar["member_sets"].index([4, 5, 6, 7])
    liar["member_sets"][tp] = [4, 6, 7]  # its trace says its tp group has 3 members
    report = analyze(summaries)
    assert report.straggler is not None and report.straggler["rank"] == 5, report.sentence
    assert any(u["rank"] == 6 and "group 4,6,7" in u["why"] for u in report.unmatched), report.unmatched[:3]
    assert any("tp group 4-7 matched among 3 of its 4 members" in n for n in report.notes), report.notes


def test_a_group_larger_than_the_world_and_a_rank_in_no_group_are_said_and_lose_nothing_else(tmp_path):
    generate(Job3D(tp=2, pp=2, dp=2), tmp_path)
    summaries = [rank_summary_from_chrome(f, cycle_step=10) for f in sorted(tmp_path.glob("*.pt.trace.json"))]
    plain = analyze(summaries)
    odd = json.loads(json.dumps(summaries))
    for c in odd[0]["collectives"]:
        if c["desc"] == "default_pg":
            c["members"] = list(range(12))  # a group of 12 in a world of 8
    for c in odd[3]["collectives"]:
        c["members"] = [0, 1]  # rank 3's trace lists it in no group of its own
    report = analyze(odd)
    assert any("a group of 12 ranks in a world of 8" in n for n in report.notes), report.notes
    assert any(u["rank"] == 3 and "does not hold this rank" in u["why"] for u in report.unmatched)
    assert 0 < report.matched < plain.matched and report.missing == []


def test_the_generator_s_folder_is_read_whole_by_ingest_s_reader(tmp_path):
    generate(Job3D(tp=2, pp=2, dp=2, gzip=True), tmp_path)
    files = sorted(tmp_path.glob("*.pt.trace.json.gz"))
    assert len(files) == 8 and all(json.loads(gzip.decompress(f.read_bytes()))["distributedInfo"]["pg_config"] for f in files)


def stage_summary(rank: int, steps=range(1, 7)) -> dict:
    """Two pipeline stages that do different work: ranks 2 and 3 run a TP all_reduce and reach
    the world all_reduce 10 ms after ranks 0 and 1 every step (rank 2 always 30 µs after rank 3)."""
    collectives = []
    for s in steps:
        t0 = 100_000.0 * s
        late = {0: 0.0, 1: 0.0, 2: 10_030.0, 3: 10_000.0}
        if rank in (2, 3):
            collectives.append({"name": "all_reduce", "members": [2, 3], "desc": "tp", "seq": None, "step": s,
                                "start_us": t0 + 5_000.0, "end_us": t0 + 5_050.0, "group": "1"})  # fmt: skip
        collectives.append({"name": "all_reduce", "members": [0, 1, 2, 3], "desc": "default_pg", "seq": None,
                            "step": s, "start_us": t0 + late[rank], "end_us": t0 + 10_080.0, "group": "0"})  # fmt: skip
    return {"format": "mlflow-neuron/rank-summary", "version": 2, "rank": rank, "world_size": 4, "host": "h",
            "cycle_step": 9, "device": None, "groups": [],
            "steps": [{"step": s, "start_us": 100_000.0 * s, "end_us": 100_000.0 * (s + 1), "step_us": 100_000.0,
                       "window_us": 100_000.0, "collective_us": 10_000.0} for s in steps],
            "collectives": collectives}  # fmt: skip


def test_a_stage_that_does_more_work_is_no_straggler_ranks_are_compared_with_ranks_of_their_role():
    report = analyze([stage_summary(r) for r in range(4)])
    table = report.table.set_index("rank")
    assert table.loc[0, "wait_us"] == pytest.approx(10_030) and table.loc[2, "wait_us"] == 0
    # rank 2 reaches the world all_reduce last in every step, 10 ms after the first stage: that is
    # its stage's work; beside rank 3, which does the same, it is 30 µs late
    assert report.straggler is None, report.sentence
    assert "the latest, rank 2, by 30 µs a step" in report.sentence, report.sentence


def test_at_256_ranks_the_picture_is_a_heat_map_with_the_straggler_boxed_and_the_dead_rank_grey(job_256, tmp_path):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from mlflow_neuron._report.ranks import chart

    truth, report = job_256
    grid, rows = chart.heat_grid(report.table)
    assert grid.shape == (8, 32) and rows.startswith("32 ranks a row")  # Kineto writes no host name
    assert pd.isna(grid.iloc[200 // 32, 200 % 32])  # the dead rank: no value, drawn grey
    cell = grid.iloc[37 // 32, 37 % 32]
    assert cell == grid.min().min()  # the straggler waited least: everyone else waited for it
    path = chart.heat_map_png(report.table, tmp_path / "ranks.png", "title", report.straggler)
    assert path.stat().st_size > 10_000
    assert chart._cells(report.table, grid)[37] == (1, 5)


def _cut_mid_event(trace):
    trace.write_bytes(trace.read_bytes()[:5000])  # its rank still read from distributedInfo


def _no_trace_at_all(trace):
    trace.write_text("garbage{")  # no rank, no traceEvents: left out, not a reason to refuse the folder


@pytest.mark.parametrize("spoil", [_cut_mid_event, _no_trace_at_all])
def test_a_folder_with_one_corrupt_rank_trace_is_ingested_whole_but_for_it_in_one_line(tmp_path, capsys, monkeypatch,
                                                                                       spoil):  # fmt: skip
    import warnings

    from mlflow_neuron._readback.ranks import read_ranks
    from mlflow_neuron.cli import main as cli_main

    folder = tmp_path / "job"
    generate(Job3D(tp=4, pp=2, dp=8, slow_rank=5), folder)  # 64 ranks
    broken = sorted(folder.glob("*.pt.trace.json"))[2]
    spoil(broken)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)  # the new store's artifact root, ./mlruns, lands in tmp_path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli_main(["ingest", str(folder), "--experiment", "job", "--tracking-uri", uri])
    out = capsys.readouterr().out
    assert code == 0
    said = [str(w.message) for w in caught if "MLflowNeuronWarning" in type(w.message).__name__]
    assert len(said) == 1 and broken.name in said[0] and "not a readable chrome trace" in said[0], said
    run_id = out.rsplit("into run ", 1)[1].split()[0]
    report = read_ranks(run_id, uri).report
    assert report.missing == [2] and len(report.table) == 63
    assert report.straggler is not None and report.straggler["rank"] == 5, report.sentence
    assert report.unmatched == [] and "tp group 0-3 matched among 3 of its 4 members (2 sent no summary)" in report.notes


def test_a_gloo_job_read_as_one_table_gives_the_same_report_as_its_summaries():
    from mlflow_neuron._analysis.ranks.frames import collectives_frame

    summaries = gloo_job("gloo_3d_slow")
    table = collectives_frame(summaries)  # lane and peer_index have gaps: pandas makes them floats
    bare = [{k: v for k, v in s.items() if k != "collectives"} for s in summaries]
    from_table, from_lists = analyze(bare, collectives=table), analyze(summaries)
    assert from_table.unmatched == [] and from_table.straggler["rank"] == from_lists.straggler["rank"] == 2
    assert from_table.to_json() == from_lists.to_json()
