"""Comparison, the CI gate and the rendered reports: pure frames, then real runs in a sqlite store."""

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import artifact_files
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import compare, compare_runs, regressions, render
from mlflow_neuron._compare import TOTAL, RunProfile
from mlflow_neuron.cli import main as cli_main


def profile_of(label, times, device_time="present", total=None, aten_calls=3):
    ops = pd.DataFrame({
        "name": list(times), "kind": ["op"] * len(times), "calls": [2] * len(times),
        "self_device_time_us": list(times.values()), "self_cpu_time_us": [v / 10 for v in times.values()],
    })  # fmt: skip
    totals = {"self_device_time_us": total or sum(times.values()), "self_cpu_time_us": (total or sum(times.values())) / 10,
              "aten_calls": aten_calls}  # fmt: skip
    return RunProfile(label, f"id-{label}", 4, ops, totals, "neuron", device_time)


def test_per_op_time_delta_speedup_and_share_against_the_baseline():
    frame = compare([profile_of("naive", {"aten::mul": 2355.0, "aten::add": 45.0}),
                     profile_of("fused", {"aten::rms_norm": 1400.0})], baseline="naive")
    assert frame.attrs["metric"] == "self_device_time_us" and frame.attrs["fallback"] is None
    assert list(frame.index) == ["aten::mul", "aten::rms_norm", "aten::add", TOTAL]
    assert frame.loc["aten::mul", ("naive", "share")] == pytest.approx(2355 / 2400)
    assert frame.loc[TOTAL, ("fused", "delta_us")] == pytest.approx(1400 - 2400)
    assert frame.loc[TOTAL, ("fused", "speedup")] == pytest.approx(2400 / 1400)
    assert np.isnan(frame.loc["aten::mul", ("fused", "time_us")])
    assert frame.attrs["aten_calls"] == {"naive": 3, "fused": 3}


def test_a_run_without_device_time_switches_every_run_to_cpu_time_and_says_so():
    frame = compare([profile_of("a", {"x": 100.0}), profile_of("b", {"x": 50.0}, device_time="missing")])
    assert frame.attrs["metric"] == "self_cpu_time_us"
    assert "no device time in b" in frame.attrs["fallback"]
    assert frame.loc["x", ("a", "time_us")] == 10.0  # CPU numbers for both runs, never mixed


def test_the_gate_names_the_ops_and_total_that_regressed():
    frame = compare([profile_of("base", {"x": 100.0, "y": 10.0}), profile_of("new", {"x": 130.0, "y": 10.5})])
    slower = regressions(frame, 20)
    assert {(r.run, r.op) for r in slower} == {("new", "x"), ("new", TOTAL)}
    assert regressions(frame, 50) == []
    assert {(r.run, r.op) for r in regressions(frame, 20, min_us=200)} == {("new", TOTAL)}


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="metric must be one of"):
        compare([profile_of("a", {"x": 1.0})], metric="wall_time")
    with pytest.raises(ValueError, match="baseline 'zzz' is not among"):
        compare([profile_of("a", {"x": 1.0})], baseline="zzz")


def test_renderings_are_self_contained(tmp_path):
    frame = compare([profile_of("naive", {"aten::mul": 2355.0}), profile_of("fused", {"aten::rms_norm": 1400.0})])
    assert "speedup vs naive" in render.text(frame) and "| `aten::mul` |" in render.markdown(frame)
    assert json.loads(render.as_json(frame))["baseline"] == "naive"
    assert "naive/time_us" in render.csv(frame).splitlines()[0]
    chart = render.png(frame, tmp_path / "c.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = render.html_page(frame, chart)
    assert "data:image/png;base64," in page
    assert "src=\"http" not in page and "href=" not in page and "<script" not in page


# -- real runs ------------------------------------------------------------------------------------


@pytest.fixture
def variants(tracking_uri):
    """Three profiled runs under a parent, the way the example logs them, plus a slow one apart."""
    from mlflow_neuron import MLflowProfilerCallback

    experiment_id = mlflow.create_experiment("variants")
    mlflow.set_experiment(experiment_id=experiment_id)
    ids = {}
    with mlflow.start_run(run_name="parent") as parent:
        for name in ("base", "again"):
            with mlflow.start_run(run_name=name, nested=True) as run:
                profile_rmsnorm(MLflowProfilerCallback(strict=True))
                ids[name] = run.info.run_id
    with mlflow.start_run(run_name="slow") as run:
        from workloads import rms_norm_naive
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        x, w = torch.randn(64, 65536), torch.ones(65536)
        callback = MLflowProfilerCallback(strict=True)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=2, warmup=1, active=1),
                     on_trace_ready=callback) as prof:
            for _ in range(4):
                rms_norm_naive(x, w)
                prof.step()
        ids["slow"] = run.info.run_id
    ids["parent"] = parent.info.run_id
    return ids


