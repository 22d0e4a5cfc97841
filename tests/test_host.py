"""The host during each profiled window: `system/profile/...` at the cycle's step, `host_...` columns.

Real torch.profiler runs into real sqlite stores. The machine running the tests may be busy, so
the CPU numbers are checked against bounds that hold whatever else runs: a hog's own CPU time,
read with psutil inside the window, is a lower bound of what the rest of the host used.
"""

import subprocess
import sys
import time

import mlflow
import pandas as pd
import psutil
import pytest
import torch
from calibration_runs import end_unrelated, unrelated_process
from conftest import profile_offline, read_json_artifact
from mlflow.tracking import MlflowClient
from test_neuron_monitor import install_monitor, stand_in
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule
from workloads import inputs, profile_rmsnorm, rms_norm_naive

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._capture import host
from mlflow_neuron._record.model import HOST_VALUES
from mlflow_neuron.cli import main as cli_main

pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
KEYS = [f"system/profile/{name}" for name in HOST_VALUES]
COLUMNS = [f"host_{name}" for name in HOST_VALUES]
NEURON_KEY = "system/profile/neuron_utilization_percentage"
READY_S = 180  # the helper imports mlflow: seconds on a busy machine
TICKS_S = 0.05  # CPU counters tick at 100 Hz: a few ticks either way
MS = 0.001  # the values are logged to three decimals


def host_metrics(client, run_id) -> dict[str, dict[int, float]]:
    """key -> {step: value} for every system/profile/... metric of the run."""
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith("system/profile/")]
    return {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in keys}


def step_totals(client, run_id, step, tmp_path) -> pd.DataFrame:
    table = read_json_artifact(client, run_id, f"profiler/step_{step}/step_totals.json", tmp_path / f"t{step}")
    return pd.DataFrame(table["data"], columns=table["columns"])


SPIN = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"


@pytest.fixture
def hog():
    """A process outside this one's tree that spins one core for at most 60 s (another user's work:
    a child of this process would be the job's own); killed at the end of the test."""
    process = unrelated_process(SPIN)
    try:
        yield process
    finally:
        end_unrelated(process)


@pytest.fixture
def child_hog():
    """A child of this process that spins one core for at most 60 s; killed at the end of the test."""
    process = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        yield psutil.Process(process.pid)
    finally:
        process.kill()
        process.wait(10)


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def assert_sane(values: dict[str, dict[int, float]], steps: list[int]):
    assert set(values) == set(KEYS)  # no neuron-monitor ran: no utilisation
    for key in KEYS:
        assert sorted(values[key]) == steps, key
    for step in steps:
        cores = values["system/profile/cpu_count"][step]
        assert cores == psutil.cpu_count()
        assert 0 <= values["system/profile/other_cpu_cores"][step] <= cores
        assert values["system/profile/torch_threads"][step] == torch.get_num_threads()
        assert values["system/profile/window_s"][step] > 0
        assert values["system/profile/load_average_1m"][step] >= 0
        assert values["system/profile/cpu_frequency_mhz"][step] > 0


@pytest.mark.parametrize("process", ["inline", "helper"])
def test_each_cycle_logs_the_host_at_its_step_and_in_its_step_totals(tracking_uri, strict, tmp_path, process):
    with mlflow.start_run() as run:
        # A whole budget as long as the start's: at nice 10 beside busy cores the helper crawls, and
        # this test is about what each cycle logs, not how fast (with 10 s, they went to the outbox).
        callback = MLflowProfilerCallback(process=process, flush_timeout_s=READY_S)
        if process == "helper":
            assert callback.start_helper(READY_S), "the helper did not start"
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        callback.close()
    client = MlflowClient()
    values = host_metrics(client, run.info.run_id)
    assert_sane(values, [4, 8])
    for cycle, steps in ((4, [2, 3]), (8, [6, 7])):
        totals = step_totals(client, run.info.run_id, cycle, tmp_path)
        assert totals.step.tolist() == steps
        assert [c for c in totals.columns if c.startswith("host_")] == COLUMNS
        for column, key in zip(COLUMNS, KEYS):
            assert totals[column].tolist() == [values[key][cycle]] * len(steps)  # the cycle's value, every row


