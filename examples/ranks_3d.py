"""A 4-rank job with tensor-, data- and pipeline-parallel groups and one slow rank, profiled into one run.

    torchrun --nproc-per-node 4 examples/ranks_3d.py --slow-rank 0 --delay-ms 30
    mlflow-neuron ranks RUN_ID     # rank 0 (tp group 0,1) late by its own time; its tp peer waited ~30 ms

Layout (gloo, CPU): tensor-parallel groups {0,1} {2,3}, data-parallel groups {0,2} {1,3}; pipeline
stage 0 = ranks {0,1}, stage 1 = ranks {2,3}. Each step:
- stage 0: a matmul and `--device-ms` of sleep (standing for the accelerator's time: the host is
  free meanwhile), two TP all_reduces, then a send of its activation to stage 1 (0 -> 2, 1 -> 3);
- stage 1: the receive, the same compute, one TP all_reduce (it has fewer layers);
- every rank: one DP all_reduce.
`--slow-rank R` sleeps `--delay-ms` before its first TP all_reduce of each step. Stage 1 always
waits for stage 0 (the pipeline's bubble) and reaches its DP all_reduce last: that is the
schedule, not a straggler. Shapes are recorded (`record_shapes=True`): gloo names a send's and a
receive's peer only there. Every rank prints one JSON line (`"rank"`, `"run_id"`, `"constructor_s"`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from mlflow_neuron import MLflowProfilerCallback

TP, DP = ([0, 1], [2, 3]), ([0, 2], [1, 3])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=None, help="default: MLflow's (MLFLOW_TRACKING_URI or ./mlflow.db)")
    parser.add_argument("--experiment-id", default=None)
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank that sleeps before its TP all_reduce")
    parser.add_argument("--delay-ms", type=float, default=30.0, help="its sleep a step, in ms")
    parser.add_argument("--device-ms", type=float, default=40.0, help="every rank's stand-in for device time a step")
    parser.add_argument("--size", type=int, default=128, help="the matmul's side")
    parser.add_argument("--cycles", type=int, default=1, help="profiler cycles of --active steps each")
    parser.add_argument("--active", type=int, default=8)
    parser.add_argument("--outbox", default="mlflow-neuron-outbox")
    parser.add_argument("--flush-timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 4:
        raise SystemExit("examples/ranks_3d.py runs 4 ranks (torchrun --nproc-per-node 4)")
    torch.set_num_threads(1)
    started = time.perf_counter()
    callback = MLflowProfilerCallback(tracking_uri=args.tracking_uri, experiment_id=args.experiment_id,
                                      outbox=args.outbox, flush_timeout_s=args.flush_timeout_s)  # fmt: skip
    constructor_s = time.perf_counter() - started
    # every rank makes every group, in one order (new_group gives a non-member no group)
    tp = {tuple(g): dist.new_group(g, group_desc="tp") for g in TP}
    dp = {tuple(g): dist.new_group(g, group_desc="dp") for g in DP}
    my_tp = next(tp[k] for k in tp if rank in k)
    my_dp = next(dp[k] for k in dp if rank in k)
    stage = 0 if rank in (0, 1) else 1
    x, w = torch.randn(args.size, args.size), torch.randn(args.size, args.size)
    act = torch.zeros(4096)

    def compute() -> None:
        act.add_((x @ w).mean())
        time.sleep(args.device_ms / 1000)
        if rank == args.slow_rank:
            time.sleep(args.delay_ms / 1000)

    steps = args.cycles * (1 + 1 + args.active)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=callback, record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=args.active, repeat=args.cycles)) as prof:  # fmt: skip
        for _ in range(steps):
            if stage == 0:
                compute()
                dist.all_reduce(act, group=my_tp)
                dist.all_reduce(act, group=my_tp)
                dist.send(act, dst=rank + 2)
            else:
                dist.recv(act, src=rank - 2)
                compute()
                dist.all_reduce(act, group=my_tp)
            dist.all_reduce(act, group=my_dp)
            prof.step()
    callback.close()
    print(json.dumps({"rank": rank, "run_id": callback.run_id, "constructor_s": round(constructor_s, 3)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
