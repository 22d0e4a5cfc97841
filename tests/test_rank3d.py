"""The 3D-parallel trace generator (`tests/rank3d.py`) checked against its own truth, at TP2 x PP2 x DP2.

What a consumer will rely on: every group's collectives come in the same number on each member; a
collective never ends before its last member arrived, and ends at one time on all of them; send and
recv pair up by their Src/Dst ranks; group names differ across members when asked; the waits in
truth.json are what the traces show once each host's clock offset is taken off; and the files are
what our readers take (the rank summary, ingest's folder layout).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import pytest

from rank3d import Job3D, generate, ranks_text

from mlflow_neuron._capture.ingest import find_cycles
from mlflow_neuron._capture.ingest_ranks import split_by_rank, trace_rank
from mlflow_neuron._trace.collectives import rank_summary_from_chrome

JOB = dict(tp=2, pp=2, dp=2, ranks_per_node=4, slow_rank=3, slow_ms=15.0, clock_skew_ms=8.0, host_offsets_ms={1: -20.0})


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rank3d")
    job = Job3D(**JOB)
    return job, generate(job, out), out


def load(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def nccl_kernels(trace: dict) -> list[dict]:
    return sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
                  key=lambda e: e["ts"])  # fmt: skip


def members(args: dict) -> tuple[int, ...]:
    return tuple(args["Global rank start"] + i * args["Global rank stride"] for i in range(args["Group size"]))


@pytest.fixture(scope="module")
def traces(job_dir):
    """{rank: (trace, its NCCL kernels, its host's clock offset in us)}."""
    job, truth, _ = job_dir
    out = {}
    for rank, path in truth["files"].items():
        trace = load(path)
        out[rank] = (trace, nccl_kernels(trace), truth["host_offsets_us"][job.host(rank)])
    return out


def instances(traces) -> dict:
    """{(group members, name or pair): {rank: [(true start, true end, args), ...]}} in each rank's order."""
    found: dict = defaultdict(lambda: defaultdict(list))
    for rank, (_, kernels, offset) in traces.items():
        for k in kernels:
            a = k["args"]
            if a["Collective name"] in ("send", "recv"):
                pair = (rank, a["Dst Rank"]) if a["Collective name"] == "send" else (a["Src Rank"], rank)
                key = (members(a), pair)
            else:
                key = (members(a), a["Collective name"])
            found[key][rank].append((k["ts"] - offset, k["ts"] + k["dur"] - offset, a))
    return found


def test_each_group_has_the_same_collectives_on_every_member(job_dir, traces):
    job, truth, _ = job_dir
    found = instances(traces)
    kinds = Counter()
    for (group, what), by_rank in found.items():
        expected = set(what) if isinstance(what, tuple) else set(group)
        assert set(by_rank) == expected, (group, what)
        assert len({len(v) for v in by_rank.values()}) == 1, (group, what, {r: len(v) for r, v in by_rank.items()})
        kinds[by_rank[min(by_rank)][0][2]["Process Group Description"]] += 1
    assert kinds == {"tp": 4, "pp": 8, "dp": 4, "default_pg": 1}  # pp: 4 stage pairs x 2 directions
    per_step = {p: Counter(c["group"] for c in cs) for p, cs in truth["collectives"].items()}
    for rank, (_, kernels, _) in traces.items():
        assert len(kernels) == sum(per_step[str(job.coords(rank)[1])].values()) * job.steps


def test_a_collective_ends_on_all_members_at_once_and_never_before_the_last_arrival(traces):
    checked = 0
    for (_, what), by_rank in instances(traces).items():
        for together in zip(*by_rank.values()):
            last_start = max(start for start, _, _ in together)
            ends = [end for _, end, _ in together]
            assert min(ends) >= last_start
            assert max(ends) - min(ends) < 0.01  # one end on every member, on true time (ns rounding)
            seqs = {a["Seq"] for _, _, a in together}
            if not isinstance(what, tuple):
                assert len(seqs) == 1  # a collective's Seq agrees across members; a send/recv pair's need not
            checked += 1
    assert checked > 100


def test_truth_waits_are_what_the_traces_show(job_dir, traces):
    """latest arrival - own arrival, from the traces with each host's offset taken off."""
    job, truth, _ = job_dir
    seen: dict[int, list[float]] = defaultdict(list)
    order: dict[int, list] = defaultdict(list)
    for (_, what), by_rank in instances(traces).items():
        for together in zip(*by_rank.values()):
            latest = max(start for start, _, _ in together)
            for rank, (start, _, _) in zip(by_rank, together):
                order[rank].append(start)
                seen[rank].append(latest - start)
    for rank in traces:
        by_start = [w for _, w in sorted(zip(order[rank], seen[rank]))]
        expected = [w for step in truth["wait_us"][str(rank)] for w in step]
        assert by_start == pytest.approx(expected, abs=0.01)


def test_the_slow_rank_makes_its_tp_peers_wait(job_dir):
    job, truth, _ = job_dir
    straggler = truth["straggler"]
    assert straggler["rank"] == 3 and straggler["tp_group"] == [2, 3] and straggler["pp_stage"] == 1
    tp = [i for i, c in enumerate(truth["collectives"]["1"]) if c["group"] == "tp"]
    for step in range(job.steps):
        peer = [truth["wait_us"]["2"][step][i] for i in tp]
        assert min(peer) > 15_000 - 200  # every TP all_reduce: the peer waits the 15 ms
        assert max(truth["wait_us"]["3"][step][i] for i in tp) == 0.0  # the slow rank arrives last
    totals = {r: sum(sum(s.values()) for s in steps) for r, steps in truth["wait_us_by_kind"].items()}
    assert min(totals, key=totals.get) == "3"


def test_slow_once_a_step(tmp_path):
    truth = generate(Job3D(**{**JOB, "slow_mode": "once"}), tmp_path)
    tp = [i for i, c in enumerate(truth["collectives"]["1"]) if c["group"] == "tp"]
    for step in truth["wait_us"]["2"]:
        waits = [step[i] for i in tp]
        assert waits[0] > 14_800 and max(waits[1:]) < 500


def test_send_and_recv_name_each_other(traces):
    sends, recvs = Counter(), Counter()
    for rank, (_, kernels, _) in traces.items():
        for k in kernels:
            a = k["args"]
            group = members(a)
            if a["Collective name"] == "send":
                assert "Src Rank" not in a and a["Dst Rank"] == group[a["Rank"]] and a["Dst Rank"] != rank
                sends[(rank, a["Dst Rank"])] += 1
            elif a["Collective name"] == "recv":
                assert "Dst Rank" not in a and a["Src Rank"] == group[a["Rank"]] and a["Src Rank"] != rank
                recvs[(a["Src Rank"], rank)] += 1
    assert sends == recvs and len(sends) == 8  # 4 stage pairs, each way


def test_group_names_differ_across_members_unless_global(job_dir, traces, tmp_path):
    def names(trace_set):
        by_group = defaultdict(set)
        for _, (_, kernels, _) in trace_set.items():
            for k in kernels:
                by_group[members(k["args"])].add(k["args"]["Process Group Name"])
        return by_group

    per_rank = names(traces)
    assert any(len(n) > 1 for n in per_rank.values())  # a consumer must match on members
    for rank, (trace, _, _) in traces.items():  # pg_config says what the events say
        for config in trace["distributedInfo"]["pg_config"][1:]:
            assert config["pg_name"] == job_dir[0].group_name(config["pg_desc"], rank)
    truth = generate(Job3D(**{**JOB, "group_names": "global"}), tmp_path)
    same = names({r: (None, nccl_kernels(load(p)), 0.0) for r, p in truth["files"].items()})
    assert all(len(n) == 1 for n in same.values())
    assert len({next(iter(n)) for n in same.values()}) == len(same)  # one name, one group


def test_distributed_info_and_header(job_dir, traces):
    job, _, _ = job_dir
    for rank, (trace, _, _) in traces.items():
        assert list(trace)[:3] == ["schemaVersion", "deviceProperties", "distributedInfo"]
        info = trace["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("nccl", rank, 8)
        assert [c["pg_desc"] for c in info["pg_config"]] == ["default_pg", "tp", "pp", "dp"]
        for c in info["pg_config"][1:]:
            assert rank in c["ranks"] and c["pg_size"] == len(c["ranks"]) and c["backend_config"] == "cuda:nccl"
        assert "host_name" not in trace and trace["baseTimeNanoseconds"] % 1_000_000_000 == 0
        steps = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
        assert steps == [f"ProfilerStep#{n}" for n in range(10, 16)]


def test_process_group_ranks_cut_short_as_torch_does():
    assert ranks_text(list(range(30))) == "[" + ", ".join(map(str, range(30))) + "]"
    assert ranks_text(list(range(0, 128, 2))) == "[" + ", ".join(map(str, range(0, 58, 2))) + ", ..., 126]"
    assert ranks_text(list(range(31)), "old") == "[" + ", ".join(map(str, range(30))) + ", ...]"


def test_our_rank_summary_reads_every_file(job_dir):
    job, truth, _ = job_dir
    for rank, path in truth["files"].items():
        summary = rank_summary_from_chrome(path)
        assert (summary["rank"], summary["world_size"], summary["timeline"]) == (rank, 8, "device")
        assert summary["collective_source"] == "device_kernels"
        assert [s["step"] for s in summary["steps"]] == truth["steps"]
        stage = str(job.coords(rank)[1])
        assert len(summary["collectives"]) == len(truth["collectives"][stage]) * job.steps
        assert {c["name"] for c in summary["collectives"]} == {"allreduce", "send", "recv"}
        assert all(c["seq"] is not None and c["group"] is not None and c["bytes"] for c in summary["collectives"])


def test_missing_died_gzip_legacy_and_the_folder_ingest_takes(tmp_path):
    job = Job3D(**{**JOB, "missing_ranks": (5,), "died_after": {6: 2}, "gzip": True, "kernel_args": "legacy"})
    truth = generate(job, tmp_path)
    assert sorted(truth["files"]) == [0, 1, 2, 3, 4, 6, 7] and truth["missing_ranks"] == [5]
    assert truth["truncated_ranks"] == {"6": 2}
    assert json.loads((tmp_path / "truth.json").read_text())["straggler"]["rank"] == 3
    died = rank_summary_from_chrome(truth["files"][6])
    assert [s["step"] for s in died["steps"]] == [10, 11]
    trace = load(truth["files"][0])
    kernel = nccl_kernels(trace)[0]["args"]
    assert not {"Rank", "Global rank start", "Global rank stride", "Seq", "Comms Id"} & set(kernel)
    rpc = next(e for e in trace["traceEvents"] if e["name"] == "record_param_comms")["args"]
    assert {"Rank", "Global rank start", "Global rank stride", "Seq", "Comms Id"} <= set(rpc)
    # ingest's layout: tensorboard_trace_handler names, each rank placed by distributedInfo
    cycles = find_cycles(tmp_path)
    assert len(cycles) == 7 and all(c.trace.name.endswith(".pt.trace.json.gz") for c in cycles)
    full, others, world, left_out = split_by_rank(cycles)
    assert [trace_rank(c.trace)[0] for c in full] == [0] and len(others) == 6 and world == 8 and left_out == []
