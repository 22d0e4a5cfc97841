"""Faults of the outbox and of `sync`, each asserting every cycle delivered once, kept, or named as
damaged: two syncs at once, damaged records of each kind, a writer killed before its rename, a run
the user gave, a server gone mid-sync, a transient database race, credentials in the URI.

Concurrency and credentials run against a real `mlflow server` on 127.0.0.1; the rest against a
sqlite store (their behaviour does not depend on the network)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, profile_offline
from mlflow.entities import RunStatus
from mlflow.exceptions import RestException
from mlflow.tracking import MlflowClient
from servers import MlflowServer
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import entries
from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron._delivery.failures import is_permanent, is_unreachable
from mlflow_neuron.cli import main as cli_main
from mlflow_neuron.cli.arguments import EXIT_BUSY, EXIT_FAILED, EXIT_OK

FIXTURES = ROOT / "tests" / "fixtures"

STEPS = [4, 8, 12]  # profile_offline's three cycles


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("sync-faults-server")) as running:
        yield running


def sync_process(outbox: Path, uri: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlflow_neuron.cli", "sync", "--outbox", str(outbox),
                             "--tracking-uri", uri, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def cycles_in(client: MlflowClient, experiment_id: str) -> dict[str, list[int]]:
    """{run id: the steps of its cycles} for every live run of the experiment."""
    runs = client.search_runs([experiment_id])
    return {r.info.run_id: [m.step for m in client.get_metric_history(r.info.run_id, "profiler/total/active_steps")]
            for r in runs}  # fmt: skip


def offline_records(tmp_path: Path, name: str = "outbox", **kwargs) -> Path:
    outbox = tmp_path / name
    with socket_free_port() as dead:
        profile_offline(dead, outbox, **kwargs)
    assert len(_outbox.pending(outbox)) == kwargs.get("cycles", 3)
    return outbox


class socket_free_port:
    """An http URI where nothing listens (the dead_server fixture, usable more than once a test)."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        pass


# -- two syncs at once ------------------------------------------------------------------------------


@pytest.mark.parametrize("existing_run", [False, True], ids=["run-created-by-sync", "existing-run"])
def test_two_syncs_started_together_deliver_each_cycle_once(server, tmp_path, existing_run, matrix_row):
    client = MlflowClient(server.uri)
    experiment = client.create_experiment(f"two-syncs-{existing_run}")
    kwargs = {"experiment_id": experiment}
    if existing_run:
        given = client.create_run(experiment).info.run_id
        kwargs = {"run_id": given}
    outbox = tmp_path / "outbox"
    with socket_free_port() as dead:
        callback = MLflowProfilerCallback(tracking_uri=dead, outbox=outbox, retry_wait_s=0.01, **kwargs)
        with pytest.warns(MLflowNeuronWarning, match="not sent"):
            profile_rmsnorm(callback, steps=12, wait=1, warmup=1, active=2)
            callback.close()
    assert len(_outbox.pending(outbox)) == 3

    syncs = [sync_process(outbox, server.uri) for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in syncs]
    codes = sorted(code for code, _, _ in results)
    assert codes in ([EXIT_OK, EXIT_OK], [EXIT_OK, EXIT_BUSY]), results  # the second waits its turn or says so
    for code, _, err in results:
        if code == EXIT_BUSY:
            assert "another process (pid " in err and "is delivering the outbox" in err, err
    assert _outbox.pending(outbox) == [] and _outbox.rejected(outbox) == [] and _outbox.damaged(outbox) == []
    [(run_id, steps)] = cycles_in(client, experiment).items()  # one run, each cycle once
    assert steps == STEPS
    if existing_run:
        assert run_id == given
    matrix_row(len(STEPS), len(set(steps)), len(STEPS), 0, len(steps) - len(set(steps)))


