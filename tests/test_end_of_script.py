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
holder = open(os.path.join({outbox!r}, ".helper.lock")).read().strip()
consumer = {{"rank": rank, "holder": holder,  # the helper of the node: this rank's, or another's
            "became_consumer": launcher.proc is not None and holder == str(launcher.proc.pid)}}
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
    assert len({r["holder"] for r in reports}) == 1, reports  # the same helper process for every rank
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

HOLD_LOCK = HOLD.replace("entries.try_claim(__import__(\"pathlib\").Path(sys.argv[1]))",
                         "entries.lock_file(__import__(\"pathlib\").Path(sys.argv[1]), blocking=False)")


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


HUNG_HELPER = """
import sys, time
from pathlib import Path
from mlflow_neuron._delivery import entries
held = entries.lock_file(Path(sys.argv[1]) / entries.CONSUMER_LOCK, blocking=True, timeout=60)
entries.mark_holder(held)
time.sleep(600)  # in a pass for good: hung on a request, or starved; its input's end is not heard
"""


def test_a_hung_helper_does_not_decide_how_close_ends(tmp_path):
    """close() stops the helper first (killed when it does not stop), takes the consumer lock, and
    drains and ends the run itself: a helper hung in a pass, holding the lock, leaves nothing
    RUNNING and nothing in the outbox."""
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback
    from mlflow_neuron._delivery.helper_process import HelperLauncher

    uri, outbox = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "outbox"
    callback = MLflowProfilerCallback(experiment_id="0", tracking_uri=uri, outbox=outbox, flush_timeout_s=2,
                                      strict=True)  # fmt: skip
    producer = callback._producer
    producer.helper.stop()
    hung = producer.helper = HelperLauncher(outbox, {}, callback.reporter, command=(sys.executable, "-c", HUNG_HELPER))
    hung.ensure()
    lock = outbox / entries.CONSUMER_LOCK
    deadline = time.monotonic() + 120
    while entries.holder_pid(lock) != hung.proc.pid and time.monotonic() < deadline:
        time.sleep(0.05)
    assert entries.lock_file(lock, blocking=False) is None  # the hung helper holds it
    profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)  # two cycles, queued behind it (the stop waits 2 s)
    callback.close(timeout=300)
    assert hung.proc.poll() is not None  # stopped: killed when it did not stop by itself
    assert count_cycles(MlflowClient(uri), callback.run_id, [4, 8]) == (2, 0)
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
    callback that drains nothing itself, into a run of a fresh sqlite store (its artifacts under
    `tmp_path`, not the default ./mlruns of the working directory)."""
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    uri, outbox = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "outbox"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("queued", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment_id).info.run_id
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, outbox=outbox, process="inline",
                                      flush_timeout_s=0.0, strict=True)  # fmt: skip
    callback._producer._kick = lambda *args: None  # queued only
    profile_rmsnorm(callback, steps=4 * cycles)  # a cycle every 4 steps
    callback._producer._stop.set()
    return uri, outbox, run_id


def test_a_drain_does_nothing_while_another_process_holds_the_consumer_lock(tmp_path):
    """Every drain (the helper, the training process at a stop or close, sync) makes each pass under
    the outbox's consumer lock. While another process holds it, a pass does nothing and says so."""
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    uri, outbox, _ = _queued_cycles(tmp_path, 2)
    lock = outbox / entries.CONSUMER_LOCK
    other = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "held"
        waited = Drain(outbox, Reporter(), credentials={uri: uri}).once(wait_s=0.2)
        assert waited.other and waited.outcomes == [] and len(entries.listed(outbox)) == 2  # nothing touched
    finally:
        other.kill()
        other.wait()


