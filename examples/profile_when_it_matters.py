"""A long loop profiled on the callback's own schedule: a baseline, then a capture when the step time
changes, or when someone asks from MLflow (`mlflow-neuron capture RUN_ID`).

    python examples/profile_when_it_matters.py --steps 600 --slower-from 300 --delay-ms 15
    torchrun --nproc-per-node 2 examples/profile_when_it_matters.py --slow-rank 1 --slower-from 300 --delay-ms 20
    mlflow-neuron ranks RUN_ID      # the capture after step 300 names rank 1
    torchrun --nproc-per-node 2 examples/profile_when_it_matters.py --as-nodes ...   # each rank a node

Each step waits until its deadline (`--step-ms` after the last, as a rank waits on its accelerator),
then, from step `--slower-from`, the slow rank (every rank of a one-process job) waits
`--delay-ms` more; under torchrun, one `all_reduce` (gloo) a step, so every rank is as slow as the
slowest. Rank 0 decides when to capture and every rank captures the same steps. Every rank prints
one JSON line: its rank, the run id, and its captures (reason, first and last step).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mlflow_neuron import MLflowProfilerCallback


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=None, help="default: MLflow's (MLFLOW_TRACKING_URI or ./mlflow.db)")
    parser.add_argument("--experiment-id", default=None)
    parser.add_argument("--outbox", default="mlflow-neuron-outbox")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-ms", type=float, default=20.0, help="each step's time before the change")
    parser.add_argument("--slower-from", type=int, default=None, help="the step from which the slow rank is slower")
    parser.add_argument("--slow-rank", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=15.0, help="how much slower, a step")
    parser.add_argument("--as-nodes", action="store_true",
                        help="each rank as a node of its own (its own outbox and helper): rank 0's plans reach the "
                        "others through the run's tags, as across nodes")
    parser.add_argument("--until-captures", type=int, default=None,
                        help="also keep going (past --steps) until this many captures were made, for at most --steps more")
    args = parser.parse_args(argv)

    dist = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist else 0
    torch.set_num_threads(1)
    outbox = args.outbox
    if args.as_nodes:
        os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        outbox = os.path.join(args.outbox, f"node_{rank}")
    callback = MLflowProfilerCallback(tracking_uri=args.tracking_uri, experiment_id=args.experiment_id,
                                      outbox=outbox, flush_timeout_s=120)  # fmt: skip
    grad = torch.zeros(1024)
    schedule = callback.schedule()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule, on_trace_ready=callback) as prof:
        deadline = time.perf_counter()
        step = 0
        while step < args.steps or (args.until_captures and step < 2 * args.steps and (
                len(schedule.captures) < args.until_captures or step <= schedule.captures[-1].last_step + 1)):
            slower = args.slower_from is not None and step >= args.slower_from and rank == args.slow_rank
            deadline = max(deadline + (args.step_ms + (args.delay_ms if slower else 0)) / 1000, time.perf_counter())
            time.sleep(max(deadline - time.perf_counter(), 0))  # to a deadline: a late wake-up is taken back
            grad += 1
            if dist:
                dist.all_reduce(grad)
            prof.step()
            step += 1
    callback.close()
    print(json.dumps({"rank": rank, "run_id": callback.run_id,
                      "captures": [[c.reason, c.first_step, c.last_step] for c in schedule.captures]}), flush=True)
    if dist:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
