"""RMSNorm three ways, profiled into MLflow: naive ATen ops, fused `torch.rms_norm`, `torch.compile`.

One parent run and one child run per variant (`naive`, `fused`, `compiled`) in experiment
`rmsnorm-variants`; ends with a side-by-side table read back from MLflow.

    python examples/rmsnorm_variants.py                       # Neuron, else CUDA, else CPU
    python examples/rmsnorm_variants.py --device cpu --steps 8 --shape 8,4096 --dtype float32
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import mlflow
import pandas as pd
import torch
from mlflow.tracking import MlflowClient
from torch.profiler import profile, schedule

from mlflow_neuron import MLflowProfilerCallback, compile_backend, pick_device, profiling_setup, synchronize

EXPERIMENT = "rmsnorm-variants"
EPS = 1e-6


def rms_norm_naive(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # Six ATen calls: mul, mean, add, rsqrt, mul, mul.
    rms = torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
    return x * rms * weight


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.rms_norm(x, (x.shape[-1],), weight, EPS)


def variants(device: str) -> dict[str, Callable]:
    return {
        "naive": rms_norm_naive,
        "fused": rms_norm_fused,
        "compiled": torch.compile(rms_norm_naive, backend=compile_backend(device)),
    }


def profile_variant(name: str, fn: Callable, args: argparse.Namespace, device: str) -> str:
    shape = tuple(int(n) for n in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype).to(device)
    weight = torch.ones(shape[-1], dtype=dtype).to(device)
    setup = profiling_setup(device, os.path.join(args.profile_dir, name))
    with mlflow.start_run(run_name=name, nested=True) as run:
        mlflow.log_params({"variant": name, "shape": args.shape, "dtype": args.dtype})
        with MLflowProfilerCallback(*setup.handlers, run_id=run.info.run_id) as callback:
            with profile(
                **setup.profiler_kwargs(),
                schedule=schedule(wait=2, warmup=1, active=1),
                on_trace_ready=callback,
            ) as prof:
                for _ in range(args.steps):
                    fn(x, weight)
                    synchronize(device)
                    prof.step()
    return run.info.run_id


def comparison_table(run_ids: dict[str, str], top: int = 8) -> tuple[pd.DataFrame, str]:
    """Per-op time, totals, ATen calls and speedup vs naive, read back from the runs' metrics."""
    client = MlflowClient()
    runs = {name: client.get_run(run_id).data for name, run_id in run_ids.items()}
    on_device = all(r.tags.get("mlflow_neuron.device_time") == "present" for r in runs.values())
    metric = "self_device_time_us" if on_device else "self_cpu_time_us"
    prefix = f"profiler/{metric}/"
    per_op = pd.DataFrame(
        {
            name: {k[len(prefix) :]: v for k, v in r.metrics.items() if k.startswith(prefix)}
            for name, r in runs.items()
        }
    )
    per_op = per_op.loc[per_op.max(axis=1).sort_values(ascending=False).index[:top]]
    totals = pd.DataFrame(
        {name: [r.metrics.get(f"profiler/total/{metric}"), r.metrics.get("profiler/total/aten_calls")]
         for name, r in runs.items()},
        index=[f"TOTAL {metric}", "ATen calls"],
    )
    baseline = totals.loc[f"TOTAL {metric}", "naive"]
    totals.loc["speedup vs naive"] = [baseline / t if t else float("nan") for t in totals.loc[f"TOTAL {metric}"]]
    return pd.concat([per_op, totals]), metric


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="neuron, cuda or cpu (default: the first available)")
    parser.add_argument("--steps", type=int, default=4, help="profiler steps per variant (default 4)")
    parser.add_argument("--shape", default="4,512", help="input shape (default 4,512)")
    parser.add_argument("--dtype", default="bfloat16", help="torch dtype name (default bfloat16)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, sqlite:///mlflow.db)")
    parser.add_argument("--profile-dir", default="neuron_profile", help="Neuron profile output folder")
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4 (schedule wait=2, warmup=1, active=1)")

    if args.tracking_uri:
        mlflow.set_tracking_uri(args.tracking_uri)
    device = pick_device(args.device)
    mlflow.set_experiment(EXPERIMENT)
    with mlflow.start_run(run_name=f"rmsnorm-{device}") as parent:
        mlflow.log_params({"device": device, "shape": args.shape, "dtype": args.dtype, "steps": args.steps})
        run_ids = {name: profile_variant(name, fn, args, device) for name, fn in variants(device).items()}

    table, metric = comparison_table(run_ids)
    unit = "device" if metric == "self_device_time_us" else "CPU (no device time on this device)"
    print(f"\nRMSNorm variants on {device}, shape {args.shape} {args.dtype}: self {unit} time in us per op")
    print(table.to_string(float_format=lambda v: f"{v:,.2f}"))
    print(f"\nParent run {parent.info.run_id} in experiment '{EXPERIMENT}'. Open the MLflow UI with:")
    print(f"    mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
