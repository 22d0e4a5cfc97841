"""How often the comparison's gate and verdicts are wrong, measured on real profiled runs.

    python benchmarks/calibration.py [--pairs 20] [--cpu-pairs 10] [--load-pairs 10] [--example-runs 3]

Every run is a real torch.profiler run through `MLflowProfilerCallback` into a sqlite store,
profiled with `schedule(wait=1, warmup=1, active=5, repeat=4)`: 20 per-step samples in 4 cycles.
Each pair is its own experiment, compared as a user would:
`mlflow-neuron compare --experiment E --baseline base --fail-if-slower 10` (tests/calibration_runs.py).

- A/A, fake device: both runs have the same kernel times; each kernel's duration is jittered by
  U(0.7, 1.3) and 2% of kernels stall for 10x (the fake PrivateUse1 profiler of tests/, seeded).
- A/B, fake device: the second run's kernels are 30% longer, same noise.
- A/A, CPU: naive RMSNorm twice, host time only, on one host thread as the example runs it.
- A/A, CPU under load: the same, with two CPU hogs running beside the candidate run only.
- The example (`examples/rmsnorm_variants.py --device cpu`) run `--example-runs` times while two
  CPU hogs run 3 s, pause 3 s, and so on: each run's `X vs naive: <verdict>,` lines, and whether
  a variant is `faster` in one run and `slower` in another.

Prints the rates; asserts nothing. tests/test_calibration.py asserts the fake device's rates (its
noise is seeded); the CPU rate follows the host's load and is only printed here.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import threading
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import calibration_runs  # noqa: E402

NAMES = {"aa": "A/A fake device, ±30% jitter, 2% stalls", "ab": "A/B fake device, kernels +30%, same noise",
         "cpu-aa": "A/A CPU, naive RMSNorm (host time)",
         "cpu-aa-load": "A/A CPU, two CPU hogs beside the candidate only"}  # fmt: skip
VERDICT_LINE = re.compile(r"^(\w+) vs naive: ([a-z ]+?)[,:]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--cpu-pairs", type=int, default=10)
    parser.add_argument("--load-pairs", type=int, default=10, help="CPU A/A pairs with hogs beside the candidate")
    parser.add_argument("--example-runs", type=int, default=3, help="runs of the example under a periodic load")
    parser.add_argument("--seed", type=int, default=2026, help="FAKE_NEURON_SEED for the fake device's noise")
    args = parser.parse_args()

    import calibration_runs

    work = pathlib.Path(tempfile.mkdtemp(prefix="mlflow-neuron-calibration-"))
    so = calibration_runs.fake_device_library("CPU pairs only")
    device_pairs = args.pairs if so else 0
    started = time.perf_counter()
    uri = calibration_runs.log_pairs(work, so, device_pairs, args.cpu_pairs, args.seed, args.load_pairs)
    runs = 2 * (args.cpu_pairs + args.load_pairs + 2 * device_pairs)
    print(f"logged {runs} runs in {time.perf_counter() - started:.0f} s ({uri})")
    print("\n| pairs | what | gate fired (exit 1) | total's verdicts |")
    print("|---|---|---|---|")
    kinds = (("aa", device_pairs), ("ab", device_pairs), ("cpu-aa", args.cpu_pairs), ("cpu-aa-load", args.load_pairs))
    for kind, pairs in kinds:
        if pairs:
            fired, verdicts = calibration_runs.gate_and_verdicts(uri, kind, pairs)
            counted = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts)))
            print(f"| {pairs} | {NAMES[kind]} | {fired}/{pairs} ({fired / pairs:.0%}) | {counted} |")
    if args.example_runs:
        example_under_periodic_load(work, args.example_runs)
    return 0


def example_under_periodic_load(work: pathlib.Path, runs: int, period_s: float = 3.0) -> None:
    """The example, `runs` times, while two CPU hogs run `period_s` seconds and pause as long."""
    uri = f"sqlite:///{work / 'example.db'}"
    seen: dict[str, set[str]] = {}
    print(f"\nthe example under a periodic load (2 CPU hogs, {period_s:g} s on, {period_s:g} s off):")
    with PeriodicHogs(2, period_s):
        for index in range(runs):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, str(ROOT / "examples" / "rmsnorm_variants.py"), "--device", "cpu",
                                   "--tracking-uri", uri], cwd=work, capture_output=True, text=True)  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if VERDICT_LINE.match(line)]
            print(f"run {index + 1} (exit {done.returncode}, {time.perf_counter() - started:.0f} s):")
            for line in lines:
                print(f"    {line}")
                variant, verdict = VERDICT_LINE.match(line).groups()
                seen.setdefault(variant, set()).add(verdict)
    flips = sorted(v for v, verdicts in seen.items() if {"faster", "slower"} <= verdicts)
    print(f"variants faster in one run and slower in another: {', '.join(flips) or 'none'}")


class PeriodicHogs:
    """`count` CPU hogs outside this process's tree (another user's work, not the job's), alternately
    running and stopped (SIGSTOP) every `period_s` seconds."""

    def __init__(self, count: int, period_s: float) -> None:
        self.count, self.period_s = count, period_s
        self.stop = threading.Event()

    def __enter__(self):
        self.hogs = [calibration_runs.unrelated_process(calibration_runs.SPIN) for _ in range(self.count)]
        self.thread = threading.Thread(target=self._toggle, daemon=True)
        self.thread.start()
        return self

    def _toggle(self) -> None:
        running = True
        while not self.stop.wait(self.period_s):
            running = not running
            for hog in self.hogs:
                hog.send_signal(signal.SIGCONT if running else signal.SIGSTOP)

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        self.thread.join()
        for hog in self.hogs:
            calibration_runs.end_unrelated(hog)


if __name__ == "__main__":
    sys.exit(main())
