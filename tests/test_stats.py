"""The statistics behind compare: the interval's method, its coverage, and the gate's calibration.

Simulated per-step samples (see `tests/synthetic_steps.py`) with fixed seeds: every number here
is reproducible, and each simulation takes well under a second.
"""

import math

import numpy as np
import pandas as pd
import pytest

from mlflow_neuron._analysis.frame import compare
from mlflow_neuron._analysis.gate import regressions
from mlflow_neuron._analysis.model import TOTAL, RunProfile
from mlflow_neuron._analysis.stats import _u_counts, moses_rank, outlier_mask, ratio_interval
from synthetic_steps import Noise, rates, steps


@pytest.mark.parametrize("n, m, rank", [(3, 3, 0), (4, 4, 1), (5, 5, 3), (10, 10, 24), (20, 20, 128),
                                        (2, 8, 1), (1, 38, 0), (1, 39, 1), (30, 30, 318)])  # fmt: skip
def test_the_interval_ranks_match_published_mann_whitney_critical_values(n, m, rank):
    # Critical values of U at 5% two-sided (lower bound rank = critical value + 1).
    assert moses_rank(n, m) == rank


def test_the_exact_u_distribution_counts_every_ordering_and_is_symmetric():
    counts = _u_counts(7, 5)
    assert counts.sum() == math.comb(12, 5) and list(counts) == list(counts[::-1])
    # The normal approximation (used past int64 range) is within a rank of the exact value near it.
    assert abs(moses_rank(32, 32) - (32 * 32 / 2 - 1.959964 * math.sqrt(32 * 32 * 65 / 12))) < 1.5


def test_zero_spread_compares_exactly_and_single_samples_have_no_interval():
    exact = ratio_interval(np.full(5, 40.0), np.full(3, 50.0))
    assert (exact.ratio, exact.low, exact.high, exact.exact) == (1.25, 1.25, 1.25, True)
    assert not ratio_interval(np.array([40.0]), np.array([50.0])).has_interval
    assert not ratio_interval(np.full(3, 1.0) + [0, 1, 2], np.full(3, 2.0) + [0, 1, 2]).has_interval  # 3 vs 3


def test_an_op_absent_in_some_steps_still_compares():
    estimate = ratio_interval(np.array([0.0, 5, 5, 5, 5, 5]), np.array([0.0, 0, 0, 0, 0, 0]))
    assert estimate.ratio == 0.0 and estimate.has_interval and estimate.high <= 1.0


def test_one_stalled_step_barely_moves_the_ratio_but_is_named_an_outlier():
    rng = np.random.default_rng(7)
    base, run = rng.uniform(90, 110, 10), rng.uniform(90, 110, 10)
    calm = ratio_interval(base, run).ratio
    stalled = run.copy()
    stalled[3] *= 800  # one step stalls for ~80 ms, as in the README's screenshot
    assert ratio_interval(base, stalled).ratio == pytest.approx(calm, rel=0.06)
    assert list(np.flatnonzero(outlier_mask(stalled))) == [3]
    assert not outlier_mask(np.r_[np.full(9, 7.0), 7.001]).any()  # 1 ns on identical samples is no outlier


def test_an_ordinary_series_of_any_length_rarely_has_an_outlier():
    """5 MADs flagged a sample in 11% of normal 5-step series; the bound for few samples is the
    99th percentile of the largest deviation, so at most about 1% of them are flagged."""
    rng = np.random.default_rng(11)
    for n in (4, 5, 6, 8, 10, 15, 23, 24, 40):
        series = rng.standard_normal((20_000, n)) * 0.1 + 1.0
        flagged = np.mean([outlier_mask(values).any() for values in series])
        assert flagged <= 0.0125, (n, flagged)
    five = np.array([1.0, 1.2, 0.8, 1.1, 0.9])
    for stalled in range(5):  # a 10x stall is still found in a 5-step series, wherever it is
        values = five.copy()
        values[stalled] *= 10
        assert list(np.flatnonzero(outlier_mask(values))) == [stalled]


