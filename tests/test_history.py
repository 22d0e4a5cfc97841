"""`history`: change points across an experiment's runs. The change-point layer on synthetic series
(the noise of `synthetic_steps`: ±30% jitter, 2% stalls), then the command on real profiled runs:
the fake device's kernels take 10 us for eight nightly runs, then 13 us for eight."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import run_python
from mlflow.tracking import MlflowClient
from synthetic_steps import Noise, steps

from mlflow_neuron._analysis.changes import change_points, pelt_l2, search_changes
from mlflow_neuron._report.history import environment_changes, median_interval
from mlflow_neuron._report.history_text import no_change_line
from mlflow_neuron.cli import main as cli_main


def series(seed: int, scales: list[float], n: int = 10) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [steps(rng, n, Noise(), scale) for scale in scales]


def test_a_step_is_found_at_its_run_with_its_ratio():
    for seed in range(5):
        found = change_points(series(seed, [1.0] * 8 + [1.3] * 8))
        assert [(c.at, c.verdict) for c in found] == [(8, "slower")], seed
        assert found[0].low > 1.1 and found[0].ratio == pytest.approx(1.3, rel=0.1)


def test_two_steps_and_a_faster_one():
    found = change_points(series(1, [1.0] * 10 + [1.3] * 10 + [1.0] * 10))
    assert [(c.at, c.verdict) for c in found] == [(10, "slower"), (20, "faster")]


def test_flat_series_and_one_outlier_run_report_nothing():
    assert all(change_points(series(seed, [1.0] * 20)) == [] for seed in range(10))
    assert change_points(series(3, [1.0] * 9 + [1.6] + [1.0] * 10)) == []
    assert change_points(series(0, [1.0] * 3)) == []  # too short for two segments


def test_a_change_inside_the_noise_band_is_not_reported():
    scales = [1.0] * 10 + [1.01] * 10  # +1%, below the 2% noise band
    assert change_points(series(0, scales, n=200), noise_pct=2.0) == []


def test_no_change_says_which_it_was_a_suggestion_inside_the_band_none_or_no_search():
    rng = np.random.default_rng(0)
    within = search_changes([100 * s * (1 + 0.001 * rng.standard_normal(20)) for s in [1.0] * 8 + [1.015] * 8])
    flat, short = search_changes(series(0, [1.0] * 20)), search_changes(series(0, [1.0] * 3))
    assert (within.changes, within.suggested, within.skipped) == ([], 1, None)  # +1.5%: clear, but inside +-2%
    assert (flat.changes, flat.suggested, flat.skipped) == ([], 0, None)
    assert short.changes == [] and short.skipped.startswith("3 runs are too few")

    def line(found) -> str:
        frame = pd.DataFrame()
        frame.attrs.update(noise_pct=2.0, suggested=found.suggested, not_searched=found.skipped)
        return no_change_line(frame)

    assert line(within) == "no change: the series suggested 1 change point, and it stayed within \u00b12% (95% interval)"
    assert line(flat).startswith("no change: the series suggested no change point")
    assert line(short) == "no change looked for: 3 runs are too few to look for a change (3 a side, 6 in all)"


def test_the_median_intervals_order_statistic_is_the_binomial_quantile_at_any_number_of_steps():
    """Exact (scipy's `binom.ppf`) from one step to a long run's thousands, where the run's summary
    recomputes it each cycle."""
    from scipy.stats import binom

    from mlflow_neuron._trace.step_summary import _binomial_half_quantile

    for n in [*range(1, 80), 100, 333, 1000, 5000]:
        for q in (0.005, 0.025, 0.05, 0.25):
            assert _binomial_half_quantile(n, q) == int(binom.ppf(q, n, 0.5)), (n, q)


def test_the_median_interval_and_the_environment_lines():
    assert median_interval(np.arange(1.0, 11.0)) == (2.0, 9.0)  # order statistics 2 and 9 of 10: 97.9%
    assert median_interval(np.arange(5.0)) == (None, None)
    run = lambda params, tags: SimpleNamespace(data=SimpleNamespace(params=params, tags=tags))  # noqa: E731
    before = run({"versions.torch": "2.13.0"}, {"mlflow_neuron.env.ec2_instance_type": "trn2.48xlarge"})
    after = run({"versions.torch": "2.14.0"}, {"mlflow_neuron.env.ec2_instance_type": "trn2.48xlarge"})
    assert environment_changes(before, after) == ["torch 2.13.0 \u2192 2.14.0"]
    assert environment_changes(before, before) == []


SERIES = """
import json, os, pathlib, torch
import fake_device
fake_device.activate(pathlib.Path({so!r}))
import mlflow
from torch.profiler import ProfilerActivity, profile, schedule
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
x = torch.randn(8, 64)
for experiment, kernels in (("nightly", ["10"] * 8 + ["13"] * 8), ("flat", ["10"] * 12)):
    mlflow.set_experiment(experiment)
    for night, mul_us in enumerate(kernels, start=1):
        os.environ.update(FAKE_NEURON_KERNELS=f"aten::mul={{mul_us}},aten::add=5", FAKE_NEURON_SEED=str(night))
        with mlflow.start_run(run_name="step"):
            mlflow.set_tag("mlflow.source.git.commit", f"c{{night:02d}}")
            callback = MLflowProfilerCallback(process="inline", background=False, log_timeline=False)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], on_trace_ready=callback,
                         schedule=schedule(wait=1, warmup=1, active=10)) as prof:
                for _ in range(12):
                    (x * 2) + 1
                    prof.step()
            callback.close()
