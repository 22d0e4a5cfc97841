"""The callback with a real torch.profiler on CPU and a real MLflow store (sqlite)."""

import gzip
import json
import socket
import threading
import warnings

import mlflow
import pytest
from conftest import artifact_files, read_artifact, read_json_artifact, run_python
from mlflow.tracking import MlflowClient
from torch.profiler import tensorboard_trace_handler
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._record import node_file as node_file_format
from mlflow_neuron._record.model import node_file


def metric_steps(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_a_cycle_becomes_metrics_tags_params_and_artifacts(tracking_uri, strict, tmp_path):
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback()
        assert profile_rmsnorm(callback) == 4
    client = MlflowClient()
    data = client.get_run(run.info.run_id).data
    assert callback.run_id == run.info.run_id
    # schedule(wait=2, warmup=1, active=1): one cycle, logged at prof.step_num == 4.
    assert metric_steps(client, run.info.run_id, "profiler/calls/aten.mul") == [(4, 3.0)]
    assert data.metrics["profiler/total/aten_calls"] == 6
    assert data.metrics["profiler/total/active_steps"] == 1
    assert data.metrics["profiler/self_cpu_time_us/aten.mul"] > 0
    assert data.metrics["profiler/total/self_cpu_time_us"] >= data.metrics["profiler/self_cpu_time_us/aten.mul"]
    assert data.metrics["profiler/total/self_device_time_us"] == 0
    # Microseconds to the nanosecond, the profiler's resolution: no float noise (452.36899999999986).
    steps = [m.value for m in client.get_metric_history(run.info.run_id, "profiler/step/self_cpu_time_us")]
    for value in [*data.metrics.values(), *steps]:
        assert value == round(value, 3) and len(repr(value).partition(".")[2]) <= 3, value
    assert data.tags["mlflow_neuron.device_time"] == "not_profiled"
    assert data.params["profiler.schedule.wait"] == "2"
    assert data.params["profiler.schedule.active"] == "1"
    assert data.params["profiler.activities"] == "cpu"
    assert data.params["profiler.record_shapes"] == "False"
    assert data.params["versions.torch"].startswith("2.")
    assert "versions.mlflow" in data.params

    files = artifact_files(client, run.info.run_id)
    assert set(files) == {f"profiler/step_4/{name}" for name in
                          ("ops.json", "steps.json", "step_totals.json", "key_averages.txt", "manifest.json",
                           "trace.json.gz", "timeline.json")} | {node_file(socket.gethostname(), 4, 0)}
    # One process is one rank: its summary, in its node's file, says so, and names the host.
    [ranks], _ = node_file_format.read(client.download_artifacts(run.info.run_id, node_file(socket.gethostname(), 4, 0),
                                                                 str(tmp_path / "dl")))  # fmt: skip
    assert (ranks["rank"], ranks["world_size"], ranks["cycle_step"]) == (0, 1, 4) and ranks["host"]
    assert [s["step"] for s in ranks["steps"]] == [3]
    table = read_json_artifact(client, run.info.run_id, "profiler/step_4/ops.json", tmp_path / "dl")
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    mul = next(r for r in rows if r["name"] == "aten::mul")
    assert mul["metric_key"] == "aten.mul" and mul["calls"] == 3
    # The UI finds tables through this tag, as log_table sets it.
    assert json.loads(data.tags["mlflow.loggedArtifacts"]) == [{"path": "profiler/step_4/ops.json", "type": "table"}]
    assert "aten::mul" in read_artifact(client, run.info.run_id, "profiler/step_4/key_averages.txt", tmp_path / "dl").decode()
    trace = json.loads(gzip.decompress(read_artifact(client, run.info.run_id, "profiler/step_4/trace.json.gz", tmp_path / "dl")))
    assert any(e.get("name") == "aten::mul" for e in trace["traceEvents"])


def test_a_repeating_schedule_logs_each_cycle_at_its_step(tracking_uri, strict):
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback()
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
    client = MlflowClient()
    assert callback.cycles_logged == 2
    assert metric_steps(client, run.info.run_id, "profiler/total/active_steps") == [(4, 2.0), (8, 2.0)]
    assert metric_steps(client, run.info.run_id, "profiler/calls/aten.mul") == [(4, 6.0), (8, 6.0)]
    files = artifact_files(client, run.info.run_id)
    assert {"profiler/step_4/trace.json.gz", "profiler/step_8/trace.json.gz"} <= set(files)
    tables = json.loads(client.get_run(run.info.run_id).data.tags["mlflow.loggedArtifacts"])
    assert [t["path"] for t in tables] == ["profiler/step_4/ops.json", "profiler/step_8/ops.json"]


def test_acc_events_profiles_log_each_cycle_not_the_running_sum(tracking_uri, strict):
    with mlflow.start_run() as run, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        profile_rmsnorm(MLflowProfilerCallback(), steps=8, wait=1, warmup=1, active=2, acc_events=True)
    history = metric_steps(MlflowClient(), run.info.run_id, "profiler/calls/aten.mul")
    assert history == [(4, 6.0), (8, 6.0)]


def test_handlers_run_first_in_order_and_their_trace_is_reused(tracking_uri, strict, tmp_path):
    calls = []
    tensorboard_dir = tmp_path / "tb"
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(
            lambda prof: calls.append(("first", prof.step_num)),
            tensorboard_trace_handler(str(tensorboard_dir)),
            lambda prof: calls.append(("last", prof.step_num)),
        )
        profile_rmsnorm(callback)
    assert calls == [("first", 4), ("last", 4)]
    exported = list(tensorboard_dir.glob("*.pt.trace.json"))
    assert len(exported) == 1
    client = MlflowClient()
    logged = read_artifact(client, run.info.run_id, "profiler/step_4/trace.json.gz", tmp_path / "dl")
    assert gzip.decompress(logged) == exported[0].read_bytes()
    manifest = read_json_artifact(client, run.info.run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    assert manifest["framework_trace"] == str(exported[0])


def test_a_failing_handler_is_reported_once_and_the_cycle_still_logs(tracking_uri):
    def broken(prof):
        raise RuntimeError("exporter exploded")

    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning) as caught:
        callback = MLflowProfilerCallback(broken)
        assert profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2) == 8
    messages = [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning)]
    assert len(messages) == 1 and "exporter exploded" in messages[0]
    assert callback.reporter.counts == {f"handler:{broken.__qualname__}": 2}
    history = metric_steps(MlflowClient(), run.info.run_id, "profiler/total/aten_calls")
    assert [step for step, _ in history] == [4, 8]


