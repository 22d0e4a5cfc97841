"""Training-thread cost of one profiler cycle with MLflowProfilerCallback, side by side with the
profiler's own `export_chrome_trace` of the same kind of cycle, measured in one run; then MLflow
requests per cycle and trace bytes uploaded against the raw export.

    python benchmarks/cycle_cost.py [--cycles 5] [--layers 8]

Prints medians over the cycles of each workload. The store is a fresh local sqlite database.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import mlflow
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron._delivery import mlflow_io


class Timed:
    def __init__(self, handler):
        self.handler, self.seconds, self.events = handler, [], []

    def __call__(self, prof):
        start = time.perf_counter()
        self.handler(prof)
        self.seconds.append(time.perf_counter() - start)
        self.events.append(len(prof.profiler.kineto_results.events()))


class CountingClient:
    """Counts the MLflow client calls a callback makes (each is one request to a server)."""

    def __init__(self, client):
        self.client, self.calls, self.metrics = client, {}, 0

    def __getattr__(self, name):
        method = getattr(self.client, name)
        if not callable(method):  # a property such as tracking_uri
            return method

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            self.metrics += len(kwargs.get("metrics", ())) if name == "log_batch" else 0
            return method(*args, **kwargs)

        return counted


def rmsnorm_step():
    x, w = torch.randn(4, 512), torch.ones(512)
    return lambda: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def many_ops_step(count):
    x = torch.ones(4)

    def step():
        for _ in range(count):
            torch.add(x, x)

    return step


def mlp_step(layers):
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 256)

    def step():
        loss = model(data).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def measure(step, handler, cycles):
    timed = Timed(handler)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=cycles),
        on_trace_ready=timed,
    ) as prof:
        for _ in range(4 * cycles):
            step()
            prof.step()
    return statistics.median(timed.seconds) * 1000, statistics.median(timed.events)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--many", type=int, default=25_000, help="ops per step of the large workload")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mlflow-neuron-bench-"))
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    mlflow.set_experiment("bench")
    print("callback ms: on the training thread, with the helper process (default, started ahead); inline ms: "
          "process='inline' (this process reads the cycle; its background thread does the rest)")
    print(f"{'workload':<22}{'events/cycle':>14}{'callback ms':>14}{'inline ms':>12}{'export ms':>12}{'ratio':>8}"
          f"{'requests/cycle':>16}{'metrics/cycle':>15}{'trace raw KB':>14}{'uploaded KB':>13}")
    workloads = (
        ("rmsnorm (naive)", rmsnorm_step),
        (f"mlp {args.layers} layers + sgd", lambda: mlp_step(args.layers)),
        (f"{args.many:,} adds a step", lambda: many_ops_step(args.many)),
    )
    for name, make in workloads:
        with mlflow.start_run(run_name=f"{name} (helper)") as run:
            callback = MLflowProfilerCallback(run_id=run.info.run_id, strict=True)
            if not callback.start_helper(300):
                raise RuntimeError("the helper process did not start")
            callback_ms, events = measure(make(), callback, args.cycles)
            callback.close()
        with mlflow.start_run(run_name=name) as run:  # MLflow's requests are counted in this process
            counting = CountingClient(mlflow.MlflowClient())
            # The drain makes its RunLogger at the first delivery: it gets the counting client.
            with mock.patch.object(mlflow_io, "MlflowClient", lambda uri=None: counting):
                callback = MLflowProfilerCallback(run_id=run.info.run_id, strict=True, process="inline")
                inline_ms, _ = measure(make(), callback, args.cycles)
                callback.flush()
        counter = iter(range(10**6))
        export_ms, _ = measure(make(), lambda prof: prof.export_chrome_trace(str(work / f"t{next(counter)}.json")), args.cycles)
        raw_kb = statistics.median(p.stat().st_size for p in work.glob("t*.json")) / 1024
        for p in work.glob("t*.json"):
            p.unlink()
        artifacts = Path(mlflow.get_run(run.info.run_id).info.artifact_uri.removeprefix("file://"))
        gz_kb = statistics.median(p.stat().st_size for p in artifacts.glob("profiler/step_*/trace.json.gz")) / 1024
        requests = sum(counting.calls.values()) / args.cycles
        print(f"{name:<22}{events:>14.0f}{callback_ms:>14.1f}{inline_ms:>12.1f}{export_ms:>12.1f}{callback_ms / export_ms:>8.1f}"
              f"{requests:>16.1f}{counting.metrics / args.cycles:>15.0f}{raw_kb:>14.0f}{gz_kb:>13.0f}")
        print(f"{'':<22}client calls over {args.cycles} cycles: {dict(sorted(counting.calls.items()))}")


if __name__ == "__main__":
    main()
