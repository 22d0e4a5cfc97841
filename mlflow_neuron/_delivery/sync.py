"""Replaying the outbox: one loop for the sender (its own records, as the server comes back) and
for `mlflow-neuron sync` (every record, into the runs they name).

`replay` sends one stored record and settles it: delivered (removed), refused for good (moved to
`rejected/`), damaged (its seal failed: moved to `damaged/`, never sent), or kept (the server is
away). Each record is locked while it is sent, and `sync` holds the outbox's lock (`locks`): two
processes never send one record at once. Sending a record twice leaves its data once, so a replay
that is cut off can simply run again.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import locks, outbox, staging
from .failures import is_permanent, is_unreachable, reason
from .files import human_size, sent_files
from .model import Delivery, RunRef
from .report import RedactingStream
from .seal import DamagedRecord

DELIVERED, REJECTED, DAMAGED, KEPT, UNREACHABLE = "delivered", "rejected", "damaged", "kept", "unreachable"
BUSY, GONE = "busy", "gone"  # another process is sending it; another process settled it


@dataclass(frozen=True)
class Replayed:
    """What became of one outbox record."""

    outcome: str  # DELIVERED | REJECTED | DAMAGED | KEPT | UNREACHABLE | BUSY | GONE
    why: str = ""  # for every outcome but DELIVERED
    delivery: Delivery | None = None
    run: RunRef | None = None
    files: dict[str, int] = field(default_factory=dict)  # what was sent: path -> bytes
    vanished: list[str] = field(default_factory=list)  # profile files gone before they were sent
    error: Exception | None = None
    path: Path | None = None  # a rejected or damaged record's new place


def replay(record_dir: Path, logger_for: Callable[[RunRef], object]) -> Replayed:
    """Sends one stored record through `logger_for(its run)` (a `RunLogger`) and settles it,
    holding the record's lock; a record another process holds or has settled is left alone."""
    with locks.record_lock(record_dir) as lock:
        if lock == locks.BUSY:
            return Replayed(BUSY, "another process is sending it")
        if lock == locks.GONE:
            return Replayed(GONE, "another process delivered it or set it aside")
        return _replay_held(record_dir, logger_for)


def _replay_held(record_dir: Path, logger_for: Callable[[RunRef], object]) -> Replayed:
    try:
        delivery, run = outbox.load(record_dir)
    except DamagedRecord as damage:
        try:
            moved = outbox.set_aside(record_dir, str(damage), into=outbox.DAMAGED)
        except OSError as unmoved:
            return Replayed(KEPT, f"damaged ({damage}); it could not be set aside ({unmoved})", error=damage)
        return Replayed(DAMAGED, str(damage), error=damage, path=moved)
    try:
        logger = logger_for(run)
        _, vanished = logger.deliver(delivery)
    except Exception as error:  # noqa: BLE001 - classified here; the caller reports it
        if is_unreachable(error):
            return Replayed(UNREACHABLE, reason(error), delivery, run, error=error)
        if is_permanent(error):
            try:
                moved = outbox.reject(record_dir, reason(error))
            except OSError as unmoved:
                return Replayed(KEPT, f"{reason(error)}; it could not be set aside ({unmoved})", delivery, run,
                                error=error)  # fmt: skip
            return Replayed(REJECTED, reason(error), delivery, run, error=error, path=moved)
        return Replayed(KEPT, reason(error), delivery, run, error=error)
    files = sent_files(delivery, vanished)  # counted before the record's copies are removed
    outbox.remove(record_dir)
    return Replayed(DELIVERED, "", delivery, logger.run, files, vanished)


@dataclass
class SyncResult:
    """What one `sync` did. Unpacks as (delivered, kept) like earlier versions."""

    delivered: int = 0
    kept: int = 0  # deliverable records still in the outbox (a transient failure, or another process had it)
    rejected: int = 0  # records refused for good, now or earlier, left in <outbox>/rejected
    damaged: int = 0  # records this sync set aside in <outbox>/damaged (with --retry-damaged: still damaged)
    unreachable: dict[str, str] = field(default_factory=dict)  # tracking URI -> why it did not answer
    refused: str | None = None  # why the outbox folder itself was not read (a link, another user's)
    busy: str | None = None  # another sync holds the outbox: nothing was done
    changed: bool = False  # something was written to a server (a run created, data logged)

    def __iter__(self):
        return iter((self.delivered, self.kept))


