"""A cycle's saved trace is read once: its numbers, op tables, timeline and rank summary come from
one pass over the file (`_trace.summarize.RankPass` is fed the same pieces as the cycle's reader).

The count is taken by a wrapper around the one function that reads a trace file
(`_trace.chrome_file.read_pieces`), put in place by the test only: in-process for `ingest`, and
through a `sitecustomize` on the path of a training script for the helper process it starts.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, artifact_files
from mlflow.tracking import MlflowClient

from mlflow_neuron._analysis.ranks.frames import collectives_frame
from mlflow_neuron._capture.ingest import read_cycle
from mlflow_neuron._readback.ranks import read_ranks
from mlflow_neuron._record import node_file as node_file_format
from mlflow_neuron._record.model import node_file
from mlflow_neuron._trace import chrome, chrome_file, collectives
from mlflow_neuron._trace.summarize import ChromeTraceFile, CycleSettings

COUNTER = '''
import json, os
from mlflow_neuron._trace import chrome_file
_read = chrome_file.read_pieces

def read_pieces(path, feed, restart):
    with open({log!r}, "a") as out:
        out.write(json.dumps({{"pid": os.getpid(), "path": str(path)}}) + "\\n")
    return _read(path, feed, restart)

chrome_file.read_pieces = read_pieces
'''

SCRIPT = """
import mlflow
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
with mlflow.start_run(run_name="once") as run:
    callback = MLflowProfilerCallback(process={process!r})
    profile_rmsnorm(callback, steps=12, wait=1, warmup=1, active=2)
    callback.close()
