"""The default exit: the profiler's exit and `close()` do not wait for queued cycles; the helper
delivers them afterwards, each exactly once, and a helper killed meanwhile leaves them to `sync`.

Against a real `mlflow server` behind `FaultProxy`, whose plan holds the metric requests so that
nothing can be delivered before the exit, whatever the machine's speed.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from fault_scenarios import count_cycles
from http_faults import FaultProxy, Hold
from mlflow.tracking import MlflowClient
from servers import MlflowServer
from test_batching import cycle_traces, profile_cycles

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron._delivery import staging
from mlflow_neuron.cli import sync

CYCLES = 4
STEPS = [4 * (i + 1) for i in range(CYCLES)]  # profile_cycles: a cycle every 4 steps
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("after-exit") / "server") as running:
        yield running.start(timeout=120)


class HoldMetrics:
    """Holds every `log-batch` request (metrics, params, tags) until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0

    def __call__(self, index: int, method: str, path: str):
        if path.endswith("/runs/log-batch"):
            self.held += 1
            return Hold(self.release)
        return None


def job_folders(outbox: Path) -> list[Path]:
    return sorted(p for p in outbox.iterdir() if staging.is_job_folder(p)) if outbox.is_dir() else []


def kept_steps(outbox: Path) -> list[int]:
    """The steps of the cycles waiting in `outbox`: staged with their jobs, or stored as records (a
    helper whose request timed out stores the cycle)."""
    staged = [json.loads((f / staging.JOB).read_text())["job"]["step"] for f in job_folders(outbox)]
    return sorted(set(staged) | {json.loads((r / _outbox.RECORD).read_text())["step"] for r in _outbox.pending(outbox)})


def test_the_exit_waits_for_no_queued_cycle_and_the_helper_delivers_each_once_after_it(server, tmp_path):
    client = MlflowClient(server.uri)
    experiment_id = client.create_experiment("after-exit-in-process")
    hold = HoldMetrics()
    with FaultProxy(server.port, hold) as proxy, warnings.catch_warnings():
        warnings.simplefilter("ignore", MLflowNeuronWarning)
        callback = MLflowProfilerCallback(tracking_uri=proxy.uri, experiment_id=experiment_id,
                                          outbox=tmp_path / "outbox", deliver_after_exit=True)  # fmt: skip
        try:
            assert profile_cycles(callback, cycles=CYCLES) == 4 * CYCLES
            callback.close()
            # Returned while no metric could reach the server: the exit waited for none of them,
            # and each is kept in the outbox meanwhile.
            assert count_cycles(client, callback.run_id, STEPS) == (0, 0) if callback.run_id else True
            assert kept_steps(tmp_path / "outbox") == STEPS
        finally:
            hold.release.set()
        assert callback.wait_delivered(300)
    assert hold.held >= 1
    run_id = callback.run_id
    assert run_id is not None
    assert count_cycles(client, run_id, STEPS) == (CYCLES, 0)  # every cycle, once
    assert cycle_traces(client, run_id) == sorted(f"{run_id}/{step}" for step in STEPS)
    assert client.get_run(run_id).info.status == "FINISHED"  # ended by the helper after its last cycle
    assert job_folders(tmp_path / "outbox") == [] and _outbox.pending(tmp_path / "outbox") == []


TRAINING = """
import json, sys, time, warnings
sys.path.insert(0, {tests!r})
from test_batching import profile_cycles
from mlflow_neuron import MLflowProfilerCallback
warnings.simplefilter("ignore")
callback = MLflowProfilerCallback(tracking_uri={uri!r}, experiment_id={experiment!r}, outbox={outbox!r},
                                  deliver_after_exit=True)
profile_cycles(callback, cycles={cycles})
callback.close()
print(json.dumps({{"helpers": list(callback._sender.handed.pids())}}), flush=True)
"""


