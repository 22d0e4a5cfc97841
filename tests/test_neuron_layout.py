"""Neuron session files, with the test double of `torch_neuronx.profiling` (documented layout)."""

import os
import time

import mlflow
import pytest
from conftest import artifact_files, read_json_artifact
from mlflow.tracking import MlflowClient
from torch._C._profiler import _ExperimentalConfig
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._neuron.torch_neuronx import neuron_settings

DELIVER_S = 120  # close() waits this long to deliver: beside busy cores the 10 s default can keep a cycle for sync


def neuron_files(files, step):
    prefix = f"profiler/step_{step}/neuron/"
    return {path[len(prefix):]: size for path, size in files.items() if path.startswith(prefix)}


def test_each_cycle_uploads_its_own_session_folder_found_through_the_config(
    tracking_uri, strict, neuron_double, tmp_path
):
    out = tmp_path / "neuron_profile"
    config = neuron_double.NeuronConfig(
        modes=[neuron_double.ProfileMode.DEVICE, neuron_double.ProfileMode.RUNTIME], profile_output_dir=str(out)
    )
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(exporter.export_trace, flush_timeout_s=DELIVER_S)  # no profile_output_dir given
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2, experimental_config=config)
    client = MlflowClient()
    files = artifact_files(client, run.info.run_id)
    first, second = (s.relative_to(out).as_posix() for s in exporter.sessions)
    expected = {"trace.json", "ntrace.pb", "trace_info.pb", "neff_5eed1e55_vnc_0.neff",
                "profile_nc_0_session_0.ntff", "profile_nc_1_session_0.ntff"}
    assert set(neuron_files(files, 4)) == {f"{first}/{name}" for name in expected}
    assert {p.rsplit("/", 1)[0] for p in neuron_files(files, 8)} == {second}
    assert neuron_files(files, 4)[f"{first}/profile_nc_1_session_0.ntff"] == 0  # idle core: empty NTFF
    # The framework trace came with the session, so no separate trace.json.gz.
    assert "profiler/step_4/trace.json.gz" not in files
    manifest = read_json_artifact(client, run.info.run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    assert manifest["framework_trace"] == f"profiler/step_4/neuron/{first}/trace.json"
    assert manifest["profile_output_dir"] == str(out)
    params = client.get_run(run.info.run_id).data.params
    assert params["neuron.modes"] == "DEVICE,RUNTIME"
    assert params["neuron.max_events_per_nc"] == "1000000"
    assert params["neuron.profile_output_dir"] == str(out)


def test_files_over_the_size_cap_are_listed_not_uploaded(tracking_uri, strict, neuron_double, tmp_path, monkeypatch):
    monkeypatch.setattr(neuron_double, "NTFF_BYTES", 10_000)
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(neuron_double.NeuronProfiler(config).export_trace, max_file_bytes=5_000)
        profile_rmsnorm(callback, experimental_config=config)
    client = MlflowClient()
    uploaded = neuron_files(artifact_files(client, run.info.run_id), 4)
    assert not any(p.endswith("profile_nc_0_session_0.ntff") for p in uploaded)
    assert any(p.endswith(".neff") for p in uploaded)
    manifest = read_json_artifact(client, run.info.run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    big = next(f for f in manifest["files"] if f["artifact_path"].endswith("profile_nc_0_session_0.ntff"))
    assert big == {**big, "size_bytes": 10_000, "uploaded": False, "reason": "over_size_cap"}
    assert os.path.isfile(big["source"])  # the user still has it where the profiler put it


def test_the_rank_named_framework_trace_is_recognised(tracking_uri, strict, neuron_double, tmp_path, monkeypatch):
    monkeypatch.setattr(neuron_double, "FRAMEWORK_TRACE_NAME", "neuron_framework_trace_rank_0.json")
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(neuron_double.NeuronProfiler(config).export_trace), experimental_config=config)
    client = MlflowClient()
    files = artifact_files(client, run.info.run_id)
    assert "profiler/step_4/trace.json.gz" not in files
    assert any(p.endswith("/neuron_framework_trace_rank_0.json") for p in files)


def test_symlinks_are_listed_never_followed_and_other_processes_are_left_alone(
    tracking_uri, strict, neuron_double, tmp_path
):
    out = tmp_path / "out"
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not a profile")
    config = neuron_double.NeuronConfig(profile_output_dir=str(out))
    exporter = neuron_double.NeuronProfiler(config)

    def other_rank_and_a_link(prof):
        other = out / "i-0other_pid_999999" / "20261129_000000_0000"
        other.mkdir(parents=True)
        (other / "trace.json").write_text("{}")
        os.symlink(secret, out / "looks_like.ntff")
        os.symlink(secret.parent, out / "linked_dir")

    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(exporter.export_trace, other_rank_and_a_link, flush_timeout_s=DELIVER_S)
        profile_rmsnorm(callback, experimental_config=config)
    client = MlflowClient()
    uploaded = neuron_files(artifact_files(client, run.info.run_id), 4)
    assert not any("pid_999999" in p or "looks_like" in p or "secret" in p for p in uploaded)
    manifest = read_json_artifact(client, run.info.run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    reasons = {f["artifact_path"]: f["reason"] for f in manifest["files"] if not f["uploaded"]}
    assert reasons == {"profiler/step_4/neuron/looks_like.ntff": "symlink_not_followed",
                       "profiler/step_4/neuron/linked_dir": "symlink_not_followed"}
    assert not any("pid_999999" in f["artifact_path"] for f in manifest["files"])


def test_files_older_than_the_callback_are_not_this_runs(tracking_uri, strict, neuron_double, tmp_path):
    out = tmp_path / "out"
    old = out / f"i-0old_pid_{os.getpid()}" / "20200101_000000_0000"
    old.mkdir(parents=True)
    (old / "trace.json").write_text("{}")
    an_hour_ago = time.time() - 3600
    os.utime(old / "trace.json", (an_hour_ago, an_hour_ago))
    config = neuron_double.NeuronConfig(profile_output_dir=str(out))
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(neuron_double.NeuronProfiler(config).export_trace), experimental_config=config)
    uploaded = neuron_files(artifact_files(MlflowClient(), run.info.run_id), 4)
    assert uploaded and not any("i-0old" in p for p in uploaded)


def test_a_missing_output_folder_is_reported_once_and_the_rest_is_logged(tracking_uri, tmp_path):
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="does not exist") as caught:
        callback = MLflowProfilerCallback(profile_output_dir=tmp_path / "nowhere")
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    files = artifact_files(MlflowClient(), run.info.run_id)
    assert {"profiler/step_4/trace.json.gz", "profiler/step_8/ops.json"} <= set(files)


