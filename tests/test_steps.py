"""Per-step samples: each active step's ops, logged beside the cycle's sums, and read back by compare.

The per-step values of a cycle must add up to the cycle's numbers exactly (whole nanoseconds),
device kernels must land in the step of the op that launched them, and runs whose step tables
are gone (or predate them) must still load, from metrics.
"""

import json
import shutil
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest
from conftest import read_json_artifact, run_python
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron._analysis.model import SAMPLES_FROM_CYCLES, SAMPLES_FROM_METRICS, SAMPLES_FROM_STEPS
from mlflow_neuron._readback.profiles import load_profile

pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")  # repeat=2
SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=2)  # active steps 2-4 and 7-9; cycles at 5 and 10


def ns(us: float) -> int:
    return round(us * 1000)


def table(client, run_id, path, tmp_path):
    data = read_json_artifact(client, run_id, path, tmp_path)
    return pd.DataFrame(data["data"], columns=data["columns"])


@pytest.fixture
def cpu_run(tracking_uri, strict):
    import mlflow

    with mlflow.start_run() as run:
        with MLflowProfilerCallback() as callback:
            profile_rmsnorm(callback, steps=10, **SCHEDULE)
    return MlflowClient(tracking_uri), run.info.run_id


def test_each_active_step_is_a_point_at_its_own_step_number(cpu_run):
    client, run_id = cpu_run
    points = client.get_metric_history(run_id, "profiler/step/self_cpu_time_us")
    assert sorted(p.step for p in points) == [2, 3, 4, 7, 8, 9]
    assert all(p.value > 0 for p in points)
    # CPU only: no device series (like the per-op device keys), the cycle keys are unchanged
    assert client.get_metric_history(run_id, "profiler/step/self_device_time_us") == []
    assert sorted(p.step for p in client.get_metric_history(run_id, "profiler/total/self_cpu_time_us")) == [5, 10]


def test_the_steps_of_a_cycle_add_up_to_the_cycle_exactly(cpu_run, tmp_path):
    client, run_id = cpu_run
    for cycle, steps in ((5, [2, 3, 4]), (10, [7, 8, 9])):
        ops = table(client, run_id, f"profiler/step_{cycle}/ops.json", tmp_path / f"o{cycle}")
        per_step = table(client, run_id, f"profiler/step_{cycle}/steps.json", tmp_path / f"s{cycle}")
        totals = table(client, run_id, f"profiler/step_{cycle}/step_totals.json", tmp_path / f"t{cycle}")
        assert sorted(per_step.step.unique()) == steps == sorted(totals.step)
        metric = {k: client.get_metric_history(run_id, f"profiler/total/{k}") for k in ("self_cpu_time_us", "aten_calls")}
        cycle_cpu = next(p.value for p in metric["self_cpu_time_us"] if p.step == cycle)
        cycle_aten = next(p.value for p in metric["aten_calls"] if p.step == cycle)
        assert sum(map(ns, totals.self_cpu_time_us)) == ns(cycle_cpu)
        assert sum(map(ns, per_step.self_cpu_time_us)) == ns(cycle_cpu)
        assert totals.aten_calls.sum() == cycle_aten == 18  # 6 naive RMSNorm calls a step
        for (name, kind), rows in per_step.groupby(["name", "kind"]):
            row = ops[(ops.name == name) & (ops.kind == kind)].iloc[0]
            assert rows.calls.sum() == row.calls, name
            assert sum(map(ns, rows.self_cpu_time_us)) == ns(row.self_cpu_time_us), name
        # the step series logged as metrics are the same numbers
        logged = {p.step: p.value for p in client.get_metric_history(run_id, "profiler/step/self_cpu_time_us")}
        assert [logged[s] for s in steps] == list(totals.sort_values("step").self_cpu_time_us)
        assert set(per_step[per_step.name == "ProfilerStep*"].calls) == {1}  # one range per step


def test_ops_json_marks_ranges_and_puts_cpu_first_without_device_time(cpu_run, tmp_path):
    client, run_id = cpu_run
    ops = table(client, run_id, "profiler/step_5/ops.json", tmp_path)
    assert list(ops.columns[:6]) == ["name", "metric_key", "kind", "calls", "self_cpu_time_us", "cpu_time_us"]
    assert set(ops[ops.annotation].name) == {"ProfilerStep*"}
    assert not ops[ops.name == "aten::mul"].annotation.any()


NOISY = """
import json, pathlib
import fake_device
fake_device.activate(pathlib.Path({so!r}))
import mlflow
from torch.profiler import ProfilerActivity
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
with mlflow.start_run() as run:
    with MLflowProfilerCallback(flush_timeout_s=300) as callback:  # every cycle in, however busy the machine
        profile_rmsnorm(callback, steps=10, wait=1, warmup=1, active=3, repeat=2,
                        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])
print(json.dumps({{"run_id": run.info.run_id}}))
"""


