"""The gate and the verdicts on real profiled runs, as the issue's acceptance scenarios run them.

Pairs of runs go through MLflowProfilerCallback with schedule(wait=1, warmup=1, active=5,
repeat=2) into a sqlite store, and `mlflow-neuron compare --experiment E --baseline base
--fail-if-slower 10` judges each pair (tests/calibration_runs.py). The fake device's noise is
seeded, so the rates are the same on every run of this test; `benchmarks/calibration.py` prints
them.
"""

import pytest

import calibration_runs

PAIRS, CPU_PAIRS = 20, 10


@pytest.fixture(scope="module")
def store(tmp_path_factory, fake_profiler):
    return calibration_runs.log_pairs(tmp_path_factory.mktemp("calibration"), str(fake_profiler), PAIRS, CPU_PAIRS)


def test_a_a_same_kernels_with_jitter_and_stalls_the_gate_fires_at_most_once_in_20_pairs(store):
    fired, no_change = calibration_runs.rates(store, "aa", PAIRS)
    assert fired <= 1
    assert no_change >= PAIRS - 1


def test_a_b_kernels_30_percent_slower_the_gate_fires_on_every_pair(store):
    fired, _ = calibration_runs.rates(store, "ab", PAIRS)
    assert fired == PAIRS


def test_a_a_on_cpu_the_totals_verdict_is_no_change_in_at_least_9_of_10_pairs(store):
    _, no_change = calibration_runs.rates(store, "cpu-aa", CPU_PAIRS)
    assert no_change >= 9
