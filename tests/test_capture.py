"""Captures on request (`mlflow-neuron capture`, or the tag set by hand) and the plan every rank
follows (`_record.capture_request`): through a real `mlflow server`, the helper's listener, and a
real 2-rank `torchrun` job (gloo) whose rank 1 becomes slower at step 300.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings

import pytest
from conftest import ROOT
from mlflow.tracking import MlflowClient
from servers import MlflowServer, free_port
from torch.profiler import ProfilerActivity, profile

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._capture.adaptive import NODES_LEAD_S, AdaptiveSchedule
from mlflow_neuron._capture.plans import Plans
from mlflow_neuron._delivery.report import Reporter
from mlflow_neuron._readback.ranks import read_ranks
from mlflow_neuron._record.capture_request import (LISTEN_FILE, PLAN_TAG, POLL_S, REQUEST_TAG, Plan, parse_plan,
                                                   parse_request)  # fmt: skip
from mlflow_neuron._record.model import RunRef

MS = 1_000_000
CAPTURE_WITHIN_S = 10.0  # the promise: a capture begins within 10 s of the request (POLL_S is 7)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlflow_neuron.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("server")) as running:
        yield running


# -- what a tag holds -------------------------------------------------------------------------------


def test_a_request_is_the_clis_json_or_a_number_of_steps_and_anything_else_is_refused_by_name():
    request = parse_request('{"id": "ab12", "steps": 8, "at": "2026-12-07T14:02:11Z", "by": "capture"}', "x")
    assert (request.id, request.steps, request.at, request.by) == ("ab12", 8, "2026-12-07T14:02:11Z", "capture")
    typed = parse_request(" 6 steps", "2026-12-07T15:00:00Z")
    assert (typed.id, typed.steps, typed.by, typed.at) == ("tag:6 steps", 6, "tag", "2026-12-07T15:00:00Z")
    for bad in ("please", "0", "100000", '{"steps": 5}', '{"id": "x", "steps": -1}', "[1]"):
        with pytest.raises(ValueError, match="not a capture request|steps must be a whole number from 1 to 1000"):
            parse_request(bad, "x")
    plan = Plan(id="p1", start=310, steps=6, reason="baseline", at="t", request=None)
    assert parse_plan(plan.to_json()) == plan and parse_plan("{}") is None and parse_plan(b"\x00") is None


def test_the_ranks_of_a_node_writing_the_run_s_folder_at_once_all_succeed(tmp_path):
    """Every rank writes the same listen file when its schedule is made, and the helper may write the
    plan rank 0 writes: each writer renames a partial file of its own (a shared one was renamed away
    under the other writer, whose schedule then had no folder: its plans came late, by the tag)."""
    run = RunRef(tracking_uri="sqlite:///x.db", run_id="r" * 32)
    failed = []

    def make() -> None:
        for _ in range(200):
            try:
                Plans(tmp_path, run).write(Plan(id="p", start=1, steps=1, reason="r", at="t"))
                (tmp_path / LISTEN_FILE).unlink(missing_ok=True)
            except OSError as error:
                failed.append(error)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == [] and not list(tmp_path.glob("*.partial"))


# -- the plan every rank follows, on a clock of its own -----------------------------------------------


def drive_all(schedules: list[AdaptiveSchedule], steps: int, step_ms) -> list[list[str]]:
    """Each schedule called at each step in turn, as ranks stepping together; `step_ms(rank, step)`."""
    clock = [0] * len(schedules)
    for rank, schedule in enumerate(schedules):
        schedule.clock = lambda rank=rank: clock[rank]
    actions = [[] for _ in schedules]
    for step in range(steps):
        for rank, schedule in enumerate(schedules):
            actions[rank].append(schedule(step).name)
            clock[rank] += int(step_ms(rank, step) * MS)
    return actions


def test_rank_0_decides_and_the_other_ranks_capture_the_same_steps(tmp_path):
    """Rank 1 never decides: its own step time does not change here, and it captures what rank 0 planned."""
    run = RunRef(tracking_uri="sqlite:///x.db", run_id="r" * 32)
    sent = []
    leader = AdaptiveSchedule(Reporter(strict=True), sent.append, plans=Plans(tmp_path, run), followers=True)
    follower = AdaptiveSchedule(Reporter(strict=True), None, plans=Plans(tmp_path, run), leader=False)
    actions = drive_all([leader, follower], 600, lambda rank, step: 20 if step < 300 or rank == 1 else 35)
    assert actions[0] == actions[1]
    steps = [(c.reason, c.first_step, c.last_step) for c in leader.captures]
    assert [(c.first_step, c.last_step) for c in follower.captures] == [s[1:] for s in steps]
    assert len(steps) == 2 and steps[0] == ("baseline", 20, 26) and 300 < steps[1][1] <= 330, steps
    plan = json.loads(next(d.tags[PLAN_TAG] for d in sent if d.tags))
    assert plan["start"] == steps[1][1] and plan["reason"] == steps[1][0] == follower.captures[1].reason


def test_a_plan_seen_late_is_one_warning_and_the_rank_captures_at_once(tmp_path):
    run = RunRef(tracking_uri="sqlite:///x.db", run_id="r" * 32)
    plans = Plans(tmp_path, run)
    follower = AdaptiveSchedule(Reporter(strict=False), None, plans=Plans(tmp_path, run), leader=False,
                                warmup_steps=10**6)  # fmt: skip
    drive_all([follower], 50, lambda rank, step: 20)
    plans.write(Plan(id="p", start=40, steps=3, reason="requested at 14:02:11 by `capture`", at="t"))
    os.utime(tmp_path, ns=(0, 0))  # the folder's time moved (a coarse clock may not show the rename)
    follower.clock = itertools.count(10**12, 20 * MS).__next__  # the steps go on, 20 ms each
    with pytest.warns(MLflowNeuronWarning, match="planned by rank 0 for step 40 was seen at step 50"):
        actions = [follower(step).name for step in range(50, 56)]
    assert actions == ["WARMUP", "RECORD", "RECORD", "RECORD_AND_SAVE", "NONE", "NONE"]


# -- a request through a real server --------------------------------------------------------------


def test_capture_on_a_running_job_gives_a_cycle_within_10_s_plus_its_steps(server, tmp_path, monkeypatch):
    """A loop of 20 ms steps with no baseline (warmup_steps=10**6): a tag that is no request is said
    once and changes nothing; `mlflow-neuron capture RUN --steps 6` then gives one cycle of 6
    profiled steps, begun within 10 s of the command's return, answered on the run; then the
    tag set by hand to "4", as in the MLflow UI, gives one more of 4 steps."""
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(server.uri)
    run_id = client.create_run("0").info.run_id
    callback = MLflowProfilerCallback(tracking_uri=server.uri, run_id=run_id, outbox=tmp_path / "outbox")
    assert callback.start_helper(timeout=180)
    schedule = callback.schedule(warmup_steps=10**6)
    asked: dict[str, float] = {}

    def ask() -> None:
        time.sleep(1.0)
        client.set_tag(run_id, REQUEST_TAG, "please profile")  # not a request: one warning in the job
        time.sleep(POLL_S + 2)
        done = cli("capture", run_id, "--steps", "6", "--tracking-uri", server.uri)
        asked["at"], asked["rc"], asked["out"] = time.monotonic(), done.returncode, done.stdout + done.stderr
        for _ in range(600):
            if schedule.captures and not schedule.pending:
                break
            time.sleep(0.1)
        for _ in range(600):  # the plan's tag goes through the outbox, as the cycle does
            asked["plan"] = client.get_run(run_id).data.tags.get(PLAN_TAG)
            if asked["plan"]:
                break
            time.sleep(0.1)
        client.set_tag(run_id, REQUEST_TAG, "4")  # as typed in the MLflow UI
        asked["by hand"] = time.monotonic()

    began = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threading.Thread(target=ask, daemon=True).start()
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule, on_trace_ready=callback) as prof:
            deadline = time.perf_counter()
            for _ in range(9000):  # at most 3 minutes
                deadline = max(deadline + 0.02, time.perf_counter())
                time.sleep(max(deadline - time.perf_counter(), 0))
                prof.step()
                if len(began) < len(schedule.captures):
                    began.append(time.monotonic())
                if len(began) == 2 and time.monotonic() - began[1] > 1:
                    break
        callback.close(timeout=120)
    assert asked["rc"] == 0 and asked["out"].count("\n") == 1 and "asked run" in asked["out"], asked
    assert began, f"no capture in 3 minutes of 20 ms steps; the request: {asked}"
    assert began[0] - asked["at"] <= CAPTURE_WITHIN_S, (began[0] - asked["at"], schedule.captures)
    first, typed = schedule.captures
    assert first.reason.startswith("requested at ") and first.reason.endswith("by `capture`")
    assert typed.reason.endswith("by tag mlflow_neuron.capture") and began[1] - asked["by hand"] <= CAPTURE_WITHIN_S
    assert (first.last_step - first.first_step, typed.last_step - typed.first_step) == (6, 4)
    assert callback.cycles_logged == 2
    tags = client.get_run(run_id).data.tags
    for capture in (first, typed):
        assert tags[f"mlflow_neuron.capture_reason.step_{capture.last_step + 1}"] == capture.reason
    plan = json.loads(asked["plan"])
    assert (plan["start"], plan["steps"], plan["reason"]) == (first.first_step, 6, first.reason)
    assert plan["request"] == re.search(r"\(request (\w+)\)", asked["out"])[1]  # the id the command printed
    latest = json.loads(tags[PLAN_TAG])
    assert (latest["request"], latest["start"], latest["steps"]) == ("tag:4", typed.first_step, 4)
    said = [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning)]
    assert [m for m in said if "is not a capture request" in m] == [
        f"mlflow-neuron: tag {REQUEST_TAG}='please profile' is not a capture request: set it to a number of steps "
        "(1 to 1000), or use `mlflow-neuron capture RUN_ID --steps N`"], said


def test_capture_refuses_a_finished_run_another_schedule_a_bad_step_count_and_a_dead_server(server, dead_server):
    client = MlflowClient(server.uri)
    finished = client.create_run("0").info.run_id
    client.set_terminated(finished)
    done = cli("capture", finished, "--tracking-uri", server.uri)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"mlflow-neuron capture: error: run {finished} is FINISHED: no job is writing it, so nothing can capture")
    other = client.create_run("0").info.run_id
    client.log_param(other, "profiler.schedule", "none")
    done = cli("capture", other, "--tracking-uri", server.uri)
    assert done.returncode == 2 and "profiles on a schedule of its own (profiler.schedule=none)" in done.stderr
    assert REQUEST_TAG not in client.get_run(other).data.tags and REQUEST_TAG not in client.get_run(finished).data.tags
    done = cli("capture", other, "--steps", "0", "--tracking-uri", server.uri)
    assert done.returncode == 2 and "--steps: must be a whole number from 1 to 1000, not '0'" in done.stderr
    done = cli("capture", "f" * 32, "--tracking-uri", server.uri)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = cli("capture", other, "--tracking-uri", dead_server)
    assert done.returncode == 3 and len(done.stderr.strip().splitlines()) == 1, done.stderr


# -- a real torchrun job ---------------------------------------------------------------------------


def job(tmp_path, *args: str) -> tuple[list[dict], str]:
    """A 2-rank torchrun job of examples/profile_when_it_matters.py whose rank 1 is 20 ms slower a
    step from step 300; each rank's line, and the store."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(ROOT / "examples" / "profile_when_it_matters.py"),
               "--tracking-uri", uri, "--experiment-id", "0", "--slow-rank", "1", "--slower-from", "300",
               "--delay-ms", "20", "--until-captures", "2", *args]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    said = [line for line in result.stderr.splitlines() if "mlflow-neuron:" in line]
    lines = sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")),
                   key=lambda line: line["rank"])  # fmt: skip
    assert [line["rank"] for line in lines] == [0, 1] and lines[0]["run_id"] == lines[1]["run_id"]
    captures = [[tuple(c[1:]) for c in line["captures"]] for line in lines]
    assert captures[0] == captures[1], (lines, said)  # every rank: the same steps
    assert not [line for line in said if "capture" in line or "schedule" in line], said
    return lines, uri