print("done")
"""


@pytest.fixture(scope="module")
def nightly(fake_profiler, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("history")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    result = run_python(SERIES.format(so=str(fake_profiler), uri=uri), tmp, env={"FAKE_NEURON_JITTER": "0.1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return uri


def test_history_names_the_commit_that_made_it_slower(nightly, capsys):
    assert cli_main(["history", "--tracking-uri", nightly, "--experiment", "nightly", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["runs"]) == 16 and [r["commit"] for r in report["runs"]] == [f"c{i:02d}" for i in range(1, 17)]
    [change] = report["changes"]
    assert (change["before_commit"], change["after_commit"], change["verdict"]) == ("c08", "c09", "slower")
    # mul 10 -> 13 us and add 5 us a step: (13 + 5) / (10 + 5)
    assert change["ratio"] == pytest.approx(18 / 15, rel=0.03) and change["ratio_low"] > 1.1
    assert "aten::mul accounts for" in change["sentence"]
    assert cli_main(["history", "--tracking-uri", nightly, "--experiment", "nightly"]) == 0
    table = capsys.readouterr().out
    assert "commit c08" in table and "commit c09" in table and "SLOWER +20%" in table

    args = ["history", "--tracking-uri", nightly, "--experiment", "nightly", "--fail-on-change"]
    assert cli_main([*args, "10"]) == 1
    assert "CHANGE c08 -> c09: ratio 1.20" in capsys.readouterr().out
    assert cli_main([*args, "60"]) == 0


def test_a_flat_series_the_picture_and_a_wrong_experiment(nightly, capsys):
    assert cli_main(["history", "--tracking-uri", nightly, "--experiment", "flat", "--format", "json",
                     "--fail-on-change", "10"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert json.loads(out[: out.rindex("}") + 1])["changes"] == []
    client = MlflowClient(nightly)
    target = client.create_run(client.get_experiment_by_name("flat").experiment_id).info.run_id
    assert cli_main(["history", "--tracking-uri", nightly, "--experiment", "nightly", "--log-to", target]) == 0
    assert {a.path for a in client.list_artifacts(target, "history")} == {
        "history/history.png", "history/history.html", "history/history.json"}
    assert cli_main(["history", "--tracking-uri", nightly, "--experiment", "nightlyy"]) == 2
    assert "no experiment named 'nightlyy'" in capsys.readouterr().err


def _penalized_cost(x: np.ndarray, ends: list[int], penalty: float) -> float:
    bounds = [0, *ends]
    return sum(float(((x[a:b] - x[a:b].mean()) ** 2).sum()) + penalty for a, b in zip(bounds, bounds[1:]))


def test_pelt_finds_the_segments_ruptures_finds():
    """`pelt_l2` is the search ruptures' PELT makes (L2 cost, jump 1): the same ends on 2,000 series
    (noise, level shifts, a flat series around a large mean). Where rounded values make costs tie,
    PELT's pruning (not exact with a minimum segment size) may go another way: ours then keeps the
    tied starts and ends at a cost no higher than ruptures'. And ruptures' refusal of a too-short series."""
    ruptures = pytest.importorskip("ruptures")
    rng = np.random.default_rng(36)
    for trial in range(2000):
        n, kind = int(rng.integers(1, 90)), trial % 4
        x = {0: lambda: rng.normal(size=n) + 6,
             1: lambda: np.repeat(rng.normal(size=4), -(-n // 4))[:n] * 0.05 + rng.normal(scale=0.01, size=n) + 6,
             2: lambda: np.round(rng.normal(size=n), 1),
             3: lambda: np.full(n, 5.3)}[kind]()  # fmt: skip
        penalty, min_size = float(rng.choice([0.001, 0.5, 2.0, 10.0])), int(rng.integers(1, 5))
        try:
            want = ruptures.Pelt(model="l2", min_size=min_size, jump=1).fit(x.reshape(-1, 1)).predict(pen=penalty)
        except ruptures.exceptions.BadSegmentationParameters:
            with pytest.raises(ValueError, match=f"no segment of at least {min_size}"):
                pelt_l2(x, penalty, min_size)
            continue
        got = pelt_l2(x, penalty, min_size)
        ours, theirs = _penalized_cost(x, got, penalty), _penalized_cost(x, want, penalty)
        assert got == want or (kind == 2 and ours <= theirs * (1 + 1e-9)), (trial, want, got, ours, theirs)