print(run.info.run_id)
"""


def counted_reads(monkeypatch) -> Counter:
    reads: Counter = Counter()

    def counting(real):
        def read_pieces(path, feed, restart):
            reads[Path(path).name] += 1
            return real(path, feed, restart)

        return read_pieces

    for module in (chrome, collectives):  # every module that reads a trace file names it
        monkeypatch.setattr(module, "read_pieces", counting(module.read_pieces))
    return reads


def node_files(client: MlflowClient, run_id: str) -> list[str]:
    return sorted(p for p in artifact_files(client, run_id, "profiler/ranks"))


def test_ingest_reads_each_trace_once_and_still_logs_its_rank_summary(tracking_uri, monkeypatch, tmp_path, capsys):
    from mlflow_neuron.cli import main as cli_main

    folder = TESTS / "fixtures" / "multi_rank" / "gloo_4rank_slow2"
    reads = counted_reads(monkeypatch)
    assert cli_main(["ingest", str(folder), "--experiment", "once", "--run-name", "ingested"]) == 0
    traces = sorted(p.name for p in folder.iterdir() if ".json" in p.name)
    assert dict(reads) == {name: 1 for name in traces}
    run = MlflowClient().search_runs([MlflowClient().get_experiment_by_name("once").experiment_id])[0]
    assert len(read_ranks(run.info.run_id).summaries) == len(traces)  # in its node's file


def test_the_helper_reads_each_cycles_trace_once_and_the_rank_summary_is_the_same(tmp_path):
    """Default settings (the helper process), three cycles: each saved trace is opened once, by
    whichever process prepares it, and the rank summary equals one made by reading the file again."""
    for process in ("helper", "inline"):
        hook, log = tmp_path / process / "hook", tmp_path / process / "reads.jsonl"
        hook.mkdir(parents=True)
        (hook / "sitecustomize.py").write_text(COUNTER.format(log=str(log)), encoding="utf-8")
        uri = f"sqlite:///{tmp_path / process / 'mlflow.db'}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT), str(TESTS)])}
        done = subprocess.run([sys.executable, "-c", SCRIPT.format(uri=uri, process=process)], cwd=tmp_path / process,
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        run_id = done.stdout.strip().splitlines()[-1]
        reads = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        by_file = Counter(r["path"] for r in reads)
        assert len(by_file) == 3 and set(by_file.values()) == {1}, (process, reads)
        client = MlflowClient(uri)
        host = socket.gethostname()
        assert node_files(client, run_id) == sorted(node_file(host, s, 0) for s in (4, 8, 12))
        [logged], frame = node_file_format.read(client.download_artifacts(run_id, node_file(host, 8, 0),
                                                                          str(tmp_path / process)))  # fmt: skip
        assert [s["step"] for s in logged["steps"]] == [6, 7] and all(s["step_us"] > 0 for s in logged["steps"])
        trace = client.download_artifacts(run_id, "profiler/step_8/trace.json.gz", str(tmp_path / process))
        again = collectives.rank_summary_from_chrome(trace, rank=0, host=logged["host"],
                                                     world_size=logged["world_size"], cycle_step=8)  # fmt: skip
        # the same numbers as a second read would give: the summary, and its collectives as columns
        assert logged == json.loads(json.dumps({k: v for k, v in again.items() if k not in ("collectives", "member_sets")}))
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
        assert rows == collectives_frame([again]).astype(object).where(lambda f: f.notna(), None).to_dict("records")


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _edge_trace(*extra) -> dict:
    """A trace with every kind of event the rank summary takes from the reader's columns or walks itself."""
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 0, "ts": 0, "dur": 900},
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "python"}},
        _x("cpu_op", "ProfilerStep#1", 1, 400), _x("user_annotation", "ProfilerStep#2", 401, 400),
        _x("cpu_op", "aten::mm", 2, 50, **{"External id": 1}), _x("cpu_op", "aten::add", 60.5, 10.25),
        _x("cuda_runtime", "cudaLaunchKernel", 3, 5, correlation=11), _x("cuda_runtime", "cudaLaunchKernel", 4, 1),
        _x("cuda_runtime", "cudaMemcpyAsync", 5, 1, correlation=0),
        _x("kernel", "gemm", 20, 30, tid=9, correlation=11), _x("kernel", "gemm", 51, 3, tid=9),
        _x("kernel", "gemm", 55, 3, tid=9, correlation=None), _x("gpu_memcpy", "Memcpy HtoD", 60, 4, tid=9, correlation=0, bytes=4096),
        _x("kernel", "ncclDevKernel_AllReduce_Sum_f32", 70, 90, tid=9, correlation=12, **{"Collective name": "allreduce"}),
        _x("cuda_runtime", "cudaLaunchKernel", 65, 2, correlation=12),
        _x("cpu_op", "c10d::allreduce_", 64, 3), _x("cpu_op", "c10d::send", 170, 2, **{"Concrete Inputs": ["", "", "1"]}),
        _x("cpu_op", "record_param_comms", 171, 2, **{"Collective name": "send"}),
        _x("user_annotation", "gloo:all_reduce", 180, 40, tid=3), _x("python_function", "train.py(9): step", 1, 800),
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 7, "tid": 1, "ts": 100, "s": "t",
         "args": {"Total Allocated": 4096, "Bytes": 4096, "Device Type": 1}},
        {"ph": "s", "cat": "ac2g", "name": "launch", "id": 11, "pid": 7, "tid": 1, "ts": 3},
        *extra,
    ]
    return {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": events}


class _Walked(collectives.RankEvents):
    """RankEvents that counts the events it walks itself."""

    def restart(self) -> None:
        super().restart()
        self.walked = 0

    def feed(self, chunk: list) -> None:
        self.walked += len(chunk)
        super().feed(chunk)


def _rank_files():
    folders = [TESTS / "fixtures" / "real_traces", *(TESTS / "fixtures" / "multi_rank").iterdir()]
    return sorted(p for f in folders if f.is_dir() for p in f.iterdir() if p.name.endswith(".json.gz"))


def test_the_rank_summary_made_from_the_readers_columns_is_the_one_its_own_walk_gives(tmp_path, monkeypatch):
    """`RankEvents.feed_read` (the cycle's pass) keeps what `RankEvents.feed` keeps, event for
    event, on every recorded trace here and on traces made to hold each odd event, cut into
    pieces of a few events; and on a Kineto trace it walks only the few events that name a step,
    a collective or memory."""
    monkeypatch.setattr(chrome_file, "PIECE_BYTES", 700)  # many pieces: the order across them counts
    odd = {
        "every kind": _edge_trace(),
        "a hidden cpu op": _edge_trace(_x("cpu_op", "aten::mul", 300, 5, hidden=1)),
        "an Operator category": _edge_trace(_x("Operator", "aten::mul", 300, 5)),
        "an unknown device category": _edge_trace(_x("npu_kernel", "k", 300, 5, tid=9, correlation=11)),
        "a zero written -0.0": {"traceEvents": [_x("cpu_op", "aten::mul", -0.0, -0.0), _x("kernel", "k", -0.0, -0.0, correlation=3)]},
        "no step": {"traceEvents": [e for e in _edge_trace()["traceEvents"] if "ProfilerStep" not in str(e.get("name"))]},
    }
    files = {name: tmp_path / f"{k}.json" for k, name in enumerate(odd)}
    for name, trace in odd.items():
        files[name].write_text(json.dumps(trace))
    files.update({f"{p.parent.name}/{p.name}": p for p in _rank_files()})
    assert len(files) > 25
    walked = {}
    for name, path in files.items():
        alone = collectives.rank_summary_from_chrome(path, rank=0, cycle_step=3)
        events = _Walked()
        cycle = chrome.read_chrome_file(path, also=events)
        fused = events.summary(events.meta, rank=0, cycle_step=3)
        assert fused == alone and json.dumps(fused) == json.dumps(alone), name  # json: -0.0 is not 0.0
        walked[name] = events.walked / max(len(cycle.raw), 1)
    assert walked["real_traces/hta_cuda_trace_diff_control_2022.json.gz"] < 0.01
    assert walked["hta_sampled_2rank/sampled_rank-0.json.gz"] < 0.01
    assert walked["every kind"] < walked["an Operator category"]  # that piece walked whole
    summary = collectives.rank_summary_from_chrome(files["every kind"])
    assert [s["step"] for s in summary["steps"]] == [1, 2] and summary["collective_source"] == "device_kernels"
    assert summary["steps"][0]["memcpy_bytes"] == 4096 and summary["steps"][0]["peak_memory_bytes"] == 4096


@pytest.mark.parametrize("reader", ["helper", "ingest"])
def test_the_cycle_collector_resumes_only_once_what_the_read_made_is_freed(tmp_path, monkeypatch, reader):
    """The read pauses Python's cycle collector. With shapes recorded it keeps every op's input
    lists until the cycle is summarized: resumed while they live, its first pass would scan them
    all (measured: 40-120 ms a 20,000-op cycle). When it resumes, in the helper's read and in
    `ingest`'s, only what the summary keeps is new, not objects for every op."""
    ops = 5000
    events = [_x("cpu_op", "aten::add", 10 * i, 5, **{"External id": i + 1, "Input Dims": [[4], [4]],
                                                       "Input type": ["float", "float"]}) for i in range(ops)]  # fmt: skip
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"traceEvents": [_x("cpu_op", "ProfilerStep#1", 0, 10 * ops), *events]}))
    young, enable = [], gc.enable
    monkeypatch.setattr(gc, "enable", lambda: (young.append(len(gc.get_objects(0))), enable()))
    gc.collect()
    if reader == "helper":
        summary = ChromeTraceFile(str(path), CycleSettings("cpu", False, timeline_step=1, max_spans=100)).summarize()
    else:
        summary = read_cycle(path, 0, max_spans=100)[1]
    assert summary.profile.ops and summary.timeline is not None and gc.isenabled()
    assert len(young) == 1 and young[0] < ops // 5, young  # the summary's objects only
