"""Memory per step and per op (`profile_memory=True`): the peak's definition on chosen records, the
same peak read independently from a real chrome trace's "Total Allocated", and `compare --metric
peak_memory_bytes` on runs logged by the callback."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron._trace.chrome import read_chrome_trace
from mlflow_neuron._trace.events import MemoryRecords
from mlflow_neuron._trace.kineto import raw_events_from_kineto
from mlflow_neuron._trace.aggregate import aggregate
from mlflow_neuron._trace.memory import StepMemory, step_peaks
from mlflow_neuron.cli import main as cli_main


def records(*rows: tuple[int, int, int]) -> MemoryRecords:
    at, size, device = (np.array(column, np.int64) for column in zip(*rows))
    return MemoryRecords(at, size, device, np.zeros(len(rows), np.int64))


def test_the_peak_is_the_highest_level_above_the_steps_start():
    memory = records(
        (10, 100, 0), (20, 50, 0), (30, -120, 0), (40, 200, 0),  # step 5: 100, 150, 30, 230 above its start
        (150, 999, 0),  # between the steps: neither
        (210, -50, 0), (220, 30, 0),  # step 6 frees first: its level never rises above its start
        (230, 64, 1), (240, -64, 1), (250, 32, 1),  # CUDA memory in step 6
    )  # fmt: skip
    peaks = step_peaks(memory, np.array([0, 200]), np.array([100, 300]), [5, 6], private_use1="neuron")
    assert peaks == (StepMemory(5, "cpu", 230), StepMemory(6, "cpu", -20), StepMemory(6, "cuda", 64))
    assert step_peaks(records((10, 8, 20)), np.array([0]), np.array([100]), [1], "neuron") == (StepMemory(1, "neuron", 8),)
    assert step_peaks(None, np.array([0]), np.array([100]), [1], "neuron") == ()


def independent_peaks(trace: dict) -> dict[int, int]:
    """Per ProfilerStep#N: the highest "Total Allocated" of the [memory] events inside its range
    minus the level before its first one, read from the JSON alone."""
    events = trace["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    found = {}
    for step in (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")):
        inside = [m["args"] for m in memory if step["ts"] <= m["ts"] <= step["ts"] + step["dur"]]
        level = inside[0]["Total Allocated"] - inside[0]["Bytes"]
        found[int(step["name"].split("#")[1])] = max(m["Total Allocated"] for m in inside) - level
    return found


def test_both_readers_give_the_peaks_a_chrome_trace_states(tmp_path):
    path, box = tmp_path / "cycle.json", {}

    def ready(prof):
        prof.export_chrome_trace(str(path))
        box["kineto"] = aggregate(raw_events_from_kineto(prof), device="cpu", device_profiled=False, default_step=3)

    weight = torch.ones(256)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=ready) as prof:  # fmt: skip
        for _ in range(4):
            x = torch.randn(32, 256)
            with record_function("rmsnorm"):
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
            buffer = torch.empty(1000)  # 4,000 bytes from aten::empty
            del x, y, buffer
            prof.step()
    trace = json.loads(path.read_text())
    want = independent_peaks(trace)
    ranges = [e for e in trace["traceEvents"] if e.get("name") == "rmsnorm" and e.get("ph") == "X"]
    in_ranges = sorted(sum(m["args"]["Bytes"] for m in trace["traceEvents"] if m.get("name") == "[memory]"
                           and m["args"]["Bytes"] > 0 and r["ts"] <= m["ts"] <= r["ts"] + r["dur"]) for r in ranges)
    chrome = aggregate(read_chrome_trace(trace)[0], device="cpu", device_profiled=False, default_step=3)
    for got in (chrome, box["kineto"]):
        assert {m.step: m.peak_bytes for m in got.step_memory} == want and len(want) == 3
        assert {m.device for m in got.step_memory} == {"cpu"}
        allocated = dict(got.allocated)
        assert allocated["aten::pow"] == 3 * 32 * 256 * 4  # its output, in each of the 3 steps
        assert allocated["aten::empty"] >= 3 * 4000
        region = sorted(r.allocated_bytes for r in got.regions)
        assert region == in_ranges and min(region) >= 32 * 256 * 4 * 3 + 32 * 4 * 3  # pow, mul, mul; mean, add, rsqrt


def test_compare_peak_memory_of_logged_runs(tracking_uri, tmp_path, capsys):
    for name, size, memory in (("small", 64, True), ("large", 256, True), ("without", 64, False)):
        callback = MLflowProfilerCallback(run_name=name, flush_timeout_s=120, strict=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=memory, on_trace_ready=callback,
                     schedule=schedule(wait=0, warmup=1, active=4)) as prof:  # fmt: skip
            for _ in range(5):
                (torch.ones(size, 256) * 2).sum()
                prof.step()
        callback.close()
    client = MlflowClient(tracking_uri)
    runs = {r.info.run_name: r for r in client.search_runs(["0"])}
    history = client.get_metric_history(runs["large"].info.run_id, "profiler/step/peak_memory_bytes/cpu")
    assert len(history) == 4 and min(p.value for p in history) >= 256 * 256 * 4 * 2  # ones, and the product

    args = ["compare", "--tracking-uri", tracking_uri, "--experiment", "Default", "--metric", "peak_memory_bytes"]
    assert cli_main([*args, "--runs", "small", "large", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metric"] == "peak_memory_bytes" and report["verdicts"]["large"] == "slower"
    ratio = next(r for r in report["rows"] if r["op"] == "TOTAL")["large/ratio"]
    assert ratio == pytest.approx(4.0, rel=0.05)  # four times the rows, four times the bytes
    assert cli_main([*args, "--runs", "small", "large"]) == 0
    assert "median peak memory per step (bytes" in capsys.readouterr().out
    assert cli_main([*args, "--runs", "small", "without"]) == 2
    assert "run without has no memory samples: profile it with profile_memory=True" in capsys.readouterr().err
