"""Cycles handed to the helper process are staged inside the outbox, each with its job: a write-ahead
record that outlives every process that holds the cycle.

A handed-off cycle's files (the trace Kineto saved, then the tables made from it) are written in
`<outbox>/.job-<time>-<pid>-<seq>/staged/`, and beside them `job.json`: the job as the helper gets it,
the run, the preparer's settings, and its owners (the training process and its helper). The folder
goes when the cycle is settled: delivered, or stored as an outbox record. So a job folder whose
owners have all ended, killed or not, names a cycle nobody delivered, and `sync` finishes it: it
prepares the cycle from its staged trace into an outbox record and replays that (`finish`).

Why not in $TMPDIR: the helper delivers what was queued after training's process has ended; a
container or a job step that ends with training kills the helper too, and its queue must survive it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from . import outbox as _outbox

PREFIX = ".job-"  # dot: invisible to the record listing (`outbox.pending`, `not_records`)
JOB = "job.json"
STAGED = "staged"

_sequence = itertools.count()


def new_staged_folder(folder: str | os.PathLike) -> Path:
    """A fresh job folder in the outbox `folder`; returns its `staged/` folder. Where the outbox cannot
    be written, the fallback outbox; where neither can, a temporary folder (no write-ahead)."""
    name = f"{PREFIX}{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}"
    for outbox in (folder, _outbox.fallback_folder()):
        try:
            staged = _outbox.private_folder(outbox) / name / STAGED
            staged.mkdir(parents=True, mode=0o700)
            return staged
        except OSError:
            continue
    return Path(tempfile.mkdtemp(prefix="mlflow-neuron-"))


def is_job_folder(folder: Path) -> bool:
    return folder.name.startswith(PREFIX)


def job_header(run: dict, preparer: dict) -> str:
    """What every job of one helper shares (the run, the preparer's settings and op keys), as JSON
    once: the training thread then writes only each job's own part."""
    return json.dumps({"format": 1, "run": run, "preparer": preparer})


def write_job(staged: Path, header: str, job_message: dict, owners: tuple[int, ...]) -> bool:
    """Writes the job's record beside its staged files (whole or not at all); False where it is not
    staged in a job folder or could not be written (then it is held in memory only, as before)."""
    folder = staged.parent
    if not is_job_folder(folder) or not header.endswith("}"):
        return False
    partial = folder / f".{JOB}.partial"
    try:
        own = json.dumps({"owners": list(owners), "job": {**job_message, "staged_dir": STAGED}})
        partial.write_text(f"{header[:-1]}, {own[1:]}", encoding="utf-8")
        os.chmod(partial, 0o600)
        os.replace(partial, folder / JOB)
        return True
    except (OSError, TypeError, ValueError):
        with contextlib.suppress(OSError):
            partial.unlink()
        return False


def discard(staged: Path) -> None:
    """The cycle is settled: its staged files go, and its job folder with them."""
    folder = staged.parent
    if is_job_folder(folder) and staged.name == STAGED:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        shutil.rmtree(staged, ignore_errors=True)


def abandoned(folder: str | os.PathLike) -> list[Path]:
    """Job folders in the outbox `folder` whose owners have all ended, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if is_job_folder(p) and p.is_dir() and not _owned(p))


def _owned(job_folder: Path) -> bool:
    try:
        owners = json.loads((job_folder / JOB).read_text(encoding="utf-8"))["owners"]
    except (OSError, ValueError, KeyError, TypeError):
        owners = [_writer_pid(job_folder.name)]  # not handed over yet, or its record is unreadable
    return any(_outbox.alive(pid) for pid in owners)


def _writer_pid(name: str) -> int | None:
    try:
        return int(name[len(PREFIX):].split("-")[1])
    except (IndexError, ValueError):
        return None


def finish(job_folder: Path, reporter) -> Path | None:
    """Turns an abandoned job folder into an outbox record (its cycle prepared from the staged trace,
    as the helper would have), then removes it. Returns the record; None when the cycle was settled
    already (its staged files are gone: delivered or stored just before its owner ended). Raises
    ValueError when the job folder cannot be read (the caller sets it aside)."""
    from .job import CycleJob  # the preparer reads traces: only sync, which finishes jobs, needs it
    from .model import RunRef
    from .prepare import Preparer

    staged = job_folder / STAGED
    if not staged.is_dir():
        shutil.rmtree(job_folder, ignore_errors=True)
        return None
    try:
        record = json.loads((job_folder / JOB).read_text(encoding="utf-8"))
        job = CycleJob.from_message({**record["job"], "staged_dir": str(staged)})
        run = RunRef(**record["run"])
        settings = dict(record["preparer"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"its {JOB} cannot be read ({type(error).__name__}: {error})") from error
    known = settings.pop("known", {})
    preparer = Preparer(reporter, **settings)
    preparer.absorb(known)
    job.tried = True  # its helper may have written part of it
    delivery = preparer.prepare(job)
    placed = _outbox.put(job_folder.parent, delivery, run, copy_max_bytes=_outbox.DEFAULT_COPY_MAX_BYTES)
    shutil.rmtree(job_folder, ignore_errors=True)
    return placed
