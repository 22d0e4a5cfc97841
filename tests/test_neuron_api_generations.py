"""Both TorchNeuron profiling API generations, through the test doubles (docs/neuron.md).

Current: `NeuronConfig` + `NeuronProfiler(config).export_trace` as `on_trace_ready`.
Older: a context-manager `NeuronProfiler(pytorch_activities=..., neuron_output_dir=...)` that
saves `pytorch_trace.json`.
"""

import sys

import mlflow
import pytest
from conftest import artifact_files, read_json_artifact
from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity
from workloads import inputs, profile_rmsnorm, rms_norm_naive

from mlflow_neuron import MLflowProfilerCallback, profiling_setup
from mlflow_neuron._neuron.layout import is_framework_trace
from mlflow_neuron._neuron.torch_neuronx import neuron_settings
from mlflow_neuron.cli import main as cli_main


@pytest.fixture
def older_api(neuron_double, monkeypatch):
    """An install whose `torch_neuronx.profiling` is the older API (no NeuronConfig)."""
    import torch_neuronx.older_profiling as older

    monkeypatch.setitem(sys.modules, "torch_neuronx.profiling", older)
    return older


def test_the_older_profilers_settings_are_read(older_api, tmp_path):
    profiler = older_api.NeuronProfiler(
        pytorch_activities=[ProfilerActivity.CPU], record_shapes=True, neuron_output_dir=str(tmp_path),
        event_filters={"nc": ["0", "4-7"], "types": ["cc_exec_barrier"]},
    )
    assert neuron_settings(profiler) == {
        "neuron_output_dir": str(tmp_path),
        "pytorch_activities": "CPU",
        "pytorch_trace_file": f"{tmp_path}/pytorch_trace.json",
        "record_shapes": "True",
        "event_filters": "nc:0,4-7;types:cc_exec_barrier",
    }
    assert is_framework_trace("out/pytorch_trace.json")


def test_profiling_setup_detects_the_older_api(older_api, tmp_path):
    setup = profiling_setup("neuron", tmp_path / "np")
    assert setup.experimental_config is None and setup.handlers == ()
    assert isinstance(setup.neuron_context, older_api.NeuronProfiler)
    assert setup.neuron_context.neuron_output_dir == setup.output_dir == str(tmp_path / "np")
    assert setup.context() is setup.neuron_context


def test_an_older_api_output_folder_ingests_with_its_pytorch_trace(tracking_uri, strict, older_api, tmp_path):
    out = tmp_path / "output"
    x, weight = inputs()
    with older_api.NeuronProfiler(pytorch_activities=[ProfilerActivity.CPU], neuron_output_dir=str(out)):
        rms_norm_naive(x, weight)
    assert cli_main(["ingest", str(out), "--experiment", "older", "--run-name", "older-api"]) == 0
    client = MlflowClient()
    [run] = client.search_runs([client.get_experiment_by_name("older").experiment_id])
    files = artifact_files(client, run.info.run_id)
    [step_dir] = {p.split("/")[1] for p in files} - {"ranks"}  # profiler/ranks/: the rank summary
    neuron = {p.split("/neuron/", 1)[1] for p in files if "/neuron/" in p}
    assert "pytorch_trace.json" in neuron
    assert any(p.endswith("/7e57_instid_0_vnc_0.ntff") for p in neuron)  # the runtime's session folder below
    manifest = read_json_artifact(client, run.info.run_id, f"profiler/{step_dir}/manifest.json", tmp_path / "dl")
    assert manifest["framework_trace"].endswith("/neuron/pytorch_trace.json")
    [pair] = manifest["neuron_pairs"]
    assert pair["neff"].endswith("/neff_7e57_vnc_0.neff")
    assert run.data.metrics["profiler/total/aten_calls"] > 0


def test_the_current_api_logs_config_fields_and_uploads_cpu_and_host_memory_files(tracking_uri, strict,
                                                                                   neuron_double, tmp_path):
    modes = neuron_double.ProfileMode
    config = neuron_double.NeuronConfig(
        modes=[modes.DEVICE, modes.RUNTIME, modes.CPU_UTIL, modes.HOST_MEMORY], profile_output_dir=str(tmp_path / "o"),
        capture_enabled_for_nc="0,1", neff_cache_dir=str(tmp_path / "neffs"),
    )
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback(neuron_double.NeuronProfiler(config).export_trace)
        profile_rmsnorm(callback, experimental_config=config)
    client = MlflowClient()
    names = {p.rsplit("/", 1)[1] for p in artifact_files(client, run.info.run_id) if "/neuron/" in p}
    assert {"cpu_util.pb", "host_mem.pb"} <= names
    params = client.get_run(run.info.run_id).data.params
    assert params["neuron.modes"] == "CPU_UTIL,DEVICE,HOST_MEMORY,RUNTIME"
    assert params["neuron.capture_enabled_for_nc"] == "0,1"
    assert params["neuron.neff_cache_dir"] == str(tmp_path / "neffs")
    assert params["neuron.precache_node_info"] == "True"


def test_profiling_setup_passes_a_neff_cache_folder_so_that_neffs_are_copied(neuron_double, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    setup = profiling_setup("neuron", tmp_path / "np")
    assert setup.experimental_config.neff_cache_dir == str(tmp_path / "np_neff_cache")  # beside, not inside
    assert profiling_setup("neuron", tmp_path / "np", neff_cache_dir=tmp_path / "mine").experimental_config \
        .neff_cache_dir == str(tmp_path / "mine")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "from_env"))
    assert profiling_setup("neuron", tmp_path / "np").experimental_config.neff_cache_dir == str(tmp_path / "from_env")


def test_with_profiling_setup_a_session_has_its_neff(tracking_uri, strict, neuron_double, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    setup = profiling_setup("neuron", tmp_path / "np")
    with mlflow.start_run():
        profile_rmsnorm(MLflowProfilerCallback(*setup.handlers), experimental_config=setup.experimental_config)
    [session] = setup.handlers[0].__self__.sessions
    assert [p.name for p in session.glob("*.neff")] == ["neff_5eed1e55_vnc_0.neff"]