def test_runs_are_found_by_experiment_parent_name_and_id(variants):
    by_experiment = compare_runs("variants")
    assert list(by_experiment.attrs["runs"]) == ["base", "again"]  # the latest parent's children
    by_parent = compare_runs(["parent"], experiment="variants")
    assert by_parent.attrs["runs"] == by_experiment.attrs["runs"]
    by_mixed = compare_runs([variants["slow"], "base"], baseline="base", experiment="variants")
    assert list(by_mixed.attrs["runs"]) == ["slow", "base"] and by_mixed.attrs["baseline"] == "base"
    assert by_mixed.attrs["metric"] == "self_cpu_time_us" and "aten::mul" in by_mixed.index


def test_the_cli_gate_trips_on_a_real_regression_and_passes_otherwise(variants, capsys):
    slower = ["compare", "--experiment", "variants", "--runs", "base", "slow", "--baseline", "base"]
    assert cli_main([*slower, "--fail-if-slower", "50"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION slow: aten::mul" in out and f"REGRESSION slow: {TOTAL}" in out
    assert cli_main([*slower[:-1], "slow", "--fail-if-slower", "50", "--min-time-us", "50"]) == 0
    assert "no op or total is more than 50.0% slower than slow" in capsys.readouterr().out
    assert cli_main(["compare", "--experiment", "variants", "--runs", "nobody"]) == 2
    assert "no run named 'nobody'" in capsys.readouterr().err


def test_formats_and_log_to_attach_table_png_and_html(variants, capsys, tmp_path):
    assert cli_main(["compare", "--experiment", "variants", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("op,base/time_us")
    assert cli_main(["compare", "--experiment", "variants", "--format", "json", "--log-to", variants["parent"]]) == 0
    assert json.loads(capsys.readouterr().out.split("\nattached")[0])["baseline"] == "base"
    client = MlflowClient()
    files = artifact_files(client, variants["parent"], "comparison")
    assert set(files) == {"comparison/ops.json", "comparison/comparison.png", "comparison/report.html"}
    tables = json.loads(client.get_run(variants["parent"]).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "comparison/ops.json", "type": "table"} in tables
    # Attaching again replaces the comparison instead of appending rows to it.
    assert cli_main(["compare", "--experiment", "variants", "--log-to", variants["parent"]]) == 0
    table = json.loads(open(client.download_artifacts(variants["parent"], "comparison/ops.json", str(tmp_path))).read())
    assert len(table["data"]) == len({row[0] for row in table["data"]})


def test_model_versions_carry_idempotent_performance_annotations(variants, capsys):
    from mlflow_neuron import annotate_model_version

    client = MlflowClient()
    client.create_registered_model("rmsnorm")
    v1 = client.create_model_version("rmsnorm", f"runs:/{variants['base']}/model", run_id=variants["base"],
                                      description="My notes about v1.")
    v2 = client.create_model_version("rmsnorm", f"runs:/{variants['slow']}/model", run_id=variants["slow"])
    tags = annotate_model_version("rmsnorm", v1.version, variants["base"])
    assert tags["perf.device"] == "cpu" and tags["perf.aten_calls"] == "6"
    assert tags["perf.profile_run_id"] == variants["base"] and tags["perf.torch_version"].startswith("2.")
    assert float(tags["perf.total_self_cpu_time_us"]) > 0 and tags["perf.top_op"]
    first = client.get_model_version("rmsnorm", v1.version)
    assert first.description.startswith("My notes about v1.") and "| op | self_cpu_time_us | calls |" in first.description
    assert cli_main(["annotate", "--model", "rmsnorm", "--version", str(v1.version), "--run", variants["base"]]) == 0
    assert "perf.aten_calls = 6" in capsys.readouterr().out
    again = client.get_model_version("rmsnorm", v1.version)
    assert again.description == first.description and again.tags == first.tags
    # compare accepts the runs behind two versions
    frame = compare_runs([f"models:/rmsnorm/{v1.version}", f"models:/rmsnorm/{v2.version}"])
    assert list(frame.attrs["runs"].values()) == [variants["base"], variants["slow"]]


def test_the_description_stays_under_the_backend_limit():
    from mlflow_neuron._registry import BEGIN, END, with_block

    block = "\n".join([BEGIN, "title", "", "| op | t | calls |", "|---|---:|---:|"] + [f"| `op{i}` | 1 | 1 |" for i in range(500)] + [END])
    text = with_block("u" * 4000, block)
    assert len(text) <= 5000 and text.startswith("u" * 4000) and text.endswith(END)
    assert with_block(text, block) == text  # replaces its own block, never stacks a second one
