"""Regions: a record_function range's inclusive time, checked against numbers computed here
without the code under test, and `compare --region` with its gate.

- Public traces (tests/fixtures): per region, its calls, wall time, and the kernels whose runtime
  launch lies inside a `cpu_op` inside the range (the reader's documented link: a launch in no op
  stays unattributed), walked from the raw JSON events.
- A real CPU profile: each step's outermost `rmsnorm` range duration, read from the chrome trace.
- The fake device, whose kernel durations are chosen: the region's device time per step is their sum.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import read_json_artifact, run_python
from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from mlflow_neuron._trace.chrome import read_chrome_trace
from mlflow_neuron._trace.summarize import CycleSettings, summarize
from mlflow_neuron.cli import main as cli_main

REAL = Path(__file__).parent / "fixtures" / "real_traces"
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})


def _inside(outer: dict, inner: dict) -> bool:
    return ((outer["pid"], outer["tid"]) == (inner["pid"], inner["tid"]) and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner.get("dur", 0) <= outer["ts"] + outer["dur"])  # fmt: skip


def independent_regions(trace: dict) -> dict[str, tuple[int, float, int, float]]:
    """name -> (calls, device us, launches, wall us), straight from the JSON events."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if e.get("cat") == "user_annotation" and not e["name"].startswith("ProfilerStep")]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    launch_of = {e["args"]["correlation"]: e for e in events
                 if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}  # fmt: skip
    kernels = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and "correlation" in e.get("args", {})]
    found: dict[str, list] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for region in ranges:
        if any(o is not region and o["name"] == region["name"] and _inside(o, region) for o in ranges):
            continue  # inside a range of its own name: counted with that one
        row = found[region["name"]]
        row[0] += 1
        row[3] += region["dur"]
        in_region = [o for o in ops if _inside(region, o)]
        for kernel in kernels:
            launch = launch_of.get(kernel["args"]["correlation"])
            if launch is not None and any(_inside(op, launch) for op in in_region):
                row[1] += kernel["dur"]
                row[2] += 1
    return {name: tuple(row) for name, row in found.items()}


def summed_regions(profile) -> dict[str, tuple[int, float, int, float]]:
    found: dict[str, list] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for r in profile.regions:
        row = found[r.name]
        row[0] += r.calls
        row[1] += r.device_time_us
        row[2] += r.launches
        row[3] += r.cpu_time_us
    return {name: tuple(row) for name, row in found.items()}


@pytest.mark.parametrize("fixture", ["tracelens_rocm_mi300_normalization.json.gz", "hta_cuda_alexnet_2023.json.gz",
                                     "hta_rocm62_mi250_minitoy.json.gz"])  # fmt: skip
def test_region_times_of_public_traces_match_the_events(fixture):
    trace = json.loads(gzip.open(REAL / fixture).read())
    want = independent_regions(trace)
    got = summed_regions(summarize(read_chrome_trace(trace)[0], CycleSettings("cuda", True)).profile)
    assert set(got) == set(want) and want
    for name, (calls, device_us, launches, wall_us) in want.items():
        assert got[name][0] == calls and got[name][2] == launches, name
        assert got[name][1] == pytest.approx(device_us, abs=1.0), name
        assert got[name][3] == pytest.approx(wall_us, abs=1.0), name
    assert any(v[1] > 0 for v in want.values())  # kernels were counted somewhere


def test_cpu_region_is_the_outermost_range_per_step_with_the_ops_inside(tmp_path):
    x = __import__("torch").randn(16, 256)
    path = tmp_path / "cycle.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:  # fmt: skip
        for _ in range(4):
            y = x * 2
            with record_function("rmsnorm"):
                z = y * (y * y).mean(-1, keepdim=True).rsqrt()
                with record_function("rmsnorm"):  # nested in its own name: part of the outer one
                    z = z + 1
            z = z - 1
            prof.step()
    trace = json.loads(path.read_text())
    outer = sorted((e["ts"], e["dur"]) for e in trace["traceEvents"] if e.get("name") == "rmsnorm"
                   and not any(o is not e and o.get("name") == "rmsnorm" and _inside(o, e) for o in trace["traceEvents"]
                               if o.get("ph") == "X"))  # fmt: skip
    profile_ = summarize(read_chrome_trace(trace)[0], CycleSettings("cpu", False, default_step=3)).profile
    regions = sorted(profile_.regions, key=lambda r: r.step)
    assert [r.step for r in regions] == [1, 2, 3] and all(r.calls == 1 and r.launches == 0 for r in regions)
    assert [r.cpu_time_us for r in regions] == pytest.approx([d for _, d in outer], abs=0.002)
    inside = {(r.step, r.name) for r in profile_.region_ops if r.region == "rmsnorm"}
    assert {(1, "aten::mean"), (1, "aten::rsqrt"), (1, "aten::add"), (1, "rmsnorm")} <= inside
    assert not any(name == "aten::sub" for _, name in inside)  # after the range


