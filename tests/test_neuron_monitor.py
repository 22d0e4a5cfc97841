"""Neuron system metrics from a stand-in `neuron-monitor` that prints the documented report shape.

The report values are the examples of the Neuron Monitor User Guide (docs/neuron.md), not
measurements.
"""

import json
import os
import time

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._neuron import monitor as nm

DOCUMENTED_REPORT = {
    "neuron_runtime_data": [{
        "pid": 0, "address": "", "neuron_runtime_tag": "my_app_1", "error": "",
        "report": {
            "neuroncore_counters": {"period": 1.000113182, "error": "", "neuroncores_in_use": {
                "0": {"neuroncore_utilization": 42.01, "flops": 1234567891011,
                      "v3d": {"nc_v3.0": {"neuroncore_utilization": 21.01},
                              "nc_v3.1": {"neuroncore_utilization": 63.01}}},
                "1": {"neuroncore_utilization": 42.02, "flops": 1234567891021},
            }},
            "memory_used": {"period": 1.00001, "error": "", "neuron_runtime_used_bytes": {
                "host": 6997643264, "neuron_device": 12519788544,
                "usage_breakdown": {"host": {"application_memory": 6996594688, "constants": 0,
                                             "dma_buffers": 1048576, "tensors": 0}},
            }},
        },
    }],
    "system_data": {"memory_info": {"period": 1.0, "error": "", "memory_total_bytes": 1, "memory_used_bytes": 1}},
    "instance_info": {"instance_type": "trn1.2xlarge", "error": ""},
    "neuron_hardware_info": {"neuron_device_count": 1, "neuroncore_per_device_count": 2, "error": ""},
}
EXPECTED = {
    "system/neuron/neuroncore_0_utilization_percentage": 42.01,
    "system/neuron/neuroncore_1_utilization_percentage": 42.02,
    "system/neuron/device_memory_used_megabytes": 12519.788544,
    "system/neuron/host_memory_used_megabytes": 6997.643264,
}

STAND_IN = """#!/usr/bin/env python3
import json, sys, time
assert sys.argv[1] == "-c", sys.argv
config = json.load(open(sys.argv[2]))
json.dump(config, open({config_copy!r}, "w"))
period = float(config["period"].rstrip("s"))
report = {report}
print("neuron-monitor starting", flush=True)
while True:
    print(report, flush=True)
    time.sleep(period)
"""


def stand_in(config_copy):
    return STAND_IN.format(config_copy=str(config_copy), report=repr(json.dumps(DOCUMENTED_REPORT)))


def install_monitor(tmp_path, monkeypatch, script):
    bin_dir = tmp_path / "monitor-bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "neuron-monitor"
    tool.write_text(script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    return tool


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def neuron_system_metrics(run_id):
    metrics = MlflowClient().get_run(run_id).data.metrics
    return {k: v for k, v in metrics.items() if "/neuron/" in k and k.startswith("system/")}


def test_the_documented_report_becomes_the_system_metrics():
    assert {f"system/neuron/{k}": v for k, v in nm.sample_of(DOCUMENTED_REPORT).items()} == pytest.approx(EXPECTED)
    assert nm.sample_of({"neuron_runtime_data": [{"error": "runtime gone", "report": {}}]}) == {}


def test_with_mlflow_system_metrics_on_the_run_gets_neuron_metrics_while_profiling(tracking_uri, strict, tmp_path,
                                                                                   monkeypatch):
    config_copy = tmp_path / "config-seen.json"
    install_monitor(tmp_path, monkeypatch, stand_in(config_copy))
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")  # MLflow's own monitor runs too (psutil)
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback()
        profile_rmsnorm(callback)
        assert wait_for(lambda: len(neuron_system_metrics(run.info.run_id)) == 4)
        callback.close()
    assert not callback._system_metrics.running
    metrics = neuron_system_metrics(run.info.run_id)
    print("\n".join(f"{k} = {v:g}" for k, v in sorted(metrics.items())))  # shown with pytest -s
    assert metrics == pytest.approx(EXPECTED)
    history = MlflowClient().get_metric_history(run.info.run_id, "system/neuron/device_memory_used_megabytes")
    assert [m.step for m in history] == list(range(len(history)))
    assert json.loads(config_copy.read_text())["period"] == "0.2s"
    # MLflow's own system metrics are there as well, under the same prefix.
    assert any(k.startswith("system/cpu") for k in MlflowClient().get_run(run.info.run_id).data.metrics)


def test_the_monitor_stops_when_the_run_ends_and_honours_the_node_id(tracking_uri, strict, tmp_path, monkeypatch):
    install_monitor(tmp_path, monkeypatch, stand_in(tmp_path / "c.json"))
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_NODE_ID", "node_3")
    with mlflow.start_run(log_system_metrics=False) as run:
        callback = MLflowProfilerCallback(system_metrics=True)
        process = callback._system_metrics.tool._process
        assert wait_for(lambda: MlflowClient().get_run(run.info.run_id).data.metrics)
    assert wait_for(lambda: process.poll() is not None)  # the run ended: the tool went with it
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    assert "system/node_3/neuron/neuroncore_0_utilization_percentage" in metrics
    callback.close()


def test_a_failing_monitor_is_one_warning_and_training_goes_on(tracking_uri, strict, tmp_path, monkeypatch):
    install_monitor(tmp_path, monkeypatch, "#!/bin/sh\necho 'cannot reach the Neuron driver' >&2\nexit 1\n")
    expected = pytest.warns(MLflowNeuronWarning, match="cannot reach the Neuron driver")
    with mlflow.start_run(log_system_metrics=False) as run, expected as caught:
        callback = MLflowProfilerCallback(system_metrics=True)
        assert wait_for(lambda: not callback._system_metrics.running)
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        callback.close()
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    assert "profiler/total/aten_calls" in MlflowClient().get_run(run.info.run_id).data.metrics


def test_a_monitor_that_ignores_sigterm_cannot_hold_up_close(tracking_uri, strict, tmp_path, monkeypatch):
    install_monitor(tmp_path, monkeypatch, "#!/usr/bin/env python3\nimport signal, time\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    with mlflow.start_run(log_system_metrics=False):
        callback = MLflowProfilerCallback(system_metrics=True)
        process = callback._system_metrics.tool._process
        time.sleep(0.3)
        started = time.monotonic()
        callback.close()
        assert time.monotonic() - started < 8
    assert process.poll() is not None


def test_off_by_default_and_nothing_without_the_tool(tracking_uri, strict, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    install_monitor(tmp_path, monkeypatch, "#!/bin/sh\nsleep 60\n")
    with mlflow.start_run(log_system_metrics=False):
        assert MLflowProfilerCallback()._system_metrics is None
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with mlflow.start_run(log_system_metrics=False):
        assert MLflowProfilerCallback(system_metrics=True)._system_metrics is None
