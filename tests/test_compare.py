"""Comparison, the CI gate and the rendered reports: pure frames, then real runs in a sqlite store."""

import json
from itertools import pairwise

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import artifact_files
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import compare, compare_runs, regressions, render
from mlflow_neuron.cli.arguments import EXIT_USAGE
from mlflow_neuron._analysis.gate import unchecked
from mlflow_neuron._analysis.model import TOTAL, RunProfile
from mlflow_neuron._report.publish import top_ops
from mlflow_neuron._analysis.samples import is_wrapper, wrapper_names
from mlflow_neuron._analysis.verdict import short_name
from mlflow_neuron.cli import main as cli_main


def profile_of(label, times, device_time="present", total=None, aten_calls=3):
    """An old-style profile: one cycle's op table, no per-step samples."""
    ops = pd.DataFrame({
        "name": list(times), "kind": ["op"] * len(times), "calls": [2] * len(times),
        "self_device_time_us": list(times.values()), "self_cpu_time_us": [v / 10 for v in times.values()],
    })  # fmt: skip
    totals = {"self_device_time_us": total or sum(times.values()), "self_cpu_time_us": (total or sum(times.values())) / 10,
              "aten_calls": aten_calls}  # fmt: skip
    return RunProfile(label, f"id-{label}", 4, ops, totals, "neuron", device_time)


def stepped(label, per_op, aten_calls=6, cycles=2):
    """A profile with per-step samples: `per_op` maps op name -> its device time in each step."""
    n = len(next(iter(per_op.values())))
    rows = [{"cycle": 1 + step * cycles // n, "step": 10 + step, "name": name, "calls": 2,
             "self_device_time_us": float(values[step]), "self_cpu_time_us": 1.0}
            for name, values in per_op.items() for step in range(n) if values[step] is not None]  # fmt: skip
    samples = pd.DataFrame(rows)
    totals = samples.groupby(["cycle", "step"], as_index=False)[["self_device_time_us", "self_cpu_time_us"]].sum()
    ops = samples.groupby("name", as_index=False)[["calls", "self_device_time_us", "self_cpu_time_us"]].sum()
    return RunProfile(label, f"id-{label}", 4, ops.assign(kind="op"), {}, "neuron", "present",
                      samples=samples, step_totals=totals.assign(aten_calls=aten_calls), source="steps")  # fmt: skip


JITTER = [1.0, 1.12, 0.91, 1.05, 0.97, 1.08, 0.94, 1.02, 0.99, 1.1]  # ±12%, fixed


def jittery(label, scale=1.0, stall_step=None, **kwargs):
    mul = [100.0 * scale * j for j in JITTER]
    add = [10.0 * j for j in reversed(JITTER)]
    if stall_step is not None:
        mul[stall_step] *= 80
    return stepped(label, {"aten::mul": mul, "aten::add": add}, **kwargs)


def test_old_single_sample_runs_still_compare_per_op_with_medians_delta_speedup_and_share():
    frame = compare([profile_of("naive", {"aten::mul": 2355.0, "aten::add": 45.0}),
                     profile_of("fused", {"aten::rms_norm": 1400.0})], baseline="naive")
    assert frame.attrs["metric"] == "self_device_time_us" and frame.attrs["fallback"] is None
    assert list(frame.index) == ["aten::mul", "aten::rms_norm", "aten::add", TOTAL]
    assert frame.loc["aten::mul", ("naive", "share")] == pytest.approx(2355 / 2400)
    assert frame.loc[TOTAL, ("fused", "delta_us")] == pytest.approx(1400 - 2400)
    assert frame.loc[TOTAL, ("fused", "speedup")] == pytest.approx(2400 / 1400)
    assert np.isnan(frame.loc["aten::mul", ("fused", "time_us")])
    assert frame.attrs["aten_calls"] == {"naive": 3, "fused": 3} and frame.attrs["n"] == {"naive": 1, "fused": 1}
    # One sample each: a ratio, but no interval, and the verdict says why.
    assert frame.loc[TOTAL, ("fused", "verdict")] == "too few samples"
    assert np.isnan(frame.loc[TOTAL, ("fused", "ratio_low")])
    assert frame.loc[TOTAL, ("fused", "ratio")] == pytest.approx(1400 / 2400)
    assert (frame.loc["aten::mul", ("fused", "verdict")], frame.loc["aten::rms_norm", ("fused", "verdict")]) == ("gone", "new")