def test_a_helper_killed_after_training_ended_leaves_every_cycle_to_sync_once(server, tmp_path):
    client = MlflowClient(server.uri)
    experiment_id = client.create_experiment("after-exit-killed")
    outbox = tmp_path / "outbox"
    hold = HoldMetrics()
    with FaultProxy(server.port, hold) as proxy:
        script = TRAINING.format(tests=str(TESTS), uri=proxy.uri, experiment=experiment_id, outbox=str(outbox),
                                 cycles=CYCLES)  # fmt: skip
        try:
            # Files, not pipes: the helper inherits stderr, and a pipe would stay open until it ends.
            out, err = tmp_path / "stdout", tmp_path / "stderr"
            with out.open("w") as stdout, err.open("w") as stderr:
                training = subprocess.Popen([sys.executable, "-c", script], stdout=stdout, stderr=stderr)
                assert training.wait(300) == 0, err.read_text()[-3000:]
            [helper] = json.loads(out.read_text().strip().splitlines()[-1])["helpers"]
            # Training has ended; its helper is still there, its first metrics held.
            os.kill(helper, signal.SIGKILL)
            _wait_gone(helper)
        finally:
            hold.release.set()
    assert kept_steps(outbox) == STEPS  # staged with their jobs (or stored): none lost with the helper
    assert staging.abandoned(outbox) == job_folders(outbox)  # nobody owns them any more
    for _ in range(2):  # twice: the second finds nothing left to send
        out = io.StringIO()
        sync(str(outbox), server.uri, out=out)
    assert job_folders(outbox) == [] and _outbox.pending(outbox) == []
    [run] = client.search_runs([experiment_id])
    assert count_cycles(client, run.info.run_id, STEPS) == (CYCLES, 0)
    assert cycle_traces(client, run.info.run_id) == sorted(f"{run.info.run_id}/{step}" for step in STEPS)
    assert client.get_run(run.info.run_id).info.status == "FINISHED"  # sync ends the run the callback created


def test_a_job_folder_is_left_alone_while_an_owner_lives(tmp_path):
    outbox = tmp_path / "outbox"
    alive = staging.new_staged_folder(outbox)
    assert staging.write_job(alive, staging.job_header({}, {}), {"step": 1}, (os.getpid(),))
    gone = staging.new_staged_folder(outbox)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert staging.write_job(gone, staging.job_header({}, {}), {"step": 2}, (child.pid,))
    assert staging.abandoned(outbox) == [gone.parent]
    # A staged cycle whose files went (delivered, or stored as a record) needs nothing more.
    staging.discard(gone)
    assert not gone.parent.exists() and alive.parent.exists()
    # A job record that cannot be read is set aside by sync, never sent, never lost silently.
    broken = staging.new_staged_folder(outbox)
    (broken.parent / staging.JOB).write_text("{", encoding="utf-8")
    os.chmod(broken.parent, 0o700)
    with pytest.raises(ValueError, match="cannot be read"):
        staging.finish(broken.parent, reporter=None)


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _outbox.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_against_a_dead_server_the_exit_does_not_wait_and_the_helper_keeps_every_cycle(tmp_path):
    outbox = tmp_path / "outbox"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        callback = MLflowProfilerCallback(tracking_uri="http://127.0.0.1:1", experiment_id="0", outbox=outbox,
                                          retry_wait_s=0.05, deliver_after_exit=True)  # fmt: skip
        profile_cycles(callback, cycles=2)
        callback.close()
        assert callback.wait_delivered(300)
    assert job_folders(outbox) == []
    assert len(_outbox.pending(outbox)) == 2  # each kept as a record for `mlflow-neuron sync`


def test_a_bad_setting_is_refused_when_the_callback_is_created(tracking_uri, monkeypatch):
    with pytest.raises(TypeError, match="deliver_after_exit must be True, False or None; got 'yes'"):
        MLflowProfilerCallback(deliver_after_exit="yes")
    monkeypatch.setenv("MLFLOW_NEURON_DELIVER_AFTER_EXIT", "later")
    with pytest.raises(ValueError, match="MLFLOW_NEURON_DELIVER_AFTER_EXIT must be 1 or 0"):
        MLflowProfilerCallback()