def sync_outbox(folder: str, tracking_uri: str | None = None, out=None, *, retry_rejected: bool = False,
                retry_damaged: bool = False, run_id: str | None = None, err=None) -> SyncResult:  # fmt: skip
    """Replays outbox records into their runs, one line per record, then a summary.

    Holds the outbox's lock throughout: a second sync on it says who holds it and does nothing. A
    record the server refuses for good moves to `<outbox>/rejected/`, one that fails its seal to
    `<outbox>/damaged/`, each with a `reason` file; those are only tried again with
    `retry_rejected` (into `run_id` if given) or `retry_damaged`. A run that the callback would
    have created and ended is ended (FINISHED) once all its records are in; a run it was given is
    left as it is. Whatever it prints names no password.
    """
    out, err = RedactingStream(out or sys.stdout), RedactingStream(err or sys.stderr)
    result = SyncResult()
    try:
        if Path(folder).is_dir():
            outbox.check_private(Path(folder))  # a link or another user's folder: never read
            with locks.sync_lock(Path(folder)):
                _sync_held(folder, tracking_uri, out, err, result, retry_rejected, retry_damaged, run_id)
        else:
            _summary(result, 0, folder, retry_rejected, out)
    except outbox.OutboxRefused as refused:
        result.refused = str(refused)
        print(f"mlflow-neuron sync: error: {refused}", file=err, flush=True)
    except locks.OutboxBusy as busy:
        result.busy = str(busy)
        print(f"mlflow-neuron sync: {busy}", file=err, flush=True)
    return result


def _sync_held(folder: str, tracking_uri: str | None, out, err, result: SyncResult, retry_rejected: bool,
               retry_damaged: bool, run_id: str | None) -> None:  # fmt: skip
    _tidy(folder, result, out)
    if retry_rejected:
        records = outbox.rejected(folder)
    elif retry_damaged:
        records = [outbox.restore(record) for record in outbox.damaged(folder)]
    else:
        records = outbox.pending(folder)
    loggers = _Loggers(tracking_uri, run_id, out)
    for index, record_dir in enumerate(records, 1):
        prefix = f"[{index}/{len(records)}] {record_dir.name}"
        done = replay(record_dir, loggers.get)
        if done.outcome == DELIVERED:
            result.delivered += 1
            note = f" ({len(done.vanished)} file(s) had disappeared)" if done.vanished else ""
            print(f"{prefix}: step {done.delivery.step} -> run {done.run.run_id} at {done.run.tracking_uri}: "
                  f"{len(done.delivery.metrics)} metrics, {len(done.files)} file(s), "
                  f"{human_size(sum(done.files.values()))}{note}", file=out, flush=True)  # fmt: skip
            continue
        if done.run is not None:
            loggers.unfinished.add(done.run.run_key)
        if done.outcome == GONE:
            print(f"{prefix}: left alone, {done.why}", file=out, flush=True)
        elif done.outcome == DAMAGED:
            _set_aside(result, prefix, done.why, done.path, out)
        elif done.outcome == REJECTED:
            result.rejected += 1
            print(f"{prefix}: rejected, not retried ({done.why})", file=out, flush=True)
        elif done.outcome == UNREACHABLE:
            result.kept += 1
            uri = loggers.uri_of(done.run)
            loggers.unreachable.add(uri)  # its other records are kept without trying
            if uri not in result.unreachable:
                result.unreachable[uri] = str(done.error) if isinstance(done.error, ConnectionError) else (
                    f"tracking server {uri} did not answer ({done.why})")  # fmt: skip
                print(f"mlflow-neuron sync: error: {result.unreachable[uri]}; its records stay in {folder}", file=err,
                      flush=True)  # fmt: skip
        else:
            result.kept += 1
            print(f"{prefix}: kept, {done.why}", file=out, flush=True)
    loggers.end_created_runs(folder)
    result.changed = result.delivered > 0 or any(logger.wrote for logger in loggers.loggers.values())
    _summary(result, len(records), folder, retry_rejected, out)


def _tidy(folder: str, result: SyncResult, out) -> None:
    """Puts in place records whose writer was killed after writing them whole but before the
    rename, and sets aside half-written ones and folders that are not records, each named."""
    for partial in outbox.abandoned_partials(folder):
        placed = outbox.finish_partial(partial)
        if placed.parent.name == outbox.DAMAGED:
            _set_aside(result, placed.name, outbox.reason_of(placed), placed, out)
        else:
            print(f"{placed.name}: written whole by a process that ended before putting it in place; "
                  "put in place", file=out, flush=True)  # fmt: skip
    for job_folder in staging.abandoned(folder):
        try:
            placed = staging.finish(job_folder, _Notes(out, job_folder.name))
        except (OSError, ValueError) as unfinished:
            why = f"a cycle staged for a helper that ended, which could not be prepared: {unfinished}"
            _set_aside(result, job_folder.name, why, outbox.set_aside(job_folder, why, into=outbox.DAMAGED), out)
            continue
        if placed is not None:
            print(f"{job_folder.name}: staged for a helper that ended before delivering it; prepared as "
                  f"{placed.name}", file=out, flush=True)  # fmt: skip
    for stray in outbox.not_records(folder):
        why = "it has no record.json"
        _set_aside(result, stray.name, why, outbox.set_aside(stray, why, into=outbox.DAMAGED), out)


