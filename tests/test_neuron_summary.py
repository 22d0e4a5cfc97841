"""Neuron Explorer summaries in every documented shape, read into metrics (docs/neuron.md).

Stand-in values: `PUBLISHED` is a trimmed trn2 `summary-json` node published in public test code
(see docs/neuron.md); `QUIET` is that node with two fields lowered, as the same public test does.
Neither is a measurement of this project's workloads.
"""

import json
import os

import mlflow
import pytest
from conftest import read_json_artifact
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._record.record import summary_metrics
from mlflow_neuron._neuron import summary as ns
from mlflow_neuron._neuron.processed import read_processed

from doubles import neuron_explorer as stand_in
from doubles.neuron_explorer import METADATA, SHAPE_2_34, write_tables

PUBLISHED = {
    "tensor_engine_active_time_percent": 0.110,
    "tensor_engine_instruction_count": 55,
    "scalar_engine_active_time_percent": 0.383,
    "scalar_engine_instruction_count": 94,
    "gpsimd_engine_active_time_percent": 0.563,
    "dma_active_time_percent": 0.476,
    "dynamic_dma_active_time_percent": 0.457,
    "mfu_estimated_percent": 0.0,
    "mbu_estimated_percent": 0.184,
}
QUIET = {**PUBLISHED, "dma_active_time_percent": 0.01, "tensor_engine_active_time_percent": 0.01}
LOG_LINES = "INFO loading profile\nWARNING some cores have empty traces {not json\n"


def published_percent(node):
    return {k: (v * 100 if k.endswith("_percent") else float(v)) for k, v in node.items()}


def test_one_model_is_keyed_by_model_and_also_as_before():
    models = ns.parse_summary_json(json.dumps({"n_5eed": PUBLISHED}))
    metrics = summary_metrics(models, "neuron/summary")
    expected = published_percent(PUBLISHED)
    assert {k: v for k, v in metrics.items() if k.count("/") == 2} == pytest.approx(
        {f"neuron/summary/{k}": v for k, v in expected.items()})
    assert {k: v for k, v in metrics.items() if k.count("/") == 3} == pytest.approx(
        {f"neuron/summary/n_5eed/{k}": v for k, v in expected.items()})
    assert metrics["neuron/summary/dma_active_time_percent"] == pytest.approx(47.6)
    assert metrics["neuron/summary/tensor_engine_instruction_count"] == 55  # a count is not scaled


def test_two_models_each_get_their_own_keys_and_no_flat_keys():
    text = LOG_LINES + json.dumps({"n_abc": PUBLISHED, "n_def": QUIET}, indent=2)
    metrics = summary_metrics(ns.parse_summary_json(text), "neuron/summary")
    assert metrics["neuron/summary/n_abc/dma_active_time_percent"] == pytest.approx(47.6)
    assert metrics["neuron/summary/n_def/dma_active_time_percent"] == pytest.approx(1.0)
    assert metrics["neuron/summary/n_def/mbu_estimated_percent"] == pytest.approx(18.4)
    assert not [k for k in metrics if k.count("/") == 2]


def test_a_new_field_is_read_and_text_fields_are_left_out():
    node = {**PUBLISHED, "future_engine_stall_cycles": 1234, "profile_name": "x", "ok": True, "nested": {"a": 1}}
    [(model, fields)] = ns.parse_summary_json(json.dumps({"n_1": node})).items()
    assert fields["future_engine_stall_cycles"] == 1234
    assert {"profile_name", "ok"}.isdisjoint(fields)


def test_a_summary_without_a_model_level_keeps_the_flat_keys():
    metrics = summary_metrics(ns.parse_summary_json(json.dumps({"total_time": 0.25, "x_percent": 0.5})), "p")
    assert metrics == {"p/total_time": 0.25, "p/x_percent": 50.0}


def test_an_active_time_above_one_means_the_tool_already_reports_percent():
    fields = {"mfu_estimated_percent": 12.5, "dma_active_time_percent": 40.0, "total_time": 2.0}
    assert ns.on_percent_scale(fields) == fields  # busy time above 1: the whole summary is in percent


