"""Cost of a cycle's timeline (issue 12) against the cycle's aggregation, at 10k and 100k ops.

    python benchmarks/timeline_cost.py [--ops 10000 100000] [--reps 3] [--max-spans 2000]

Each cycle: `--steps` ProfilerStep ranges of `torch.add` ops, each op launching one fake "neuron"
kernel (tests/fake_device, needs g++; without it CPU ops only, and a note says so). Per cycle,
medians over --reps fresh cycles, seconds:

  aggregate  `_raw.aggregate(raw)`: what every cycle already pays in the sender
  inputs     `timeline_inputs_from_kineto`: streams and the shapes reader, from Kineto again
  build      `build_timeline(raw, inputs=...)`
  log        `log_timeline` into a local sqlite store (a fresh run per cycle)

and the ratios (inputs + build) / aggregate and (inputs + build + log) / aggregate. Reading the
raw events (`raw_events_from_kineto`) is shared by both sides and not counted. No assertions.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
os.environ.setdefault("FAKE_NEURON_KERNELS", "aten::add=1")
os.environ.setdefault("FAKE_NEURON_MODE", "kernels")


def profile_cycle(ops: int, steps: int, with_device: bool):
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if with_device else [])
    a, b = torch.ones(4), torch.ones(4)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            for _ in range(ops // steps):
                torch.add(a, b)
            prof.step()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-spans", type=int, default=2000)
    args = parser.parse_args()

    from extraction import activate_fake_device

    why_not = activate_fake_device()
    device = "neuron" if why_not is None else "cpu"
    if why_not:
        print(f"note: no fake device ({why_not}); CPU ops only")

    from mlflow import MlflowClient

    from mlflow_neuron._mlflow_traces import log_timeline
    from mlflow_neuron._raw import aggregate, raw_events_from_kineto
    from mlflow_neuron._timeline import build_timeline, timeline_inputs_from_kineto

    store = pathlib.Path(tempfile.mkdtemp(prefix="timeline_cost_"))
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.create_experiment("timeline-cost", artifact_location=str(store / "artifacts"))

    header = ("ops/cycle", "events", "aggregate s", "inputs s", "build s", "log s", "spans", "dropped",
              "(inputs+build)/aggregate", "with log")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for ops in args.ops:
        times: dict[str, list[float]] = {k: [] for k in ("aggregate", "inputs", "build", "log")}
        for _ in range(args.reps):
            prof = profile_cycle(ops, args.steps, device != "cpu")
            raw = raw_events_from_kineto(prof)
            t0 = time.perf_counter()
            aggregate(raw, device=device, device_profiled=device != "cpu")
            t1 = time.perf_counter()
            inputs = timeline_inputs_from_kineto(prof, raw)
            t2 = time.perf_counter()
            timeline = build_timeline(raw, cycle_step=prof.step_num, max_spans=args.max_spans, inputs=inputs)
            t3 = time.perf_counter()
            run_id = client.create_run(experiment).info.run_id
            t4 = time.perf_counter()
            log_timeline(client, run_id, experiment, timeline, device=device)
            t5 = time.perf_counter()
            for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t5 - t4)):
                times[key].append(value)
            events = len(raw)
            del prof
        m = {k: statistics.median(v) for k, v in times.items()}
        own = m["inputs"] + m["build"]
        print(f"| {ops:,} | {events:,} | {m['aggregate']:.3f} | {m['inputs']:.3f} | {m['build']:.3f} | "
              f"{m['log']:.3f} | {len(timeline.spans):,} | {timeline.dropped:,} | {own / m['aggregate']:.0%} | "
              f"{(own + m['log']) / m['aggregate']:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
