"""Fault scenarios against a real `mlflow server`, shared by the tests and the benchmark.

Each scenario runs a training loop with the callback while the server misbehaves, then runs
`mlflow-neuron sync` (twice: sync must be idempotent) and counts what the run holds. A cycle is
present when its step has exactly one point in the metric history and its files are there.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient
from servers import DelayProxy, MlflowServer
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron._delivery.outbox import JOB, RECORD, fallback_folder, pending
from mlflow_neuron.cli import sync

# A sending attempt must fail in seconds, not in MLflow's default minutes of retries.
FAST_FAILING_CLIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass
class Outcome:
    scenario: str
    steps_completed: int
    cycles_sent: int
    delivered_live: int
    kept_in_outbox: int
    present_after_sync: int
    duplicated: int


@contextmanager
def client_env():
    saved = {k: os.environ.get(k) for k in FAST_FAILING_CLIENT}
    os.environ.update(FAST_FAILING_CLIENT)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def count_cycles(client: MlflowClient, run_id: str, expected_steps: list[int]) -> tuple[int, int]:
    """(cycles present exactly once with their files, metric points logged more than once)."""
    present, duplicated = present_steps(client, run_id, expected_steps)
    return len(present), duplicated


def present_steps(client: MlflowClient, run_id: str, expected_steps: list[int]) -> tuple[set[int], int]:
    """The steps of `expected_steps` whose cycle is in the run once with its files, and the
    metric points logged more than once."""
    history = [m.step for m in client.get_metric_history(run_id, "profiler/total/active_steps")]
    artifacts = {a.path for a in client.list_artifacts(run_id, "profiler")}
    present = set()
    for step in expected_steps:
        files = {a.path for a in client.list_artifacts(run_id, f"profiler/step_{step}")}
        if history.count(step) == 1 and f"profiler/step_{step}" in artifacts and \
                {f"profiler/step_{step}/ops.json", f"profiler/step_{step}/manifest.json"} <= files:
            present.add(step)
    return present, len(history) - len(set(history))


def kept_steps(outbox: str | os.PathLike) -> set[int]:
    """The steps of the cycles queued in an outbox now, read from disk (each entry's record.json,
    else its job.json), apart from anything a callback counted."""
    steps = set()
    for entry in pending(outbox):
        for name in (RECORD, JOB):
            if (entry / name).is_file():
                data = json.loads((entry / name).read_text(encoding="utf-8"))
                step = data.get("step", data.get("job", {}).get("step") if isinstance(data.get("job"), dict) else None)
                if step is not None:
                    steps.add(int(step))
                break
    return steps


def lost_steps(client: MlflowClient, run_id: str, outbox: str | os.PathLike, produced: list[int]) -> list[int]:
    """The produced cycles that neither MLflow holds (once, with their files) nor the outbox keeps:
    counted from both places on their own, never as `produced - present`."""
    present, _ = present_steps(client, run_id, produced)
    kept = kept_steps(outbox)
    return [step for step in produced if step not in present and step not in kept]


def _finish(name, server, run_id, callback, steps, expected_steps, outboxes) -> Outcome:
    """Counts, once the callback is closed: the cycles kept in the outboxes and the cycles the run
    holds (once, with their files) before any sync, both read from where they are, not from the
    callback's counters; then syncs twice and counts the run again."""
    client = MlflowClient(server.uri)
    kept = sum(len(list(Path(o).glob("*-*-*"))) for o in outboxes if Path(o).is_dir())
    live, _ = count_cycles(client, run_id, expected_steps)  # delivered live: in MLflow before a sync sends the rest
    for _ in range(2):  # a second sync must change nothing
        for outbox in outboxes:
            sync(str(outbox), server.uri, out=io.StringIO())
    present, duplicated = count_cycles(client, run_id, expected_steps)
    return Outcome(name, steps, callback.cycles_read, live, kept, present, duplicated)


def new_callback(helper: bool, **options) -> MLflowProfilerCallback:
    """The callback processing every cycle in its helper process (up before the first cycle), or,
    without `helper`, in the training process (process="inline"). By default the first cycles
    go in-process until the helper is up: a mix of the two."""
    if not helper:
        return MLflowProfilerCallback(process="inline", **options)
    callback = MLflowProfilerCallback(**options)
    if not callback.start_helper(300):  # at nice 10 beside two nice-0 hogs it gets ~10% of a core
        raise RuntimeError("the helper process did not start")
    return callback


