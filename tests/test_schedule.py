"""`callback.schedule()`: a baseline, a capture when the step time changes, the step time between.

The rule alone on chosen step times, the schedule on a clock of its own (no sleeping), then real
`torch.profiler` loops into a real sqlite store: the issue's own loop, 600 sleep-based steps of
20 ms, each sleeping until its deadline. On a 2-core machine beside two busy processes (and other
work) a plain `sleep(0.02)` wakes one to three scheduler ticks (4 ms) late, for seconds at a time:
that loop's step time really changes (medians of 20 steps of 24, 28, 32 ms were seen), and the rule
is right to see it; 10 ms sleeps measured 10.3, then 12-16 ms. Deadlines keep the loop's step at
what the test means it to be.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import time
import warnings

import mlflow
import pytest
from conftest import read_json_artifact
from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity, profile

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._capture.adaptive import OPTIONS, AdaptiveSchedule
from mlflow_neuron._capture.step_times import REFERENCE_STEPS, ShiftRule, StepTimeLine
from mlflow_neuron._delivery.report import Reporter
from mlflow_neuron._record.capture_request import PLAN_TAG

MS = 1_000_000


def feed(rule: ShiftRule, times_ms: list[float]) -> list[tuple[int, str]]:
    """(step, reason) of each change the rule finds; the rule starts again after each, as the schedule does."""
    found = []
    for step, ms in enumerate(times_ms):
        shift = rule.add(step, int(ms * MS))
        if shift is not None:
            found.append((step, shift.reason()))
            rule.reset()
    return found


def default_rule() -> ShiftRule:
    """The rule with the schedule's defaults."""
    return ShiftRule(window=OPTIONS["window_steps"][0], persist=OPTIONS["persist_steps"][0],
                     min_change=OPTIONS["min_change"][0])


