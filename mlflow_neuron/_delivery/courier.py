"""Sending prepared entries to their runs: a refusal's Retry-After heeded by whoever drains next, and
a run the callback creates made once.

The drain (`drain`) decides what to send and settles each entry; this is the part that talks to the
server. It runs inside one drain's pass, under the outbox's consumer lock: nothing else sends from
this outbox meanwhile. A server that asked to wait (`Retry-After`, kept in the outbox as a
wall-clock time, `entries.QUIET`) gets nothing before then, from this drain or the next one (the
helper refused, then the training process at close). A run known by its key is created under the
store lock, and its id kept in the outbox (`.run-<key>.id`) for the other processes and the callback.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path

from . import entries
from . import outbox as _outbox
from .entries import TRIED
from .http_budget import retry_after_s
from .._record.model import Delivery, RunRef


class Courier:
    def __init__(self, outbox: Path, *, credentials: dict[str, str] | None = None, tracking_uri: str | None = None,
                 run_id: str | None = None, progress=None) -> None:  # fmt: skip
        self.outbox = outbox
        self.credentials = dict(credentials or {})  # URI without credentials -> the URI with them
        self.tracking_uri, self.run_id = tracking_uri, run_id  # sync's overrides
        self.progress = progress
        self.wrote = False  # something was written to a server
        self._loggers: dict[tuple, object] = {}

    def deliver(self, entries_sent: list[Path], deliveries: list[Delivery], run: RunRef, stop,
                deadline: float | None) -> list[tuple[dict, list[str]]]:  # fmt: skip
        """One attempt, once a refusal's Retry-After has passed (InterruptedError: not within the time left)."""
        self._wait_quiet(stop, deadline)
        return self._deliver_held(entries_sent, deliveries, run)

    def refused(self, seconds: float) -> None:
        """A refusal asked for `seconds` of quiet: kept in the outbox for whoever drains next."""
        with contextlib.suppress(OSError):
            (self.outbox / entries.QUIET).write_text(f"{time.time() + seconds:.3f}", encoding="ascii")

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
            with entries.store_lock(self.outbox):  # a fresh sqlite store makes its schema here: one process at a time
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