def test_a_sync_finding_the_outbox_locked_says_by_whom_and_changes_nothing(sync_store, tmp_path, capsys):
    outbox = offline_records(tmp_path)
    before = _outbox.pending(outbox)
    # as a helper's or a sync's pass holds it; the callback's close() stopped its helper and let go
    # of the lock before it returned: free at once
    held = entries.lock_file(outbox / entries.CONSUMER_LOCK, blocking=False)
    assert held is not None, f"the outbox is still held by pid {entries.holder_pid(outbox / entries.CONSUMER_LOCK)}"
    entries.mark_holder(held)
    try:
        assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_BUSY
    finally:
        held.release()
    err = capsys.readouterr().err
    assert f"another process (pid {os.getpid()}) is delivering the outbox {outbox}" in err
    assert _outbox.pending(outbox) == before
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK  # released


def test_the_runs_summary_after_sync_covers_every_cycle_whoever_prepared_each(sync_store, tmp_path):
    """Offline, the helper and the training process (at close) prepare the run's cycles at once, so a
    cycle's summary may leave out one prepared beside it. The run's latest summary is the one made
    last, over every cycle: what `history` reads agrees with the run's tables."""
    from mlflow_neuron._record.run_summary import summary_key

    for attempt in range(3):  # who prepares which cycle differs from run to run
        outbox = offline_records(tmp_path, name=f"outbox-{attempt}", cycles=4)
        assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK
    client = MlflowClient(sync_store)
    runs = client.search_runs(["0"], filter_string="attributes.run_name = 'offline'")
    assert len(runs) == 3
    for run in runs:  # 4 cycles of 2 active steps each
        assert run.data.metrics[summary_key("self_cpu_time_us", "n_steps")] == 8, run.info.run_id


def test_a_record_another_process_is_sending_is_left_to_it(sync_store, tmp_path, capsys):
    outbox = offline_records(tmp_path)
    held = _outbox.pending(outbox)[1]
    claim = entries.try_claim(held)
    assert claim is not None
    try:
        assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_FAILED
    finally:
        claim.release()
    out = capsys.readouterr().out
    assert f"{held.name}: kept, a training process is writing it" in out
    assert _outbox.pending(outbox) == [held]  # untouched: its sender settles it
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK
    client = MlflowClient(sync_store)
    [(_, steps)] = cycles_in(client, "0").items()
    assert sorted(steps) == STEPS


def test_runs_made_for_one_key_at_once_collapse_into_the_first(sync_store):
    """Two processes that both found no run for a key and both created one: each keeps the first."""
    import time

    from mlflow_neuron._delivery.mlflow_io import RunLogger
    from mlflow_neuron._record.model import RUN_KEY_TAG, RunRef

    client = MlflowClient(sync_store)
    earlier_ms = int(time.time() * 1000) - 1000
    first = client.create_run("0", start_time=earlier_ms, tags={RUN_KEY_TAG: "k-race"}).info.run_id  # the other's
    logger = RunLogger(RunRef(sync_store, None, "0", "race", "k-race"))
    search, searches = logger._runs_with_key, []

    def searched_before_the_other_process_created() -> list:
        searches.append(1)
        return [] if len(searches) == 1 else search()

    logger._runs_with_key = searched_before_the_other_process_created
    assert logger.ensure_run() == first
    assert [r.info.run_id for r in client.search_runs(["0"])] == [first]  # its own run deleted, nothing in it


# -- damaged records ------------------------------------------------------------------------------------


def _null(record: Path) -> str:
    (record / "record.json").write_text("null")
    return "record.json holds NoneType, not a record"


def _list(record: Path) -> str:
    (record / "record.json").write_text("[]")
    return "record.json holds list, not a record"


def _format_only(record: Path) -> str:
    (record / "record.json").write_text('{"format": 1}')
    return "record.json lacks run, step"


def _wrong_type(record: Path) -> str:
    data = json.loads((record / "record.json").read_text())
    data["step"] = "four"
    (record / "record.json").write_text(json.dumps(data))
    return "record.json has step of type str"


def _no_record_json(record: Path) -> str:
    (record / "record.json").unlink()
    return "it has no record.json"


def _deleted_file(record: Path) -> str:
    (record / "files" / "ops.json").unlink()
    return "files/ops.json is missing"


def _overwritten_file(record: Path) -> str:
    with open(record / "files" / "steps.json", "r+b") as f:
        f.write(os.urandom(400))
    return "files/steps.json"


