"""Sending cycles off the training thread, with retries, and the outbox for what cannot be sent.

The training thread only hands over a `CycleJob`; a daemon worker prepares it (reads the cycle,
writes its files: `prepare.Preparer`), writes it ahead to the outbox, sends it, retries with
backoff, and removes its record once the server took all of it. From before the first byte is
sent until the server confirmed the last, the cycle is a whole record on disk, so a kill while
sending loses nothing (`write_ahead=False`, in the helper process: written only when not sent).
Cycles that waited while one was sent go together (`RunLogger.deliver_many`: one log_batch, one
artifact pass); if that fails, each is sent on its own. Pending memory is bounded: when
`max_pending` cycles wait, the next goes straight to the outbox, and `pace` says once when
cycles come faster than they leave. When the queue is empty the worker replays what it stored,
so a server that was only slow or briefly gone needs no manual sync. At close, what is still
queued or in flight is stored (sending it again later leaves its data once).

A refusal that no retry can change (the run does not exist or was deleted, permission denied, an
invalid value) is not retried: the record goes to the outbox's `rejected/` folder with its reason,
where `mlflow-neuron sync` leaves it unless asked (`--retry-rejected`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

from collections.abc import Callable

from . import outbox as _outbox
from . import staging
from .failures import is_permanent, reason
from .http_budget import remember_retry_after, retry_after_s
from .job import CycleJob
from .mlflow_io import RunLogger
from .model import Delivery
from .pace import Pace
from .report import Reporter, closing_summary, one_line, rejected_message, report_delivery
from .sync import DAMAGED, DELIVERED, GONE, REJECTED, replay

BATCH = 16  # cycles sent together at most: a batch that fails is sent again cycle by cycle


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
        self._inflight: list[CycleJob] = []  # the batch being sent
        self.pace = Pace()  # a sender that cannot keep up says so once; its busy_s: time spent sending
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
            return len(self._queue) + len(self._inflight)

    def submit(self, job: CycleJob) -> None:
        self.raise_worker_errors()
        if not self.background:
            self._send(job)
            return
        with self._cond:
            self.pace.arrived(job.step)
            waiting = len(self._queue) + len(self._inflight)
            full = waiting >= self.max_pending
            if not full:
                self._queue.append(job)
                self._cond.notify_all()
                self._start_worker()
            behind = self.pace.behind(waiting + 1)
        if behind:
            self.reporter.problem("falling_behind", behind)
        if full:
            self._store(job, f"{self.max_pending} cycles were already waiting to be sent")

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every submitted cycle is sent or stored; False if `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._inflight or (self.stored and not self._replay_blocked):
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
            inflight = [job for job in self._inflight if id(job) not in self._settled]
            for job in inflight:
                self._settled[id(job)] = "abandoned"
            left[:0] = inflight
            self._cond.notify_all()
        for job in left:
            self._store(job, why)
        return len(left)

    def raise_worker_errors(self) -> None:
        if self._worker_errors:
            raise self._worker_errors.pop(0)

    # -- worker ---------------------------------------------------------------------------------

    def warm(self) -> None:
        """Starts the worker now; it opens the store first (`RunLogger.warm`), before any cycle waits."""
        with self._cond:
            self._start_worker(warm=True)

    def _start_worker(self, warm: bool = False) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, args=(warm,), name="mlflow-neuron-sender", daemon=True)
            self._thread.start()

    def _work(self, warm: bool = False) -> None:
        if warm:
            self.logger.warm()
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set() and self._seconds_to_replay() != 0.0:
                    self._cond.wait(self._seconds_to_replay())
                if self._queue:  # every cycle waiting, sent together (one cycle: as it always was)
                    batch = self._inflight = [self._queue.popleft() for _ in range(min(len(self._queue), BATCH))]
                elif self._stop.is_set():
                    return
                else:
                    batch, stored = [], self.stored[0]
            if not batch:
                self._replay(stored)
                continue
            started = time.monotonic()
            try:
                self._send_together(batch) if len(batch) > 1 else self._send(batch[0])
                with self._cond:  # behind: said at an arrival, or here when no cycle arrives any more
                    self.pace.delivered(len(batch), time.monotonic() - started)
                    behind = self.pace.behind(len(self._queue))
                if behind:
                    self.reporter.problem("falling_behind", behind)
            except BaseException as error:  # noqa: BLE001 - only strict mode gets here
                self._worker_errors.append(error)
            finally:
                with self._cond:
                    self._inflight = []
                    for job in batch:
                        self._settled.pop(id(job), None)
                    self._cond.notify_all()

    def _send_together(self, batch: list[CycleJob]) -> None:
        """One delivery for several cycles (one log_batch, one artifact pass). If it fails, each
        cycle is sent on its own, with its own retries and verdict: what the failed attempt wrote
        is written again once, never twice."""
        try:
            quiet = self._quiet_until - time.monotonic()  # a refusal's Retry-After holds for a batch too
            if quiet > 0 and self._stop.wait(quiet):
                raise InterruptedError("closing")  # each cycle goes its own way: to the outbox
            deliveries = [self._written_ahead(job) for job in batch]
            if self.write_ahead:
                self._write_ahead_queued()
            retry_after_s()  # forget a refusal from before this attempt
            fresh = not any(job.tried for job in batch)
            for job in batch:
                job.tried = True
            results = self.logger.deliver_many(deliveries, fresh=fresh)
        except Exception:  # noqa: BLE001 - split back: each cycle finds its own way (or reason)
            self._heed_retry_after()  # a refusal's Retry-After holds for the cycles sent next, too
            for job in batch:
                if self._settled.get(id(job)) != "abandoned":
                    self._send(job)
            return
        for job, (clashes, vanished) in zip(batch, results):
            self._settle_delivered(job, clashes, vanished)

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
                fresh, job.tried = not job.tried, True
                clashes, vanished = self.logger.deliver(delivery, fresh=fresh)
            except Exception as caught:  # noqa: BLE001 - server down, slow, 5xx, bad data
                error = caught
                self._heed_retry_after()
                if is_permanent(caught):
                    if self._claim(job):
                        self._reject(job, caught)
                    return
                continue
            self._settle_delivered(job, clashes, vanished)
            return
        if self._claim(job):
            self._store(job, f"sending failed {self.retries + 1} times", error)

    def _seconds_to_replay(self) -> float | None:  # None: nothing stored; 0.0: a replay is due now
        return max(self._next_replay() - time.monotonic(), 0.0) if self.stored else None

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

    def _settle_delivered(self, job: CycleJob, clashes: dict, vanished: list[str]) -> None:
        if self._claim(job):
            with self._cond:  # the server takes cycles again: stored ones are replayed right away
                self.delivered += 1
                self._replay_blocked, self._replay_at, self._replay_wait_s = False, 0.0, self.retry_wait_s
            if job.record is not None:
                _outbox.remove(job.record)
            _cleanup(job)
        report_delivery(self.reporter, self.logger.run.run_id, job.step, job.problems, clashes, vanished)

    def _claim(self, job: CycleJob) -> bool:
        """True if this thread settles the record; False if close() took it over meanwhile."""
        with self._cond:
            if self._settled.get(id(job)) == "abandoned":
                return False
            self._settled[id(job)] = "done"
            return True

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
                job.record = _outbox.put_or_fallback(self.outbox, delivery, self.logger.run, self.copy_max_bytes,
                                                     self.reporter)  # fmt: skip
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
        what = f"profiler step {step}" if step is not None else f"outbox record {path.name}"
        # The cause is in `why` already: the error goes along only to be raised (strict mode).
        self.reporter.problem("rejected", rejected_message(what, self.logger.run, why, path),
                              error if self.reporter.strict else None)  # fmt: skip

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


def _cleanup(job: CycleJob) -> None:
    staging.discard(job.staged_dir)