def _set_aside(result: SyncResult, name: str, why: str, moved: Path, out) -> None:
    result.damaged += 1
    print(f"{name}: damaged, not sent: {why}; set aside in {moved.parent}", file=out, flush=True)


class _Notes:
    """The reporter of a staged cycle prepared here: its problems are printed under its name."""

    strict = False

    def __init__(self, out, name: str) -> None:
        self.out, self.name = out, name

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        print(f"{self.name}: {message}" + (f" ({error})" if error else ""), file=self.out, flush=True)


class _Loggers:
    """One RunLogger per (tracking URI, run): each server probed once; a dead one skipped after."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, out) -> None:
        self.tracking_uri, self.run_id, self.out = tracking_uri, run_id, out
        self.loggers: dict[tuple, object] = {}
        self.unreachable: set[str] = set()  # URIs whose probe failed: their records are kept untried
        self.unfinished: set[str | None] = set()  # run keys with a record left behind: not ended yet

    def uri_of(self, run: RunRef) -> str:
        return self.tracking_uri or run.tracking_uri

    def get(self, run: RunRef):
        from .mlflow_io import RunLogger
        from .probe import check_reachable

        if self.run_id:
            run = RunRef(run.tracking_uri, self.run_id)
        run = replace(run, tracking_uri=self.uri_of(run))
        if run.tracking_uri in self.unreachable:
            raise ConnectionError(f"tracking server {run.tracking_uri} did not answer earlier in this sync")
        key = (run.tracking_uri, run.run_id, run.run_key)
        if key not in self.loggers:
            try:
                check_reachable(run.tracking_uri)
            except ConnectionError:
                self.unreachable.add(run.tracking_uri)
                raise
            self.loggers[key] = RunLogger(run, progress=lambda line: print(f"  {line}", file=self.out, flush=True))
        return self.loggers[key]

    def end_created_runs(self, folder: str) -> None:
        """Ends, as FINISHED, runs that the callback created (known by a run key) once all their
        records are in: the status the callback's close() gives them. Runs already ended stay."""
        created = [logger for logger in self.loggers.values() if logger.run.run_key]
        if not created:
            return
        from mlflow.entities import RunStatus

        left = {outbox.run_key_of(record_dir) for record_dir in outbox.pending(folder)}
        for logger in created:
            run = logger.run
            if run.run_id is None or run.run_key in self.unfinished | left:
                continue
            try:
                if logger.client.get_run(run.run_id).info.status == RunStatus.to_string(RunStatus.RUNNING):
                    logger.end_run()
                    print(f"run {run.run_id} ended (FINISHED): all its records are in", file=self.out, flush=True)
            except Exception as error:  # noqa: BLE001 - the data is in; the status is secondary
                print(f"run {run.run_id} could not be ended: {type(error).__name__}: {error}", file=self.out, flush=True)


def _summary(result: SyncResult, total: int, folder: str, retry_rejected: bool, out) -> None:
    summary = f"synced {result.delivered} of {total} record(s) from {folder}; {result.kept} kept"
    if retry_rejected:
        print(f"{summary}; {result.rejected} still rejected", file=out, flush=True)
        result.kept += result.rejected  # asked for, and not delivered
        return
    summary += f"; {result.rejected} rejected" if result.rejected else ""
    print(summary + (f"; {result.damaged} damaged" if result.damaged else ""), file=out, flush=True)
    refused = outbox.rejected(folder)
    if refused:
        result.rejected = len(refused)
        why = Counter(outbox.reason_of(r) for r in refused)
        print(f"{len(refused)} record(s) in {Path(folder) / outbox.REJECTED} were refused by the server and are "
              f"not retried: " + "; ".join(f"{n} x {text}" for text, n in why.most_common()), file=out)  # fmt: skip
        print(f"  fix the cause, then `mlflow-neuron sync --outbox {folder} --retry-rejected [--run-id ID]` "
              "sends them again (--run-id: into another run)", file=out, flush=True)  # fmt: skip
    broken = outbox.damaged(folder)
    if broken:
        print(f"{len(broken)} record(s) in {Path(folder) / outbox.DAMAGED} are damaged and not sent: "
              + "; ".join(f"{r.name}: {outbox.reason_of(r)}" for r in broken[:5])
              + (f"; and {len(broken) - 5} more" if len(broken) > 5 else ""), file=out)  # fmt: skip
        print(f"  restore their files, then `mlflow-neuron sync --outbox {folder} --retry-damaged` checks and "
              "sends them again", file=out, flush=True)  # fmt: skip
