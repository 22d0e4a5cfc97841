"""A 2 GiB NTFF (a sparse file) through a proxied `mlflow server --artifacts-destination s3://...`
into moto's S3 server, three ways, each in its own process:

1. `mlflow.log_artifact` alone: the reference time and memory (run first and last; the faster
   of the two counts).
2. The training process: `MLflowProfilerCallback` finds the NTFF in `profile_output_dir` and its
   background sender uploads it (timed from the cycle until `close()` returns).
3. The uploader: `mlflow-neuron sync` of an outbox record that names the same file.

RSS growth is the peak resident set during the upload minus the resident set just before it
(`/proc/self/clear_refs` resets the peak). Then the S3 object's SHA-256 is compared with the
checksum in the cycle's manifest.json.

    python benchmarks/large_files.py [--gib 2]

Needs moto[server] and boto3 (the `test` extra). Uses the PostgreSQL backend when
MLFLOW_NEURON_TEST_POSTGRES_URI is set (`eval "$(bash .ci/postgres.sh)"`), else sqlite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS)]
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from mlflow.tracking import MlflowClient  # noqa: E402
from object_store import MotoS3, S3MlflowServer  # noqa: E402
from servers import drop_postgres_database, free_port, postgres_uri, scratch_postgres_database  # noqa: E402

NTFF = "profile_nc_0_session_0.ntff"

PRELUDE = """
import json, os, sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
def start():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    return status("VmRSS"), time.perf_counter()
def done(base, t0, **extra):
    seconds = time.perf_counter() - t0
    print("RESULT " + json.dumps({"seconds": seconds, "base": base, "peak": status("VmHWM"), **extra}), flush=True)
"""

LOG_ARTIFACT = PRELUDE + """
import mlflow
big, warm = sys.argv[1:3]
with mlflow.start_run() as run:
    mlflow.log_artifact(warm, "warm")
    base, t0 = start()
    mlflow.log_artifact(big, "neuron")
    done(base, t0, run_id=run.info.run_id)
"""

CALLBACK = PRELUDE + """
from workloads import profile_rmsnorm
from mlflow_neuron import MLflowProfilerCallback
uri, out, outbox = sys.argv[1:4]
big = os.path.join(out, "profile_nc_0_session_0.ntff")
callback = MLflowProfilerCallback(tracking_uri=uri, experiment_id="0", profile_output_dir=out, outbox=outbox,
                                  flush_timeout_s=3600, retries=0, retry_wait_s=0.01)
