"""Nothing lost: cycles the tracking server does not take go to the outbox; sync delivers them once."""

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import artifact_files, profile_offline
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import entries
from mlflow_neuron._delivery.outbox import damaged, fallback_folder, pending
from mlflow_neuron.cli import main as cli_main


def assert_each_cycle_once(client, run_id, steps):
    for key in ("profiler/total/active_steps", "profiler/calls/aten.mul"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == steps
    files = artifact_files(client, run_id)
    for step in steps:
        assert {f"profiler/step_{step}/{name}" for name in ("ops.json", "manifest.json", "trace.json.gz")} <= set(files)


def test_an_unreachable_server_loses_nothing_and_sync_delivers_each_cycle_once(sync_store, dead_server, tmp_path):
    outbox = tmp_path / "outbox"
    callback = profile_offline(dead_server, outbox)
    assert callback.run_id is None  # the run could not even be created
    assert len(pending(outbox)) == 3

    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    assert pending(outbox) == []
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])  # created once, from the records' run key
    assert run.info.run_name == "offline"
    assert_each_cycle_once(client, run.info.run_id, [4, 8, 12])
    assert run.data.params["profiler.schedule.active"] == "2"


def test_sync_is_idempotent_twice_and_after_a_partial_replay(sync_store, dead_server, tmp_path):
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox)
    backup = tmp_path / "backup"
    shutil.copytree(outbox, backup)
    # A partial replay: only the first record goes through, then everything is replayed again.
    first = pending(outbox)[0]
    rest = tmp_path / "rest"
    shutil.move(str(outbox), str(rest))
    outbox.mkdir()
    shutil.move(str(rest / first.name), str(outbox / first.name))
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    shutil.rmtree(outbox)
    shutil.copytree(backup, outbox)
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    shutil.rmtree(outbox)
    shutil.copytree(backup, outbox)
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])
    assert_each_cycle_once(client, run.info.run_id, [4, 8, 12])


def test_an_unwritable_outbox_falls_back_and_says_where(sync_store, dead_server, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the helper process's temp folder too
    (tmp_path / "tmp").mkdir()
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a path under a regular file cannot be created, even by root
    with pytest.warns(MLflowNeuronWarning) as caught:
        callback = profile_offline(dead_server, blocker / "outbox", cycles=2)
    messages = " ".join(str(w.message) for w in caught)
    fallback = fallback_folder()
    assert fallback.parent == tmp_path / "tmp"
    assert "is not writable" in messages and str(fallback) in messages
    assert [p.parent for p in callback.outbox_records] == [fallback, fallback]
    assert cli_main(["sync", "--outbox", str(fallback), "--tracking-uri", sync_store]) == 0
    client = MlflowClient(sync_store)
    assert_each_cycle_once(client, client.search_runs(["0"])[0].info.run_id, [4, 8])


def test_each_cycle_is_on_disk_before_the_training_loop_goes_on(dead_server, tmp_path):
    """The outbox is the queue: no cycle waits in memory, so memory does not grow with a backlog and
    a kill at any step loses none that was handed over."""
    outbox = tmp_path / "outbox"
    callback = MLflowProfilerCallback(tracking_uri=dead_server, experiment_id="0", outbox=outbox, retries=50,
                                      retry_wait_s=0.2)  # fmt: skip
    seen = []
    with pytest.warns(MLflowNeuronWarning):
        profile_rmsnorm(lambda prof: (callback(prof), seen.append(len(pending(outbox)))),
                        steps=20, wait=1, warmup=1, active=2)
        callback.close(timeout=0)
    assert seen == [1, 2, 3, 4, 5]  # each queued on disk when on_trace_ready returned
    assert len(pending(outbox)) == 5 and len(callback.outbox_records) == 5  # every cycle kept


def test_sync_sets_a_corrupt_record_aside_and_delivers_the_rest(sync_store, dead_server, tmp_path):
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox, cycles=2)
    broken = outbox / "00000000000000000000-1-000000"
    broken.mkdir()
    (broken / "record.json").write_text('{"format": 1, "run": {')  # truncated
    sync = [sys.executable, "-m", "mlflow_neuron.cli", "sync", "--outbox", str(outbox), "--tracking-uri", sync_store]
    result = subprocess.run(sync, capture_output=True, text=True)
    assert result.returncode == 1  # found damaged: not everything was delivered
    assert f"{broken.name}: damaged, not sent: unreadable record.json" in result.stdout
    assert "synced 2 of 3 record(s)" in result.stdout
    assert pending(outbox) == [] and damaged(outbox) == [outbox / "damaged" / broken.name]
    again = subprocess.run(sync, capture_output=True, text=True)  # set aside once: later syncs pass, and say so
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"1 record(s) in {outbox / 'damaged'} are damaged and not sent: {broken.name}: unreadable" in again.stdout


