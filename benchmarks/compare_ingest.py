"""Compare and ingest speed, measured in one run.

    python benchmarks/compare_ingest.py [--runs 100] [--ops 200] [--events 100000]

1. compare: the pure comparison of `runs` x `ops` (synthetic op tables), and `compare_runs`
   reading the same number of runs back from a fresh local sqlite store.
2. ingest: a chrome trace of about `events` events (a real torch.profiler export), parsed and
   aggregated as `mlflow-neuron ingest` does, against a bare `json.load` of the same file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from mlflow_neuron import compare
from mlflow_neuron._analysis.model import RunProfile


def median_time(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def synthetic_profiles(runs: int, ops: int) -> list[RunProfile]:
    rng = np.random.default_rng(0)
    names = [f"aten::op_{i}" for i in range(ops)]
    profiles = []
    for r in range(runs):
        times = rng.uniform(1, 1000, ops)
        table = pd.DataFrame({"name": names, "kind": "op", "calls": rng.integers(1, 10, ops),
                              "self_device_time_us": times, "self_cpu_time_us": times / 10})
        totals = {"self_device_time_us": times.sum(), "self_cpu_time_us": times.sum() / 10, "aten_calls": ops}
        profiles.append(RunProfile(f"run_{r}", f"id_{r}", 4, table, totals, "neuron", "present"))
    return profiles


def store_with_runs(work: Path, profiles: list[RunProfile]) -> str:
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from mlflow_neuron._record.record import write_table

    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("bench", artifact_location=str(work / "artifacts"))
    for p in profiles:
        run_id = client.create_run(experiment_id, run_name=p.label,
                                   tags={"mlflow_neuron.device": "neuron", "mlflow_neuron.device_time": "present"}).info.run_id
        client.log_batch(run_id, metrics=[Metric(f"profiler/total/{k}", float(v), 0, 4) for k, v in p.totals.items()])
        folder = work / "tables" / p.label / "step_4"
        folder.mkdir(parents=True)
        write_table(p.ops, folder / "ops.json")
        client.log_artifacts(run_id, str(folder.parent), "profiler")
    mlflow.set_tracking_uri(uri)
    return uri


def trace_file(work: Path, events: int) -> Path:
    x = torch.ones(4)
    path = work / "trace.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(events):  # one aten::add event per call, plus the trace's own metadata
            torch.add(x, x)
    prof.export_chrome_trace(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    work = Path(tempfile.mkdtemp(prefix="mlflow-neuron-bench-"))

    profiles = synthetic_profiles(args.runs, args.ops)
    pure = median_time(lambda: compare(profiles, baseline="run_0"))
    uri = store_with_runs(work, profiles)
    from mlflow_neuron import compare_runs

    full = median_time(lambda: compare_runs("bench", baseline="run_0", tracking_uri=uri), repeat=1)
    print(f"compare {args.runs} runs x {args.ops} ops: pure {pure * 1000:.0f} ms; "
          f"compare_runs from a local sqlite store {full:.2f} s (reading {args.runs} runs dominates)")

    import json

    from mlflow_neuron._trace.aggregate import aggregate
    from mlflow_neuron._trace.chrome import read_chrome_file

    path = trace_file(work, args.events)
    size_mb = path.stat().st_size / 1e6
    count = len(json.load(open(path))["traceEvents"])

    def parse_and_aggregate():
        cycle = read_chrome_file(path, shapes=False)
        aggregate(cycle.raw, device=cycle.device, device_profiled=cycle.device_profiled)

    bare = median_time(lambda: json.load(open(path)))
    ours = median_time(parse_and_aggregate)
    print(f"ingest of a {size_mb:.1f} MB chrome trace with {count:,} events (median of 3):")
    print(f"{'':<28}{'seconds':>9}{'MB/s':>9}{'events/s':>12}")
    print(f"{'json.load only':<28}{bare:>9.2f}{size_mb / bare:>9.1f}{count / bare:>12,.0f}")
    print(f"{'parse + aggregate (ingest)':<28}{ours:>9.2f}{size_mb / ours:>9.1f}{count / ours:>12,.0f}")
    print(f"ingest / json.load: {ours / bare:.2f}x")


if __name__ == "__main__":
    main()
