"""Sending prepared entries to their runs: one request at a time per outbox, a refusal's Retry-After
heeded by every process, and a run the callback creates made once.

The drain (`drain`) decides what to send and settles each entry; this is the part that talks to the
server. Every attempt holds the outbox's send lock (`entries.SEND_LOCK`): the helper and the
training process prepare cycles side by side, but send in turn. Each HTTP request a drain makes
holds the request lock (`entries.REQUEST_LOCK`, through `Courier.turn`): a server that asked to
wait (`Retry-After`, kept in the outbox as a wall-clock time the moment it is read) gets nothing
from any drain before then, even from one that found the send lock held past its patience. A run
known by its key is created under the store lock, and its id kept in the outbox (`.run-<key>.id`)
for the other processes and the callback.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

from . import entries
from . import outbox as _outbox
from .entries import TRIED
from .http_budget import gated, retry_after_s
from .._record.model import Delivery, RunRef


# The send lock keeps the drains of one outbox from sending at once (one server, one queue). A
# drain that waited this long for it sends anyway: a helper starved of CPU beside busy cores held
# it through a whole delivery, and the training process, draining at close, sent nothing (0 of 12
# cycles in 10 s). Retry-After is still heeded: each request waits for the request lock (as long,
# at most), then reads the outbox's quiet time. Reading it once before a batch was not enough: a
# drain sending without the send lock wrote 0.08 s after the lock's holder was refused.
SEND_LOCK_PATIENCE_S = 2.0


class Courier:
    def __init__(self, outbox: Path, *, credentials: dict[str, str] | None = None, tracking_uri: str | None = None,
                 run_id: str | None = None, progress=None) -> None:  # fmt: skip
        self.outbox = outbox
        self.credentials = dict(credentials or {})  # URI without credentials -> the URI with them
        self.tracking_uri, self.run_id = tracking_uri, run_id  # sync's overrides
        self.progress = progress
        self.wrote = False  # something was written to a server
        self._loggers: dict[tuple, object] = {}
        self._stop, self._deadline = None, None  # of the pass whose requests are gated (`gated`)

    def deliver(self, entries_sent: list[Path], deliveries: list[Delivery], run: RunRef, stop,
                deadline: float | None) -> list[tuple[dict, list[str]]]:  # fmt: skip
        """One attempt, holding the outbox's send lock where it comes within `SEND_LOCK_PATIENCE_S`;
        nothing goes out before a refusal's Retry-After has passed, for any entry and from any
        process draining this outbox (the helper, and training while it waits)."""
        held = self._lock(entries.SEND_LOCK, deadline)
        try:
            self._wait_quiet(stop, deadline)
            return self._deliver_held(entries_sent, deliveries, run)  # each request in turn: `Drain.once` is gated
        finally:
            if held is not None:
                held.release()

    @contextlib.contextmanager
    def gated(self, stop, deadline):
        """Every HTTP request this thread makes inside waits its turn (`turn`)."""
        outer = self._stop, self._deadline
        self._stop, self._deadline = stop, deadline
        try:
            with gated(self):
                yield
        finally:
            self._stop, self._deadline = outer

    @contextlib.contextmanager
    def turn(self):
        """One request: with the request lock (or without it, past `SEND_LOCK_PATIENCE_S`), after
        the quiet time a refusal asked for."""
        held = self._lock(entries.REQUEST_LOCK, self._deadline)
        try:
            self._wait_quiet(self._stop, self._deadline)
            yield
        finally:
            if held is not None:
                held.release()

    def refused(self, seconds: float) -> None:
        """A refusal asked for `seconds` of quiet: kept in the outbox for every drain, at once."""
        with contextlib.suppress(OSError):
            (self.outbox / entries.QUIET).write_text(f"{time.time() + seconds:.3f}", encoding="ascii")

    def _lock(self, name: str, deadline: float | None):
        """The outbox's lock `name`, waited for up to `SEND_LOCK_PATIENCE_S`; None past it."""
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        patience = SEND_LOCK_PATIENCE_S if left is None else min(left, SEND_LOCK_PATIENCE_S)
        held = entries.lock_file(self.outbox / name, blocking=True, timeout=patience)
        if held is None and left is not None and left <= patience:
            raise InterruptedError("another process was sending from this outbox until the time ran out")
        return held

    def _wait_quiet(self, stop, deadline) -> None:
        quiet = self._quiet_until() - time.time()
        if quiet > 0:
            if (deadline is not None and time.monotonic() + quiet >= deadline) or (
                    stop is not None and (stop.is_set() or stop.wait(quiet))):  # fmt: skip
                raise InterruptedError(f"the server asked to wait {quiet:.0f} s more, past the time left")
            if stop is None:
                time.sleep(quiet)

    def _deliver_held(self, entries_sent: list[Path], deliveries: list[Delivery], run: RunRef) -> list:
        logger = self.logger(run)
        fresh = not any((entry / TRIED).exists() for entry in entries_sent)
        for entry in entries_sent:
            with contextlib.suppress(OSError):
                (entry / TRIED).touch(mode=0o600)
        retry_after_s()  # forget a refusal from before this attempt
        self.wrote = True
        try:
            return logger.deliver_many(deliveries, fresh=fresh)
        except Exception:
            asked = retry_after_s()
            if asked:  # already kept by `refused`, when the refusal was read; kept from its end too
                self.refused(asked)
            raise

    def quiet_s(self) -> float:
        """Seconds until the server takes requests again (0: now)."""
        return max(self._quiet_until() - time.time(), 0.0)

    def _quiet_until(self) -> float:
        """The wall-clock time before which the server asked not to be sent anything (0: none)."""
        try:
            return float((self.outbox / entries.QUIET).read_text(encoding="ascii"))
        except (OSError, ValueError):
            return 0.0

    def logger(self, run: RunRef, *, create: bool = True):
        """One RunLogger per run and server; the server probed once; a run the callback creates is
        created once across processes (under the store lock, its id kept in the outbox)."""
        from .mlflow_io import RunLogger
        from .failures import check_reachable

        if self.run_id:
            run = RunRef(run.tracking_uri, self.run_id)
        run = replace(run, tracking_uri=self.uri(run))
        key = (run.tracking_uri, run.run_id, run.run_key)
        logger = self._loggers.get(key)
        if logger is None:
            check_reachable(run.tracking_uri)
            # A fresh sqlite store creates its schema here (MLflow's client makes it): one process
            # at a time. A store that has its schema is opened without the lock: a helper starved
            # beside busy cores, opening it under the lock, kept the training process's own drain
            # waiting at close (0 of 12 cycles arrived).
            with contextlib.nullcontext() if store_ready(run.tracking_uri) else entries.store_lock(self.outbox):
                logger = RunLogger(run, progress=self.progress)
                logger.warm()
            self._loggers[key] = logger
        if logger.run.run_id is None and run.run_key:
            with entries.store_lock(self.outbox):
                known = entries.read_run_id(self.outbox, run.run_key)
                if known:
                    logger.run = replace(logger.run, run_id=known)
                elif create:
                    logger.ensure_run()
                    with contextlib.suppress(OSError):
                        entries.run_id_file(self.outbox, run.run_key).write_text(logger.run.run_id, encoding="ascii")
                else:
                    found = logger._runs_with_key()
                    logger.run = replace(logger.run, run_id=found[0].info.run_id if found else None)
        return logger

    def uri(self, run: RunRef) -> str:
        return self.tracking_uri or self.credentials.get(run.tracking_uri, run.tracking_uri)

    def server(self, run: RunRef) -> str:
        """The server a run is sent to, as named in messages (without credentials)."""
        return _outbox.without_credentials(self.uri(run))


def store_ready(tracking_uri: str) -> bool:
    """Whether opening this store creates nothing: a tracking server (it made its own schema), or a
    sqlite file whose schema is at MLflow's latest revision. Another database: False (not checked)."""
    if tracking_uri.startswith(("http://", "https://")):
        return True
    if not tracking_uri.startswith("sqlite:///"):
        return False
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or not os.path.isfile(path):
        return False
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        with contextlib.closing(sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True, timeout=1.0)) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
        return row is not None and row[0] == _get_latest_schema_revision()
    except Exception:  # noqa: BLE001 - anything unsure: take the lock
        return False
