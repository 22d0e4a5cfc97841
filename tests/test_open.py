"""`mlflow-neuron open`: a run's Neuron session folder, downloaded and opened, against a real store."""

import json
import os
import uuid

import mlflow
import pytest
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron.cli import main as cli_main


@pytest.fixture
def profiled_run(tracking_uri, strict, neuron_double, tmp_path):
    """A run with two cycles (steps 4 and 8), each with its own Neuron session folder."""
    out = tmp_path / "out"
    config = neuron_double.NeuronConfig(profile_output_dir=str(out))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace), steps=8, wait=1, warmup=1, active=2,
                        experimental_config=config)
    return run.info.run_id, [s.relative_to(out).as_posix() for s in exporter.sessions]


def no_tool(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")


def stand_in_explorer(tmp_path, monkeypatch, exit_code=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "explorer-calls.json"
    tool = bin_dir / "neuron-explorer"
    tool.write_text(f"#!/usr/bin/env python3\nimport json, sys\njson.dump(sys.argv[1:], open({str(calls)!r}, 'w'))\n"
                    f"sys.exit({exit_code})\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    return calls


def test_without_the_tool_it_downloads_the_last_cycle_and_prints_the_command(profiled_run, tmp_path, monkeypatch,
                                                                               capsys):
    run_id, sessions = profiled_run
    no_tool(monkeypatch)
    dest = tmp_path / "opened"
    assert cli_main(["open", run_id, "--dest", str(dest)]) == 0
    local_session = dest / "neuron" / sessions[1]  # profiler/step_8/neuron, layout kept
    assert {p.name for p in local_session.iterdir()} >= {"trace.json", "ntrace.pb", "neff_5eed1e55_vnc_0.neff",
                                                         "profile_nc_0_session_1.ntff"}
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["neuron_sessions"][0]["view_command"] == f"neuron-explorer view -d {sessions[1]}"
    printed = capsys.readouterr().out
    assert f"neuron-explorer view -d {local_session.resolve()}" in printed
    assert "not installed" in printed


def test_with_the_tool_it_runs_neuron_explorer_on_the_chosen_step(profiled_run, tmp_path, monkeypatch, capsys):
    run_id, sessions = profiled_run
    calls = stand_in_explorer(tmp_path, monkeypatch)
    dest = tmp_path / "opened"
    assert cli_main(["open", run_id, "--step", "4", "--dest", str(dest)]) == 0
    local_session = (dest / "neuron" / sessions[0]).resolve()
    assert json.loads(calls.read_text()) == ["view", "-d", str(local_session)]
    assert f"running: {tmp_path / 'bin' / 'neuron-explorer'} view -d {local_session}" in capsys.readouterr().out


def test_no_launch_only_downloads_and_a_failing_tool_exits_1(profiled_run, tmp_path, monkeypatch):
    run_id, _ = profiled_run
    calls = stand_in_explorer(tmp_path, monkeypatch, exit_code=4)
    assert cli_main(["open", run_id, "--dest", str(tmp_path / "a"), "--no-launch"]) == 0
    assert not calls.exists()
    assert cli_main(["open", run_id, "--dest", str(tmp_path / "b")]) == 1


def test_unknown_runs_steps_and_runs_without_neuron_files_are_usage_errors(profiled_run, tmp_path, monkeypatch,
                                                                          capsys):
    run_id, _ = profiled_run
    no_tool(monkeypatch)
    assert cli_main(["open", uuid.uuid4().hex, "--dest", str(tmp_path / "x")]) == 2
    assert cli_main(["open", run_id, "--step", "5", "--dest", str(tmp_path / "y")]) == 2
    assert "steps that have: 4, 8" in capsys.readouterr().err
    with mlflow.start_run() as plain:
        profile_rmsnorm(MLflowProfilerCallback())
    assert cli_main(["open", plain.info.run_id, "--dest", str(tmp_path / "z")]) == 2
    assert "no Neuron session files" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli_main(["open", run_id, "--step", "-1"])
    assert usage.value.code == 2


def test_a_system_only_session_opens_with_view_d(tracking_uri, strict, neuron_double, tmp_path, monkeypatch):
    out = tmp_path / "out"
    config = neuron_double.NeuronConfig(modes=[neuron_double.ProfileMode.RUNTIME], profile_output_dir=str(out))
    exporter = neuron_double.NeuronProfiler(config)
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace), experimental_config=config)
    calls = stand_in_explorer(tmp_path, monkeypatch)
    dest = tmp_path / "opened"
    assert cli_main(["open", run.info.run_id, "--dest", str(dest)]) == 0
    local_session = (dest / "neuron" / exporter.sessions[0].relative_to(out)).resolve()
    assert {p.name for p in local_session.iterdir()} == {"trace.json", "ntrace.pb", "trace_info.pb"}
    assert json.loads(calls.read_text()) == ["view", "-d", str(local_session)]
