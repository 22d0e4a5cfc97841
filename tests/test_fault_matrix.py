"""The faults of the training side, each against a real `mlflow server` on 127.0.0.1: refusals
with Retry-After, a reset mid-upload, a full disk (with the fallback usable and unusable), and
kill -9 of a training process whose helper holds the cycles. Each asserts, for every cycle the
profiler produced, that it landed exactly once, or is kept in a folder the warnings named, or is
counted as lost in a warning; and that no cycle landed twice.

With MLFLOW_NEURON_FAULT_MATRIX=FILE each test appends its row (fault, produced, delivered once,
kept, lost, duplicates) to FILE: `python benchmarks/fault_matrix.py` prints the table."""

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
from fault_scenarios import client_env, count_cycles, new_callback
from http_faults import FaultProxy, Refuse, Reset
from mlflow.tracking import MlflowClient
from servers import HungServer, MlflowServer, free_port
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning
from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron.cli import main as cli_main
from mlflow_neuron.cli.arguments import EXIT_OK

MODES = pytest.mark.parametrize("helper", [False, True], ids=["inline", "helper"])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("matrix-server")) as running:
        yield running.start()


def steps_of(cycles: int) -> list[int]:
    return [4 * (i + 1) for i in range(cycles)]  # profile_rmsnorm(steps=4n, wait=1, warmup=1, active=2)


def sync_each(folders, uri: str) -> int:
    """Syncs every folder that holds records; returns how many records they held."""
    held = 0
    for folder in folders:
        held += len(_outbox.pending(folder))
        if held:
            assert cli_main(["sync", "--outbox", str(folder), "--tracking-uri", uri]) == EXIT_OK
    return held


# -- refusals and resets ---------------------------------------------------------------------------------


def refuse_first(n: int, status: int, retry_after_s: int):
    writes = itertools.count()

    def plan(index, method, path):
        if method in ("POST", "PUT") and next(writes) < n:
            return Refuse(status, retry_after_s)
        return None

    return plan


@MODES
@pytest.mark.parametrize("status", [503, 429])
def test_refusals_with_retry_after_are_waited_out_and_each_cycle_lands_once(server, tmp_path, matrix_row, status,
                                                                             helper):  # fmt: skip
    """The first 4 writes are refused with Retry-After: 1. No write comes back sooner than the
    server asked (for the same cycle or the next), and every cycle lands once (live, or from the
    outbox)."""
    cycles, run_id = 3, MlflowClient(server.uri).create_run("0").info.run_id
    # MLflow's own retries, as a user has them: in the training process (inline, or draining at a
    # stop or close) they wait out Retry-After; the helper makes one request a call and waits itself.
    with FaultProxy(server.port, refuse_first(4, status, 1)) as proxy:
        callback = new_callback(helper, run_id=run_id, tracking_uri=proxy.uri, outbox=tmp_path / "outbox",
                                retry_wait_s=0.05, flush_timeout_s=60)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MLflowNeuronWarning)  # a cycle may wait in the outbox
            profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
            callback.close()
    refused = [entry for entry in proxy.seen if entry[3].startswith("refused")]
    assert len(refused) == 4
    for at, method, path, _ in refused:
        again = [t for t, m, p, _ in proxy.seen if m in ("POST", "PUT") and t > at]
        assert not again or again[0] - at >= 0.95, f"a write came {again[0] - at:.2f} s after {method} {path} was refused"
    kept = sync_each([tmp_path / "outbox"], server.uri)
    present, duplicates = count_cycles(MlflowClient(server.uri), run_id, steps_of(cycles))
    assert present == cycles
    matrix_row(cycles, present, kept, 0, duplicates)


def test_a_refusal_the_helper_was_given_holds_the_drain_that_comes_after_it(server, tmp_path, monkeypatch):
    """The helper (drain A, in a process of ours that reads Retry-After) is refused with
    Retry-After: 1 and stops; the training process drains next, at close (drain B). B sends
    nothing before that second is out: the refusal is kept in the outbox (`.quiet-until`)."""
    import threading

    from urllib3.util.retry import Retry

    from mlflow_neuron import MLflowProfilerCallback
    from mlflow_neuron._delivery import entries
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.http_budget import remember_retry_after
    from mlflow_neuron._delivery.report import Reporter

    run_id, outbox = MlflowClient(server.uri).create_run("0").info.run_id, tmp_path / "outbox"
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=server.uri, outbox=outbox, process="inline",
                                      flush_timeout_s=0.0, strict=True)  # fmt: skip
    callback._producer._kick = lambda *args: None  # queued only: no drain of the callback's own
    profile_rmsnorm(callback, steps=8)
    callback._producer._stop.set()
    monkeypatch.setattr(Retry, "increment", Retry.increment)  # put back after the test
    remember_retry_after()  # as the helper does: this test's process plays it
    writes, stopped = itertools.count(), threading.Event()

    def plan(index, method, path):
        if "log-batch" in path and next(writes) == 0:
            stopped.set()  # close() stops the helper just as it is refused
            return Refuse(429, 1)
        return None

    with client_env(), FaultProxy(server.port, plan) as proxy:
        first = Drain(outbox, Reporter(), tracking_uri=proxy.uri, retries=0).once(stop=stopped)
        assert first.count("kept") >= 1 and (outbox / entries.QUIET).exists(), first.outcomes
        then = Drain(outbox, Reporter(), tracking_uri=proxy.uri, retry_wait_s=0.05).once(deadline=time.monotonic() + 60)
    (refused_at, *_), = proxy.refused()
    later = [t for t, method, _, done in proxy.seen if method in ("POST", "PUT") and t > refused_at]
    assert later and later[0] - refused_at >= 0.95, f"a write came {later[0] - refused_at:.2f} s after the refusal"
    assert then.count("delivered") + first.count("delivered") == 2 and not _outbox.pending(outbox)
    assert count_cycles(MlflowClient(server.uri), run_id, steps_of(2)) == (2, 0)


