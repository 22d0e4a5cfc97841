"""The cycle as the unit of replication, and the host's load beside host time (pure: no MLflow).

Simulated runs with fixed seeds (`tests/synthetic_steps.py`): each cycle of a run may carry a
shift of its own (the machine got busier between windows) besides the per-step jitter.
"""

import numpy as np
import pandas as pd
import pytest

from mlflow_neuron._analysis import cycles
from mlflow_neuron._analysis.frame import compare
from mlflow_neuron._analysis.gate import gate_lines, inconclusive_runs, regressions
from mlflow_neuron._analysis.model import (
    CPU_METRIC,
    DEVICE_METRIC,
    FASTER,
    INCONCLUSIVE,
    NEW,
    NO_CHANGE,
    SLOWER,
    TOO_FEW_CYCLES,
    TOTAL,
    RunProfile,
)
from mlflow_neuron._analysis.stats import ratio_interval
from mlflow_neuron._analysis.weather import run_host
from synthetic_steps import Noise, cycle_rates, cycle_steps


def run_profile(label, rng, n_cycles, scale=1.0, shift=0.0, steps=5, host=None, ops=("aten::mul",), rotation="r1",
                **noise):  # fmt: skip
    """A run of `n_cycles` cycles of `steps` steps; its ops' samples in both metrics; in `rotation`
    (an `interleaved()` call's tag) unless it is None."""
    values, labels = cycle_steps(rng, n_cycles, steps, Noise(**noise), scale, shift)
    rows = [{"cycle": 10 * (1 + int(c)), "step": i, "name": op, "calls": 1, "self_device_time_us": float(v),
             "self_cpu_time_us": float(v)} for op in ops for i, (v, c) in enumerate(zip(values, labels))]  # fmt: skip
    samples = pd.DataFrame(rows)
    table = samples.groupby("name", as_index=False)[[DEVICE_METRIC, CPU_METRIC, "calls"]].sum().assign(kind="op")
    return RunProfile(label, f"id-{label}", 1, table, {}, "cpu", "present", samples=samples, source="steps",
                      host=host or {}, extra={"rotation": rotation})  # fmt: skip


def test_cycles_that_differ_are_found_and_steps_that_only_jitter_are_not():
    rng = np.random.default_rng(1)
    quiet = [cycles.cycle_noise(*cycle_steps(rng, 4, 5, Noise(stall_p=0)), *cycle_steps(rng, 4, 5, Noise(stall_p=0)))
             for _ in range(200)]  # fmt: skip
    shifted = [cycles.cycle_noise(*cycle_steps(rng, 4, 5, Noise(stall_p=0), 1.0, 0.3),
                                  *cycle_steps(rng, 4, 5, Noise(stall_p=0), 1.0, 0.3)) for _ in range(200)]  # fmt: skip
    # a test at p < 0.2 fires on about a fifth of the runs whose cycles do not differ
    assert 0.1 < np.mean([q.differ for q in quiet]) < 0.3
    assert np.mean([s.differ for s in shifted]) > 0.9
    assert np.median([s.share for s in shifted]) > 0.3 > np.median([q.share for q in quiet])


def test_the_cluster_interval_is_welchs_on_the_cycles_median_log_times():
    x, cx = np.array([10.0, 10, 20, 20, 40, 40]), np.array([1, 1, 2, 2, 3, 3])
    y, cy = 2 * x, cx
    estimate = cycles.cluster_interval(x, cx, y, cy)
    assert estimate.ratio == pytest.approx(2.0)
    # medians log 10, log 20, log 40 on both sides: var = (log 2)^2 each; Welch df = 4
    half = 2.7764451051977987 * np.sqrt(2 * np.log(2) ** 2 / 3)
    assert (estimate.low, estimate.high) == pytest.approx((2 * np.exp(-half), 2 * np.exp(half)))


def test_a_cycle_shift_gets_the_cluster_interval_and_its_coverage_holds():
    # 200 simulated pairs per case (the benchmark runs 1000); coverage of the 95% interval.
    for shift in (0.1, 0.3):
        rates = cycle_rates(seed=4, pairs=200, noise=Noise(), n_cycles=4, steps=5, shift=shift)
        assert rates.coverage >= 0.90, (shift, rates)
    shifted = cycle_rates(seed=5, pairs=200, noise=Noise(), n_cycles=4, steps=5, shift=0.3)
    assert shifted.cycles > 0.8  # most pairs were judged on their cycles


