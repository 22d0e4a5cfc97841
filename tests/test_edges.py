"""The edges a new user meets first: servers that are down, refuse or hang; the shutdown budget;
records the server refuses for good; honest progress lines; strict input checks (issue #10)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import mlflow
import pytest
from conftest import ROOT, TESTS, artifact_files, run_python
from mlflow.tracking import MlflowClient
from servers import HungServer, MlflowServer, free_port
from shutdown_budget import budget_script, moments
from torch.profiler import tensorboard_trace_handler
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron.cli.arguments import EXIT_UNREACHABLE, EXIT_USAGE
from mlflow_neuron._device.devices import pick_device
from mlflow_neuron._record.model import Delivery, RunRef
from mlflow_neuron.cli import _exit_for
from mlflow_neuron.cli import main as cli_main

NO_SUCH_RUN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def hung_server():
    server = HungServer()
    yield server.uri
    server.close()


@pytest.fixture
def refusing_server():
    return f"http://127.0.0.1:{free_port()}"  # nobody listens there


@pytest.fixture(params=["refusing", "hung"])
def down_server(request):
    if request.param == "refusing":
        yield f"http://127.0.0.1:{free_port()}"
        return
    server = HungServer()
    yield server.uri
    server.close()


def a_record(outbox: Path, uri: str, run_id: str | None = NO_SUCH_RUN, **run) -> Path:
    staged = outbox.parent / f"staged-{time.monotonic_ns()}"
    staged.mkdir(parents=True)
    (staged / "manifest.json").write_text("{}")
    (staged / "ops.json").write_text('{"columns": [], "data": []}')
    delivery = Delivery(step=4, timestamp_ms=1, artifact_dir="profiler/step_4",
                        metrics={"profiler/total/aten_calls": 6.0}, files_dir=str(staged))  # fmt: skip
    return _outbox.put(outbox, delivery, RunRef(uri, run_id, **run), copy_max_bytes=1 << 20)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# -- 1. a dead, refusing or hung server is exit 3, one line, in seconds -----------------------------


COMMAND_LINES = {
    "compare": ["compare", "--experiment", "rmsnorm-variants", "--fail-if-slower", "10"],
    "annotate": ["annotate", "--model", "rmsnorm", "--version", "1", "--run", NO_SUCH_RUN],
    "ingest": ["ingest", str(TESTS)],
    "sync": ["sync"],
}


@pytest.mark.parametrize("command", list(COMMAND_LINES))
def test_every_command_tells_an_unreachable_server_from_a_regression(command, down_server, tmp_path, capsys):
    argv = COMMAND_LINES[command] + ["--tracking-uri", down_server]
    if command == "sync":
        a_record(tmp_path / "outbox", "sqlite:///unused.db")
        argv += ["--outbox", str(tmp_path / "outbox")]
    started = time.monotonic()
    assert cli_main(argv) == EXIT_UNREACHABLE
    assert time.monotonic() - started < 10
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"mlflow-neuron {command}: error: tracking server {down_server} is not reachable")


def test_the_tracking_uri_from_the_environment_is_checked_too(refusing_server, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", refusing_server)
    assert cli_main(COMMAND_LINES["compare"]) == EXIT_UNREACHABLE
    assert "is not reachable" in one_line(capsys.readouterr().err)


def test_sync_keeps_records_whose_server_is_down_and_says_so_once(down_server, tmp_path, capsys):
    outbox = tmp_path / "outbox"
    records = [a_record(outbox, down_server) for _ in range(3)]
    started = time.monotonic()
    assert cli_main(["sync", "--outbox", str(outbox)]) == EXIT_UNREACHABLE
    assert time.monotonic() - started < 10  # probed once, not once per record
    captured = capsys.readouterr()
    assert "is not reachable" in one_line(captured.err)
    assert "synced 0 of 3 record(s)" in captured.out
    assert _outbox.pending(outbox) == records


def test_a_server_that_goes_away_mid_command_is_exit_3_too(refusing_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(Exception) as caught:  # what MLflow's client raises after the probe passed
        MlflowClient(refusing_server).get_run(NO_SUCH_RUN)
    code, message = _exit_for(caught.value)
    assert code == EXIT_UNREACHABLE and "did not answer" in message and "\n" not in message


def test_the_installed_command_against_a_hung_server(hung_server):
    """The issue's own command line, as a CI job runs it."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "mlflow_neuron.cli", *COMMAND_LINES["compare"], "--tracking-uri", hung_server],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == EXIT_UNREACHABLE
    assert time.monotonic() - started < 30
    assert result.stdout == ""
    assert one_line(result.stderr).endswith("is not reachable (no answer within 3 s)")


# -- 2. flush_timeout_s is one budget from the loop's end to process exit -----------------------------

