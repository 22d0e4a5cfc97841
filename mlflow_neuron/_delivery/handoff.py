"""The training side of the helper process: hand a cycle's job over, and never wait on it.

`Handoff` stands where the callback's `Sender` stood and offers the same surface (`submit`,
`flush`, `close`, `delivered`, `stored`, `pending`, `logger`). A job that holds in-process objects
(a cycle's Kineto results) goes to the in-process sender; a portable one (plain data naming the
cycle's saved trace) goes to the helper process.

The helper starts with the callback (`start`), and again at the first cycle of a later profile:
its imports take a second or two, and the jobs of cycles that come meanwhile wait in its pipe
(small messages; their traces are on disk). It creates the run when there is none, so that one
process creates it. Trouble with the helper never reaches training:
- it cannot start, dies, or stops answering for `hang_timeout_s`: one warning; the jobs it had not
  settled (a job is settled when its staged folder is gone: delivered, or stored in the outbox) go
  to the in-process sender, and the helper is restarted once; after a second failure every job
  goes the in-process way;
- with `hands_over` (the default), the helper serves every profile, and `close` lets it go to deliver
  what it holds after the exit (`handed_over`); else, when a profile stops, the callback retires it
  (`retire`: it finishes or stores its jobs within the budget and exits; a later profile starts a
  new one);
- `flush(timeout)` waits for it (one still starting: 5 s from its start at most, then its jobs are
  sent here); so does `close(timeout)` without hand-over: after it each cycle is delivered or stored.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

from . import outbox as _outbox
from . import staging
from .handed_over import HandedOver
from .handed_over import seconds_left as _left
from .helper_messages import HelperMessages
from .helper_process import HelperProcess, init_message
from .helper_records import LeftBehind, LeftBehinds
from .job import CycleJob
from .report import logger as _log

HANG_TIMEOUT_S = 120.0  # a helper that took no job for this long is replaced
START_WAIT_S = 5.0  # a helper starts in 1-3 s on an idle machine; beside busy cores, at nice 10, in ~20 s
RESTARTS = 1


class Handoff(HelperMessages):
    """Sender-compatible front: portable jobs to the helper process, the rest to the in-process sender."""

    def __init__(self, inner, reporter, preparer, *, exit_budget_s: float, command: tuple[str, ...] | None = None,
                 hang_timeout_s: float | None = None, hands_over: bool = False) -> None:  # fmt: skip
        self.inner = inner  # the in-process Sender: fallback, and jobs read in-process
        self.reporter = reporter
        self.preparer = preparer  # the in-process sender's: its op keys go to each new helper and back
        self.exit_budget_s = exit_budget_s
        self.command = command
        self.hang_timeout_s = HANG_TIMEOUT_S if hang_timeout_s is None else hang_timeout_s
        self.hands_over = hands_over  # the exit lets the helper deliver afterwards (`handed_over`)
        self.handed = HandedOver()
        self._job_header = ""  # what `sync` needs to finish a staged job (`staging.write_job`)
        self.parser: str | None = None  # what the helper parses traces with, once it is ready
        self.helper_pid: int | None = None
        self.jobs_sent = 0  # cycles handed to a helper process
        self.helper_peak_rss_kb: int | None = None  # the largest peak RSS a helper reported
        self.ready_after_s: float | None = None  # from the first helper's start until it took its settings
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._proc: HelperProcess | None = None
        self._started_at = 0.0
        self._ready = False
        self._failures = 0
        self._fallen_back = False
        self._closing = False
        self._retiring: HelperProcess | None = None
        self._sent: list[CycleJob] = []  # jobs the helper has, maybe not settled yet
        self._given: list[CycleJob] = []  # every job handed to the current helper (its final count)
        self._started_ns = 0  # wall clock at its start: its outbox records are named after it
        self._helper_fallback: str | None = None  # the helper's own fallback outbox folder
        self._final_state = False  # the helper answered close: its state is complete
        self._seq = itertools.count(1)
        self._unaccepted: dict[int, float] = {}  # cycle seq -> monotonic time sent
        self._replies: dict[int, dict] = {}
        self._state: dict = {}
        self._done_delivered = 0  # from helpers that are gone
        self._done_busy_s = 0.0
        self._done_stored: list[Path] = []
        self._done_rejected: list[Path] = []
        self._left = LeftBehinds()  # helpers gone without their final state (see helper_records)
        self._errors: list[BaseException] = []

    # -- the Sender surface ------------------------------------------------------------------------

    @property
    def logger(self):
        return self.inner.logger

    @property
    def delivered(self) -> int:
        self._count_left()
        return self.inner.delivered + self._done_delivered + self._state.get("delivered", 0)

    @property
    def stored(self) -> list[Path]:
        self._count_left()
        return [*self.inner.stored, *self._done_stored, *map(Path, self._state.get("stored", ()))]

    @property
    def rejected(self) -> list[Path]:
        self._count_left()
        return [*self.inner.rejected, *self._done_rejected, *map(Path, self._state.get("rejected", ()))]

    @property
    def delivery_busy_s(self) -> float:
        """Seconds the senders spent sending (the helpers' and the in-process one's)."""
        return self.inner.pace.busy_s + self._done_busy_s + self._state.get("busy_s", 0.0)

    @property
    def pending(self) -> int:
        """Cycles held in memory by the in-process sender and by the helper's sender (jobs on their
        way through the pipe are a few hundred bytes each; their traces are on disk)."""
        return self.inner.pending + self._state.get("pending", 0)

    @property
    def uses_helper(self) -> bool:
        return not self._fallen_back

    def submit(self, job: CycleJob) -> None:
        self.raise_worker_errors()
        with self._lock:
            if job.portable and self._proc is not None and not self._fallen_back:
                self._send_job(job)  # a starting helper reads it once its imports are done
                return
        # In-process: a job holding this process's objects, or the helper is gone for good.
        self.inner.submit(job)

    def process_ids(self) -> tuple[int, ...]:
        """The helper processes running now, the current one and one retiring. Read without the
        lock: the training thread asks at each profiled window and must not wait on a restart."""
        procs = (self._proc, self._retiring)
        return tuple(p.proc.pid for p in procs if p is not None) + self.handed.pids()

    def accepts_jobs(self) -> bool:
        """Whether the next cycle should be a job for the helper: it is up, or starting (then the
        job waits for it; a retired one is started again now). Else the callback reads cycles the
        in-process way."""
        with self._lock:
            if self._fallen_back or self._closing:
                return False
            if self._proc is None:
                self._start()  # a later profile's first cycle
            self._check_hang()
            return self._proc is not None

    def start(self) -> None:
        """Starts the helper now rather than on the first cycle (its imports take seconds)."""
        with self._lock:
            if self._proc is None and not self._fallen_back and not self._closing:
                self._start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Waits until the helper took its settings (tests, benchmarks); False if it did not."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._ready and self._proc is not None:
                left = _left(deadline)
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._ready

    def flush(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self._request("flush", deadline)
        ok = self.inner.flush(_left(deadline)) and ok
        self.raise_worker_errors()
        return ok

    def spill(self, why: str) -> int:
        """Stores the in-process sender's queue in the outbox now, and has the helper store its own
        (it answers nothing: the shutdown budget is spent)."""
        with self._lock:
            if self._proc is not None and not self._fallen_back:  # a starting helper reads it after its jobs
                self._proc.send({"op": "spill", "why": why})
        return self.inner.spill(why)

    def release(self) -> None:
        """Lets the helper go without waiting (its callback is gone): it delivers or stores what it holds."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:  # an explicit close: a forked child of training may hold the pipe open
                proc.send({"op": "close", "seq": 0, "timeout": None})
                proc.end_input()
        self.handed.finish(end_run=False)

    def new_staged_folder(self) -> Path:
        """Where a cycle for the helper is staged: a job folder in the outbox (`staging`)."""
        return staging.new_staged_folder(self.inner.outbox)

    def wait_delivered(self, timeout: float | None = None) -> bool:
        """Waits until the helpers let go at an exit delivered what they held and ended."""
        return self.handed.wait_exited(timeout)

    def retire(self, timeout: float) -> bool:
        """Ends the helper when a profile stopped: it delivers or stores what it holds within `timeout`;
        jobs it did not settle go in-process. A later cycle starts a new one. False: it was stopped."""
        return self._end_helper(time.monotonic() + max(timeout, 0.0))

    def close(self, timeout: float | None = None, *, end_run: bool = False) -> bool:
        """Ends the helper (hands it over, or waits for it) and the in-process sender. With hand-over
        and `end_run`, the helper ends the run after its last cycle: True when it will."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closing = True
        if self.hands_over:  # it delivers what it holds after the exit (`handed_over`)
            with self._lock:
                proc, self._proc = self._proc, None
                if proc is not None:
                    self.handed.add(proc, len(self._unsettled()))
                    self._absorb_state()  # what it did so far; the rest it does unseen
                    self._sent, self._given, self._state, self._ready = [], [], {}, False
                    self._unaccepted.clear()
            ends_run = self.handed.finish(end_run=end_run)
            self.handed.wait_written(deadline)
        else:
            ends_run = False
            self._end_helper(deadline)  # what it did not settle, inner.close() below stores: the time is up
        self.inner.close(_left(deadline))
        self.raise_worker_errors()
        return ends_run

    def raise_worker_errors(self) -> None:
        if self._errors:
            raise self._errors.pop(0)
        self.inner.raise_worker_errors()

    def __getattr__(self, name: str) -> Any:  # the rest of the Sender's surface
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- the helper's lifecycle (under self._lock) ---------------------------------------------------

    def _start(self) -> None:
        self._ready = False
        self._started_at = time.monotonic()
        self._started_ns = time.time_ns()
        self._given, self._helper_fallback, self._final_state = [], None, False
        try:
            init = {**init_message(self.inner, self.preparer, self.exit_budget_s, self.reporter.strict),
                    "hands_over": self.hands_over}
            run = {**init["run"], "tracking_uri": _outbox.without_credentials(init["run"]["tracking_uri"])}
            self._job_header = staging.job_header(run, init["preparer"])
            self._proc = HelperProcess(init, self._on_message, self.command)
        except Exception as error:  # noqa: BLE001 - no helper: the in-process path takes over
            self._fail(f"could not start the helper process ({type(error).__name__}: {error})")

    def _send_job(self, job: CycleJob) -> None:
        seq = next(self._seq)
        self.jobs_sent += 1
        self._sent = self._unsettled()
        self._sent.append(job)
        self._given.append(job)
        message = job.to_message()
        staging.write_job(job.staged_dir, self._job_header, message, (os.getpid(), self._proc.proc.pid))  # ahead
        self._unaccepted[seq] = time.monotonic()
        self._proc.send({"op": "cycle", "seq": seq, "job": message})

    def _unsettled(self) -> list[CycleJob]:
        """Jobs handed to the helper whose staged folder is still there: not delivered nor stored."""
        return [j for j in self._sent if j.staged_dir.exists()]

    def _check_hang(self) -> None:
        if self._proc is None:
            return
        since = min(self._unaccepted.values()) if self._unaccepted else None
        if since is None and not self._ready:
            since = self._started_at
        if since is not None and time.monotonic() - since > self.hang_timeout_s:
            what = "took no cycle" if self._ready else "did not start"
            self._fail(f"the helper process {what} in {time.monotonic() - since:.0f} s")

    def _end_helper(self, deadline: float | None) -> bool:
        """Asks the helper to deliver or store what it holds and exit by `deadline`, stops it if it
        did not answer, and lets it go; False if it had to be stopped."""
        with self._lock:
            self._retiring = self._proc  # its exit is expected: not a failure
        answered = self._request("close", deadline)
        with self._lock:
            self._let_go(graceful=answered and self._ready)
            self._retiring = None
        return answered

    def _let_go(self, *, graceful: bool) -> None:
        """Forgets the current helper (its input closed if `graceful`, else killed; one whose exit
        came first was settled then) and gives the jobs it did not settle to the in-process sender."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.end_input() if graceful else proc.kill()
            # a killed helper is gone in a moment; one asked to finish goes on: no budget stretched
            self._settle_gone(proc, exit_wait_s=0.0 if graceful else 0.2)
        unsettled, self._sent = self._unsettled(), []
        for job in unsettled:
            job.tried = True  # the helper may have written part of it
            self.inner.submit(job)

    def _fail(self, why: str) -> None:
        """One warning; then a restart, or from the second failure on, the in-process sender."""
        self._let_go(graceful=False)  # its jobs are processed here, while a new helper starts (or for good)
        self._failures += 1
        restart = self._failures <= RESTARTS and not self._closing
        self.reporter.problem(
            "helper", f"{why}; " + ("restarting it" if restart else "cycles are processed in the training "
                                    "process from now on (as with process='inline')"),
        )  # fmt: skip
        if restart:
            return self._start()
        self._fallen_back = True
        self._cond.notify_all()

    def _settle_gone(self, proc: HelperProcess, exit_wait_s: float = 1.0) -> None:
        """Counts what a gone helper delivered and stored (without its final state: `helper_records`)."""
        stored, rejected, delivered = self._absorb_state()
        if not self._final_state:
            self._left.add(LeftBehind(proc, self._given, self._started_ns, self._outboxes(), (stored, rejected, delivered)))
            self._count_left(exit_wait_s)
        self._given, self._final_state, self._state, self._ready = [], False, {}, False
        self._unaccepted.clear()
        self._cond.notify_all()

    def _absorb_state(self) -> tuple[set[Path], set[Path], int]:
        """Adds the current helper's last state (cycles delivered, busy time, records it stored or
        set aside) to the totals of helpers that are gone or let go; returns those records and count."""
        stored = {Path(p) for p in self._state.get("stored", ()) if Path(p).exists()}
        rejected = {Path(p) for p in self._state.get("rejected", ()) if Path(p).exists()}
        delivered = self._state.get("delivered", 0)
        self._done_delivered += delivered
        self._done_busy_s += self._state.get("busy_s", 0.0)
        self._done_stored, self._done_rejected = self._done_stored + sorted(stored), self._done_rejected + sorted(rejected)
        return stored, rejected, delivered

    def _request(self, op: str, deadline: float | None) -> bool:
        """Sends flush or close to the helper; waits for its answer until `deadline`."""
        while True:
            with self._lock:
                if self._gave_up_on_start(deadline):
                    return True
                proc = self._proc
                if proc is None or self._fallen_back or not (self._ready or self._unsettled()):
                    return True  # a helper still starting, with no job: nothing to wait for
                seq = next(self._seq)
                left = _left(deadline)
                helper_budget = None if left is None else max(left - min(1.0, 0.1 * left), 0.0)
                proc.send({"op": op, "seq": seq, "timeout": helper_budget})
                while seq not in self._replies and self._proc is proc:
                    left = _left(deadline)
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
                reply = self._replies.pop(seq, None)
                if reply is not None:
                    return bool(reply.get("ok"))
            # the helper died meanwhile: its jobs went in-process; ask the new one, if it is up

    def _gave_up_on_start(self, deadline: float | None) -> bool:
        """A helper still starting at a flush or close gets `START_WAIT_S` from its start (at most half the time
        left); then its jobs (untouched, in its pipe) are sent from here, where training waits anyway."""
        left = float("inf") if deadline is None else _left(deadline)
        until = min(self._started_at + START_WAIT_S, time.monotonic() + left / 2)
        while self._proc is not None and not self._ready and not self._fallen_back and self._unsettled():
            if until <= time.monotonic():
                _log.info("mlflow-neuron: the helper process was not ready after %.1f s; its cycles are sent from "
                          "the training process", time.monotonic() - self._started_at)  # fmt: skip
                self._let_go(graceful=False)
                return True
            self._cond.wait(until - time.monotonic())
        return False

    def _outboxes(self) -> set[Path]:
        return {Path(self.inner.outbox), _outbox.fallback_folder(), *(Path(f) for f in [self._helper_fallback] if f)}

    def _count_left(self, wait_s: float = 0.0) -> None:
        delivered, stored, rejected = self._left.count(wait_s)
        self._done_delivered, self._done_stored, self._done_rejected = (
            self._done_delivered + delivered, self._done_stored + stored, self._done_rejected + rejected)
