"""The outbox's records: a prepared cycle's `record.json`, its privacy, and `rejected/` and `damaged/`.

The queue itself (an entry per cycle, its states and locks) is `entries`; a prepared entry holds a
record written here (`write_record`), with record.json renamed in last, so a crash never leaves a
half record that sync would trust. Files are hard-linked where possible (no copy, no extra disk);
files above the copy cap are kept as paths to where the profiler left them. Each record is sealed
(`seal`: the size and SHA-256 of its files); one that fails its seal is set aside in `damaged/`
with a reason, never sent. `put` writes a whole record elsewhere in one go (tests, benchmarks).
A cycle's files are placed without holding them in memory (`link_or_copy`).

The outbox is private: on a shared Trainium host other users must neither read records nor plant
them. The folder is created 0700 and its files 0600; an existing folder that is a symlink or
belongs to another user is refused, never followed. Records hold no credentials: a tracking URI's
user:password@ is dropped, and the environment (MLFLOW_TRACKING_USERNAME/PASSWORD, AWS_*)
supplies credentials again at sync.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import stat
import tempfile
import time
import urllib.parse
from dataclasses import asdict
from pathlib import Path

from .._record.model import Delivery, RunRef
from .seal import CHECKS, DamagedRecord, check_files, check_shape, seal

DEFAULT_OUTBOX = "mlflow-neuron-outbox"
RECORD = "record.json"
JOB = "job.json"  # a queued cycle, not prepared yet (`entries`)
END = "end.json"  # a run's end, queued after its cycles (`entries`)
REJECTED = "rejected"  # records the server refused for good; sync leaves them unless asked
DAMAGED = "damaged"  # records that failed their seal or are not records; sync leaves them unless asked
REASON = "reason"  # in a rejected or damaged record: one line saying why
PARTIAL = ".partial"  # a record being written: `.<name>.partial`, renamed to `<name>` when complete
FORMAT = 1
DEFAULT_COPY_MAX_BYTES = 64 * 1024**2

_sequence = itertools.count()


def fallback_folder() -> Path:
    """Where the outbox goes when the configured folder cannot be written."""
    return Path(tempfile.gettempdir()) / f"mlflow-neuron-outbox-{os.getuid() if hasattr(os, 'getuid') else 0}"


def put(outbox: str | os.PathLike, delivery: Delivery, run: RunRef, *, copy_max_bytes: int,
        rejected: str | None = None) -> Path:  # fmt: skip
    """Stores a delivery, private to this user (folders 0700, files 0600); raises OSError when the
    folder cannot be written, OutboxRefused when it is not this user's private folder.

    With `rejected` (the reason), the record goes to `<folder>/rejected/` with a `reason` file."""
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}"
    for attempt in (1, 2):
        folder = private_folder(outbox) if rejected is None else private_folder(private_folder(outbox) / REJECTED)
        partial = folder / f".{name}{PARTIAL}"
        try:
            partial.mkdir(mode=0o700)
            break
        except FileNotFoundError:  # the empty outbox was removed meanwhile (another sender's close)
            if attempt == 2:
                raise
    try:
        if delivery.files_dir and Path(delivery.files_dir).is_dir():
            shutil.copytree(delivery.files_dir, partial / "files", copy_function=link_or_copy)
        write_record(partial, delivery, run, copy_max_bytes=copy_max_bytes,
                     files_dir="files" if delivery.files_dir and Path(delivery.files_dir).is_dir() else None)
        if rejected is not None:
            _write_private(partial / REASON, rejected + "\n")
        final = folder / name
        os.rename(partial, final)
        return final
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def write_record(record_dir: Path, delivery: Delivery, run: RunRef, *, copy_max_bytes: int,
                 files_dir: str | None, skip: tuple[str, ...] = ()) -> None:
    """Writes `record.json` into `record_dir`, whose `files_dir` (relative) holds the delivery's
    generated files: profile files up to `copy_max_bytes` are linked in (above that, kept as
    paths), everything but the top-level names in `skip` is sealed, and record.json comes last,
    renamed into place."""
    uploads, missing = [], []
    for index, (source, artifact_folder) in enumerate(delivery.uploads):
        try:
            size = os.path.getsize(source)
            if size <= copy_max_bytes:
                target = record_dir / "uploads" / str(index) / os.path.basename(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    link_or_copy(source, target)
                source = target.relative_to(record_dir).as_posix()
            uploads.append([source, artifact_folder])
        except FileNotFoundError:
            missing.append(source)
    record = {
        "format": FORMAT,
        "run": plain_run(run),
        **{k: v for k, v in asdict(delivery).items() if k not in ("files_dir", "uploads")},
        "files_dir": files_dir,
        "uploads": uploads,
        "missing_files": missing,
    }
    _make_private(record_dir)
    record[CHECKS] = seal(record_dir, skip=skip)
    partial = record_dir / f".{RECORD}.partial"
    _write_private(partial, json.dumps(record, indent=1))
    os.replace(partial, record_dir / RECORD)


def pending(folder: str | os.PathLike) -> list[Path]:
    """The cycles in the queue (prepared records and queued jobs), oldest first. Raises
    OutboxRefused for a folder that is not private."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    check_private(folder)
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and ((p / RECORD).is_file()
                                                                                or (p / JOB).is_file()))


