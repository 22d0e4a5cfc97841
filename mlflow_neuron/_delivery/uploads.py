"""Uploading profile files of any size: streamed, checksummed as they go, checked at the other end.

A Trainium NTFF reaches gigabytes. Through a proxied-artifact server (`mlflow-artifacts:` URIs, the
usual production setup, whatever store sits behind it) a file goes as one streamed PUT that reads
1 MiB at a time, so memory does not grow with the file, and its SHA-256 is computed from the very
bytes sent, on the sender's thread. Other stores (S3 written directly with MLFLOW_S3_ENDPOINT_URL,
a local store) and MLflow's presigned multipart upload (MLflow 3.17 uses it for files of
MLFLOW_MULTIPART_UPLOAD_MINIMUM_FILE_SIZE, 500 MB, and more when the server's store supports it,
unless MLFLOW_ENABLE_PROXY_MULTIPART_UPLOAD=false; parts go straight to S3) get MLflow's own
`log_artifact`, bounded by its chunk and thread settings, with the checksum read beside it by a
second thread.

A large file's size is then checked on the server. An upload that is cut off fails and is later
sent again whole (sender retry, outbox, `mlflow-neuron sync`): a restart, not a resume. The cut-off
copy never becomes an object: the tracking server spools a proxied upload to a temporary file and
hands it to the store only when the request is complete, and an S3 multipart upload stays
invisible until it is completed (an abandoned one still holds storage until the bucket's
AbortIncompleteMultipartUpload lifecycle rule removes it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

LARGE_FILE_BYTES = 64 * 1024**2  # from here on: progress lines and a size check on the server
READ_BYTES = 1024**2
PROGRESS_EVERY_S = 5.0

_log = logging.getLogger("mlflow_neuron")  # the package's logger (_report.logger)


class UploadIncomplete(OSError):
    """The server holds a different size than was sent: the upload is to be repeated."""


@dataclass(frozen=True)
class Sent:
    artifact_path: str
    size_bytes: int
    sha256: str


class Progress:
    """Progress lines for one large file: at most one per `every_s` seconds, and one at the end."""

    def __init__(self, name: str, total: int, emit: Callable[[str], None], every_s: float = PROGRESS_EVERY_S):
        self.name, self.total, self.emit, self.every_s = name, total, emit, every_s
        self._start = self._last = time.monotonic()
        self._finished = False

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self._finished or (done < self.total and now - self._last < self.every_s):
            return
        self._finished = done >= self.total
        self._last = now
        rate = done / max(now - self._start, 1e-9) / 1e6
        percent = 100.0 * done / self.total if self.total else 100.0
        self.emit(f"uploading {self.name}: {_gib(done)} of {_gib(self.total)} GiB ({percent:.0f}%), {rate:.0f} MB/s")


class HashingReader:
    """A file as a request body: read in 1 MiB pieces, hashed and counted as it is sent.

    Each piece is hashed by a helper thread while the socket sends it (hashlib lets go of the
    GIL), one piece at a time and in order, so at most two pieces are held. `seek(0)` (what
    urllib3 does to send a body again) starts the hash and the count over."""

    def __init__(self, path: str, size: int, progress: Progress | None = None):
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.size = size
        self.sent = 0
        self.progress = progress
        self._hash = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-neuron-sha256")
        self._hashing: Future | None = None

    def __len__(self) -> int:  # requests sets Content-Length from it
        return self.size

    def read(self, n: int = -1) -> bytes:
        data = self._file.read(READ_BYTES)
        self._wait()
        if data:
            self._hashing = self._hasher.submit(self._hash.update, data)
        self.sent += len(data)
        if self.progress is not None:
            self.progress.update(self.sent)
        return data

    def hexdigest(self) -> str:
        self._wait()
        return self._hash.hexdigest()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if (offset, whence) != (0, os.SEEK_SET):
            raise OSError("an upload body can only be rewound to its start")
        self._wait()
        self._hash, self.sent = hashlib.sha256(), 0
        return self._file.seek(0)

    def close(self) -> None:
        self._wait()
        self._hasher.shutdown()
        self._file.close()

    def _wait(self) -> None:
        if self._hashing is not None:
            self._hashing.result()
            self._hashing = None


def file_sha256(path: str | os.PathLike, progress: Progress | None = None) -> str:
    """SHA-256 of a file, read in 1 MiB pieces (constant memory)."""
    digest, done = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress.update(done)
    return digest.hexdigest()


def upload(
    tracking_uri: str, run_id: str, local_path: str, artifact_folder: str | None,
    emit: Callable[[str], None] | None = None,
) -> Sent:  # fmt: skip
    """Uploads one file into the run's artifacts; returns what was sent, with its SHA-256.

    Raises UploadIncomplete when the server ends up with another size, and whatever the artifact
    store raises otherwise (the caller retries or keeps the cycle in the outbox).
    """
    from mlflow.store.artifact.http_artifact_repo import HttpArtifactRepository

    name = os.path.basename(local_path)
    artifact_path = posixpath.join(artifact_folder, name) if artifact_folder else name
    size = os.path.getsize(local_path)
    large = size >= LARGE_FILE_BYTES
    progress = Progress(artifact_path, size, emit or _log.info) if large else None
    repo = _artifact_repo(tracking_uri, run_id)
    if isinstance(repo, HttpArtifactRepository) and not repo._should_multipart_upload(local_path):
        sha256, sent = _put_streamed(repo, local_path, artifact_folder, size, progress)
    else:
        if progress is not None:
            progress.emit(f"uploading {artifact_path}: {_gib(size)} GiB with {type(repo).__name__}")
        sha256, sent = _beside(lambda: repo.log_artifact(local_path, artifact_folder), local_path), size
        if progress is not None:
            progress.update(size)
    if sent != size:
        raise UploadIncomplete(f"{local_path} changed size while it was uploaded ({size} -> {sent} bytes)")
    if large:
        _check_size_on_server(repo, artifact_folder, artifact_path, size)
    return Sent(artifact_path, size, sha256)


def manifest_with_checksums(files_dir: str | os.PathLike, sent: dict[str, Sent],
                            manifest_name: str = "manifest.json") -> str | None:  # fmt: skip
    """The cycle's manifest with the size and SHA-256 of what was sent, or None when there is
    nothing to add. The file itself is left as it is: in an outbox record it is sealed."""
    path = Path(files_dir, manifest_name)
    if not sent or not path.is_file():
        return None
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for entry in manifest.get("files", ()):
        done = sent.get(entry.get("artifact_path"))
        if done is not None:
            if entry.get("size_bytes") not in (None, done.size_bytes):  # rewritten after the cycle
                entry["size_bytes_at_cycle"] = entry["size_bytes"]
            entry.update(size_bytes=done.size_bytes, sha256=done.sha256)
    return json.dumps(manifest, indent=2)


def _put_streamed(repo, local_path: str, artifact_folder: str | None, size: int, progress: Progress | None):
    """MLflow's own proxied PUT (`HttpArtifactRepository.log_artifact`), with a hashing body."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.mime_type_utils import _guess_mime_type
    from mlflow.utils.rest_utils import augmented_raise_for_status, http_request

    name = os.path.basename(local_path)
    endpoint = posixpath.join("/", *([artifact_folder] if artifact_folder else []), name)
    body = HashingReader(local_path, size, progress)
    try:
        response = http_request(
            get_default_host_creds(repo.artifact_uri), endpoint, "PUT", data=body,
            extra_headers={"Content-Type": _guess_mime_type(name)},
        )  # fmt: skip
        augmented_raise_for_status(response)
        return body.hexdigest(), body.sent
    finally:
        body.close()


