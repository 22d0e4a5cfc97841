"""Neuron Explorer run on each cycle's sessions: its Parquet output read from a folder of ours, the
versions on the run, what a misbehaving tool gets, a user's processed data path, missing NEFFs.

Through the real callback and a real sqlite store, with the test double of `torch_neuronx.profiling`
and the stand-in `neuron-explorer` of `tests/doubles/neuron_explorer.py` (2.34-shaped stand-in values).
"""

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._neuron.explorer_run import TIMEOUT_ENV, run_to_parquet
from mlflow_neuron._neuron.processed import DATA_PATH_ENV, data_path_profile
from mlflow_neuron._neuron.summary import SummaryError
from mlflow_neuron._trace.neuron_fields import VERSION_TAG_PREFIX

from doubles import neuron_explorer as stand_in
from doubles.neuron_explorer import FUTURE, METADATA, SHAPE_2_34, write_tables

pytest.importorskip("pyarrow")


def profiled_run(neuron_double, tmp_path, *handlers, **schedule):
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, *handlers), experimental_config=config,
                        **schedule)  # fmt: skip
    return MlflowClient().get_run(run.info.run_id).data, exporter


def neuron_warnings(caught, text=""):
    return [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning) and text in str(w.message)]


def test_a_2_34_cycle_logs_the_summary_and_the_version_tags(tracking_uri, strict, neuron_double, tmp_path,
                                                            monkeypatch, capfd):
    calls = stand_in.install(tmp_path, monkeypatch)
    data, exporter = profiled_run(neuron_double, tmp_path)
    [call] = stand_in.calls_of(calls)  # the Parquet output did it: no summary-json
    session = exporter.sessions[0]
    assert call[:6] == ["view", "-d", str(session), "--output-format", "parquet", "--output-file"]
    assert not call[6].startswith(str(tmp_path / "out"))  # our folder, never the capture folder
    # Every field as written (percent fields on 0-100). One profile in the folder: the flat keys.
    assert not [k for k in data.metrics if k.startswith("neuron/summary/") and k.count("/") > 2]
    for key in ("neuron/summary",):
        assert data.metrics[f"{key}/mbu_estimated_percent"] == pytest.approx(18.4)  # the stand-in writes them apart
        assert data.metrics[f"{key}/hbm_mbu_estimated_percent"] == pytest.approx(17.6)
        assert data.metrics[f"{key}/packet_hbm_read_bytes"] == 4608
        assert data.metrics[f"{key}/dma_transfer_total_bytes"] == 0
        assert data.metrics[f"{key}/cc_op_count"] == 3
    # mfu_max_achievable_estimated_percent is 1.3: the fractions are still taken as fractions
    assert data.metrics["neuron/summary/tensor_engine_active_time_percent"] == pytest.approx(16.75)
    assert data.metrics["neuron/summary/mfu_max_achievable_estimated_percent"] == pytest.approx(130.0)
    assert {k.removeprefix(VERSION_TAG_PREFIX): v for k, v in data.tags.items()
            if k.startswith(VERSION_TAG_PREFIX)} == METADATA  # fmt: skip
    # the user learns it runs: said by the training process (the helper process has no terminal)
    assert "neuron-explorer processes each cycle's Neuron capture sessions off the training thread" in \
        capfd.readouterr().err


def test_a_future_summary_without_the_deprecated_fields_and_a_split_table(tracking_uri, strict, neuron_double,
                                                                          tmp_path, monkeypatch):
    stand_in.install(tmp_path, monkeypatch, models={"n_1": FUTURE}, split=True)
    data, _ = profiled_run(neuron_double, tmp_path)
    assert data.metrics["neuron/summary/hbm_mbu_estimated_percent"] == pytest.approx(17.6)
    assert "neuron/summary/mbu_estimated_percent" not in data.metrics


def test_a_schema_major_not_tested_is_one_warning(tracking_uri, neuron_double, tmp_path, monkeypatch):
    stand_in.install(tmp_path, monkeypatch, metadata={**METADATA, "profile_schema_version": "13.0.0"})
    with pytest.warns(MLflowNeuronWarning) as caught:
        data, _ = profiled_run(neuron_double, tmp_path, steps=8, wait=1, warmup=1, active=2)
    [warning] = neuron_warnings(caught, "13.0.0")
    assert "7.x, 12.x" in warning
    assert data.tags[VERSION_TAG_PREFIX + "profile_schema_version"] == "13.0.0"