def test_an_op_only_a_third_run_has_is_neither_gone_nor_new_in_the_others():
    frame = compare([profile_of("naive", {"aten::mul": 2355.0}), profile_of("fused", {"aten::rms_norm": 1400.0}),
                     profile_of("compiled", {"Torch-Compiled Region": 900.0})], baseline="naive")  # fmt: skip
    verdicts = {op: tuple(frame.loc[op, (run, "verdict")] for run in ("fused", "compiled")) for op in frame.index}
    assert verdicts["aten::mul"] == ("gone", "gone")
    assert verdicts["aten::rms_norm"] == ("new", "-")
    assert verdicts["Torch-Compiled Region"] == ("-", "new")


def test_an_old_run_counts_per_step_by_its_active_steps():
    old = profile_of("old", {"x": 300.0})
    old = RunProfile(old.label, old.run_id, old.step, old.ops, {**old.totals, "active_steps": 3, "aten_calls": 6},
                     "neuron", "present")
    frame = compare([old])
    assert frame.loc["x", ("old", "time_us")] == 100.0 and frame.attrs["aten_calls"] == {"old": 2}


def test_runs_whose_per_op_samples_are_cycle_averages_keep_per_step_totals():
    # Samples from metrics (steps.json gone): one per-op sample per cycle, totals per step.
    def run(label, scale):
        samples = pd.DataFrame([{"cycle": c, "step": c - 1, "name": "k", "calls": 1.0, "self_device_time_us": 50.0 * scale * (1 + (c == 10) * 0.04),
                                 "self_cpu_time_us": 1.0} for c in (5, 10)])  # fmt: skip
        totals = pd.DataFrame([{"cycle": c, "step": s, "self_device_time_us": 50.0 * scale * j, "self_cpu_time_us": 1.0,
                                "aten_calls": 1.0} for c in (5, 10) for s, j in zip(range(c - 5, c), JITTER)])  # fmt: skip
        return RunProfile(label, label, 10, samples.assign(kind="op"), {}, "neuron", "present",
                          samples=samples, step_totals=totals, source="metrics")  # fmt: skip

    frame = compare([run("a", 1.0), run("b", 1.5)], skip_steps=1)
    assert frame.loc["k", ("b", "time_us")] == pytest.approx(76.5) and frame.loc["k", ("b", "n")] == 2  # not diluted by zeros
    assert frame.loc[TOTAL, ("b", "n")] == 9 and frame.loc[TOTAL, ("b", "verdict")] == "slower"
    assert frame.loc["k", ("b", "verdict")] == "too few samples"
    assert frame.attrs["op_sample_steps"]["b"] == [[5, 4], [10, 9]] and len(frame.attrs["sample_steps"]["b"]) == 9


def test_a_run_without_device_time_switches_every_run_to_cpu_time_and_says_so():
    frame = compare([profile_of("a", {"x": 100.0}), profile_of("b", {"x": 50.0}, device_time="missing")])
    assert frame.attrs["metric"] == "self_cpu_time_us"
    assert "no device time in b" in frame.attrs["fallback"]
    assert frame.loc["x", ("a", "time_us")] == 10.0  # CPU numbers for both runs, never mixed


def test_verdicts_faster_slower_and_no_change_come_from_the_interval():
    frame = compare([jittery("base"), jittery("slow", 1.5), jittery("fast", 0.6), jittery("same", 1.01)])
    verdicts = {run: frame.loc["aten::mul", (run, "verdict")] for run in ("slow", "fast", "same")}
    assert verdicts == {"slow": "slower", "fast": "faster", "same": "no change"}
    low, high = frame.loc["aten::mul", ("slow", "ratio_low")], frame.loc["aten::mul", ("slow", "ratio_high")]
    assert 1.0 < low < 1.5 < high and frame.loc["aten::mul", ("slow", "time_us")] == pytest.approx(150 * 1.01)
    assert frame.loc["aten::add", ("slow", "verdict")] == "no change"  # add did not change at all
    assert frame.attrs["verdicts"] == {"slow": "slower", "fast": "faster", "same": "no change"}