def test_an_mlflow_failure_never_reaches_the_training_loop(tracking_uri, tmp_path):
    # No such run. Both cycles go through the helper, as with the defaults on an idle machine: beside
    # busy cores a helper not up at the stop leaves them to the training process, whose summary
    # comes at close(), not at the stop.
    callback = MLflowProfilerCallback(run_id="0123456789abcdef0123456789abcdef", retry_wait_s=0.01, flush_timeout_s=120)
    assert callback.start_helper(180), "the helper did not start"
    with pytest.warns(MLflowNeuronWarning, match=r"profiler step 4 was refused .*\(RESOURCE_DOES_NOT_EXIST") as caught:
        assert profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2) == 8
    # One warning for the refusal, one summing both up when the helper closes at the profiler's stop.
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 2
    # A run that does not exist is a refusal no retry can change: set aside, not retried.
    assert callback.cycles_logged == 0 and callback.reporter.counts == {"rejected": 2, "rejected_summary": 1}
    assert callback.outbox_records == []
    assert [p.parent for p in callback._producer.rejected] == [tmp_path / "mlflow-neuron-outbox" / "rejected"] * 2


def test_strict_mode_raises_out_of_the_step(tmp_path):
    code = f"""
import mlflow, sys
sys.path.insert(0, {str(tmp_path)!r})
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
mlflow.set_tracking_uri("sqlite:///{tmp_path}/mlflow.db")
def broken(prof):
    raise RuntimeError("exporter exploded")
try:
    profile_rmsnorm(MLflowProfilerCallback(broken), steps=4)
except RuntimeError as error:
    print("raised:", error)
"""
    result = run_python(code, tmp_path, env={"MLFLOW_NEURON_STRICT": "1"})
    assert "raised: exporter exploded" in result.stdout, result.stderr[-2000:]