def test_too_few_cycles_is_the_verdict_and_it_names_how_many_are_needed():
    rng = np.random.default_rng(11)
    base = run_profile("base", rng, 2, shift=0.5, stall_p=0)
    run = run_profile("run", rng, 2, scale=1.3, shift=0.5, stall_p=0)
    frame = compare([base, run], metric=DEVICE_METRIC)
    noise = frame.attrs["cycle_noise"]["run"]
    assert noise["unit"] == "cycles" and noise["too_few_cycles"] and noise["p_value"] < cycles.CYCLE_ALPHA
    assert frame.loc[TOTAL, ("run", "verdict")] == TOO_FEW_CYCLES
    assert f"an interval needs {cycles.MIN_CYCLES} cycles per run, base has 2 and run 2" in frame.attrs["sentences"]["run"]
    failed, lines = gate_lines(frame, 10)
    assert not failed and not regressions(frame, 10)
    assert "NOT CHECKED run: 2 row(s), 2 vs 2 cycles that differ beyond the noise between steps, too few (needs 3 per " \
           f"run) for a 95% interval (TOTAL point ratio {frame.loc[TOTAL, ('run', 'ratio')]:.2f})" in lines, lines


def test_runs_with_enough_cycles_that_differ_are_judged_on_their_cycles():
    rng = np.random.default_rng(12)
    base = run_profile("base", rng, 6, shift=0.3, stall_p=0)
    run = run_profile("run", rng, 6, scale=2.0, shift=0.3, stall_p=0)
    frame = compare([base, run], metric=DEVICE_METRIC)
    assert frame.attrs["cycle_noise"]["run"]["unit"] == "cycles"
    assert frame.loc[TOTAL, ("run", "unit")] == "cycles"
    assert frame.loc[TOTAL, ("run", "verdict")] == SLOWER
    assert "over 6 vs 6 cycles" in frame.attrs["sentences"]["run"]


def test_one_cycle_per_run_is_judged_on_steps():
    rng = np.random.default_rng(13)
    frame = compare([run_profile("base", rng, 1, steps=10), run_profile("run", rng, 1, steps=10, scale=1.5)])
    noise = frame.attrs["cycle_noise"]["run"]
    assert noise["unit"] == "steps" and noise["p_value"] is None and noise["cycles"] == [1, 1]
    assert frame.loc[TOTAL, ("run", "verdict")] == SLOWER


QUIET, BUSY = {"other_cpu_cores": 0.1, "load_average_1m": 0.3, "cpu_count": 2.0}, {"other_cpu_cores": 1.9}


def test_host_time_of_runs_that_saw_different_host_load_is_inconclusive_and_never_gated():
    rng = np.random.default_rng(14)
    base = run_profile("base", rng, 4, host=QUIET, ops=("aten::mul", "aten::add"))
    cand = run_profile("cand", rng, 4, scale=1.6, host=BUSY, ops=("aten::mul", "aten::add"))
    frame = compare([base, cand], metric=CPU_METRIC)
    assert set(frame[("cand", "verdict")]) == {INCONCLUSIVE}
    reason = "the runs saw different host load (base 0.1 cores busy elsewhere, cand 1.9)"
    assert frame.attrs["sentences"]["cand"].startswith(f"cand vs base: inconclusive: {reason}")
    assert inconclusive_runs(frame) == {"cand": reason}
    failed, lines = gate_lines(frame, 10)
    assert not failed and not regressions(frame, 10)
    assert f"INCONCLUSIVE cand: {reason}; host time not gated (--fail-if-inconclusive: exit 4)" in lines
    # the same runs within the threshold are judged
    judged = compare([base, cand], metric=CPU_METRIC, host_load_threshold=2.0)
    assert judged.loc[TOTAL, ("cand", "verdict")] == SLOWER and not inconclusive_runs(judged)


def test_device_time_is_judged_on_its_own_and_the_host_load_is_shown_beside_it():
    rng = np.random.default_rng(15)
    base = run_profile("base", rng, 4, host=QUIET)
    cand = run_profile("cand", rng, 4, scale=0.5, host=BUSY)
    frame = compare([base, cand], metric=DEVICE_METRIC)
    assert frame.loc[TOTAL, ("cand", "verdict")] == FASTER and not inconclusive_runs(frame)
    from mlflow_neuron._report.render import html_page, text

    host = "host while profiled: base 0.1 cores busy elsewhere (load 0.3 on 2 CPUs), cand 1.9 cores busy elsewhere"
    assert host in text(frame) and host in html_page(frame)


