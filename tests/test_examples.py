"""The examples run as users run them, on CPU, into a real sqlite store."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, read_json_artifact
from mlflow.tracking import MlflowClient

from mlflow_neuron import compare_runs

CONTRACT_TOTALS = {
    "profiler/total/self_device_time_us",
    "profiler/total/self_cpu_time_us",
    "profiler/total/aten_calls",
    "profiler/total/active_steps",
}
VARIANTS = ("naive", "fused", "compiled")
PARENT = "mlflow.parentRunId"


def run_example(name, *args, cwd, env=None):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def rmsnorm_twice(tmp_path_factory):
    """The example run twice into one store, as a user reruns it: (tracking URI, parent runs oldest
    first, {parent run id: {variant: child run}}, the two runs' output)."""
    tmp = tmp_path_factory.mktemp("rmsnorm")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:  # no active experiment or run leaked by earlier tests
        for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
            mp.delenv(name, raising=False)
        results = [run_example("rmsnorm_variants.py", "--device", "cpu", "--tracking-uri", uri, cwd=tmp)
                   for _ in range(2)]  # fmt: skip
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("rmsnorm-variants")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if PARENT not in r.data.tags]
    children = {p.info.run_id: {r.info.run_name: r for r in runs if r.data.tags.get(PARENT) == p.info.run_id}
                for p in parents}  # fmt: skip
    return uri, parents, children, results


def test_rmsnorm_variants_leaves_three_child_runs_and_prints_the_table(rmsnorm_twice):
    uri, parents, children, results = rmsnorm_twice
    out = results[-1].stdout
    client = MlflowClient(uri)
    parent = parents[-1]
    runs = children[parent.info.run_id]
    assert set(runs) == set(VARIANTS)
    parent_id = parent.info.run_id
    aten_calls = {}
    for name in VARIANTS:
        run = runs[name]
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        assert CONTRACT_TOTALS <= set(run.data.metrics)
        assert run.data.tags["mlflow_neuron.device"] == "cpu"
        aten_calls[name] = run.data.metrics["profiler/total/aten_calls"]
    # What fusion does to dispatched ATen calls (measured on CPU; see the issue), 5 steps a cycle:
    # the norm's 6, 1 or 0, plus the step's two linears.
    assert aten_calls == {"naive": 40, "fused": 15, "compiled": 10}
    for name in VARIANTS:  # the region, each step's memory, and bytes from the recorded shapes
        metrics = runs[name].data.metrics
        assert metrics["profiler/region_cpu_time_us/rmsnorm"] > 0 and metrics["profiler/step/peak_memory_bytes/cpu"] > 0
    ops = read_json_artifact(client, runs["fused"].info.run_id, "profiler/step_8/ops.json", Path(uri[10:]).parent / "d")
    table = [dict(zip(ops["columns"], row)) for row in ops["data"]]
    rms = next(row for row in table if row["name"] == "aten::rms_norm")
    assert rms["bytes"] == 5 * (2 * 4 * 512 * 2 + 512 * 2) and rms["achieved_gbps"] > 0  # x, y (4x512), weight; bf16; 5 calls
    assert next(row for row in table if row["kind"] == "region")["name"] == "rmsnorm"
    for name in VARIANTS:  # 20 samples: four cycles of 5 steps, profiled in rotation
        steps = client.get_metric_history(runs[name].info.run_id, "profiler/step/self_cpu_time_us")
        assert sorted(p.step for p in steps) == [8 * cycle + step for cycle in range(4) for step in range(3, 8)]
        starts = {runs[other].info.start_time for other in VARIANTS}
        assert max(starts) - min(starts) < 60_000  # created together, not one after another
    description = parent.data.tags["mlflow.note.content"]
    assert "fused vs naive: " in description and "compiled vs naive: " in description
    assert "profiler/calls/aten.mul" in runs["naive"].data.metrics
    assert "profiler/calls/aten._fused_rms_norm" in runs["fused"].data.metrics
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["naive", "fused"])
    assert "fused verdict" in header and "compiled ratio (95% CI)" in header
    assert any(line.split()[:2] == ["region", "rmsnorm"] for line in lines)
    assert any(line.split() == ["launches", "per", "step", "0", "0", "0"] for line in lines)  # CPU: no kernels
    assert any(line.strip().startswith("region rmsnorm: naive ") and "GB/s" in line for line in lines)
    # torch.compile's region runs a compiled graph, whose bytes no formula knows: named, with the reason
    assert any(line.strip().startswith("compiled: none, the bytes of region rmsnorm are unknown") for line in lines)
    assert any(line.startswith("fused vs naive: ") for line in lines)
    assert any(line.startswith("compiled vs naive: ") for line in lines)
    assert f"mlflow ui --backend-store-uri {uri}" in out
    assert "host noise: torch uses 1 CPU thread(s)" in out
    assert f"Parent run {parent.info.run_name} ({parent_id})" in out
    # Kineto's "USDT: ... profiler_start/profiler_stop" markers (4 per variant, on fd 2) are dropped.
    for result in results:
        usdt = [line for line in (result.stdout + result.stderr).splitlines() if "USDT" in line]
        assert not usdt, usdt


def test_rmsnorm_variants_reruns_are_parent_runs_named_apart(rmsnorm_twice):
    uri, parents, children, results = rmsnorm_twice
    names = [p.info.run_name for p in parents]
    assert len(names) == 2 and names[0] != names[1], names
    assert all(re.fullmatch(r"rmsnorm-cpu-\d{8}-\d{6}", name) for name in names), names  # device, start time
    for parent, result in zip(parents, results):  # each run made one parent, named in its output
        assert set(children[parent.info.run_id]) == set(VARIANTS)
        assert f"Parent run {parent.info.run_name} ({parent.info.run_id})" in result.stdout
    # `mlflow-neuron compare --experiment rmsnorm-variants` compares the latest parent's children.
    frame = compare_runs("rmsnorm-variants", baseline="naive", tracking_uri=uri)
    assert frame.attrs["runs"] == {name: run.info.run_id for name, run in children[parents[-1].info.run_id].items()}


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