@pytest.mark.parametrize("behaviour, timeout_s, says", [
    ("serve_ui", 2.0, "did not exit within 2 s"),
    ("into_capture", 120.0, "into the capture folder"),
    ("nothing", 120.0, "wrote nothing into --output-file"),
    ("fail", 120.0, "exited 3: ERROR: stand-in failure"),
])  # fmt: skip
def test_a_tool_that_behaves_otherwise_is_caught_with_a_clear_message(tmp_path, monkeypatch, behaviour, timeout_s,
                                                                      says):
    calls = stand_in.install(tmp_path, monkeypatch, behaviour=behaviour)
    session, ours = tmp_path / "session", tmp_path / "ours"
    session.mkdir(), ours.mkdir()
    with pytest.raises(SummaryError, match=says):
        run_to_parquet(str(tmp_path / "stand-in-bin" / "neuron-explorer"), session, ours, timeout_s,
                       say=lambda line: None)
    assert len(stand_in.calls_of(calls)) == 1


def test_the_run_says_when_explorer_starts_and_finishes(tmp_path, monkeypatch):
    stand_in.install(tmp_path, monkeypatch)
    session, ours, said = tmp_path / "session", tmp_path / "ours", []
    session.mkdir(), ours.mkdir()
    processed = run_to_parquet(str(tmp_path / "stand-in-bin" / "neuron-explorer"), session, ours, 120.0, said.append)
    assert processed.metadata == METADATA and len(processed.models) == 1
    assert said[0].startswith(f"mlflow-neuron: neuron-explorer is processing {session} (stopped after 120 s)")
    assert said[1].startswith("mlflow-neuron: neuron-explorer finished session in ")


def test_a_tool_serving_its_ui_is_stopped_and_summary_json_is_used(tracking_uri, neuron_double, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "5")  # the stand-in serves until stopped
    calls = stand_in.install(tmp_path, monkeypatch, behaviour="serve_ui")
    with pytest.warns(MLflowNeuronWarning) as caught:
        data, _ = profiled_run(neuron_double, tmp_path)
    [warning] = neuron_warnings(caught, "did not exit")
    assert "ports 3001 and 3002" in warning and "summary-json" in warning
    assert [c[4] for c in stand_in.calls_of(calls)] == ["parquet", "summary-json"]
    assert data.metrics["neuron/summary/n_5eed1e55/hbm_mbu_estimated_percent"] == pytest.approx(17.6)


def test_a_failing_neuron_explorer_is_reported_once_and_every_cycle_still_logs(tracking_uri, neuron_double, tmp_path,
                                                                               monkeypatch):
    """A tool that fails every call (its Parquet output and summary-json), on each of three cycles:
    the user gets one warning in all, and each cycle is in MLflow, without a Neuron summary."""
    calls = stand_in.install(tmp_path, monkeypatch, behaviour="fail")
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="stand-in failure") as caught:
        callback = MLflowProfilerCallback(exporter.export_trace)
        profile_rmsnorm(callback, steps=12, wait=1, warmup=1, active=2, experimental_config=config)
        callback.close()
    said = neuron_warnings(caught)
    assert len(said) == 1, f"{len(said)} warnings for one failing neuron-explorer: {said}"
    assert "exited 3: ERROR: stand-in failure" in said[0] and "summary-json" in said[0]
    assert len(exporter.sessions) == 3  # the tool was run on every cycle's session, and failed each time
    assert sorted({c[2] for c in stand_in.calls_of(calls)}) == sorted(str(s) for s in exporter.sessions)
    client = MlflowClient()
    assert [m.step for m in client.get_metric_history(run.info.run_id, "profiler/total/active_steps")] == [4, 8, 12]
    metrics = client.get_run(run.info.run_id).data.metrics
    assert "profiler/total/aten_calls" in metrics and not [k for k in metrics if k.startswith("neuron/summary")]