def test_a_ratio_above_one_does_not_flip_the_scale():
    # mfu_max_achievable_estimated_percent is a ratio that can pass 1 on a fraction scale
    fields = {"mfu_max_achievable_estimated_percent": 1.3, "tensor_engine_active_time_percent": 0.1675,
              "mfu_estimated_percent": 0.11}
    assert ns.on_percent_scale(fields) == pytest.approx({"mfu_max_achievable_estimated_percent": 130.0,
                                                         "tensor_engine_active_time_percent": 16.75,
                                                         "mfu_estimated_percent": 11.0})


def test_a_pinned_scale_overrides_the_rule_and_a_bad_one_is_refused(monkeypatch):
    fields = {"mfu_estimated_percent": 0.4}
    monkeypatch.setenv(ns.SCALE_ENV, "percent")
    assert ns.on_percent_scale(fields) == {"mfu_estimated_percent": 0.4}
    monkeypatch.setenv(ns.SCALE_ENV, "fraction")
    assert ns.on_percent_scale({"a_percent": 12.0}) == {"a_percent": 1200.0}
    monkeypatch.setenv(ns.SCALE_ENV, "tenths")
    with pytest.raises(ValueError, match="fraction, percent, auto"):
        ns.on_percent_scale(fields)


def test_negative_percentages_mean_not_available_and_are_left_out():
    assert ns.on_percent_scale({"mfu_estimated_percent": -1.0, "mbu_estimated_percent": 0.2}) == {
        "mbu_estimated_percent": 20.0}


def test_output_without_json_is_a_clear_error():
    with pytest.raises(ns.SummaryError, match="no JSON"):
        ns.parse_summary_json("ERROR: cannot open NTFF\n")


# -- Summary.parquet ----------------------------------------------------------------------------

SUMMARY_COLUMNS = {  # documented Summary columns (Profile Parquet Schema Reference), stand-in values
    "total_time": 0.25, "hbm_read_bytes": 4096, "hbm_write_bytes": 2048, "dma_transfer_total_bytes": 6144,
    "event_count": 42, "mfu_estimated_percent": 0.110, "mbu_estimated_percent": 0.184,
    "tensor_engine_active_time_percent": 0.110, "dma_active_time_percent": 0.476,
}


def write_summary_parquet(folder, columns=SUMMARY_COLUMNS):
    pytest.importorskip("pyarrow")
    write_tables(folder, columns, None)
    return folder / "Summary.parquet"


def test_a_summary_parquet_table_gives_the_same_keys_as_the_json(tmp_path):
    write_summary_parquet(tmp_path / "session" / "graph@latest")
    from_parquet = summary_metrics(read_processed(tmp_path / "session").models, "neuron/summary")
    from_json = summary_metrics(ns.parse_summary_json(json.dumps({"graph@latest": SUMMARY_COLUMNS})),
                                   "neuron/summary")
    assert from_parquet == pytest.approx(from_json)
    assert from_parquet["neuron/summary/mfu_estimated_percent"] == pytest.approx(11.0)
    assert from_parquet["neuron/summary/graph_latest/hbm_read_bytes"] == 4096


def test_a_split_table_and_a_metadata_table_are_read(tmp_path):
    pytest.importorskip("pyarrow")
    write_tables(tmp_path / "out", SHAPE_2_34, METADATA, split=True)  # Summary_0.parquet
    processed = read_processed(tmp_path / "out")
    assert processed.models == {"": pytest.approx({k: float(v) for k, v in SHAPE_2_34.items()})}
    assert processed.metadata["profile_schema_version"] == "12.0.1"


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ns.SummaryError, match=r"mlflow-neuron\[parquet\]"):
        ns.read_parquet_rows([tmp_path / "Summary.parquet"])


# -- through the callback, with stand-in tools and the torch_neuronx test double -----------------

def test_several_device_profiles_are_logged_per_profile(tracking_uri, strict, neuron_double, tmp_path,
                                                        monkeypatch):
    newer = {**QUIET, "future_engine_stall_count": 7}  # a field this package has never seen
    calls = stand_in.install(tmp_path, monkeypatch, models={"n_abc": PUBLISHED, "n_def": newer}, layout="per_profile")
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace), experimental_config=config)
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    summary = {k: v for k, v in sorted(metrics.items()) if k.startswith("neuron/summary/")}
    print("\n".join(f"{k} = {v:g}" for k, v in summary.items()))  # shown with pytest -s
    assert summary == pytest.approx(
        {f"neuron/summary/n_abc/{k}": v for k, v in published_percent(PUBLISHED).items()}
        | {f"neuron/summary/n_def/{k}": v for k, v in published_percent(newer).items()})
    [call] = stand_in.calls_of(calls)
    assert call[:5] == ["view", "-d", str(exporter.sessions[0]), "--output-format", "parquet"]