def test_background_false_logs_the_host_too(tracking_uri, strict):
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(background=False)
        profile_rmsnorm(callback, steps=4, wait=1, warmup=1, active=2)
        callback.close()
    assert_sane(host_metrics(MlflowClient(), run.info.run_id), [4])


def test_a_window_starts_where_the_profiler_leaves_none(tracking_uri, strict):
    """The second cycle's window holds its warmup and active steps, not the wait step before them,
    nor the reading of the first cycle."""
    x, weight = inputs()
    ended, before, after = [], {}, {}
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(lambda prof: ended.append(time.monotonic()), process="inline")
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                     on_trace_ready=callback) as prof:  # fmt: skip
            for _ in range(8):
                time.sleep(0.3 if prof.current_action == ProfilerAction.NONE else 0.02)  # a long wait step
                rms_norm_naive(x, weight)
                before[prof.step_num + 1] = time.monotonic()
                prof.step()
                after[prof.step_num] = time.monotonic()
            marks = prof.action_map[(ProfilerAction.NONE, ProfilerAction.RECORD)]
        callback.close()
    assert getattr(marks[0], "_mlflow_neuron_mark", False)  # first: before start_trace when warmup=0
    window = host_metrics(MlflowClient(), run.info.run_id)["system/profile/window_s"]
    # It starts inside the step() that enters WARMUP (step 5) and ends when the cycle is read.
    assert after[8] - before[5] + MS >= window[8] >= before[8] - after[5] - MS
    assert window[8] <= ended[1] - before[5] + MS  # without the mark it would hold the 0.3 s wait step
    assert window[4] >= 0.3  # the first profile's first window: from the callback's creation


def test_mark_window_start_starts_the_window_of_a_new_profile(tracking_uri, strict):
    """A helper that opens a profile per cycle marks each window's start just before entering it."""
    x, weight = inputs()
    ended, marked = [], []
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(lambda prof: ended.append(time.monotonic()), process="inline")
        for variant in range(2):
            time.sleep(0.3)  # between the profiles: in no window
            marked.append(time.monotonic())
            callback.mark_window_start()
            with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1),
                         on_trace_ready=callback) as prof:  # fmt: skip
                for _ in range(2):
                    rms_norm_naive(x, weight)
                    prof.step()
        callback.close()
    history = MlflowClient().get_metric_history(run.info.run_id, "system/profile/window_s")
    windows = [m.value for m in sorted(history, key=lambda m: m.timestamp)]  # both at step 2: a profile each
    assert len(windows) == 2
    for window, start, end in zip(windows, marked, ended):
        assert 0 < window <= end - start + MS < 0.3  # without the mark each would hold the 0.3 s pause


def test_a_cpu_hog_counts_as_other_cores_and_this_process_does_not(tracking_uri, strict, hog):
    """Bounds that hold on a busy machine too: the hog's CPU time inside the window is at most what
    other processes used, and this process's own spinning is never counted as other."""
    spun, hogged = {}, {}
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(background=False)
        hog_start, own_start = cpu_s(hog), time.process_time()  # after the window started, at creation
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                     on_trace_ready=callback) as prof:  # fmt: skip
            for step in range(3):
                end = time.monotonic() + 0.2
                while time.monotonic() < end:  # this process spins too: its CPU time is not "other"
                    pass
                if step == 2:  # before the step() that reads the cycle: inside the window
                    hogged[3], spun[3] = cpu_s(hog) - hog_start, time.process_time() - own_start
                prof.step()
        callback.close()
    values = host_metrics(MlflowClient(), run.info.run_id)
    # A window under MIN_SPAN_S is read over a longer span, which holds the window: the bounds are
    # over the span's unclamped seconds.
    span, other = values["system/profile/span_s"][3], values["system/profile/other_cpu_s"][3]
    cores = psutil.cpu_count()
    print(f"span {span:.3f} s, hog {hogged[3]:.3f} s, own {spun[3]:.3f} s, other {other:.3f} s")
    assert hogged[3] > 0.1  # the hog ran during the window
    assert other >= hogged[3] - TICKS_S
    assert other <= cores * span - spun[3] + TICKS_S


