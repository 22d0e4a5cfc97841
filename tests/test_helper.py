"""The helper process: same numbers as `extract_cycle(prof.events())`, and no trouble reaches training.

The helper drains the outbox in its own process, parsing each cycle's chrome trace; its per-op rows,
per-step samples and totals must equal torch's own parse of the same cycle, fake device kernels
included. A helper that dies or never starts is restarted once, then the training process drains by
itself, with one warning; a hung one never holds flush or close past their timeouts, loses no cycle,
and does not outlive close().
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from conftest import ROOT, read_json_artifact, run_python
from mlflow.tracking import MlflowClient
from torch.profiler import tensorboard_trace_handler
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import helper_process as _helper_process
from mlflow_neuron._record import node_file as node_file_format
from mlflow_neuron._record import record as _record
from mlflow_neuron._record.model import node_file
from mlflow_neuron._device import devices as _devices
from mlflow_neuron._trace.device_names import CPU
from mlflow_neuron._trace.function_events import extract_cycle
from mlflow_neuron._record.keys import OpKeys

pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
NUMBERS = ["calls", "self_device_time_us", "device_time_us", "self_cpu_time_us", "cpu_time_us"]
READY_S = 180  # the helper imports mlflow: seconds on a busy machine
# The helper runs at nice 10: beside nice-0 work that fills the cores (a busy machine) it gets about
# 10% of a core, and delivering a cycle can take longer than the default budget's 10 s. Tests that
# read back what the helper delivered give the stop that long to wait (it waits only until the
# cycle is delivered); what is not delivered in a budget goes to the outbox, which other tests check.
DELIVER_S = 300.0


def reference_tables(prof) -> dict:
    """What the in-process reader computes from torch's own parse of this cycle."""
    device = _devices.profiled_device(prof)
    profile = extract_cycle(prof.events(), device=device, device_profiled=device != CPU,
                            default_step=prof.step_num - 1)  # fmt: skip
    tables = {"ops.json": _record.ops_table(profile, OpKeys()), **_record.step_tables(profile)}
    return {name: json.loads(frame.to_json(orient="split", index=False)) for name, frame in tables.items()}


def assert_same_tables(client, run_id, step, expected: dict, tmp_path):
    for name, want in expected.items():
        got = read_json_artifact(client, run_id, f"profiler/step_{step}/{name}", tmp_path / f"dl-{step}-{name}")
        got, want = (pd.DataFrame(t["data"], columns=t["columns"]) for t in (got, want))
        got = got.drop(columns=[c for c in got.columns if c.startswith("host_")])  # sampled, not parsed
        keys = [c for c in ("step", "name", "kind") if c in want.columns]
        got, want = (f.sort_values(keys).reset_index(drop=True) for f in (got, want))
        assert list(got.columns) == list(want.columns), name
        assert got[keys].equals(want[keys]), name
        numeric = [c for c in want.columns if c not in keys and pd.api.types.is_numeric_dtype(want[c])]
        pd.testing.assert_frame_equal(got[numeric], want[numeric], check_exact=False, rtol=1e-6, atol=2e-3,
                                      check_dtype=False)  # fmt: skip


def started(callback) -> MLflowProfilerCallback:
    assert callback.start_helper(READY_S), "the helper did not start"
    return callback



def test_the_helper_process_never_maps_libtorch(tracking_uri, strict):
    """The helper reads traces, aggregates and talks to MLflow: none of it needs torch."""
    seen = {}

    def look(prof):  # at the second cycle, once the helper has delivered the first
        if callback.cycles_read:
            seen["flushed"] = callback.flush(READY_S)
            seen["maps"] = Path(f"/proc/{callback._producer.helper.helper_pid}/maps").read_text()

    with mlflow.start_run():
        callback = started(MLflowProfilerCallback(look, flush_timeout_s=DELIVER_S))
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        callback.close()
    assert seen["flushed"] and callback.cycles_logged == 2
    assert "libtorch" not in seen["maps"] and "libc10" not in seen["maps"]
    assert "libpython" in seen["maps"] or "python" in seen["maps"]  # the maps were read, of a Python process