def test_deterministic_samples_compare_exactly_and_noise_pct_sets_what_counts_as_a_change():
    base = stepped("base", {"k": [40.0, 40.0]})
    frame = compare([base, stepped("new", {"k": [40.6, 40.6]})])  # +1.5%, no spread
    assert frame.loc["k", ("new", "ratio_low")] == frame.loc["k", ("new", "ratio_high")] == pytest.approx(1.015)
    assert frame.loc["k", ("new", "verdict")] == "no change"  # under the default 2%
    assert compare([base, stepped("new", {"k": [40.6, 40.6]})], noise_pct=1).loc["k", ("new", "verdict")] == "slower"
    slower = regressions(compare([base, stepped("new", {"k": [48.0, 48.0]})]), 10)
    assert {(r.op, round(r.ratio_low, 6)) for r in slower} == {("k", 1.2), (TOTAL, 1.2)}


def test_too_few_samples_for_an_interval_are_never_a_regression():
    frame = compare([stepped("a", {"k": [10.0, 11.0, 12.0]}), stepped("b", {"k": [30.0, 31.0, 32.0]})])
    assert frame.loc["k", ("b", "verdict")] == "too few samples" and regressions(frame, 10) == []
    assert [(r.run, r.op) for r in unchecked(frame)] == [("b", "k"), ("b", TOTAL)]


def test_skip_steps_leaves_out_each_runs_first_steps():
    warm = jittery("warm")
    warm.samples.loc[warm.samples["step"] == 10, "self_device_time_us"] *= 50  # a cold first step
    cold = compare([jittery("base"), warm])
    skipped = compare([jittery("base"), warm], skip_steps=1)
    assert cold.attrs["n"]["warm"] == 10 and skipped.attrs["n"]["warm"] == 9
    assert any(o["run"] == "warm" and o["step"] == 10 for o in cold.attrs["outliers"])
    assert not any(o["run"] == "warm" for o in skipped.attrs["outliers"])
    with pytest.raises(ValueError, match="skip_steps=10 leaves no samples of run base"):
        compare([jittery("base")], skip_steps=10)


def test_the_gate_fails_only_when_the_whole_interval_is_above_the_threshold():
    wide = stepped("wide", {"k": [60.0, 160.0, 70.0, 150.0, 80.0, 140.0, 90.0, 130.0, 125.0, 135.0]})
    frame = compare([jittery("base"), wide])  # the median is ~+25%, but the interval spans 1.0
    assert frame.loc[TOTAL, ("wide", "ratio")] > 1.1 and frame.loc[TOTAL, ("wide", "ratio_low")] < 1.0
    assert regressions(frame, 10) == []
    tight = compare([jittery("base"), jittery("slow", 1.5)])
    found = {r.op: r for r in regressions(tight, 20)}
    assert set(found) == {"aten::mul", TOTAL}
    assert found[TOTAL].ratio_low > 1.2 and found[TOTAL].ratio_low <= found[TOTAL].ratio <= found[TOTAL].ratio_high
    assert set(r.op for r in regressions(tight, 20, min_us=200)) == {TOTAL}  # the total is always checked


def test_a_stalled_step_is_named_and_does_not_flip_the_answer():
    frame = compare([jittery("base"), jittery("stalled", stall_step=4)])
    named = [o for o in frame.attrs["outliers"] if o["op"] == "aten::mul"]
    assert named == [{"run": "stalled", "op": "aten::mul", "cycle": 1, "cycle_index": 1, "cycles": 2, "step": 14,
                      "value_us": 7760.0, "median_us": 103.5, "times_median": 74.98}]  # fmt: skip
    assert frame.loc["aten::mul", ("stalled", "verdict")] == "no change"  # the mean would say +7600%
    assert frame.loc["aten::mul", ("stalled", "outliers")] == 1
    text = render.text(frame)
    # the cycle by its place among the run's cycles, and the folder it was logged in
    assert "stalled step 14 (cycle 1 of 2, profiler/step_1) aten::mul: 7,760.000 us, 74.98x its median 103.500 us" in text
    # the count under the outliers says what it counts: samples of any row (the stall is in aten::mul and the total)
    assert "outliers, samples of any row (base 0, stalled 2; in the medians" in text
    json.dumps(frame.attrs)  # the attrs travel as JSON


