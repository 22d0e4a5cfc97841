"""Rank summaries and the analysis across ranks: `_trace.collectives` and `_analysis.ranks`.

Pure tests with chosen numbers; real traces: a 4-rank gloo job recorded under torchrun (with and
without a slow rank) and HolisticTraceAnalysis's public 2-rank NCCL pair, against the figures
HolisticTraceAnalysis and TraceLens give for the same files (tests/fixtures/multi_rank/reference.json,
from benchmarks/hta_agreement.py).
"""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from mlflow_neuron._analysis.ranks import straggler as ranks
from mlflow_neuron._analysis.ranks.analysis import analyze
from mlflow_neuron._analysis.ranks.change import explain_change
from mlflow_neuron._trace.collectives import FORMAT, VERSION, rank_summary_from_chrome

FIXTURES = Path(__file__).parent / "fixtures"
MULTI = FIXTURES / "multi_rank"
REFERENCE = json.loads((MULTI / "reference.json").read_text())
HTA_SETS = {"hta_sampled_2rank": ["multi_rank/hta_sampled_2rank/sampled_rank-0.json.gz",
                                  "multi_rank/hta_sampled_2rank/sampled_rank-1.json.gz"],
            "hta_cuda_alexnet_2023": ["real_traces/hta_cuda_alexnet_2023.json.gz"],
            "hta_cuda_trace_diff_control_2022": ["real_traces/hta_cuda_trace_diff_control_2022.json.gz"],
            "hta_rocm62_mi250_minitoy": ["real_traces/hta_rocm62_mi250_minitoy.json.gz"],
            "tracelens_rocm_mi300_normalization": ["real_traces/tracelens_rocm_mi300_normalization.json.gz"],
            "tracelens_cuda_h100_bert_small": ["real_traces/tracelens_cuda_h100_bert_small.json.gz"]}  # fmt: skip
CONTRACT_KEYS = {"format", "version", "rank", "world_size", "host", "cycle_step", "steps", "collectives", "device"}
STEP_KEYS = {"step", "start_us", "end_us", "step_us", "compute_us", "collective_us", "exposed_comm_us", "idle_us",
             "memcpy_us", "memcpy_bytes", "peak_memory_bytes"}  # fmt: skip
COLLECTIVE_KEYS = {"name", "group", "members", "desc", "seq", "step", "start_us", "end_us", "bytes", "peer", "peer_index", "lane"}


# ---------------------------------------------------------------- hand-made summaries


def summary(rank, collectives, *, steps=None, world_size=None, host=None, cycle=9):
    """A rank summary with chosen numbers: collectives as (step, start, end[, name, seq])."""
    steps = steps or sorted({c[0] for c in collectives})
    return {"format": FORMAT, "version": VERSION, "rank": rank, "world_size": world_size, "host": host or f"h{rank}",
            "cycle_step": cycle, "device": None,
            "steps": [{"step": s, "start_us": 1000.0 * s, "end_us": 1000.0 * s + 1000.0, "step_us": 1000.0,
                       "window_us": 1000.0, "compute_us": 400.0, "collective_us": 300.0, "exposed_comm_us": 300.0,
                       "idle_us": 300.0, "memcpy_us": None, "memcpy_bytes": None, "peak_memory_bytes": None}
                      for s in steps],
            "collectives": [{"name": c[3] if len(c) > 3 else "all_reduce", "group": "0",
                             "seq": c[4] if len(c) > 4 else None, "step": c[0], "start_us": float(c[1]),
                             "end_us": float(c[2]), "bytes": 4096} for c in collectives]}  # fmt: skip


def straggling(late_rank=2, n=4, steps=range(1, 9), late_by=300.0, shift=None):
    """n ranks, one all_reduce a step that ends at once on every rank; `late_rank` arrives
    `late_by` µs after rank 0, the others 5 µs apart after rank 0; the transfer takes 20 µs."""
    shift = shift or {}
    out = []
    for r in range(n):
        calls = []
        for s in steps:
            end = 1000.0 * s + 90
            start = end - 20 - (0 if r == late_rank else late_by + 5 * r)
            calls.append((s, start + shift.get(r, 0.0), end + shift.get(r, 0.0)))
        out.append(summary(r, calls, world_size=n))
    return out


