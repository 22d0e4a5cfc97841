"""The gloo group placement prototype (tests/gloo_lanes.py) on the recorded 3-D job (TP x DP x PP,
tests/rank3d_worker.py): it places spans only where the trace leaves one group possible, and it is
checked against the collectives each rank issued (truth_rank<r>.json)."""

import copy
import gzip
import json
from pathlib import Path

import pytest
from gloo_lanes import place_job, place_rank, score

MULTI = Path(__file__).parent / "fixtures" / "multi_rank"
SETS = ("gloo_3d_slow", "gloo_3d_even")


def load(name: str):
    traces = {r: json.loads(gzip.decompress((MULTI / name / f"rank{r}.json.gz").read_bytes())) for r in range(4)}
    issued = {r: json.loads((MULTI / name / f"truth_rank{r}.json").read_text())["issued"] for r in range(4)}
    return traces, issued


def totals(placed: dict, traces: dict, issued: dict) -> dict:
    out = {"right": 0, "wrong": 0, "cannot": 0}
    for r, spans in placed.items():
        s = score(spans, traces[r], issued[r])
        for key in out:
            out[key] += s[key]
    return out


@pytest.mark.parametrize("name", SETS)
def test_the_job_rule_places_every_span_of_the_recorded_job(name):
    traces, issued = load(name)
    assert totals(place_job(traces), traces, issued) == {"right": 84, "wrong": 0, "cannot": 0}


@pytest.mark.parametrize("name", SETS)
def test_one_rank_alone_places_only_the_send_and_recv_whose_peer_index_fits_one_group(name):
    """The default group's threads ran nothing: 4 worker threads for 3 groups leave each thread two
    or three possible groups. Rank 0 sends to index 2 (only the default group has 4 members); rank 2
    receives from index 0 (the default group or dp {0,2}); rank 3 from index 1 (index 1 of its tp and
    dp groups is itself)."""
    traces, issued = load(name)
    placed = {r: place_rank(t) for r, t in traces.items()}
    by_rank = {r: score(placed[r], traces[r], issued[r]) for r in placed}
    assert [(s["right"], s["wrong"], s["cannot"]) for s in by_rank.values()] == [
        (6, 0, 18), (6, 0, 18), (0, 0, 18), (6, 0, 12)]  # fmt: skip


def test_without_the_peer_trace_the_recv_stays_unplaced(name=SETS[0]):
    traces, issued = load(name)
    placed = place_job({r: t for r, t in traces.items() if r != 0})
    recvs = [(g, why) for span, g, why in placed[2] if span["name"] == "gloo:recv"]
    assert recvs and all(g is None and "fits group 0 (default_pg) or 2 (dp)" in why for g, why in recvs), recvs[0]
    assert totals(placed, traces, issued) == {"right": 54, "wrong": 0, "cannot": 6}


def test_a_thread_it_cannot_order_is_not_placed(name=SETS[1]):
    traces, issued = load(name)
    bent = copy.deepcopy(traces[1])
    worker = max(e["tid"] for e in bent["traceEvents"] if str(e.get("name")).startswith("gloo:all"))
    for e in bent["traceEvents"]:
        if e.get("tid") == worker:
            e["tid"] = 5  # an id below the process id: ids wrapped, creation order unknown
    alone = place_rank(bent)
    assert all(g is None for span, g, _ in alone if span["name"] == "gloo:all_reduce")
    placed = place_job({**traces, 1: bent})
    assert totals(placed, {**traces, 1: bent}, issued)["wrong"] == 0


def test_more_worker_threads_than_groups_can_hold_places_none(name=SETS[1]):
    """(A group destroyed before the export leaves pg_config but its threads' spans stay; when the
    count still fits, the rule cannot see it: docs/notes_gloo_groups.md, limits.)"""
    traces, _ = load(name)
    trace = copy.deepcopy(traces[0])
    trace["distributedInfo"]["pg_config"] = trace["distributedInfo"]["pg_config"][:1]  # tp and dp gone from the list
    reasons = {why for span, g, why in place_rank(trace) if span["name"] == "gloo:all_reduce"}
    assert reasons == {"cannot place: 4 worker threads, more than the 1 gloo group(s) in pg_config can hold (a group gone from pg_config?)"}