def _until(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@MODES
def test_a_connection_reset_mid_upload_is_sent_again_and_lands_once(server, tmp_path, matrix_row, helper):
    cycles, run_id = 3, MlflowClient(server.uri).create_run("0").info.run_id
    puts = itertools.count()

    def plan(index, method, path):
        return Reset(after_body_bytes=512) if method == "PUT" and next(puts) == 0 else None

    with client_env(), FaultProxy(server.port, plan) as proxy:
        callback = new_callback(helper, run_id=run_id, tracking_uri=proxy.uri, outbox=tmp_path / "outbox",
                                retry_wait_s=0.05, flush_timeout_s=60)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MLflowNeuronWarning)
            profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
            callback.close()
    assert [entry[3] for entry in proxy.seen].count("reset") == 1
    kept = sync_each([tmp_path / "outbox"], server.uri)
    present, duplicates = count_cycles(MlflowClient(server.uri), run_id, steps_of(cycles))
    assert present == cycles
    matrix_row(cycles, present, kept, 0, duplicates)


# -- a full disk -------------------------------------------------------------------------------------------


@contextmanager
def small_disk(path: Path, size_kib: int):
    """A tmpfs of `size_kib` at `path`: writes past it fail with ENOSPC, as on a full disk."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a small tmpfs needs root to mount")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(path)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> None:
    try:
        with open(disk / "filler", "wb", buffering=0) as out:
            while True:
                out.write(b"\0" * 4096)
    except OSError:
        pass  # ENOSPC: full


def lost_steps(caught) -> set[int]:
    """Every step a warning counted as lost."""
    lost = set()
    for message in (str(w.message) for w in caught):
        if m := re.search(r"lost \(steps ([\d, ]+)\)", message):
            lost.update(int(s) for s in m.group(1).split(", "))
        elif m := re.search(r"profiler step (\d+) .*its data is lost", message):
            lost.add(int(m.group(1)))
    return lost


@pytest.mark.parametrize("fallback", ["usable", "blocked", "temp-full"])
def test_a_full_disk_keeps_what_fits_and_counts_what_is_lost(server, tmp_path, monkeypatch, matrix_row, fallback):
    """The outbox is on a 64 KiB tmpfs and the server is down. With a usable fallback every cycle
    is kept and the closing advice names each folder with its sync command. With the fallback
    blocked (a file where its folder goes), or the whole temp folder full (staging fails too),
    each cycle not kept is counted as lost by step, in one closing line."""
    cycles, run_id = 5, MlflowClient(server.uri).create_run("0").info.run_id
    temp = tmp_path / "temp"
    temp.mkdir()
    full_temp = small_disk(tmp_path / "temp-disk", 64) if fallback == "temp-full" else _no_disk(temp)
    with small_disk(tmp_path / "outbox-disk", 64) as disk, full_temp as tmp:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        if fallback == "temp-full":
            fill(tmp)
        elif fallback == "blocked":
            _outbox.fallback_folder().write_text("")
        with client_env(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MLflowNeuronWarning)
            callback = new_callback(False, run_id=run_id, tracking_uri=f"http://127.0.0.1:{free_port()}",
                                    outbox=disk / "outbox", retry_wait_s=0.01, flush_timeout_s=5)  # fmt: skip
            profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
            callback.close()
        folders = [disk / "outbox", *([_outbox.fallback_folder()] if fallback != "blocked" else [])]
        held = {str(f): len(_outbox.pending(f)) for f in folders}
        lost = lost_steps(caught)
        text = "\n".join(str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning))
        for folder, count in held.items():
            if count:
                assert f"mlflow-neuron sync --outbox {folder}" in text, text
        assert "Traceback" not in text and all(len(line) < 1200 for line in text.splitlines())
        # The user makes room: the outbox moves to a roomier disk (an entry names its files relative
        # to itself), where its queued cycles can be prepared, and the temp folder is usable again.
        roomy = tmp_path / "outbox-roomy"
        shutil.copytree(disk / "outbox", roomy)
        monkeypatch.setattr(tempfile, "tempdir", None)
        kept = sync_each([roomy, *folders[1:]], server.uri)
        assert [p for p in tmp.iterdir() if p.name.startswith("mlflow-neuron-") and "outbox" not in p.name] == []
    present, duplicates = count_cycles(MlflowClient(server.uri), run_id, steps_of(cycles))
    assert kept + len(lost) == cycles == present + len(lost), (held, sorted(lost), text)
    if fallback == "usable":
        assert lost == set() and all(held.values()), held  # some in the outbox, the rest in the fallback
    else:
        assert lost and f"{len(lost)} profiler cycle(s) lost (steps " in text, text
    if fallback == "blocked":
        assert held[str(disk / "outbox")] >= 1, held  # what fitted
    matrix_row(cycles, present, kept, len(lost), duplicates)


@contextmanager
def _no_disk(path: Path):
    yield path


# -- kill -9 while the helper holds the cycles ----------------------------------------------------------------

KILLED = """
import sys, time
sys.path.insert(0, {tests!r})
from fault_scenarios import new_callback
from workloads import profile_rmsnorm
callback = new_callback(True, run_id={run_id!r}, tracking_uri={uri!r}, outbox={outbox!r}, flush_timeout_s=20)
print("helper", *callback._helper_pids(), flush=True)
def handed(prof):
    callback(prof)
    print("handed", prof.step_num, flush=True)