def test_a_ranks_wait_is_its_time_in_the_collective_beyond_the_shortest_which_is_tracelens_wait_on_one_clock():
    report = analyze(straggling())
    waits = report.instances.groupby("rank")["wait_us"].first().to_dict()
    starts = report.instances.groupby("rank")["start_us"].first().to_dict()
    latest = max(starts.values())
    assert waits == pytest.approx({r: latest - starts[r] for r in starts})  # TraceLens: latest start - own start
    assert waits[2] == 0.0 and waits[0] == pytest.approx(300.0) and waits[3] == pytest.approx(315.0)


def test_the_straggler_is_named_with_the_others_wait_and_the_sentence_says_it():
    report = analyze(straggling())
    assert report.straggler["rank"] == 2 and report.straggler["host"] == "h2"
    assert report.straggler["arrived_last_pct"] == 100.0
    assert report.straggler["others_wait_us"] == pytest.approx(305.0)  # ranks 0, 1, 3 waited 300, 305, 315
    assert report.straggler["late_steps"] == report.straggler["steps"] == 8
    assert report.sentence.startswith("rank 2 (h2) arrived last at 100% of the all_reduces that kept others waiting, "
                                      "later than the others in 8 of 8 steps")  # fmt: skip
    assert report.sentence.endswith("the other 3 ranks waited 305 µs a step (30% of it), 305 µs longer than it did")
    doc = report.to_json()
    assert doc["straggler"]["rank"] == 2 and doc["world_size"] == 4
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert set(doc["ranks"][0]) >= {"rank", "host", "step_time_us", "collective_us", "wait_us", "exposed_comm_pct", "idle_pct"}
    assert set(doc["ranks"][0]["step_time_us"]) == {"median", "low", "high"}
    json.dumps(doc, allow_nan=False)


def test_one_ranks_clock_off_by_50_ms_changes_nothing():
    plain = analyze(straggling()).to_json()
    shifted = analyze(straggling(shift={1: 50_000.0, 3: -50_000.0})).to_json()
    # the clocks are aligned from the collectives' ends, and the report says by how much
    assert shifted.pop("notes") == ["clock: clocks aligned from 8 synchronizing collectives (largest correction "
                                    "50 ms, ends agree within 0 µs, median)"] and plain.pop("notes") == []  # fmt: skip
    assert shifted == plain and plain["clock"] == "aligned"