DAMAGE = [_null, _list, _format_only, _wrong_type, _no_record_json, _deleted_file, _overwritten_file]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda d: d.__name__.strip("_"))
def test_a_damaged_record_is_set_aside_by_name_and_the_others_go_on(sync_store, tmp_path, capsys, damage,
                                                                     matrix_row):
    outbox = offline_records(tmp_path)
    broken = _outbox.pending(outbox)[0]
    backup = tmp_path / "backup"
    shutil.copytree(broken, backup)
    why = damage(broken)

    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_FAILED
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith(f"{broken.name}") or f"] {broken.name}:" in line]
    assert "damaged, not sent" in line and why in line, out
    [aside] = _outbox.damaged(outbox)
    assert aside.name == broken.name and why in _outbox.reason_of(aside)
    assert _outbox.pending(outbox) == []
    client = MlflowClient(sync_store)
    [(run_id, steps)] = cycles_in(client, "0").items()
    assert steps == STEPS[1:]  # the others, once; nothing of the damaged one was uploaded
    assert not any(p.path.startswith("profiler/step_4") for p in client.list_artifacts(run_id, "profiler"))

    # Later syncs pass and name it; restored, --retry-damaged checks it again and sends it once.
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK
    assert f"{aside.name}: " in capsys.readouterr().out
    shutil.rmtree(aside)
    shutil.copytree(backup, aside)
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store, "--retry-damaged"]) == EXIT_OK
    assert _outbox.damaged(outbox) == [] and _outbox.pending(outbox) == []
    steps = cycles_in(client, "0")[run_id]
    assert sorted(steps) == STEPS
    matrix_row(len(STEPS), len(set(steps)), len(STEPS), 0, len(steps) - len(set(steps)))


def test_retry_damaged_keeps_a_record_that_is_still_damaged(sync_store, tmp_path):
    outbox = offline_records(tmp_path, cycles=1)
    _deleted_file(_outbox.pending(outbox)[0])
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_FAILED
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store, "--retry-damaged"]) == EXIT_FAILED
    [aside] = _outbox.damaged(outbox)
    assert "files/ops.json is missing" in _outbox.reason_of(aside)


# -- runs sync owns, exit codes, transient races -----------------------------------------------------------


def test_sync_leaves_a_run_the_user_gave_running(sync_store, tmp_path, matrix_row):
    client = MlflowClient(sync_store)
    given = client.create_run("0").info.run_id
    outbox = tmp_path / "outbox"
    with socket_free_port() as dead:
        callback = MLflowProfilerCallback(run_id=given, tracking_uri=dead, outbox=outbox, retry_wait_s=0.01)
        with pytest.warns(MLflowNeuronWarning, match="not sent"):
            profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
            callback.close()
    assert all(_outbox.run_key_of(r) is None for r in _outbox.pending(outbox))  # given, not created
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK
    run = client.get_run(given)
    assert run.info.status == RunStatus.to_string(RunStatus.RUNNING)
    assert [m.step for m in client.get_metric_history(given, "profiler/total/active_steps")] == [4, 8]
    matrix_row(2, 2, 2, 0, 0)


def test_a_server_gone_after_changes_began_is_exit_1_not_3(sync_store, tmp_path, capsys):
    """Exit 3 promises that nothing was changed: once a record went in, a dead server is exit 1."""
    outbox = offline_records(tmp_path, cycles=2)
    first, second = _outbox.pending(outbox)
    with socket_free_port() as dead:
        _point_at(first, sync_store)  # the first record's store answers; the second's server is gone
        _point_at(second, dead)
        assert cli_main(["sync", "--outbox", str(outbox)]) == EXIT_FAILED
    captured = capsys.readouterr()
    assert "is not reachable" in captured.err and "step 4 -> run" in captured.out
    assert _outbox.pending(outbox) == [second]


def test_nothing_changed_on_a_dead_server_is_exit_3(tmp_path):
    outbox = offline_records(tmp_path, cycles=1)
    with socket_free_port() as dead:
        assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", dead]) == 3
    assert len(_outbox.pending(outbox)) == 1


def _point_at(record: Path, tracking_uri: str) -> None:
    """Edits the server a record names (record.json is not among the files its seal covers)."""
    data = json.loads((record / "record.json").read_text())
    data["run"]["tracking_uri"] = tracking_uri
    (record / "record.json").write_text(json.dumps(data))