def noisy(ms: float, n: int, seed: int, spread: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [ms * (1 + rng.gauss(0, spread)) for _ in range(n)]


# -- the rule, on chosen numbers ---------------------------------------------------------------------


def test_a_sustained_shift_is_one_change_dated_at_its_first_step():
    times = noisy(20, 300, seed=1) + noisy(35, 300, seed=2)
    found = feed(default_rule(), times)
    assert len(found) == 1, found
    step, reason = found[0]
    assert 300 < step <= 320, found
    assert re.fullmatch(r"step time 20\.\d → 3[45]\.\d ms from step 300", reason), reason


def test_noise_a_10x_spike_and_a_burst_of_slow_steps_are_not_changes():
    times = noisy(20, 2000, seed=3, spread=0.1)
    times[700] = 200.0  # a checkpoint save
    times[1200:1209] = [70.0] * 9  # an evaluation's few steps: under half the window
    rule = default_rule()
    spikes = []
    for step, ms in enumerate(times):
        if rule.is_spike(int(ms * MS)):
            spikes.append(step)
        assert rule.add(step, int(ms * MS)) is None, (step, ms)
    assert spikes == [700, *range(1200, 1209)]


def test_a_hiccup_of_microsecond_steps_is_not_a_change_but_a_held_shift_is():
    quick = [0.011] * 1000 + [0.020] * 5000 + [0.011] * 2000  # 5,000 slow steps: 0.1 s
    assert feed(default_rule(), quick) == []
    held = [0.011] * 1000 + [0.020] * 20000  # 0.4 s
    assert [reason for _, reason in feed(default_rule(), held)] == [
        "step time 0.011 → 0.020 ms from step 1000"]


def test_the_reference_rolls_a_level_measured_while_busy_gives_way_without_a_change():
    # the first steps slow and spread (a helper starting), then quiet: no change where it eases
    busy = [2.0 + 3.0 * (i % 3 == 0) + 1.5 * (i % 5 == 0) for i in range(REFERENCE_STEPS + 40)]
    easing = [2.0 + 2.0 * max(0.0, 1 - i / 400) * (i % 3 == 0) for i in range(400)]
    assert feed(default_rule(), busy + easing + noisy(2.0, 300, seed=4)) == []


def test_the_line_is_a_median_of_50_steps_of_a_second_at_least_sent_every_10_s_and_at_close():
    now = [0.0]
    sent = []
    line = StepTimeLine(sent.append, every=50, flush_s=10.0, clock=lambda: now[0])
    for step in range(1, 1011):  # 1/32 s steps: 50 are over a second
        now[0] += 1 / 32
        line.add(step, (20 if step != 333 else 250) * MS, spike=step == 333)
    points = [p for batch in sent for p in batch]
    assert [(k, v, s) for k, v, s in points if k.endswith("spike_ms")] == [("profiler/step_time_spike_ms", 250.0, 333)]
    medians = [(v, s) for k, v, s in sent[0] if k == "profiler/step_time_ms"]
    assert medians == [(20.0, s) for s in range(50, 351, 50)]  # the first batch goes at 10 s
    assert [max(s for _, _, s in batch) for batch in sent] == [350, 700]
    line.close_point()  # the callback's close(): the last 10 steps are a point too
    line.flush()
    assert [max(s for _, _, s in batch) for batch in sent] == [350, 700, 1010]
    assert sent[-1][-1] == ("profiler/step_time_ms", 20.0, 1010)


# -- the schedule, on a clock of its own ---------------------------------------------------------------


def drive(schedule: AdaptiveSchedule, times_ms: list[float], first: int = 0, start_ns: int = 0) -> list[str]:
    """Calls `schedule` as torch does (step `first` when the profile is made, then once a step), the
    clock moving by each step's time; returns each step's action."""
    clock = [start_ns]
    schedule.clock = lambda: clock[0]
    actions = [schedule(first).name]
    for step, ms in enumerate(times_ms, start=first + 1):
        clock[0] += int(ms * MS)
        actions.append(schedule(step).name)
    return actions


def test_a_capture_is_a_warmup_step_then_6_profiled_steps_the_baseline_first():
    sent = []
    schedule = AdaptiveSchedule(Reporter(strict=True), sent.append)
    actions = drive(schedule, noisy(20, 300, seed=5) + noisy(35, 300, seed=6))
    capture = ["WARMUP", *["RECORD"] * 5, "RECORD_AND_SAVE"]
    assert actions[20:27] == capture and set(actions[:20]) == {"NONE"}
    assert [(c.reason, c.first_step, c.last_step) for c in schedule.captures][0] == ("baseline", 20, 26)
    assert len(schedule.captures) == 2 and 300 < schedule.captures[1].first_step <= 320
    first = schedule.captures[1].first_step
    assert actions[first:first + 7] == capture
    assert {i for i, a in enumerate(actions) if a != "NONE"} == {*range(20, 27), *range(first, first + 7)}
    assert schedule.params()["profiler.schedule.active_steps"] == "6"
    # the step time between captures, sent every 60 s (and at each capture): 600 steps of 20-35 ms
    schedule.close()  # the callback's close()
    plans = [json.loads(delivery.tags[PLAN_TAG]) for delivery in sent if delivery.tags]
    assert [(p["start"], p["steps"], p["reason"], p["request"]) for p in plans] == [
        (first, 6, schedule.captures[1].reason, None)]  # the answer on the run: one process, no one to wait for
    sent = [delivery for delivery in sent if delivery.series]
    points = [(step, value) for delivery in sent for key, value, step in delivery.series]
    assert [delivery.step for delivery in sent][:2] == [19, first - 1]  # at each capture: the line is current
    assert len(sent) >= 3 and {key for delivery in sent for key, _, _ in delivery.series} == {"profiler/step_time_ms"}
    assert [step for step, _ in points] == sorted(step for step, _ in points)
    assert points[-1][0] == 599  # the last step, timed at the call after it
    assert {round(value) for step, value in points if 40 < step < 300} == {20}
    assert {round(value / 5) * 5 for step, value in points if step > first + 40} == {35}


def test_a_change_past_the_hours_captures_is_one_warning_not_a_capture():
    schedule = AdaptiveSchedule(Reporter(strict=True), None, max_captures_per_hour=1)
    with pytest.warns(MLflowNeuronWarning, match=r"step time 20\.\d → 3\d\.\d ms from step 150 was not captured: 1 "
                      r"capture\(s\) in the last hour already \(max_captures_per_hour=1\)"):  # fmt: skip
        drive(schedule, noisy(20, 150, seed=7) + noisy(35, 150, seed=8))
    assert [c.reason for c in schedule.captures] == ["baseline"] and schedule.missed == 1
    # an hour after the baseline, a change is captured again
    drive(schedule, noisy(35, 200, seed=9) + noisy(20, 100, seed=10), first=301, start_ns=3600 * 10**9)
    assert [c.reason[:11] for c in schedule.captures] == ["baseline", "step time 3"]


def test_a_new_profile_ends_the_capture_in_progress_and_no_step_is_timed_across():
    schedule = AdaptiveSchedule(Reporter(strict=True), None, warmup_steps=3)
    assert drive(schedule, [20.0] * 5) == ["NONE"] * 3 + ["WARMUP", "RECORD", "RECORD"]
    # the profile's stop() saved what it had; the next profile starts again at step 0, a minute later
    assert drive(schedule, [20.0] * 100, start_ns=60 * 10**9) == ["NONE"] * 101
    assert schedule.rule.level is not None and schedule.rule.level == 20 * MS and not schedule.spikes


# -- real loops ------------------------------------------------------------------------------------


def run_loop(step_ms, steps: int, **options):
    """`steps` sleep-based steps (`step_ms(step)` each) profiled on `callback.schedule(**options)`
    into a new run; returns the schedule, the run's id and each step's measured time (ms).

    Each step sleeps until its deadline, the previous one's plus its time: a wake-up a tick late is
    taken back by the next step, as long as the loop is less than a step behind (it never runs
    ahead to catch up more). A plain `sleep(step)` would add every late wake-up to the step time."""
    with mlflow.start_run() as run:
        callback = MLflowProfilerCallback()
        schedule = callback.schedule(**options)
        measured = []
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule, on_trace_ready=callback) as prof:
            last = deadline = time.perf_counter()
            for step in range(steps):
                deadline = max(deadline + step_ms(step) / 1000, time.perf_counter())
                time.sleep(max(deadline - time.perf_counter(), 0))
                prof.step()
                now = time.perf_counter()
                measured.append((now - last) * 1000)
                last = now
        callback.close(timeout=120)  # a busy machine's helper may need more than the default 10 s
    assert callback.cycles_logged == len(schedule.captures)
    return schedule, run.info.run_id, measured


