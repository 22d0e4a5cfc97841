"""The helper's reader of capture requests and plans on the run (`_record.capture_request`).

Each run the callback's schedule profiles leaves `capture-listen.json` in its folder of the outbox.
Every `POLL_S` the helper reads each such run once (one `get_run`: its status and tags) and writes
into the run's folder what the training processes look for at each step: a new request
(`REQUEST_FILE`, which rank 0 plans) and a newer plan of rank 0 (`PLAN_FILE`, which the other ranks
of this node follow). A run that is no longer RUNNING is read no more. A tag value that is not a
request is said once, through the training process's reporter. The drain's errors say what a dead
server means; a failed read here waits for the next.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from pathlib import Path

from . import entries
from .._record.capture_request import (LISTEN_FILE, PLAN_FILE, PLAN_TAG, POLL_S, REQUEST_FILE, REQUEST_TAG,
                                       now_iso, parse_plan, parse_request)  # fmt: skip


class Listener:
    def __init__(self, outbox: Path, credentials: dict[str, str] | None, reporter) -> None:
        self.outbox = Path(outbox)
        self.credentials = credentials or {}
        self.reporter = reporter
        self.ended: set[Path] = set()  # folders of runs found not RUNNING
        self.seen: dict[tuple[Path, str], str] = {}  # (folder, tag) -> the value acted on
        self.requests = 0  # reads of a run made (for the benchmark and tests)

    def follow(self, stop: threading.Event, poll_s: float = POLL_S) -> None:
        """Reads every listened run each `poll_s` until `stop`; never raises."""
        while not stop.wait(poll_s):
            try:
                self.poll()
            except Exception as error:  # noqa: BLE001 - the drain goes on; the next read may do
                self.reporter.problem("capture_listen", "reading capture requests failed", error)

    def poll(self) -> None:
        for listen in sorted(self.outbox.glob(f".ranks-*/{LISTEN_FILE}")):
            folder = listen.parent
            if folder not in self.ended:
                try:
                    self._read(folder, listen)
                except OSError:
                    if folder.is_dir():
                        raise
                    # the run's last local rank left, and took its folder along

    def _read(self, folder: Path, listen: Path) -> None:
        try:
            run = entries.read_json(listen)
        except (OSError, ValueError):
            return
        run_id = run.get("run_id") or (entries.read_run_id(self.outbox, run["run_key"]) if run.get("run_key") else None)
        uri = run.get("tracking_uri")
        if not run_id or not isinstance(uri, str):
            return  # the run is not created yet: its first delivery creates it
        from mlflow.tracking import MlflowClient

        try:
            found = MlflowClient(self.credentials.get(uri, uri)).get_run(run_id)
        except Exception:  # noqa: BLE001 - a dead or busy server: the drain says it; read again later
            return
        finally:
            self.requests += 1
        if found.info.status != "RUNNING":
            self.ended.add(folder)
            return
        tags = found.data.tags
        plan = self._plan(folder, tags.get(PLAN_TAG))
        self._request(folder, tags.get(REQUEST_TAG), plan)

    def _plan(self, folder: Path, value: str | None):
        plan = parse_plan(value) if value else None
        if plan is None or self.seen.get((folder, PLAN_TAG)) == value:
            return plan
        self.seen[(folder, PLAN_TAG)] = value
        try:
            written = parse_plan((folder / PLAN_FILE).read_bytes())
        except OSError:
            written = None
        if written is None or written.start < plan.start:  # never back to an older plan
            entries.write_json(folder / PLAN_FILE, asdict(plan))
        return plan

    def _request(self, folder: Path, value: str | None, plan) -> None:
        if not value or self.seen.get((folder, REQUEST_TAG)) == value:
            return
        self.seen[(folder, REQUEST_TAG)] = value
        try:
            request = parse_request(value, now_iso())
        except ValueError as error:
            self.reporter.problem("capture_request", str(error))
            return
        if plan is None or plan.request != request.id:  # not answered yet
            entries.write_json(folder / REQUEST_FILE, asdict(request))


def start(outbox: Path, credentials: dict[str, str] | None, reporter, stop: threading.Event) -> Listener:
    """The listener on a thread of its own, for the helper's life."""
    listener = Listener(outbox, credentials, reporter)
    threading.Thread(target=listener.follow, args=(stop,), name="mlflow-neuron-listener", daemon=True).start()
    return listener
