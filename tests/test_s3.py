"""Large profile files into an S3 artifact store (moto's S3 server) behind real mlflow servers.

The files here are MB-sized: `_uploads.LARGE_FILE_BYTES` is lowered so they take the large-file
path (progress lines, size check on the server). benchmarks/large_files.py sends a 2 GB file.
"""

import io
import logging
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, read_json_artifact
from mlflow.tracking import MlflowClient
from object_store import MotoS3, S3MlflowServer, moto_available
from servers import drop_postgres_database, postgres_uri, scratch_postgres_database
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback
from mlflow_neuron._delivery import uploads as _uploads
from mlflow_neuron._delivery.outbox import pending
from mlflow_neuron.cli import sync

pytestmark = pytest.mark.skipif(moto_available() is not None, reason=str(moto_available()))

MIB = 1024**2
NTFF = "profile_nc_0_session_0.ntff"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with MotoS3(tmp_path_factory.mktemp("s3")) as store:
        yield store


@pytest.fixture(scope="module")
def proxied(s3, tmp_path_factory):
    """`mlflow server` on PostgreSQL with --artifacts-destination s3://mlflow/proxied."""
    base = postgres_uri()
    if base is None:
        pytest.skip('needs PostgreSQL: run `eval "$(bash .ci/postgres.sh)"` first (.ci/run does)')
    name = f"mlflow_neuron_s3_test_{os.getpid()}"  # per process: two suites on one machine share the server
    server = S3MlflowServer(tmp_path_factory.mktemp("proxied"), s3, scratch_postgres_database(base, name),
                            prefix="proxied")  # fmt: skip
    with server:
        yield server
    drop_postgres_database(base, name)


@pytest.fixture
def large_from_1_mib(monkeypatch):
    monkeypatch.setattr(_uploads, "LARGE_FILE_BYTES", MIB)


def profile_with_ntff(neuron_double, monkeypatch, tmp_path, uri, ntff_bytes, **options):
    monkeypatch.setattr(neuron_double, "NTFF_BYTES", ntff_bytes)
    config = neuron_double.NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    callback = MLflowProfilerCallback(
        neuron_double.NeuronProfiler(config).export_trace, tracking_uri=uri, experiment_id="0",
        outbox=tmp_path / "outbox", **options,
    )  # fmt: skip
    profile_rmsnorm(callback, experimental_config=config)
    return callback


def ntff_entry(client, run_id, tmp_path) -> dict:
    manifest = read_json_artifact(client, run_id, "profiler/step_4/manifest.json", tmp_path / "dl")
    return next(f for f in manifest["files"] if f["artifact_path"].endswith(NTFF))


def s3_key(s3, run_id, artifact_path) -> str:
    [key] = [k for k in s3.objects() if k.endswith(f"{run_id}/artifacts/{artifact_path}")]
    return key


def test_proxied_server_on_postgres_stores_the_ntff_with_the_manifests_checksum(
    proxied, s3, neuron_double, tmp_path, monkeypatch, caplog, large_from_1_mib, strict
):
    with caplog.at_level(logging.INFO, logger="mlflow_neuron"):
        # In-process: `large_from_1_mib` patches this process only (the helper forwards its own lines).
        callback = profile_with_ntff(neuron_double, monkeypatch, tmp_path, proxied.uri, 3 * MIB, process="inline")
        callback.close()
    entry = ntff_entry(MlflowClient(proxied.uri), callback.run_id, tmp_path)
    assert entry["uploaded"] and entry["size_bytes"] == 3 * MIB
    assert entry["sha256"] == _uploads.file_sha256(entry["source"])
    key = s3_key(s3, callback.run_id, entry["artifact_path"])
    assert key.startswith("proxied/") and s3.objects(key) == {key: 3 * MIB}
    assert s3.sha256(key) == entry["sha256"]
    assert f"uploading {entry['artifact_path']}: 0.00 of 0.00 GiB (100%)" in caplog.text
    assert callback.outbox_records == []


def test_a_client_writing_to_s3_directly_stores_the_ntff_with_the_manifests_checksum(
    s3, neuron_double, tmp_path, monkeypatch, large_from_1_mib, strict
):
    for name, value in s3.env().items():  # the client writes to S3 itself: MLFLOW_S3_ENDPOINT_URL, AWS_*
        monkeypatch.setenv(name, value)
    with S3MlflowServer(tmp_path / "direct", s3, prefix="direct", proxied=False) as server:
        callback = profile_with_ntff(neuron_double, monkeypatch, tmp_path, server.uri, 2 * MIB + 5)
        callback.close()
        entry = ntff_entry(MlflowClient(server.uri), callback.run_id, tmp_path)
    key = s3_key(s3, callback.run_id, entry["artifact_path"])
    assert key.startswith("direct/") and s3.objects(key) == {key: 2 * MIB + 5}
    assert s3.sha256(key) == entry["sha256"] == _uploads.file_sha256(entry["source"])


def test_a_client_killed_mid_upload_leaves_no_object(proxied, s3, tmp_path):
    big = tmp_path / "big.ntff"
    big.write_bytes(os.urandom(64 * MIB))
    run_id = MlflowClient(proxied.uri).create_run("0").info.run_id
    code = f"from mlflow_neuron._delivery import uploads; uploads.upload({proxied.uri!r}, {run_id!r}, {str(big)!r}, 'neuron')"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert wait_for_spool(proxied, "big.ntff"), "the upload never reached the server"
    finally:
        child.kill()
        child.wait(timeout=10)
    time.sleep(1)  # the server notices the disconnect
    assert [k for k in s3.objects() if run_id in k] == []
    assert not any(run_id in u["Key"] for u in s3.client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", ()))


def test_an_upload_cut_by_a_server_crash_is_sent_again_whole_by_sync(
    proxied, s3, neuron_double, tmp_path, monkeypatch, large_from_1_mib
):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    size = 96 * MIB
    spooled = []

    def crash_mid_upload():  # the profiler's stop waits for the upload: crash it from here
        spooled.append(wait_for_spool(proxied, NTFF))
        proxied.kill()

    crasher = threading.Thread(target=crash_mid_upload, daemon=True)
    crasher.start()
    with pytest.warns(MLflowNeuronWarning, match="not sent"):
        callback = profile_with_ntff(neuron_double, monkeypatch, tmp_path, proxied.uri, size, retries=0)
        crasher.join(timeout=90)
        callback.close()
    assert spooled == [True], "the server was not crashed mid-upload"
    [record] = pending(tmp_path / "outbox")
    run_id = callback.run_id
    assert run_id is not None  # the run exists; its NTFF does not
    assert not [k for k in s3.objects() if k.endswith(NTFF) and run_id in k]

    proxied.restart()
    out = io.StringIO()
    assert tuple(sync(str(tmp_path / "outbox"), out=out)) == (1, 0)
    entry = ntff_entry(MlflowClient(proxied.uri), run_id, tmp_path)
    key = s3_key(s3, run_id, entry["artifact_path"])
    assert s3.objects(key) == {key: size}
    assert s3.sha256(key) == entry["sha256"] == _uploads.file_sha256(entry["source"])
    assert f"uploading {entry['artifact_path']}: 0.09 of 0.09 GiB (100%)" in out.getvalue()
    assert not record.exists()


def wait_for_spool(server, name: str, timeout: float = 60) -> bool:
    """Waits until the server has spooled part of an upload of `name` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.stat().st_size > 0 for p in server.workdir.rglob(name) if p.is_file()):
            return True
        time.sleep(0.02)
    return False
