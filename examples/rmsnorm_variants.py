"""RMSNorm three ways, profiled into MLflow: naive ATen ops, fused `torch.rms_norm`, `torch.compile`.

Each step is a small model step, linear -> RMSNorm -> linear, with the norm inside
`record_function("rmsnorm")`: the comparison is of that region (the norm with everything it runs,
not drowned by the linears), lists the ops inside it side by side, and shows each variant's
achieved memory bandwidth (shapes are recorded; the memory each step needed is logged too).

One parent run and one child run per variant (`naive`, `fused`, `compiled`) in experiment
`rmsnorm-variants`. The parent is named for the device and the time it started, such as
`rmsnorm-cpu-20250131-142501`, so that reruns are rows of their own in the MLflow UI. The variants
are profiled in rotation (`mlflow_neuron.interleaved`: naive, fused, compiled, naive, ...), four
cycles of 5 active steps each, so a change in the machine's load falls on all of them alike. Each
variant runs a few times before the first profiled window (torch.compile's compiles there), so
every window measures the step, not a compile. The comparison read back from MLflow has 20
samples in 4 cycles per variant: medians, 95% intervals (over cycles where the cycles differ),
outliers, the host's load while each ran (the job's own child processes, such as torch.compile's
workers, count as the job), and a verdict per variant, which also lands in the parent run's
description.

    python examples/rmsnorm_variants.py                       # Neuron, else CUDA, else CPU
    python examples/rmsnorm_variants.py --device cpu --shape 8,4096 --dtype float32
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from collections.abc import Callable

import mlflow
import pandas as pd
import psutil
import torch

from mlflow_neuron import (attach_comparison, compare_runs, compile_backend, interleaved, load_timelines, pick_device,
                           render, synchronize)

EXPERIMENT = "rmsnorm-variants"
REGION = "rmsnorm"
EPS = 1e-6
# Four cycles of 5 active steps per variant, in rotation: 20 samples in 4 cycles, enough for the
# comparison to check the cycles against each other. warmup=2 keeps the profiler's own start-up
# out of the samples.
WAIT, WARMUP, ACTIVE, CYCLES = 1, 2, 5, 4
STEPS = (WAIT + WARMUP + ACTIVE) * CYCLES
# Calls of each variant before the first profiled window: torch.compile compiles at the first
# (and its compile workers start), the caches fill at the next. A compile inside a window would
# be that window's host time, and its workers and compilers would run beside the windows after it.
WARM_UP_CALLS = 3
QUIET_CHILDREN_S = 30.0  # at most this long, after the warm-up, for the job's child processes to go idle


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


def model_step(norm: Callable, x: torch.Tensor, w_in: torch.Tensor, weight: torch.Tensor,
               w_out: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """linear -> the RMSNorm variant, as region `rmsnorm` -> linear."""
    hidden = torch.nn.functional.linear(x, w_in)
    with torch.profiler.record_function(REGION):
        hidden = norm(hidden, weight)
    return torch.nn.functional.linear(hidden, w_out)


def profile_variants(args: argparse.Namespace, device: str) -> dict[str, str]:
    """Profiles the variants in rotation into one child run each; returns {variant: run id}."""
    shape = tuple(int(n) for n in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype).to(device)
    weight = torch.ones(shape[-1], dtype=dtype).to(device)
    w_in, w_out = (torch.randn(shape[-1], shape[-1], dtype=dtype).div(shape[-1] ** 0.5).to(device) for _ in range(2))
    steps = {name: functools.partial(model_step, fn, x, w_in, weight, w_out) for name, fn in variants(device).items()}
    warm_up(steps, device)
    # background=False: each cycle goes to MLflow between the profiled windows, so none of this
    # script's own work runs while a step is recorded (its host time would carry it). A training
    # job keeps the default background sender: device time is not affected by it.
    with kineto_markers_dropped():
        runs = interleaved(steps, cycles=CYCLES, wait=WAIT, warmup=WARMUP, active=ACTIVE, device=device,
                           profile_dir=args.profile_dir, background=False,
                           profile_kwargs={"record_shapes": True, "profile_memory": True})  # fmt: skip
    client = mlflow.MlflowClient()
    for name, run_id in runs.run_ids.items():
        for key, value in {"variant": name, "shape": args.shape, "dtype": args.dtype}.items():
            client.log_param(run_id, key, value)
    for name, why in runs.failed.items():
        print(f"variant {name} failed and is left out: {why}")
    return {name: run_id for name, run_id in runs.run_ids.items() if name not in runs.failed}


def warm_up(steps: dict[str, Callable], device: str) -> None:
    """Runs each variant `WARM_UP_CALLS` times, then waits (up to `QUIET_CHILDREN_S`) until the
    child processes it started are idle: torch.compile's worker pool goes on starting (each worker
    imports torch) after its compile has returned. They are the job's own processes, and count as
    the job, not as the host's load, but they would still share the cores with the first windows."""
    for step in steps.values():
        for _ in range(WARM_UP_CALLS):
            step()
        synchronize(device)
    this = psutil.Process()
    deadline = time.monotonic() + QUIET_CHILDREN_S
    while time.monotonic() < deadline and children_cpu_s(this, 0.5) > 0.05:  # a tenth of a core
        pass


def children_cpu_s(this: "psutil.Process", over_s: float) -> float:
    """CPU seconds this process's child processes (and theirs) used over the next `over_s` seconds."""

    def used() -> float:
        total = 0.0
        for child in this.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                total += times.user + times.system
        return total

    before = used()
    time.sleep(over_s)
    return max(used() - before, 0.0)


