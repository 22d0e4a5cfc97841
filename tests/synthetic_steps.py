"""Synthetic per-step samples and the rates that calibrate the comparison (pure numpy).

Used by `tests/test_stats.py` and `benchmarks/stats_calibration.py`. A step's time is the sum of
`kernels` kernels; each kernel takes `kernel_us` × `scale` with uniform ±`jitter` noise (or
lognormal noise of that spread) and, with probability `stall_p`, stalls `stall_x` times longer.
Scaling every kernel scales the whole distribution, so the true run / baseline ratio is `scale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlflow_neuron._analysis.stats import ratio_interval, without_outliers


@dataclass(frozen=True)
class Noise:
    kernels: int = 1
    kernel_us: float = 100.0
    jitter: float = 0.30
    stall_p: float = 0.02
    stall_x: float = 10.0
    lognormal: bool = False


def steps(rng: np.random.Generator, n: int, noise: Noise, scale: float = 1.0) -> np.ndarray:
    shape = (n, noise.kernels)
    if noise.lognormal:
        factor = rng.lognormal(0.0, noise.jitter, shape)
    else:
        factor = rng.uniform(1 - noise.jitter, 1 + noise.jitter, shape)
    stalls = np.where(rng.random(shape) < noise.stall_p, noise.stall_x, 1.0)
    return (noise.kernel_us * scale * factor * stalls).sum(axis=1)


@dataclass(frozen=True)
class Rates:
    pairs: int
    coverage: float  # share of intervals that contain the true ratio
    gate: float  # share of pairs whose whole interval lies above +gate_pct
    no_interval: float  # share of pairs with too few samples for an interval


def rates(seed: int, pairs: int, noise: Noise, scale: float = 1.0, n: int = 10, m: int = 10,
          gate_pct: float = 10.0) -> Rates:  # fmt: skip
    rng = np.random.default_rng(seed)
    covered = fired = missing = 0
    for _ in range(pairs):
        # as compare() estimates: without the named outliers
        estimate = ratio_interval(without_outliers(steps(rng, n, noise)), without_outliers(steps(rng, m, noise, scale)))
        if not estimate.has_interval:
            missing += 1
            continue
        covered += estimate.low <= scale <= estimate.high
        fired += estimate.low > 1 + gate_pct / 100
    return Rates(pairs, covered / pairs, fired / pairs, missing / pairs)


def cycle_steps(rng: np.random.Generator, n_cycles: int, steps_per_cycle: int, noise: Noise, scale: float = 1.0,
                shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """A run of `n_cycles` cycles: each cycle's steps are scaled by its own U(1 − shift, 1 + shift)
    (the host got busier or quieter between windows) on top of the per-step noise. Returns the
    samples and their cycle numbers."""
    factors = rng.uniform(1 - shift, 1 + shift, n_cycles) if shift else np.ones(n_cycles)
    values = np.concatenate([steps(rng, steps_per_cycle, noise, scale * f) for f in factors])
    return values, np.repeat(np.arange(n_cycles), steps_per_cycle)


@dataclass(frozen=True)
class CycleRates:
    pairs: int
    coverage: float  # share of the intervals given that contain the true ratio
    gate: float  # share of pairs whose whole interval lies above +gate_pct
    too_few: float  # share of pairs judged `too few cycles` (or with no interval at all)
    cycles: float  # share of pairs judged on their cycles


def cycle_rates(seed: int, pairs: int, noise: Noise, n_cycles: int, steps: int, shift: float, scale: float = 1.0,
                gate_pct: float = 10.0) -> CycleRates:  # fmt: skip
    """`rates` for runs whose cycles carry shifts, judged as compare() judges them (`cycles.judge`)."""
    from mlflow_neuron._analysis.cycles import CYCLES, judge

    rng = np.random.default_rng(seed)
    covered = given = fired = few = on_cycles = 0
    for _ in range(pairs):
        judged = judge(*cycle_steps(rng, n_cycles, steps, noise, 1.0, shift),
                       *cycle_steps(rng, n_cycles, steps, noise, scale, shift))  # fmt: skip
        on_cycles += judged.unit == CYCLES
        estimate = judged.estimate
        if not estimate.has_interval:
            few += 1
            continue
        given += 1
        covered += estimate.low <= scale <= estimate.high
        fired += estimate.low > 1 + gate_pct / 100
    return CycleRates(pairs, covered / given if given else float("nan"), fired / pairs, few / pairs, on_cycles / pairs)