def test_without_the_tool_a_sessions_summary_parquet_is_read(tracking_uri, strict, neuron_double, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no neuron-explorer

    def processed_profile(prof):  # what `neuron-explorer view --output-file` leaves in a session
        write_summary_parquet(exporter.sessions[-1] / "graph@latest")

    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, processed_profile), experimental_config=config)
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    assert metrics["neuron/summary/total_time"] == 0.25
    assert metrics["neuron/summary/dma_active_time_percent"] == pytest.approx(47.6)
    assert metrics["neuron/summary/graph_latest/hbm_read_bytes"] == 4096


def test_the_manifest_pairs_each_ntff_with_its_neff_and_gives_the_view_commands(tracking_uri, strict, neuron_double,
                                                                                tmp_path):
    out = tmp_path / "out"
    config = neuron_double.NeuronConfig(profile_output_dir=str(out))
    exporter = neuron_double.NeuronProfiler(config)

    def hashed_capture(prof):  # the other documented naming: neff_<hash>.neff + <hash>_instid_0_vnc_0.ntff
        session = exporter.sessions[-1]
        (session / "neff_395760075800974.neff").write_bytes(b"N")
        (session / "395760075800974_instid_0_vnc_0.ntff").write_bytes(b"T")

    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, hashed_capture), experimental_config=config)
    manifest = read_json_artifact(MlflowClient(), run.info.run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    session = exporter.sessions[0].relative_to(out).as_posix()
    base = "profiler/step_4/neuron"
    pairs = {p["ntff"].rsplit("/", 1)[1]: p for p in manifest["neuron_pairs"]}
    assert manifest["neuron_views_relative_to"] == base
    assert pairs["395760075800974_instid_0_vnc_0.ntff"] == {
        "ntff": f"{base}/{session}/395760075800974_instid_0_vnc_0.ntff",
        "neff": f"{base}/{session}/neff_395760075800974.neff",
        "view_command": f"neuron-explorer view -n {session}/neff_395760075800974.neff "
                        f"-s {session}/395760075800974_instid_0_vnc_0.ntff",
    }
    ntff_entry = next(f for f in manifest["files"] if f["artifact_path"].endswith("_instid_0_vnc_0.ntff"))
    assert ntff_entry["neff"] == f"{base}/{session}/neff_395760075800974.neff"
    # Two NEFFs in the folder and no hash in the session trace's name: which NEFF is unknown.
    assert pairs["profile_nc_0_session_0.ntff"]["neff"] is None
    assert manifest["neuron_sessions"] == [
        {"artifact_path": f"{base}/{session}", "view_command": f"neuron-explorer view -d {session}"}]


def test_a_broken_summary_table_is_one_warning_and_the_cycle_still_logs(tracking_uri, neuron_double, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)

    def broken_table(prof):
        (exporter.sessions[-1] / "Summary.parquet").write_bytes(b"not parquet")

    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="Summary.parquet") as caught:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, broken_table), steps=8, wait=1, warmup=1,
                        active=2, experimental_config=config)
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    assert "profiler/total/aten_calls" in metrics and not any(k.startswith("neuron/summary") for k in metrics)


def test_two_sessions_in_one_cycle_log_both_models(tracking_uri, strict, neuron_double, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "neuron-explorer"
    tool.write_text("#!/bin/sh\ncase \"$3\" in\n"
                    f"  *_extra) echo '{json.dumps({'n_extra': QUIET})}' ;;\n"
                    f"  *) echo '{json.dumps({'n_abc': PUBLISHED})}' ;;\nesac\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)

    def second_session(prof):
        extra = exporter.sessions[-1].parent / (exporter.sessions[-1].name + "_extra")
        extra.mkdir()
        (extra / "neff_e1_vnc_0.neff").write_bytes(b"N")

    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, second_session), experimental_config=config)
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    summary = {k for k in metrics if k.startswith("neuron/summary/")}
    assert {k.split("/")[2] for k in summary} == {"n_abc", "n_extra"}
    assert metrics["neuron/summary/n_extra/dma_active_time_percent"] == pytest.approx(1.0)