profile_rmsnorm(handed, steps={steps}, wait=1, warmup=1, active=2)
"""


@pytest.mark.parametrize("stage", ["delivering", "exit-flush"])
def test_kill_9_of_training_while_its_helper_holds_the_cycles_loses_none(server, tmp_path, matrix_row, stage):
    """A run exists; the server hangs; the helper is up. kill -9 of the training process mid-loop or
    in the profiler's exit flush: the helper, its parent gone, exits; every cycle the training
    thread queued is in the outbox, whole, no staging folder is left in $TMPDIR, and sync lands
    each once."""
    run_id = MlflowClient(server.uri).create_run("0").info.run_id
    outbox, staging = tmp_path / "outbox", tmp_path / "tmp"
    staging.mkdir()
    cycles = 3
    with HungServer(lifetime_s=600) as hung:
        code = KILLED.format(tests=str(Path(__file__).parent), run_id=run_id, uri=hung.uri, outbox=str(outbox),
                             steps=4 * cycles + (8 if stage == "delivering" else 0))  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                                env={**os.environ, "TMPDIR": str(staging)})  # fmt: skip
        try:
            helper_pid = int(proc.stdout.readline().split()[1])
            handed = [int(proc.stdout.readline().split()[1]) for _ in range(cycles)]
            if stage == "exit-flush":
                time.sleep(1.0)  # the loop is over: the profiler's exit waits on the helper
        finally:
            proc.kill()
            proc.wait()
        handed += [int(line.split()[1]) for line in proc.stdout.read().splitlines() if line.startswith("handed")]
        deadline = time.monotonic() + 20 + 30 + 300  # its budget, its grace; at nice 10 beside CPU hogs it crawls
        while _alive(helper_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(helper_pid), "the helper outlived its budget after its parent was killed"
    left = [p.name for p in staging.iterdir() if p.name.startswith("mlflow-neuron-") and "outbox" not in p.name]
    # Killed mid-loop, the training thread may have been reading the next cycle (into its staging
    # folder, or its outbox entry): that cycle is the one being written, and it is lost with its
    # folder (sync says the entry was cut short, and removes it).
    assert len(left) <= (1 if stage == "delivering" else 0), left
    records = _outbox.pending(outbox)
    assert {r.name.split("-")[1] for r in records} == {str(proc.pid)}  # queued by the training thread
    # A cycle queued just before the kill may not have printed "handed": its entry counts it.
    produced = sorted({*handed, *(_step_of(r) for r in records)})
    assert len(produced) <= len(handed) + 1, (handed, produced)
    layout = sorted(str(p.relative_to(outbox)) for p in outbox.rglob("*") if "files" not in p.parts)
    kept = sync_each([outbox], server.uri)
    present, duplicates = count_cycles(MlflowClient(server.uri), run_id, produced)
    assert present == len(produced) == kept, (handed, produced, kept, layout)
    matrix_row(len(produced), present, kept, 0, duplicates)


def _step_of(entry: Path) -> int:
    """The step of a queued (job.json) or prepared (record.json) entry."""
    if (entry / "record.json").is_file():
        return json.loads((entry / "record.json").read_text())["step"]
    return json.loads((entry / "job.json").read_text())["job"]["step"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False
