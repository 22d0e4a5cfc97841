"""Real `torchrun` jobs (gloo, CPU): every rank reports into one run, the slow rank is named, and
the callback holds no rank up, at its start or when a rank vanishes.

The job is `examples/ranks_straggler.py`: a matmul, then one explicit `all_reduce` a step, with
torch.distributed initialized before the callback (the documented path). What is checked is read
back from MLflow, as `ranks` reads it (`_readback.ranks.read_ranks`: the node files, then `analyze`).
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, artifact_files
from mlflow.tracking import MlflowClient
from servers import free_port

from mlflow_neuron._readback.ranks import RankRead, read_ranks

EXAMPLE = ROOT / "examples" / "ranks_straggler.py"
DELAY_MS = 30.0
# The store lock that rank 0 once held through the broadcast times out after 60 s: every rank's
# constructor took that long. A constructor that waits on no other rank's lock ends far sooner,
# even beside busy cores (it opens the store and creates the run on rank 0).
NOT_HELD_UP_S = 30.0


# The step of the calibrated device-like job (benchmarks/rank_calibration.py --device-ms 100
# --size 384, docs/figures.md: no rank named in 20 of 20 jobs without a delay, rank 2 in 20 of 20
# from 5%): a 384x384 matmul, then 100 ms standing for the accelerator's time with the host free,
# 2 cycles of 10 steps. A step of a few ms of CPU on four ranks sharing two cores is the
# scheduler's: there one rank came out later in 13 of 16 steps with no sleep at all.
STEPS = ("--size", "384", "--device-ms", "100", "--active", "10")


def torchrun(store, ranks: int, *args: str) -> list[dict]:
    """One job of `ranks` ranks into the sqlite store in `store` (a folder); each rank's JSON line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE),
               "--tracking-uri", f"sqlite:///{store / 'mlflow.db'}", "--experiment-id", "0",
               "--flush-timeout-s", "120", *args]  # fmt: skip
    result = subprocess.run(command, cwd=store, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    warned = [line for line in result.stderr.splitlines() if "MLflowNeuronWarning" in line]
    return [{**line, "warnings": warned} for line in sorted(lines, key=lambda line: line["rank"])]


def read_back(client: MlflowClient, run_id: str) -> RankRead:
    """Every rank summary the run holds (its node files), read from MLflow as `ranks` reads them."""
    return read_ranks(run_id, client=client)


def one_run(lines: list[dict], ranks: int) -> str:
    assert len({line["run_id"] for line in lines}) == 1 and len(lines) == ranks, lines
    return lines[0]["run_id"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("ranks")


@pytest.fixture(scope="module")
def slow_rank_job(store):
    """4 ranks on a fresh store, rank 2 sleeping 30 ms before each all_reduce."""
    lines = torchrun(store, 4, "--slow-rank", "2", "--delay-ms", str(DELAY_MS), *STEPS)
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    return lines, client, one_run(lines, 4)


def test_every_rank_starts_at_once_and_reports_each_cycle_into_one_run(slow_rank_job, tmp_path):
    lines, client, run_id = slow_rank_job
    assert max(line["constructor_s"] for line in lines) < NOT_HELD_UP_S, lines
    summaries = read_back(client, run_id).summaries
    cycles = sorted(int(p.split("/")[1].removeprefix("step_")) for p in artifact_files(client, run_id, "profiler")
                    if p.startswith("profiler/step_") and p.endswith("/manifest.json") and "/rank_" not in p)  # fmt: skip
    sent = {(s["rank"], s["cycle_step"]) for s in summaries}
    assert cycles and sent == {(r, c) for r in range(4) for c in cycles}, (sorted(sent), cycles, lines[0]["warnings"])
    assert all(s["world_size"] == 4 and s["host"] for s in summaries)
    # Other ranks send their summary (in their node's file), not their trace, tables or manifest (all_ranks=False).
    assert not [p for p in artifact_files(client, run_id, "profiler") if "/rank_" in p], run_id


def test_the_slow_rank_is_named_and_the_others_waited_for_it(slow_rank_job, tmp_path):
    _, client, run_id = slow_rank_job
    report = read_back(client, run_id).report
    assert report.straggler is not None and report.straggler["rank"] == 2, report.sentence
    waits = report.table.set_index("rank")["wait_us"]
    others = sorted(waits[r] for r in (0, 1, 3))
    assert abs(others[1] - DELAY_MS * 1000) <= 0.2 * DELAY_MS * 1000, waits.to_dict()
    assert waits[2] < 5000, waits.to_dict()


def test_without_the_sleep_no_rank_is_named_on_an_existing_store(store, slow_rank_job, tmp_path):
    lines = torchrun(store, 4, *STEPS)
    assert max(line["constructor_s"] for line in lines) < NOT_HELD_UP_S, lines
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    report = read_back(client, one_run(lines, 4)).report
    # Four ranks on two shared cores beside other tests: a rank the scheduler holds back is really
    # late, by a few ms (seen in CI: 2.5 ms a step, 16 of 20 steps). What no load may make is a
    # straggler the size of the sleep.
    assert report.missing == [] and report.matched > 0, report.sentence
    assert report.straggler is None or report.straggler["late_by_us"] < DELAY_MS * 1000 / 3, report.sentence


def test_a_rank_that_vanishes_holds_nobody_up_and_is_named_missing(store, slow_rank_job, tmp_path):
    """Rank 1 of 2 leaves before its first cycle, without close(): rank 0 finishes its cycles
    (the callback adds no collective after its constructor) and the run names rank 1 missing."""
    lines = torchrun(store, 2, "--exit-rank", "1", "--exit-at", "3")
    assert [line["rank"] for line in lines] == [0] and lines[0]["constructor_s"] < NOT_HELD_UP_S, lines
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    read = read_back(client, lines[0]["run_id"])
    assert {s["rank"] for s in read.summaries} == {0} and len(read.summaries) == 2
    report = read.report
    assert report.missing == [1] and report.straggler is None, report.sentence


# ---------------------------------------------------------------- a 3D-parallel job

EXAMPLE_3D = ROOT / "examples" / "ranks_3d.py"
# The 3D job's sleep and steps. With 30 ms and 12 steps a CI run beside other tests once saw rank 0
# late by 27 ms (median) in only 9 of 12 steps (10 pass the sign test): a rank the shared cores
# hold back for 30 ms turns a step around. 60 ms is held back far more rarely, and 20 steps pass
# with 16 late (P = 0.006), so four spoiled steps still name it.
DELAY_3D_MS, STEPS_3D = 60.0, 20


def torchrun_3d(store, *args: str) -> list[dict]:
    """examples/ranks_3d.py, 4 ranks, into the sqlite store in `store`; each rank's JSON line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(EXAMPLE_3D), "--tracking-uri", f"sqlite:///{store / 'mlflow.db'}",
               "--experiment-id", "0", "--flush-timeout-s", "120", *args]  # fmt: skip
    result = subprocess.run(command, cwd=store, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")), key=lambda x: x["rank"])


@pytest.fixture(scope="module")
def jobs_3d(tmp_path_factory):
    """The 3D job twice on one store: rank 0 sleeping 60 ms before its TP all_reduce, and no sleep."""
    store = tmp_path_factory.mktemp("ranks3d")
    out = {}
    for name, args in (("slow", ("--slow-rank", "0", "--delay-ms", str(DELAY_3D_MS))), ("even", ())):
        lines = torchrun_3d(store, "--active", str(STEPS_3D), *args)
        client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")  # after the job made the store (its artifact root)
        out[name] = read_back(client, one_run(lines, 4)).report
    return out


def test_in_a_3d_job_the_slow_rank_is_named_not_its_tp_peer_and_the_others_wait_for_it(jobs_3d):
    slow, even = jobs_3d["slow"], jobs_3d["even"]
    s = slow.straggler
    assert s is not None and s["rank"] == 0 and s["group_ranks"] == [0, 1] and s["group_desc"] == "tp", slow.sentence
    assert slow.unmatched == [] and slow.missing == [] and slow.matched > 0
    assert s["peers_wait_us"] == pytest.approx(DELAY_3D_MS * 1000, rel=0.3), slow.sentence

    def waited(report):  # in collectives and in receives (the pipeline's bubble), a step
        t = report.table.set_index("rank")
        return t["wait_us"] + t["bubble_us"].fillna(0.0)

    # Two live jobs on shared cores differ by ms of noise (seen with a 30 ms sleep: ranks 2 and 3 waited 25
    # and 35 ms more under load 6): the second stage waits longer for the sleep in its receives, by a good part of
    # it. The exact 30 ms is checked on the recorded job (tests/test_ranks_3d.py).
    more = waited(slow) - waited(even)
    for rank in (2, 3):
        assert more[rank] > DELAY_3D_MS * 1000 / 3, more.to_dict()


def test_in_the_3d_job_without_the_sleep_no_rank_of_the_second_stage_is_named(jobs_3d):
    even = jobs_3d["even"]
    assert even.unmatched == [] and even.matched > 0
    # stage 1 reaches every dp all_reduce last (it waits for stage 0's activations first): that is
    # the schedule. A second-stage rank is never named for it; on shared cores a rank held back by
    # the scheduler may be late by a few ms, never by the bubble's size
    bubble = even.table.set_index("rank").loc[[2, 3], "bubble_us"].min()
    s = even.straggler
    assert s is None or s["rank"] not in (2, 3) or s["late_by_us"] < bubble / 3, even.sentence