def test_a_2_rank_job_whose_rank_1_slows_at_step_300_captures_the_same_steps_and_ranks_names_rank_1(tmp_path):
    lines, uri = job(tmp_path)
    changed = [c for c in lines[0]["captures"] if c[0].startswith("step time") and 300 < c[1] <= 340]
    assert len(changed) == 1 and len(lines[0]["captures"]) <= 3, lines
    read = read_ranks(lines[0]["run_id"], client=MlflowClient(uri), step=changed[0][2] + 1)
    assert read.report.straggler is not None and read.report.straggler["rank"] == 1, read.report.sentence


def test_across_nodes_rank_0s_plan_reaches_the_other_node_through_the_runs_tags(tmp_path):
    """Each rank a node of its own (its own outbox and helper): rank 1 learns the plan only from the
    run's tag, through its helper; the plan starts 15 s ahead (NODES_LEAD_S) so that it does."""
    lines, uri = job(tmp_path, "--as-nodes")
    changed = [c for c in lines[0]["captures"] if c[0].startswith("step time")]
    assert len(changed) == 1 and changed[0][1] > 300 + NODES_LEAD_S * 1000 / 40 / 2, lines
    plan = parse_plan(MlflowClient(uri).get_run(lines[0]["run_id"]).data.tags[PLAN_TAG])
    assert (plan.start, plan.reason) == (changed[0][1], changed[0][0])
    read = read_ranks(lines[0]["run_id"], client=MlflowClient(uri), step=changed[0][2] + 1)
    assert read.report.straggler is not None and read.report.straggler["rank"] == 1, read.report.sentence
