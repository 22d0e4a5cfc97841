"""Ingesting traces taken elsewhere: same per-op numbers and layout as the live callback."""

import gzip
import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from conftest import artifact_files, read_json_artifact, run_python
from mlflow.tracking import MlflowClient
from torch.profiler import tensorboard_trace_handler
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron._readback.ranks import read_ranks
from mlflow_neuron._record.model import node_file_of
from mlflow_neuron.cli import main as cli_main

NUMBERS = ["calls", "self_device_time_us", "device_time_us", "self_cpu_time_us", "cpu_time_us"]


def ops_frame(client, run_id, step, tmp_path):
    table = read_json_artifact(client, run_id, f"profiler/step_{step}/ops.json", tmp_path / f"dl-{run_id}")
    return pd.DataFrame(table["data"], columns=table["columns"]).set_index(["name", "kind"]).sort_index()


def assert_same_numbers(client, live_id, ingested_id, step, tmp_path):
    live, ingested = ops_frame(client, live_id, step, tmp_path), ops_frame(client, ingested_id, step, tmp_path)
    assert list(live.index) == list(ingested.index)
    pd.testing.assert_frame_equal(live[NUMBERS], ingested[NUMBERS], check_exact=False, rtol=1e-6, atol=2e-3)
    live_metrics = client.get_run(live_id).data.metrics
    ingested_metrics = client.get_run(ingested_id).data.metrics
    for key in ("profiler/total/aten_calls", "profiler/total/active_steps", "profiler/calls/aten.mul"):
        assert ingested_metrics[key] == live_metrics[key]
    for key in ("profiler/total/self_cpu_time_us", "profiler/total/self_device_time_us"):
        assert ingested_metrics[key] == pytest.approx(live_metrics[key], rel=1e-6, abs=2e-3)


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_tensorboard_folder_ingests_to_the_numbers_the_callback_logged(tracking_uri, strict, tmp_path, gzipped):
    folder = tmp_path / "tb"
    with mlflow.start_run() as live:
        profile_rmsnorm(MLflowProfilerCallback(tensorboard_trace_handler(str(folder), use_gzip=gzipped)))
    assert cli_main(["ingest", str(folder), "--experiment", "ingested", "--run-name", "from-tb"]) == 0
    client = MlflowClient()
    [ingested] = client.search_runs([client.get_experiment_by_name("ingested").experiment_id])
    assert ingested.info.run_name == "from-tb" and ingested.info.status == "FINISHED"
    assert ingested.data.tags["mlflow_neuron.source"] == "ingest"
    assert_same_numbers(client, live.info.run_id, ingested.info.run_id, 4, tmp_path)
    assert "profiler/step_4/trace.json.gz" in artifact_files(client, ingested.info.run_id)