def test_settings_of_the_earlier_custom_profiler_config_form_are_read():
    config = _ExperimentalConfig(
        custom_profiler_config="profile_output_dir:/data/np;max_events_per_nc:500;capture_enabled_for_nc:0,1"
    )
    assert neuron_settings(config) == {
        "profile_output_dir": "/data/np", "max_events_per_nc": "500", "capture_enabled_for_nc": "0,1"
    }
    assert neuron_settings(_ExperimentalConfig()) == {}


def test_a_system_only_session_is_uploaded_in_explorers_layout_and_named_as_a_session(tracking_uri, strict,
                                                                                       neuron_double, tmp_path):
    out = tmp_path / "out"
    config = neuron_double.NeuronConfig(modes=[neuron_double.ProfileMode.RUNTIME], profile_output_dir=str(out))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, flush_timeout_s=DELIVER_S), experimental_config=config)
    client = MlflowClient()
    session = exporter.sessions[0].relative_to(out).as_posix()
    assert set(neuron_files(artifact_files(client, run.info.run_id), 4)) == {
        f"{session}/{name}" for name in ("trace.json", "ntrace.pb", "trace_info.pb")}
    manifest = read_json_artifact(client, run.info.run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    assert manifest["neuron_pairs"] == []
    assert manifest["neuron_sessions"] == [{"artifact_path": f"profiler/step_4/neuron/{session}",
                                            "view_command": f"neuron-explorer view -d {session}"}]