def test_the_helper_process_cpu_time_is_neither_other_nor_the_child_processes(child_hog):
    """Samplers over the same window, one told that the hog (a child of this process, as the helper
    is) is its helper: its CPU time is in neither its other-CPU figure nor its child processes',
    where a sampler that reads no children counts it as other and one that reads them as a child's."""
    hog = child_hog
    as_helper = host.HostSampler(None, torch_threads=torch.get_num_threads, helper_pids=lambda: [hog.pid])
    as_child = host.HostSampler(None, torch_threads=torch.get_num_threads)
    no_children = host.HostSampler(None, torch_threads=torch.get_num_threads)
    no_children._children = False
    before = cpu_s(hog)
    as_helper.begin(), as_child.begin(), no_children.begin()
    time.sleep(1.2)  # over MIN_SPAN_S: the window's own figures, no earlier sample in them
    inner = cpu_s(hog) - before
    helper, child, plain = as_helper.end(), as_child.end(), no_children.end()
    outer = cpu_s(hog) - before
    assert inner > 0.1
    assert inner - 3 * TICKS_S <= plain["other_cpu_s"] - helper["other_cpu_s"] <= outer + 3 * TICKS_S
    moved = child["child_processes_cpu_s"] - helper["child_processes_cpu_s"]
    assert inner - 3 * TICKS_S <= moved <= outer + 3 * TICKS_S
    assert abs(child["other_cpu_s"] - helper["other_cpu_s"]) <= 3 * TICKS_S


def tree_cpu_s(root: psutil.Process) -> float:
    return sum(cpu_s(p) for p in [root, *root.children(recursive=True)])


def test_a_child_process_cpu_is_the_jobs_own_and_an_unrelated_process_cpu_is_the_weather(hog):
    """A child of this process that spins, through a child of its own (as a compile worker pool
    does), and an unrelated process that spins, over one window: the tree's CPU is
    `child_processes_cpu_s` and not `other_cpu_s`, the unrelated one's the other way round.
    Bounds that hold on a busy machine: each process's CPU time read with psutil just inside the
    window and just outside it."""
    job = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                            f"{SPIN!r}]); exec({SPIN!r})"])  # fmt: skip
    job_tree, stranger = psutil.Process(job.pid), hog
    try:
        deadline = time.monotonic() + 30
        while len(job_tree.children()) < 1 and time.monotonic() < deadline:  # its own child started
            time.sleep(0.05)
        split = host.HostSampler(None, torch_threads=torch.get_num_threads)
        as_before = host.HostSampler(None, torch_threads=torch.get_num_threads)  # the job's children not read
        as_before._children = False
        outer = tree_cpu_s(job_tree), cpu_s(stranger)
        split.begin(), as_before.begin()
        inner = tree_cpu_s(job_tree), cpu_s(stranger)
        time.sleep(2.0)  # over MIN_SPAN_S: the figures are the window's own (long enough on a busy host)
        inner = [after - before for after, before in zip((tree_cpu_s(job_tree), cpu_s(stranger)), inner)]
        window, plain = split.end(), as_before.end()
        outer = [after - before for after, before in zip((tree_cpu_s(job_tree), cpu_s(stranger)), outer)]
    finally:
        for process in [*job_tree.children(recursive=True), job_tree]:
            process.kill()
        job.wait(10)
    print(f"window {window}, job tree {inner[0]:.3f}-{outer[0]:.3f} s, stranger {inner[1]:.3f}-{outer[1]:.3f} s")
    assert window["reach_back_s"] == 0 and min(inner) > 2 * TICKS_S  # both spun in the window
    assert inner[0] - 2 * TICKS_S <= window["child_processes_cpu_s"] <= outer[0] + 2 * TICKS_S  # not the stranger's
    assert window["child_processes_cpu_cores"] == pytest.approx(window["child_processes_cpu_s"] / window["span_s"],
                                                                abs=2 * MS)  # fmt: skip
    assert window["other_cpu_s"] >= inner[1] - 2 * TICKS_S  # the stranger is the weather
    assert "child_processes_cpu_s" not in plain
    # the same window read as before: the job's children were in other_cpu_s, and now are not
    assert inner[0] - 3 * TICKS_S <= plain["other_cpu_s"] - window["other_cpu_s"] <= outer[0] + 3 * TICKS_S