def dead_before_the_run(workdir: Path, cycles: int = 3, helper: bool = False) -> Outcome:
    """The server dies after the run was created and before training starts; it comes back later."""
    with client_env(), MlflowServer(workdir / "server") as server:
        server.start()
        run_id = MlflowClient(server.uri).create_run("0").info.run_id
        server.kill()
        callback = new_callback(helper, run_id=run_id, tracking_uri=server.uri, outbox=workdir / "outbox",
                                          retry_wait_s=0.05, flush_timeout_s=2)
        steps = profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
        callback.close()
        server.restart()
        return _finish("server dead before the run", server, run_id, callback, steps,
                       [4 * (i + 1) for i in range(cycles)], [workdir / "outbox"])


def killed_mid_upload_and_restarted(workdir: Path, cycles: int = 6, helper: bool = False) -> Outcome:
    """The server is killed while cycle 2 is being sent, and restarted while training goes on."""
    with client_env(), MlflowServer(workdir / "server") as server:
        server.start()
        run_id = MlflowClient(server.uri).create_run("0").info.run_id
        may_restart, restarted = threading.Event(), threading.Event()

        def kill_then_restart():
            time.sleep(0.05)  # cycle 2 was just handed to the sender: kill the server mid-send
            server.kill()
            may_restart.wait(120)
            server.restart()
            restarted.set()

        chaos = threading.Thread(target=kill_then_restart, daemon=True)

        def trigger(prof):
            if prof.step_num == 8:
                chaos.start()
            if prof.step_num == 12:  # cycle 3 was read while the server was down: bring it back
                may_restart.set()

        callback = new_callback(helper, run_id=run_id, tracking_uri=server.uri, outbox=workdir / "outbox",
                                          retry_wait_s=0.2, flush_timeout_s=30)
        steps = profile_rmsnorm(lambda prof: (callback(prof), trigger(prof)), steps=4 * cycles,
                                wait=1, warmup=1, active=2)
        restarted.wait(120)
        callback.close()
        return _finish("killed mid-upload, restarted", server, run_id, callback, steps,
                       [4 * (i + 1) for i in range(cycles)], [workdir / "outbox"])


def slow_server(workdir: Path, cycles: int = 3, delay_s: float = 0.3, helper: bool = False) -> Outcome:
    """Every request to the server takes `delay_s` longer (a delaying proxy on loopback)."""
    with client_env(), MlflowServer(workdir / "server") as server:
        server.start()
        with DelayProxy(server.port, delay_s=delay_s) as proxy:
            proxy.start()
            run_id = MlflowClient(server.uri).create_run("0").info.run_id
            callback = new_callback(helper, run_id=run_id, tracking_uri=proxy.uri, outbox=workdir / "outbox",
                                              flush_timeout_s=120)
            steps = profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
            callback.close()
        return _finish(f"slow server (+{delay_s * 1000:.0f} ms a request)", server, run_id, callback, steps,
                       [4 * (i + 1) for i in range(cycles)], [workdir / "outbox"])


def outbox_on_a_read_only_path(workdir: Path, cycles: int = 2, helper: bool = False) -> Outcome:
    """The server is down and the configured outbox cannot be written: the fallback folder is used."""
    blocker = workdir / "not_a_folder"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("")
    with client_env(), MlflowServer(workdir / "server") as server:
        server.start()
        run_id = MlflowClient(server.uri).create_run("0").info.run_id
        server.kill()
        callback = new_callback(helper, run_id=run_id, tracking_uri=server.uri, outbox=blocker / "outbox",
                                          retry_wait_s=0.05, flush_timeout_s=2)
        steps = profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
        callback.close()
        server.restart()
        return _finish("outbox on a read-only path", server, run_id, callback, steps,
                       [4 * (i + 1) for i in range(cycles)], [fallback_folder()])


SCENARIOS = (dead_before_the_run, killed_mid_upload_and_restarted, slow_server, outbox_on_a_read_only_path)