SCENARIO = """
import json, os, pathlib, torch
import fake_device
fake_device.activate(pathlib.Path({so!r}))
import mlflow
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
mlflow.set_experiment("regions")
x, w = torch.randn(8, 64), torch.ones(64)
ids = {{}}
for name, kernels, fused in {variants!r}:
    os.environ["FAKE_NEURON_KERNELS"] = kernels
    with mlflow.start_run(run_name=name) as run:
        callback = MLflowProfilerCallback(strict=True, flush_timeout_s=120)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                     schedule=schedule(wait=1, warmup=1, active=4, repeat=2), on_trace_ready=callback,
                     record_shapes=True, profile_memory=True) as prof:
            for _ in range(12):
                y = x * 2
                with record_function("rmsnorm"):
                    z = torch.rms_norm(y, (64,), w, 1e-6) if fused else y * torch.rsqrt((y * y).mean(-1, keepdim=True) + 1e-6) * w
                z = z - 1
                prof.step()
        callback.close()
    ids[name] = run.info.run_id
print(json.dumps(ids))
"""
NAIVE = "aten::mul=10,aten::mean=4,aten::add=3,aten::rsqrt=5,aten::sub=2"  # inside: mul x3, mean, add, rsqrt


def test_fake_device_region_compare_and_gate(fake_profiler, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    variants = [("naive", NAIVE, False), ("slower_inside", NAIVE.replace("mul=10", "mul=13"), False),
                ("slower_outside", NAIVE.replace("sub=2", "sub=9"), False), ("fused", "aten::rms_norm=7,aten::sub=2", True)]  # one kernel for the whole norm
    result = run_python(SCENARIO.format(so=str(fake_profiler), uri=uri, variants=variants), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ids = json.loads(result.stdout.strip().splitlines()[-1])
    client = MlflowClient(uri)

    steps = read_json_artifact(client, ids["naive"], "profiler/step_6/steps.json", tmp_path / "d")
    regions = [dict(zip(steps["columns"], row)) for row in steps["data"] if row[steps["columns"].index("kind")] == "region"]
    assert [(r["step"], r["device_time_us"], r["launches"], r["calls"]) for r in regions] == \
        [(s, 3 * 10 + 4 + 3 + 5, 6, 1) for s in (2, 3, 4, 5)]  # fmt: skip
    assert client.get_run(ids["naive"]).data.metrics["profiler/region_device_time_us/rmsnorm"] == 4 * 42
    assert client.get_metric_history(ids["naive"], "profiler/step/peak_memory_bytes/cpu")
    ops = read_json_artifact(client, ids["fused"], "profiler/step_6/ops.json", tmp_path / "o")
    rows = {(r[0], r[ops["columns"].index("kind")]): dict(zip(ops["columns"], r)) for r in ops["data"]}
    norm = rows[("aten::rms_norm", "op")]  # 8x64 float in and out, a 64-float weight; 4 calls
    assert norm["bytes"] == 4 * 4 * (2 * 8 * 64 + 64) and norm["calls"] == 4 and norm["device_time_us"] == 4 * 7
    assert norm["achieved_gbps"] == pytest.approx(norm["bytes"] / (4 * 7e-6) / 1e9, rel=1e-3)
    assert rows[("rmsnorm", "region")]["device_time_us"] == 4 * 7 and rows[("rmsnorm", "region")]["launches"] == 4

    def compare(*args: str) -> int:
        code = cli_main(["compare", "--tracking-uri", uri, "--experiment", "regions", "--region", "rmsnorm", *args])
        return code

    assert compare("--runs", "naive", "slower_inside", "--fail-if-slower", "10") == 1  # 51 vs 42 us: +21%
    assert "REGRESSION slower_inside: region rmsnorm median 42.00 -> 51.00 us" in capsys.readouterr().out
    assert compare("--runs", "naive", "slower_outside", "--fail-if-slower", "10") == 0  # the sub after it: not in it
    capsys.readouterr()
    assert compare("--runs", "naive", "fused", "--format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"]["fused"]["rmsnorm"] == [7.0] * 8 and report["samples"]["naive"]["rmsnorm"] == [42.0] * 8
    assert report["launches"] == {"naive": 6, "fused": 1}
    sentence = report["sentences"]["fused"]
    assert "region rmsnorm device time" in sentence and "(6 launches) replaced by" in sentence
    assert "aten::rms_norm" in sentence.split("replaced by")[1] and "(1 launch)" in sentence
    assert compare("--runs", "naive", "fused") == 0
    table = capsys.readouterr().out
    assert "region rmsnorm" in table and "aten::rsqrt" in table and "launches per step" in table
    assert "neuron_kernel::aten::rms_norm" in table  # the kernels inside, beside the ops that launched them
    assert cli_main(["compare", "--tracking-uri", uri, "--experiment", "regions", "--region", "nope"]) == 2
    assert "has no region 'nope'; its regions: rmsnorm" in capsys.readouterr().err
