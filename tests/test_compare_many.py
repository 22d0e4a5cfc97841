"""`compare` of many runs: every run's row from its summary metrics, tables only for the runs shown
in detail, the gate only on those. Runs are one real profiled run (the callback, fake device, two
cycles of 10 steps) cloned (`nightly_series`), +30% from a chosen run on."""

from __future__ import annotations

import json

import pytest
from nightly_series import Cloner, make_template

from mlflow_neuron import compare_runs, render
from mlflow_neuron._analysis.model import SLOWER, TOO_FEW_CYCLES, TOTAL
from mlflow_neuron._analysis.overview import BULK_ABOVE, DETAIL_AT_MOST, choose, overview_rows
from mlflow_neuron._trace.step_summary import StepSummary
from mlflow_neuron.cli import main as cli_main

SLOW = ["v09", "v10", "v11"]  # +30%


@pytest.fixture(scope="module")
def store(fake_profiler, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("many")
    template = make_template(tmp / "template", fake_profiler)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cloner = Cloner(template, uri, tmp / "artifacts")
    cloner.make("variants", 12, run_name="v{i:02d}", slower_from=9, seed=1)
    cloner.make("old", 12, run_name="v{i:02d}", slower_from=9, seed=2, summaries=False)
    cloner.make("mixed", 6, run_name="a{i:02d}", seed=3)
    cloner.make("mixed", 6, run_name="b{i:02d}", slower_from=3, seed=4, summaries=False, start_ms=1_800_000_000_000)
    cloner.make("lie", 12, run_name="v{i:02d}", lie=4, seed=5)
    cloner.make("few", 3, run_name="v{i:02d}", slower_from=2, seed=6)
    return uri


def _found(frame, slow: list[str]) -> None:
    """The +30% runs are shown in detail and found: slower, or, where a run's two cycles differ beyond the
    noise between its steps, too few cycles to say, with the ratio there; no other run is called slower."""
    verdicts = frame.attrs["verdicts"]
    assert set(slow) <= set(verdicts) and {run for run, v in verdicts.items() if v == SLOWER} <= set(slow)
    assert all(verdicts[run] in (SLOWER, TOO_FEW_CYCLES) and frame.loc[TOTAL, (run, "ratio")] > 1.2 for run in slow)
    assert sum(verdicts[run] == SLOWER for run in slow) >= len(slow) - 1


def test_many_runs_read_tables_only_for_the_runs_shown_in_detail(store):
    frame = compare_runs("variants", baseline="v00", tracking_uri=store)
    many = frame.attrs["many"]
    assert len(many["rows"]) == 12 > BULK_ABOVE
    largest = [run for run, why in many["why"].items() if why == "largest"]  # fill the 5: 2 that moved most
    assert len(largest) == DETAIL_AT_MOST - len(SLOW) and not set(largest) & set(SLOW)
    assert many["detailed"] == list(frame.attrs["runs"]) == ["v00", *sorted(SLOW + largest)]
    assert many["tables_read"] == 1 + DETAIL_AT_MOST and many["slow_path_runs"] == 0 and many["contradicting"] == []
    _found(frame, SLOW)
    assert sorted(many["differing"]) == SLOW
    assert many["why"] == {"v00": "baseline", **dict.fromkeys(SLOW, "differs"), **dict.fromkeys(largest, "largest")}
    rows = {r["run"]: r for r in many["rows"]}
    assert all(rows[run]["ratio_low"] > 1.1 for run in SLOW) and all(r["from"] == "summary metrics" for r in rows.values())
    text = render.text(frame)
    assert text.startswith("every run (12), from its run-level numbers: median self device time per step (us)")
    assert "in detail below (6 of 12 runs; their per-step samples loaded, the only runs the gate judges): " \
           f"v00, {', '.join(sorted(SLOW + largest))}" in text  # fmt: skip
    assert "ratio of medians" in text and "v09 vs v00: " in text
    json.loads(render.as_json(frame))  # every attr JSON-ready


def test_a_run_named_with_detail_is_shown_and_tables_reads_every_run(store):
    frame = compare_runs("variants", baseline="v00", tracking_uri=store, detail=["v03"])
    assert frame.attrs["many"]["why"]["v03"] == "named" and frame.attrs["many"]["tables_read"] == 2 + DETAIL_AT_MOST
    assert "v03" in frame.attrs["runs"] and frame.attrs["verdicts"]["v03"] != "slower"
    full = compare_runs("variants", baseline="v00", tracking_uri=store, tables=True)
    assert "many" not in full.attrs and len(full.attrs["runs"]) == 12
    _found(full, SLOW)
    with pytest.raises(ValueError, match="--detail 'nope' is not among the compared runs"):
        compare_runs("variants", tracking_uri=store, detail=["nope"])


def test_runs_without_summaries_take_the_slow_path_and_are_counted(store):
    old = compare_runs("old", baseline="v00", tracking_uri=store)
    many = old.attrs["many"]
    assert many["slow_path_runs"] == 12 and many["tables_read"] == 12 and many["detailed"][0] == "v00"
    assert set(SLOW) <= set(many["detailed"]) and len(many["detailed"]) == 1 + DETAIL_AT_MOST
    _found(old, SLOW)
    assert "12 of 12 runs read from their tables (the slow path): no summary metrics" in render.text(old)
    mixed = compare_runs("mixed", baseline="a00", tracking_uri=store)
    many = mixed.attrs["many"]
    old_runs = {f"b{i:02d}" for i in range(6)}
    assert many["slow_path_runs"] == 6 and many["tables_read"] == len(old_runs | set(many["detailed"])) < 12
    assert {r["run"] for r in many["rows"] if r["from"] == "tables"} == {f"b{i:02d}" for i in range(6)}
    _found(mixed, ["b03", "b04", "b05"])


def test_a_summary_its_tables_contradict_is_named_and_the_tables_win(store):
    frame = compare_runs("lie", baseline="v00", tracking_uri=store, detail=["v04"])  # its summary says x2
    many = frame.attrs["many"]
    [liar] = many["contradicting"]
    assert liar["run_name"] == "v04" and "v04" in many["detailed"]
    row = next(r for r in many["rows"] if r["run"] == "v04")
    assert row["from"] == "tables" and row["median"] == pytest.approx(liar["tables"]["median"])
    assert frame.attrs["verdicts"]["v04"] != "slower"
    assert f"run v04 ({liar['run_id'][:8]}): its summary metrics" in render.text(frame)


def test_the_gate_judges_only_runs_shown_in_detail_and_says_which(store, capsys):
    argv = ["compare", "--tracking-uri", store, "--experiment", "variants", "--baseline", "v00", "--fail-if-slower", "10"]
    assert cli_main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    regressions = {line.split(":")[0].split()[1] for line in out if line.startswith("REGRESSION") and ": TOTAL" in line}
    frame = compare_runs("variants", baseline="v00", tracking_uri=store, fail_if_slower=10.0)
    assert regressions and regressions == {run for run, v in frame.attrs["verdicts"].items() if v == SLOWER} <= set(SLOW)
    [judged] = [line for line in out if line.startswith("JUDGED IN DETAIL")]
    [not_gated] = [line for line in out if line.startswith("NOT JUDGED IN DETAIL")]
    assert judged.startswith("JUDGED IN DETAIL") and "of 12 runs (per-step samples): v00, " in judged
    others = [r["run"] for r in frame.attrs["many"]["rows"] if r["run"] not in frame.attrs["runs"]]
    assert others and not_gated.startswith(f"NOT JUDGED IN DETAIL {len(others)} run(s), not gated (their run-level numbers")
    assert not_gated.endswith(": " + ", ".join(others)) and f"{len(frame.attrs['runs'])} of 12 runs" in judged
    assert cli_main([*argv[:-1], "60"]) == 0
    assert "among the runs judged in detail" in capsys.readouterr().out


def test_a_few_runs_compare_as_before(store, capsys):
    frame = compare_runs("few", baseline="v00", tracking_uri=store)
    assert "many" not in frame.attrs and list(frame.attrs["runs"]) == ["v00", "v01", "v02"]
    assert not render.text(frame).startswith("every run")


def test_the_largest_changes_are_shown_in_detail_and_the_gate_adds_what_it_could_fail_on():
    def summary(median, spread=0.02, n=20):
        return StepSummary(n, median, median * (1 - spread), median * (1 + spread), None)

    numbers = [summary(100.0), *(summary(100.0 * (1.1 + i / 10)) for i in range(8)), summary(100.0), summary(104.0, 0.05),
               StepSummary(3, 103.0, None, None, None)]  # fmt: skip
    labels = [f"r{i}" for i in range(len(numbers))]
    rows = overview_rows(numbers, labels, labels, ["summary metrics"] * len(labels), base=0)
    chosen = choose(rows, noise_pct=2.0, named={"r9"}, gate_pct=None)
    assert chosen.differing == [f"r{i}" for i in range(8, 0, -1)]  # the largest change first
    assert chosen.detailed == ["r0", "r4", "r5", "r6", "r7", "r8", "r9"] and len(chosen.detailed) == DETAIL_AT_MOST + 2
    assert chosen.not_shown == ["r3", "r2", "r1"] and chosen.why["r9"] == "named"
    gated = choose(rows, noise_pct=2.0, named=set(), gate_pct=5.0)
    # r10: 1.04 [0.95-1.09] might be over +5%; r11 has no interval: neither is ruled out by its summaries
    assert gated.why["r10"] == gated.why["r11"] == "gate" and "r9" not in gated.why
