"""Calibration of compare's statistics on simulated per-step samples: what the README quotes.

    python benchmarks/stats_calibration.py [--pairs 1000] [--seed 0] [--matrix-pairs 200] [--only-matrix]
    python benchmarks/stats_calibration.py --outlier-bounds

A step's time is the sum of K kernels; each takes 100 us with uniform ±30% jitter and, with
probability 2%, stalls 10x longer (see `tests/synthetic_steps.py`). Runs have 10 steps each
unless stated. Printed per noise model:

- coverage: share of 95% intervals that contain the true ratio (about 95% expected);
- A/A false alarms: share of same-kernel pairs where `--fail-if-slower 10` would fire on that row;
- A/B detection: share of pairs with kernels 30% slower where it fires on that row.

Then the same through `compare()` and `regressions()` for runs whose steps run several ops, where
the gate fires when any op or the TOTAL is proven slower.

Last, runs of several cycles where each cycle carries a random shift of its own, U(1 − s, 1 + s)
with s = 0, 0.1, 0.3 (the host got busier or quieter between profiled windows), on top of the
same per-step noise: coverage of the step-level interval alone (as before cycles were checked)
beside the interval `compare()` now uses (steps, or cycles where they differ; `too few cycles`
below 3 per run), with the share of pairs judged on cycles and left `too few cycles`.

Last, the gate's matrix workload on the fake device (issue 36: naive RMSNorm, per step 3 kernels
of 100 us for aten::mul and one each of 40, 20 and 30 us, the same noise, 5 steps a cycle) through
`compare()` and `regressions()`, with 1 to 4 cycles a run: how often A/A fires and how often +30%
is found. Beside it, an oracle that no real comparison can be: it knows which kernels stalled and
the exact spread of the jitter, and weighs each op's log ratio by it (a z-test at 95%). Where the
oracle finds +30% in fewer than 95% of pairs, no valid 95% gate can.

`--outlier-bounds` prints instead the outlier rule's bound for few samples
(`_trace.step_summary._FEW_SAMPLE_SIGMAS`): for n = 4..25, the 99th percentile of
max|x − median| / (1.4826 · MAD) over 2,000,000 normal series of n samples (about a minute).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlflow_neuron._analysis.frame import compare  # noqa: E402
from mlflow_neuron._analysis.gate import regressions  # noqa: E402
from mlflow_neuron._analysis.model import RunProfile  # noqa: E402
from synthetic_steps import Noise, cycle_rates, cycle_steps, rates  # noqa: E402


def row_rates(pairs: int, seed: int) -> None:
    models = [
        ("K=1, uniform ±30%, 2% stalls", Noise(), 10, 10),
        ("K=1, uniform ±30%, no stalls", Noise(stall_p=0.0), 10, 10),
        ("K=1, lognormal sigma 0.3, 2% stalls", Noise(lognormal=True), 10, 10),
        ("K=4, uniform ±30%, 2% stalls", Noise(kernels=4), 10, 10),
        ("K=8, uniform ±30%, 2% stalls", Noise(kernels=8), 10, 10),
        ("K=8, uniform ±30%, no stalls", Noise(kernels=8, stall_p=0.0), 10, 10),
        ("K=1, uniform ±30%, 2% stalls, 5 vs 12 steps", Noise(), 5, 12),
        ("K=1, uniform ±30%, 2% stalls, 20 vs 20 steps", Noise(), 20, 20),
    ]
    print(f"one row (an op, or the TOTAL), {pairs} pairs each, gate at +10%")
    print(f"{'noise model':<46}{'coverage':>9}{'A/A alarms':>12}{'A/B detected':>14}")
    for name, noise, n, m in models:
        same = rates(seed, pairs, noise, 1.0, n, m)
        slower = rates(seed + 1, pairs, noise, 1.3, n, m)
        coverage = (same.coverage + slower.coverage) / 2
        print(f"{name:<46}{coverage:>9.1%}{same.gate:>12.1%}{slower.gate:>14.1%}")


def profile(label: str, rng: np.random.Generator, ops: int, scale: float) -> RunProfile:
    from synthetic_steps import steps

    return device_profile(label, {f"aten::op{i}": (1, steps(rng, 10, Noise(), scale)) for i in range(ops)})


def device_profile(label: str, ops: dict[str, tuple[int, np.ndarray]]) -> RunProfile:
    """A run of per-step device times, 5 steps a cycle: {op: (calls a step, its time each step)}."""
    import pandas as pd

    rows = [{"cycle": 1 + step // 5, "step": step, "name": name, "calls": calls, "self_device_time_us": value,
             "self_cpu_time_us": 1.0} for name, (calls, per_step) in ops.items() for step, value in enumerate(per_step)]  # fmt: skip
    samples = pd.DataFrame(rows)
    table = samples.groupby("name", as_index=False)[["self_device_time_us", "self_cpu_time_us", "calls"]].sum()
    return RunProfile(label, label, 1, table.assign(kind="op"), {}, "neuron", "present", samples=samples, source="steps")


def gate_rates(pairs: int, seed: int) -> None:
    print(f"\nthe whole gate (any op or the TOTAL), 10 vs 10 steps, ops of one kernel each, {pairs} pairs")
    print(f"{'ops per step':<46}{'A/A alarms':>12}{'A/B detected':>14}")
    for ops in (1, 4, 6, 8):
        rng = np.random.default_rng(seed + ops)
        fired = {1.0: 0, 1.3: 0}
        for _ in range(pairs):
            for scale in fired:
                frame = compare([profile("base", rng, ops, 1.0), profile("new", rng, ops, scale)])
                fired[scale] += bool(regressions(frame, 10))
        print(f"{ops:<46}{fired[1.0] / pairs:>12.1%}{fired[1.3] / pairs:>14.1%}")


def step_level_coverage(seed: int, pairs: int, n_cycles: int, steps: int, shift: float, scale: float) -> float:
    """Coverage of the step-level interval alone on runs whose cycles carry shifts."""
    from mlflow_neuron._analysis.stats import without_outliers, ratio_interval

    rng = np.random.default_rng(seed)
    covered = given = 0
    for _ in range(pairs):
        x, _ = cycle_steps(rng, n_cycles, steps, Noise(), 1.0, shift)
        y, _ = cycle_steps(rng, n_cycles, steps, Noise(), scale, shift)
        estimate = ratio_interval(without_outliers(x), without_outliers(y))
        if estimate.has_interval:
            given += 1
            covered += estimate.low <= scale <= estimate.high
    return covered / given if given else float("nan")


def cycle_table(pairs: int, seed: int) -> None:
    print(f"\ncycles that shift: K=1, uniform ±30%, 2% stalls, 5 steps a cycle, {pairs} pairs each, gate at +10%")
    print(f"{'cycles per run, shift per cycle':<34}{'steps only':>11}{'coverage':>10}{'on cycles':>11}"
          f"{'too few':>9}{'A/A alarms':>12}{'A/B detected':>14}")  # fmt: skip
    for n_cycles in (2, 3, 4, 6):
        for shift in (0.0, 0.1, 0.3):
            old = (step_level_coverage(seed, pairs, n_cycles, 5, shift, 1.0)
                   + step_level_coverage(seed + 1, pairs, n_cycles, 5, shift, 1.3)) / 2  # fmt: skip
            same = cycle_rates(seed, pairs, Noise(), n_cycles, 5, shift)
            slower = cycle_rates(seed + 1, pairs, Noise(), n_cycles, 5, shift, scale=1.3)
            coverage = (same.coverage + slower.coverage) / 2
            name = f"{n_cycles} cycles, ±{shift:.0%}"
            print(f"{name:<34}{old:>11.1%}{coverage:>10.1%}{(same.cycles + slower.cycles) / 2:>11.1%}"
                  f"{(same.too_few + slower.too_few) / 2:>9.1%}{same.gate:>12.1%}{slower.gate:>14.1%}")  # fmt: skip


RMSNORM_CALLS = {"aten::mul": 3}  # a step of the naive RMSNorm: 3 muls, one of each other op


def rmsnorm_run(label: str, rng: np.random.Generator, steps: int, scale: float) -> tuple[RunProfile, dict]:
    """A fake-device run of the matrix's workload (`calibration_runs.KERNELS`, the noise of
    `synthetic_steps.Noise`), and what the oracle knows of it: per op, the log of its mean
    stall-free time a step and that log's variance, to first order."""
    from calibration_runs import KERNELS

    noise, ops, oracle = Noise(), {}, {}
    for name, us in KERNELS.items():
        calls = RMSNORM_CALLS.get(name, 1)
        jitter = rng.uniform(1 - noise.jitter, 1 + noise.jitter, (steps, calls))
        stalls = np.where(rng.random((steps, calls)) < noise.stall_p, noise.stall_x, 1.0)
        ops[name] = (calls, (us * scale * jitter * stalls).sum(axis=1))
        variance = noise.jitter**2 / 3 / calls / steps  # uniform jitter: variance a²/3 per kernel
        oracle[name] = (math.log((us * scale * jitter).sum(axis=1).mean()), variance)
    return device_profile(label, ops), oracle


