"""The run-context plugin: tags from what the machine shows locally, never an error, no torch import.

The entry point itself is tested as MLflow loads it: a subprocess gets a throwaway `*.dist-info`
that declares `mlflow.run_context_provider`, and `mlflow.start_run()` must tag the run.
"""

from __future__ import annotations

import importlib.metadata
import json
import textwrap
import time
import types

import pytest
from conftest import run_python
from mlflow.tracking.context.abstract_context import RunContextProvider

from mlflow_neuron._neuron import run_context as _run_context
from mlflow_neuron._neuron.run_context import PREFIX, NeuronRunContextProvider

ENTRY_POINT = "mlflow_neuron = mlflow_neuron._neuron.run_context:NeuronRunContextProvider"


def test_it_is_an_mlflow_run_context_provider_that_is_always_in_context():
    provider = NeuronRunContextProvider()
    assert isinstance(provider, RunContextProvider)
    assert provider.in_context() is True


def test_tags_name_the_installed_torch_and_the_neuron_core_settings(monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-3")
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "4")
    tags = NeuronRunContextProvider().tags()
    assert tags[PREFIX + "torch_version"] == importlib.metadata.version("torch")
    assert tags[PREFIX + "neuron_rt_visible_cores"] == "0-3"
    assert tags[PREFIX + "neuron_rt_num_cores"] == "4"
    assert all(key.startswith(PREFIX) and isinstance(value, str) for key, value in tags.items())


def test_packages_that_are_not_installed_are_left_out(monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    monkeypatch.delenv("NEURON_RT_NUM_CORES", raising=False)
    tags = NeuronRunContextProvider().tags()
    for tag in ("torch_neuronx_version", "neuronx_cc_version", "libneuronxla_version"):
        name = next(dist for dist, t in _run_context.PACKAGES.items() if t == tag)
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            assert PREFIX + tag not in tags
    assert PREFIX + "neuron_rt_visible_cores" not in tags


def fake_dmi(path, vendor, product):
    path.mkdir()
    (path / "sys_vendor").write_text(vendor + "\n")
    (path / "product_name").write_text(product + "\n")
    return path


@pytest.mark.parametrize(
    ("vendor", "product", "expected"),
    [
        ("Amazon EC2", "trn1.32xlarge", {"ec2_instance_type": "trn1.32xlarge"}),
        ("Amazon EC2", "inf2.xlarge", {"ec2_instance_type": "inf2.xlarge"}),
        ("Amazon EC2", "HVM domU", {}),  # Xen-based instances do not name their type
        ("QEMU", "Standard PC (Q35 + ICH9, 2009)", {}),
    ],
)
def test_the_ec2_instance_type_comes_from_the_dmi_table(tmp_path, vendor, product, expected):
    assert _run_context.ec2_instance_type(fake_dmi(tmp_path / "dmi", vendor, product)) == expected


def test_no_dmi_table_means_no_instance_type(tmp_path):
    assert _run_context.ec2_instance_type(tmp_path / "missing") == {}


class FakeCuda:
    def __init__(self, initialized):
        self.initialized = initialized
        self.asked = []

    def is_initialized(self):
        return self.initialized

    def current_device(self):
        return 0

    def get_device_name(self, index):
        self.asked.append(index)
        return "NVIDIA H200"

    def device_count(self):
        return 8


def test_cuda_devices_are_named_only_when_the_program_initialized_cuda(monkeypatch):
    cuda = FakeCuda(initialized=True)
    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(cuda=cuda))
    tags = NeuronRunContextProvider().tags()
    assert tags[PREFIX + "cuda_device"] == "NVIDIA H200"
    assert tags[PREFIX + "cuda_device_count"] == "8"

    cuda = FakeCuda(initialized=False)
    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert PREFIX + "cuda_device" not in NeuronRunContextProvider().tags()
    assert cuda.asked == []  # asking for a name would have initialized CUDA


def test_this_cpu_build_of_torch_gives_no_cuda_tags():
    assert not any("cuda" in key for key in NeuronRunContextProvider().tags())


def test_a_failing_probe_leaves_out_its_tags_and_keeps_the_others(monkeypatch):
    def broken():
        raise OSError("boom")

    monkeypatch.setattr(_run_context, "ec2_instance_type", broken)
    monkeypatch.setattr(_run_context, "cuda_devices", lambda: 1 / 0)
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "1")
    tags = NeuronRunContextProvider().tags()
    assert tags[PREFIX + "neuron_rt_visible_cores"] == "1"
    assert PREFIX + "torch_version" in tags


def test_tags_are_cheap_enough_for_every_run_start():
    NeuronRunContextProvider().tags()  # the first call reads package metadata and DMI once
    t0 = time.perf_counter()
    for _ in range(100):
        NeuronRunContextProvider().tags()
    assert (time.perf_counter() - t0) / 100 < 0.005


def test_the_module_imports_neither_torch_nor_anything_of_the_neuron_stack(tmp_path):
    # As MLflow loads it (through the package), at every `import mlflow` of a program.
    code = textwrap.dedent(
        """
        import json, sys
        from mlflow_neuron._neuron.run_context import NeuronRunContextProvider
        tags = NeuronRunContextProvider().tags()
        heavy = [m for m in ("torch", "torch_neuronx", "libneuronxla", "neuronxcc") if m in sys.modules]
        print(json.dumps({"tags": tags, "heavy": heavy}))
        """
    )
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    assert out["tags"][PREFIX + "torch_version"] == importlib.metadata.version("torch")


def entry_point_site(tmp_path):
    """A folder that, on sys.path, declares the plugin as an installed mlflow-neuron would."""
    site = tmp_path / "site"
    dist_info = site / "mlflow_neuron_entry_point_test-0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlflow-neuron-entry-point-test\nVersion: 0.0\n")
    (dist_info / "entry_points.txt").write_text(f"[mlflow.run_context_provider]\n{ENTRY_POINT}\n")
    return site


def test_mlflow_start_run_picks_the_plugin_up_through_its_entry_point(tmp_path):
    site = entry_point_site(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(site)!r})
        for leaked in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):  # other tests' state
            os.environ.pop(leaked, None)
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import mlflow  # loads the run context providers' entry points
        failures = [str(w.message) for w in caught if "context provider" in str(w.message)]
        mlflow.set_tracking_uri({uri!r})
        with mlflow.start_run() as run:
            pass
        tags = mlflow.MlflowClient().get_run(run.info.run_id).data.tags
        print(json.dumps({{"tags": tags, "failures": failures}}))
        """
    )
    result = run_python(code, cwd=tmp_path, env={"NEURON_RT_VISIBLE_CORES": "0,1"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["failures"] == []  # MLflow only warns when a plugin fails to load
    tags = out["tags"]
    assert tags[PREFIX + "neuron_rt_visible_cores"] == "0,1"
    assert tags[PREFIX + "torch_version"] == importlib.metadata.version("torch")
    assert "mlflow.user" in tags  # MLflow's own providers still ran


def test_import_mlflow_with_the_plugin_installed_does_not_import_torch(tmp_path):
    site = entry_point_site(tmp_path)
    code = f"import sys; sys.path.insert(0, {str(site)!r}); import mlflow; print('torch' in sys.modules)"
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "False"