@pytest.mark.parametrize("helper", [False, True], ids=["first-cycles-in-process", "helper"])
@pytest.mark.parametrize("close", [True, False], ids=["close", "no-close"])
def test_shutdown_waits_one_budget_in_all_against_a_hung_server(hung_server, tmp_path, close, helper):
    budget = 4.0
    script = budget_script(hung_server, str(tmp_path / "outbox"), close, budget, helper=helper)
    # The script waits up to 300 s for the helper to start; the budget is measured from the loop's end.
    result = run_python(script, tmp_path, timeout=480)
    exited = time.time()
    assert result.returncode == 0, result.stderr
    times = moments(result.stdout)
    if "helper_not_started" in times:  # at nice 10 beside two nice-0 CPU hogs it gets ~10% of a core
        pytest.skip("the helper process did not start within 300 s on this busy machine: the helper path "
                    "was not measured (the in-process variants were)")
    loop_end, last_atexit = times["loop_end"], times["last_atexit"]
    # Profiler exit, close() and interpreter exit share one budget (plus a second for the outbox).
    assert last_atexit - loop_end < budget + 1.0, last_atexit - loop_end
    # What follows is the interpreter's own teardown of torch and mlflow (1.5-2.5 s on a quiet 2-core
    # machine with no callback at all, 5 s and more beside other jobs): the bound here is one load
    # cannot reach, far below the helper that held the script's pipe for 68-76 s before.
    # `benchmarks/end_of_script.py` measures the +5 s promise itself.
    assert exited - loop_end < budget + 20.0, exited - loop_end
    assert len(_outbox.pending(tmp_path / "outbox")) == 2  # both cycles: nothing lost


def test_close_after_a_healthy_stop_still_ends_the_run(tracking_uri):
    # A budget no busy machine runs out of: how fast a starved machine ends a run is not what this test asks.
    callback = MLflowProfilerCallback(experiment_id="0", flush_timeout_s=120)
    profile_rmsnorm(callback)
    assert callback.flush()  # delivered first, without a limit
    time.sleep(2.5)  # time spent elsewhere is not taken from the budget; only waiting is
    assert callback._budget.left() >= 120 - callback.exit_wait_s - 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", MLflowNeuronWarning)
        callback.close()
    assert MlflowClient().get_run(callback.run_id).info.status == "FINISHED"


def test_the_outbox_warning_counts_every_cycle_it_got(refusing_server, tmp_path):
    callback = MLflowProfilerCallback(tracking_uri=refusing_server, experiment_id="0", outbox=tmp_path / "outbox",
                                      retry_wait_s=0.01)  # fmt: skip
    with pytest.warns(MLflowNeuronWarning) as caught:
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        callback.close()
    messages = [str(w.message) for w in caught]
    assert any("2 profiler cycle(s) (steps 4, 8) were not sent to" in m and "mlflow-neuron sync --outbox" in m
               for m in messages), messages
    assert len(_outbox.pending(tmp_path / "outbox")) == 2


# -- 3. permanent refusals: not retried, kept apart, reported once --------------------------------------


def test_a_run_that_does_not_exist_is_rejected_at_once_and_sync_leaves_it(tmp_path, capsys):
    outbox = tmp_path / "outbox"
    with MlflowServer(tmp_path / "server") as server:
        server.start()
        started = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            callback = MLflowProfilerCallback(run_id=NO_SUCH_RUN, tracking_uri=server.uri, outbox=outbox)
            assert profile_rmsnorm(callback) == 4
            callback.close()
        elapsed = time.monotonic() - started
        ours = [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning)]
        assert len(ours) == 1, ours
        assert "RESOURCE_DOES_NOT_EXIST" in ours[0] and NO_SUCH_RUN in ours[0] and "not retried" in ours[0]
        assert elapsed < 10  # no retries with backoff
        assert _outbox.pending(outbox) == []
        [rejected] = _outbox.rejected(outbox)
        assert "RESOURCE_DOES_NOT_EXIST" in (rejected / _outbox.REASON).read_text()

        capsys.readouterr()
        for _ in range(2):  # sync never retries it, and says why
            assert cli_main(["sync", "--outbox", str(outbox)]) == 0
            out = capsys.readouterr().out
            assert "synced 0 of 0 record(s)" in out
            assert "1 record(s) in" in out and "RESOURCE_DOES_NOT_EXIST" in out and "--retry-rejected" in out
        assert _outbox.rejected(outbox) == [rejected]

        target = MlflowClient(server.uri).create_run("0").info.run_id
        assert cli_main(["sync", "--outbox", str(outbox), "--retry-rejected", "--run-id", target]) == 0
        assert _outbox.rejected(outbox) == []
        client = MlflowClient(server.uri)
        assert client.get_run(target).data.metrics["profiler/total/aten_calls"] == 6
        assert "profiler/step_4/ops.json" in artifact_files(client, target)


