"""A 4-rank gloo job with tensor-, data- and pipeline-parallel groups, profiled one chrome trace per rank.

    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        tests/rank3d_worker.py --out DIR [--steps 6] [--device-ms 20] [--slow-rank R --slow-ms 30]

Layout (torch 2.13, CPU): tensor-parallel groups {0,1} {2,3} (`group_desc="tp"`), then data-parallel
groups {0,2} {1,3} (`group_desc="dp"`), created in that order by every rank (`new_group` gives a
non-member no group object). Pipeline stage 0 = ranks {0,1}, stage 1 = ranks {2,3}. Each step:

- stage 0: a matmul plus `--device-ms` of sleep (standing for device time), TP all_reduce, a second
  TP all_reduce (stage 0 issues one more than stage 1, as when layers differ), then `dist.send` of its
  activation to the same TP index on stage 1 (0 -> 2, 1 -> 3, world group);
- stage 1: `dist.recv` from stage 0, the same compute, one TP all_reduce;
- every rank: one DP all_reduce on its dp group.

`--world-every N` adds an all_reduce on the default group every N steps (off by default: then the
default group runs nothing in the profiled window; send/recv name the default group but run on the
calling thread). `--slow-rank R` sleeps `--slow-ms` before its first TP all_reduce of each step.
Every all_reduce has the same shape (`--numel` floats), so a span's shape says nothing of its group.

The profiler schedule is wait=1, warmup=1, active=`--steps`; each rank writes `rank<r>.json.gz`
(`export_chrome_trace`, record_shapes=True) and `truth_rank<r>.json`: the collectives it issued in
the profiled steps, in order, each with its group's description and ranks (the truth that
`tests/gloo_lanes.py` is checked against), its groups' names as `new_group` returned them, and the
thread ids that each group's creation started (read from /proc/self/task before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

TP = ([0, 1], [2, 3])
DP = ([0, 2], [1, 3])


def _tasks() -> set[int]:
    """This process's thread ids (Linux)."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6, help="profiled steps (after 1 wait and 1 warm-up step)")
    parser.add_argument("--device-ms", type=float, default=20.0)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-ms", type=float, default=30.0)
    parser.add_argument("--size", type=int, default=128, help="the matmul's side")
    parser.add_argument("--world-every", type=int, default=0,
                        help="also an all_reduce on the default group every N steps (default: never)")
    parser.add_argument("--numel", type=int, default=4096, help="floats in every all_reduce")
    args = parser.parse_args()

    torch.set_num_threads(1)
    tasks = _tasks()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "the layout is for 4 ranks"
    born = {"default_pg": sorted(_tasks() - tasks)}  # the threads each group's creation started
    groups = {}
    for desc, layout in (("tp", TP), ("dp", DP)):
        for ranks in layout:
            tasks = _tasks()
            group = dist.new_group(ranks, group_desc=desc)  # every rank, in the same order
            if rank in ranks:
                groups[desc] = (group, ranks)
                born[desc] = sorted(_tasks() - tasks)
            else:
                assert _tasks() == tasks, "a group this rank is not in started threads"
    stage = 0 if rank in (0, 1) else 1
    peer = rank + 2 if stage == 0 else rank - 2
    os.makedirs(args.out, exist_ok=True)

    weights = torch.randn(args.size, args.size)
    act = torch.randn(args.numel)
    truth: list[dict] = []
    profiled = range(2, 2 + args.steps)  # wait=1, warmup=1

    def issue(step: int, op: str, desc: str, ranks: list[int], peer_rank: int | None = None) -> None:
        if step in profiled:
            truth.append({"step": step, "op": op, "desc": desc, "ranks": ranks, "peer": peer_rank})

    def all_reduce(step: int, desc: str) -> None:
        group, ranks = groups[desc]
        issue(step, "all_reduce", desc, ranks)
        dist.all_reduce(act, group=group)
        act.div_(len(ranks))

    def compute() -> None:
        x = torch.randn(args.size, args.size)
        for _ in range(4):
            x = torch.tanh(x @ weights)
        act.add_(x.flatten()[: args.numel].mean())
        if args.device_ms:
            time.sleep(args.device_ms / 1000)

    def slow() -> None:
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000)

    def ready(prof) -> None:
        prof.export_chrome_trace(os.path.join(args.out, f"rank{rank}.json.gz"))

    plan = schedule(wait=1, warmup=1, active=args.steps)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=ready, record_shapes=True) as prof:
        for step in range(2 + args.steps):
            if stage == 0:
                compute()
                slow()
                all_reduce(step, "tp")
                all_reduce(step, "tp")
                issue(step, "send", "world", list(range(world)), peer)
                dist.send(act, dst=peer)
            else:
                issue(step, "recv", "world", list(range(world)), peer)
                dist.recv(act, src=peer)
                compute()
                slow()
                all_reduce(step, "tp")
            all_reduce(step, "dp")
            if args.world_every and step % args.world_every == 0:
                issue(step, "all_reduce", "default_pg", list(range(world)))
                dist.all_reduce(act)
            prof.step()
    with open(os.path.join(args.out, f"truth_rank{rank}.json"), "w") as f:
        json.dump({
            "rank": rank, "caller_native_tid": threading.get_native_id(), "pid": os.getpid(), "threads_born": born,
            "group_names": {desc: dist.distributed_c10d._get_process_group_name(g) for desc, (g, _) in groups.items()},
            "issued": truth,
        }, f, indent=1)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