def test_the_verdict_sentence_is_deterministic_and_names_the_op_behind_the_change():
    naive = stepped("naive", {"aten::mul": [100.0] * 4, "aten::add": [10.0] * 4,
                              "## Call CompiledFxGraph f7xpqz2hash0123456789abcdefghijklmnopqrstuvwxyz012345 ##": [50.0] * 4})
    fused = stepped("fused", {"aten::mul": [60.0] * 4, "aten::add": [10.0] * 4}, aten_calls=1)
    sentence = compare([naive, fused]).attrs["sentences"]["fused"]
    # 160 -> 70 us; the compiled-graph range moved most (-50) but is a wrapper: aten::mul (-40) is named
    assert sentence == ("fused vs naive: faster, self device time \u221256% (exact: no spread in either run), "
                        "5 fewer ATen calls per step; aten::mul accounts for 44% of the change.")  # fmt: skip
    slow = compare([jittery("base"), jittery("slow", 1.5)]).attrs["sentences"]["slow"]
    assert slow.startswith("slow vs base: slower, self device time +4") and "(95% CI +" in slow
    assert slow == compare([jittery("base"), jittery("slow", 1.5)]).attrs["sentences"]["slow"]
    few = compare([profile_of("a", {"x": 10.0}), profile_of("b", {"x": 12.0})]).attrs["sentences"]["b"]
    assert few == "b vs a: too few samples, self device time +20% (n 1 vs 1: no 95% interval), same ATen calls per step (3); x accounts for 100% of the change."


def test_generated_names_are_shortened_for_people_and_kept_whole_in_csv_and_json():
    hashed = "## Call CompiledFxGraph f7xpqz2hash0123456789abcdefghijklmnopqrstuvwxyz012345 ##"
    assert short_name(hashed) == "CompiledFxGraph f7xp…"
    assert short_name("aten::_scaled_dot_product_flash_attention") == "aten::_scaled_dot_product_flash_attention"
    frame = compare([stepped("a", {hashed: [146.30600000000004] * 4}), stepped("b", {hashed: [150.0] * 4})])
    assert "CompiledFxGraph f7xp…" in render.text(frame) and hashed not in render.text(frame)
    csv_text = render.csv(frame)
    assert hashed in csv_text and "146.306," in csv_text and "146.30600000000004" not in csv_text
    assert ",4,0," in csv_text  # n and outliers as integers
    assert json.loads(render.as_json(frame))["rows"][0]["op"] == hashed


def test_tables_show_medians_intervals_verdicts_n_outliers_and_integer_aten_calls():
    frame = compare([jittery("base"), jittery("slow", 1.5, stall_step=2)])
    lines = render.text(frame).splitlines()
    assert "slow ratio (95% CI)" in lines[1] and "slow verdict" in lines[1]
    assert any(line.startswith("aten::mul") and "slower" in line and "[" in line for line in lines)
    assert any(line.split()[:4] == ["n", "(steps)", "10", "10"] for line in lines)
    assert any(line.split()[:5] == ["ATen", "calls", "per", "step", "6"] for line in lines)
    # the table's row counts the total's outlier steps, under the steps it is counted in
    assert any(line.split()[:5] == ["outlier", "steps", "(TOTAL)", "0", "1"] for line in lines)
    assert lines[-1].startswith("slow vs base: slower")
    assert "| `TOTAL` |" in render.markdown(frame) and "slow vs base: slower" in render.markdown(frame)


def test_the_first_top_ops_are_shown():
    frame = compare([stepped("a", {f"op{i}": [float(10 - i)] * 4 for i in range(6)})])
    shown = render.table(frame, top=2)
    assert list(shown.index[:3]) == ["op0", "op1", TOTAL]