@pytest.mark.parametrize("exporter", ["callback", "tensorboard_gz"])
def test_the_helper_logs_what_torchs_own_parse_gives_on_every_row(tracking_uri, strict, tmp_path, exporter):
    """The trace the helper reads is the callback's own Kineto save, or a handler's (gzipped) export."""
    expected = {}
    handlers = [lambda prof: expected.update({prof.step_num: reference_tables(prof)})]
    if exporter == "tensorboard_gz":
        handlers.append(tensorboard_trace_handler(str(tmp_path / "tb"), use_gzip=True))
    with mlflow.start_run() as run:
        callback = started(MLflowProfilerCallback(*handlers, flush_timeout_s=DELIVER_S))
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
        assert callback._producer.helper.parser == "orjson"
        assert callback.cycles_logged == 2
        callback.close()
    client = MlflowClient()
    for step in (4, 8):
        assert_same_tables(client, run.info.run_id, step, expected[step], tmp_path)
    metrics = client.get_run(run.info.run_id).data.metrics
    assert metrics["profiler/total/aten_calls"] == 12 and metrics["profiler/total/active_steps"] == 2
    manifest = read_json_artifact(client, run.info.run_id, "profiler/step_8/manifest.json", tmp_path / "dl-m")
    assert manifest["framework_trace"].endswith(".pt.trace.json.gz" if exporter == "tensorboard_gz" else "export_chrome_trace")


def test_fake_device_kernels_come_out_the_same_from_the_helper(fake_profiler, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = f"""
import json, pathlib, fake_device, mlflow
fake_device.activate(pathlib.Path({str(fake_profiler)!r}))
from torch.profiler import ProfilerActivity
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler
from workloads import profile_rmsnorm
from test_helper import reference_tables
from mlflow_neuron import MLflowProfilerCallback
mlflow.set_tracking_uri({uri!r})
config = NeuronConfig(profile_output_dir={str(tmp_path / 'np')!r})
expected = {{}}
with mlflow.start_run() as run:
    callback = MLflowProfilerCallback(NeuronProfiler(config).export_trace,
                                      lambda prof: expected.update({{prof.step_num: reference_tables(prof)}}),
                                      flush_timeout_s={DELIVER_S})
    assert callback.start_helper({READY_S})
    profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2,
                    activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=config)
    assert callback.cycles_logged == 2, callback.cycles_logged
    callback.close()
print(json.dumps({{"run_id": run.info.run_id, "expected": expected}}))
"""
    env = {"FAKE_NEURON_KERNELS": "aten::mul=785,aten::rsqrt=40,aten::add=20", "MLFLOW_NEURON_STRICT": "1"}
    result = run_python(code, tmp_path, env=env, timeout=READY_S + 2 * DELIVER_S)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    client = MlflowClient(uri)
    for step, expected in outcome["expected"].items():
        assert_same_tables(client, outcome["run_id"], int(step), expected, tmp_path)
    metrics = client.get_run(outcome["run_id"]).data.metrics
    assert metrics["profiler/total/self_device_time_us"] == pytest.approx(2 * (3 * 785 + 40 + 20))
    assert client.get_run(outcome["run_id"]).data.tags["mlflow_neuron.device_time"] == "present"


def test_a_helper_that_dies_on_its_first_cycle_is_restarted_and_loses_nothing(tracking_uri, tmp_path, monkeypatch):
    marker = tmp_path / "died-once"
    dies_once = f"""
import os, pathlib, sys
from mlflow_neuron._delivery import drain as _drain, helper as _helper
prepare = _drain.Drain.prepare
def dying(self, *args, **kwargs):
    if not pathlib.Path({str(marker)!r}).exists():
        pathlib.Path({str(marker)!r}).write_text("")
        os._exit(9)
    return prepare(self, *args, **kwargs)
_drain.Drain.prepare = dying
sys.exit(_helper.main())
"""
    monkeypatch.setattr(_helper_process, "HELPER_COMMAND", (sys.executable, "-c", dies_once))
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="helper process ended") as caught:
        callback = started(MLflowProfilerCallback(flush_timeout_s=DELIVER_S))
        def then_wait(prof):  # until the helper took the first cycle (and died): the stop drains here too
            callback(prof)
            deadline = time.monotonic() + READY_S
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

        profile_rmsnorm(then_wait, steps=12, wait=1, warmup=1, active=2)
        callback.close(timeout=DELIVER_S)
    assert marker.exists()
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    assert callback.reporter.counts == {"helper": 1}
    assert callback.cycles_logged == 3 and callback.outbox_records == []
    history = MlflowClient().get_metric_history(run.info.run_id, "profiler/total/active_steps")
    assert sorted(m.step for m in history) == [4, 8, 12]


