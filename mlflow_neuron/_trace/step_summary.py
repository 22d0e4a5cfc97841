"""A run's per-step times in five numbers (pure): what `history` reads in bulk instead of tables.

Example::

    s = summarize(np.array([101.0, 99.5, 100.2, 98.7, 100.9, 1003.0]))
    s.median, s.low, s.high, s.n, s.level     # 100.55, 98.7, 1003.0, 6, 4.6057 (the 1003 left out)

- `median`, with the distribution-free 95% interval of a median (`low`, `high`: order statistics
  k and n + 1 - k, k from the binomial (n, 1/2); none below 6 samples);
- `n`, the steps summarized;
- `level`: the mean log time of the steps that are not outliers. It is the number `history`
  places change-point candidates on (`_analysis.changes`), so candidates found from summaries are
  the candidates found from the tables. None where a step took no time (no log).

**Outliers** (used here and by every comparison): a sample more than 5 robust standard deviations
from its own run's median, |x − median| > 5 · 1.4826 · MAD (n >= 4), the MAD floored at 1% of the
median and at 1 ns, so samples that are all equal do not flag a timer's nanosecond of jitter
(`_analysis.stats` says why this rule). Below 24 samples the MAD of a few samples is often tiny (3
of 5 close together), so 5 of its sigmas flagged a sample in 11% of plain normal 5-step series;
there the bound is the 99th percentile of max|x − median| / (1.4826 · MAD) over normal series of
that size (`_FEW_SAMPLE_SIGMAS`: 18.5 at 5 steps, 7.0 at 10), so an ordinary series of any length
has an outlier flagged at most 1% of the time, and a stall of several times the median is still
found.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

OUTLIER_SIGMAS = 5.0
# n -> the 99th percentile of max|x - median| / (1.4826 * MAD) over 2,000,000 normal series of n
# samples (rounded up; from 24 samples on it is about OUTLIER_SIGMAS or below). Derived by
# `python benchmarks/stats_calibration.py --outlier-bounds`; the flag rate it gives is checked by
# tests/test_stats.py::test_an_ordinary_series_of_any_length_rarely_has_an_outlier.
_FEW_SAMPLE_SIGMAS = {4: 16.1, 5: 18.5, 6: 10.1, 7: 10.7, 8: 8.0, 9: 8.3, 10: 7.0, 11: 7.1, 12: 6.3, 13: 6.4,
                      14: 5.9, 15: 6.0, 16: 5.6, 17: 5.7, 18: 5.4, 19: 5.5, 20: 5.3, 21: 5.3, 22: 5.1, 23: 5.2}  # fmt: skip
MIN_OUTLIER_SAMPLES = 4
_MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation is 1.4826 MADs
_SPREAD_FLOOR_OF_MEDIAN = 0.01
_SPREAD_FLOOR_US = 0.001  # 1 ns: the resolution of profiler timestamps
MIN_INTERVAL_SAMPLES = 6


@dataclass(frozen=True)
class StepSummary:
    """Five numbers of one series of per-step values (see the module docstring)."""

    n: int
    median: float
    low: float | None
    high: float | None
    level: float | None


def summarize(values) -> StepSummary:
    """The summary of per-step values (at least one)."""
    values = np.asarray(values, float)
    if len(values) == 0:
        raise ValueError("summarize needs at least one step")
    low, high = median_interval(values)
    return StepSummary(len(values), float(np.median(values)), low, high, level(values))


def level(values) -> float | None:
    """The mean log of the samples that are not outliers; None when a sample is <= 0."""
    values = np.asarray(values, float)
    if len(values) == 0 or (values <= 0).any():
        return None
    return float(np.log(without_outliers(values)).mean())


def median_interval(values, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """The distribution-free interval of a median: order statistics k and n + 1 - k, k the
    (1 - confidence)/2 quantile of binomial(n, 1/2); (None, None) below 6 samples."""
    ordered, n = np.sort(np.asarray(values, float)), len(values)
    k = interval_order(n, confidence)
    return (float(ordered[k - 1]), float(ordered[n - k])) if k >= 1 and n >= MIN_INTERVAL_SAMPLES else (None, None)


def interval_order(n: int, confidence: float = 0.95) -> int:
    """k of `median_interval`: its interval is the k-th and the (n + 1 - k)-th smallest of n."""
    return _binomial_half_quantile(n, (1 - confidence) / 2)


@lru_cache(maxsize=1024)
def _binomial_half_quantile(n: int, q: float) -> int:
    """The smallest k with P(X <= k) >= q for X ~ binomial(n, 1/2) (scipy's `binom.ppf`), exactly:
    in integers, sum(C(n, i) for i <= k) * d >= m * 2**n for q = m/d. Each C(n, k) comes from the
    last (C(n, k) from scratch made a run's summary at 5,000 steps take 0.6 s a cycle)."""
    if n <= 0:
        return 0
    q = Fraction(q)
    target, cumulative, comb = q.numerator * 2**n, 0, 1
    for k in range(n + 1):
        cumulative += comb
        if cumulative * q.denominator >= target:
            return k
        comb = comb * (n - k) // (k + 1)
    return n


def outlier_mask(samples) -> np.ndarray:
    """True for samples more than OUTLIER_SIGMAS robust standard deviations (1.4826 · MAD, floored;
    more below 24 samples: see the module docstring) from their median."""
    values = np.asarray(samples, float)
    if len(values) < MIN_OUTLIER_SAMPLES:
        return np.zeros(len(values), bool)
    median = float(np.median(values))
    spread = max(_MAD_TO_SIGMA * float(np.median(np.abs(values - median))), _SPREAD_FLOOR_OF_MEDIAN * abs(median),
                 _SPREAD_FLOOR_US)  # fmt: skip
    return np.abs(values - median) > outlier_sigmas(len(values)) * spread


def outlier_sigmas(n: int) -> float:
    """How many robust standard deviations from the median make one of n samples an outlier."""
    return _FEW_SAMPLE_SIGMAS.get(n, OUTLIER_SIGMAS)


def without_outliers(samples) -> np.ndarray:
    """The samples that `outlier_mask` does not flag."""
    values = np.asarray(samples, float)
    return values[~outlier_mask(values)]