def test_renderings_are_self_contained_and_show_samples_and_outliers(tmp_path):
    frame = compare([jittery("naive"), jittery("fused", 0.6, stall_step=3)])
    chart = render.png(frame, tmp_path / "c.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert frame.attrs["samples"]["fused"]["aten::mul"][3] == pytest.approx(0.6 * 100 * 1.05 * 80)
    page = render.html_page(frame, chart)
    assert "data:image/png;base64," in page and "fused vs naive: faster" in page
    assert "fused step 13 (cycle 1 of 2, profiler/step_1) aten::mul" in page and "How to read this" in page
    assert "src=\"http" not in page and "href=" not in page and "<script" not in page


def test_the_chart_gives_each_op_the_rows_of_its_runs_its_label_between_them_and_keeps_points_in_its_band():
    import matplotlib.pyplot as plt

    from mlflow_neuron._report import chart

    def scaled(scale, stall_step=None):
        return [scale * j * (40 if k == stall_step else 1) for k, j in enumerate(JITTER)]

    frame = compare([stepped("naive", {"aten::mul": scaled(300), "aten::pow": scaled(80), "aten::add": scaled(40)}),
                     stepped("fused", {"aten::mul": scaled(180, stall_step=4), "fused_kernel": scaled(150),
                                       "aten::add": scaled(38)}),
                     stepped("compiled", {"aten::mul": scaled(120), "fused_kernel": scaled(140), "graph": scaled(60)})],
                    baseline="naive")  # fmt: skip
    fig = chart.figure(frame, "title")
    fig.canvas.draw()
    left, right = fig.axes
    bars = {line.get_gid(): float(np.mean(line.get_ydata())) for line in left.lines if line.get_gid()}  # medians
    rows: dict[str, dict[str, float]] = {}
    for gid, y in bars.items():
        run, op = gid.split(": ", 1)
        rows.setdefault(op, {})[run] = y
    ticks = dict(zip([t.get_text() for t in left.get_yticklabels()], left.get_yticks()))
    assert list(ticks) == [TOTAL, "aten::mul", "fused_kernel", "aten::pow", "graph", "aten::add"]
    for op, tick in ticks.items():  # every label has rows: one per run that has the op, none for the others
        assert set(rows[op]) == {run for run in frame.attrs["runs"] if frame.attrs["samples"][run].get(op)}
        assert tick == pytest.approx((min(rows[op].values()) + max(rows[op].values())) / 2)
    assert set(rows["graph"]) == {"compiled"} and set(rows["aten::pow"]) == {"naive"}
    bands = {op: (min(ys.values()) - 0.5, max(ys.values()) + 0.5) for op, ys in rows.items()}
    assert all(high < next_low for (_, high), (next_low, _) in pairwise(sorted(bands.values())))  # bands apart
    points = [(c.get_gid(), y) for ax in (left, right) for c in ax.collections if c.get_gid() for _, y in c.get_offsets()]
    assert len(points) > 3 * 10 * 2
    for gid, y in points:  # strip points, zeros, outlier marks and ratio points
        low, high = bands[gid.split(": ", 1)[1]]
        assert low < y < high, (gid, y)
    marks = [text for text in left.texts if text.get_gid()]
    assert {text.get_gid() for text in marks} == {"fused: aten::mul", f"fused: {TOTAL}"}
    for text in marks:  # the outlier's label, as drawn, within its op's band
        low, high = sorted(left.transData.transform([(1, y) for y in bands[text.get_gid().split(": ", 1)[1]]])[:, 1])
        extent = text.get_window_extent()
        assert low <= extent.y0 and extent.y1 <= high and text.get_text().startswith("step 14: ")
    plt.close(fig)


def test_wrappers_are_never_named_as_the_op_behind_a_change():
    ops = pd.DataFrame({"name": ["ProfilerStep#3", "aten::mm", "my_block", "## Call CompiledFxGraph x ##"],
                        "annotation": [None, False, True, False]})  # fmt: skip
    assert wrapper_names(ops) == {"ProfilerStep#3", "my_block", "## Call CompiledFxGraph x ##"}
    assert is_wrapper("## Call CompiledFxGraph abc ##") and is_wrapper("Torch-Compiled Region: 0/0")
    assert not is_wrapper("aten::mul")
    frame = compare([stepped("a", {"Torch-Compiled Region: 0/0": [500.0] * 4, "aten::mm": [50.0] * 4}),
                     stepped("b", {"Torch-Compiled Region: 0/0": [900.0] * 4, "aten::mm": [60.0] * 4})])
    assert top_ops(frame, "b") == ["aten::mm"]
    assert {r.op for r in regressions(frame, 10)} == {"aten::mm", TOTAL}  # the region is in the TOTAL
    assert "aten::mm accounts for 2% of the change" in frame.attrs["sentences"]["b"]


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="metric must be one of"):
        compare([profile_of("a", {"x": 1.0})], metric="wall_time")
    with pytest.raises(ValueError, match="baseline 'zzz' is not among"):
        compare([profile_of("a", {"x": 1.0})], baseline="zzz")


