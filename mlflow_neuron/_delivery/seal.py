"""An outbox record's seal: what `record.json` must hold, and the size and SHA-256 of every file
the record carries, taken when it was written and checked before anything of it is sent.

A record is only trusted whole: a `record.json` that is not an object of the expected shape, or a
file that is missing, shorter, longer or other than when it was sealed, makes the record damaged
(`DamagedRecord`), and sync sets it aside instead of uploading what a disk or a hand changed.
Files kept as paths to where the profiler left them (above the outbox's copy cap) are the
profiler's, not the record's: they are sent as they are then, or counted as vanished.
Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHECKS = "checks"  # in record.json: {path relative to the record: {"size": bytes, "sha256": hex}}
_CHUNK = 1024 * 1024


class DamagedRecord(ValueError):
    """An outbox record that cannot be trusted: unreadable, of the wrong shape, or its files changed."""


def seal(record_dir: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """Size and SHA-256 of every file under `record_dir` but the top-level names in `skip` and
    hidden ones (record.json itself is written after)."""
    checks = {}
    for path in sorted(p for p in record_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(record_dir)
        if relative.parts[0] in skip or relative.parts[0].startswith("."):
            continue
        checks[relative.as_posix()] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    return checks


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# The fields a record must hold, with the types each may take (None: may be null).
_FIELDS = {
    "run": (dict,),
    "step": (int,),
    "timestamp_ms": (int,),
    "artifact_dir": (str,),
    "metrics": (dict,),
    "tags": (dict,),
    "params": (dict,),
    "files_dir": (str, type(None)),
    "uploads": (list,),
    "table": (str, type(None)),
}


def check_shape(data: object, expected_format: int) -> None:
    """Raises DamagedRecord naming what is wrong when `data` is not a record of `expected_format`."""
    if not isinstance(data, dict):
        raise DamagedRecord(f"record.json holds {type(data).__name__}, not a record")
    if data.get("format") != expected_format:
        raise DamagedRecord(f"record format {data.get('format')!r}, expected {expected_format}")
    missing = [name for name in _FIELDS if name not in data]
    if missing:
        raise DamagedRecord(f"record.json lacks {', '.join(missing)}")
    wrong = [name for name, types in _FIELDS.items() if isinstance(data[name], bool) or not isinstance(data[name], types)]
    if wrong:
        raise DamagedRecord(f"record.json has {', '.join(f'{n} of type {type(data[n]).__name__}' for n in wrong)}")
    if not isinstance(data["run"].get("tracking_uri"), str):
        raise DamagedRecord("record.json names no tracking URI")
    if not all(isinstance(u, list) and len(u) == 2 and all(isinstance(s, str) for s in u) for u in data["uploads"]):
        raise DamagedRecord("record.json has uploads that are not (file, folder) pairs")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data["metrics"].values()):
        raise DamagedRecord("record.json has metrics that are not numbers")


def check_files(record_dir: Path, checks: dict) -> None:
    """Raises DamagedRecord for the first sealed file that is missing or changed."""
    if not isinstance(checks, dict):
        raise DamagedRecord("record.json has checks that are not a table")
    for relative, expected in sorted(checks.items()):
        path = record_dir / relative
        if not isinstance(expected, dict) or Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise DamagedRecord(f"record.json has a bad check for {relative!r}")
        try:
            size = os.lstat(path).st_size
        except OSError:
            raise DamagedRecord(f"{relative} is missing") from None
        if size != expected.get("size"):
            raise DamagedRecord(f"{relative} has {size} bytes, sealed with {expected.get('size')}")
        if sha256_of(path) != expected.get("sha256"):
            raise DamagedRecord(f"{relative} differs from what was sealed (SHA-256 mismatch)")
