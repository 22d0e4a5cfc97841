"""A data-parallel job under torchrun with one slow rank: every rank profiled into one MLflow run.

    torchrun --nproc-per-node 4 examples/ranks_straggler.py --slow-rank 2 --delay-ms 30
    mlflow-neuron ranks RUN_ID        # rank 2 arrived last; the others waited ~30 ms a step

Each step is a small matmul (and, with `--device-ms`, a wait standing for the accelerator's
time), then (on `--slow-rank`) a sleep of `--delay-ms` or of `--delay-frac`
of the step's own compute, then one explicit `all_reduce`: the other ranks wait for the slow one
inside it. torch.distributed is initialized before the callback, so every rank takes rank 0's
run (one broadcast in the callback's constructor, the callback's only collective). Runs on CPU
with gloo. Every rank prints one JSON line: the run id, the tracking URI, and its rank, the
time its constructor took and the time its `close()` took (`"rank"`, `"constructor_s"`, `"close_s"`).

`--exit-rank R --exit-at S`: rank R vanishes at step S, without `close()` (exit status 0, so
that torchrun lets the others go on); the `all_reduce` then runs among the other ranks only. They
finish, and the run holds rank R's cycles before S only: `ranks` names it missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from mlflow_neuron import MLflowProfilerCallback


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=None, help="default: MLflow's (MLFLOW_TRACKING_URI or ./mlflow.db)")
    parser.add_argument("--experiment-id", default=None)
    parser.add_argument("--run-name", default=None)
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank that sleeps before each all_reduce")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="its sleep a step, in ms")
    parser.add_argument("--delay-frac", type=float, default=0.0,
                        help="its sleep a step, as a fraction of the step's compute (measured before profiling)")
    parser.add_argument("--size", type=int, default=256, help="the matmul's side (the step's compute)")
    parser.add_argument("--device-ms", type=float, default=0.0,
                        help="every rank also waits this long a step, as a rank waits on its accelerator: the host "
                             "is free meanwhile, so ranks that share cores do not slow each other")
    parser.add_argument("--cycles", type=int, default=2, help="profiler cycles of --active steps each")
    parser.add_argument("--active", type=int, default=4)
    parser.add_argument("--outbox", default="mlflow-neuron-outbox")
    parser.add_argument("--flush-timeout-s", type=float, default=10.0, help="close()'s budget to deliver what is left")
    parser.add_argument("--exit-rank", type=int, default=None)
    parser.add_argument("--exit-at", type=int, default=None, help="the step at which --exit-rank stops")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)  # ranks share the host's cores: keep each rank's step its own
    started = time.perf_counter()
    callback = MLflowProfilerCallback(tracking_uri=args.tracking_uri, experiment_id=args.experiment_id,
                                      run_name=args.run_name, outbox=args.outbox,
                                      flush_timeout_s=args.flush_timeout_s)  # fmt: skip
    constructor_s = time.perf_counter() - started

    x, w, grad = torch.randn(args.size, args.size), torch.randn(args.size, args.size), torch.zeros(1024)
    delay_s = args.delay_ms / 1000 + args.delay_frac * _compute_s(x, w)
    slow = rank == args.slow_rank
    stay = [r for r in range(dist.get_world_size()) if r != args.exit_rank]
    group = dist.new_group(stay) if args.exit_rank is not None else None  # every rank makes it, before the loop
    steps = args.cycles * (1 + 1 + args.active)  # each cycle: wait, warmup, then the active steps
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=callback,
                 schedule=schedule(wait=1, warmup=1, active=args.active, repeat=args.cycles)) as prof:  # fmt: skip
        for step in range(steps):
            if rank == args.exit_rank and step == args.exit_at:
                sys.stdout.flush()
                os._exit(0)  # no close(), no cleanup
            grad += (x @ w).sum()
            if args.device_ms:
                time.sleep(args.device_ms / 1000)
            if slow and delay_s:
                time.sleep(delay_s)
            if rank in stay:
                dist.all_reduce(grad, group=group)
            prof.step()
    closing = time.perf_counter()
    callback.close()
    close_s = time.perf_counter() - closing
    print(json.dumps({"rank": rank, "run_id": callback.run_id, "tracking_uri": callback.tracking_uri,
                      "constructor_s": round(constructor_s, 3), "close_s": round(close_s, 3),
                      "delay_s": round(delay_s, 4)}), flush=True)  # fmt: skip
    dist.destroy_process_group()


def _compute_s(x: torch.Tensor, w: torch.Tensor, repeats: int = 20) -> float:
    """The median time of one step's compute here, for `--delay-frac`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        (x @ w).sum()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    main()
