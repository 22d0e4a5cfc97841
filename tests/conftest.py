"""Shared fixtures: a real MLflow store per test, and helpers to read back what was logged."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import fake_device

# As a Neuron user following the docs would: PyTorch profiling (and its test double) copies the
# NEFFs into the profile folder only with a NEFF cache folder. Subprocesses inherit it.
os.environ.setdefault("TORCH_NEURONX_NEFF_CACHE_DIR", str(Path(tempfile.gettempdir()) / "neff-cache-stand-in"))

TESTS = Path(__file__).parent
ROOT = TESTS.parent
DOUBLES = TESTS / "doubles"


@pytest.fixture(autouse=True)
def isolated_mlflow_state(monkeypatch):
    """`mlflow.set_experiment()` writes MLFLOW_EXPERIMENT_ID into os.environ and a module global;
    neither may leak into the next test or its subprocesses."""
    for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    yield
    mlflow.tracking.fluent._active_experiment_id = None


LEFT_BY_A_STORE = ("mlflow.db", "mlruns", "mlflow-neuron-outbox")


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_working_directory():
    """Tests write under their tmp_path only. A test that opens a store without a URI (MLflow's
    default is ./mlflow.db), logs artifacts under the default root (./mlruns) or keeps cycles in the
    callback's default outbox (./mlflow-neuron-outbox) fails the session."""
    here = Path.cwd()
    before = {name for name in LEFT_BY_A_STORE if (here / name).exists()}
    yield
    left = {name for name in LEFT_BY_A_STORE if (here / name).exists()} - before
    assert not left, f"the tests left {sorted(left)} in {here}"


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """A fresh sqlite store (MLflow's default kind) with artifacts under tmp_path."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # default artifact root ./mlruns lands in tmp_path
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("MLFLOW_NEURON_STRICT", "1")


@pytest.fixture(scope="session")
def fake_profiler(tmp_path_factory):
    """The fake PrivateUse1 Kineto profiler (tests/fake_device), compiled once per session: under
    xdist, once for all workers (in the session's shared temp folder, one builder at a time)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    try:
        with open(shared / "fake_device.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return fake_device.build(shared / "fake_device")
    except fake_device.FakeDeviceUnavailable as reason:
        pytest.skip(f"fake PrivateUse1 profiler unavailable: {reason}")


@pytest.fixture
def sync_store(tmp_path, monkeypatch) -> str:
    """An empty sqlite store for `mlflow-neuron sync` to create runs in. A store opened by URI keeps
    artifacts and traces under ./mlruns of the working directory, so the test runs in tmp_path."""
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def dead_server() -> str:
    """An http URI on a loopback port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def profile_offline(dead_server: str, outbox: Path, cycles: int = 3, **kwargs):
    """Profiles `cycles` cycles into run "offline" while the server is down: each goes to `outbox`."""
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback

    callback = MLflowProfilerCallback(
        tracking_uri=dead_server, experiment_id="0", run_name="offline", outbox=outbox, retry_wait_s=0.01, **kwargs
    )
    with pytest.warns(MLflowNeuronWarning, match="not sent"):
        steps = profile_rmsnorm(callback, steps=4 * cycles, wait=1, warmup=1, active=2)
        callback.close()
    assert steps == 4 * cycles  # the training loop always completes
    return callback


@pytest.fixture
def neuron_double(monkeypatch):
    """The test double of `torch_neuronx.profiling`, importable as the real one would be. It copies
    NEFFs into sessions (TORCH_NEURONX_NEFF_CACHE_DIR is set for the suite) unless a test unsets it."""
    monkeypatch.syspath_prepend(str(DOUBLES))
    for name in [m for m in sys.modules if m.startswith("torch_neuronx")]:
        monkeypatch.delitem(sys.modules, name)
    import torch_neuronx.profiling as profiling

    return profiling


def artifact_files(client: MlflowClient, run_id: str, path: str | None = None) -> dict[str, int]:
    """Every artifact file of a run, as {path: size}."""
    files = {}
    for item in client.list_artifacts(run_id, path):
        if item.is_dir:
            files.update(artifact_files(client, run_id, item.path))
        else:
            files[item.path] = item.file_size
    return files


def read_artifact(client: MlflowClient, run_id: str, path: str, dst: Path) -> bytes:
    return Path(client.download_artifacts(run_id, path, str(dst))).read_bytes()


def read_json_artifact(client: MlflowClient, run_id: str, path: str, dst: Path):
    return json.loads(read_artifact(client, run_id, path, dst))


def run_python(code: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (process-wide torch state stays out of this one)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), str(DOUBLES)]), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def import_error_without(packages: tuple[str, ...], module: str, cwd: Path) -> str:
    """The ImportError that `import module` raises in a fresh interpreter where `packages` (top-level
    names) are not installed, or "" if it imports."""
    code = f"""
import sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {packages!r}:
            raise ImportError(f"No module named {{name!r}}")
sys.meta_path.insert(0, NotInstalled())
import mlflow_neuron
try:
    import {module}
except ImportError as error:
    print(error)
"""
    result = run_python(code, cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@pytest.fixture
def matrix_row(request):
    """Records this test's row for benchmarks/fault_matrix.py; asserts the row's promise."""

    def record(produced: int, delivered_once: int, kept: int, lost: int, duplicates: int) -> None:
        assert duplicates == 0
        assert delivered_once + lost == produced, (produced, delivered_once, kept, lost)
        path = os.environ.get("MLFLOW_NEURON_FAULT_MATRIX")
        if path:
            row = dict(fault=request.node.name.removeprefix("test_"), produced=produced, delivered_once=delivered_once,
                       kept=kept, lost=lost, duplicates=duplicates)  # fmt: skip
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")

    return record