def _beside(send: Callable[[], None], local_path: str) -> str:
    """Runs `send` while another thread reads the file's SHA-256 (hashlib lets go of the GIL),
    so the checksum costs no time next to an upload that MLflow itself reads."""
    result: list = []

    def digest() -> None:
        try:
            result.append(file_sha256(local_path))
        except BaseException as error:  # noqa: BLE001 - raised below, on the sender's thread
            result.append(error)

    hasher = threading.Thread(target=digest, name="mlflow-neuron-sha256", daemon=True)
    hasher.start()
    try:
        send()
    finally:
        hasher.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _check_size_on_server(repo, artifact_folder: str | None, artifact_path: str, size: int) -> None:
    stored = {f.path: f.file_size for f in repo.list_artifacts(artifact_folder)}
    if artifact_path not in stored:
        raise UploadIncomplete(f"{artifact_path} is not on the server after its upload")
    if stored[artifact_path] is not None and stored[artifact_path] != size:
        raise UploadIncomplete(f"{artifact_path} has {stored[artifact_path]} bytes on the server, {size} were sent")


@functools.lru_cache(maxsize=16)
def _artifact_repo(tracking_uri: str, run_id: str):
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking import MlflowClient

    artifact_uri = MlflowClient(tracking_uri).get_run(run_id).info.artifact_uri
    return get_artifact_repository(artifact_uri, tracking_uri=tracking_uri)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f}"
