"""A collective's group from a `replica_group` argument, and a gloo send/recv's peer index.

`replica_group` is how Neuron Explorer's `CcOp` table names a collective's groups (FACTS.md 6);
that a framework trace carries it is not verified, so it is read only where it is there, without
torch's process-group arguments, and only where its ids can be global ranks. What does not fit
gives no group and says why, in the summary and in the report across ranks.
"""

from __future__ import annotations

import random

import pytest

from mlflow_neuron._analysis.ranks.analysis import analyze
from mlflow_neuron._trace.collective_records import peers_in_groups
from mlflow_neuron._trace.collectives import rank_summary_from_chrome

TP = "[[0,1,2,3],[4,5,6,7]]"  # text, as a Parquet cell holds it
DP = [[0, 4], [1, 5], [2, 6], [3, 7]]  # a nested list, as JSON args hold it


def x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def replica_trace(rank: int, groups: list, *, world_size: int | None = 8, steps=(1, 2)) -> dict:
    """One step a `ProfilerStep`, each with one all_reduce a replica group, on `record_param_comms`."""
    events = []
    for step in steps:
        t0 = 1000.0 * step
        events.append(x(f"ProfilerStep#{step}", t0, 1000.0, cat="user_annotation"))
        for i, group in enumerate(groups):
            events.append(x("record_param_comms", t0 + 100.0 * (i + 1), 50.0 + rank,
                            **{"Collective name": "all_reduce", "replica_group": group}))  # fmt: skip
    info = {"rank": rank} if world_size is None else {"rank": rank, "world_size": world_size}
    return {"traceEvents": events, "distributedInfo": info}


def members_of(summary: dict) -> list:
    sets = summary["member_sets"]
    return [None if c["members"] is None else sets[c["members"]] for c in summary["collectives"]]


def test_each_rank_s_collectives_are_in_the_sub_list_that_holds_it_and_match_across_the_world():
    summaries = [rank_summary_from_chrome(replica_trace(r, [TP, DP]), cycle_step=9) for r in range(8)]
    assert members_of(summaries[5]) == [[4, 5, 6, 7], [1, 5]] * 2
    assert members_of(summaries[2]) == [[0, 1, 2, 3], [2, 6]] * 2
    assert all("unplaced" not in c for s in summaries for c in s["collectives"])
    report = analyze(summaries)
    assert report.unmatched == [] and report.missing == []
    assert report.matched == 2 * (2 + 4)  # a step: 2 TP instances, 4 DP instances


def test_torch_s_own_group_arguments_win_over_a_replica_group():
    trace = replica_trace(5, [TP])
    for event in trace["traceEvents"]:
        event["args"].update({"Process Group Ranks": "[5, 7]", "Group size": 2} if event["args"] else {})
    s = rank_summary_from_chrome(trace)
    assert members_of(s) == [[5, 7], [5, 7]] and all("unplaced" not in c for c in s["collectives"])


def test_the_world_size_a_rank_summary_is_asked_for_is_the_one_replica_ids_are_checked_against():
    s = rank_summary_from_chrome(replica_trace(5, [TP], world_size=None), world_size=8)
    assert members_of(s) == [[4, 5, 6, 7]] * 2


@pytest.mark.parametrize("group, rank, world_size, why", [
    ("[[0,1,2,3],[4,5,6,", 5, 8, "is not a list of replica id lists"),
    ("[[0,1],[2,'x']]", 1, 4, "is not a list of replica id lists"),
    ([[0, 1.0], [2, 3]], 0, 4, "is not a list of replica id lists"),
    ([[0, 0, 1], [2, 3]], 0, 4, "is not a list of replica id lists"),
    ([], 0, 4, "is not a list of replica id lists"),
    ({"0": [0, 1]}, 0, 2, "is not a list of replica id lists"),
    ("[[0,1,2,3],[4,5,6,9]]", 5, 8, "replica id 9 in a world of 8: not global ranks"),
    ("[[0,1,2,3],[4,5,6,7]]", 5, 4, "replica id 7 in a world of 4: not global ranks"),
    ("[[0,1,2,3],[3,4,5,6,7]]", 3, 8, "2 sub-lists of its replica_group"),
    ("[[0,1],[2,3]]", 5, 8, "no sub-lists of its replica_group"),
    ("[[0,1],[2,3]]", 1, 8, "does not hold each of the 8 ranks once: not global ranks"),
    ("[[0,1,2,3],[3,4,5,6,7]]", 0, 8, "does not hold each of the 8 ranks once: not global ranks"),
    (TP, 5, None, "the trace's world size is unknown"),
])  # fmt: skip
def test_a_replica_group_that_does_not_fit_gives_no_group_and_says_why(group, rank, world_size, why):
    s = rank_summary_from_chrome(replica_trace(rank, [group], world_size=world_size))
    assert members_of(s) == [None, None]
    assert all(why in c["unplaced"] for c in s["collectives"]), s["collectives"][0]


def test_an_unplaced_collective_is_reported_with_its_reason_never_matched_by_name():
    """Ranks with no pg_config have one group or none: a collective without members would be
    matched by name there (the version 1 rule); one whose summary says why stays unmatched."""
    summaries = [rank_summary_from_chrome(replica_trace(r, ["[[0,1],[1,2]]"], world_size=3), cycle_step=9)
                 for r in range(3)]  # fmt: skip
    report = analyze(summaries)
    assert report.matched == 0 and len(report.unmatched) == 6
    assert {u["why"] for u in report.unmatched if u["rank"] == 1} == {
        "2 sub-lists of its replica_group [[0,1],[1,2]] hold rank 1"}
    assert all("its replica_group" in u["why"] and u["on_ranks"] == [u["rank"]] for u in report.unmatched)


def test_the_rank_of_a_trace_without_one_gives_no_group():
    trace = replica_trace(5, [TP])
    del trace["distributedInfo"]["rank"]
    s = rank_summary_from_chrome(trace)
    assert all(c["members"] is None and "the trace's rank is unknown" in c["unplaced"] for c in s["collectives"])


# ---------------------------------------------------------------- peers_in_groups


def quadratic_peers(p2p_calls: list):
    """The scan `peers_in_groups` replaced, kept as the reference."""
    calls = sorted(p2p_calls, key=lambda c: c[0])

    def peer(start: float, tid):
        found = [p for s, t, p in calls if t == tid and s <= start]
        return found[-1] if found else None

    return peer


def test_peers_in_groups_gives_what_the_quadratic_scan_gave():
    rng = random.Random(7)
    threads = [11, 12, 13, "main"]
    calls = [(float(rng.randrange(0, 5000)), rng.choice(threads), rng.choice([0, 1, 2, 3, None]))
             for _ in range(3000)]  # coarse times: many calls start together  # fmt: skip
    queries = [(float(rng.randrange(-10, 5010)) + rng.choice([0.0, 0.5]), rng.choice(threads + [99]))
               for _ in range(3000)]  # fmt: skip
    queries += [(s, t) for s, t, _ in calls[:500]]  # exactly at a call's start
    fast, slow = peers_in_groups(calls), quadratic_peers(calls)
    assert [fast(s, t) for s, t in queries] == [slow(s, t) for s, t in queries]
    assert peers_in_groups([])(1.0, 11) is None