def test_without_an_active_run_the_callback_owns_a_run_that_close_ends(tracking_uri, strict):
    experiment_id = mlflow.create_experiment("own-run")
    with MLflowProfilerCallback(experiment_id=experiment_id, run_name="profiled") as callback:
        profile_rmsnorm(callback)
        assert MlflowClient().get_run(callback.run_id).info.status == "RUNNING"
    run = MlflowClient().get_run(callback.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "profiled"
    assert run.info.experiment_id == experiment_id


def test_an_explicit_run_id_is_honoured_from_another_thread(tracking_uri, strict):
    experiment_id = mlflow.create_experiment("threads")
    run_id = MlflowClient().create_run(experiment_id).info.run_id
    callback = MLflowProfilerCallback(run_id=run_id)
    worker = threading.Thread(target=profile_rmsnorm, args=(callback,))
    worker.start()
    worker.join()
    runs = MlflowClient().search_runs([experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # no run opened behind our back
    assert runs[0].data.metrics["profiler/total/aten_calls"] == 6


def test_top_k_bounds_the_metric_keys_but_the_table_keeps_every_op(tracking_uri, strict, tmp_path):
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(top_k=2))
    client = MlflowClient()
    metrics = client.get_run(run.info.run_id).data.metrics
    assert len([k for k in metrics if k.startswith("profiler/calls/")]) == 2
    table = read_json_artifact(client, run.info.run_id, "profiler/step_4/ops.json", tmp_path / "dl")
    assert len(table["data"]) > 2


def test_a_second_profiler_with_other_settings_keeps_the_first_params(tracking_uri):
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(strict=True))
        with pytest.warns(MLflowNeuronWarning, match="already has other profiler params"):
            profile_rmsnorm(MLflowProfilerCallback(), steps=5, wait=3)
    params = MlflowClient().get_run(run.info.run_id).data.params
    assert params["profiler.schedule.wait"] == "2"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": -1}, "top_k must be an int >= 0"),
        ({"top_k": "50"}, "top_k must be an int >= 0"),
        ({"max_file_bytes": -5}, "max_file_bytes must be an int >= 0"),
        ({"profile_output_dir": 3}, "profile_output_dir must be a path"),
        ({"flush_timeout_s": -1}, "flush_timeout_s must be a number of seconds >= 0"),
        ({"flush_timeout_s": "10"}, "flush_timeout_s must be a number of seconds >= 0"),
        ({"flush_timeout_s": float("nan")}, "flush_timeout_s must be a number of seconds >= 0"),
        ({"retry_wait_s": -0.5}, "retry_wait_s must be a number of seconds >= 0"),
    ],
)
def test_bad_settings_are_rejected_when_constructed(kwargs, message, tracking_uri):
    with pytest.raises((ValueError, TypeError), match=message):
        MLflowProfilerCallback(**kwargs)


def test_a_handler_that_is_not_callable_is_rejected(tracking_uri):
    with pytest.raises(TypeError, match="handlers must be callables"):
        MLflowProfilerCallback("not a handler")


def test_the_trace_is_exported_even_after_a_handler_used_kinetos_one_save(tracking_uri, strict, tmp_path):
    def export_and_discard(prof):
        path = tmp_path / "gone.json"
        prof.export_chrome_trace(str(path))
        path.unlink()

    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(export_and_discard))
    client = MlflowClient()
    trace = json.loads(gzip.decompress(read_artifact(client, run.info.run_id, "profiler/step_4/trace.json.gz", tmp_path / "dl")))
    assert any(e.get("name") == "aten::mul" for e in trace["traceEvents"])


def test_importing_the_callback_loads_neither_matplotlib_nor_the_comparison_code(tmp_path):
    code = ("import sys\nfrom mlflow_neuron import MLflowProfilerCallback\n"
            "loaded = [m for m in sys.modules if m.startswith(('matplotlib', 'mlflow_neuron._analysis', "
            "'mlflow_neuron._readback', 'mlflow_neuron._report'))]\n"
            "assert not loaded, loaded\n"
            "assert 'mlflow_neuron._capture.callback' in sys.modules\n")  # fmt: skip
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