def test_an_entrys_json_files_read_back_as_pythons_json_wrote_them(tmp_path):
    """orjson writes job.json, record.json and a run's state (each cycle); what it would say
    otherwise (NaN as null, int keys, ints past 64 bits, a lone surrogate) goes through `json`."""
    import json

    from mlflow_neuron._delivery import entries

    for value in [{"a": float("nan"), "b": [1, 2.5, float("inf")], "c": None}, {"k": {1: "x"}}, {"s": "\udc80"},
                  {"big": 2**70, "neg": -(2**63) - 1}, {"u": "\u00e9\u2026", "t": (1, 2)}, {"f": 0.1, "g": 1e300}]:
        entries.write_json(tmp_path / "x.json", value)
        assert json.dumps(entries.read_json(tmp_path / "x.json")) == json.dumps(json.loads(json.dumps(value)))


def test_a_runs_state_is_read_again_only_when_another_process_wrote_it_last(tmp_path):
    import json

    from mlflow_neuron._delivery import entries

    path = tmp_path / ".keys-run.json"
    path.write_text(json.dumps({"keys": {"a": "a"}}))  # an earlier version's state: no token
    assert entries.read_state(path, None) == ({"keys": {"a": "a"}}, None)
    mine, seen = entries.SharedState(), []
    mine.put(path, seen.append, lambda: {"keys": {"a": "a", "b": "b"}})
    assert seen == [{"keys": {"a": "a"}}]  # what was there is taken before it is written over
    mine.take(path, seen.append)
    assert len(seen) == 1  # nothing new: this process wrote it last (100 bytes read)
    other = entries.SharedState()
    other.take(path, seen.append)
    assert seen[-1] == {"keys": {"a": "a", "b": "b"}}
    other.put(path, seen.append, lambda: {"keys": {"c": "c"}})
    mine.take(path, seen.append)
    assert seen[-1] == {"keys": {"c": "c"}} and len(seen) == 3


def test_two_processes_preparing_cycles_of_one_run_at_once_lose_neither_ones_steps(tmp_path):
    """Each read the run's state before the other wrote: the later write still holds both cycles'
    steps, so the next cycle's summary covers every cycle before it."""
    from mlflow_neuron._delivery import entries
    from mlflow_neuron._record.run_summary import RunSteps, summary_key
    from mlflow_neuron._trace.profile import StepTotal, cycle_profile

    def cycle(step: int):
        return cycle_profile("cpu", False, [], total_device_us=0, total_cpu_us=0, attributed_us=0, aten_calls=0,
                             steps_seen=1, event_count=0, step_totals=(StepTotal(step, 0.0, 100.0 + step, 1),))  # fmt: skip

    path = tmp_path / ".keys-run.json"
    helper, training = (RunSteps(), entries.SharedState()), (RunSteps(), entries.SharedState())
    for steps, state in (helper, training):
        with pytest.raises(FileNotFoundError):
            state.take(path, steps.absorb)  # both look before either wrote
    for cycle_step, (steps, state) in ((3, helper), (6, training)):
        steps.add(cycle_step, cycle(cycle_step))
        state.put(path, steps.absorb, steps.export)
    steps, state = RunSteps(), entries.SharedState()  # the next cycle, prepared by a third (`sync`)
    state.take(path, steps.absorb)
    steps.add(9, cycle(9))
    assert steps.metrics()[summary_key("self_cpu_time_us", "n_steps")] == 3


def test_a_dead_server_holds_neither_close_nor_the_exit_for_the_whole_budget(dead_server, tmp_path):
    """Against a server that refuses connections, close() stops once a pass has found it so: the
    run's end entry that close() itself holds is not another process at work (waiting on it
    waited out the whole budget), and the close at exit, after close(), does not wait again."""
    outbox = tmp_path / "outbox"
    with pytest.warns(MLflowNeuronWarning, match="not sent"):
        callback = MLflowProfilerCallback(tracking_uri=dead_server, experiment_id="0", outbox=outbox,
                                          flush_timeout_s=300, retry_wait_s=0.01)  # fmt: skip
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        started = time.monotonic()
        callback.close()
        first = time.monotonic() - started
    started = time.monotonic()
    callback.close()  # what the exit handler calls
    second = time.monotonic() - started
    assert first < 150 and second < 150, (first, second)  # half the budget: only a wait for it takes that long
    assert len(pending(outbox)) == 2 and len(entries.listed(outbox)) == 3  # both cycles and the run's end, for sync


def test_the_console_script_is_installed():
    script = str(Path(sys.executable).with_name("mlflow-neuron"))  # the environment's bin folder
    result = subprocess.run([script, "sync", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "example: mlflow-neuron sync" in result.stdout
    result = subprocess.run([script, "nonsense"], capture_output=True, text=True)
    assert result.returncode == 2