def test_one_drain_at_a_time_each_cycle_once_whoever_holds_the_consumer_lock(tmp_path):
    """Two drains of one outbox, each passing as often as it can: never two passes at once (the
    consumer lock, taken on its own open file by each drain), and each cycle delivered once.

    A pass of either drain, once inside, waits for the other drain to try too: the other is turned
    away (`Pass.other`) while the lock holds, and gets in beside it where no lock is taken; then it
    goes on. Without the lock, the passes overlap whatever the machine's speed; with it, no pass
    ever sees the other drain inside."""
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    uri, outbox, run_id = _queued_cycles(tmp_path, 4)
    seen = threading.Condition()
    inside, turned_away, finished, passes = [False, False], [0, 0], [False, False], [0, 0]
    overlaps: list[str] = []

    class Watched(Drain):
        """A drain that notes when its pass (what `once` runs under the consumer lock) begins and ends."""

        def __init__(self, i: int) -> None:
            super().__init__(outbox, Reporter(), credentials={uri: uri})
            self.i = i

        def _pass(self, *args, **kwargs):
            i, j = self.i, 1 - self.i
            with seen:
                passes[i] += 1
                if inside[j]:
                    overlaps.append(f"drain {i} began pass {passes[i]} while drain {j} was in its pass {passes[j]}")
                inside[i] = True
                seen.notify_all()
                tries = turned_away[j]
                seen.wait_for(lambda: inside[j] or turned_away[j] > tries or finished[j], timeout=120)
            try:
                return super()._pass(*args, **kwargs)
            finally:
                with seen:
                    inside[i] = False
                    seen.notify_all()

    drains = [Watched(i) for i in range(2)]
    delivered = [0, 0]

    def drain_until_empty(i: int) -> None:
        try:
            while entries.listed(outbox):
                done = drains[i].once(wait_s=0.01)
                delivered[i] += done.count("delivered")
                with seen:
                    turned_away[i] += done.other
                    seen.notify_all()
        finally:
            with seen:
                finished[i] = True
                seen.notify_all()

    threads = [threading.Thread(target=drain_until_empty, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert sum(passes) >= 1, "no pass ran through Drain._pass: this test watches nothing"
    assert not overlaps, f"two drains of one outbox were in a pass at once, {len(overlaps)} times; first: {overlaps[0]}"
    assert sum(delivered) == 4
    assert count_cycles(MlflowClient(uri), run_id, [4, 8, 12, 16]) == (4, 0)


def test_a_following_drain_finds_new_cycles_by_itself(tmp_path):
    """The helper is told nothing per cycle: its drain looks at the outbox folder every poll and
    makes a pass when it changed; each pass is handed to `on_pass`."""
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    uri, outbox, run_id = _queued_cycles(tmp_path, 2)
    queued = entries.listed(outbox)
    for entry in queued:  # out of sight while the drain makes its first pass
        entry.rename(entry.with_name("." + entry.name))
    stop, passes, first = threading.Event(), [], threading.Event()
    drain = Drain(outbox, Reporter(), credentials={uri: uri})
    thread = threading.Thread(target=drain.follow, args=(stop, 0.05),
                              kwargs={"on_pass": lambda done: (passes.append(done), first.set())})  # fmt: skip
    thread.start()
    try:
        assert first.wait(120) and passes[0].outcomes == []
        for entry in queued:
            entry.with_name("." + entry.name).rename(entry)
        deadline = time.monotonic() + 300
        while sum(p.count("delivered") for p in passes) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive()
    assert sum(p.count("delivered") for p in passes) == 2
    assert count_cycles(MlflowClient(uri), run_id, [4, 8]) == (2, 0)


DEAD_HELPER_WRITTEN = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as scripts piped into `head` do
from mlflow_neuron._delivery.helper_process import HelperLauncher, write_input
from mlflow_neuron._delivery.report import Reporter
launcher = HelperLauncher(Path(sys.argv[1]), {}, Reporter(), command=(sys.executable, "-c", "pass"))
launcher.ensure()
launcher.proc.wait()
time.sleep(0.2)  # its pipe's read end is closed now
for _ in range(3):
    try:
        write_input(launcher.proc.stdin.fileno(), b"{}\\n")
    except OSError:
        pass
print("alive")
"""


def test_a_write_to_a_helper_that_has_exited_never_ends_training_even_with_sigpipe_restored(tmp_path):
    """A write into the pipe of a helper that has exited raises SIGPIPE; a script that restored its
    default action (it ends the process) would be killed by it."""
    done = subprocess.run([sys.executable, "-c", DEAD_HELPER_WRITTEN, str(tmp_path / "outbox")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "alive"), done.stderr[-2000:]