# Kineto, the C++ library behind torch.profiler, writes "USDT:<time> <pid>:<tid>
# SyncActivityProfilerHandler.cpp:52] profiler_start" (and :59 profiler_stop) to file descriptor 2
# (std::cerr, so Python's sys.stderr cannot catch it) each time a cycle's recording starts and
# stops: 4 lines per variant here. They are markers for tracing tools, not messages for a person.
# No setting drops only them: KINETO_LOG_LEVEL is a threshold and USDT its highest level, so a
# level that drops them drops Kineto's warnings and errors too. And a schedule starts and stops the
# recording inside prof.step(), the same call that runs the callback (whose warnings the user must
# see), so fd 2 cannot be pointed away around the start and stop alone.
KINETO_MARKER = re.compile(rb"USDT:.*\] profiler_(start|stop)\r?\n?")


@contextlib.contextmanager
def kineto_markers_dropped():
    """Points fd 2 at a temporary file while a variant is profiled, then writes back to stderr every
    line but Kineto's start/stop markers: warnings and errors arrive when the variant ends, a few
    seconds late, and nothing is read or written inside a recorded step."""
    sys.stderr.flush()
    stderr_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(stderr_fd, 2)
            os.close(stderr_fd)
            captured.seek(0)
            for line in captured:
                if not KINETO_MARKER.fullmatch(line):
                    os.write(2, line)


@contextlib.contextmanager
def garbage_collector_paused():
    """Python's garbage collector runs wherever allocations cross its threshold; inside a recorded
    step it adds milliseconds of host time. Collect before, pause. (`interleaved` does this for
    each cycle; tests/calibration_runs.py uses it around its own profiles.)"""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def attach_comparison_to(parent_run_id: str, run_ids: dict[str, str]) -> pd.DataFrame:
    """Compares the variants' `rmsnorm` region against naive and attaches table, PNG and HTML to the parent run."""
    frame = compare_runs(list(run_ids.values()), baseline="naive", skip_steps=0, region=REGION)
    with tempfile.TemporaryDirectory() as tmp:
        chart = render.png(frame, Path(tmp, "comparison.png"))
        page = Path(tmp, "report.html")
        page.write_text(render.html_page(frame, chart, timelines=load_timelines(frame)), encoding="utf-8")
        attach_comparison(mlflow.get_tracking_uri(), parent_run_id, frame, [chart, page])
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="neuron, cuda or cpu (default: the first available)")
    parser.add_argument("--shape", default="4,512", help="input shape (default 4,512)")
    parser.add_argument("--dtype", default="bfloat16", help="torch dtype name (default bfloat16)")
    parser.add_argument("--threads", type=int, default=1,
                        help="host threads for torch on CPU (default 1: see the note it prints; 0 keeps torch's)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, sqlite:///mlflow.db)")
    parser.add_argument("--profile-dir", default="neuron_profile", help="Neuron profile output folder")
    parser.add_argument("-v", "--verbose", action="store_true", help="show MLflow's own INFO messages")
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error(f"--threads must be >= 0; got {args.threads}")
    try:
        shape = tuple(int(n) for n in args.shape.split(","))
    except ValueError:
        parser.error(f"--shape must be integers separated by commas, such as 4,512; got {args.shape!r}")
    if not shape or min(shape) < 1:
        parser.error(f"--shape must be positive sizes; got {args.shape!r}")
    if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        parser.error(f"--dtype must be a torch dtype name such as bfloat16 or float32; got {args.dtype!r}")
    try:
        device = pick_device(args.device)
    except ValueError as error:
        parser.error(str(error))

    if not args.verbose:
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")  # expected: one cycle at a time
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if args.tracking_uri:
        mlflow.set_tracking_uri(args.tracking_uri)
    if device == "cpu" and args.threads:
        # A 4x512 RMSNorm needs no thread pool; on a shared 2-core machine OpenMP workers that
        # wait for a core add stalls of 5-24 ms to single steps, noise that says nothing about
        # the kernels.
        torch.set_num_threads(args.threads)
        print(f"host noise: torch uses {args.threads} CPU thread(s) (--threads 0 keeps torch's default)")
    mlflow.set_experiment(EXPERIMENT)
    # One name per rerun: three runs of this script are three rows that tell apart in the UI. The
    # children keep the variant names, which the comparison labels its columns with.
    with mlflow.start_run(run_name=f"rmsnorm-{device}-{time.strftime('%Y%m%d-%H%M%S')}") as parent:
        mlflow.log_params({"device": device, "shape": args.shape, "dtype": args.dtype, "steps": STEPS,
                           "cycles": CYCLES, "threads": args.threads or torch.get_num_threads()})  # fmt: skip
        run_ids = profile_variants(args, device)

    frame = attach_comparison_to(parent.info.run_id, run_ids)
    print(f"\nRMSNorm variants on {device}, shape {args.shape} {args.dtype}: region '{REGION}' of a linear -> "
          f"RMSNorm -> linear step, {ACTIVE * CYCLES} profiled steps each in {CYCLES} interleaved cycles")
    print(render.text(frame, top=10))
    print(f"\nParent run {parent.info.run_name} ({parent.info.run_id}) in experiment '{EXPERIMENT}' holds the "
          "comparison (table, PNG, HTML).")
    print(f"Compare from the shell: mlflow-neuron compare --experiment {EXPERIMENT} --baseline naive --region {REGION}")
    print("                (without --region: the whole step, with a sentence per region)")
    print("Open the MLflow UI with:")
    print(f"    mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