def test_a_cycle_kept_in_the_outbox_and_synced_carries_the_host(sync_store, dead_server, tmp_path):
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox, cycles=2)
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])
    assert_sane(host_metrics(client, run.info.run_id), [4, 8])
    assert [c for c in step_totals(client, run.info.run_id, 8, tmp_path).columns if c.startswith("host_")] == COLUMNS


def test_sampling_that_fails_is_one_warning_and_the_cycle_is_logged(tracking_uri, monkeypatch):
    def broken():
        raise OSError("/proc/stat is not readable here")

    monkeypatch.setattr(host, "system_busy_seconds", broken)
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="/proc/stat") as caught:
        callback = MLflowProfilerCallback(process="inline", strict=False)
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        callback.close()
    assert sum("could not sample the host" in str(w.message) for w in caught) == 1
    client = MlflowClient()
    values = host_metrics(client, run.info.run_id)
    assert "system/profile/other_cpu_cores" not in values  # the one value that needs /proc/stat
    assert sorted(values["system/profile/window_s"]) == [4, 8]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "profiler/total/active_steps")] == [4, 8]


def test_sampling_that_fails_is_raised_in_strict_mode(tracking_uri, strict, monkeypatch):
    monkeypatch.setattr(host, "cpu_frequency_mhz", lambda: 1 / 0)
    with mlflow.start_run(), pytest.raises(ZeroDivisionError):
        callback = MLflowProfilerCallback(process="inline")
        profile_rmsnorm(callback, steps=4, wait=1, warmup=1, active=2)
    callback.close()


def test_with_neuron_monitor_running_the_window_gets_its_mean_utilization(tracking_uri, strict, tmp_path,
                                                                          monkeypatch):  # fmt: skip
    install_monitor(tmp_path, monkeypatch, stand_in(tmp_path / "config.json"))  # a report every 0.2 s
    x, weight = inputs()
    with mlflow.start_run(log_system_metrics=False) as run:
        callback = MLflowProfilerCallback(system_metrics=True, process="inline")
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                     on_trace_ready=callback) as prof:  # fmt: skip
            for _ in range(3):
                time.sleep(0.5)
                rms_norm_naive(x, weight)
                prof.step()
        callback.close()
    client = MlflowClient()
    values = host_metrics(client, run.info.run_id)
    assert values[NEURON_KEY] == {3: pytest.approx(42.015)}  # the documented report's two cores
    totals = step_totals(client, run.info.run_id, 3, tmp_path)
    assert totals["host_neuron_utilization_percentage"].tolist() == [pytest.approx(42.015)] * 2


def test_a_short_window_reads_other_processes_over_the_second_up_to_its_end_never_into_an_earlier_window():
    """The host's counters tick every 10 ms: a window of a few ms reads them over the last
    MIN_SPAN_S up to its end (as far back as the kept samples go), and says how far before its
    start (`reach_back_s`); never past an earlier window's end, whatever ran in that one (a
    compile) is not this window's weather. A window of a second or more reads itself."""
    sampler = host.HostSampler(None, torch_threads=torch.get_num_threads)
    time.sleep(0.3)  # before the window: the sampler has kept its sample at construction
    sampler.begin()
    short = sampler.end()
    assert short["window_s"] < 0.05 and short["span_s"] >= 0.3
    assert short["reach_back_s"] == pytest.approx(short["span_s"] - short["window_s"], abs=2 * MS)
    time.sleep(0.4)
    for _ in range(3):  # a window's start 0.4 s after the last, which started 0.4 s after the one before
        sampler.begin()
        time.sleep(0.4)
    short = sampler.end()
    assert host.MIN_SPAN_S <= short["span_s"] < host.MIN_SPAN_S + 0.45  # back to a begin() before its own
    time.sleep(0.4)
    sampler.begin()
    after_a_window = sampler.end()  # 0.4 s after the last window's end: no further
    assert 0.4 <= after_a_window["span_s"] < 0.45 and after_a_window["reach_back_s"] < 0.45
    sampler.begin()
    time.sleep(host.MIN_SPAN_S + 0.05)
    long = sampler.end()
    assert long["span_s"] == long["window_s"] >= host.MIN_SPAN_S and long["reach_back_s"] == 0