def seen(schedule, measured) -> str:
    """What a failed assertion shows: the captures, and the loop's medians of each 20 steps as measured."""
    medians = " ".join(f"{statistics.median(measured[i:i + 20]):.1f}" for i in range(0, len(measured), 20))
    return f"captures {[(c.reason, c.first_step) for c in schedule.captures]}; medians of 20 steps (ms): {medians}"


def test_the_issues_loop_20_to_35_ms_at_step_300_is_captured_as_a_baseline_and_at_the_change(tracking_uri, strict,
                                                                                               tmp_path):  # fmt: skip
    schedule, run_id, measured = run_loop(lambda step: 20 if step < 300 else 35, 600)
    captures = schedule.captures
    assert captures[0].reason == "baseline" and captures[0].first_step == 20, seen(schedule, measured)
    changed = [c for c in captures if 300 < c.first_step <= 330]
    assert len(changed) == 1, seen(schedule, measured)
    # beside two busy processes the 20 ms sleep may wake a tick late (24 ms): the level is what was measured
    found = re.fullmatch(r"step time (\d+\.\d) → (\d+\.\d) ms from step (\d+)", changed[0].reason)
    assert found and float(found[2]) / float(found[1]) > 1.3 and 290 <= int(found[3]) <= 310, changed[0].reason
    assert len(captures) <= 3, seen(schedule, measured)
    client = MlflowClient()
    data = client.get_run(run_id).data
    cycle = changed[0].last_step + 1  # the cycle is read at the step after its last one
    assert data.tags[f"mlflow_neuron.capture_reason.step_{cycle}"] == changed[0].reason
    assert data.tags["mlflow_neuron.capture_reason.step_27"] == "baseline"
    manifest = read_json_artifact(client, run_id, f"profiler/step_{cycle}/manifest.json", tmp_path / "dl")
    assert manifest["capture"]["reason"] == changed[0].reason
    assert (manifest["capture"]["first_step"], manifest["capture"]["last_step"]) == (changed[0].first_step, cycle - 1)
    assert data.params["profiler.schedule"] == "callback.schedule()"
    assert (data.params["profiler.schedule.warmup_steps"], data.params["profiler.schedule.active_steps"]) == ("20", "6")
    points = [(m.step, m.value) for m in client.get_metric_history(run_id, "profiler/step_time_ms")]
    assert any(step < 300 and 19 < v < 24 for step, v in points), points
    assert any(step > 340 and 34 < v < 40 for step, v in points), points