def test_runs_without_host_figures_are_judged_as_before():
    rng = np.random.default_rng(16)
    frame = compare([run_profile("base", rng, 4), run_profile("cand", rng, 4, host=BUSY)], metric=CPU_METRIC)
    assert frame.loc[TOTAL, ("cand", "verdict")] in (NO_CHANGE, FASTER, SLOWER)
    assert not inconclusive_runs(frame)


def test_new_and_gone_ops_keep_their_verdicts_when_the_rest_is_inconclusive():
    rng = np.random.default_rng(17)
    base = run_profile("base", rng, 4, host=QUIET, ops=("aten::mul",))
    cand = run_profile("cand", rng, 4, host=BUSY, ops=("aten::mul", "aten::_fused_rms_norm"))
    frame = compare([base, cand], metric=CPU_METRIC)
    assert frame.loc["aten::_fused_rms_norm", ("cand", "verdict")] == NEW
    assert frame.loc[TOTAL, ("cand", "verdict")] == INCONCLUSIVE


def test_a_runs_host_figures_are_window_weighted_means_over_its_cycles():
    per_cycle = pd.DataFrame({"other_cpu_cores": [0.0, 2.0, np.nan], "window_s": [3.0, 1.0, 5.0],
                              "load_average_1m": [1.0, 1.0, 1.0], "torch_threads": [1.0, 1.0, 1.0]})  # fmt: skip
    host = run_host(per_cycle)
    assert host == {"cycles": 2.0, "other_cpu_cores": 0.5, "load_average_1m": 1.0, "torch_threads": 1.0}
    assert run_host(pd.DataFrame({"load_average_1m": [1.0]})) == {}
    # with the unclamped CPU seconds, the run's figure is their sum over the windows' seconds: a
    # short window that read -0.4 and one that read 2.4 (both past the clamps) cancel
    seconds = pd.DataFrame({"other_cpu_cores": [0.0, 2.0], "other_cpu_s": [-0.004, 0.024], "window_s": [0.01, 0.01],
                            "cpu_count": [2.0, 2.0]})  # fmt: skip
    assert run_host(seconds)["other_cpu_cores"] == pytest.approx(1.0)


def test_the_jobs_own_child_processes_are_summed_apart_and_the_reach_back_is_kept():
    # two windows of 10 ms, each read over the second up to its end; the job's compile workers
    # used 0.9 s of the 2 s, the rest of the host 0.2 s
    per_cycle = pd.DataFrame({"other_cpu_cores": [0.0, 0.2], "other_cpu_s": [0.0, 0.2],
                              "child_processes_cpu_cores": [1.5, 0.3], "child_processes_cpu_s": [0.6, 0.3],
                              "span_s": [1.0, 1.0], "reach_back_s": [0.99, 0.8], "window_s": [0.01, 0.03],
                              "cpu_count": [2.0, 2.0]})  # fmt: skip
    host = run_host(per_cycle)
    assert host["other_cpu_cores"] == pytest.approx(0.1) and host["child_processes_cpu_cores"] == pytest.approx(0.45)
    assert host["reach_back_s"] == 0.99 and host["window_s"] == pytest.approx(0.02)


JOB_BUSY = {"other_cpu_cores": 0.1, "child_processes_cpu_cores": 0.7, "load_average_1m": 1.0, "cpu_count": 2.0}


def test_the_jobs_own_processes_are_the_job_not_the_weather():
    """A run whose own child processes kept 0.7 cores busy (torch.compile's workers) beside a quiet
    host is judged, and the host line names the job's share; a run logged before the split, whose
    0.8 cores elsewhere held the same workers, is judged as it was: the host was busy."""
    rng = np.random.default_rng(21)
    base, cand = run_profile("base", rng, 4, host=JOB_BUSY), run_profile("cand", rng, 4, scale=1.6, host=JOB_BUSY)
    frame = compare([base, cand], metric=CPU_METRIC)
    assert frame.loc[TOTAL, ("cand", "verdict")] == SLOWER and not inconclusive_runs(frame)
    from mlflow_neuron._report.render import text

    assert ("base 0.1 cores busy elsewhere (load 1.0 on 2 CPUs; the job's own processes used 0.7 cores: its child "
            "processes, such as compile or DataLoader workers, counted as the job)") in text(frame)  # fmt: skip
    before = {"other_cpu_cores": 0.8, "load_average_1m": 1.0, "cpu_count": 2.0}
    old = compare([run_profile("base", rng, 4, host=before), run_profile("cand", rng, 4, scale=1.6, host=before)],
                  metric=CPU_METRIC)  # fmt: skip
    assert inconclusive_runs(old)["cand"] == ("the host was busy (base 0.8 of 2 CPUs busy elsewhere, cand 0.8 of 2 "
                                              "CPUs busy elsewhere, over 25%)")  # fmt: skip