@pytest.mark.parametrize("argv, message", [
    (["compare", "--top", "-3"], "argument --top: expected an integer >= 1, got '-3'"),
    (["compare", "--fail-if-slower", "-5"], "argument --fail-if-slower: expected a number >= 0, got '-5'"),
    (["compare", "--skip-steps", "two"], "argument --skip-steps: expected an integer >= 0, got 'two'"),
    (["compare", "--noise-pct", "nan"], "argument --noise-pct: expected a number >= 0, got 'nan'"),
    (["compare", "--min-time-us", "-1"], "argument --min-time-us: expected a number >= 0"),
    (["annotate", "--model", "m", "--version", "1", "--run", "r", "--step", "-1"], "argument --step: expected"),
])  # fmt: skip
def test_bad_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_the_cli_gate_prints_the_interval_and_exits_1_on_a_proven_regression(tracking_uri, monkeypatch, capsys):
    # tracking_uri: the client the command makes opens a store in tmp_path, not ./mlflow.db
    import mlflow_neuron._report.comparison as loading

    profiles = [jittery("base"), jittery("slow", 1.5)]
    monkeypatch.setattr(loading, "resolve_runs", lambda client, names, experiment: names)
    monkeypatch.setattr(loading, "load_profiles", lambda client, names, step=None: profiles)
    monkeypatch.setattr(loading, "rank_changes", lambda client, names, baseline, step=None: ({}, {}))
    assert cli_main(["compare", "--runs", "base", "slow", "--fail-if-slower", "10"]) == 1
    out = capsys.readouterr().out
    gate = [line for line in out.splitlines() if line.startswith("REGRESSION slow: TOTAL")]
    assert len(gate) == 1 and "median 111.05 -> 161.55 us, ratio 1.45 (95% CI 1.36\u20131.55)" in gate[0]
    assert gate[0].endswith("> +10% vs base")
    assert cli_main(["compare", "--runs", "base", "slow", "--fail-if-slower", "60"]) == 0
    assert "no op or total is proven more than 60% slower than base" in capsys.readouterr().out


# -- real runs ------------------------------------------------------------------------------------


@pytest.fixture
def variants(tracking_uri):
    """Three profiled runs under a parent, the way the example logs them, plus a slow one apart."""
    from mlflow_neuron import MLflowProfilerCallback

    experiment_id = mlflow.create_experiment("variants")
    mlflow.set_experiment(experiment_id=experiment_id)
    ids = {}
    with mlflow.start_run(run_name="parent") as parent:
        for name in ("base", "again"):
            with mlflow.start_run(run_name=name, nested=True) as run:
                profile_rmsnorm(MLflowProfilerCallback(strict=True))
                ids[name] = run.info.run_id
    with mlflow.start_run(run_name="slow") as run:
        from workloads import rms_norm_naive
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        x, w = torch.randn(64, 65536), torch.ones(65536)
        callback = MLflowProfilerCallback(strict=True)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=2, warmup=1, active=1),
                     on_trace_ready=callback) as prof:
            for _ in range(4):
                rms_norm_naive(x, w)
                prof.step()
        ids["slow"] = run.info.run_id
    ids["parent"] = parent.info.run_id
    return ids


def test_a_mistyped_experiment_name_gets_the_closest_names_as_a_hint(tracking_uri):
    from mlflow_neuron._readback.runs import RunNotFound

    for name in ("rmsnorm-variants", "rmsnorm-sweep", "layernorm-variants", "unrelated"):
        mlflow.create_experiment(name)
    with pytest.raises(RunNotFound) as typo:
        compare_runs("rmsnorm-variant")
    message = str(typo.value)
    assert message.startswith(f"no experiment named 'rmsnorm-variant' at {tracking_uri}; did you mean 'rmsnorm-variants'")
    assert message.endswith("?") and "unrelated" not in message
    with pytest.raises(RunNotFound) as nothing_close:
        compare_runs(["a-run"], experiment="qqqqqqq")
    assert str(nothing_close.value) == f"no experiment named 'qqqqqqq' at {tracking_uri}"


