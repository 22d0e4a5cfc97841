"""Statistics for comparing per-step samples (pure: numpy arrays in, numbers out).

**The ratio and its interval.** For a baseline with samples x (n of them) and a run with samples
y (m), the estimate is the Hodges–Lehmann shift on log times, reported as a ratio: the median of
the n·m pairwise ratios y_j / x_i. Its 95% interval is Moses' distribution-free interval: the
pairwise ratios at ranks k and n·m + 1 − k, where k comes from the exact Mann–Whitney U
distribution (largest k with P(U <= k − 1) <= 2.5%), or from its normal approximation when n·m is
large. Why this method:

- deterministic: the same samples always give the same answer (a bootstrap would not);
- robust: one stalled step moves a pairwise median by one rank, not by its size;
- multiplicative: kernels jitter by a percentage, so a ratio is the natural effect size;
- honest about size: when no 95% interval exists (3 vs 3 samples, or single samples), it says
  so instead of guessing.

Log differences and pairwise ratios have the same order, so the ratios are ranked directly; that
keeps zeros (an op absent in a step) usable: x = 0 ranks as +inf, 0 / 0 as 1. Samples with no
spread on both sides (n, m >= 2; common for device time) compare exactly: the interval is the
point. The interval assumes the runs differ by a scale factor; `tests/test_stats.py` and
`benchmarks/stats_calibration.py` check its coverage by simulation.

**Outliers.** A sample is an outlier when it lies more than 5 robust standard deviations from
its own run's median: |x − median| > 5 · 1.4826 · MAD (n >= 4; more sigmas below 24 samples, see
`_trace.step_summary`), with the MAD floored at 1% of the median (and at 1 ns), so samples that
are all equal do not flag the nanosecond of jitter that a timer adds. The median and the MAD
ignore up to half the samples, so three stalls in ten steps are still found (quartiles would
take them in). Outliers are named wherever a comparison is shown, and the ratio and its
interval are estimated without them (`without_outliers`): a stalled step is a separate event,
not a sample of how long the op takes. Left in, two stalls in ten steps stretch the interval over
most of its range; taken out by this rule, the simulated coverage stays at about 95%
(`benchmarks/stats_calibration.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import ndtri

# the outlier rule lives with the run-level summary, which the delivery side computes too
from .._trace.step_summary import MIN_OUTLIER_SAMPLES, OUTLIER_SIGMAS, outlier_mask, without_outliers  # noqa: F401

CONFIDENCE = 0.95
_EXACT_MAX_COMBINATIONS = 2**61  # int64 q-binomial coefficients (and twice them) stay exact


@dataclass(frozen=True)
class RatioEstimate:
    """run / baseline: the point estimate and its interval (None where no interval exists)."""

    ratio: float
    low: float | None
    high: float | None
    exact: bool = False  # both runs had zero spread: the interval is the point

    @property
    def has_interval(self) -> bool:
        return self.low is not None


def ratio_interval(baseline: np.ndarray, run: np.ndarray, confidence: float = CONFIDENCE) -> RatioEstimate:
    """Hodges–Lehmann ratio run / baseline with Moses' distribution-free interval.

    Example::

        ratio_interval(np.array([10.0, 11, 10.5, 9.8]), np.array([13.0, 12.9, 13.4, 13.1]))
        # RatioEstimate(ratio=1.25..., low=1.17..., high=1.36...)
    """
    x, y = np.asarray(baseline, float), np.asarray(run, float)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("ratio_interval needs at least one sample on each side")
    if len(x) >= 2 and len(y) >= 2 and np.ptp(x) == 0 and np.ptp(y) == 0:
        point = float(_ratio(x[:1], y[:1])[0, 0])
        return RatioEstimate(point, point, point, exact=True)
    ratios = np.sort(_ratio(x, y).ravel())
    point = _middle(ratios)
    k = moses_rank(len(x), len(y), confidence)
    if k < 1:
        return RatioEstimate(point, None, None)
    return RatioEstimate(point, float(ratios[k - 1]), float(ratios[len(ratios) - k]))


def moses_rank(n: int, m: int, confidence: float = CONFIDENCE) -> int:
    """The 1-based rank k of the lower bound among n·m ordered pairwise differences; 0 when no
    interval at this confidence exists for so few samples."""
    alpha_half = (1 - confidence) / 2
    if math.comb(n + m, n) <= _EXACT_MAX_COMBINATIONS:
        cumulative = np.cumsum(_u_counts(n, m)) / math.comb(n + m, n)
        return int(np.searchsorted(cumulative, alpha_half, side="right"))  # count of P(U <= u) <= alpha/2
    z = float(ndtri(0.5 + confidence / 2))  # the normal approximation, for samples too large to count exactly
    return max(0, math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12)))


def _ratio(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Every y_j / x_i, with 0/0 = 1 (both absent: no change) and y/0 = +inf."""
    xs, ys = x[:, None], y[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ys / xs
    return np.where((xs == 0) & (ys == 0), 1.0, out)


def _middle(ordered: np.ndarray) -> float:
    """The median on the log scale: the geometric mean of the two middle values when even."""
    half = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[half])
    a, b = float(ordered[half - 1]), float(ordered[half])
    if a == b:
        return a
    if a == 0:
        return 1.0 if math.isinf(b) else 0.0  # half the pairs say "gone", half say "new" or "less"
    return b if math.isinf(b) else math.sqrt(a * b)


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> np.ndarray:
    """How many of the C(n+m, n) orderings give each Mann–Whitney U = 0..n·m: the coefficients of
    the Gaussian binomial [n+m choose n]_q, built one factor (1 − q^(m+i)) / (1 − q^i) at a time
    so every intermediate is itself a q-binomial and stays small."""
    counts = np.zeros(n * m + 1, np.int64)
    counts[0] = 1
    for i in range(1, n + 1):
        shift = m + i
        if shift <= n * m:
            counts[shift:] -= counts[:-shift].copy()
        for residue in range(i):  # divide by (1 − q^i): a running sum along each residue class
            counts[residue::i] = np.cumsum(counts[residue::i])
    return counts