def test_figures_read_before_their_windows_say_so_in_the_host_line_and_the_verdict():
    rng = np.random.default_rng(22)
    reached = {"other_cpu_cores": 1.2, "cpu_count": 2.0, "reach_back_s": 1.3, "window_s": 0.008}
    frame = compare([run_profile("base", rng, 4, host=reached), run_profile("cand", rng, 4, host=QUIET)],
                    metric=CPU_METRIC)  # fmt: skip
    said = "the host's load read with up to 1.3 s before each window of 8 ms: its counters tick every 10 ms"
    assert inconclusive_runs(frame)["cand"] == f"the host was busy (base 1.2 of 2 CPUs busy elsewhere, over 25%; {said})"
    from mlflow_neuron._report.render import text

    assert f"cand 0.1 cores busy elsewhere (load 0.3 on 2 CPUs); {said}" in text(frame)


def test_the_cli_exits_4_on_inconclusive_only_when_asked_and_1_still_wins(tracking_uri, monkeypatch, capsys):
    # tracking_uri: the client the command makes opens a store in tmp_path, not ./mlflow.db
    import mlflow_neuron._report.comparison as loading
    from mlflow_neuron.cli import main as cli_main

    rng = np.random.default_rng(18)
    profiles = [run_profile("base", rng, 6, host=QUIET), run_profile("cand", rng, 6, scale=1.6, host=BUSY)]
    monkeypatch.setattr(loading, "resolve_runs", lambda client, names, experiment: names)
    monkeypatch.setattr(loading, "load_profiles", lambda client, names, step=None: profiles)
    monkeypatch.setattr(loading, "rank_changes", lambda client, names, baseline, step=None: ({}, {}))  # no runs in a store
    argv = ["compare", "--runs", "base", "cand", "--metric", "self_cpu_time_us", "--fail-if-slower", "10"]
    assert cli_main(argv) == 0  # never gated: the gate does not fire on the weather
    out = capsys.readouterr().out
    assert "cand vs base: inconclusive: the runs saw different host load (base 0.1 cores busy elsewhere, cand 1.9)" in out
    assert "INCONCLUSIVE cand: the runs saw different host load" in out and "REGRESSION" not in out
    assert cli_main([*argv, "--fail-if-inconclusive"]) == 4
    assert cli_main(["compare", "--runs", "base", "cand", "--metric", "self_cpu_time_us", "--fail-if-inconclusive"]) == 4
    assert "INCONCLUSIVE cand:" in capsys.readouterr().out
    # within a wider threshold the same runs are judged, and the proven regression exits 1
    assert cli_main([*argv, "--fail-if-inconclusive", "--host-load-threshold", "3"]) == 1
    profiles.append(run_profile("slow", rng, 6, scale=3.0, host=QUIET))
    assert cli_main(["compare", "--runs", "base", "cand", "slow", *argv[4:], "--fail-if-inconclusive"]) == 1


def test_a_bad_host_load_threshold_is_a_usage_error(capsys):
    from mlflow_neuron.cli import main as cli_main

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["compare", "--experiment", "x", "--host-load-threshold", "-1"])
    assert exit_info.value.code == 2 and "--host-load-threshold" in capsys.readouterr().err


def test_a_wobble_between_cycles_too_small_to_carry_a_change_does_not_make_them_differ():
    # device time that barely jitters: cycles 0.1% apart are significantly different, and harmless
    x, cx = np.array([100.0, 100.001, 100.1, 100.101]), np.array([1, 1, 2, 2])
    noise = cycles.cycle_noise(x, cx, x * 1.3, cx)
    assert noise.p_value < cycles.CYCLE_ALPHA and noise.spread < cycles.NEGLIGIBLE_SHIFT and not noise.differ
    judged = cycles.judge(x, cx, x * 1.3, cx)
    assert judged.unit == cycles.STEPS and judged.estimate.low > 1.25


