"""The helper keeps up: cycles that waited go together, each still exactly once; the helper starts
with the callback; a sender that cannot keep up says so.

Against a real `mlflow server` behind `FaultProxy`, which holds, refuses or counts requests.
"""

from __future__ import annotations

import io
import os
import re
import signal
import threading
import time
import warnings

import pytest
from fault_scenarios import client_env, count_cycles
from http_faults import Delay, FaultProxy, Refuse
from mlflow.tracking import MlflowClient
from servers import MlflowServer
from torch.profiler import ProfilerActivity, profile, schedule
from workloads import inputs, rms_norm_naive

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron._delivery import pace
from mlflow_neuron._delivery.traces import CYCLE_KEY_TAG
from mlflow_neuron.cli import sync

CYCLES = 8
STEPS = [4 * (i + 1) for i in range(CYCLES)]  # schedule(wait=1, warmup=1, active=2): a cycle every 4 steps


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("batching") / "server") as running:
        yield running.start(timeout=120)


def profile_cycles(callback, first_alone=None, steps_per_cycle: int = 4, cycles: int = CYCLES,
                   step_s: float = 0.0) -> int:
    """`cycles` cycles of the reference loop. `first_alone` (an `InTheBatch`): the helper is up
    first, and the loop waits after the first cycle until that cycle's metrics are being held, so
    that it is sent alone and the others pile up behind it, however slow the machine."""
    if first_alone:
        assert callback._sender.wait_ready(300)
    x, weight = inputs()
    plan = dict(wait=1, warmup=1, active=2) if steps_per_cycle == 4 else dict(wait=0, warmup=1, active=1)
    steps = steps_per_cycle * cycles
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(**plan), on_trace_ready=callback) as prof:
        for step in range(1, steps + 1):
            rms_norm_naive(x, weight)
            time.sleep(step_s)
            prof.step()
            if first_alone and step == steps_per_cycle:
                deadline = time.monotonic() + 300
                while first_alone.log_batches < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
    return steps


def cycle_traces(client: MlflowClient, run_id: str) -> list[str]:
    """The cycle keys of the run's traces, one entry per trace."""
    experiment_id = client.get_run(run_id).info.experiment_id
    traces = client.search_traces(locations=[experiment_id], include_spans=False, max_results=500)
    return sorted(t.info.tags.get(CYCLE_KEY_TAG, "") for t in traces if t.info.tags.get(CYCLE_KEY_TAG, "").startswith(run_id))


def step_of(path: str) -> str | None:
    found = re.search(r"/profiler/step_(\d+)/", path)
    return found.group(1) if found else None


class InTheBatch:
    """Holds the first cycles' metrics (`log-batch` number 2; number 1 holds the params) so that
    the cycles behind them pile up; then acts on the first request that belongs to the *second*
    cycle after the batch's `log-batch` (number 4: number 3 marks the first cycle's trace
    complete), before any further one: which proves that the cycles after that one `log-batch`
    went together, and hits the batch after its first cycle is written."""

    def __init__(self, kind: str, fault) -> None:
        self.kind, self.fault = kind, fault
        self.log_batches = 0
        self.first_key: str | None = None
        self.hit: int | None = None  # the request index acted on

    def __call__(self, index: int, method: str, path: str):
        if path.endswith("/runs/log-batch"):
            self.log_batches += 1
            return Delay(3.0) if self.log_batches == 2 else None
        if self.log_batches != 4 or self.hit is not None:
            return None
        if self.kind == "files" and method == "PUT" and step_of(path):
            key = step_of(path)
        elif self.kind == "traces" and method == "POST" and path.endswith("/mlflow/traces"):
            key = str(index)  # each trace start is a cycle of its own
        else:
            return None
        if self.first_key is None:
            self.first_key = key
            return None
        if key != self.first_key:
            self.hit = index
            return self.fault
        return None


def check_once(server, callback, expected=CYCLES) -> None:
    client = MlflowClient(server.uri)
    present, duplicated = count_cycles(client, callback.run_id, STEPS[:expected])
    assert (present, duplicated) == (expected, 0)
    keys = cycle_traces(client, callback.run_id)
    assert keys == sorted(f"{callback.run_id}/{step}" for step in STEPS[:expected])  # one trace per cycle


@pytest.mark.parametrize("kind", ["files", "traces"])
def test_a_batch_that_fails_half_way_is_sent_again_cycle_by_cycle_and_each_cycle_lands_once(server, tmp_path, kind):
    plan = InTheBatch(kind, Refuse(503))
    with client_env(), FaultProxy(server.port, plan) as proxy, warnings.catch_warnings():
        warnings.simplefilter("ignore", MLflowNeuronWarning)
        callback = MLflowProfilerCallback(tracking_uri=proxy.uri, experiment_id="0", outbox=tmp_path / "outbox",
                                          retry_wait_s=0.05, flush_timeout_s=120)  # fmt: skip
        assert profile_cycles(callback, first_alone=plan) == 4 * CYCLES
        callback.close()
    assert plan.hit is not None, f"no batch formed: {[(m, p) for _, m, p, _ in proxy.seen]}"
    assert len(proxy.refused()) == 1
    assert callback.cycles_logged == CYCLES and callback._sender.jobs_sent == CYCLES
    assert _outbox.pending(tmp_path / "outbox") == []
    check_once(server, callback)