@pytest.mark.parametrize("message", [
    "INVALID_PARAMETER_VALUE: (sqlite3.IntegrityError) FOREIGN KEY constraint failed [SQL: INSERT INTO trace_tags",
    "INVALID_PARAMETER_VALUE: (psycopg2.errors.UniqueViolation) duplicate key value violates unique constraint",
    "BAD_REQUEST: (sqlite3.OperationalError) database is locked",
])  # fmt: skip
def test_a_database_race_on_the_server_is_never_a_permanent_refusal(message):
    """What the REST client raises for a server's answer; the same codes without a race stay final."""
    code, _, text = message.partition(": ")
    assert not is_permanent(RestException({"error_code": code, "message": text}))
    assert is_permanent(RestException({"error_code": code, "message": "Run 'x' must be in the 'active' state"}))


def test_a_server_that_stops_halfway_through_its_answer_did_not_answer():
    """A server that dies while it writes a body: MLflow's client raises a cut-off read. That is no
    answer (the cycle stays kept, sync says the server is unreachable), never a refusal."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_half() -> None:
        with listener:
            for _ in range(8):  # MLflow's client retries; each try is cut off the same way
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 500\r\n\r\n{\"experiment\": {")  # fmt: skip

    threading.Thread(target=answer_half, daemon=True).start()
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    creds = MlflowHostCreds(f"http://127.0.0.1:{listener.getsockname()[1]}")
    with pytest.raises(Exception) as caught:
        http_request(creds, "/api/2.0/mlflow/experiments/get", "GET", max_retries=0, timeout=5,
                     params={"experiment_id": "0"})  # fmt: skip
    listener.close()
    assert is_unreachable(caught.value), repr(caught.value)
    assert not is_permanent(caught.value)


# -- no secret in any output ----------------------------------------------------------------------------


PASSWORD = "hunter2-7f3a"


def test_no_output_of_a_failing_run_or_its_sync_shows_the_password(server, tmp_path):
    """The callback against a dead server, then sync to a live one, both with user:password@ in
    the URI: warnings, stdout, stderr, log lines and the outbox's files are searched."""
    outbox = tmp_path / "outbox"
    script = tmp_path / "train.py"
    with socket_free_port() as dead:
        secret_dead = dead.replace("http://", f"http://alice:{PASSWORD}@")
        script.write_text(
            "import logging, sys\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "logging.basicConfig(level=logging.WARNING)\n"
            "logging.getLogger('mlflow_neuron').setLevel(logging.DEBUG)\n"
            "from workloads import profile_rmsnorm\n"
            "from mlflow_neuron import MLflowProfilerCallback\n"
            f"cb = MLflowProfilerCallback(tracking_uri={secret_dead!r}, experiment_id='0', outbox={str(outbox)!r},"
            " retry_wait_s=0.01)\n"
            "profile_rmsnorm(cb, steps=8, wait=1, warmup=1, active=2)\n"
            "cb.close()\n"
        )
        train = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                               timeout=600)  # fmt: skip
        assert train.returncode == 0, train.stderr[-3000:]
        assert "not sent to http://***@127.0.0.1" in train.stderr
        dead_sync = subprocess.run([sys.executable, "-m", "mlflow_neuron.cli", "-v", "sync", "--outbox", str(outbox),
                                    "--tracking-uri", secret_dead], capture_output=True, text=True)  # fmt: skip
        assert dead_sync.returncode == 3
    live_uri = server.uri.replace("http://", f"http://alice:{PASSWORD}@")
    live_sync = sync_process(outbox, live_uri, "--verbose")
    out, err = live_sync.communicate(timeout=600)
    assert live_sync.returncode == EXIT_OK, out + err
    assert "at http://***@127.0.0.1" in out
    outputs = [train.stdout, train.stderr, dead_sync.stdout, dead_sync.stderr, out, err]
    outputs += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".py"]
    leaks = [text for text in outputs if PASSWORD in text]
    assert not leaks, [text[max(text.index(PASSWORD) - 200, 0):][:400] for text in leaks]