def test_runs_are_found_by_experiment_parent_name_and_id(variants):
    by_experiment = compare_runs("variants")
    assert list(by_experiment.attrs["runs"]) == ["base", "again"]  # the latest parent's children
    by_parent = compare_runs(["parent"], experiment="variants")
    assert by_parent.attrs["runs"] == by_experiment.attrs["runs"]
    by_mixed = compare_runs([variants["slow"], "base"], baseline="base", experiment="variants")
    assert list(by_mixed.attrs["runs"]) == ["slow", "base"] and by_mixed.attrs["baseline"] == "base"
    assert by_mixed.attrs["metric"] == "self_cpu_time_us" and "aten::mul" in by_mixed.index


def test_the_cli_gate_on_single_sample_runs_says_it_cannot_check_them(variants, capsys):
    # One profiled step per run (the fixture's schedule): no 95% interval exists, so the gate may
    # not fail, and it says which rows it could not check instead of passing in silence.
    slower = ["compare", "--experiment", "variants", "--runs", "base", "slow", "--baseline", "base"]
    assert cli_main([*slower, "--fail-if-slower", "50"]) == 0
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("NOT CHECKED")]
    assert line.startswith("NOT CHECKED slow: ") and "1 vs 1 samples, too few for a 95% interval (TOTAL point ratio" in line
    assert "REGRESSION" not in out
    assert "slow vs base: too few samples, self CPU time +" in out
    assert cli_main(["compare", "--experiment", "variants", "--runs", "nobody"]) == 2
    assert "no run named 'nobody'" in capsys.readouterr().err
    assert cli_main(["compare", "--runs", "0123456789abcdef0123456789abcdef"]) == 2
    assert "no such run: 0123456789abcdef0123456789abcdef" in capsys.readouterr().err


