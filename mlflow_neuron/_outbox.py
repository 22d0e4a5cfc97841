"""The local outbox: cycles that could not reach the tracking server, kept for `mlflow-neuron sync`.

One folder per cycle, written under a temporary name and renamed when complete, so a crash never
leaves a half record that sync would trust. Files are hard-linked where possible (no copy, no
extra disk); files above the copy cap are kept as paths to where the profiler left them.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # _record imports torch and pandas: the CLI loads this module before those
    from ._record import Delivery, RunRef

DEFAULT_OUTBOX = "mlflow-neuron-outbox"
RECORD = "record.json"
REJECTED = "rejected"  # records the server refused for good; sync leaves them unless asked
REASON = "reason"  # in a rejected record: one line saying why
FORMAT = 1
DEFAULT_COPY_MAX_BYTES = 64 * 1024**2

_sequence = itertools.count()


def fallback_folder() -> Path:
    """Where the outbox goes when the configured folder cannot be written."""
    return Path(tempfile.gettempdir()) / f"mlflow-neuron-outbox-{os.getuid() if hasattr(os, 'getuid') else 0}"


def put(folder: str | os.PathLike, delivery: Delivery, run: RunRef, *, copy_max_bytes: int,
        rejected: str | None = None) -> Path:  # fmt: skip
    """Stores a delivery; raises OSError when the folder cannot be written.

    With `rejected` (the reason), the record goes to `<folder>/rejected/` with a `reason` file."""
    from ._files import link_or_copy

    folder = Path(folder) / REJECTED if rejected is not None else Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}"
    partial = folder / f".{name}.partial"
    partial.mkdir()
    try:
        files_dir = None
        if delivery.files_dir and Path(delivery.files_dir).is_dir():
            shutil.copytree(delivery.files_dir, partial / "files", copy_function=link_or_copy)
            files_dir = "files"
        uploads, missing = [], []
        for index, (source, artifact_folder) in enumerate(delivery.uploads):
            try:
                size = os.path.getsize(source)
                if size <= copy_max_bytes:
                    target = partial / "uploads" / str(index) / os.path.basename(source)
                    target.parent.mkdir(parents=True)
                    link_or_copy(source, target)
                    source = target.relative_to(partial).as_posix()
                uploads.append([source, artifact_folder])
            except FileNotFoundError:
                missing.append(source)
        record = {
            "format": FORMAT,
            "run": asdict(run),
            **{k: v for k, v in asdict(delivery).items() if k not in ("files_dir", "uploads")},
            "files_dir": files_dir,
            "uploads": uploads,
            "missing_files": missing,
        }
        (partial / RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
        if rejected is not None:
            (partial / REASON).write_text(rejected + "\n", encoding="utf-8")
        final = folder / name
        os.rename(partial, final)
        return final
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def pending(folder: str | os.PathLike) -> list[Path]:
    """Complete records, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and (p / RECORD).is_file())


def rejected(folder: str | os.PathLike) -> list[Path]:
    """Records the server refused for good, oldest first."""
    return pending(Path(folder) / REJECTED)


def reject(record_dir: Path, why: str) -> Path:
    """Moves a pending record to `rejected/`, or updates the reason of one already there."""
    if record_dir.parent.name != REJECTED:
        target = record_dir.parent / REJECTED / record_dir.name
        target.parent.mkdir(exist_ok=True)
        os.rename(record_dir, target)
        record_dir = target
    (record_dir / REASON).write_text(why + "\n", encoding="utf-8")
    return record_dir


def reason_of(record_dir: Path) -> str:
    try:
        return (record_dir / REASON).read_text(encoding="utf-8").strip() or "no reason recorded"
    except OSError:
        return "no reason recorded"


def load(record_dir: Path) -> tuple[Delivery, RunRef]:
    """Reads a record; raises ValueError with the reason when it is not one this version reads."""
    from ._record import Delivery, RunRef

    try:
        data = json.loads((record_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{record_dir}: unreadable outbox record ({error})") from error
    if data.get("format") != FORMAT:
        raise ValueError(f"{record_dir}: outbox record format {data.get('format')!r}, expected {FORMAT}")

    def local(path: str) -> str:
        return path if os.path.isabs(path) else str(record_dir / path)

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
    )
    return delivery, RunRef(**data["run"])


def remove(record_dir: Path) -> None:
    shutil.rmtree(record_dir, ignore_errors=True)