def noisy_run(so, tmp_path, seed):
    tmp_path.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"FAKE_NEURON_KERNELS": "aten::mul=100,aten::rsqrt=40", "FAKE_NEURON_JITTER": "0.3",
           "FAKE_NEURON_STALL_RATE": "0.1", "FAKE_NEURON_SEED": str(seed), "MLFLOW_NEURON_STRICT": "1"}  # fmt: skip
    result = run_python(NOISY.format(so=str(so), uri=uri), tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return MlflowClient(uri), json.loads(result.stdout.strip().splitlines()[-1])["run_id"]


def test_device_steps_add_up_and_kernels_stay_with_their_ops(fake_profiler, tmp_path):
    client, run_id = noisy_run(fake_profiler, tmp_path / "a", seed=3)
    device = {p.step: p.value for p in client.get_metric_history(run_id, "profiler/step/self_device_time_us")}
    assert sorted(device) == [2, 3, 4, 7, 8, 9]
    assert len(set(device.values())) > 1  # jittered: steps differ
    for cycle in (5, 10):
        steps = table(client, run_id, f"profiler/step_{cycle}/steps.json", tmp_path / f"s{cycle}")
        total = next(p.value for p in client.get_metric_history(run_id, "profiler/total/self_device_time_us")
                     if p.step == cycle)  # fmt: skip
        assert sum(ns(device[s]) for s in steps.step.unique()) == ns(total)
        for step, rows in steps.groupby("step"):
            ops = rows[rows.kind == "op"].set_index("name")
            kernels = rows[rows.kind == "kernel"].set_index("name")
            # three muls per step, each with its own kernel, in the step of the op that launched it
            assert ops.loc["aten::mul", "calls"] == 3 == kernels.loc["neuron_kernel::aten::mul", "calls"]
            assert ns(ops.loc["aten::mul", "self_device_time_us"]) == ns(kernels.loc["neuron_kernel::aten::mul",
                                                                                        "self_device_time_us"])  # fmt: skip
            assert ns(kernels.self_device_time_us.sum()) == ns(device[step])
    # the noise is seeded: the same seed gives the same steps, another seed other steps
    _, again = noisy_run(fake_profiler, tmp_path / "b", seed=3)
    again_client = MlflowClient(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}")
    same = {p.step: p.value for p in again_client.get_metric_history(again, "profiler/step/self_device_time_us")}
    assert same == device
    other_client, other = noisy_run(fake_profiler, tmp_path / "c", seed=4)
    assert {p.step: p.value for p in other_client.get_metric_history(other, "profiler/step/self_device_time_us")} != device


# -- reading samples back --------------------------------------------------------------------------


def artifact_root(client, run_id) -> Path:
    return Path(unquote(urlparse(client.get_run(run_id).info.artifact_uri).path))


def test_samples_come_from_every_cycle_and_skip_nothing_silently(cpu_run):
    client, run_id = cpu_run
    profile = load_profile(client, client.get_run(run_id))
    assert profile.source == SAMPLES_FROM_STEPS
    assert sorted(profile.step_totals.step) == [2, 3, 4, 7, 8, 9]
    assert set(profile.samples.cycle) == {5, 10} and "aten::mul" in set(profile.samples.name)
    assert profile.step == 10 and profile.totals["active_steps"] == 3
    one = load_profile(client, client.get_run(run_id), step=5)
    assert sorted(one.step_totals.step) == [2, 3, 4]


def test_without_step_tables_the_step_metrics_still_give_samples(cpu_run):
    client, run_id = cpu_run
    root = artifact_root(client, run_id)
    for cycle in (5, 10):
        (root / f"profiler/step_{cycle}/steps.json").unlink()
    profile = load_profile(client, client.get_run(run_id))
    assert profile.source == SAMPLES_FROM_METRICS
    logged = {p.step: p.value for p in client.get_metric_history(run_id, "profiler/step/self_cpu_time_us")}
    assert dict(zip(profile.step_totals.step, profile.step_totals.self_cpu_time_us)) == logged
    assert profile.step_totals.aten_calls.tolist() == [6.0] * 6  # the cycle's count, per step


def test_a_run_whose_artifacts_expired_compares_from_its_metrics(cpu_run):
    client, run_id = cpu_run
    shutil.rmtree(artifact_root(client, run_id) / "profiler")
    profile = load_profile(client, client.get_run(run_id))
    assert profile.source == SAMPLES_FROM_METRICS
    assert "aten.mul" in set(profile.ops.name)  # names are the metric keys now
    mul = profile.samples[profile.samples.name == "aten.mul"]
    assert len(mul) == 2 and (mul.calls == 3).all()  # one sample per cycle: 9 calls over 3 steps


def test_runs_logged_before_step_samples_load_as_one_sample_per_cycle(cpu_run, tracking_uri):
    client, run_id = cpu_run
    root = artifact_root(client, run_id)
    for cycle in (5, 10):
        (root / f"profiler/step_{cycle}/steps.json").unlink()
        (root / f"profiler/step_{cycle}/step_totals.json").unlink()
    with sqlite3.connect(tracking_uri[len("sqlite:///"):]) as db:  # what an older version logged
        for table_name in ("metrics", "latest_metrics"):
            db.execute(f"DELETE FROM {table_name} WHERE key LIKE 'profiler/step/%'")
    old = load_profile(client, client.get_run(run_id))
    assert old.source == SAMPLES_FROM_CYCLES
    assert old.step_totals.step.tolist() == [4, 9]  # each cycle's last step stands for it
    cpu = {p.step: p.value for p in client.get_metric_history(run_id, "profiler/total/self_cpu_time_us")}
    assert old.step_totals.self_cpu_time_us.tolist() == pytest.approx([cpu[5] / 3, cpu[10] / 3])
    assert old.step_totals.aten_calls.tolist() == [6.0, 6.0]
