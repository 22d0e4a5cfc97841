"""Real "Self NEURON" device time from a fake PrivateUse1 Kineto profiler compiled for the test.

Each scenario runs in its own interpreter: the backend rename and the profiler registration are
process-wide and irreversible. Together with the `torch_neuronx.profiling` double this is the
Trainium-shaped path end to end: NeuronConfig as experimental_config, NeuronProfiler.export_trace
chained, activities CPU + PrivateUse1, device kernels linked to their ops.
"""

import json

import pytest
from conftest import artifact_files, read_artifact, read_json_artifact, run_python
from mlflow.tracking import MlflowClient

KERNELS = "aten::mul=785,aten::rsqrt=40,aten::add=20"

SCENARIO = """
import json, os, sys, pathlib, warnings
import fake_device
fake_device.activate(pathlib.Path({so!r}))
import mlflow
from torch.profiler import ProfilerActivity
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
config = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir={out!r})
exporter = NeuronProfiler(config)
with mlflow.start_run() as run, warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    callback = MLflowProfilerCallback(exporter.export_trace)
    profile_rmsnorm(callback, steps={steps}, activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                    experimental_config=config)
print(json.dumps({{"run_id": run.info.run_id,
                  "warnings": [str(w.message) for w in caught if "mlflow-neuron" in str(w.message)]}}))
"""


def run_scenario(fake_profiler, tmp_path, mode, steps=4, strict="1"):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = SCENARIO.format(so=str(fake_profiler), uri=uri, out=str(tmp_path / "np"), steps=steps)
    env = {"FAKE_NEURON_KERNELS": KERNELS, "FAKE_NEURON_MODE": mode, "MLFLOW_NEURON_STRICT": strict}
    result = run_python(code, tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    return MlflowClient(uri), outcome


def test_device_time_lands_on_the_launching_ops_and_totals_count_each_kernel_once(fake_profiler, tmp_path):
    client, outcome = run_scenario(fake_profiler, tmp_path, "kernels")
    run = client.get_run(outcome["run_id"])
    metrics, tags = run.data.metrics, run.data.tags
    assert metrics["profiler/self_device_time_us/aten.mul"] == pytest.approx(3 * 785)
    assert metrics["profiler/self_device_time_us/aten.rsqrt"] == pytest.approx(40)
    assert metrics["profiler/self_device_time_us/aten.add"] == pytest.approx(20)
    assert metrics["profiler/calls/aten.mul"] == 3
    assert metrics["profiler/total/self_device_time_us"] == pytest.approx(3 * 785 + 40 + 20)  # not doubled
    assert metrics["profiler/total/unattributed_device_time_us"] == pytest.approx(0)
    assert metrics["profiler/total/aten_calls"] == 6
    assert tags["mlflow_neuron.device"] == "neuron"
    assert tags["mlflow_neuron.device_time"] == "present"
    assert run.data.params["profiler.activities"] == "cpu,neuron"
    assert outcome["warnings"] == []
    # The costliest op by device time comes first in the table, with kernel rows listed apart.
    table = read_json_artifact(client, run.info.run_id, "profiler/step_4/ops.json", tmp_path / "dl")
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert (rows[0]["name"], rows[0]["kind"]) in {("aten::mul", "op"), ("neuron_kernel::aten::mul", "kernel")}
    kernel = next(r for r in rows if r["name"] == "neuron_kernel::aten::mul")
    assert kernel["kind"] == "kernel" and kernel["metric_key"] == ""
    text = read_artifact(client, run.info.run_id, "profiler/step_4/key_averages.txt", tmp_path / "dl").decode()
    assert "Self NEURON" in text
    # The Neuron session's framework trace holds the device kernels.
    files = artifact_files(client, run.info.run_id)
    [trace_path] = [p for p in files if p.endswith("/trace.json")]
    trace = read_json_artifact(client, run.info.run_id, trace_path, tmp_path / "dl")
    assert sum(e.get("cat") == "kernel" for e in trace["traceEvents"]) == 5


def test_runtime_only_events_come_out_as_missing_device_time_with_one_warning(fake_profiler, tmp_path):
    client, outcome = run_scenario(fake_profiler, tmp_path, "runtime", steps=8, strict="0")
    run = client.get_run(outcome["run_id"])
    assert run.data.tags.get("mlflow_neuron.device_time") == "missing", outcome["warnings"]  # none: what it said
    assert run.data.metrics["profiler/total/self_device_time_us"] == 0
    assert len(outcome["warnings"]) == 1  # two cycles, one warning
    assert "synchronize" in outcome["warnings"][0] and "runtime/driver" in outcome["warnings"][0]
    # Runtime/driver events stay host rows; per-op metrics rank by self CPU time instead.
    assert run.data.metrics["profiler/self_cpu_time_us/neuron_runtime.aten.mul"] > 0
    history = client.get_metric_history(run.info.run_id, "profiler/total/active_steps")
    assert [m.step for m in history] == [4, 8]