def test_explorer_never_runs_on_the_training_thread(tracking_uri, strict, neuron_double, tmp_path, monkeypatch):
    release = tmp_path / "release"
    # The stand-in waits until the training thread has reached its next cycle: had it run on the
    # training thread, the loop could not get there and the stand-in would record "timed out".
    calls = stand_in.install(tmp_path, monkeypatch, behaviour="wait_for", release=str(release))

    def next_cycle(prof):
        if prof.step_num > 4:
            release.touch()

    data, _ = profiled_run(neuron_double, tmp_path, next_cycle, steps=8, wait=1, warmup=1, active=2)
    waits = [c[0] for c in stand_in.calls_of(calls) if c[0] in ("released", "timed out")]
    assert waits and set(waits) == {"released"}
    assert "neuron/summary/hbm_mbu_estimated_percent" in data.metrics


def test_without_the_tool_the_users_processed_data_path_is_read(tracking_uri, strict, neuron_double, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no neuron-explorer
    monkeypatch.setenv(DATA_PATH_ENV, str(tmp_path / "explorer-data"))

    def processed_by_the_user(prof):  # `neuron-explorer view --data-path` under the session's name
        session = exporter_of[0].sessions[-1]
        write_tables(data_path_profile(tmp_path / "explorer-data", session.name), SHAPE_2_34, METADATA)

    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter_of = [neuron_double.NeuronProfiler(config)]
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter_of[0].export_trace, processed_by_the_user),
                        experimental_config=config)  # fmt: skip
    data = MlflowClient().get_run(run.info.run_id).data
    assert data.metrics["neuron/summary/dma_mbu_estimated_percent"] == pytest.approx(9.1)
    assert data.tags[VERSION_TAG_PREFIX + "explorer_version"] == METADATA["explorer_version"]


def test_a_session_without_neffs_warns_once_naming_the_setting(tracking_uri, neuron_double, tmp_path,
                                                               monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")  # PyTorch profiling then copies no NEFF
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.warns(MLflowNeuronWarning) as caught:
        _, exporter = profiled_run(neuron_double, tmp_path, steps=8, wait=1, warmup=1, active=2)
    assert len(exporter.sessions) == 2 and not list(exporter.sessions[0].glob("*.neff"))
    [warning] = neuron_warnings(caught, "NEFF")
    assert "neff_cache_dir" in warning and "TORCH_NEURONX_NEFF_CACHE_DIR" in warning
    assert "profile_nc_0_session_0.ntff" in warning  # the empty NTFF of the idle core is not named


def test_compare_shows_mbu_hbm_and_dma_bytes_for_a_2_34_run_and_a_future_run_and_the_versions(
        tracking_uri, strict, neuron_double, tmp_path, monkeypatch, capsys):
    from mlflow_neuron.cli import main as cli_main

    run_ids = []
    for name, shape, explorer in (("current", SHAPE_2_34, "stand-in-explorer-a"),
                                  ("future", FUTURE, "stand-in-explorer-b")):
        folder = tmp_path / name
        folder.mkdir()
        stand_in.install(folder, monkeypatch, models={"n_1": shape}, metadata={**METADATA, "explorer_version": explorer})
        config = neuron_double.NeuronConfig(profile_output_dir=str(folder / "out"))
        with mlflow.start_run(run_name=name) as run:
            profile_rmsnorm(MLflowProfilerCallback(neuron_double.NeuronProfiler(config).export_trace),
                            experimental_config=config)  # fmt: skip
        run_ids.append(run.info.run_id)
    capsys.readouterr()
    assert cli_main(["compare", "--runs", *run_ids]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0].strip(): line for line in out.splitlines() if "each run's only NEFF" in line}
    print(out)  # shown with pytest -s
    hbu = lines["each run's only NEFF HBU (MBU before Neuron 2.34)"]
    # both runs' HBU is hbm_mbu (17.6); the current run's deprecated mbu (18.4) is logged, never compared
    assert "current 17.6, future 17.6 [hbm_mbu_estimated_percent]" in hbu, hbu
    assert "current 4,608, future 4,608 [packet_hbm_read_bytes]" in lines["each run's only NEFF HBM read bytes"]
    assert "current 1,792, future 1,792" in lines["each run's only NEFF DMA bytes"]
    assert "explorer_version differs: current stand-in-explorer-a, future stand-in-explorer-b" in out