def test_a_helper_killed_mid_batch_loses_nothing_and_sync_after_it_adds_nothing(server, tmp_path):
    plan = InTheBatch("files", Delay(3.0))  # the batch's second cycle is held: the helper is killed meanwhile
    with client_env(), FaultProxy(server.port, plan) as proxy, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MLflowNeuronWarning)
        callback = MLflowProfilerCallback(tracking_uri=proxy.uri, experiment_id="0", outbox=tmp_path / "outbox",
                                          retry_wait_s=0.05, flush_timeout_s=120)  # fmt: skip
        killed = []

        def kill_mid_batch():
            deadline = time.monotonic() + 300
            while plan.hit is None and time.monotonic() < deadline:
                time.sleep(0.01)
            pid = callback._sender.helper_pid
            if plan.hit is not None and pid:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        killer = threading.Thread(target=kill_mid_batch, daemon=True)
        killer.start()
        assert profile_cycles(callback, first_alone=plan) == 4 * CYCLES
        killer.join(300)
        callback.close()
        for _ in range(2):  # sync after it, twice: nothing left to send, nothing sent again
            sync(str(tmp_path / "outbox"), server.uri, out=io.StringIO())
    assert killed, "the helper was not killed mid-batch"
    assert any("helper process ended" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert _outbox.pending(tmp_path / "outbox") == []
    check_once(server, callback)


def test_the_helper_starts_with_the_callback_and_takes_every_cycle_even_the_first(tracking_uri):
    callback = MLflowProfilerCallback(experiment_id="0", flush_timeout_s=300)
    try:
        [pid] = callback._sender.process_ids()  # before any profiler step
        assert callback._sender.wait_ready(300)
        maps = open(f"/proc/{pid}/maps", encoding="utf-8").read()
        assert "libtorch" not in maps  # it imports no torch (hence it starts in about a second)
        assert profile_cycles(callback) == 4 * CYCLES
    finally:
        callback.close()
    assert callback.cycles_read == callback._sender.jobs_sent == CYCLES  # none read in this process
    assert callback.cycles_logged + len(callback.outbox_records) == CYCLES  # each delivered or kept
    assert callback.exit_wait_s is not None  # what the profiler's stop waited


def test_pace_says_how_much_less_often_to_profile(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(pace.time, "monotonic", lambda: now[0])
    clock = pace.Pace()
    for i in range(8):  # a cycle every 7 steps, every 0.1 s: 10 cycles/s in
        clock.arrived(7 * (i + 1))
        now[0] += 0.1
    assert clock.behind(waiting=6) is None  # no delivery timed yet: nothing to compare
    clock.delivered(1, 5.0)  # the first one (it also created the run): not counted
    clock.delivered(2, 1.0)  # 2 cycles/s out
    assert clock.behind(waiting=3) is None  # a short queue is no sign
    said = clock.behind(waiting=6)
    assert "10.0 cycles/s in, 2.0 out" in said
    assert "wait about 3.0 s" in said  # 6 waiting at 2 cycles/s
    assert "a cycle comes every 7 steps" in said and "a cycle every 44 steps" in said  # 7 * 10 / 2 * 1.25
    clock.after_exit = True  # deliver_after_exit: nothing waits at the exit; the helper goes on after it
    said = clock.behind(waiting=6)
    assert "go on delivering them for about 3.0 s after training ends" in said and "exit would wait" not in said
    clock.delivered(32, 1.0)  # now it keeps up: 34 cycles in 2 s of sending
    assert clock.behind(waiting=6) is None


def test_a_slow_server_gets_one_warning_with_the_rates_and_nothing_is_lost(server, tmp_path):
    def slow(index, method, path):
        return Delay(2.0) if path.endswith("/runs/log-batch") else None

    with client_env(), FaultProxy(server.port, slow) as proxy, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MLflowNeuronWarning)
        # max_pending=200: the queue may grow (no cycle goes to the outbox); a batch holds at most 16
        # cycles and its log-batch takes 2 s, so at most ~8 cycles a second go out, and up to ~20 come
        # in (a cycle every 2 steps of at least 20 ms each).
        callback = MLflowProfilerCallback(tracking_uri=proxy.uri, experiment_id="0", outbox=tmp_path / "outbox",
                                          flush_timeout_s=120, max_pending=200)  # fmt: skip
        assert callback._sender.wait_ready(300)  # the rates are the helper's: from its first cycle on
        profile_cycles(callback, steps_per_cycle=2, cycles=100, step_s=0.02)
        callback.close()
    behind = [str(w.message) for w in caught if "arrive faster than they are delivered" in str(w.message)]
    assert len(behind) == 1, ([str(w.message) for w in caught], callback.reporter.counts, callback.cycles_logged,
                              callback._sender.delivery_busy_s)
    assert re.search(r"\d+\.\d cycles/s in, \d+\.\d out", behind[0]) and "schedule(wait=...)" in behind[0]
    kept = len(_outbox.pending(tmp_path / "outbox"))
    assert callback.cycles_logged + kept == callback.cycles_read == 100  # each cycle delivered or kept
