"""The run's folder in the node's outbox as the schedule sees it: requests and plans, looked at once
a step for the cost of one `stat` (`_record.capture_request` tells the way a capture travels).

A file renamed into the folder changes the folder's modification time, so the schedule reads the
two files only when that time moved. Where the file system keeps times in coarse ticks, a rename
in the same tick as the last look leaves the time as it was: while the folder's time is recent
(`SETTLE_NS`), the files are read at each step.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

from .._delivery import entries
from .._delivery.outbox import plain_run, private_folder
from .._record.capture_request import LISTEN_FILE, PLAN_FILE, REQUEST_FILE, Plan, Request, parse_plan
from .._record.model import RunRef

SETTLE_NS = 100_000_000  # a folder time this recent may hide a rename in the same tick: look again


class Plans:
    """The run's folder (`_delivery.node_parts.run_folder`): what a helper wrote there (requests,
    and plans from the run's tags) and what rank 0 writes there (its plans)."""

    def __init__(self, folder: Path, run: RunRef) -> None:
        self.folder = folder
        self._seen_ns: int | None = None
        self._recent = False
        private_folder(folder)
        listen = plain_run(run)
        path = folder / LISTEN_FILE
        if _read(path) != listen:  # every rank writes the same: the node's helper reads the run's tags
            entries.write_json(path, listen)

    def changed(self) -> bool:
        """Whether the folder may hold something new since the last call (one `stat`)."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except OSError:
            return False
        if mtime == self._seen_ns and not self._recent:
            return False
        self._seen_ns = mtime
        self._recent = time.time_ns() - mtime < SETTLE_NS
        return True

    def request(self) -> Request | None:
        data = _read(self.folder / REQUEST_FILE)
        try:
            return Request(**data) if data else None
        except TypeError:
            return None

    def plan(self) -> Plan | None:
        try:
            return parse_plan((self.folder / PLAN_FILE).read_bytes())
        except OSError:
            return None

    def write(self, plan: Plan) -> None:
        """Rank 0's plan, for the ranks of its node (whole or not at all)."""
        entries.write_json(self.folder / PLAN_FILE, asdict(plan))


def _read(path: Path) -> dict | None:
    """The object in `path`, or None where there is none (absent, damaged, not an object)."""
    try:
        return entries.read_json(path)
    except (OSError, ValueError):
        return None
