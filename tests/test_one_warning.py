"""A dead tracking server is said once: in the warning that names the kept cycles, the outbox and
the `sync` command. A job that goes on profiling long after the server was found dead is told at
its next cycle too, so that it can act before its end."""

import os
import subprocess
import sys
import warnings

from conftest import ROOT, TESTS
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import closing

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
callback = MLflowProfilerCallback(run_name="dead", tracking_uri={uri!r}, outbox={outbox!r}, retry_wait_s=0.01)
profile_rmsnorm(callback, steps=6, wait=1, warmup=1, active=1)
"""


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "MLflowNeuronWarning" in line]


def test_a_six_step_script_against_a_dead_server_prints_one_warning_with_the_sync_command(tmp_path, dead_server):
    outbox = tmp_path / "outbox"
    code = SCRIPT.format(tests=str(TESTS), uri=dead_server, outbox=str(outbox))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = warning_lines(result.stderr)
    assert "2 profiler cycle(s) (steps 3, 6) were not sent to" in line
    assert "is not reachable" in line and f"mlflow-neuron sync --outbox {outbox}" in line


def test_a_job_that_profiles_on_after_the_server_died_is_told_at_its_next_cycle(tmp_path, dead_server, monkeypatch):
    monkeypatch.setattr(closing, "UNREACHABLE_HOLD_S", 0.0)  # the job has gone on long enough
    callback = MLflowProfilerCallback(tracking_uri=dead_server, run_name="long", outbox=tmp_path / "outbox",
                                      retry_wait_s=0.01, background=False)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MLflowNeuronWarning)
        profile_rmsnorm(callback, steps=9, wait=1, warmup=1, active=1)
        said_during = [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning)]
        callback.close()
    said = [str(w.message) for w in caught if issubclass(w.category, MLflowNeuronWarning)]
    assert len(said_during) == 1 and "is not reachable" in said_during[0], said_during
    assert len(said) == 2 and "were not sent to" in said[1], said
