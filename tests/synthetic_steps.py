"""Synthetic per-step samples and the rates that calibrate the comparison (pure numpy).

Used by `tests/test_stats.py` and `benchmarks/stats_calibration.py`. A step's time is the sum of
`kernels` kernels; each kernel takes `kernel_us` × `scale` with uniform ±`jitter` noise (or
lognormal noise of that spread) and, with probability `stall_p`, stalls `stall_x` times longer.
Scaling every kernel scales the whole distribution, so the true run / baseline ratio is `scale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlflow_neuron._compare.stats import ratio_interval, without_outliers


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