def test_a_warning_with_an_error_that_names_the_uri_is_redacted():
    from mlflow_neuron._delivery.report import Reporter

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Reporter(strict=False).problem("x", f"sent to http://bob:{PASSWORD}@h:1",
                                       ConnectionError(f"https://bob:{PASSWORD}@h:1/api refused"))  # fmt: skip
    [warning] = caught
    assert PASSWORD not in str(warning.message)
    assert "http://***@h:1" in str(warning.message) and "https://***@h:1/api" in str(warning.message)


# -- kill -9 while the cycles are being sent -------------------------------------------------------------


def test_a_kill_while_sending_to_a_hung_server_loses_nothing(sync_store, tmp_path, matrix_row):
    """No run exists yet and the server accepts connections but never answers; the cycles are
    processed in the training process (process="inline"). Each is written ahead to the outbox
    before its delivery starts, so kill -9 during the exit flush leaves every cycle in the outbox
    and no staging folder behind; sync then delivers each cycle once. (Through the helper, a kill
    of the training process leaves the helper to store them: test_fault_matrix.)"""
    from servers import HungServer

    outbox, staging = tmp_path / "outbox", tmp_path / "tmp"
    staging.mkdir()
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from workloads import profile_rmsnorm\n"
        "from mlflow_neuron import MLflowProfilerCallback\n"
        "cb = MLflowProfilerCallback(tracking_uri=URI, experiment_id='0', run_name='killed', outbox=OUTBOX,"
        " flush_timeout_s=600, retries=50, process='inline')\n"  # never stored for having failed: only written ahead
        "profile_rmsnorm(cb, steps=12, wait=1, warmup=1, active=2)\n"
    )  # the profiler's exit waits on the hung server for up to flush_timeout_s
    with HungServer(lifetime_s=900) as hung:
        code = f"URI = {hung.uri!r}\nOUTBOX = {str(outbox)!r}\n" + script
        env = {**os.environ, "TMPDIR": str(staging)}
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=tmp_path)  # fmt: skip
        try:
            deadline = time.monotonic() + 300  # written ahead while the first delivery hangs; slow on a busy host
            while len(_outbox.pending(outbox)) < 3 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert proc.poll() is None, "the process was to be killed while its cycles were being sent"
            assert len(_outbox.pending(outbox)) == 3, proc.stderr.read() if proc.poll() is not None else ""
        finally:
            proc.kill()  # SIGKILL: no atexit, no finally
            proc.wait()
    assert [p.name for p in staging.iterdir() if p.name.startswith("mlflow-neuron-")] == []  # nothing left aside

    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK
    [(_, steps)] = cycles_in(MlflowClient(sync_store), "0").items()
    assert steps == STEPS
    matrix_row(len(STEPS), len(STEPS), len(STEPS), 0, 0)


def test_an_outbox_written_before_one_consumer_still_syncs_whole(sync_store, tmp_path):
    """An outbox written by 3ddfbdc (`tests/fixtures/outbox-3ddfbdc`: two prepared records and their
    run's end, a queued job and its run's end, the send lock file of that version) syncs whole:
    records already written in today's format are read as they are."""
    outbox = tmp_path / "outbox"
    shutil.copytree(FIXTURES / "outbox-3ddfbdc", outbox)
    for folder in [outbox, *(p for p in outbox.rglob("*") if p.is_dir())]:
        os.chmod(folder, 0o700)  # a checkout's folders are 0755; an outbox is private
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == EXIT_OK
    client = MlflowClient(sync_store)
    runs = {run.info.run_name: run for run in client.search_runs(["0"])}
    assert sorted(runs) == ["from-3ddfbdc", "from-3ddfbdc-queued"]
    steps = cycles_in(client, "0")
    assert sorted(steps[runs["from-3ddfbdc"].info.run_id]) == [4, 8]
    assert steps[runs["from-3ddfbdc-queued"].info.run_id] == [4]
    assert {run.info.status for run in runs.values()} == {"FINISHED"}  # each run ended once its cycles were in
    assert entries.listed(outbox) == [] and _outbox.rejected(outbox) == [] and _outbox.damaged(outbox) == []
