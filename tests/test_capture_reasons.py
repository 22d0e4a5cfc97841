"""Why each cycle was captured, where `compare`, `history` and `ranks` name a cycle.

The store is real: runs profiled by the callback into sqlite, one of them on `callback.schedule()`
(a baseline, then a capture when its step goes from 5 to 25 ms), which sets the run tag
`mlflow_neuron.capture_reason.step_<N>` of each cycle it captured. The other runs are profiled on a
`torch.profiler.schedule` of their own and carry no such tag: they print as they always did.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_python
from mlflow.tracking import MlflowClient

from mlflow_neuron._record.model import capture_reasons
from mlflow_neuron._report import render
from mlflow_neuron._report.comparison import compare_runs
from mlflow_neuron.cli import main as cli_main

RUNS = """
import time, mlflow, torch
from torch.profiler import ProfilerActivity, profile, schedule
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
x = torch.randn(16, 64)

def loop(name, make_schedule, steps, step_ms):
    with mlflow.start_run(run_name=name):
        callback = MLflowProfilerCallback(log_timeline=False)
        with profile(activities=[ProfilerActivity.CPU], schedule=make_schedule(callback),
                     on_trace_ready=callback) as prof:
            deadline = time.perf_counter()
            for step in range(steps):  # each step sleeps to its deadline: a late wake-up is no change of step time
                deadline = max(deadline + step_ms(step) / 1000, time.perf_counter())
                (x * 2).sum()
                time.sleep(max(deadline - time.perf_counter(), 0))
                prof.step()
        callback.close(timeout=120)

plain = lambda callback: schedule(wait=1, warmup=1, active=4, repeat=2)
mlflow.set_experiment("plain")
for name in ("first", "second"):
    loop(name, plain, 14, lambda step: 1)
mlflow.set_experiment("mixed")
for name in ("first", "second"):
    loop(name, plain, 14, lambda step: 1)
adaptive = lambda callback: callback.schedule(warmup_steps=2, active_steps=4, window_steps=5, persist_steps=2,
                                              min_change=1.0)
loop("adaptive", adaptive, 150, lambda step: 5 if step < 90 else 25)
print("done")
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reasons")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    result = run_python(RUNS.format(uri=uri), tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    [adaptive] = client.search_runs([client.get_experiment_by_name("mixed").experiment_id],
                                    filter_string="attributes.run_name = 'adaptive'")  # fmt: skip
    prefix = "mlflow_neuron.capture_reason.step_"  # read here as the schedule's tests read it, not by the code tested
    reasons = dict(sorted((int(key[len(prefix):]), why) for key, why in adaptive.data.tags.items()
                          if key.startswith(prefix)))  # fmt: skip
    # the schedule's own promise (tests/test_schedule.py): a baseline first, then the change
    assert list(reasons.values())[0] == "baseline" and len(reasons) >= 2, reasons
    assert any(why.startswith("step time ") for why in reasons.values()), reasons
    return uri, adaptive.info.run_id, reasons


def cli(capsys, *argv) -> str:
    assert cli_main(list(argv)) == 0
    return capsys.readouterr().out


def test_the_tag_gives_each_step_its_reason_and_nothing_else():
    tags = {"mlflow_neuron.capture_reason.step_27": "baseline", "mlflow_neuron.capture_reason.step_9": "x",
            "mlflow_neuron.capture_reason.step_": "no step", "mlflow_neuron.device": "cpu"}  # fmt: skip
    assert capture_reasons(tags) == {9: "x", 27: "baseline"}


def test_compare_names_each_cycle_with_why_it_was_captured(store, capsys):
    uri, run_id, reasons = store
    out = cli(capsys, "compare", "--tracking-uri", uri, "--experiment", "mixed", "--runs", "first", "adaptive",
              "--baseline", "first")  # fmt: skip
    block = out[out.index("why each cycle compared was captured (callback.schedule()):"):].splitlines()[1:]
    assert block[: len(reasons)] == [f"  adaptive profiler/step_{step}: {why}" for step, why in reasons.items()]
    assert "  first profiler/step_" not in out  # the run without tags names no reason
    frame = compare_runs(["first", "adaptive"], "first", experiment="mixed", tracking_uri=uri)
    assert frame.attrs["capture_reasons"] == {"adaptive": reasons}
    last = max(reasons)  # the HTML page names each run's last cycle
    assert f"step {last} (captured: {reasons[last]})" in render.html_page(frame)
    report = json.loads(cli(capsys, "compare", "--tracking-uri", uri, "--experiment", "mixed", "--runs", "first",
                            "adaptive", "--format", "json"))  # fmt: skip
    assert report["capture_reasons"] == {"adaptive": {str(step): why for step, why in reasons.items()}}


def test_compare_of_one_cycle_names_that_cycles_reason_only(store, capsys):
    uri, run_id, reasons = store
    step, why = list(reasons.items())[1]  # the change, not the baseline
    frame = compare_runs([run_id], step=step, tracking_uri=uri)
    assert frame.attrs["capture_reasons"] == {"adaptive": {step: why}}
    assert render.capture_lines(frame) == [f"adaptive profiler/step_{step}: {why}"]


def test_runs_without_the_tag_print_as_before(store, capsys):
    uri, _, _ = store
    out = cli(capsys, "compare", "--tracking-uri", uri, "--experiment", "plain", "--runs", "first", "second")
    assert "captured" not in out
    report = json.loads(cli(capsys, "compare", "--tracking-uri", uri, "--experiment", "plain", "--runs", "first",
                            "second", "--format", "json"))  # fmt: skip
    assert "capture_reasons" not in report
    for format in ("table", "markdown", "json"):
        out = cli(capsys, "history", "--tracking-uri", uri, "--experiment", "plain", "--format", format)
        assert "captured" not in out and "capture_reasons" not in out


def test_history_says_why_each_cycle_of_a_run_was_captured(store, capsys):
    uri, run_id, reasons = store
    out = cli(capsys, "history", "--tracking-uri", uri, "--experiment", "mixed")
    block = out[out.index("why each cycle was captured (callback.schedule()):"):].splitlines()[1:]
    assert block[: len(reasons)] == [f"  adaptive ({run_id[:8]}) profiler/step_{step}: {why}"
                                     for step, why in reasons.items()]  # fmt: skip
    markdown = cli(capsys, "history", "--tracking-uri", uri, "--experiment", "mixed", "--format", "markdown")
    assert f"- adaptive ({run_id[:8]}) profiler/step_{min(reasons)}: baseline" in markdown
    report = json.loads(cli(capsys, "history", "--tracking-uri", uri, "--experiment", "mixed", "--format", "json"))
    assert report["capture_reasons"] == {run_id: {str(step): why for step, why in reasons.items()}}


def test_ranks_says_why_the_cycle_it_reads_was_captured(store, capsys):
    uri, run_id, reasons = store
    step, why = list(reasons.items())[1]
    out = cli(capsys, "ranks", run_id, "--tracking-uri", uri, "--step", str(step))
    assert out.rstrip().splitlines()[-1] == f"profiler/step_{step} captured: {why}"
    everything = cli(capsys, "ranks", run_id, "--tracking-uri", uri)
    assert [f"profiler/step_{s} captured: {w}" for s, w in reasons.items()] == everything.rstrip().splitlines()[-len(reasons):]