profile_rmsnorm(callback)  # warm-up cycle without the NTFF: imports, run creation
callback.flush(3600)
os.utime(big)  # the NTFF is new to the next cycle
base, t0 = start()
profile_rmsnorm(callback)
callback.close()
done(base, t0, run_id=callback.run_id, stored=[str(p) for p in callback.outbox_records])
"""

SYNC = PRELUDE + """
from mlflow_neuron._delivery import mlflow_io as _mlflow_io
from mlflow_neuron._delivery import uploads as _uploads
from mlflow_neuron.cli import sync
outbox, uri = sys.argv[1:3]
base, t0 = start()
delivered, kept = sync(outbox, uri)
done(base, t0, delivered=delivered, kept=kept)
"""


def child(code: str, *args: str, env: dict | None = None) -> dict:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), **(env or {}),
                "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, *args], env=full_env, capture_output=True, text=True,
                          timeout=3600)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    progress = [line for line in (proc.stdout + proc.stderr).splitlines() if "uploading " in line]
    return {**json.loads(lines[-1][len("RESULT "):]), "progress": progress}


def row(name: str, result: dict, size: int) -> str:
    mb = 1e6
    growth = (result["peak"] - result["base"]) / mb
    return (f"{name:<34} {result['seconds']:8.1f} {size / result['seconds'] / mb:8.1f} "
            f"{result['base'] / mb:9.0f} {result['peak'] / mb:9.0f} {growth:9.0f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the sparse NTFF (default: 2)")
    parser.add_argument("--crash", action="store_true",
                        help="also crash the server mid-upload, restart it and sync the outbox")  # fmt: skip
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlflow-neuron-bench-large-"))
    try:
        return measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # moto's objects: gigabytes


def measure(args, work: Path) -> int:
    size = int(args.gib * 1024**3)
    out = work / "neuron_profile"
    out.mkdir()
    big = out / NTFF
    with open(big, "wb") as f:
        f.truncate(size)  # sparse: no disk, reads return zeros
    warm = work / "warm.txt"
    warm.write_text("warm-up\n")

    base_pg, db = postgres_uri(), "mlflow_neuron_bench_large"
    backend = scratch_postgres_database(base_pg, db) if base_pg else None
    with MotoS3(work / "s3") as s3, S3MlflowServer(work / "server", s3, backend, prefix="bench") as server:
        uri = server.uri
        env = {"MLFLOW_TRACKING_URI": uri}
        print(f"{size} bytes ({args.gib:g} GiB) sparse NTFF -> {uri} (mlflow server, "
              f"{'PostgreSQL' if backend else 'sqlite'} backend, --artifacts-destination {server.destination}) "
              f"-> moto S3 at {s3.endpoint}", flush=True)  # fmt: skip

        reference = child(LOG_ARTIFACT, str(big), str(warm), env=env)
        training = child(CALLBACK, uri, str(out), str(work / "outbox-live"), env=env)
        # An outbox record naming the same file: the same callback against a port where nothing listens.
        dead = f"http://127.0.0.1:{free_port()}"
        offline = child(CALLBACK, dead, str(out), str(work / "outbox"),
                        env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})  # fmt: skip
        uploader = child(SYNC, str(work / "outbox"), uri)
        # Again at the end: the first large upload into a fresh server and bucket tends to be slower.
        reference_again = child(LOG_ARTIFACT, str(big), str(warm), env=env)
        if reference_again["seconds"] < reference["seconds"]:
            reference, reference_again = reference_again, reference

        print(f"\n{'':<34} {'seconds':>8} {'MB/s':>8} {'RSS base':>9} {'RSS peak':>9} {'growth':>9}  (MB)")
        print(row("mlflow.log_artifact alone (faster)", reference, size))
        print(row("mlflow.log_artifact alone (other)", reference_again, size))
        print(row("training process (callback)", training, size))
        print(row("uploader (mlflow-neuron sync)", uploader, size))
        ratio = training["seconds"] / reference["seconds"]
        sync_ratio = uploader["seconds"] / reference["seconds"]
        growths = [(r["peak"] - r["base"]) / 1e6 for r in (training, uploader)]
        print(f"\ncallback / log_artifact time: {ratio:.2f}x; sync / log_artifact: {sync_ratio:.2f}x (target <= 1.2x)")
        print(f"RSS growth: training process {growths[0]:.0f} MB, uploader {growths[1]:.0f} MB (target < 100 MB)")
        print(f"offline cycle stored in the outbox: {len(offline['stored'])} record(s); sync delivered "
              f"{uploader['delivered']}, kept {uploader['kept']}")  # fmt: skip
        print("progress lines of the sync:", *uploader["progress"][-3:], sep="\n  ")

        client = MlflowClient(uri)
        manifest_path = client.download_artifacts(training["run_id"], "profiler/step_4/manifest.json", str(work))
        entry = next(e for e in json.loads(Path(manifest_path).read_text())["files"]
                     if e["artifact_path"].endswith(big.name))  # fmt: skip
        print("\nmanifest.json entry of the NTFF (training process):")
        print(json.dumps(entry, indent=2))
        [key] = [k for k in s3.objects() if training["run_id"] in k and k.endswith(big.name)]
        t0 = time.perf_counter()
        stored = s3.sha256(key)
        print(f"S3 object {key}: {s3.objects(key)[key]} bytes, sha256 {stored} "
              f"({'equals' if stored == entry['sha256'] else 'DIFFERS FROM'} the manifest; read back in "
              f"{time.perf_counter() - t0:.0f} s)")  # fmt: skip
        incomplete = s3.client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
        print(f"incomplete multipart uploads left in the bucket: {len(incomplete)}")
        for key in s3.objects():  # moto keeps objects in memory: only the checked one stays
            if key.endswith(NTFF) and training["run_id"] not in key:
                s3.client().delete_object(Bucket=s3.bucket, Key=key)
        if args.crash:
            crash_and_sync(server, s3, out, work, size)
    if backend:
        drop_postgres_database(base_pg, db)
    return 0


def crash_and_sync(server, s3, out: Path, work: Path, size: int) -> None:
    """The server is killed once it holds a quarter of the upload; then restart, sync, check."""
    spooled = []

    def received() -> int:
        """Bytes of the upload the server spooled (one PUT) or S3 holds as parts (multipart)."""
        spool = [p.stat().st_size for p in server.workdir.rglob(NTFF) if p.is_file()]
        client, parts = s3.client(), [0]
        for upload in client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", ()):
            if upload["Key"].endswith(NTFF):
                listed = client.list_parts(Bucket=s3.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                parts.append(sum(p["Size"] for p in listed.get("Parts", ())))
        return max(spool + parts)

    def crash():
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            done = received()
            if done >= size // 4:
                spooled.append(done)
                server.kill()
                return
            time.sleep(0.5)

    crasher = threading.Thread(target=crash, daemon=True)
    crasher.start()
    offline = child(CALLBACK, server.uri, str(out), str(work / "outbox-crash"),
                    env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})  # fmt: skip
    crasher.join(timeout=60)
    run_id = offline["run_id"]
    visible = [k for k in s3.objects() if run_id in k and k.endswith(NTFF)]
    print(f"\nserver killed with {spooled[0] if spooled else 0} of {size} bytes received, spooled on the server "
          "or held by S3 as multipart parts; outbox records: "
          f"{len(offline['stored'])}; objects of that NTFF visible in S3: {len(visible)}")  # fmt: skip
    server.restart()
    t0 = time.perf_counter()
    uploader = child(SYNC, str(work / "outbox-crash"), server.uri)
    client = MlflowClient(server.uri)
    manifest = json.loads(Path(client.download_artifacts(run_id, "profiler/step_4/manifest.json", str(work / "crash")))
                          .read_text())  # fmt: skip
    entry = next(e for e in manifest["files"] if e["artifact_path"].endswith(NTFF))
    [key] = [k for k in s3.objects() if run_id in k and k.endswith(NTFF)]
    stored = s3.sha256(key)
    print(f"after restart, sync: delivered {uploader['delivered']}, kept {uploader['kept']} in "
          f"{time.perf_counter() - t0:.0f} s; S3 object {s3.objects(key)[key]} bytes, sha256 "
          f"{'equals' if stored == entry['sha256'] else 'DIFFERS FROM'} the manifest's {entry['sha256']}")  # fmt: skip
    incomplete = s3.client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    print(f"incomplete (invisible) multipart uploads left in the bucket: {len(incomplete)}")


if __name__ == "__main__":
    sys.exit(main())
