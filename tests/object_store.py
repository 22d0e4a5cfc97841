"""An S3-compatible store for tests: moto's S3 server, and `mlflow server` processes that use it.

    with MotoS3(tmp_path / "s3") as s3:                     # http://127.0.0.1:PORT, bucket "mlflow"
        with S3MlflowServer(tmp_path / "srv", s3) as server:  # proxied: --artifacts-destination s3://
            ...
        s3.client().list_objects_v2(Bucket=s3.bucket)

moto's server keeps objects in spooled temporary files: its TMPDIR is its workdir, so a test's
large objects go to that test's tmp_path. Like tests/servers.py, everything binds 127.0.0.1, every
wait is bounded, and a watchdog kills the server's process group if the test process disappears.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

from servers import _LAUNCHER, HOST, MlflowServer, ServerError, free_port, port_is_open

ACCESS_KEY = "testing-key-id"
SECRET_KEY = "testing-secret-key"

_live: weakref.WeakSet[MotoS3] = weakref.WeakSet()


@atexit.register
def _stop_live() -> None:
    for server in list(_live):
        server.stop()


def moto_available() -> str | None:
    """None if moto's server can run here, else why not (for a skip reason)."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as error:
        return f"moto[server] and boto3 are needed for the S3 tests (pip install -e '.[test]'): {error}"
    return None


class MotoS3:
    """moto's S3 server on 127.0.0.1 with one bucket."""

    def __init__(self, workdir: Path, bucket: str = "mlflow", port: int | None = None):
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        self.port = port or free_port()
        self.log_path = self.workdir / "moto.log"
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """What an S3 client (boto3, an mlflow server or client) needs to reach this store."""
        return {
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )  # fmt: skip

    def start(self, timeout: float = 60) -> MotoS3:
        if port_is_open(self.port):
            raise ServerError(f"port {self.port} is already in use")
        code = "import sys; from moto.server import main; sys.exit(main())"
        env = {**os.environ, "TMPDIR": str(self.workdir), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                ["sh", "-c", _LAUNCHER, "moto-launcher", str(os.getpid()),
                 sys.executable, "-c", code, "-H", HOST, "-p", str(self.port)],
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )  # fmt: skip
        _live.add(self)
        deadline = time.monotonic() + timeout
        while not port_is_open(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log_path.read_text(errors="replace")[-3000:]
                raise ServerError(f"moto's S3 server did not start:\n{log}")
            time.sleep(0.1)
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._proc = None
        _live.discard(self)

    def objects(self, prefix: str = "") -> dict[str, int]:
        """Complete objects in the bucket: {key: size}."""
        found, token = {}, None
        for _ in range(1000):
            page = self.client().list_objects_v2(
                Bucket=self.bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {})
            )
            found.update({o["Key"]: o["Size"] for o in page.get("Contents", ())})
            token = page.get("NextContinuationToken")
            if not token:
                break
        return found

    def sha256(self, key: str) -> str:
        """SHA-256 of an object, streamed (constant memory)."""
        body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"]
        digest = hashlib.sha256()
        for chunk in iter(lambda: body.read(1024**2), b""):
            digest.update(chunk)
        return digest.hexdigest()

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class S3MlflowServer(MlflowServer):
    """`mlflow server` whose artifacts live in `s3`, under s3://<bucket>/<prefix>.

    proxied=True: `--serve-artifacts --artifacts-destination s3://...`, clients upload through the
    server and need no S3 credentials. proxied=False: `--no-serve-artifacts --default-artifact-root
    s3://...`, clients write to S3 themselves (they need `s3.env()`).
    """

    def __init__(self, workdir: Path, s3: MotoS3, backend_store_uri: str | None = None, *, prefix: str = "artifacts",
                 proxied: bool = True, extra_args=(), env: dict[str, str] | None = None):  # fmt: skip
        self.destination = f"s3://{s3.bucket}/{prefix}"
        self.proxied = proxied
        workdir = Path(workdir).resolve()
        # A proxied upload is spooled to a temporary file on the server: keep it in workdir.
        server_env = {**s3.env(), "TMPDIR": str(workdir), **(env or {})}
        super().__init__(workdir, backend_store_uri, extra_args=list(extra_args), env=server_env)

    def command(self) -> list[str]:
        cmd = super().command()
        at = cmd.index("--artifacts-destination")
        if self.proxied:
            cmd[at + 1] = self.destination
        else:
            del cmd[at : at + 2]
            cmd[cmd.index("--serve-artifacts")] = "--no-serve-artifacts"
            cmd += ["--default-artifact-root", self.destination]
        return cmd
