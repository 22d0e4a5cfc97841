"""Bad input gets a clear message and loses nothing else in the cycle."""

import math
import warnings

import mlflow
import numpy as np
import pytest
from conftest import artifact_files, read_json_artifact
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import _validate_metric_name
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery.mlflow_io import RunLogger
from mlflow_neuron._record.model import Delivery, RunRef
from mlflow_neuron._trace.steps import split_by_step


def ops_rows(client, run_id, tmp_path, step=4):
    table = read_json_artifact(client, run_id, f"profiler/step_{step}/ops.json", tmp_path / "dl")
    return [dict(zip(table["columns"], row)) for row in table["data"]]


def profile_named_ops(callback, names):
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=callback) as prof:
        for _ in range(2):
            for name in names:
                with record_function(name):
                    pass
            prof.step()


def test_unicode_and_10000_character_op_names_get_legal_keys_and_keep_their_names(tracking_uri, strict, tmp_path):
    names = ["ünïcode⚡op", "x" * 10_000, "weird <>(),:*#name"]
    with mlflow.start_run() as run:
        # In-process: Kineto's JSON writer (the file the helper reads) writes a non-ASCII name as "unknown".
        profile_named_ops(MLflowProfilerCallback(process="inline"), names)
    client = MlflowClient()
    keys = [k for k in client.get_run(run.info.run_id).data.metrics if k.startswith("profiler/calls/")]
    for key in keys:
        _validate_metric_name(key)
        assert len(key) <= 250
    rows = {r["name"]: r for r in ops_rows(client, run.info.run_id, tmp_path, step=2)}
    assert set(names) <= set(rows)
    assert len({rows[n]["metric_key"] for n in names}) == 3


def test_ten_thousand_distinct_ops_keep_metric_keys_bounded_and_the_table_complete(tracking_uri, strict, tmp_path):
    names = [f"op_{i}" for i in range(10_000)]
    with mlflow.start_run() as run:
        profile_named_ops(MLflowProfilerCallback(top_k=50), names)
    client = MlflowClient()
    metrics = client.get_run(run.info.run_id).data.metrics
    # bounded by top_k, not by the 10,000 names: at most 3 per op and 2 per region (each name is a
    # record_function range, so a region too), plus the totals and the step series
    assert len(metrics) <= 3 * 50 + 2 * 50 + 10
    rows = ops_rows(client, run.info.run_id, tmp_path, step=2)
    assert {f"op_{i}" for i in range(10_000)} <= {r["name"] for r in rows}


def test_an_empty_cycle_logs_zero_totals(tracking_uri, strict):
    with mlflow.start_run() as run:
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=MLflowProfilerCallback()):
            pass
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    assert metrics["profiler/total/aten_calls"] == 0
    assert metrics["profiler/total/self_cpu_time_us"] == 0


class RecordedCycle:
    """A finished cycle handed to the callback as torch would: genuine events, with odd numbers."""

    def __init__(self, events, step_num=4):
        self.step_num, self.activities, self.use_device, self.experimental_config = step_num, set(), None, None
        self.schedule = None
        self._events = EventList(events)
        self._events._build_tree()

    def events(self):
        return self._events

    def export_chrome_trace(self, path, use_python_export=False):
        self._events.export_chrome_trace(path)

    def stop(self):
        pass


def test_nan_and_infinite_times_are_reported_once_and_left_out_of_the_metrics(tracking_uri, tmp_path):
    def event(i, name, start, end):
        return FunctionEvent(id=i, name=name, thread=1, start_us=start, end_us=end, device_type=DeviceType.CPU, stack=[])

    cycle = RecordedCycle([event(0, "aten::ok", 0, 10), event(1, "aten::nan", 20, float("nan")),
                           event(2, "aten::inf", 30, float("inf"))])
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="NaN or infinite") as caught:
        callback = MLflowProfilerCallback(export_trace=False)
        callback(cycle)
        callback.flush()
    assert sum(issubclass(w.category, MLflowNeuronWarning) for w in caught) == 1
    client = MlflowClient()
    metrics = client.get_run(run.info.run_id).data.metrics
    assert metrics["profiler/self_cpu_time_us/aten.ok"] == 10
    assert "profiler/self_cpu_time_us/aten.nan" not in metrics
    assert "profiler/self_cpu_time_us/aten.inf" not in metrics
    names = {r["name"] for r in ops_rows(client, run.info.run_id, tmp_path)}
    assert {"aten::ok", "aten::nan", "aten::inf"} <= names
    # The step holding them has no number either: not -9.2e15 us from a NaN cast to an integer.
    assert "profiler/step/self_cpu_time_us" not in metrics


