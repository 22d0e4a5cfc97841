"""How often the comparison's gate and verdicts are wrong, measured on real profiled runs.

    python benchmarks/calibration.py [--pairs 20] [--cpu-pairs 10]      # ~2 min on 2 cores

Every run is a real torch.profiler run through `MLflowProfilerCallback` into a sqlite store,
profiled with `schedule(wait=1, warmup=1, active=5, repeat=2)`: 10 per-step samples per run.
Each pair is its own experiment, compared as a user would:
`mlflow-neuron compare --experiment E --baseline base --fail-if-slower 10` (tests/calibration_runs.py).

- A/A, fake device: both runs have the same kernel times; each kernel's duration is jittered by
  U(0.7, 1.3) and 2% of kernels stall for 10x (the fake PrivateUse1 profiler of tests/, seeded).
- A/B, fake device: the second run's kernels are 30% longer, same noise.
- A/A, CPU: naive RMSNorm twice, host time only, on one host thread as the example runs it.

Prints the rates; asserts nothing. tests/test_calibration.py asserts the fake device's rates (its
noise is seeded); the CPU rate follows the host's load and is only printed here.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

NAMES = {"aa": "A/A fake device, ±30% jitter, 2% stalls", "ab": "A/B fake device, kernels +30%, same noise",
         "cpu-aa": "A/A CPU, naive RMSNorm (host time)"}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--cpu-pairs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2026, help="FAKE_NEURON_SEED for the fake device's noise")
    args = parser.parse_args()

    import calibration_runs
    import fake_device

    work = pathlib.Path(tempfile.mkdtemp(prefix="mlflow-neuron-calibration-"))
    try:
        so = str(fake_device.build(pathlib.Path(tempfile.gettempdir()) / f"fake_neuron_build_{os.getuid()}"))
    except fake_device.FakeDeviceUnavailable as reason:
        print(f"fake device unavailable ({reason}); CPU pairs only")
        so = None
    device_pairs = args.pairs if so else 0
    started = time.perf_counter()
    uri = calibration_runs.log_pairs(work, so, device_pairs, args.cpu_pairs, args.seed)
    print(f"logged {2 * (args.cpu_pairs + 2 * device_pairs)} runs in {time.perf_counter() - started:.0f} s ({uri})")
    print("\n| pairs | what | gate fired (exit 1) | total verdict `no change` |")
    print("|---|---|---|---|")
    for kind, pairs in (("aa", device_pairs), ("ab", device_pairs), ("cpu-aa", args.cpu_pairs)):
        if pairs:
            fired, no_change = calibration_runs.rates(uri, kind, pairs)
            print(f"| {pairs} | {NAMES[kind]} | {fired}/{pairs} ({fired / pairs:.0%}) | {no_change}/{pairs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
