"""Bytes, achieved GB/s and % of a measured bandwidth for the RMSNorm variants, on this CPU.

    python benchmarks/roofline_cpu.py [--shape 64,4096] [--dtype float32]

A CPU has no line in the peaks table, so this script first measures one: the best of 5 numpy
copies of a 256 MiB array (bytes read plus bytes written, over the copy's wall time), printed
as "copy bandwidth". It then profiles the example's step (linear -> RMSNorm in
`record_function("rmsnorm")` -> linear) for each variant with `record_shapes=True`, that
bandwidth given to the callback as `peaks=`, and prints per variant the region's least traffic
per step, its median CPU time, the achieved GB/s and its % of the copy bandwidth, read back from
MLflow (`compare_runs(..., region="rmsnorm")` and ops.json). Host time of a small tensor is mostly
the dispatcher's, so low percentages say that, not the memory system.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def copy_bandwidth_gbps(mib: int = 256, repeats: int = 5) -> float:
    source = np.ones(mib * 2**20 // 8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="64,4096")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    import functools

    import mlflow
    import torch
    from rmsnorm_variants import REGION, model_step, variants

    from mlflow_neuron import compare_runs, interleaved

    torch.set_num_threads(1)
    bandwidth = copy_bandwidth_gbps()
    print(f"copy bandwidth (numpy, 256 MiB, best of 5): {bandwidth:.1f} GB/s")
    shape, dtype = tuple(int(n) for n in args.shape.split(",")), getattr(torch, args.dtype)
    x, weight = torch.randn(*shape, dtype=dtype), torch.ones(shape[-1], dtype=dtype)
    w_in, w_out = (torch.randn(shape[-1], shape[-1], dtype=dtype) / shape[-1] ** 0.5 for _ in range(2))
    steps = {name: functools.partial(model_step, fn, x, w_in, weight, w_out) for name, fn in variants("cpu").items()}
    with tempfile.TemporaryDirectory() as tmp:
        mlflow.set_tracking_uri(f"sqlite:///{Path(tmp, 'mlflow.db')}")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        peak = {"name": "this CPU's copy bandwidth", "memory_gbps": bandwidth, "source": "benchmarks/roofline_cpu.py"}
        with mlflow.start_run(run_name="roofline"):
            runs = interleaved(steps, cycles=4, wait=1, warmup=2, active=5, device="cpu", background=False,
                               profile_dir=Path(tmp, "np"), peaks=peak, profile_kwargs={"record_shapes": True})  # fmt: skip
        frame = compare_runs(list(runs.run_ids.values()), baseline="naive", region=REGION)
        print(f"\nregion {REGION}, shape {args.shape} {args.dtype}, measured on CPU (host time)")
        print("| variant | bytes per step | median CPU time per step (us) | achieved GB/s | % of copy bandwidth |")
        print("|---|---|---|---|---|")
        for label in runs.run_ids:
            rows = frame.attrs["throughput"].get(label, [])
            median = frame.loc["TOTAL", (label, "time_us")]
            if not rows:
                print(f"| {label} | (unknown: an op without a formula) | {median:,.1f} | - | - |")
                continue
            gbps, pct = rows[0]["achieved_gbps"], rows[0]["pct_of_peak_bandwidth"]
            print(f"| {label} | {_region_bytes(runs.run_ids[label], frame):,.0f} | {median:,.1f} | {gbps:,.2f} | {pct:,.1f}% |")
    return 0


def _region_bytes(run_id: str, frame) -> float:
    """The region's bytes per step, from the last cycle's ops.json region row."""
    import json

    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    step = frame.attrs["steps"][next(label for label, rid in frame.attrs["runs"].items() if rid == run_id)]
    with tempfile.TemporaryDirectory() as tmp:
        table = json.loads(Path(client.download_artifacts(run_id, f"profiler/step_{step}/ops.json", tmp)).read_text())
    row = next(dict(zip(table["columns"], r)) for r in table["data"] if r[table["columns"].index("kind")] == "region")
    return row["bytes"] / row["calls"]


if __name__ == "__main__":
    sys.exit(main())
