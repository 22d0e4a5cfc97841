"""An existing training loop with profiling into MLflow: the change is one `on_trace_ready=` line.

    python examples/train_loop.py [--device cpu] [--steps 24]

A repeating schedule (wait=1, warmup=1, active=2, repeat=3) gives three profiler cycles; each lands
in the run as metrics at its step and as files under `profiler/step_<N>/`.
"""

from __future__ import annotations

import argparse

import mlflow
import torch
from torch import nn
from torch.profiler import profile, schedule

from mlflow_neuron import MLflowProfilerCallback, pick_device, profiling_setup, synchronize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="neuron, cuda or cpu (default: the first available)")
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    device = pick_device(args.device)
    setup = profiling_setup(device)  # on Neuron: NeuronConfig + NeuronProfiler exporter

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 256, device=device)
    target = torch.randint(0, 10, (64,), device=device)

    mlflow.set_experiment("train-loop")
    with mlflow.start_run(run_name=f"mlp-{device}") as run:
        with profile(
            **setup.profiler_kwargs(),
            schedule=schedule(wait=1, warmup=1, active=2, repeat=3),
            on_trace_ready=MLflowProfilerCallback(*setup.handlers),  # <- the one-line change
        ) as prof:
            for step in range(args.steps):
                loss = nn.functional.cross_entropy(model(data), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                synchronize(device)
                mlflow.log_metric("loss", loss.item(), step=step)
                prof.step()
    print(f"run {run.info.run_id}: loss and profiler/... metrics in experiment 'train-loop'")


if __name__ == "__main__":
    main()
