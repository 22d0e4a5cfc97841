"""The examples run as users run them, on CPU, into a real sqlite store."""

import os
import subprocess
import sys

from conftest import ROOT
from mlflow.tracking import MlflowClient

CONTRACT_TOTALS = {
    "profiler/total/self_device_time_us",
    "profiler/total/self_cpu_time_us",
    "profiler/total/aten_calls",
    "profiler/total/active_steps",
}


def run_example(name, *args, cwd, env=None):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_rmsnorm_variants_leaves_three_child_runs_and_prints_the_table(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_example("rmsnorm_variants.py", "--device", "cpu", "--tracking-uri", uri, cwd=tmp_path)
    out = result.stdout
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("rmsnorm-variants")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"naive", "fused", "compiled", "rmsnorm-cpu"}
    parent_id = runs["rmsnorm-cpu"].info.run_id
    aten_calls = {}
    for name in ("naive", "fused", "compiled"):
        run = runs[name]
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        assert CONTRACT_TOTALS <= set(run.data.metrics)
        assert run.data.tags["mlflow_neuron.device"] == "cpu"
        aten_calls[name] = run.data.metrics["profiler/total/aten_calls"]
    # What fusion does to dispatched ATen calls (measured on CPU; see the issue), 5 steps a cycle.
    assert aten_calls == {"naive": 30, "fused": 5, "compiled": 0}
    for name in ("naive", "fused", "compiled"):  # 10 samples: two cycles of 5 steps
        steps = client.get_metric_history(runs[name].info.run_id, "profiler/step/self_cpu_time_us")
        assert sorted(p.step for p in steps) == [3, 4, 5, 6, 7, 11, 12, 13, 14, 15]
    description = runs["rmsnorm-cpu"].data.tags["mlflow.note.content"]
    assert "fused vs naive: " in description and "compiled vs naive: " in description
    assert "profiler/calls/aten.mul" in runs["naive"].data.metrics
    assert "profiler/calls/aten._fused_rms_norm" in runs["fused"].data.metrics
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["naive", "fused"])
    assert "fused verdict" in header and "compiled ratio (95% CI)" in header
    assert any(line.split() == ["ATen", "calls", "per", "step", "6", "1", "0"] for line in lines)
    assert any(line.startswith("fused vs naive: ") for line in lines)
    assert any(line.startswith("compiled vs naive: ") for line in lines)
    assert f"mlflow ui --backend-store-uri {uri}" in out
    assert "host noise: torch uses 1 CPU thread(s)" in out
    # Kineto's "USDT: ... profiler_start/profiler_stop" markers (4 per variant, on fd 2) are dropped.
    usdt = [line for line in (out + result.stderr).splitlines() if "USDT" in line]
    assert not usdt, usdt


def test_rmsnorm_variants_rejects_a_device_it_cannot_use_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rmsnorm_variants.py"), "--device", "neuron"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "neuron" in result.stderr.splitlines()[-1]


def test_train_loop_puts_loss_and_three_profiler_cycles_in_one_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_example("train_loop.py", "--device", "cpu", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("train-loop").experiment_id])
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 24
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "profiler/total/active_steps")]
    assert steps == [4, 8, 12]
    assert "profiler/calls/aten.addmm" in run.data.metrics
