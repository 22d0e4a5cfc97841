"""A tracking server with MLflow's basic-auth app: credentials come from the environment, never
from the outbox; wrong ones are a clear error that loses nothing."""

import io
import json
import os
import stat

import pytest
from mlflow.tracking import MlflowClient
from servers import MlflowServer
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery.outbox import RECORD, pending
from mlflow_neuron.cli import sync

ADMIN, PASSWORD = "admin", "test-admin-password-5e1f"
# These tests are about credentials, not speed: beside busy cores (the helper at nice 10) delivering
# and ending the run took the default 10 s and left the run RUNNING, which strict mode raises.
BUDGET_S = 120.0


@pytest.fixture
def auth_server(tmp_path):
    """`mlflow server --app-name basic-auth`, its user database in tmp_path."""
    config = tmp_path / "basic_auth.ini"
    config.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{tmp_path / 'basic_auth.db'}\n"
        f"admin_username = {ADMIN}\nadmin_password = {PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key"}
    with MlflowServer(tmp_path / "srv", extra_args=["--app-name", "basic-auth"], env=env) as server:
        yield server


def test_basic_auth_logging_outbox_without_password_and_sync_after_restart(auth_server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    outbox = tmp_path / "outbox"
    live = MLflowProfilerCallback(tracking_uri=auth_server.uri, experiment_id="0", outbox=outbox, strict=True,
                                  flush_timeout_s=BUDGET_S)  # fmt: skip
    profile_rmsnorm(live)
    live.close()
    client = MlflowClient(auth_server.uri)
    assert [m.step for m in client.get_metric_history(live.run_id, "profiler/total/active_steps")] == [4]

    # The server goes away; the credentials also sit in the URI: neither may reach the disk.
    auth_server.kill()
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    uri_with_password = auth_server.uri.replace("http://", f"http://{ADMIN}:{PASSWORD}@")
    offline = MLflowProfilerCallback(run_id=live.run_id, tracking_uri=uri_with_password, outbox=outbox,
                                     retries=0, retry_wait_s=0.01)  # fmt: skip
    with pytest.warns(MLflowNeuronWarning, match="not sent"):
        profile_rmsnorm(offline)
        offline.close()
    [record] = pending(outbox)
    for path in [record, *record.rglob("*")]:
        if not path.is_dir():
            assert PASSWORD not in path.read_text(errors="replace"), path
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0 or path.stat().st_nlink > 1, path
    assert json.loads((record / RECORD).read_text())["run"]["tracking_uri"] == auth_server.uri
    assert stat.S_IMODE(os.stat(outbox).st_mode) == 0o700

    auth_server.restart()
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    out = io.StringIO()
    assert tuple(sync(str(outbox), out=out)) == (0, 1)
    assert "kept" in out.getvalue() and "401" in out.getvalue(), out.getvalue()
    assert pending(outbox) == [record]  # nothing lost

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    assert tuple(sync(str(outbox), out=io.StringIO())) == (1, 0)
    assert [m.step for m in client.get_metric_history(live.run_id, "profiler/total/active_steps")] == [4, 4]


def test_a_password_in_the_tracking_uri_logs_without_the_environment(auth_server, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    uri_with_password = auth_server.uri.replace("http://", f"http://{ADMIN}:{PASSWORD}@")
    callback = MLflowProfilerCallback(tracking_uri=uri_with_password, experiment_id="0", outbox=tmp_path / "outbox",
                                      strict=True, flush_timeout_s=BUDGET_S)  # fmt: skip
    profile_rmsnorm(callback)
    callback.close()
    assert callback.outbox_records == []
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    assert MlflowClient(auth_server.uri).get_run(callback.run_id).data.metrics
