"""Sending cycles off the training thread, with retries, and the outbox for what cannot be sent.

The training thread only hands over a `CycleJob`; a daemon worker prepares it (reads the cycle,
writes its files: `prepare.Preparer`), writes it ahead to the outbox, sends it, retries with
backoff, and removes its record once the server took all of it; when the server stays away the
record simply stays. From before the first byte is sent until the server confirmed the last, the
cycle is a whole record on disk, so a kill while sending loses nothing (`write_ahead=False`, in
the helper process: written only when not sent). Pending memory is
bounded: when `max_pending` cycles wait, the next one goes straight to the outbox. When the queue
is empty the worker replays what it stored, so a server that was only slow or briefly gone needs
no manual sync. At close, what is still queued or in flight is stored rather than dropped
(sending it again later is harmless: a delivery sent twice leaves its data once).

A refusal that no retry can change (the run does not exist or was deleted, permission denied, an
invalid value) is not retried: the record goes to the outbox's `rejected/` folder with its reason,
where `mlflow-neuron sync` leaves it unless asked (`--retry-rejected`).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import deque
from pathlib import Path

from collections.abc import Callable

from . import outbox as _outbox
from .failures import is_permanent, reason
from .http_budget import remember_retry_after, retry_after_s
from .job import CycleJob
from .mlflow_io import RunLogger
from .model import Delivery
from .report import Reporter, closing_summary, one_line
from .sync import DAMAGED, DELIVERED, GONE, REJECTED, replay


class Sender:
    def __init__(
        self,
        logger: RunLogger,
        reporter: Reporter,
        prepare: Callable[[CycleJob], Delivery],
        *,
        background: bool = True,
        max_pending: int = 8,
        retries: int = 3,
        retry_wait_s: float = 0.5,
        outbox: str | Path = _outbox.DEFAULT_OUTBOX,
        copy_max_bytes: int = _outbox.DEFAULT_COPY_MAX_BYTES,
        write_ahead: bool = True,
    ) -> None:
        self.logger = logger
        self.write_ahead = write_ahead  # False in the helper process: see helper.py
        self.reporter = reporter
        self.prepare = prepare  # a job's delivery, its files written (once per job)
        self.background = background
        self.max_pending = max_pending
        self.retries = retries
        self.retry_wait_s = retry_wait_s
        self.outbox = Path(outbox).absolute()  # the working directory may change later
        self.copy_max_bytes = copy_max_bytes
        self.delivered = 0
        self.stored: list[Path] = []  # outbox records written by this sender and not replayed yet
        self.rejected: list[Path] = []  # records the server refused for good, under <outbox>/rejected
        self._stored_steps: list[int] = []  # every step this sender put in the outbox to send again
        self.lost: list[tuple[int, str]] = []  # (step, why) of cycles neither sent nor stored
        self._replay_at = 0.0  # monotonic time of the next replay attempt
        self._replay_wait_s = retry_wait_s
        self._replay_blocked = False  # the last replay failed: flush() does not wait for replays
        self._quiet_until = 0.0  # monotonic time before which the server asked not to be sent anything
        self._queue: deque[CycleJob] = deque()
        self._inflight: CycleJob | None = None
        self._settled: dict[int, str] = {}  # id(record) -> "done" | "abandoned", while in flight
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker_errors: list[BaseException] = []  # strict mode: raised on the caller's thread
        self._writing = threading.Lock()  # a job's record is written once: by the worker, or by close()
        remember_retry_after()  # a refusal's Retry-After paces this sender's retries

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (self._inflight is not None)

    def submit(self, job: CycleJob) -> None:
        self.raise_worker_errors()
        if not self.background:
            self._send(job)
            return
        with self._cond:
            full = len(self._queue) + (self._inflight is not None) >= self.max_pending
            if not full:
                self._queue.append(job)
                self._cond.notify_all()
                self._start_worker()
        if full:
            self._store(job, f"{self.max_pending} cycles were already waiting to be sent")

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every submitted cycle is sent or stored; False if `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._inflight is not None or (self.stored and not self._replay_blocked):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        self.raise_worker_errors()
        return True

    def close(self, timeout: float | None = None) -> None:
        """Flushes, then stores whatever is still queued or in flight in the outbox."""
        self.flush(timeout)
        self._stop.set()
        self.spill("it was still being sent when the callback closed")
        _outbox.remove_if_empty(self.outbox)  # every record written ahead was delivered
        with self._cond:
            kept = list(self.stored), list(self.rejected), list(self._stored_steps), list(self.lost)
        closing_summary(self.reporter, *kept)
        self.raise_worker_errors()

    def spill(self, why: str) -> int:
        """Stores every queued or in-flight cycle in the outbox now; returns how many.

        The worker may finish sending an in-flight cycle anyway; sync sending it again later
        leaves its data once."""
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
            inflight = self._inflight
            if inflight is not None and id(inflight) not in self._settled:
                self._settled[id(inflight)] = "abandoned"
                left.insert(0, inflight)
            self._cond.notify_all()
        for job in left:
            self._store(job, why)
        return len(left)

    def raise_worker_errors(self) -> None:
        if self._worker_errors:
            raise self._worker_errors.pop(0)

    # -- worker ---------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="mlflow-neuron-sender", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set() and not self._replay_due():
                    self._cond.wait(self._seconds_to_replay())
                if self._queue:
                    job = self._inflight = self._queue.popleft()
                elif self._stop.is_set():
                    return
                else:
                    job, stored = None, self.stored[0]
            if job is None:
                self._replay(stored)
                continue
            try:
                self._send(job)
            except BaseException as error:  # noqa: BLE001 - only strict mode gets here
                self._worker_errors.append(error)
            finally:
                with self._cond:
                    self._inflight = None
                    self._settled.pop(id(job), None)
                    self._cond.notify_all()

    def _send(self, job: CycleJob) -> None:
        error: Exception | None = None
        for attempt in range(self.retries + 1):
            backoff = self.retry_wait_s * 2 ** (attempt - 1) if attempt else 0.0
            wait = max(backoff, self._quiet_until - time.monotonic())  # the server's Retry-After, for any cycle
            if wait > 0 and self._stop.wait(wait):
                break  # closing: the record goes to the outbox now
            if self._settled.get(id(job)) == "abandoned":
                return  # the budget ran out and the record went to the outbox meanwhile
            try:
                delivery = self._written_ahead(job)
                if self.write_ahead:  # the cycles behind this one too: a delivery may hang for minutes
                    self._write_ahead_queued()
                retry_after_s()  # forget a refusal from before this attempt
                clashes, vanished = self.logger.deliver(delivery)
            except Exception as caught:  # noqa: BLE001 - server down, slow, 5xx, bad data
                error = caught
                self._heed_retry_after()
                if is_permanent(caught):
                    if self._claim(job):
                        self._reject(job, caught)
                    return
                continue
            if self._claim(job):
                self._delivered_live()
                if job.record is not None:
                    _outbox.remove(job.record)
                _cleanup(job)
            self._report_delivery(job, clashes, vanished)
            return
        if self._claim(job):
            self._store(job, f"sending failed {self.retries + 1} times", error)

    def _replay_due(self) -> bool:
        return bool(self.stored) and time.monotonic() >= self._next_replay()

    def _seconds_to_replay(self) -> float | None:
        return max(self._next_replay() - time.monotonic(), 0.01) if self.stored else None

    def _next_replay(self) -> float:
        return max(self._replay_at, self._quiet_until)

    def _heed_retry_after(self) -> None:
        """After a failed attempt: nothing more goes to the server before its Retry-After, if it sent one."""
        self._quiet_until = time.monotonic() + (retry_after_s() or 0.0)

    def _replay(self, path: Path) -> None:
        """Sends one stored record again; on failure waits longer (up to 30 s) before the next try."""
        retry_after_s()  # forget a refusal from before this attempt
        done = replay(path, lambda run: self.logger)
        if done.outcome in (REJECTED, DAMAGED, GONE):  # settled: set aside here, or by a sync meanwhile
            with self._cond:
                self.stored.remove(path)
                self._cond.notify_all()
            if done.outcome == REJECTED:
                self._rejected(done.path, None, done.why, done.error)
            elif done.outcome == DAMAGED:
                self.reporter.problem("damaged", f"outbox record {path.name} is damaged ({done.why}); it is "
                                      f"not sent, and is kept in {done.path.parent}")  # fmt: skip
            return
        if done.outcome != DELIVERED:  # still unreachable, or a damaged record: sync reports it
            with self._cond:
                self._replay_blocked = True
                self._heed_retry_after()
                self._replay_at = time.monotonic() + self._replay_wait_s
                self._replay_wait_s = min(self._replay_wait_s * 2, 30.0)
                self._cond.notify_all()
            return
        with self._cond:
            self.stored.remove(path)
            self.delivered += 1
            self._cond.notify_all()

    def _delivered_live(self) -> None:
        """The server takes cycles again: replay stored ones right away."""
        with self._cond:
            self.delivered += 1
            self._replay_blocked, self._replay_at, self._replay_wait_s = False, 0.0, self.retry_wait_s

    def _claim(self, job: CycleJob) -> bool:
        """True if this thread settles the record; False if close() took it over meanwhile."""
        with self._cond:
            if self._settled.get(id(job)) == "abandoned":
                return False
            self._settled[id(job)] = "done"
            return True

    def _report_delivery(self, job: CycleJob, clashes: dict, vanished: list[str]) -> None:
        for kind, problem in job.problems:
            self.reporter.problem(kind, problem)
        if clashes:
            listed = ", ".join(f"{k}: kept {old!r}, not {new!r}" for k, (old, new) in clashes.items())
            self.reporter.problem("params_clash", f"run {self.logger.run.run_id} already has other profiler params ({listed})")
        if vanished:
            self.reporter.problem(
                "file_vanished",
                f"{len(vanished)} profile file(s) of step {job.step} disappeared before upload "
                f"(first: {vanished[0]}); the rest of the cycle was logged",
            )

    # -- outbox -----------------------------------------------------------------------------------

    def _written_ahead(self, job: CycleJob) -> Delivery:
        """The job's delivery, its record written to the outbox (or the fallback) first; then the
        delivery reads its files from the record and the staged folder is gone. Where no outbox
        can be written, the staged files are sent as they are (the warning has said why)."""
        delivery = self.prepare(job)
        if not self.write_ahead or job.unwritable:
            return delivery
        try:
            self._record(job, delivery)
        except Exception:  # noqa: BLE001 - reported by _put; sending is still worth a try
            job.unwritable = True  # a full disk is not written again on each retry; storing tries once more
            return delivery
        return job.delivery

    def _write_ahead_queued(self) -> None:
        with self._cond:
            queued = list(self._queue)
        for job in queued:  # in queue order: op keys are handed out in order
            try:
                self._written_ahead(job)
            except Exception:  # noqa: BLE001 - its own turn reports it; not this cycle's failure
                pass

    def _record(self, job: CycleJob, delivery: Delivery) -> Path:
        """The job's outbox record, written once (by the worker ahead of sending, or by close()
        storing it), after which its delivery points into the record."""
        with self._writing:
            if job.record is None:
                job.record = self._put(job, delivery)
                job.delivery = _outbox.load(job.record, check_seal=False)[0]
                _cleanup(job)
            return job.record

    def _reject(self, job: CycleJob, error: Exception) -> None:
        why = reason(error)
        try:
            if job.record is not None:
                path = _outbox.reject(job.record, why)
            else:
                path = _outbox.put(self.outbox, self.prepare(job), self.logger.run,
                                   copy_max_bytes=self.copy_max_bytes, rejected=why)  # fmt: skip
        except Exception as lost:  # noqa: BLE001
            self.lose(job.step, f"refused by the server ({why}) and could not be stored", lost)
            return
        finally:
            _cleanup(job)
        self._rejected(path, job.step, why, error)

    def _rejected(self, path: Path, step: int | None, why: str, error: Exception) -> None:
        with self._cond:
            self.rejected.append(path)
        outbox = path.parent.parent
        what = f"profiler step {step}" if step is not None else f"outbox record {path.name}"
        if self.reporter.strict:
            raise error
        self.reporter.problem(  # the cause is in `why` already: no error detail appended
            "rejected",
            f"{what} was refused by {self.logger.run.tracking_uri} for run {self.logger.run.run_id} ({why}); "
            f"retrying cannot help, so it is not retried: it is kept in {path.parent}. Once the cause is "
            f"fixed, `mlflow-neuron sync --outbox {outbox} --retry-rejected [--run-id ID]` sends it",
        )

    def lose(self, step: int | str, what: str, error: Exception) -> None:
        """Counts a cycle as lost (neither sent nor stored) and says so; the close sums them up."""
        why = f"{type(error).__name__}: {one_line(error)}"
        with self._cond:
            self.lost.append((step, why))
        self.reporter.problem("lost", f"profiler step {step} {what}; its data is lost", error)  # strict: raised

    def _store(self, job: CycleJob, why: str, error: Exception | None = None) -> None:
        try:
            path = self._record(job, self.prepare(job))  # written ahead already, or now
        except Exception as lost:  # noqa: BLE001
            self.lose(job.step, "could be neither sent nor stored", lost)
            return
        finally:
            _cleanup(job)
        with self._cond:
            self.stored.append(path)
            self._stored_steps.append(job.step)
            self._cond.notify_all()
        self.reporter.problem(
            "stored_in_outbox",
            f"profiler step {job.step} was not sent to {self.logger.run.tracking_uri} ({why}); it is kept in "
            f"{path.parent} and sent again when the server answers; if the job ends first, run "
            f"`mlflow-neuron sync --outbox {path.parent}`",
            error,
        )

    def _put(self, job: CycleJob, delivery: Delivery) -> Path:
        try:
            return _outbox.put(self.outbox, delivery, self.logger.run, copy_max_bytes=self.copy_max_bytes)
        except OSError as unwritable:
            fallback = _outbox.fallback_folder()
            self.reporter.problem(
                "outbox_unwritable", f"outbox {self.outbox} is not writable ({one_line(unwritable)}); using {fallback} instead"
            )
            return _outbox.put(fallback, delivery, self.logger.run, copy_max_bytes=self.copy_max_bytes)


def _cleanup(job: CycleJob) -> None:
    shutil.rmtree(job.staged_dir, ignore_errors=True)