def test_a_neuron_folder_with_device_kernels_ingests_to_the_same_numbers_and_layout(tmp_path):
    """The live run comes from the fake PrivateUse1 profiler (a subprocess); ingest reads its folder."""
    import fake_device

    try:
        so = fake_device.build(tmp_path / "build")
    except fake_device.FakeDeviceUnavailable as reason:
        pytest.skip(f"fake PrivateUse1 profiler unavailable: {reason}")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "np"
    code = f"""
import pathlib, fake_device, mlflow
fake_device.activate(pathlib.Path({str(so)!r}))
from torch.profiler import ProfilerActivity
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
mlflow.set_tracking_uri({uri!r})
config = NeuronConfig(profile_output_dir={str(out)!r})
with mlflow.start_run() as run:
    profile_rmsnorm(MLflowProfilerCallback(NeuronProfiler(config).export_trace),
                    activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=config)
print(run.info.run_id)
"""
    result = run_python(code, tmp_path, env={"FAKE_NEURON_KERNELS": "aten::mul=785,aten::rsqrt=40", "MLFLOW_NEURON_STRICT": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    live_id = result.stdout.strip().splitlines()[-1]
    client = MlflowClient(uri)
    run_id = client.create_run("0").info.run_id
    assert cli_main(["ingest", str(out), "--run-id", run_id, "--tracking-uri", uri]) == 0
    assert_same_numbers(client, live_id, run_id, 4, tmp_path)
    ingested = client.get_run(run_id).data
    assert ingested.metrics["profiler/self_device_time_us/aten.mul"] == pytest.approx(3 * 785)
    assert ingested.tags["mlflow_neuron.device"] == "neuron" and ingested.tags["mlflow_neuron.device_time"] == "present"
    neuron = lambda rid: {p for p in artifact_files(client, rid) if "/neuron/" in p}  # noqa: E731
    assert neuron(run_id) == neuron(live_id) and neuron(run_id)


def test_malformed_inputs_get_clear_errors(tracking_uri, tmp_path, capsys):
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{"traceEvents": [{"ph": "X", "name": "aten::mul"')
    assert cli_main(["ingest", str(truncated)]) == 2
    assert "not a readable chrome trace" in capsys.readouterr().err
    no_ops = tmp_path / "empty.json"
    no_ops.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}}]}))
    assert cli_main(["ingest", str(no_ops)]) == 2
    assert "no host op events" in capsys.readouterr().err
    not_a_trace = tmp_path / "list.json"
    not_a_trace.write_text("[1, 2, 3]")
    assert cli_main(["ingest", str(not_a_trace)]) == 2
    assert "no traceEvents list" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # a usage error, found before anything is imported
        cli_main(["ingest", str(tmp_path / "missing")])
    assert exited.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_path_that_holds_no_trace_creates_no_experiment_and_no_run(tracking_uri, tmp_path, capsys):
    not_a_trace = tmp_path / "notes.json"
    not_a_trace.write_text('{"hello": "world"}')
    with pytest.raises(SystemExit):  # no such path: a usage error
        cli_main(["ingest", str(tmp_path / "missing"), "--experiment", "trn2"])
    for path in (not_a_trace, tmp_path):  # not a trace; a folder without one
        assert cli_main(["ingest", str(path), "--experiment", "trn2"]) == 2
    assert MlflowClient().get_experiment_by_name("trn2") is None
    assert [r.info.run_name for r in MlflowClient().search_runs(["0"])] == []


def test_unknown_categories_are_ignored(tracking_uri, tmp_path):
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "args": {"External id": 1}},
        {"ph": "X", "cat": "some_future_category", "name": "mystery", "pid": 1, "tid": 1, "ts": 30.0, "dur": 5.0},
    ]}  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    assert cli_main(["ingest", str(path), "--experiment", "x"]) == 0
    client = MlflowClient()
    [run] = client.search_runs([client.get_experiment_by_name("x").experiment_id])
    assert run.data.metrics["profiler/self_cpu_time_us/aten.mul"] == pytest.approx(5.0)
    assert not any("mystery" in k for k in run.data.metrics)


MULTI_RANK = Path(__file__).parent / "fixtures" / "multi_rank" / "gloo_4rank_slow2"  # rank 2 slept before each all_reduce


def rank_summaries(client, run_id):
    """The run's rank summaries as `ranks` reads them; every file under profiler/ranks/ a node file."""
    paths = sorted(p.removeprefix("profiler/ranks/") for p in artifact_files(client, run_id, "profiler/ranks"))
    assert paths and all(node_file_of(p) for p in paths), paths
    return read_ranks(run_id, client=client)


def test_a_folder_of_one_trace_per_rank_makes_one_run_with_every_ranks_summary(tracking_uri, tmp_path):
    """The rank comes from the trace's distributedInfo, else from the file name."""
    unnamed = tmp_path / "unnamed"  # no distributedInfo: the name places it
    unnamed.mkdir()
    for rank in range(4):
        with gzip.open(MULTI_RANK / f"rank{rank}.json.gz", "rt") as f:
            trace = json.load(f)
        trace.pop("distributedInfo")
        (unnamed / f"worker-rank_{rank}.json").write_text(json.dumps(trace))
    client = MlflowClient()
    for folder, name in ((MULTI_RANK, "from-distributed-info"), (unnamed, "from-names")):
        assert cli_main(["ingest", str(folder), "--experiment", "ranks", "--run-name", name]) == 0
        [run] = client.search_runs([client.get_experiment_by_name("ranks").experiment_id],
                                   filter_string=f"attributes.run_name = '{name}'")  # fmt: skip
        read = rank_summaries(client, run.info.run_id)
        assert sorted((s["rank"], s["world_size"]) for s in read.summaries) == [(r, 4) for r in range(4)]
        assert len(read.cycles) == 1 and read.notes == []
        assert "profiler/total/aten_calls" in run.data.metrics  # rank 0's cycle, in full
        assert read.report.straggler["rank"] == 2