def test_too_few_samples_stay_too_few_whatever_the_host_load():
    # one sample a run: no interval, so no claim the weather could have made; the gate says so
    rng = np.random.default_rng(19)
    base = run_profile("base", rng, 1, steps=1, host=QUIET)
    cand = run_profile("cand", rng, 1, steps=1, scale=1.5, host=BUSY)
    frame = compare([base, cand], metric=CPU_METRIC)
    assert frame.loc[TOTAL, ("cand", "verdict")] == "too few samples" and not inconclusive_runs(frame)
    failed, lines = gate_lines(frame, 10)
    assert not failed and any(line.startswith("NOT CHECKED cand:") for line in lines), lines


# -- the gate acts only on evidence that covers the variation between windows (issue 36) ----------


def chosen_run(label, cycles_of_mul, host=None, rotation="r1", add=5.0):
    """A run of the chosen aten::mul times, one list per cycle (profiled window), and a steady aten::add;
    in `rotation` (an `interleaved()` call's tag) unless it is None."""
    rows = [{"cycle": 8 * (c + 1), "step": 8 * c + i, "name": name, "calls": 1, "self_device_time_us": value,
             "self_cpu_time_us": value}
            for c, values in enumerate(cycles_of_mul) for i, mul in enumerate(values)
            for name, value in (("aten::mul", mul), ("aten::add", add))]  # fmt: skip
    samples = pd.DataFrame(rows)
    table = samples.groupby("name", as_index=False)[[DEVICE_METRIC, CPU_METRIC, "calls"]].sum().assign(kind="op")
    return RunProfile(label, f"id-{label}", 8 * len(cycles_of_mul), table, {}, "cpu", "present", samples=samples,
                      source="steps", host=host or {}, extra={"rotation": rotation})  # fmt: skip


# The A/A pair of issue 36: aten::mul median 12.80 -> 39.15 us, 2 vs 2 cycles of 5 steps, a busy host
# beside both (0.9 and 1.4 cores busy elsewhere on 2 CPUs: half a core apart, so the old rule passed it).
AA_BASE = [[12.5, 12.8, 13.1, 12.6, 12.9], [12.7, 12.8, 13.0, 12.4, 12.9]]
AA_CAND = [[35.0, 39.15, 42.0, 38.0, 40.1], [36.2, 39.5, 41.0, 37.3, 39.0]]
LOADED_BASE = {"other_cpu_cores": 0.9, "load_average_1m": 3.2, "cpu_count": 2.0}
LOADED_CAND = {"other_cpu_cores": 1.4, "load_average_1m": 3.3, "cpu_count": 2.0}
NOT_GATED = "2 windows a run: not gated; profile \u2265 5 cycles each in rotation"  # 3 rows: 5 cycles
APART = ("runs profiled apart: not gated (a whole run can shift); profile them in rotation with interleaved(), "
         "\u2265 5 cycles each")  # fmt: skip
# three more windows of each run, at the levels of its first two
MORE_BASE = [[12.6, 12.8, 13.0, 12.5, 12.9], [12.4, 12.9, 12.7, 12.6, 13.0], [12.8, 12.5, 12.9, 12.7, 12.6]]
MORE_CAND = [[36.0, 39.2, 41.5, 37.9, 40.0], [38.1, 36.9, 40.4, 39.3, 37.2], [37.0, 40.8, 38.8, 39.9, 36.4]]


def test_host_time_from_two_windows_a_run_gets_its_numbers_and_a_verdict_but_never_the_gate():
    frame = compare([chosen_run("base", AA_BASE), chosen_run("cand", AA_CAND)], metric=CPU_METRIC)
    mul = frame.loc["aten::mul", "cand"]
    assert mul["verdict"] == SLOWER and mul["unit"] == "steps" and mul["ratio_low"] > 1.1  # what once fired
    assert frame.attrs["not_gated"] == {"cand": NOT_GATED}
    assert f"; {NOT_GATED})" in frame.attrs["sentences"]["cand"]
    failed, lines = gate_lines(frame, 10)
    assert not failed and regressions(frame, 10) == []  # the total and the op rows alike
    [line] = [line for line in lines if line.startswith("NOT GATED")]
    assert line.startswith(f"NOT GATED cand: host time, {NOT_GATED} (aten::mul ratio 3.")
    assert line.endswith(": above +10% but not proven)") and "TOTAL ratio" in line
    from mlflow_neuron._report.render import text

    assert "slower (not gated)" in text(frame)


