"""What a helper process that is gone left in the outbox: its records, found by its pid.

A helper stopped when the shutdown budget ran out (or one that died) may have stored or delivered
a cycle after the last state it reported, most often on a busy machine, where the helper at nice
19 gets little time. Its records carry its pid and start time in their names
(`<time_ns>-<pid>-...`), so the training process counts them from the folders themselves; what it
delivered is what it settled less those; a job whose record it finished but whose staged folder
it had not removed yet is settled here, not sent again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import outbox as _outbox
from . import staging


def records_of(pid: int, started_ns: int,
               folders: Iterable[Path]) -> tuple[dict[Path, int | None], dict[Path, int | None]]:  # fmt: skip
    """The records (pending, rejected) the helper process `pid`, started at `started_ns`, wrote
    in `folders`, with their steps; its unfinished `.partial` folders are removed (it is gone:
    nothing completes them)."""
    pending: dict[Path, int | None] = {}
    refused: dict[Path, int | None] = {}
    for folder in folders:
        for where, found in ((folder, pending), (folder / _outbox.REJECTED, refused)):
            try:
                entries = list(where.iterdir()) if where.is_dir() else []
            except OSError:
                continue
            for entry in entries:
                name = entry.name
                partial = name.startswith(".") and name.endswith(".partial")
                parts = name.strip(".").split("-")
                if len(parts) < 3 or parts[1] != str(pid) or not parts[0].isdigit():
                    continue
                if int(parts[0]) < started_ns:
                    continue  # an older process with the same pid
                if partial:
                    shutil.rmtree(entry, ignore_errors=True)
                elif (entry / _outbox.RECORD).is_file():
                    found[entry] = record_step(entry)
    return pending, refused


def settle_jobs(given: Iterable, recorded_steps: set) -> int:
    """Removes the staged folders of the jobs whose step has a record (stored: nothing left to
    do); returns how many of `given` are settled."""
    given = list(given)
    for job in given:
        if job.staged_dir.exists() and job.step in recorded_steps:
            staging.discard(job.staged_dir)
    return sum(not job.staged_dir.exists() for job in given)


def exited(proc, wait_s: float) -> bool:
    """Whether the helper's process is gone, waiting at most `wait_s` for it to exit."""
    try:
        proc.proc.wait(wait_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def record_step(record_dir: Path) -> int | None:
    try:
        return json.loads((record_dir / _outbox.RECORD).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class LeftBehind:
    """A helper stopped without its final state: what it left is counted once it has exited."""

    proc: Any  # its HelperProcess
    given: list  # every job handed to it
    started_ns: int
    folders: set[Path]  # the outboxes it may have written to
    counted: tuple[set[Path], set[Path], int]  # stored, rejected, delivered: from its last state

    def extra(self, wait_s: float) -> tuple[int, list[Path], list[Path]] | None:
        """(delivered, stored, rejected) beyond `counted`, once the process is gone; None before."""
        if not exited(self.proc, wait_s):
            return None
        found, found_rejected = records_of(self.proc.proc.pid, self.started_ns, self.folders)
        stored, rejected, delivered = self.counted
        all_stored, all_rejected = stored | set(found), rejected | set(found_rejected)
        settled = settle_jobs(self.given, {*found.values(), *found_rejected.values()})
        total = max(delivered, settled - len(all_stored) - len(all_rejected))
        return total - delivered, sorted(all_stored - stored), sorted(all_rejected - rejected)


class LeftBehinds:
    """Helpers whose leftovers are not counted yet. A killed helper at low priority on a busy machine
    may take a while to exit, and no shutdown budget may wait for it: `count()` is asked again
    whenever the counts are read, and adds each helper once it is gone."""

    def __init__(self) -> None:
        self._waiting: list[LeftBehind] = []
        self._lock = threading.Lock()

    def add(self, left: LeftBehind) -> None:
        with self._lock:
            self._waiting.append(left)

    def count(self, wait_s: float = 0.0) -> tuple[int, list[Path], list[Path]]:
        """What the helpers that have exited since left: (delivered, stored, rejected)."""
        delivered, stored, rejected = 0, [], []
        with self._lock:
            for left in list(self._waiting):
                extra = left.extra(wait_s)
                if extra is not None:
                    self._waiting.remove(left)
                    delivered, stored, rejected = delivered + extra[0], stored + extra[1], rejected + extra[2]
        return delivered, stored, rejected