def test_a_deleted_run_is_rejected_with_its_reason(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    client.delete_run(run_id)
    with pytest.warns(MLflowNeuronWarning, match="deleted") as caught:
        profile_rmsnorm(MLflowProfilerCallback(run_id=run_id, outbox=tmp_path / "outbox"))
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    [rejected] = _outbox.rejected(tmp_path / "outbox")
    assert "INVALID_PARAMETER_VALUE" in _outbox.reason_of(rejected)


def test_sync_moves_a_refused_record_aside_and_exits_0(tracking_uri, tmp_path, capsys):
    outbox = tmp_path / "outbox"
    a_record(outbox, tracking_uri)
    assert cli_main(["sync", "--outbox", str(outbox)]) == 0  # nothing deliverable is left
    out = capsys.readouterr().out
    assert "rejected, not retried (RESOURCE_DOES_NOT_EXIST" in out
    assert _outbox.pending(outbox) == [] and len(_outbox.rejected(outbox)) == 1
    assert cli_main(["sync", "--outbox", str(outbox), "--retry-rejected"]) == 1  # still refused
    assert len(_outbox.rejected(outbox)) == 1


def test_strict_mode_raises_a_refusal(tracking_uri, strict, tmp_path):
    # The refusal reaches the training thread when the profiler's stop flush sees it: a budget no busy
    # machine runs out of, since a starved helper may take seconds to send the cycle at all.
    callback = MLflowProfilerCallback(run_id=NO_SUCH_RUN, outbox=tmp_path / "outbox", flush_timeout_s=120)
    with pytest.raises(mlflow.exceptions.MlflowException, match="not found"):
        profile_rmsnorm(callback)


# -- 4. progress lines count what is sent ------------------------------------------------------------------


def test_ingest_and_sync_progress_lines_count_every_file_with_its_size(tracking_uri, refusing_server, tmp_path,
                                                                       capsys):  # fmt: skip
    folder = tmp_path / "tb"
    with mlflow.start_run():
        profile_rmsnorm(MLflowProfilerCallback(tensorboard_trace_handler(str(folder))))
    capsys.readouterr()
    assert cli_main(["ingest", str(folder), "--experiment", "ingested"]) == 0
    cycle, node = capsys.readouterr().out.splitlines()[:2]
    # trace.json.gz, ops.json, steps.json, step_totals.json, timeline.json, key_averages.txt, manifest.json;
    # then the node file that holds the rank summary
    assert " 7 file(s), " in cycle and not cycle.endswith(" 0 B"), cycle
    assert node.startswith("[node file] profiler/ranks/node_") and " 1 file(s), " in node and " 0 B" not in node, node

    outbox = tmp_path / "outbox"
    offline = MLflowProfilerCallback(tracking_uri=refusing_server, experiment_id="0", outbox=outbox, retry_wait_s=0.01)
    with pytest.warns(MLflowNeuronWarning):
        profile_rmsnorm(offline)
        offline.close()
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", tracking_uri]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert " 8 file(s), " in line and "KiB" in line, line


# -- 5. a run created by sync ends as the callback would have ended it --------------------------------------


def test_a_run_created_by_sync_ends_finished(sync_store, refusing_server, tmp_path, capsys):
    outbox = tmp_path / "outbox"
    callback = MLflowProfilerCallback(tracking_uri=refusing_server, experiment_id="0", run_name="offline",
                                      outbox=outbox, retry_wait_s=0.01)  # fmt: skip
    with pytest.warns(MLflowNeuronWarning):
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        callback.close()
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    [run] = MlflowClient(sync_store).search_runs(["0"])
    assert run.info.status == "FINISHED"
    assert "ended (FINISHED)" in capsys.readouterr().out


def test_sync_leaves_a_run_it_did_not_create_running(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    a_record(tmp_path / "outbox", tracking_uri, run_id)
    assert cli_main(["sync", "--outbox", str(tmp_path / "outbox")]) == 0
    assert client.get_run(run_id).info.status == "RUNNING"


# -- 6., 7. bad values and paths are usage errors, in one line ----------------------------------------------


@pytest.mark.parametrize("argv", [
    ["ingest", ".", "--top-k", "-1"],
    ["ingest", ".", "--top-k", "many"],
    ["ingest", ".", "--max-file-mb", "-5"],
    ["ingest", ".", "--max-file-mb", "nan"],
    ["sync", "--outbox", "./does-not-exist"],
    ["sync", "--outbox", __file__],  # a regular file
])  # fmt: skip
def test_bad_values_are_exit_2_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main(argv)
    assert exited.value.code == EXIT_USAGE
    assert one_line(capsys.readouterr().err).startswith(f"mlflow-neuron {argv[0]}: error: argument ")


def test_run_id_without_retry_rejected_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "outbox").mkdir()
    with pytest.raises(SystemExit) as exited:
        cli_main(["sync", "--outbox", str(tmp_path / "outbox"), "--run-id", NO_SUCH_RUN])
    assert exited.value.code == EXIT_USAGE
    assert "--run-id goes with --retry-rejected" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["compare"], "name the runs to compare (--runs RUN ...) or an experiment (--experiment NAME)"),
    (["compare", "--experiment", "x", "--bogus"], "unrecognized arguments: --bogus"),
    (["ingest", "./no-such-trace.json"], "./no-such-trace.json does not exist"),
    (["sync", "--run-id", NO_SUCH_RUN], "--run-id goes with --retry-rejected"),
])  # fmt: skip
def test_usage_errors_name_the_commands_help_and_come_before_mlflow_and_torch_load(argv, message, tmp_path):
    code = (f"import sys\nfrom mlflow_neuron.cli import main\ntry:\n    main({argv!r})\n"
            "except SystemExit as exited:\n    print(exited.code, 'torch' in sys.modules, 'mlflow' in sys.modules)\n")  # fmt: skip
    result = run_python(code, tmp_path)
    assert result.stdout.split() == ["2", "False", "False"], result.stderr[-2000:]
    line = one_line(result.stderr)
    assert line == f"mlflow-neuron {argv[0]}: error: {message} (see mlflow-neuron {argv[0]} --help)"