def matrix_workload(pairs: int, seed: int) -> None:
    print(f"\nthe matrix's fake-device workload (naive RMSNorm, 5 steps a cycle), {pairs} pairs each, gate at +10%")
    print(f"{'cycles per run':<16}{'A/A alarms':>12}{'A/B detected':>14}{'oracle A/B':>12}")
    rng = np.random.default_rng(seed)
    for cycles in (1, 2, 3, 4):
        fired, oracle = {1.0: 0, 1.3: 0}, 0
        for _ in range(pairs):
            base, base_logs = rmsnorm_run("base", rng, 5 * cycles, 1.0)
            for scale in fired:
                run, logs = rmsnorm_run("new", rng, 5 * cycles, scale)
                fired[scale] += bool(regressions(compare([base, run]), 10))
                if scale != 1.0:
                    weights = {name: 1 / (2 * logs[name][1]) for name in logs}
                    shift = sum(w * (logs[n][0] - base_logs[n][0]) for n, w in weights.items()) / sum(weights.values())
                    oracle += shift - 1.96 / math.sqrt(sum(weights.values())) > math.log(1.1)
        print(f"{cycles:<16}{fired[1.0] / pairs:>12.1%}{fired[1.3] / pairs:>14.1%}{oracle / pairs:>12.1%}")