def test_the_issues_aa_pair_under_load_is_inconclusive_and_the_cli_exits_0_or_4(tracking_uri, monkeypatch, capsys):
    import mlflow_neuron._report.comparison as loading
    from mlflow_neuron.cli import main as cli_main

    profiles = [chosen_run("base", AA_BASE, LOADED_BASE), chosen_run("cand", AA_CAND, LOADED_CAND)]
    monkeypatch.setattr(loading, "resolve_runs", lambda client, names, experiment: names)
    monkeypatch.setattr(loading, "load_profiles", lambda client, names, step=None: profiles)
    monkeypatch.setattr(loading, "rank_changes", lambda client, names, baseline, step=None: ({}, {}))  # no runs in a store
    argv = ["compare", "--runs", "base", "cand", "--metric", "self_cpu_time_us", "--fail-if-slower", "10"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    why = "the host was busy (base 0.9 of 2 CPUs busy elsewhere, cand 1.4 of 2 CPUs busy elsewhere, over 25%)"
    assert f"INCONCLUSIVE cand: {why}" in out and "REGRESSION" not in out
    assert cli_main([*argv, "--fail-if-inconclusive"]) == 4
    capsys.readouterr()
    # without the busy rule it is the window rule that keeps the gate off: still exit 0, never 1
    assert cli_main([*argv, "--host-busy-share", "1"]) == 0
    assert f"NOT GATED cand: host time, {NOT_GATED}" in capsys.readouterr().out


def test_device_time_over_two_cycles_is_gated_on_its_own_evidence():
    base = chosen_run("base", [[100.0, 101, 99, 100.5, 99.5], [100.2, 100.8, 99.3, 100.1, 99.9]], LOADED_BASE)
    slower = chosen_run("cand", [[130.0, 131, 129, 130.5, 129.5], [130.2, 130.8, 129.3, 130.1, 129.9]], LOADED_CAND)
    frame = compare([base, slower], metric=DEVICE_METRIC)
    assert not frame.attrs["not_gated"] and not inconclusive_runs(frame)
    assert {r.op for r in regressions(frame, 10)} == {"aten::mul", TOTAL}


def test_enough_cycles_in_rotation_cover_the_windows_and_the_gate_acts_on_family_wise_intervals_over_cycles():
    five = compare([chosen_run("base", AA_BASE + MORE_BASE), chosen_run("cand", AA_CAND + MORE_CAND)], metric=CPU_METRIC)
    assert not five.attrs["not_gated"] and "aten::mul" in {r.op for r in regressions(five, 10)}
    family = five.attrs["gate_intervals"]["cand"]
    assert family["level"] == 1 - 0.05 / 3 and set(family["rows"]) == {"aten::mul", "aten::add", TOTAL}
    assert family["needs"] == 5
    [mul] = [r for r in regressions(five, 10) if r.op == "aten::mul"]
    assert mul.ratio_low < five.loc["aten::mul", ("cand", "ratio_low")]  # wider than the row's 95% interval
    failed, lines = gate_lines(five, 10)
    assert failed and any(line.startswith("REGRESSION cand: aten::mul") and "(98.33% CI " in line
                          and " over cycles, for 3 rows)" in line for line in lines), lines  # fmt: skip
    # In rotation, fewer windows a run are not enough: quiet A/A pairs of one interleaved() call fired
    # on 4 of 20 at 2 cycles and 1 of 20 at 4 (the calibration matrix).
    for cycles_each in (1, 2, 3, 4):
        few = compare([chosen_run("base", (AA_BASE + MORE_BASE)[:cycles_each]),
                       chosen_run("cand", (AA_CAND + MORE_CAND)[:cycles_each])], metric=CPU_METRIC)  # fmt: skip
        windows = "1 window" if cycles_each == 1 else f"{cycles_each} windows"
        assert few.attrs["not_gated"] == {"cand": f"{windows} a run: not gated; profile \u2265 5 cycles each in rotation"}
        assert regressions(few, 10) == [] and few.loc["aten::mul", ("cand", "verdict")] == SLOWER
    # Runs profiled apart, however many cycles: a whole run can shift (quiet A/A pairs one after the
    # other: every cycle of one run 1.3-1.9x the other's), and nothing inside a run shows it. Two
    # rotations are two experiments, not one.
    for base_rotation, cand_rotation in ((None, None), ("r1", None), ("r1", "r2")):
        apart = compare([chosen_run("base", AA_BASE + MORE_BASE, rotation=base_rotation),
                         chosen_run("cand", AA_CAND + MORE_CAND, rotation=cand_rotation)], metric=CPU_METRIC)  # fmt: skip
        assert apart.attrs["not_gated"] == {"cand": APART} and regressions(apart, 10) == []
        assert apart.loc["aten::mul", ("cand", "verdict")] == SLOWER  # its numbers say so; the gate stays off
        [line] = [line for line in gate_lines(apart, 10)[1] if line.startswith("NOT GATED")]
        assert line.startswith(f"NOT GATED cand: host time, {APART} (aten::mul ratio 3.") and "95% CI over cycles" in line


def test_the_gates_interval_over_cycles_is_distribution_free_so_one_run_at_one_level_does_not_fire():
    """The quiet A/A pair in rotation that fired (calibration matrix, 4 cycles each): the base's
    four windows of aten::mean sat at one level (cycle medians 3.34-3.38 us), three of the
    candidate's at another, and Welch's interval over cycles read the base's variance as near zero
    (99.62% CI 1.17-1.68). Moses' interval on the cycles' medians needs no normal levels: at the
    gate's level it exists from 5 or 6 cycles each, and is the exact one on those medians."""
    base = [[3.36, 3.36, 3.36, 3.3, 3.4], [3.34, 3.34, 3.34, 3.3, 3.4], [3.36, 3.36, 3.36, 3.3, 3.4],
            [3.38, 3.38, 3.38, 3.3, 3.4]]  # fmt: skip
    cand = [[4.8, 4.8, 4.8, 4.7, 4.9], [4.46, 4.46, 4.46, 4.4, 4.5], [4.97, 4.97, 4.97, 4.9, 5.0],
            [4.58, 4.58, 4.58, 4.5, 4.6]]  # fmt: skip
    welch = cycles.cluster_interval(*_flat(base), *_flat(cand), 1 - 0.05 / 3)
    assert welch.low > 1.1  # what fired
    four = compare([chosen_run("base", base), chosen_run("cand", cand)], metric=CPU_METRIC)
    assert set(four.attrs["gate_intervals"]["cand"]["rows"]) == {"aten::add"}  # steady: its exact interval 1-1
    assert regressions(four, 10) == []
    assert four.attrs["not_gated"] == {"cand": "4 windows a run: not gated; profile \u2265 5 cycles each in rotation"}
    # two more windows each, the candidate's back at the base's level: an A/A pair's windows mix
    six = compare([chosen_run("base", base + base[:2]), chosen_run("cand", cand + base[2:])], metric=CPU_METRIC)
    [low, high] = six.attrs["gate_intervals"]["cand"]["rows"]["aten::mul"]
    medians = [np.median(c) for c in base + base[:2]], [np.median(c) for c in cand + base[2:]]
    exact = ratio_interval(np.array(medians[0]), np.array(medians[1]), 1 - 0.05 / 3)
    assert (low, high) == pytest.approx((exact.low, exact.high)) and low < 1.1 and regressions(six, 10) == []


def _flat(cycles_of_values):
    values = np.array([v for c in cycles_of_values for v in c])
    return values, np.repeat(np.arange(len(cycles_of_values)), [len(c) for c in cycles_of_values])


def test_the_all_clear_line_names_the_level_the_gate_judged_host_time_at():
    """A run whose host time the gate acted on over cycles passed at the family's level, not at 95%."""
    same = compare([chosen_run("base", AA_BASE + MORE_BASE), chosen_run("cand", AA_BASE + MORE_BASE)], metric=CPU_METRIC)
    failed, lines = gate_lines(same, 10)
    assert not failed and lines[-1] == "no op or total is proven more than 10% slower than base (95% interval; host time 98.33% over cycles)"
    apart = compare([chosen_run("base", AA_BASE + MORE_BASE, rotation=None),
                     chosen_run("cand", AA_BASE + MORE_BASE, rotation=None)], metric=CPU_METRIC)  # fmt: skip
    assert gate_lines(apart, 10)[1][-1] == "no op or total is proven more than 10% slower than base (95% interval)"


def test_host_time_is_judged_on_cycles_even_where_the_cycles_look_alike():
    """The F test on three cycles has little power: a pair whose cycles it found alike was judged
    on its steps, and that fired on quiet A/A pairs whose every window of one run sat at another
    level. Host time from 3 cycles a run is judged on its cycles; device time keeps the test."""
    base = [[50.0, 51, 49, 50.5, 49.5], [50.2, 50.8, 49.3, 50.1, 49.9], [49.8, 50.4, 50.6, 49.7, 50.3],
            [50.1, 49.6, 50.7, 49.9, 50.2], [49.7, 50.3, 50.9, 49.4, 50.0]]  # fmt: skip
    cand = [[v * 1.3 for v in cycle] for cycle in base]
    host = compare([chosen_run("base", base), chosen_run("cand", cand)], metric=CPU_METRIC)
    assert set(host[("cand", "unit")]) == {"cycles"}
    assert set(host.attrs["gate_intervals"]["cand"]["rows"]) == {"aten::mul", "aten::add", TOTAL}
    assert {r.op for r in regressions(host, 10)} == {"aten::mul", TOTAL}
    device = compare([chosen_run("base", base), chosen_run("cand", cand)], metric=DEVICE_METRIC)
    assert set(device[("cand", "unit")]) == {"steps"} and not device.attrs["gate_intervals"]
    assert {r.op for r in regressions(device, 10)} == {"aten::mul", TOTAL}


def test_a_busy_host_makes_host_time_inconclusive_even_when_both_runs_saw_the_same_load():
    rng = np.random.default_rng(20)
    busy_alike = [run_profile("base", rng, 4, host=LOADED_BASE), run_profile("cand", rng, 4, scale=1.6, host=LOADED_CAND)]
    frame = compare(busy_alike, metric=CPU_METRIC)
    assert frame.loc[TOTAL, ("cand", "verdict")] == INCONCLUSIVE
    assert inconclusive_runs(frame)["cand"].startswith("the host was busy (base 0.9 of 2 CPUs busy elsewhere")
    # a busy baseline alone is enough; a quiet pair, or a share the user widened, is judged
    assert compare([busy_alike[0], run_profile("cand", rng, 4, host=QUIET)], metric=CPU_METRIC,
                   host_load_threshold=2.0).loc[TOTAL, ("cand", "verdict")] == INCONCLUSIVE  # fmt: skip
    quiet = {"other_cpu_cores": 0.4, "cpu_count": 2.0}  # 20%: what a run's own noise absorbs
    judged = compare([run_profile("base", rng, 4, host=quiet), run_profile("cand", rng, 4, scale=1.6, host=quiet)],
                     metric=CPU_METRIC)  # fmt: skip
    assert judged.loc[TOTAL, ("cand", "verdict")] == SLOWER and not inconclusive_runs(judged)
    widened = compare(busy_alike, metric=CPU_METRIC, host_busy_share=0.75)
    assert widened.loc[TOTAL, ("cand", "verdict")] == SLOWER
    # device time is judged on its own whatever the weather
    assert compare(busy_alike, metric=DEVICE_METRIC).loc[TOTAL, ("cand", "verdict")] == SLOWER


def test_rows_whose_stalls_took_whole_cycles_are_named_not_checked_never_passed_in_silence():
    # in rotation, 5 cycles a run (3 rows need 5): two of the candidate's windows stalled through,
    # and outliers take them whole. aten::mul and the TOTAL keep a 95% interval over 3 cycles, but
    # none at the gate's level: the gate cannot act on them, and says so.
    stalled = [[900.0, 950.0, 1000.0, 980.0, 990.0], [910.0, 940.0, 1010.0, 970.0, 995.0]]
    frame = compare([chosen_run("base", MORE_BASE + AA_BASE), chosen_run("cand", AA_CAND + MORE_CAND[:1] + stalled)],
                    metric=CPU_METRIC)  # fmt: skip
    assert not frame.attrs["not_gated"] and set(frame.attrs["gate_intervals"]["cand"]["rows"]) == {"aten::add"}
    assert frame.loc["aten::mul", ("cand", "ratio_low")] > 2  # what a 95% interval alone would have failed
    failed, lines = gate_lines(frame, 10)
    assert not failed
    assert ("NOT CHECKED cand: 2 row(s) (TOTAL, aten::mul), too few cycles left after outliers for the gate's "
            "98.33% interval over cycles (needs 5 a run)") in lines, lines