def test_a_helper_that_cannot_run_falls_back_to_the_training_process_with_one_warning(tracking_uri, monkeypatch):
    monkeypatch.setattr(_helper_process, "HELPER_COMMAND", (sys.executable, "-c", "import sys; sys.exit(3)"))
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="exit code 3") as caught:
        callback = MLflowProfilerCallback()
        helper = callback._producer.helper
        deadline = time.monotonic() + 60
        while helper.usable and time.monotonic() < deadline:
            helper.ensure()  # started again 2 s after each failure, twice in all
            time.sleep(0.05)
        assert not helper.usable
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2)
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    assert callback.reporter.counts == {"helper": 2} and callback.cycles_logged == 2
    assert callback.last_profile is not None  # read in-process
    history = MlflowClient().get_metric_history(run.info.run_id, "profiler/total/active_steps")
    assert [m.step for m in history] == [4, 8]


HANGS = """
import pathlib, sys, time
from mlflow_neuron._delivery import entries
outbox = pathlib.Path(sys.argv[1])
lock = entries.lock_file(entries._outbox.private_folder(outbox) / entries.CONSUMER_LOCK, blocking=True, timeout=5)
sys.stdout.write('{"type": "ready", "parser": "none", "pid": 0}\\n')
sys.stdout.flush()
held = []
while True:  # takes every entry it can and never lets go, whatever its input says
    for entry in entries.listed(outbox):
        claim = entries.try_claim(entry)
        if claim is not None:
            held.append(claim)
    time.sleep(0.01)
"""


def test_a_hung_helper_holds_neither_flush_nor_close_past_their_time_and_every_cycle_stays(tracking_uri, monkeypatch):
    monkeypatch.setattr(_helper_process, "HELPER_COMMAND", (sys.executable, "-c", HANGS))
    callback = started(MLflowProfilerCallback(experiment_id="0", flush_timeout_s=1.0))
    proc = callback._producer.helper.proc
    start = time.monotonic()
    profile_rmsnorm(lambda prof: (callback(prof), callback.flush(0.5)), steps=8, wait=1, warmup=1, active=2)
    # Whichever process claimed an entry first has it: the hung helper keeps what it took.
    with pytest.warns(MLflowNeuronWarning, match=r"profiler cycle\(s\) \(steps [48, ]+\) were not sent"):
        callback.close(timeout=2.0)
    assert time.monotonic() - start < 2 * 0.5 + 1.0 + 2.0 + 2.0 + 30.0  # flushes, stop, close, the helper's stop; the loop
    assert proc.poll() is not None  # stopped: nothing of ours outlives close()
    assert callback.outbox_records and callback.cycles_logged + len(callback.outbox_records) == 2  # kept, whole


