"""`history` over many runs: run-level summaries logged at delivery, read in bulk, checked against
the tables where they are read. Series are one real profiled run (the callback, fake device, two
cycles) cloned (`nightly_series`): +30% from a chosen run on."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from nightly_series import ROOT, TESTS, Cloner, make_template
from servers import MlflowServer

from mlflow_neuron._readback import series as _series
from mlflow_neuron._report.history import history_runs
from mlflow_neuron._record.run_summary import RunSteps, summary_key
from mlflow_neuron._trace.profile import StepTotal, cycle_profile
from mlflow_neuron._trace.regions import RegionStep
from mlflow_neuron._trace.step_summary import summarize
from mlflow_neuron.cli import main as cli_main


@pytest.fixture(scope="module")
def template(fake_profiler, tmp_path_factory):
    return make_template(tmp_path_factory.mktemp("template"), fake_profiler)


@pytest.fixture(scope="module")
def store(template, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cloner = Cloner(template, uri, tmp / "artifacts")
    cloner.make("series", 30, slower_from=18, seed=1)
    cloner.make("old", 14, slower_from=7, summaries=False, seed=2)
    cloner.make("mixed", 8, seed=3, summaries=False)
    cloner.make("mixed", 8, slower=1.3, slower_from=0, seed=4, start_ms=1_800_000_000_000)
    cloner.make("lie", 20, slower_from=12, lie=11, seed=5)
    return uri


def _found(frame) -> list[tuple[str, str, str]]:
    return [(c["before_commit"], c["after_commit"], c["verdict"]) for c in frame.attrs["changes"]]


def test_the_callback_logs_a_summary_of_every_cycle(template):
    n_steps = template.history[summary_key("self_device_time_us", "n_steps")]
    assert [value for value, _, _ in n_steps] == [10.0, 20.0]  # after cycle 1, then over both cycles
    assert summary_key("region_cpu_time_us", "median", "block") in template.history


def test_a_summary_covers_cycles_prepared_by_other_processes():
    def cycle(steps: range, device_us: float):
        totals = tuple(StepTotal(s, device_us + s, 2 * device_us, 3) for s in steps)
        regions = tuple(RegionStep(s, "block", 1, device_us, 2 * device_us, 1) for s in steps)
        return cycle_profile("neuron", True, [], total_device_us=0, total_cpu_us=0, attributed_us=0, aten_calls=0,
                             steps_seen=len(steps), event_count=0, step_totals=totals, regions=regions)  # fmt: skip

    first, second = RunSteps(), RunSteps()
    first.add(7, cycle(range(2, 7), 100.0))
    second.absorb(first.export())  # what the outbox's run file carries from one preparer to the next
    second.add(14, cycle(range(9, 14), 200.0))
    metrics = second.metrics()
    expected = summarize([100.0 + s for s in range(2, 7)] + [200.0 + s for s in range(9, 14)])
    assert metrics[summary_key("self_device_time_us", "n_steps")] == 10
    assert metrics[summary_key("self_device_time_us", "median")] == expected.median
    assert metrics[summary_key("self_device_time_us", "geomean")] == pytest.approx(np.exp(expected.level), abs=0.001)
    assert metrics[summary_key("region_device_time_us", "median", "block")] == 150.0


def test_a_summary_kept_as_steps_come_is_the_summary_of_every_step_held():
    """The columns `RunSteps` keeps as cycles come (adds, other preparers' steps, a cycle prepared
    again with other regions) give what summarizing every step held from scratch gives."""
    from mlflow_neuron._record.run_summary import MAX_REGIONS, _numbers
    from mlflow_neuron._record.model import REGION_METRICS, STEP_METRICS

    def from_scratch(held: RunSteps) -> dict:
        steps, found = list(held.steps.values()), {}
        for index in (0, 1):
            found.update(_numbers([s["total"][index] for s in steps], STEP_METRICS[index], None))
        cpu = {}
        for step in steps:
            for name, times in step["regions"].items():
                cpu[name] = cpu.get(name, 0.0) + times[1]
        for name in sorted(cpu, key=lambda n: (-cpu[n], n))[:MAX_REGIONS]:
            for index in (0, 1):
                values = [s["regions"].get(name, (0.0, 0.0))[index] for s in steps]
                found.update(_numbers(values, REGION_METRICS[index], name))
        return found

    rng = np.random.default_rng(7)

    def cycle(first: int, names: list[str]):
        steps = range(first, first + 3)
        totals = tuple(StepTotal(s, float(rng.uniform(50, 60)), float(rng.uniform(80, 90)), 3) for s in steps)
        regions = tuple(RegionStep(s, name, 1, float(rng.uniform(1, 9)), float(rng.uniform(1, 9)), 1)
                        for s in steps for name in names if rng.random() < 0.8)  # fmt: skip
        return cycle_profile("neuron", True, [], total_device_us=0, total_cpu_us=0, attributed_us=0, aten_calls=0,
                             steps_seen=3, event_count=0, step_totals=totals, regions=regions)  # fmt: skip

    names = [f"layer_{k}" for k in range(25)]  # more than MAX_REGIONS: which ones get a summary matters
    mine, other = RunSteps(), RunSteps()
    for c in range(40):
        (mine if c % 3 else other).add(c, cycle(3 * c, names[: 5 + c % 21]))
        if c % 7 == 6:
            mine.absorb(other.export())
            assert mine.metrics() == from_scratch(mine)
    mine.add(4, cycle(12, names[20:]))  # cycle 4 prepared again, by a process that read other regions
    mine.absorb(other.export())
    assert len(mine.steps) == 120 and mine.metrics() == from_scratch(mine)
    assert other.metrics() == from_scratch(other)


def test_summaries_find_the_change_at_the_commit_the_tables_find(store):
    fast = history_runs("series", tracking_uri=store)
    slow = history_runs("series", tracking_uri=store, summaries=False)
    assert _found(fast) == _found(slow) == [("c0017", "c0018", "slower")]
    assert fast.attrs["slow_path_runs"] == 0 and slow.attrs["slow_path_runs"] == 30
    assert fast.attrs["tables_read"] < 30 and fast.attrs["contradicting"] == []
    assert np.allclose(fast["median"], slow["median"]) and list(fast["n"]) == list(slow["n"]) == [20] * 30
    assert fast.attrs["changes"][0]["ratio_low"] > 1.2
    region = history_runs("series", tracking_uri=store, region="block")
    assert _found(region) == [("c0017", "c0018", "slower")] and region.attrs["slow_path_runs"] == 0


def test_runs_without_summaries_take_the_slow_path_and_are_counted(store, capsys):
    old = history_runs("old", tracking_uri=store)
    assert _found(old) == [("c0006", "c0007", "slower")] and old.attrs["slow_path_runs"] == 14
    mixed = history_runs("mixed", tracking_uri=store)
    assert mixed.attrs["slow_path_runs"] == 8 and _found(mixed) == [("c0007", "c0000", "slower")]
    assert cli_main(["history", "--tracking-uri", store, "--experiment", "mixed"]) == 0
    assert "8 of 16 runs have no summary metrics" in capsys.readouterr().out


def test_a_summary_its_tables_contradict_is_named_and_the_tables_win(store, capsys):
    frame = history_runs("lie", tracking_uri=store)
    [liar] = frame.attrs["contradicting"]
    row = frame[frame["run_id"] == liar["run_id"]].iloc[0]
    assert row["commit"] == "c0011" and liar["summary"]["median"] == pytest.approx(2 * liar["tables"]["median"], abs=0.002)
    assert row["median"] == pytest.approx(liar["tables"]["median"])
    assert _found(frame) == [("c0011", "c0012", "slower")]
    assert cli_main(["history", "--tracking-uri", store, "--experiment", "lie"]) == 0
    assert f"({liar['run_id'][:8]}): its summary metrics" in capsys.readouterr().out


def test_many_runs_get_a_progress_line(store, monkeypatch):
    monkeypatch.setattr(_series, "PAGE_SIZE", 10)
    lines = []
    frame = history_runs("series", tracking_uri=store, progress=lines.append)
    assert len(frame) == 30 and lines == ["history: 10 runs read, 10 of them profiled; reading more",
                                          "history: 20 runs read, 20 of them profiled; reading more"]  # fmt: skip


def test_a_server_that_dies_halfway_exits_3_with_one_line(template, tmp_path):
    server = MlflowServer(tmp_path / "server")
    Cloner(template, server.backend_store_uri, server.artifacts_dir, "mlflow-artifacts:").make("old", 60, summaries=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    with server.start():
        command = [sys.executable, "-m", "mlflow_neuron.cli", "history", "--tracking-uri", server.uri, "--experiment", "old"]
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = process.stderr.readline()
        assert "reading their tables (the slow path)" in first, first
        server.kill()  # halfway: the runs are found, their tables are being read
        out, err = process.communicate(timeout=120)
    lines = [line for line in err.splitlines() if not line.startswith("history: tables of")]
    assert process.returncode == 3, err
    assert len(lines) == 1 and lines[0].startswith("mlflow-neuron history: error: the tracking server did not answer")
    assert "Traceback" not in err and out == ""
