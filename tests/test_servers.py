"""The test servers themselves (tests/servers.py): a real `mlflow server`, DelayProxy, Postgres."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from servers import (
    DelayProxy,
    MlflowServer,
    ServerError,
    drop_postgres_database,
    free_port,
    port_is_open,
    postgres_uri,
    scratch_postgres_database,
)

# A call to a dead server fails at once instead of retrying for minutes (MLflow's defaults).
FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One sqlite-backed server for the module (tests that stop it leave it running again)."""
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    srv.start()
    print(f"\nmlflow server started in {srv.last_start_s:.2f} s at {srv.uri}")
    yield srv
    srv.stop()
    assert not srv.alive


@pytest.fixture
def fail_fast(monkeypatch):
    for name, value in FAIL_FAST.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def server_running(server):
    if not server.alive:  # a previous test failed half way through a crash or a stop
        server.restart()
    return server


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _log_some(client: MlflowClient, tmp_path: Path, experiment_name: str) -> tuple[str, str]:
    exp_id = client.create_experiment(experiment_name)
    run_id = client.create_run(exp_id).info.run_id
    client.log_metric(run_id, "loss", 0.5, step=1)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric("loss", 0.25, now, 2)], params=[Param("lr", "0.1")])
    client.log_artifact(run_id, str(_write(tmp_path / "note.txt", f"hello {run_id}")), "files")
    return exp_id, run_id


def _check_logged(client: MlflowClient, run_id: str, tmp_path: Path) -> None:
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.1"}
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5), (2, 0.25)]
    assert [f.path for f in client.list_artifacts(run_id, "files")] == ["files/note.txt"]
    dst = tmp_path / f"download-{uuid.uuid4().hex[:8]}"
    dst.mkdir()
    local = client.download_artifacts(run_id, "files/note.txt", str(dst))
    assert Path(local).read_text() == f"hello {run_id}"


def test_real_server_round_trip_crash_and_restart(server_running, tmp_path, fail_fast):
    server = server_running
    client = MlflowClient(server.uri)
    _, run_id = _log_some(client, tmp_path, f"round-trip-{uuid.uuid4().hex[:8]}")
    _check_logged(client, run_id, tmp_path)
    run = client.get_run(run_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # uploaded through the server
    assert list(server.artifacts_dir.rglob("note.txt"))  # ... into its artifacts destination

    # Crash: the whole process group dies at once, the port is closed, calls fail (fast here).
    server.kill()
    assert not server.alive
    assert not port_is_open(server.port)
    t0 = time.monotonic()
    with pytest.raises(Exception):
        client.get_run(run_id)
    print(f"\ncall to the killed server failed after {time.monotonic() - t0:.3f} s")

    # Restart after the crash: same port, same stores, everything still there.
    server.restart()
    assert server.alive and server.uri == client.tracking_uri
    _check_logged(client, run_id, tmp_path)
    print(f"restart after kill: {server.last_start_s:.2f} s")

    # Graceful stop, then start again.
    server.stop()
    assert not server.alive and not port_is_open(server.port)
    server.restart()
    _check_logged(client, run_id, tmp_path)
    print(f"restart after stop: {server.last_start_s:.2f} s")


def test_delay_proxy_adds_latency(server_running, tmp_path):
    server = server_running
    direct = MlflowClient(server.uri)
    with DelayProxy(server.port, delay_s=0.2) as proxy:
        proxied = MlflowClient(proxy.uri)
        direct.get_experiment("0")  # warm both connection pools
        proxied.get_experiment("0")
        t0 = time.monotonic()
        direct.get_experiment("0")
        t_direct = time.monotonic() - t0
        t0 = time.monotonic()
        proxied.get_experiment("0")
        t_proxied = time.monotonic() - t0
        print(f"\nget_experiment: direct {t_direct * 1000:.1f} ms, "
              f"through DelayProxy(0.2 s) {t_proxied * 1000:.1f} ms")  # fmt: skip
        assert t_proxied >= 0.2

        # Changing the delay at run time; 0 means a plain proxy.
        proxy.delay_s = 0.0
        seen = proxy.requests
        # End to end through the proxy, artifact upload and download included.
        _, run_id = _log_some(proxied, tmp_path, f"proxied-{uuid.uuid4().hex[:8]}")
        _check_logged(proxied, run_id, tmp_path)
        assert proxy.requests - seen >= 8  # it all went through the proxy
        _check_logged(direct, run_id, tmp_path)


def test_delay_proxy_is_once_per_request_not_per_chunk(server_running, tmp_path):
    """A large upload (many chunks) is delayed about once, not once per 64 KiB chunk."""
    server = server_running
    client = MlflowClient(server.uri)
    run_id = client.create_run("0").info.run_id
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(4 * 1024 * 1024))
    with DelayProxy(server.port, delay_s=0.1) as proxy:
        proxied = MlflowClient(proxy.uri)
        before = proxy.requests
        proxied.log_artifact(run_id, str(big))
        assert proxy.requests - before <= 4  # a handful of REST calls, not 64 chunks
    assert client.list_artifacts(run_id)[0].file_size == big.stat().st_size