def test_the_same_loop_without_the_change_is_captured_once_and_a_10x_step_is_a_spike(tracking_uri, strict):
    schedule, run_id, measured = run_loop(lambda step: 200 if step == 400 else 20, 600)
    assert [(c.reason, c.first_step) for c in schedule.captures] == [("baseline", 20)], seen(schedule, measured)
    assert 400 in [step for step, _ in schedule.spikes]  # (a busy machine makes some of its own)
    client = MlflowClient()
    spikes = {m.step: m.value for m in client.get_metric_history(run_id, "profiler/step_time_spike_ms")}
    assert spikes[400] > 150 and all(value > 60 for value in spikes.values()), spikes
    points = [(m.step, m.value) for m in client.get_metric_history(run_id, "profiler/step_time_ms")]
    assert len(points) >= 6 and all(19 < v < 24 for step, v in points if step > 40), (points, seen(schedule, measured))


# -- options and trouble ---------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"warmup_steps": -1}, r"warmup_steps must be an int >= 0 \(default 20: steps before the baseline"),
    ({"active_steps": 0}, r"active_steps must be an int >= 1 \(default 6"),
    ({"min_change": 0}, r"min_change must be a number >= 0.01 \(default 0.25: .*\(0.25: 25%\)\); got 0"),
    ({"window_steps": 2.5}, r"window_steps must be an int >= 5"),
    ({"persist_steps": True}, r"persist_steps must be an int >= 1"),
    ({"max_captures_per_hour": float("nan")}, r"max_captures_per_hour must be an int >= 1"),
    ({"steps": 5}, r"no option 'steps'; it takes warmup_steps \(default 20: .*\); active_steps .*; metric_steps"),
])  # fmt: skip
def test_bad_options_are_refused_when_the_schedule_is_made(tracking_uri, options, message):
    callback = MLflowProfilerCallback(process="inline")
    try:
        with pytest.raises(ValueError, match=message):
            callback.schedule(**options)
    finally:
        callback.close()


def test_trouble_inside_the_schedule_is_one_warning_and_strict_mode_raises(tracking_uri, monkeypatch):
    callback = MLflowProfilerCallback(process="inline", strict=False)
    schedule = callback.schedule(warmup_steps=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [schedule(None).name, schedule(None).name] == ["NONE", "NONE"]  # not a step number
    said = [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning)]
    assert len(said) == 1 and "callback.schedule() failed at step None: TypeError" in said[0], said
    strict = MLflowProfilerCallback(process="inline", strict=True)
    with pytest.raises(TypeError):
        strict.schedule(warmup_steps=0)(None)
    callback.close()
    strict.close()


def test_step_times_the_server_did_not_take_are_named_with_the_sync_command(dead_server, tmp_path):
    callback = MLflowProfilerCallback(tracking_uri=dead_server, run_id="0" * 32, outbox=tmp_path / "outbox",
                                      retry_wait_s=0.01, flush_timeout_s=2)  # fmt: skip
    schedule = callback.schedule(warmup_steps=10**6)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule, on_trace_ready=callback) as prof:
        for _ in range(60):
            time.sleep(0.02)
            prof.step()
    with pytest.warns(MLflowNeuronWarning, match=r"1 record\(s\) of step times were not sent to http://127.0.0.1:\d+; "
                      r"`mlflow-neuron sync --outbox .*outbox` sends them"):  # fmt: skip
        callback.close()
    records = [json.loads(p.read_text()) for p in (tmp_path / "outbox").glob("*/record.json")]
    assert [{k for k, _, _ in r["series"]} for r in records] == [{"profiler/step_time_ms"}]
    assert callback.cycles_logged == 0 and callback.outbox_records == []