def test_the_helper_exits_when_its_parent_closes_stdin(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow_neuron._delivery.helper", str(tmp_path / "outbox")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tmp_path)  # fmt: skip
    proc.stdin.write((json.dumps({"credentials": {}}) + "\n").encode())
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["type"] == "ready"
    proc.stdin.close()
    assert proc.wait(READY_S) == 0


def test_a_rank_that_logs_no_metrics_hands_its_files_to_the_helper(tracking_uri, strict, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    run_id = MlflowClient().create_run("0").info.run_id
    callback = started(MLflowProfilerCallback(run_id=run_id, flush_timeout_s=DELIVER_S))
    profile_rmsnorm(callback)
    assert callback.cycles_logged == 1
    callback.close()
    # It uploads nothing of its own: its summary and its manifest go in its node's file.
    assert not MlflowClient().list_artifacts(run_id, "profiler/step_4")
    path = MlflowClient().download_artifacts(run_id, node_file(socket.gethostname(), 4, 1), str(tmp_path))
    assert [s["rank"] for s in node_file_format.read(path)[0]] == [1]
    assert MlflowClient().get_run(run_id).data.metrics == {}


def test_the_helper_logs_the_timeline_the_training_process_would_build(tracking_uri):
    """The helper builds the cycle's trace from the chrome trace file: the same spans, to the
    nanosecond, as the in-process path builds from Kineto's events."""
    from mlflow_neuron._trace.kineto import raw_events_from_kineto
    from mlflow_neuron._trace.span_tree import build_timeline
    from mlflow_neuron._trace.kineto import timeline_inputs_from_kineto
    from mlflow_neuron._record.model import cycle_dir

    built = {}

    def in_process_timeline(prof):
        raw = raw_events_from_kineto(prof)
        inputs = timeline_inputs_from_kineto(prof, raw)
        built[prof.step_num] = build_timeline(raw, cycle_step=prof.step_num, inputs=inputs,
                                              root_name=cycle_dir(prof.step_num))  # as the reader names it

    with mlflow.start_run() as run:
        callback = started(MLflowProfilerCallback(in_process_timeline, flush_timeout_s=DELIVER_S))
        profile_rmsnorm(callback, steps=4, wait=1, warmup=1, active=2)
        callback.close()
    [trace] = MlflowClient().search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, flush=True)
    got = sorted(trace.data.spans, key=lambda s: int(s.span_id, 16))
    want = built[4].spans
    assert len(got) == len(want) > 10
    assert [(s.name, s.start_time_ns, s.end_time_ns) for s in got] == [(w.name, w.start_ns, w.end_ns) for w in want]
    assert any(s.name.startswith("ProfilerStep#") for s in got) and any(s.name.startswith("aten::") for s in got)


def test_one_helper_serves_every_profile_and_none_outlives_close(tracking_uri):
    with mlflow.start_run():
        callback = started(MLflowProfilerCallback(flush_timeout_s=DELIVER_S))
        helper = callback._producer.helper.proc
        profile_rmsnorm(callback, steps=4, wait=1, warmup=1, active=2)
        profile_rmsnorm(callback, steps=4, wait=1, warmup=1, active=2)
        assert callback._producer.helper.proc is helper and helper.poll() is None  # the same one, still up
        callback.close()
        assert helper.poll() == 0  # it stopped when its input ended, and close() waited for it
    assert callback.cycles_logged == 2
    assert callback.reporter.counts == {} and callback._producer.helper.failures == 0  # stopping is not failing


def test_a_trace_orjson_refuses_is_read_by_the_standard_parser(tmp_path):
    """Python's exporter writes NaN for a NaN float; orjson refuses that, json reads it."""
    from mlflow_neuron._trace.summarize import ChromeTraceFile, CycleSettings

    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1,
         "args": {"External id": 1, "Flops": float("nan")}},
    ]}  # fmt: skip
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert "NaN" in path.read_text()
    summary = ChromeTraceFile(str(path), CycleSettings("cpu", False)).summarize()
    assert [op.name for op in summary.profile.ops] == ["aten::add"] and summary.timeline is None


def test_a_callback_dropped_without_close_lets_its_helper_go(tracking_uri):
    import gc

    callback = started(MLflowProfilerCallback(experiment_id="0"))
    proc = callback._producer.helper.proc
    del callback
    gc.collect()
    assert proc.wait(READY_S) == 0


def test_op_keys_and_the_device_time_flag_go_on_across_helpers():
    from mlflow_neuron._record.prepare import Preparer

    class Quiet:
        def problem(self, *args):
            raise AssertionError(args)

    first = Preparer(Quiet(), top_k=5, rank=0, primary=True, all_ranks=False)
    taken = first.keys.key("aten::mul")
    first._device_time_seen = True
    second = Preparer(Quiet(), top_k=5, rank=0, primary=True, all_ranks=False)
    second.keys.key("aten_mul")  # a name that could have wanted the same key
    second.absorb(first.export())
    assert second.keys.key("aten::mul") == taken and second._device_time_seen
    assert len(set(second.keys.known().values())) == 2  # two names never share a key