def test_the_same_samples_always_give_the_same_answer():
    rng = np.random.default_rng(3)
    base, run = rng.uniform(1, 2, 12), rng.uniform(1, 2, 9)
    assert ratio_interval(base, run) == ratio_interval(base.copy(), run.copy())


@pytest.mark.parametrize("noise, scale, n, m", [
    (Noise(), 1.3, 10, 10),                               # one kernel, ±30% uniform, 2% 10x stalls
    (Noise(stall_p=0.0, lognormal=True), 0.7, 10, 10),   # lognormal jitter
    (Noise(kernels=4), 1.0, 10, 10),                      # four kernels per step
    (Noise(kernels=2, lognormal=True), 1.5, 6, 15),       # unequal n
])  # fmt: skip
def test_the_95_percent_interval_covers_the_true_ratio_about_95_percent_of_the_time(noise, scale, n, m):
    found = rates(seed=11, pairs=600, noise=noise, scale=scale, n=n, m=m)
    assert found.no_interval == 0
    assert 0.92 <= found.coverage <= 0.99, found


# -- calibration of the gate, through compare() and regressions() ---------------------------------


def _profile(label: str, rng, noise: Noise, scale: float = 1.0, ops: int = 1, n: int = 10) -> RunProfile:
    """A run whose every step runs `ops` ops, each drawn from `noise`."""
    rows = [{"cycle": 1 + step // 5, "step": step, "name": f"aten::op{i}", "calls": 1,
             "self_device_time_us": value, "self_cpu_time_us": 1.0}
            for i in range(ops) for step, value in enumerate(steps(rng, n, noise, scale))]  # fmt: skip
    samples = pd.DataFrame(rows)
    table = samples.groupby("name", as_index=False)[["self_device_time_us", "self_cpu_time_us", "calls"]].sum()
    return RunProfile(label, label, 1, table.assign(kind="op"), {}, "neuron", "present", samples=samples, source="steps")


def _gate_fires(seed: int, pairs: int, scale: float, ops: int) -> int:
    rng = np.random.default_rng(seed)
    fired = 0
    for _ in range(pairs):
        frame = compare([_profile("base", rng, Noise(), 1.0, ops), _profile("new", rng, Noise(), scale, ops)])
        fired += bool(regressions(frame, 10))
    return fired


def test_a_a_the_gate_at_10_percent_fires_at_most_once_in_40_pairs():
    assert _gate_fires(seed=5, pairs=40, scale=1.0, ops=1) <= 1
    assert _gate_fires(seed=6, pairs=40, scale=1.0, ops=8) <= 1  # nine rows gated per pair


def test_a_b_a_30_percent_slower_kernel_fails_the_gate_on_nearly_every_pair_when_a_step_runs_several_ops():
    # Eight ops per step (naive RMSNorm runs six): the TOTAL averages the kernels' jitter. The
    # stalls (15% of steps have one) keep the rate just under 100%: about 99% with eight ops, 97%
    # with six, 92% with four (benchmarks/stats_calibration.py prints them).
    assert _gate_fires(seed=8, pairs=20, scale=1.3, ops=8) >= 19
    assert _gate_fires(seed=8, pairs=20, scale=1.3 * 1.3, ops=8) == 20  # +69%: every pair


def test_a_b_with_one_kernel_per_step_no_honest_interval_can_clear_10_percent_every_time():
    # ±30% uniform jitter, 10 vs 10 steps: the interval's lower bound is often below 1.10 although
    # the truth is 1.30. The benchmark prints this rate; here we pin that it is well below 100%.
    found = rates(seed=9, pairs=400, noise=Noise(), scale=1.3)
    assert 0.2 < found.gate < 0.7 and found.coverage > 0.92


def test_the_total_row_is_gated_like_any_op():
    rng = np.random.default_rng(12)
    frame = compare([_profile("base", rng, Noise(stall_p=0), 1.0, 4), _profile("new", rng, Noise(stall_p=0), 1.3, 4)])
    assert frame.loc[TOTAL, ("new", "verdict")] == "slower"
    assert any(r.op == TOTAL and r.ratio_low > 1.1 for r in regressions(frame, 10))