@pytest.mark.parametrize("broken", [math.nan, math.inf])
def test_a_step_with_a_broken_time_sums_to_nan_and_the_other_steps_stay_exact(broken):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the NaN cast to an integer warned, then logged garbage
        rows, totals = split_by_step(
            step_starts=np.array([0.0, 100.0]), step_numbers=[1, 2], default_step=2,
            placed_at=np.array([10.0, 20.0, 110.0, 120.0]), name_id=np.array([0, 1, 0, 2]), names=["a", "b", "c"],
            kind_id=np.zeros(4, np.int64), kinds=("op",), self_device_us=np.array([0.0, broken, 0.0, 0.0]),
            self_cpu_us=np.array([1.5, broken, 2.25, 0.125]), in_device_total=np.ones(4, bool),
            aten_starts=np.array([10.0, 110.0]),
        )  # fmt: skip
    cpu = {(r.step, r.name): r.self_cpu_time_us for r in rows}
    assert cpu[(1, "a")] == 1.5 and math.isnan(cpu[(1, "b")]) and cpu[(2, "a")] == 2.25 and cpu[(2, "c")] == 0.125
    assert [math.isnan(t.self_cpu_time_us) for t in totals] == [True, False] and totals[1].self_cpu_time_us == 2.375
    assert math.isnan(totals[0].self_device_time_us) and totals[1].self_device_time_us == 0


def test_truncated_trace_files_are_uploaded_as_they_are(tracking_uri, strict, neuron_double, tmp_path):
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    exporter = neuron_double.NeuronProfiler(config)

    def truncate_the_session_trace(prof):
        trace = exporter.sessions[-1] / "trace.json"
        trace.write_bytes(trace.read_bytes()[:100])

    with mlflow.start_run() as run:
        # In-process, where the cycle's numbers come from the profiler, not from the truncated file
        # (the helper reads that file: its numbers are then empty, with a warning).
        profile_rmsnorm(MLflowProfilerCallback(exporter.export_trace, truncate_the_session_trace, process="inline"),
                        experimental_config=config)
    client = MlflowClient()
    files = artifact_files(client, run.info.run_id)
    assert [size for path, size in files.items() if path.endswith("/trace.json")] == [100]
    assert client.get_run(run.info.run_id).data.metrics["profiler/total/aten_calls"] == 6


def test_files_that_vanish_or_grow_before_upload_lose_nothing_else(tracking_uri, tmp_path):
    run_id = MlflowClient().create_run("0").info.run_id
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "manifest.json").write_text("{}")
    growing, vanished = tmp_path / "growing.ntff", tmp_path / "vanished.ntff"
    growing.write_bytes(b"x" * 10)
    delivery = Delivery(step=4, timestamp_ms=1, artifact_dir="profiler/step_4", metrics={"profiler/total/aten_calls": 6.0},
                        files_dir=str(staged), uploads=((str(vanished), "profiler/step_4/neuron"),
                                                        (str(growing), "profiler/step_4/neuron")))
    growing.write_bytes(b"x" * 1000)  # grew after it was found
    _, missing = RunLogger(RunRef(tracking_uri, run_id)).deliver(delivery)
    assert missing == [str(vanished)]
    files = artifact_files(MlflowClient(), run_id)
    assert files["profiler/step_4/neuron/growing.ntff"] == 1000
    assert "profiler/step_4/manifest.json" in files
    assert MlflowClient().get_run(run_id).data.metrics["profiler/total/aten_calls"] == 6


def test_events_unreadable_off_the_training_thread_lose_nothing_else(tracking_uri, monkeypatch):
    import mlflow_neuron._trace.kineto as kineto

    monkeypatch.setattr(kineto, "read_kineto_events", lambda prof: None)  # a torch this reader does not know
    with mlflow.start_run() as run, pytest.warns(MLflowNeuronWarning, match="could not be read"):
        assert profile_rmsnorm(MLflowProfilerCallback(process="inline")) == 4  # the in-process reader
    files = artifact_files(MlflowClient(), run.info.run_id)
    assert {"profiler/step_4/trace.json.gz", "profiler/step_4/manifest.json", "profiler/step_4/ops.json"} <= set(files)
    assert MlflowClient().get_run(run.info.run_id).data.metrics["profiler/total/aten_calls"] == 0