def test_no_default_outbox_means_nothing_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["sync"]) == 0
    assert "nothing to sync" in capsys.readouterr().out


# -- 8. messages ---------------------------------------------------------------------------------------------


def test_an_unknown_tracking_uri_scheme_says_so(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown scheme 'notascheme'") as caught:
        MLflowProfilerCallback(tracking_uri="notascheme://x")
    assert "registry" not in str(caught.value)
    assert cli_main(["ingest", str(tmp_path), "--tracking-uri", "notascheme://x"]) == EXIT_USAGE
    assert "unknown scheme 'notascheme'" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("device", ["cuda", "neuron", "tpu"])
def test_a_device_this_machine_lacks_is_one_clear_line(device):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError) as caught:
        pick_device(device)
    assert "\n" not in str(caught.value) and repr(device) in str(caught.value)
    assert pick_device("cpu") == "cpu"


# -- friction ------------------------------------------------------------------------------------------------


def test_the_cli_hides_mlflow_info_chatter_unless_verbose(tmp_path):
    outbox = tmp_path / "outbox"
    a_record(outbox, "unused", None, experiment_id="0", run_key="k1")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_LOGGING_LEVEL", None)
    base = [sys.executable, "-m", "mlflow_neuron.cli"]
    args = ["sync", "--outbox", str(outbox), "--tracking-uri"]
    quiet = subprocess.run(base + args + [f"sqlite:///{tmp_path / 'a.db'}"], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert quiet.returncode == 0 and "INFO" not in quiet.stderr, quiet.stderr
    a_record(outbox, "unused", None, experiment_id="0", run_key="k2")
    loud = subprocess.run(base + ["-v"] + args + [f"sqlite:///{tmp_path / 'b.db'}"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert loud.returncode == 0 and "INFO" in loud.stderr, loud.stdout + loud.stderr


def test_registering_a_model_version_in_mlflow_3_then_annotating_it(tracking_uri, capsys):
    """The README's recipe: mlflow.register_model("runs:/<id>/profiler") fails in MLflow 3
    ("Unable to find a logged_model"); create_model_version with the run id works."""
    with mlflow.start_run() as run:
        profile_rmsnorm(MLflowProfilerCallback())
    run_id = run.info.run_id
    client = MlflowClient()
    client.create_registered_model("rmsnorm")
    version = client.create_model_version("rmsnorm", source=f"runs:/{run_id}/profiler", run_id=run_id)
    assert cli_main(["annotate", "--model", "rmsnorm", "--version", str(version.version), "--run", run_id]) == 0
    tags = client.get_model_version("rmsnorm", version.version).tags
    assert tags["perf.profile_run_id"] == run_id


def test_gitignore_covers_what_a_run_leaves_behind():
    ignored = set((ROOT / ".gitignore").read_text().split())
    assert {"mlflow-neuron-outbox/", "mlflow.db", "neuron_profile/"} <= ignored


def test_a_missing_experiment_names_the_store_that_was_searched(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'other.db'}"
    assert cli_main(["compare", "--experiment", "nope", "--tracking-uri", uri]) == EXIT_USAGE
    assert f"no experiment named 'nope' at {uri}" in capsys.readouterr().err