def test_delay_proxy_to_dead_target_and_clean_stop(fail_fast):
    dead_port = free_port()  # nothing listens there
    with DelayProxy(dead_port, delay_s=0.01) as proxy:
        t0 = time.monotonic()
        with pytest.raises(Exception):
            MlflowClient(proxy.uri).get_experiment("0")
        assert time.monotonic() - t0 < 10

        # An idle client connection and a listener thread must not keep stop() waiting.
        idle = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    try:
        assert not port_is_open(proxy.port)
        leftover = [t for t in threading.enumerate() if t.name.startswith(f"DelayProxy:{proxy.port}")]
        assert leftover == []
    finally:
        idle.close()


def test_delay_proxy_forwards_raw_tcp():
    """Byte-exact forwarding both ways, with the delay on the client side only."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def echo():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    try:
        with DelayProxy(listener.getsockname()[1], delay_s=0.1) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as c:
                t0 = time.monotonic()
                c.sendall(b"ping")
                assert c.recv(100) == b"PING"
                assert time.monotonic() - t0 >= 0.1
                payload = os.urandom(300_000).hex().encode()
                c.sendall(payload)
                got = b""
                while len(got) < len(payload):
                    got += c.recv(65536)
                assert got == payload.upper()
    finally:
        listener.close()
        t.join(timeout=5)


def test_server_that_cannot_start_reports_its_log(tmp_path):
    srv = MlflowServer(tmp_path, backend_store_uri="nosuchscheme://nowhere")
    with pytest.raises(ServerError, match="exited with code") as err:
        srv.start(timeout=60)
    assert "nosuchscheme" in str(err.value)  # the log tail is in the message
    assert not srv.alive


def _postgres_or_skip() -> str:
    uri = postgres_uri()
    if not uri:
        pytest.skip("MLFLOW_NEURON_TEST_POSTGRES_URI not set (CI sets it via .ci/postgres.sh)")
    pytest.importorskip("psycopg", reason="the Postgres driver psycopg (psycopg[binary]) is not installed")
    return uri


def test_server_on_postgres(tmp_path):
    uri = _postgres_or_skip()
    with MlflowServer(tmp_path, backend_store_uri=uri) as srv:
        print(f"\nmlflow server on Postgres started in {srv.last_start_s:.2f} s")
        client = MlflowClient(srv.uri)
        # The database outlives test runs: use names of our own.
        _, run_id = _log_some(client, tmp_path, f"postgres-{uuid.uuid4().hex}")
        _check_logged(client, run_id, tmp_path)
        srv.kill()
        srv.restart()
        _check_logged(client, run_id, tmp_path)
        assert client.get_run(run_id).data.metrics == {"loss": 0.25}


def test_scratch_postgres_database(tmp_path):
    """An empty database per test, for tests that need a fresh MLflow schema on Postgres."""
    base = _postgres_or_skip()
    name = f"mlflow_neuron_scratch_{uuid.uuid4().hex[:8]}"
    try:
        uri = scratch_postgres_database(base, name)
    except Exception as e:  # e.g. a role without CREATEDB outside .ci/postgres.sh
        pytest.skip(f"cannot create a scratch database: {e}")
    try:
        assert uri.endswith("/" + name)
        with MlflowServer(tmp_path, backend_store_uri=uri) as srv:
            print(f"\nmlflow server on an empty Postgres database started in {srv.last_start_s:.2f} s")
            client = MlflowClient(srv.uri)
            assert [e.name for e in client.search_experiments()] == ["Default"]
            run_id = client.create_run("0").info.run_id
            client.log_metric(run_id, "m", 1.0)
            assert client.get_run(run_id).data.metrics == {"m": 1.0}
    finally:
        drop_postgres_database(base, name)