def rejected(folder: str | os.PathLike) -> list[Path]:
    """Records the server refused for good, oldest first."""
    return pending(Path(folder) / REJECTED)


def damaged(folder: str | os.PathLike) -> list[Path]:
    """Records set aside because they failed their seal or were not records, oldest first."""
    folder = Path(folder) / DAMAGED
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def reject(record_dir: Path, why: str) -> Path:
    """Moves a pending record to `rejected/`, or updates the reason of one already there."""
    return set_aside(record_dir, why, into=REJECTED)


def set_aside(record_dir: Path, why: str, *, into: str, name: str | None = None) -> Path:
    """Moves a record to `<outbox>/<into>/` with a `reason` file (or updates the reason of one
    already there)."""
    if record_dir.parent.name != into:
        target = private_folder(record_dir.parent / into) / (name or record_dir.name)
        os.rename(record_dir, target)
        record_dir = target
    _write_private(record_dir / REASON, why + "\n")
    return record_dir


def restore(record_dir: Path) -> Path:
    """Moves a record from `rejected/` or `damaged/` back among the pending ones."""
    target = record_dir.parent.parent / record_dir.name
    os.rename(record_dir, target)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target / REASON)
    return target


def reason_of(record_dir: Path) -> str:
    try:
        return (record_dir / REASON).read_text(encoding="utf-8").strip() or "no reason recorded"
    except OSError:
        return "no reason recorded"


