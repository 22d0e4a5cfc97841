"""What `callback.schedule()` costs the training loop between captures.

    python benchmarks/schedule_cost.py [--rotations 20] [--hogs 0] [--step-ms 20] [--empty-steps 2000] [--busy-steps 10]

Three loops side by side, in one process, in rotation (a block of each, again and again, so that
the machine's changes fall on all three alike):

- `none`: the step alone, no profiler;
- `plain`: the step and `prof.step()` of a `torch.profiler.profile` on torch's own schedule, in its
  wait phase (`schedule(wait=10**9, warmup=1, active=1)`): what any schedule costs;
- `callback`: the step and `prof.step()` of a profile on `MLflowProfilerCallback().schedule()`
  (the helper process, a run on a sqlite store in a temporary folder), after its baseline capture
  and once its reference is measured: it times every step, keeps the rule's windows and sends
  `profiler/step_time_ms` through the outbox every 60 s. It runs with `min_change=100`: the same
  work every step as the defaults between captures, and no capture inside the measured blocks.
  Between two of its blocks the others run: the schedule sees one long step there (a spike).

Two steps: an empty one (nothing but the loop; `--rotations` blocks of `--empty-steps`), and a
busy one that spins `--step-ms` on the clock as compute does (5 x `--rotations` blocks of
`--busy-steps`; a sleep's wake-up varies by more than what is measured). Each step is timed; a
loop's figure is its median step (a step the machine took the CPU from is an outlier, and so is
the callback's first step of each block, which holds the other two blocks). Each line prints the cost a step against `none` and
against `plain`, and the ratios. The helper process is alive through all three (its idle look at
the outbox every 50 ms falls on all alike). With `--hogs 2`, two busy Python processes run beside it
all. A capture during the measured blocks would spoil them: the script says so.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import mlflow  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from mlflow_neuron import MLflowProfilerCallback  # noqa: E402

# The rule runs every step as it does by default, but never fires: an empty loop's step time does
# change on a shared machine (11 -> 15 us for a fifth of a second and more), and a capture inside
# the measured blocks would measure the capture.
MIN_CHANGE = 100.0


def block(steps: int, step, prof=None) -> list[float]:
    """Each step's seconds, `prof.step()` in it when profiled."""
    clock = time.perf_counter
    times = []
    last = clock()
    for _ in range(steps):
        step()
        if prof is not None:
            prof.step()
        now = clock()
        times.append(now - last)
        last = now
    return times


def busy(seconds: float):
    def step() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return step


def measure(name: str, step, steps: int, rotations: int, folder: Path) -> None:
    mlflow.set_tracking_uri(f"sqlite:///{folder / f'{name}.db'}")
    spent: dict[str, list[float]] = {"none": [], "plain": [], "callback": []}  # each step's seconds
    with mlflow.start_run(), MLflowProfilerCallback(outbox=folder / f"outbox-{name}") as callback:
        callback.start_helper()
        adaptive = callback.schedule(min_change=MIN_CHANGE)
        plain_schedule = schedule(wait=10**9, warmup=1, active=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=adaptive, on_trace_ready=callback) as ours, \
             profile(activities=[ProfilerActivity.CPU], schedule=plain_schedule) as plain:  # fmt: skip
            while adaptive.rule.level is None:  # the baseline, then the reference's steps
                block(1, step, ours)
            captures = len(adaptive.captures)
            for _ in range(rotations):
                spent["none"] += block(steps, step)
                spent["plain"] += block(steps, step, plain)
                spent["callback"] += block(steps, step, ours)[1:]  # its first step holds the other two blocks
        spoiled = adaptive.captures[captures:]
    per_step = {k: statistics.median(v) for k, v in spent.items()}  # a step the machine took the CPU from is an outlier
    none, plain_s, ours_s = per_step["none"], per_step["plain"], per_step["callback"]
    print(f"{name}: a step {none * 1e6:,.2f} us alone, {plain_s * 1e6:,.2f} us with torch's schedule, "
          f"{ours_s * 1e6:,.2f} us with callback.schedule() (median steps; {rotations} blocks of {steps} steps each)")
    for label, a, b in (("callback.schedule() vs no profiler", ours_s, none),
                        ("callback.schedule() vs torch's schedule", ours_s, plain_s),
                        ("torch's schedule vs no profiler", plain_s, none)):  # fmt: skip
        print(f"  {label}: {(a - b) * 1e6:+,.2f} us a step, ratio {a / b:.4f}")
    if spoiled:
        print(f"  SPOILED: {len(spoiled)} capture(s) during the measured blocks: {spoiled}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rotations", type=int, default=20, help="of the empty step (the busy one: 5x as many)")
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--empty-steps", type=int, default=2000, help="a block of the empty step")
    parser.add_argument("--busy-steps", type=int, default=10, help="a block of the busy step")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hogs)]
    try:
        with tempfile.TemporaryDirectory(prefix="schedule-cost-") as tmp:
            with contextlib.chdir(tmp):  # MLflow's default artifact root, ./mlruns, lands there
                measure("empty step", lambda: None, args.empty_steps, args.rotations, Path(tmp))
                measure(f"{args.step_ms:g} ms busy step", busy(args.step_ms / 1000), args.busy_steps,
                        5 * args.rotations, Path(tmp))  # fmt: skip
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