def outlier_bounds(seed: int) -> None:
    from mlflow_neuron._trace.step_summary import _MAD_TO_SIGMA, OUTLIER_SIGMAS

    rng = np.random.default_rng(seed)
    print("n: the 99th percentile of max|x - median| / (1.4826 MAD) over 2,000,000 normal series of n,"
          " and the share of them in which 5 such sigmas flag a sample")  # fmt: skip
    for n in range(4, 26):
        quantiles, flagged = [], []
        for _ in range(5):  # 5 x 400,000 series: memory stays small
            values = rng.standard_normal((400_000, n))
            median = np.median(values, axis=1, keepdims=True)
            spread = _MAD_TO_SIGMA * np.median(np.abs(values - median), axis=1)
            largest = np.max(np.abs(values - median), axis=1) / spread
            quantiles.append(np.quantile(largest, 0.99))
            flagged.append(np.mean(largest > OUTLIER_SIGMAS))
        print(f"{n}: {np.mean(quantiles):.2f} (spread of the 5 estimates {np.std(quantiles):.2f}); "
              f"5 sigmas flag {np.mean(flagged):.1%}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1000, help="simulated pairs per noise model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--matrix-pairs", type=int, default=200, help="pairs per row of the matrix workload's table")
    parser.add_argument("--only-matrix", action="store_true", help="print only the matrix workload's table")
    parser.add_argument("--outlier-bounds", action="store_true", help="print only the outlier rule's bound for few samples")
    args = parser.parse_args()
    if args.pairs < 1 or args.matrix_pairs < 1:
        parser.error("--pairs and --matrix-pairs must be at least 1")
    start = time.perf_counter()
    if args.outlier_bounds:
        outlier_bounds(args.seed)
        return
    if not args.only_matrix:
        row_rates(args.pairs, args.seed)
        gate_rates(max(args.pairs // 5, 20), args.seed)
        cycle_table(args.pairs, args.seed)
    matrix_workload(args.matrix_pairs, args.seed)
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