def test_no_rank_is_named_when_ranks_take_turns_or_nobody_waits_measurably():
    turns = []  # each rank is late in two of the eight steps
    for r in range(4):
        calls = [(s, 1000.0 * s + (0 if (s - 1) // 2 == r else -300), 1000.0 * s + 20) for s in range(1, 9)]
        turns.append(summary(r, calls))
    report = analyze(turns)
    assert report.straggler is None and report.sentence.startswith("no rank stands out across 4 ranks")
    # rank 2 arrives last every time, 3 to 18 µs after the others: nobody waited measurably
    report = analyze(straggling(late_by=3.0))
    assert report.straggler is None and "no rank stands out" in report.sentence


def test_a_step_is_the_unit_one_late_arrival_a_step_among_quick_collectives_names_the_rank():
    """Each step: rank 1 arrives 3 ms late at the first all_reduce; at the three quick collectives
    after it, rank 0 is last by 200 µs (the transfer is 20 µs). By instances rank 0 is last at 3 of 4;
    by steps, rank 1 held every step."""
    a, b = [], []
    for s in range(1, 7):
        t = 10_000.0 * s
        a.append((s, t, t + 3020))  # rank 0 waits 3 ms for rank 1
        b.append((s, t + 3000, t + 3020))
        for k in range(3):
            u = t + 4000 + 1000 * k
            a.append((s, u + 200, u + 220, "broadcast"))
            b.append((s, u, u + 220, "broadcast"))  # rank 1 waits 200 µs for rank 0
    report = analyze([summary(0, a), summary(1, b)])
    assert report.table.set_index("rank").loc[0, "arrived_last_pct"] == 75.0
    assert report.straggler["rank"] == 1 and report.straggler["late_steps"] == 6


def test_a_rank_late_in_five_of_six_steps_or_in_three_of_three_is_not_named_by_chance():
    """With no slow rank a rank is late in about half the steps: 5 of 6 happens 11% of the time,
    3 of 3 12.5%; named only at 2% or less (6 of 6, 16 of 20)."""
    five_of_six = straggling(steps=range(1, 7))
    for s in five_of_six:  # in step 3 rank 0 is the late one, by as much
        for c in s["collectives"]:
            if c["step"] == 3:
                c["start_us"] = c["end_us"] - 20 - (0 if s["rank"] == 0 else 300.0)
    report = analyze(five_of_six)
    assert report.straggler is None and "only in 5 of 6 steps: not consistently" in report.sentence
    assert analyze(straggling(steps=range(1, 4))).straggler is None
    assert analyze(straggling(steps=range(1, 7))).straggler["rank"] == 2


def test_the_rules_constants_can_be_changed_for_calibration(monkeypatch):
    assert analyze(straggling(late_by=300.0)).straggler["rank"] == 2
    monkeypatch.setattr(ranks, "STRAGGLER_MIN_WAIT_US", 1000.0)
    assert analyze(straggling(late_by=300.0)).straggler is None


def test_instances_match_by_sequence_number_where_the_trace_has_one():
    # rank 1 ran its two collectives of the step in the other order (two process groups' worth): seq says which is which
    a = summary(0, [(1, 100, 200, "all_reduce", 7), (1, 300, 330, "all_gather", 8)])
    b = summary(1, [(1, 90, 130, "all_gather", 8), (1, 150, 200, "all_reduce", 7)])
    report = analyze([a, b])
    assert report.matched == 2 and report.unmatched == []
    spent = report.instances.set_index(["name", "rank"])["spent_us"]
    assert spent[("all_reduce", 0)] == 100 and spent[("all_reduce", 1)] == 50


def test_different_numbers_of_collectives_are_matched_as_far_as_they_agree_and_the_rest_named():
    sums = straggling(n=3, steps=range(1, 7))
    sums[1]["collectives"].append({"name": "all_reduce", "group": "0", "seq": None, "step": 6, "start_us": 6095.0,
                                   "end_us": 6099.0, "bytes": None})  # fmt: skip
    report = analyze(sums)
    assert report.matched == 6
    assert report.unmatched == [{"rank": 1, "name": "all_reduce", "group": "0", "step": 6, "seq": None,
                                 "on_ranks": [1], "why": "not on every rank"}]  # fmt: skip
    assert report.straggler["rank"] == 2


def test_a_rank_without_a_summary_is_named_missing_and_no_false_straggler_is_named():
    sums = straggling()
    report = analyze([s for s in sums if s["rank"] != 2])  # the slow rank died
    assert report.missing == [2] and report.world_size == 4
    assert "rank 2 sent no summary" in report.sentence
    assert report.straggler is None or report.straggler["rank"] != 2
    report = analyze(sums[:2], expected_world_size=8)
    assert report.missing == [2, 3, 4, 5, 6, 7] and "ranks 2-7 sent no summary" in report.sentence


def test_the_devices_collective_time_from_explorer_is_shown_where_a_rank_has_it():
    sums = straggling(n=2, late_rank=1)
    sums[0]["device"] = {"cc_op_time": 0.25, "cc_op_active_time": 0.2, "cc_op_count": 40}
    table = analyze(sums).table.set_index("rank")
    assert table.loc[0, "device_cc_op_time"] == 0.25 and pd.isna(table.loc[1, "device_cc_op_time"])
    assert [r["device_cc_op_time"] for r in analyze(sums).to_json()["ranks"]] == [0.25, None]


def test_a_single_process_says_it_has_one_rank():
    alone = summary(None, [], steps=[1, 2, 3])
    report = analyze([alone])
    assert report.sentence == "one rank (rank 0): nothing to compare across ranks"
    assert report.straggler is None and len(report.table) == 1 and report.table["steps"].iloc[0] == 3
    assert report.table["wait_us"].iloc[0] is None


def test_bad_input_is_left_out_and_said_never_raised():
    good = straggling(late_rank=1, n=2)
    broken = copy.deepcopy(good[1])
    broken["collectives"] += [None, {"name": "all_reduce"}, {"name": "x", "start_us": 5.0, "end_us": 1.0},
                              {"start_us": 1.0, "end_us": 2.0}, {"name": "y", "start_us": float("nan"), "end_us": 2.0}]
    broken["steps"] += ["garbage", {"step": 99, "step_us": float("nan")}]
    report = analyze([good[0], broken, "not a summary", {"format": "other"}, {"format": FORMAT}])
    assert report.straggler is not None and report.matched == 8
    assert len(report.notes) == 3
    assert analyze([]).sentence == "no rank summary to read"
    json.dumps(analyze([]).to_json(), allow_nan=False)


def test_explain_change_says_where_the_wait_grew_and_who_the_straggler_is_in_each():
    even = analyze(straggling(late_by=3.0))
    slow = analyze(straggling(late_by=3000.0))
    assert explain_change(even, slow) == ("the wait in all_reduce grew from 8 µs to 3.0 ms a step on ranks 0, 1 and 3; "
                                          "rank 2 is the straggler in B, none in A")  # fmt: skip
    assert explain_change(even, even) is None
    heavier = straggling(late_by=3.0)
    for summary_ in heavier:
        for step in summary_["steps"]:
            step["compute_us"] += 250.0
    assert explain_change(even, analyze(heavier)) == ("compute grew from 400 µs to 650 µs a step (the ranks' median); "
                                                      "the wait did not change")  # fmt: skip
    assert explain_change(analyze(straggling(n=1)), slow) is None


# ---------------------------------------------------------------- one rank's trace


def trace(events, **meta):
    return {"traceEvents": events, **meta}


def x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_cpu_rank_step_is_split_into_compute_collective_exposed_and_idle():
    events = [
        x("ProfilerStep#4", 0, 100, cat="user_annotation"),
        x("aten::mm", 0, 30), x("aten::add", 10, 5),  # nested: compute 0-30
        x("c10d::allreduce_", 30, 2),  # only queues the work: neither compute nor collective
        x("gloo:all_reduce", 35, 40, cat="user_annotation", tid=2, **{"Input Dims": [[1024]], "Input type": ["float"]}),
        x("aten::relu", 60, 20),  # overlaps the collective from 60 to 75
        {"ph": "i", "name": "[memory]", "ts": 50, "args": {"Total Allocated": 4096, "Device Type": 0}},
        {"ph": "i", "name": "[memory]", "ts": 70, "args": {"Total Allocated": 1024, "Device Type": 0}},
    ]  # fmt: skip
    s = rank_summary_from_chrome(trace(events, distributedInfo={"rank": 3, "world_size": 8}, host_name="node-7"))
    assert (s["rank"], s["world_size"], s["host"], s["timeline"], s["collective_source"]) == (3, 8, "node-7", "cpu", "backend_spans")
    assert s["collectives"] == [{"name": "all_reduce", "group": None, "members": None, "desc": None, "seq": None,
                                 "step": 4, "start_us": 35.0, "end_us": 75.0, "bytes": 4096, "peer": None,
                                 "peer_index": None, "lane": 2}]  # fmt: skip
    (step,) = s["steps"]
    assert step["step"] == 4 and step["step_us"] == 100 and step["window_us"] == 100
    assert step["compute_us"] == 50 and step["collective_us"] == 40 and step["exposed_comm_us"] == 25
    assert step["idle_us"] == 100 - 30 - 45 and step["peak_memory_bytes"] == 4096
    assert step["memcpy_us"] is None and step["memcpy_bytes"] is None  # no device events: unknown, not 0


def test_device_kernels_are_split_as_hta_splits_them_and_belong_to_the_step_that_launched_them():
    launch = lambda ts, corr: x("cudaLaunchKernel", ts, 1, cat="cuda_runtime", correlation=corr)  # noqa: E731
    kernel = lambda name, ts, dur, corr, **a: x(name, ts, dur, cat="kernel", tid=7, stream=7, correlation=corr, **a)  # noqa: E731
    events = [
        x("ProfilerStep#1", 0, 50, cat="user_annotation"), x("ProfilerStep#2", 50, 50, cat="user_annotation"),
        launch(1, 1), launch(2, 2), launch(3, 3), launch(55, 4),
        kernel("gemm", 10, 20, 1),  # step 1 (launched at 1)
        kernel("ncclDevKernel_AllReduce_Sum_f32", 20, 30, 2, **{"Collective name": "allreduce",
               "Process Group Name": "3", "Seq": 12, "In msg nelems": 256, "dtype": "Float"}),
        x("Memcpy HtoD (Pageable -> Device)", 52, 4, cat="gpu_memcpy", stream=7, correlation=3, bytes=1 << 20),
        kernel("gemm", 60, 10, 4),  # step 2, launched at 55
    ]  # fmt: skip
    s = rank_summary_from_chrome(trace(events), rank=0)
    assert s["timeline"] == "device" and s["collective_source"] == "device_kernels"
    assert s["collectives"] == [{"name": "allreduce", "group": "3", "members": None, "desc": None, "seq": 12, "step": 1,
                                 "start_us": 20.0, "end_us": 50.0, "bytes": 1024, "peer": None, "peer_index": None, "lane": None}]  # fmt: skip
    one, two = s["steps"]
    # step 1's device window: its first event (10) to step 2's first device event... the memcpy at 52
    # was launched in step 1, so step 2's first is the gemm at 60
    assert one["window_us"] == 50 and one["compute_us"] == 20 and one["collective_us"] == 30
    assert one["exposed_comm_us"] == 20 and one["idle_us"] == 50 - 40 - 4
    assert one["memcpy_us"] == 4 and one["memcpy_bytes"] == 1 << 20
    assert two["window_us"] == 10 and two["compute_us"] == 10 and two["idle_us"] == 0 and two["memcpy_bytes"] == 0


def test_collectives_come_from_record_param_comms_where_nothing_better_is_there():
    events = [x("ProfilerStep#1", 0, 100, cat="user_annotation"),
              x("record_param_comms", 10, 30, **{"Collective name": "broadcast", "Process Group Name": "1", "Seq": 3}),
              x("record_param_comms", 50, 1)]  # fmt: skip  (no Collective name: not a collective we can name)
    s = rank_summary_from_chrome(trace(events))
    assert s["collective_source"] == "record_param_comms"
    assert [(c["name"], c["group"], c["seq"]) for c in s["collectives"]] == [("broadcast", "1", 3)]
    assert rank_summary_from_chrome(trace([x("aten::mm", 0, 5)]))["collectives"] == []


def test_a_rank_summary_has_the_contracts_fields_and_is_plain_json():
    s = rank_summary_from_chrome(MULTI / "gloo_4rank_slow2" / "rank2.json.gz", cycle_step=7)
    assert CONTRACT_KEYS <= set(s) and (s["format"], s["version"], s["rank"], s["world_size"]) == (FORMAT, VERSION, 2, 4)
    assert all(STEP_KEYS <= set(step) for step in s["steps"]) and len(s["steps"]) == 6
    assert all(set(c) == COLLECTIVE_KEYS for c in s["collectives"])
    assert {c["name"] for c in s["collectives"]} == {"all_reduce", "barrier"}
    assert all(c["step"] in {st["step"] for st in s["steps"]} for c in s["collectives"])
    json.dumps(s, allow_nan=False)


def test_what_is_not_a_trace_is_refused_with_a_reason(tmp_path):
    with pytest.raises(ValueError, match="not a chrome trace"):
        rank_summary_from_chrome({"events": []})
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable chrome trace"):
        rank_summary_from_chrome(bad)
    assert rank_summary_from_chrome(trace([]))["steps"] == []
    odd = [x("ProfilerStep#1", 0, 100, cat="user_annotation"), x("aten::mm", 10, 20),
           {"ph": "X", "cat": "cpu_op", "name": "aten::add"}, x("aten::mul", "soon", 5), x("aten::div", 5, float("nan")),
           x("aten::sub", 50, -3), "not an event", {"ph": "i", "name": "[memory]", "args": {"Total Allocated": 9}}]  # fmt: skip
    s = rank_summary_from_chrome(trace(odd))
    assert s["skipped_events"] == 4 and s["steps"][0]["compute_us"] == 20 and s["steps"][0]["peak_memory_bytes"] is None


# ---------------------------------------------------------------- real traces


def gloo_set(name: str, shift: dict[int, float] | None = None) -> list[dict]:
    out = []
    for r in range(4):
        with gzip.open(MULTI / name / f"rank{r}.json.gz", "rt") as handle:
            data = json.load(handle)
        for event in data["traceEvents"]:
            if "ts" in event and shift and r in shift:
                event["ts"] = float(event["ts"]) + shift[r]
        out.append(rank_summary_from_chrome(data, cycle_step=7))
    return out


def test_a_real_gloo_job_with_a_30_ms_sleep_on_rank_2_names_rank_2_and_the_wait():
    report = analyze(gloo_set("gloo_4rank_slow2"))
    assert report.straggler["rank"] == 2 and report.missing == [] and report.unmatched == []
    table = report.table.set_index("rank")
    for r in (0, 1, 3):
        assert table.loc[r, "wait_us"] == pytest.approx(30_000, rel=0.2)
    assert table.loc[2, "wait_us"] < 5_000
    assert table.loc[2, "idle_pct"] > 50  # the sleep is idle time on rank 2


def test_the_same_job_without_the_sleep_names_no_straggler():
    report = analyze(gloo_set("gloo_4rank_even"))
    (n,) = set(report.table["steps"])
    assert n == 24 and report.matched == 36  # 24 all_reduces and 12 barriers on every rank
    # enough steps that the rule could name a rank: one late in 3 of 4 steps would be (at 6 steps, 5 of 6 is p = 0.109)
    assert binom.sf(math.ceil(0.75 * n) - 1, n, 0.5) <= ranks.STRAGGLER_P_VALUE
    assert report.straggler is None, report.sentence
    assert report.sentence.startswith("no rank stands out across 4 ranks"), report.sentence


def test_the_real_traces_with_one_ranks_clock_off_by_50_ms_give_the_same_straggler_and_waits():
    plain = analyze(gloo_set("gloo_4rank_slow2"))
    shifted = analyze(gloo_set("gloo_4rank_slow2", shift={1: 50_000.0}))
    # on one host no clock needed aligning; with rank 1's 50 ms off, the ends align it again, to within their spread
    assert plain.clock == "one clock" and shifted.clock == "aligned"
    assert (shifted.straggler["rank"], shifted.straggler["late_steps"]) == (plain.straggler["rank"], plain.straggler["late_steps"])
    largest = plain.table["wait_us"].max()
    assert shifted.table["wait_us"].tolist() == pytest.approx(plain.table["wait_us"].tolist(), abs=0.02 * largest)


def test_the_wait_and_the_straggler_agree_with_tracelens():
    """TraceLens's NcclAnalyser on the same files: its straggler (lowest total wait) is ours, and
    each rank's total wait in all_reduce is within 10% (of the largest rank's)."""
    theirs = REFERENCE["tracelens"]["gloo_4rank_slow2"]
    report = analyze(gloo_set("gloo_4rank_slow2"))
    assert report.straggler["rank"] == int(min(theirs, key=lambda r: theirs[r]["total_wait_us"]))
    ours = report.instances[report.instances["name"] == "all_reduce"].groupby("rank")["wait_us"].sum()
    largest = max(t["total_wait_us"] for t in theirs.values())
    for rank, figures in theirs.items():
        assert abs(ours[int(rank)] - figures["total_wait_us"]) <= 0.1 * largest


@pytest.mark.parametrize("name", sorted(HTA_SETS))
@pytest.mark.parametrize("all_steps", [True, False], ids=["all-steps", "hta-default-filter"])
def test_the_temporal_breakdown_and_overlap_agree_with_hta_within_2_points(name, all_steps):
    """HTA's default drops the last ProfilerStep; a rank summary keeps every step of a cycle. Both
    are checked: all steps against HTA with include_last_profiler_step=True, and ours without the
    last step against HTA's default."""
    reference = REFERENCE["hta"][name]["include_last_step" if all_steps else "default"]
    for rank, path in enumerate(HTA_SETS[name]):
        steps = [s for s in rank_summary_from_chrome(FIXTURES / path)["steps"] if s["window_us"]]
        if not all_steps and len(steps) >= 2:
            steps = steps[:-1]
        total = {k: sum(s[k] for s in steps) for k in ("window_us", "idle_us", "compute_us", "collective_us", "exposed_comm_us")}
        ours = {"idle_pct": 100 * total["idle_us"] / total["window_us"],
                "compute_pct": 100 * total["compute_us"] / total["window_us"],
                "non_compute_pct": 100 * (total["window_us"] - total["idle_us"] - total["compute_us"]) / total["window_us"]}  # fmt: skip
        if total["collective_us"]:
            ours["overlap_pct"] = 100 * (total["collective_us"] - total["exposed_comm_us"]) / total["collective_us"]
        theirs = reference[str(rank)]
        for key, value in ours.items():
            assert value == pytest.approx(theirs[key], abs=2.0), key
    if all_steps:  # what `ranks --format json` prints per rank is the same figure
        report = analyze([rank_summary_from_chrome(FIXTURES / path, rank=r) for r, path in enumerate(HTA_SETS[name])])
        for row in report.to_json()["ranks"]:
            for key in ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct"):
                if reference[str(row["rank"])][key] is not None:
                    assert row[key] == pytest.approx(reference[str(row["rank"])][key], abs=2.0), key


def test_a_public_nccl_pair_with_one_ranks_clock_off_by_50_ms_reads_the_same():
    def summaries(shift):
        out = []
        for rank, path in enumerate(HTA_SETS["hta_sampled_2rank"]):
            with gzip.open(FIXTURES / path, "rt") as handle:
                data = json.load(handle)
            for event in data["traceEvents"]:
                if "ts" in event and rank == 1:
                    event["ts"] = float(event["ts"]) + shift
            out.append(rank_summary_from_chrome(data))
        return out

    plain, shifted = analyze(summaries(0.0)), analyze(summaries(50_000.0))
    a, b = plain.to_json(), shifted.to_json()
    # its two sampled ranks' few collectives cannot set a clock: the wait is taken without one, in both
    assert a["clock"] == b["clock"] == "clock-free"
    assert [n for n in a.pop("notes") if not n.startswith("clock:")] == [n for n in b.pop("notes") if not n.startswith("clock:")]
    assert a == b
    # its SendRecv kernels are named by the ops that launched them: collectives, not point-to-point
    assert sorted(set(plain.instances["name"])) == ["_all_gather_base", "all_reduce", "all_to_all"] and plain.matched == 8
    assert plain.missing == list(range(2, 128)) and "ranks 2-127 sent no summary" in plain.sentence


def test_torch_writes_what_the_summary_reads_a_real_profiler_and_a_gloo_process_group(tmp_path):
    """torch 2.13 under torch.profiler: a gloo all_reduce is a `gloo:all_reduce` span with its
    input's shape (with record_shapes; without, its bytes are null); `c10d::allreduce_` only
    queues it. One process, a process group of one."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        tensor = torch.ones(1000)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3), record_shapes=True,
                     on_trace_ready=lambda p: p.export_chrome_trace(str(tmp_path / "trace.json"))) as prof:  # fmt: skip
            for _ in range(4):
                torch.tanh(torch.randn(64, 64) @ torch.randn(64, 64))
                dist.all_reduce(tensor)
                prof.step()
    finally:
        dist.destroy_process_group()
    s = rank_summary_from_chrome(tmp_path / "trace.json", cycle_step=4)
    assert (s["rank"], s["world_size"], s["timeline"], s["collective_source"]) == (0, 1, "cpu", "backend_spans")
    assert [(c["name"], c["bytes"]) for c in s["collectives"]] == [("all_reduce", 4000)] * 3
    assert [c["step"] for c in s["collectives"]] == [st["step"] for st in s["steps"]] == [1, 2, 3]
    assert all(st["compute_us"] > 0 and st["collective_us"] > 0 for st in s["steps"])
    assert analyze([s]).sentence == "one rank (rank 0): nothing to compare across ranks"


def param_set(shift: dict[int, float] | None = None) -> list[dict]:
    """facebookresearch/param's 8-rank NCCL DLRM job (one host, one ProfilerStep; tests/fixtures/README.md)."""
    out = []
    for rank, path in enumerate(sorted((MULTI / "param_dlrm_8rank").glob("*.json.gz"))):
        data = json.loads(gzip.decompress(path.read_bytes()))
        for event in data["traceEvents"]:
            if "ts" in event and shift and rank in shift:
                event["ts"] = float(event["ts"]) + shift[rank]
        out.append(rank_summary_from_chrome(data))
    return out


@pytest.mark.parametrize("shifted", [False, True], ids=["as-recorded", "rank-1-clock-50-ms-off"])
def test_a_public_8_rank_nccl_job_gives_tracelens_waits_and_the_straggler_tracelens_and_hta_name(shifted):
    """Its all_to_alls run as SendRecv kernels (older NCCL): named by the op that launched them, they
    are collectives, matched as TraceLens matches them. Each rank's total wait is within 10% (of the
    largest) of TraceLens's `NcclAnalyser`; the straggler is the one TraceLens (fewest wait, last at
    5 of 8) and HTA (one candidate) name. With rank 1's clock 50 ms off, both tools name rank 1 (one
    clock across files); here the clocks are aligned from the all_reduces' ends and nothing changes."""
    reference = REFERENCE["nccl_sets"]["param_dlrm_8rank"]
    theirs = reference["as_recorded"]["tracelens"]
    assert theirs["straggler"] == reference["as_recorded"]["hta"]["candidates_1"][0] == 7
    shift = {reference["shift"]["rank"]: reference["shift"]["us"]} if shifted else None
    report = analyze(param_set(shift))
    assert report.clock == ("aligned" if shifted else "one clock")
    assert report.matched == 8 and report.unmatched == [] and report.missing == []
    assert {c for c in report.instances["name"]} == {"all_to_all", "all_reduce"}
    ours = report.instances.groupby("rank")["wait_us"].sum()
    largest = max(t["total_wait_us"] for t in theirs["ranks"].values())
    for rank, figures in theirs["ranks"].items():
        assert abs(ours[int(rank)] - figures["total_wait_us"]) <= 0.1 * largest, (rank, ours.to_dict())
    assert report.straggler is not None and report.straggler["rank"] == 7, report.sentence
    assert report.straggler["evidence"] == "instances" and report.straggler["last_instances"] == 5
    assert "rank 7 arrived last later than the others at 5 of the 8 collectives" in report.sentence
    if shifted:  # what a one-clock tool makes of it
        assert reference["rank1_plus_50ms"]["tracelens"]["straggler"] == 1


def test_the_rules_binomial_tail_and_median_of_the_others_are_scipys_and_numpys():
    for n in (1, 6, 8, 24, 300):
        for k in range(-1, n + 1):
            for p in (0.5, 0.125, 1 / 3):
                assert ranks.binomial_sf(k, n, p) == pytest.approx(binom.sf(k, n, p), rel=1e-9, abs=1e-15)
    rng = np.random.default_rng(0)
    for n in (2, 3, 7, 8):
        values = rng.random((5, n))
        expected = [[np.median(np.delete(row, i)) for i in range(n)] for row in values]
        assert ranks.median_of_others(values) == pytest.approx(np.array(expected))
