"""`interleaved`: variants profiled in rotation, one cycle each, one run per variant (real
torch.profiler on CPU, a real sqlite store)."""

import itertools
import warnings

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient

from mlflow_neuron import InterleavedRuns, MLflowNeuronWarning, compare_runs, interleaved

WAIT, WARMUP, ACTIVE = 1, 1, 2
LENGTH = WAIT + WARMUP + ACTIVE


def recording(calls, name, fail_on_call=None):
    x = torch.ones(64)

    def step():
        calls.append(name)
        if fail_on_call is not None and calls.count(name) == fail_on_call:
            raise ValueError(f"{name} broke")
        return (x * x).sum()

    return step


def cycle_steps(client, run_id):
    return [m.step for m in client.get_metric_history(run_id, "profiler/total/active_steps")]


def test_variants_are_profiled_in_rotation_each_into_a_run_of_its_own(tracking_uri):
    calls = []
    with mlflow.start_run(run_name="parent") as parent:
        runs = interleaved({name: recording(calls, name) for name in ("a", "b", "c")}, cycles=3, wait=WAIT,
                           warmup=WARMUP, active=ACTIVE, device="cpu", background=False, strict=True)  # fmt: skip
    assert isinstance(runs, InterleavedRuns) and not runs.failed
    assert runs.order == tuple((cycle, name) for cycle in range(3) for name in "abc")
    # each cycle's steps run together: a a a a, b b b b, c c c c, a a a a, ...
    assert [name for name, _ in itertools.groupby(calls)] == list("abc" * 3)
    assert all(len(list(group)) == LENGTH for _, group in itertools.groupby(calls))
    client = MlflowClient(tracking_uri)
    assert list(runs.run_ids) == ["a", "b", "c"] and len(set(runs.run_ids.values())) == 3
    rotations = set()
    for name, run_id in runs.run_ids.items():
        run = client.get_run(run_id)
        assert run.info.run_name == name and run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        rotations.add(run.data.tags["mlflow_neuron.rotation"])
        # the cycles are logged where one profile with repeat=3 would log them
        assert cycle_steps(client, run_id) == [LENGTH, 2 * LENGTH, 3 * LENGTH]
    frame = compare_runs(list(runs.run_ids.values()), baseline="a")
    assert frame.attrs["n"] == {"a": 3 * ACTIVE, "b": 3 * ACTIVE, "c": 3 * ACTIVE}
    assert {tuple(key)[0] for key in frame.attrs["sample_steps"]["b"]} == {LENGTH, 2 * LENGTH, 3 * LENGTH}
    # one mark for the runs of one rotation, read back with them: compare gates their host time from 2 cycles
    from mlflow_neuron._readback.profiles import load_profile

    assert len(rotations) == 1 and load_profile(client, client.get_run(runs.run_ids["b"])).extra["rotation"] in rotations


def test_a_variant_that_raises_ends_failed_and_the_others_go_on(tracking_uri):
    calls = []
    steps = {"a": recording(calls, "a"), "bad": recording(calls, "bad", fail_on_call=LENGTH + 2)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = interleaved(steps, cycles=3, wait=WAIT, warmup=WARMUP, active=ACTIVE, device="cpu",
                           background=False, strict=False)  # fmt: skip
    assert list(runs.failed) == ["bad"] and runs.failed["bad"] == "ValueError: bad broke"
    assert runs.order == ((0, "a"), (0, "bad"), (1, "a"), (1, "bad"), (2, "a"))
    found = [w for w in caught if issubclass(w.category, MLflowNeuronWarning) and "'bad'" in str(w.message)]
    assert len(found) == 1 and "ends FAILED" in str(found[0].message)
    client = MlflowClient(tracking_uri)
    assert client.get_run(runs.run_ids["bad"]).info.status == "FAILED"
    assert client.get_run(runs.run_ids["a"]).info.status == "FINISHED"
    assert cycle_steps(client, runs.run_ids["a"]) == [LENGTH, 2 * LENGTH, 3 * LENGTH]


def test_strict_mode_raises_the_variants_error_and_still_ends_every_run(tracking_uri):
    calls = []
    steps = {"a": recording(calls, "a"), "bad": recording(calls, "bad", fail_on_call=1)}
    with pytest.raises(ValueError, match="bad broke"):
        interleaved(steps, cycles=2, wait=WAIT, warmup=WARMUP, active=ACTIVE, device="cpu", background=False,
                    strict=True)  # fmt: skip
    runs = MlflowClient(tracking_uri).search_runs(["0"])
    assert {(r.info.run_name, r.info.status) for r in runs} == {("a", "FINISHED"), ("bad", "FAILED")}


@pytest.mark.parametrize("kwargs, message", [
    ({"cycles": 0}, "cycles must be an int >= 1"),
    ({"active": 0}, "active must be an int >= 1"),
    ({"wait": -1}, "wait must be an int >= 0"),
])  # fmt: skip
def test_bad_settings_are_refused_before_anything_is_created(tracking_uri, kwargs, message):
    with pytest.raises(ValueError, match=message):
        interleaved({"a": lambda: None}, device="cpu", **kwargs)
    with pytest.raises(TypeError, match="must be a callable"):
        interleaved({"a": 3}, device="cpu")
    assert MlflowClient(tracking_uri).search_runs(["0"]) == []


def test_with_the_helper_delivering_after_the_exit_every_cycle_is_in_when_interleaved_returns(tracking_uri,
                                                                                          monkeypatch):
    calls = []
    with mlflow.start_run(run_name="parent"):
        runs = interleaved({name: recording(calls, name) for name in ("a", "b")}, cycles=2, wait=WAIT,
                           warmup=WARMUP, active=ACTIVE, device="cpu", strict=True)  # fmt: skip
    client = MlflowClient(tracking_uri)
    for run_id in runs.run_ids.values():  # read at once, as compare_runs does next
        assert cycle_steps(client, run_id) == [LENGTH, 2 * LENGTH]
        assert client.get_run(run_id).info.status == "FINISHED"
