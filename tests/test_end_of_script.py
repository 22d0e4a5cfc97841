"""The end of a script: its profile is in MLflow when it ends, or it says in one line what is not.

Scripts run as users run them: in a container (a PID namespace whose PID 1 is the script: when it
ends, the kernel kills every process left in it), behind a pipe, killed, and as the ranks of one
node sharing an outbox. The promises: every cycle once, the callback's own run FINISHED, nothing of
ours alive after the script, kept cycles named with the `sync` command, and `sync` (from another
namespace) delivering each kept cycle once. Budgets here are generous: the tests are about those
promises, not speed (benchmarks/fault_matrix.py and loop_cost.py time the defaults).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, TESTS
from fault_scenarios import count_cycles, kept_steps, lost_steps
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient
from servers import HungServer

from mlflow_neuron._delivery import entries
from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron.cli import main as cli_main
from mlflow_neuron.cli.arguments import EXIT_OK

BUDGET_S = 120  # the callback's flush_timeout_s in these scripts: beside busy cores a cycle may take seconds

SCRIPT = """
import os, sys, time
sys.path.insert(0, {tests!r})
import mlflow
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
mlflow.set_tracking_uri({uri!r})

def profile():
    callback = MLflowProfilerCallback(run_name="script", flush_timeout_s={budget}, outbox={outbox!r}, retry_wait_s=0.05)
    def ready(prof):
        callback(prof)
        print("CYCLE", time.time(), flush=True)  # the last one: the loop's end
    profile_rmsnorm(ready, steps=4 * {cycles}, wait=1, warmup=1, active=2)
    print("HELPER", *callback._producer.helper_pids(), flush=True)
    return callback

if {user_run}:
    with mlflow.start_run(run_name="user"):
        profile()
else:
    profile()