def test_formats_and_log_to_attach_table_png_and_html(variants, capsys, tmp_path):
    assert cli_main(["compare", "--experiment", "variants", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("op,base/time_us")
    assert cli_main(["compare", "--experiment", "variants", "--format", "json", "--log-to", variants["parent"]]) == 0
    assert json.loads(capsys.readouterr().out.split("\nattached")[0])["baseline"] == "base"
    client = MlflowClient()
    files = artifact_files(client, variants["parent"], "comparison")
    assert set(files) == {"comparison/ops.json", "comparison/comparison.png", "comparison/report.html"}
    tables = json.loads(client.get_run(variants["parent"]).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "comparison/ops.json", "type": "table"} in tables
    # Attaching again replaces the comparison instead of appending rows to it.
    assert cli_main(["compare", "--experiment", "variants", "--log-to", variants["parent"]]) == 0
    table = json.loads(open(client.download_artifacts(variants["parent"], "comparison/ops.json", str(tmp_path))).read())
    assert len(table["data"]) == len({row[0] for row in table["data"]})
    # The parent run's description carries the verdict in words, once, after the user's own text.
    client.set_tag(variants["parent"], "mlflow.note.content", "Variants of RMSNorm.")
    assert cli_main(["compare", "--experiment", "variants", "--log-to", variants["parent"]]) == 0
    assert cli_main(["compare", "--experiment", "variants", "--log-to", variants["parent"]]) == 0
    note = client.get_run(variants["parent"]).data.tags["mlflow.note.content"]
    assert note.startswith("Variants of RMSNorm.") and note.count("- again vs base: too few samples") == 1


def test_model_versions_carry_idempotent_performance_annotations(variants, capsys):
    from mlflow_neuron import annotate_model_version

    client = MlflowClient()
    client.create_registered_model("rmsnorm")
    v1 = client.create_model_version("rmsnorm", f"runs:/{variants['base']}/model", run_id=variants["base"],
                                      description="My notes about v1.")
    v2 = client.create_model_version("rmsnorm", f"runs:/{variants['slow']}/model", run_id=variants["slow"])
    tags = annotate_model_version("rmsnorm", v1.version, variants["base"])
    base_total = float(tags["perf.total_self_cpu_time_us"])
    assert tags["perf.device"] == "cpu" and tags["perf.aten_calls"] == "6"
    assert tags["perf.profile_run_id"] == variants["base"] and tags["perf.torch_version"].startswith("2.")
    assert float(tags["perf.total_self_cpu_time_us"]) > 0 and tags["perf.top_op"]
    first = client.get_model_version("rmsnorm", v1.version)
    assert first.description.startswith("My notes about v1.") and "| op | median self_cpu_time_us per step | calls per step |" in first.description
    assert cli_main(["annotate", "--model", "rmsnorm", "--version", str(v1.version), "--run", variants["base"]]) == 0
    assert "perf.aten_calls = 6" in capsys.readouterr().out
    again = client.get_model_version("rmsnorm", v1.version)
    assert again.description == first.description and again.tags == first.tags
    # Against a baseline: the verdict as a tag and in words.
    tags = annotate_model_version("rmsnorm", v2.version, variants["slow"], baseline_run_id=variants["base"])
    assert tags["perf.verdict"] == "too few samples" and tags["perf.baseline_run_id"] == variants["base"]
    # The ratio is the two recorded totals' (one step each), whatever the machine's load made them.
    ratio = float(tags["perf.ratio_vs_baseline"])
    assert ratio == pytest.approx(float(tags["perf.total_self_cpu_time_us"]) / base_total, rel=1e-3)
    sign = "+" if ratio > 1 else "-"
    assert f"slow vs base: too few samples, self CPU time {sign}" in client.get_model_version("rmsnorm", v2.version).description
    assert "perf.verdict" not in annotate_model_version("rmsnorm", v2.version, variants["slow"])
    assert "perf.verdict" not in client.get_model_version("rmsnorm", v2.version).tags
    # compare accepts the runs behind two versions
    frame = compare_runs([f"models:/rmsnorm/{v1.version}", f"models:/rmsnorm/{v2.version}"])
    assert list(frame.attrs["runs"].values()) == [variants["base"], variants["slow"]]


def test_the_description_stays_under_the_backend_limit():
    from mlflow_neuron._report.publish import BEGIN, END, with_block

    block = "\n".join([BEGIN, "title", "", "| op | t | calls |", "|---|---:|---:|"] + [f"| `op{i}` | 1 | 1 |" for i in range(500)] + [END])
    text = with_block("u" * 4000, block)
    assert len(text) <= 5000 and text.startswith("u" * 4000) and text.endswith(END)
    assert with_block(text, block) == text  # replaces its own block, never stacks a second one


@pytest.mark.parametrize("command", ["compare", "history"])
def test_the_format_option_says_what_each_format_is_for(command, capsys):
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--format {table,markdown,csv,json} table (default) or markdown for people;" in text


def test_the_bandwidth_lines_say_why_a_run_has_no_figure():
    """compare's "achieved bandwidth" names every run: with its GB/s, or with the reason it has none."""
    from mlflow_neuron._analysis.throughput import throughput, throughput_lines, throughput_missing

    def region_row(gbps, nbytes):
        return pd.DataFrame({"name": ["aten::mul", "rmsnorm"], "kind": ["op", "region"], "achieved_gbps": [1.0, gbps],
                             "bytes": [8.0, nbytes]})  # fmt: skip

    profiles = [
        RunProfile("naive", "a", 4, region_row(2.5, 100.0), {}),
        RunProfile("compiled", "b", 4, region_row(np.nan, np.nan), {}),  # an op inside without a formula
        RunProfile("idle", "c", 4, region_row(np.nan, 100.0), {}),  # bytes, but no time to divide by
        RunProfile("no_shapes", "d", 4, pd.DataFrame({"name": ["rmsnorm"], "kind": ["region"]}), {}),
        RunProfile("elsewhere", "e", 4, region_row(1.0, 8.0).assign(name=["aten::mul", "other"]), {}),
    ]
    lines = throughput_lines(throughput(profiles, "rmsnorm", []), "rmsnorm", throughput_missing(profiles, "rmsnorm"))
    assert lines == [
        "region rmsnorm: naive 2.5 GB/s",
        "compiled: none, the bytes of region rmsnorm are unknown: an op inside it has no traffic formula "
        "(a compiled graph's kernels, for one)",
        "idle: none, region rmsnorm took no measurable time in its last cycle",
        "no_shapes: none, no bytes in its ops.json (profiled without record_shapes=True)",
        "elsewhere: none, no region rmsnorm in its last cycle",
    ]
    assert throughput_missing(profiles[:1], None) == {}  # whole steps: naive's ops have figures
