"""How often the comparison's gate and verdicts are wrong, measured on real profiled runs.

    python benchmarks/calibration.py [--pairs 20] [--cpu-pairs 10]      # ~3 min on 2 cores

Every run is a real torch.profiler run through `MLflowProfilerCallback` into a sqlite store,
profiled with `schedule(wait=1, warmup=1, active=5, repeat=2)`: 10 per-step samples per run.
Each pair is its own experiment, compared as a user would:
`mlflow-neuron compare --experiment E --baseline base --fail-if-slower 10`.

- A/A, fake device: both runs have the same kernel times; each kernel's duration is jittered by
  U(0.7, 1.3) and 2% of kernels stall for 10x (the fake PrivateUse1 profiler of tests/, seeded).
  The gate should fire at most once in 20 pairs.
- A/B, fake device: the second run's kernels are 30% longer, same noise. The gate should fire on
  every pair.
- A/A, CPU: naive RMSNorm twice, host time only. The total's verdict should be `no change`.

The workload is the naive RMSNorm of the example: per step 3 x aten::mul, aten::mean, aten::add,
aten::rsqrt, each given one fake kernel. Prints the rates; asserts nothing (see tests/test_calibration.py).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

KERNELS = {"aten::mul": 100, "aten::mean": 40, "aten::add": 20, "aten::rsqrt": 30}
NOISE = {"FAKE_NEURON_JITTER": "0.3", "FAKE_NEURON_STALL_RATE": "0.02", "FAKE_NEURON_STALL_FACTOR": "10"}
SCHEDULE = dict(wait=1, warmup=1, active=5, repeat=2)


def kernels(scale: float) -> str:
    return ",".join(f"{op}={round(us * scale)}" for op, us in KERNELS.items())


def make_runs(uri: str, pairs: int, cpu_pairs: int, so: str | None) -> None:
    """Worker: logs the runs of every pair (one process, so the fake device is activated once)."""
    import mlflow
    import torch
    from torch.profiler import ProfilerActivity
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    torch.set_num_threads(1)  # as the example does: no OpenMP workers waiting for a core
    mlflow.set_tracking_uri(uri)
    plan = [("cpu-aa", i, ("base", 1.0), ("same", 1.0)) for i in range(cpu_pairs)]
    if so is not None:
        import fake_device

        fake_device.activate(pathlib.Path(so))
        plan += [("aa", i, ("base", 1.0), ("same", 1.0)) for i in range(pairs)]
        plan += [("ab", i, ("base", 1.0), ("slower", 1.3)) for i in range(pairs)]
    for kind, index, *runs in plan:
        mlflow.set_experiment(f"{kind}-{index}")
        for name, scale in runs:
            os.environ["FAKE_NEURON_KERNELS"] = kernels(scale)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if kind != "cpu-aa" else [])
            with mlflow.start_run(run_name=name) as run:
                with MLflowProfilerCallback(run_id=run.info.run_id, strict=True) as callback:
                    profile_rmsnorm(callback, steps=16, activities=activities, **SCHEDULE)


def gate(uri: str, experiment: str) -> tuple[int, str]:
    from mlflow_neuron.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["compare", "--experiment", experiment, "--baseline", "base", "--fail-if-slower", "10",
                     "--format", "json", "--tracking-uri", uri])  # fmt: skip
    return code, out.getvalue()


def total_verdict(report: str) -> str:
    document = json.loads(report[: report.rindex("}") + 1])
    total = next(row for row in document["rows"] if row["op"] == "TOTAL")
    run = next(label for label in document["runs"] if label != "base")
    return total[f"{run}/verdict"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--cpu-pairs", type=int, default=10)
    parser.add_argument("--worker", nargs=2, metavar=("URI", "SO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        make_runs(args.worker[0], args.pairs, args.cpu_pairs, None if args.worker[1] == "-" else args.worker[1])
        return 0

    import fake_device

    work = pathlib.Path(tempfile.mkdtemp(prefix="mlflow-neuron-calibration-"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    try:
        so = str(fake_device.build(pathlib.Path(tempfile.gettempdir()) / f"fake_neuron_build_{os.getuid()}"))
    except fake_device.FakeDeviceUnavailable as reason:
        print(f"fake device unavailable ({reason}); CPU pairs only")
        so = "-"
    started = time.perf_counter()
    env = {**os.environ, **NOISE, "FAKE_NEURON_SEED": "2026", "PYTHONPATH": os.pathsep.join(sys.path[:2])}
    subprocess.run([sys.executable, __file__, "--pairs", str(args.pairs), "--cpu-pairs", str(args.cpu_pairs),
                    "--worker", uri, so], check=True, cwd=work, env=env)  # fmt: skip
    print(f"logged {2 * (args.cpu_pairs + (2 * args.pairs if so != '-' else 0))} runs in "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip

    rows = []
    for kind, pairs in (("aa", args.pairs if so != "-" else 0), ("ab", args.pairs if so != "-" else 0),
                        ("cpu-aa", args.cpu_pairs)):  # fmt: skip
        fired = no_change = 0
        for index in range(pairs):
            code, report = gate(uri, f"{kind}-{index}")
            fired += code == 1
            no_change += total_verdict(report) == "no change"
        if pairs:
            rows.append((kind, pairs, fired, no_change))
    print("\n| pairs | what | gate fired (exit 1) | total verdict `no change` |")
    print("|---|---|---|---|")
    names = {"aa": "A/A fake device, ±30% jitter, 2% stalls", "ab": "A/B fake device, kernels +30%, same noise",
             "cpu-aa": "A/A CPU, naive RMSNorm (host time)"}  # fmt: skip
    for kind, pairs, fired, no_change in rows:
        print(f"| {pairs} | {names[kind]} | {fired}/{pairs} ({fired / pairs:.0%}) | {no_change}/{pairs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