print("LAST LINE", time.time(), flush=True)
"""


def container_available() -> str | None:
    """Why a PID namespace cannot be made here (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --pid is not allowed here: {probe.stderr.strip()[:200]}"


def run_script(tmp_path: Path, uri: str, *, cycles: int, user_run: bool = False, container: bool = False,
               budget: float = BUDGET_S, outbox: Path | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """The script, its stdout and stderr captured through pipes (as `| tee` or a CI runner does)."""
    code = SCRIPT.format(tests=str(TESTS), uri=uri, budget=budget, cycles=cycles, user_run=user_run,
                         outbox=str(outbox or tmp_path / "outbox"))  # fmt: skip
    command = [sys.executable, "-c", code]
    if container:
        reason = container_available()
        if reason:
            pytest.skip(reason)
        command = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def script_run(client: MlflowClient, name: str):
    [run] = client.search_runs(["0"], filter_string=f"attributes.run_name = '{name}'")
    return run


def expected(cycles: int) -> list[int]:
    return [4 * (i + 1) for i in range(cycles)]


@pytest.mark.parametrize("user_run, cycles", [(False, 6), (True, 12)], ids=["own run", "user's run"])
def test_a_container_that_ends_with_the_script_has_every_cycle_in_mlflow(tmp_path, user_run, cycles, matrix_row):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_script(tmp_path, uri, cycles=cycles, user_run=user_run, container=True)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    run = script_run(client, "user" if user_run else "script")
    present, duplicated = count_cycles(client, run.info.run_id, expected(cycles))
    lost = lost_steps(client, run.info.run_id, tmp_path / "outbox", expected(cycles))
    matrix_row(cycles, present, len(kept_steps(tmp_path / "outbox")), len(lost), duplicated)
    assert lost == [] and present == cycles
    assert run.info.status == RunStatus.to_string(RunStatus.FINISHED)
    assert _outbox.pending(tmp_path / "outbox") == []
    assert "mlflow-neuron" not in result.stderr.replace("mlflow-neuron: delivering", ""), result.stderr[-2000:]


def test_a_piped_script_leaves_no_process_of_ours_behind(tmp_path, matrix_row):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_script(tmp_path, uri, cycles=2)  # returns once every holder of the pipes closed them
    assert result.returncode == 0, result.stderr[-3000:]
    helpers = [int(pid) for line in result.stdout.splitlines() if line.startswith("HELPER") for pid in line.split()[1:]]
    assert helpers, "the helper was not running during the loop"
    for pid in helpers:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"helper {pid} outlived the script"
    client = MlflowClient(uri)
    run = script_run(client, "script")
    present, duplicated = count_cycles(client, run.info.run_id, expected(2))
    lost = lost_steps(client, run.info.run_id, tmp_path / "outbox", expected(2))
    matrix_row(2, present, len(kept_steps(tmp_path / "outbox")), len(lost), duplicated)
    assert lost == [], lost  # each cycle in MLflow or kept in the outbox (and named)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_container_behind_a_pipe_on_a_hung_server_names_what_it_kept_and_sync_sends_each_once(tmp_path, matrix_row):
    outbox = tmp_path / "outbox"
    with HungServer() as hung:
        started = time.monotonic()
        result = run_script(tmp_path, hung.uri, cycles=3, container=True, budget=4)
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert took < 120, took  # the script is not held by the server: its budget, then exit
    kept = [line for line in result.stderr.splitlines() if "were not sent to" in line]
    assert len(kept) == 1, result.stderr[-3000:]
    assert "3 profiler cycle(s) (steps 4, 8, 12)" in kept[0] and f"mlflow-neuron sync --outbox {outbox}" in kept[0]
    assert len(_outbox.pending(outbox)) == 3 and kept_steps(outbox) == set(expected(3))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    os.chdir(tmp_path)
    # From this (another) PID namespace: the container's locks went with its processes.
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", store]) == EXIT_OK
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", store]) == EXIT_OK  # nothing twice
    client = MlflowClient(store)
    [run] = client.search_runs(["0"])
    present, duplicated = count_cycles(client, run.info.run_id, expected(3))
    lost = lost_steps(client, run.info.run_id, outbox, expected(3))
    matrix_row(3, present, 3, len(lost), duplicated)
    assert lost == [] and present == 3
    assert run.info.status == RunStatus.to_string(RunStatus.FINISHED)  # its end was queued after its cycles


KILLED = """
import os, sys, time
sys.path.insert(0, {tests!r})
import mlflow
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
mlflow.set_tracking_uri({uri!r})
callback = MLflowProfilerCallback(run_name="killed", outbox={outbox!r}, process="inline")
profile_rmsnorm(callback, steps=12, wait=1, warmup=1, active=2)
print("READ", callback.cycles_read, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_script_killed_after_its_loop_leaves_every_cycle_to_sync(tmp_path, dead_server, matrix_row):
    """Nobody delivered (the server was down): each cycle stays queued, and sync delivers it once."""
    outbox = tmp_path / "outbox"
    code = KILLED.format(tests=str(TESTS), uri=dead_server, outbox=str(outbox))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == -signal.SIGKILL and "READ 3" in result.stdout, result.stderr[-3000:]
    assert kept_steps(outbox) == set(expected(3))  # each cycle queued on disk before the kill
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    os.chdir(tmp_path)
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", store]) == EXIT_OK
    client = MlflowClient(store)
    [run] = client.search_runs(["0"])
    present, duplicated = count_cycles(client, run.info.run_id, expected(3))
    lost = lost_steps(client, run.info.run_id, outbox, expected(3))
    matrix_row(3, present, 3, len(lost), duplicated)
    assert lost == [] and present == 3


RANK = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import mlflow
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
rank = int(sys.argv[1])
mlflow.set_tracking_uri({uri!r})
callback = MLflowProfilerCallback(run_name=f"rank{{rank}}", outbox={outbox!r}, flush_timeout_s={budget})
profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
barrier = Path({barrier!r})
(barrier / str(rank)).touch()
while len(list(barrier.iterdir())) < {ranks}:  # every rank stays alive until all have profiled
    time.sleep(0.05)
launcher = callback._producer.helper
consumer = {{"rank": rank, "became_consumer": launcher.ready_after_s is not None,
            "holder": open(os.path.join({outbox!r}, ".consumer.lock")).read().strip()}}
callback.close()
consumer["delivered"] = callback.cycles_logged
print(json.dumps(consumer), flush=True)
"""


def test_the_ranks_of_a_node_share_one_outbox_and_one_helper_on_a_fresh_store(tmp_path, matrix_row):
    """Four ranks started at once on a sqlite file that does not exist yet: one creates the store,
    none crashes, one helper process drains for all of them, and each rank's cycles arrive once."""
    ranks, uri, outbox, barrier = 4, f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "outbox", tmp_path / "barrier"
    barrier.mkdir()
    code = RANK.format(tests=str(TESTS), uri=uri, outbox=str(outbox), budget=BUDGET_S, barrier=str(barrier),
                       ranks=ranks)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(ranks)]  # fmt: skip
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sum(r["became_consumer"] for r in reports) == 1, reports
    assert len({r["holder"] for r in reports}) == 1, reports  # the same consumer process for every rank
    assert [r["delivered"] for r in reports] == [2] * ranks
    client = MlflowClient(uri)
    runs = [script_run(client, f"rank{rank}").info.run_id for rank in range(ranks)]
    counts = [count_cycles(client, run_id, expected(2)) for run_id in runs]
    lost = [step for run_id in runs for step in lost_steps(client, run_id, outbox, expected(2))]
    matrix_row(2 * ranks, sum(p for p, _ in counts), len(kept_steps(outbox)), len(lost), sum(d for _, d in counts))
    assert lost == [] and [p for p, _ in counts] == [2] * ranks  # read from MLflow, not the callbacks' counters


HOLD = """
import sys, time
from mlflow_neuron._delivery import entries
held = entries.try_claim(__import__("pathlib").Path(sys.argv[1]))
print("held" if held else "busy", flush=True)
time.sleep(600)
"""


def test_an_entry_held_by_a_live_process_is_never_taken_and_one_whose_holder_died_is_taken_at_once(tmp_path):
    outbox = tmp_path / "outbox"
    held = entries.create(outbox)
    entries.write_json(held.path / entries.END, {"format": entries.FORMAT, "run": {"tracking_uri": "sqlite:///x"}})
    held.release()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held.path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert entries.try_claim(held.path) is None  # a live holder: never taken
    finally:
        holder.kill()
        holder.wait()
    again = entries.try_claim(held.path)  # the kernel dropped its lock with it
    assert again is not None
    again.release()


GRAB_THE_END = """
import sys, time
from pathlib import Path
from mlflow_neuron._delivery import entries
outbox, until = Path(sys.argv[1]), time.monotonic() + 120
print("ready", flush=True)
while time.monotonic() < until:
    for entry in entries.listed(outbox):
        held = (entry / entries.END).is_file() and entries.try_claim(entry)
        if held:
            print("grabbed", flush=True)
            time.sleep(600)  # a drain starved of CPU, holding the run's end
    time.sleep(0.001)
"""


def test_close_holds_the_run_end_so_a_starved_drain_cannot_take_it_and_leave_the_run_running(tmp_path):
    """Seen beside busy CPUs: the helper (nice 10) took the run's end entry and did not get the CPU
    to end the run within close()'s budget; close() warned that the run was left RUNNING. The
    training process now holds the end entry from the moment it queues it and ends the run itself."""
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    uri, outbox = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "outbox"
    callback = MLflowProfilerCallback(experiment_id="0", tracking_uri=uri, outbox=outbox, process="inline",
                                      flush_timeout_s=120, strict=True)  # fmt: skip
    profile_rmsnorm(callback)
    assert callback.flush()
    grabber = subprocess.Popen([sys.executable, "-c", GRAB_THE_END, str(outbox)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert grabber.stdout.readline().strip() == "ready"
        callback.close()
    finally:
        grabber.kill()
        said = grabber.communicate()[0]
    assert "grabbed" not in said
    assert MlflowClient(uri).get_run(callback.run_id).info.status == "FINISHED"
    assert not outbox.exists()  # every cycle and the end settled: the outbox is cleared


def test_an_entry_its_dead_writer_left_unqueued_is_removed_as_cut_short_and_the_rest_land(tmp_path, capsys):
    """The one cycle a kill can take (contract: the trace being written) is said to be cut short and
    removed: not set aside as damaged with advice to restore files that never were, and not a
    failing exit when every cycle that was queued landed."""
    store, outbox, run_id = _queued_cycles(tmp_path, 1)
    held = entries.create(outbox)
    (held.path / entries.FILES / "raw_trace.json").write_text("{", encoding="utf-8")  # killed mid-write
    held.release()
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", store]) == 0
    out = capsys.readouterr().out
    assert f"{held.name}: cut short: the process reading this cycle ended before it was queued" in out
    assert "1 cut short by their process's end" in out and "damaged" not in out
    assert not held.path.exists() and _outbox.damaged(outbox) == [] and _outbox.pending(outbox) == []
    assert count_cycles(MlflowClient(store), run_id, [4]) == (1, 0)
    # A prepared entry whose record.json went is damage, not a cut: its files are set aside, whole.
    prepared = entries.create(outbox)
    (prepared.path / entries.FILES / "manifest.json").write_text("{}", encoding="utf-8")
    prepared.release()
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", store]) == 1
    assert f"{prepared.name}: damaged, not sent: it has no record.json" in capsys.readouterr().out
    assert [p.name for p in _outbox.damaged(outbox)] == [prepared.name]


def test_a_new_entry_is_in_the_queue_only_once_it_is_held(tmp_path, monkeypatch):
    """A consumer listing the outbox between an entry's making and its lock would take it, find
    it half-written and set a live cycle aside (seen beside busy cores: a cycle lost). The entry
    enters the queue already held; one whose maker died before that is cleared, not queued."""
    outbox = tmp_path / "outbox"
    entries.create(outbox).release()  # the outbox exists
    seen_at_lock = []
    real_flock = entries.fcntl.flock

    def flock(fd, operation):
        seen_at_lock.append([p.name for p in entries.listed(outbox)])
        return real_flock(fd, operation)

    monkeypatch.setattr(entries.fcntl, "flock", flock)
    held = entries.create(outbox)
    monkeypatch.undo()
    assert seen_at_lock and held.name not in seen_at_lock[0]  # not listed before it was locked
    assert held.name in [p.name for p in entries.listed(outbox)] and entries.try_claim(held.path) is None
    held.release()
    unborn = outbox / f".{held.name}x{entries._NEW}"  # a maker killed before the rename
    (unborn / entries.FILES).mkdir(parents=True)
    os.utime(unborn, (time.time() - 120, time.time() - 120))
    assert unborn.name not in [p.name for p in entries.listed(outbox)]
    for entry in entries.listed(outbox):
        shutil.rmtree(entry)
    entries.remove_if_idle(outbox)
    assert not outbox.exists()  # the dead maker's empty folder does not keep the outbox


def _queued_cycles(tmp_path: Path, cycles: int) -> tuple[str, Path, str]:
    """(store URI, outbox, run id): `cycles` cycles of the reference loop queued in the outbox of a
    callback that drains nothing itself, into a run of a fresh sqlite store."""
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    uri, outbox = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "outbox"
    run_id = MlflowClient(uri).create_run("0").info.run_id
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, outbox=outbox, process="inline",
                                      flush_timeout_s=0.0, strict=True)  # fmt: skip
    callback._producer._kick = lambda *args: None  # queued only
    profile_rmsnorm(callback, steps=4 * cycles)  # a cycle every 4 steps
    callback._producer._stop.set()
    return uri, outbox, run_id


def test_a_slow_drain_sends_what_it_prepared_instead_of_holding_the_queue(tmp_path, monkeypatch):
    """A drain starved of CPU (the helper at nice 10 beside busy cores) held every entry it had
    prepared until its batch was full: at close the training process, draining too, found them all
    held and sent none, and 0 of 12 cycles arrived. A batch now goes once its first entry has been
    held `BATCH_HOLD_S`; every cycle still arrives once."""
    from mlflow_neuron._delivery import drain as _drain
    from mlflow_neuron._delivery.drain import BATCH, Drain
    from mlflow_neuron._delivery.report import Reporter

    monkeypatch.setattr(_drain, "BATCH_HOLD_S", 0.3)  # its 2 s, shortened: the rule, not the figure

    uri, outbox, run_id = _queued_cycles(tmp_path, 4)
    assert len(entries.listed(outbox)) == 4 < BATCH

    drain = Drain(outbox, Reporter(), credentials={uri: uri})
    prepared, sends = [], []
    prepare, send = drain.prepare, drain._send

    def slow_prepare(*args, **kwargs):
        time.sleep(2 * _drain.BATCH_HOLD_S)  # a starved process: each entry takes longer than a batch may wait
        prepared.append(args[0])
        return prepare(*args, **kwargs)

    def counted_send(ready, *args, **kwargs):
        sends.append((len(prepared), len(ready)))
        return send(ready, *args, **kwargs)

    drain.prepare, drain._send = slow_prepare, counted_send
    done = drain.once()
    assert done.count("delivered") == 4 and sends == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert count_cycles(MlflowClient(uri), run_id, [4, 8, 12, 16]) == (4, 0)


def test_a_store_with_its_schema_is_opened_without_the_store_lock(tmp_path, monkeypatch):
    """The store lock keeps two processes from creating one sqlite schema at once. A helper starved
    beside busy cores opened a ready store under it too, and the training process's own drain
    waited at close behind it. Only a store without its schema (or one not checked) takes it now."""
    from mlflow_neuron._delivery import courier as _courier
    from mlflow_neuron._delivery.courier import Courier, store_ready
    from mlflow_neuron._record.model import RunRef

    taken = []
    real = entries.store_lock

    def recorded(outbox, *args, **kwargs):
        taken.append(outbox)
        return real(outbox, *args, **kwargs)

    monkeypatch.setattr(_courier.entries, "store_lock", recorded)
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert not store_ready(fresh)
    Courier(tmp_path / "outbox").logger(RunRef(fresh, None, experiment_id="0"), create=False)
    assert len(taken) == 1 and store_ready(fresh)  # the warm made the schema, under the lock
    Courier(tmp_path / "outbox").logger(RunRef(fresh, None, experiment_id="0"), create=False)
    assert len(taken) == 1  # a second process opens it without
    assert store_ready("http://127.0.0.1:5000") and not store_ready("postgresql://u@h/db")
    (tmp_path / "empty.db").write_bytes(b"")
    assert not store_ready(f"sqlite:///{tmp_path / 'empty.db'}")


def test_a_send_lock_held_past_its_patience_does_not_stop_a_send(tmp_path, monkeypatch):
    """The send lock keeps an outbox's drains from sending at once. A helper starved beside busy
    cores held it through a whole delivery, and the training process, draining at close with 10 s
    left, sent nothing. A drain now waits `SEND_LOCK_PATIENCE_S` for it, then sends anyway; with
    less time left than that, it keeps the cycle, as before."""
    from mlflow_neuron._delivery import courier as _courier
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    monkeypatch.setattr(_courier, "SEND_LOCK_PATIENCE_S", 0.5)  # its 2 s, shortened: the rule, not the figure
    uri, outbox, run_id = _queued_cycles(tmp_path, 2)
    held = entries.lock_file(outbox / entries.SEND_LOCK, blocking=False)  # another process sending, for good
    try:
        short = Drain(outbox, Reporter(), credentials={uri: uri}).once(deadline=time.monotonic() + 0.2)
        assert short.count("delivered") == 0 and short.count("kept") == 2
        done = Drain(outbox, Reporter(), credentials={uri: uri}).once(deadline=time.monotonic() + 600)
        assert done.count("delivered") == 2
    finally:
        held.release()
    assert count_cycles(MlflowClient(uri), run_id, [4, 8]) == (2, 0)


def test_a_drain_not_yet_sending_prepares_each_cycle_and_leaves_it_whole_for_whoever_sends(tmp_path):
    """The helper prepares cycles while it imports MLflow (`sending` unset): each is prepared and
    left in the queue, nothing reaches the store; then the training process's drain (or the
    helper's, once set) sends each once."""
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    uri, outbox, run_id = _queued_cycles(tmp_path, 3)
    queued = entries.listed(outbox)
    assert [entries.state(e) for e in queued] == [entries.QUEUED] * 3
    sending = threading.Event()
    helper = Drain(outbox, Reporter(), credentials={uri: uri}, sending=sending)
    done = helper.once()
    assert (done.busy, done.outcomes) == (3, [])
    assert [entries.state(e) for e in entries.listed(outbox)] == [entries.PREPARED] * 3
    assert count_cycles(MlflowClient(uri), run_id, [4, 8, 12]) == (0, 0)
    written = [(e / "record.json").stat().st_mtime_ns for e in entries.listed(outbox)]
    claims = []
    with pytest.MonkeyPatch.context() as patch:  # a pass that claimed them would make the training drain wait
        patch.setattr(entries, "try_claim", lambda entry: claims.append(entry))
        assert helper.once().busy == 3  # held back again, not prepared twice, and not even claimed
    assert claims == []
    assert [(e / "record.json").stat().st_mtime_ns for e in entries.listed(outbox)] == written
    training = Drain(outbox, Reporter(), credentials={uri: uri})
    assert training.once().count("delivered") == 3
    sending.set()
    assert helper.once().outcomes == []  # nothing left
    assert count_cycles(MlflowClient(uri), run_id, [4, 8, 12]) == (3, 0)
    assert entries.listed(outbox) == []


def test_a_nudge_wakes_a_following_drain_at_once_and_each_pass_is_heard(tmp_path):
    """The training process writes a byte to the helper's input for each cycle it queues: the
    helper's drain looks at once instead of at its next poll (here an hour away), and each pass
    is handed to `on_pass` (the helper tells a waiting close() what it settled)."""
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    uri, outbox, run_id = _queued_cycles(tmp_path, 2)
    queued = entries.listed(outbox)
    for entry in queued:  # out of sight while the drain makes its first pass
        entry.rename(entry.with_name("." + entry.name))
    stop, wake, passes, first = threading.Event(), threading.Event(), [], threading.Event()
    drain = Drain(outbox, Reporter(), credentials={uri: uri})
    thread = threading.Thread(target=drain.follow, args=(stop, wake, 3600.0),
                              kwargs={"on_pass": lambda done: (passes.append(done), first.set())})  # fmt: skip
    thread.start()
    try:
        assert first.wait(120) and passes[0].outcomes == []
        for entry in queued:
            entry.with_name("." + entry.name).rename(entry)
        time.sleep(0.5)
        assert len(passes) == 1 and [entries.state(e) for e in queued] == [entries.QUEUED] * 2  # not looked at
        wake.set()
        deadline = time.monotonic() + 300
        while sum(p.count("delivered") for p in passes) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        wake.set()
        thread.join(300)
    assert not thread.is_alive()
    assert sum(p.count("delivered") for p in passes) == 2
    assert count_cycles(MlflowClient(uri), run_id, [4, 8]) == (2, 0)


def test_the_helper_says_when_it_settled_cycles_and_a_nudge_never_blocks_the_training_thread(tmp_path):
    """Through the real pipes: the helper tells the training process after a pass that settled
    cycles (its waiting close() looks at once). A nudge to a helper that reads nothing (stopped,
    or hung) returns at once, past the pipe's 64 KiB, instead of blocking the training thread."""
    from mlflow_neuron._delivery.helper_process import HelperLauncher
    from mlflow_neuron._delivery.report import Reporter

    uri, outbox, run_id = _queued_cycles(tmp_path, 2)
    settled = threading.Event()
    launcher = HelperLauncher(outbox, {"credentials": {uri: uri}}, Reporter())
    launcher.on_settled = settled.set
    launcher.ensure()
    try:
        assert settled.wait(300), "the helper never said it settled a cycle"
    finally:
        launcher.stop(30)
    assert count_cycles(MlflowClient(uri), run_id, [4, 8])[0] >= 1

    deaf = HelperLauncher(tmp_path / "other", {}, Reporter(), command=(sys.executable, "-c", "import time; time.sleep(600)"))
    deaf.ensure()
    try:
        for _ in range(100_000):  # a blocking write would hang here for good
            deaf.nudge()
    finally:
        deaf.stop(0.1)
    assert deaf.proc.poll() is not None


STARVED_HELPER = """
import os, subprocess, sys
os.sched_setaffinity(0, {0})
hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\\nwhile True: pass"])
try:
    import time
    time.sleep(0.5)  # the hog is running
    os.nice(10)
    from mlflow_neuron._delivery.helper import Pace
    pace = Pace()
    sum(range(3 * 10**6))  # a pass's CPU, beside a nice-0 process on the same core
    pace.after_pass()
    print(pace.heed)
finally:
    hog.kill()
"""


def test_a_helper_starved_of_cpu_does_not_jump_on_the_cycle_just_queued():
    """Beside busy cores the helper (nice 10) would hold the cycle it was nudged about at a tenth
    of a core, and close() waited for it: after a pass in which it waited for a CPU, it heeds no
    nudge (the training process takes the cycle). Where the kernel does not say, it always does."""
    from mlflow_neuron._delivery import helper

    if helper.run_delay_ns() is None or not hasattr(os, "sched_setaffinity"):
        pytest.skip("this kernel does not say how long a thread waited for a CPU (/proc/thread-self/schedstat)")
    out = subprocess.run([sys.executable, "-c", STARVED_HELPER], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout.split()  # fmt: skip
    assert out[0] == "False"  # starved: nudges are not heeded
    with pytest.MonkeyPatch.context() as patch:  # a kernel that does not say: nudges are always heeded
        patch.setattr(helper, "run_delay_ns", lambda: None)
        pace = helper.Pace()
        pace.after_pass()
        assert pace.heed


DEAD_HELPER_NUDGED = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as scripts piped into `head` do
from mlflow_neuron._delivery.helper_process import HelperLauncher
from mlflow_neuron._delivery.report import Reporter
launcher = HelperLauncher(Path(sys.argv[1]), {}, Reporter(), command=(sys.executable, "-c", "pass"))
launcher.ensure()
launcher.proc.wait()
time.sleep(0.2)  # its pipe's read end is closed now
for _ in range(3):
    launcher.nudge()
print("alive")
"""


def test_a_nudge_to_a_helper_that_has_exited_never_ends_training_even_with_sigpipe_restored(tmp_path):
    """A write into the pipe of a helper that has exited raises SIGPIPE; a script that restored its
    default action (it ends the process) was killed by the first nudge after its helper died."""
    done = subprocess.run([sys.executable, "-c", DEAD_HELPER_NUDGED, str(tmp_path / "outbox")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "alive"), done.stderr[-2000:]