def load(record_dir: Path, *, check_seal: bool = True) -> tuple[Delivery, RunRef]:
    """Reads a record and checks its seal; raises DamagedRecord (a ValueError) saying why when it
    is not a whole record this version reads. `check_seal=False`: a record this process has just
    written, whose files it need not read again."""
    try:
        data = json.loads((record_dir / RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedRecord("it has no record.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DamagedRecord(f"unreadable record.json ({error})") from error
    check_shape(data, FORMAT)
    if check_seal and CHECKS in data:  # records of versions before seals have none
        check_files(record_dir, data[CHECKS])

    def local(path: str) -> str:
        return path if os.path.isabs(path) else str(record_dir / path)

    try:
        delivery = Delivery(
            step=data["step"],
            timestamp_ms=data["timestamp_ms"],
            artifact_dir=data["artifact_dir"],
            metrics=data["metrics"],
            tags=data["tags"],
            params=data["params"],
            files_dir=local(data["files_dir"]) if data["files_dir"] else None,
            uploads=tuple((local(src), folder) for src, folder in data["uploads"]),
            table=data["table"],
            series=tuple((key, value, step) for key, value, step in data.get("series", ())),
            timeline=data.get("timeline"),  # records from before timelines have none
            trace_spans=data.get("trace_spans"),  # records from before it have none: timeline.json is read
            summary=tuple((key, value) for key, value in data.get("summary", ())),
            summary_at=tuple(data["summary_at"]) if data.get("summary_at") else None,  # fmt: skip
            placed=tuple((name, path) for name, path in data.get("placed", ())),  # records from before: none
        )
        return delivery, RunRef(**data["run"])
    except (TypeError, ValueError) as error:
        raise DamagedRecord(f"record.json does not describe a cycle ({error})") from error


def run_key_of(record_dir: Path) -> str | None:
    """The run key a record (or a queued job) names, read without checking its seal (None when
    unreadable)."""
    for name in (RECORD, JOB):
        try:
            data = json.loads((record_dir / name).read_text(encoding="utf-8"))
            return data["run"].get("run_key")
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return None


def remove(record_dir: Path) -> None:
    shutil.rmtree(record_dir, ignore_errors=True)


# -- privacy ------------------------------------------------------------------------------------


class OutboxRefused(OSError):
    """An outbox folder that is a symlink or belongs to another user: never followed or used."""


def private_folder(folder: str | os.PathLike) -> Path:
    """`folder`, created with mode 0700 if missing (parents as usual), else checked and tightened.

    Raises OutboxRefused for a symlink, something that is not a folder, or another user's folder.
    """
    folder = Path(folder)
    if not os.path.lexists(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # created meanwhile by someone else: the check below decides
            pass
    info = check_private(folder)
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, 0o700)  # ours, made before outboxes were private: close it now
    return folder


def check_private(folder: Path) -> os.stat_result:
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise OutboxRefused(
            f"outbox {folder} is a symbolic link; refusing to follow it (another user could point it "
            "anywhere). Remove the link or pass another outbox folder"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise OutboxRefused(f"outbox {folder} exists and is not a folder")
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and info.st_uid != uid:
        raise OutboxRefused(
            f"outbox {folder} belongs to uid {info.st_uid}, not to this user (uid {uid}); refusing to "
            "read or write records there. Remove it or pass another outbox folder"
        )
    return info


def plain_run(run: RunRef) -> dict:
    """`run` as written to disk: its fields, its tracking URI without credentials."""
    return {**asdict(run), "tracking_uri": without_credentials(run.tracking_uri)}


def without_credentials(uri: str) -> str:
    """`uri` without the user:password@ part (the environment supplies credentials at sync)."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _write_private(path: Path, text: str) -> None:
    """Writes `text` to `path` as a 0600 file (replacing an earlier one; never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def _make_private(record_dir: Path) -> None:
    """Folders 0700; files 0600, except hard links to the profiler's own files, whose mode is the
    user's (chmod would change the original); the 0700 folders keep others out of those."""
    for root, dirnames, filenames in os.walk(record_dir):
        for name in dirnames:
            os.chmod(os.path.join(root, name), 0o700)
        generated = Path(root).relative_to(record_dir).parts[:1] == ("files",)
        for name in filenames:
            path = os.path.join(root, name)
            if generated or os.lstat(path).st_nlink == 1:
                os.chmod(path, 0o600)


# -- a cycle's files, without holding them in memory: links, copies --------------------------------------


def link_or_copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """A hard link where the filesystem allows (no copy, no extra disk), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def sent_files(delivery: Delivery, vanished: list[str] = ()) -> dict[str, int]:
    """{path: bytes} of every file a delivery uploads: the generated ones and the profile's own."""
    files = {}
    if delivery.files_dir and os.path.isdir(delivery.files_dir):
        trace_spans = Path(delivery.files_dir, delivery.trace_spans) if delivery.trace_spans else None  # not an artifact
        for path in Path(delivery.files_dir).rglob("*"):
            if path.is_file() and path != trace_spans:
                files[str(path)] = path.stat().st_size
    for source, _ in delivery.uploads:
        if source not in vanished and os.path.isfile(source):
            files[source] = os.path.getsize(source)
    return files


def nothing_to_send(d: Delivery) -> bool:
    """Whether a delivery holds nothing for the server (a rank's cycle whose summary went to its
    node's file, `node_parts`): it is settled without a request."""
    if d.metrics or d.tags or d.params or d.uploads or d.table or d.series or d.timeline or d.summary or d.placed:
        return False
    return not (d.files_dir and any(p.is_file() for p in Path(d.files_dir).rglob("*")))


def human_size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
