"""Small workloads profiled by the tests."""

import torch
from torch.profiler import ProfilerActivity, profile, schedule

EPS = 1e-6


def rms_norm_naive(x, weight):
    rms = torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
    return x * rms * weight


def inputs():
    torch.manual_seed(0)
    return torch.randn(4, 512, dtype=torch.bfloat16), torch.ones(512, dtype=torch.bfloat16)


def profile_rmsnorm(on_trace_ready, steps=4, wait=2, warmup=1, active=1, repeat=0, **profiler_kwargs):
    """The reference loop of FACTS.md §4 on CPU; returns the number of steps completed."""
    x, weight = inputs()
    profiler_kwargs.setdefault("activities", [ProfilerActivity.CPU])
    done = 0
    with profile(
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        on_trace_ready=on_trace_ready,
        **profiler_kwargs,
    ) as prof:
        for _ in range(steps):
            rms_norm_naive(x, weight)
            prof.step()
            done += 1
    return done
