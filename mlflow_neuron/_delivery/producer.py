"""The training side of delivery: each cycle made durable in the outbox, and nothing slower.

The training thread writes a cycle into an outbox entry (Kineto saves the trace there, then
`job.json` is renamed in) and goes on. Everything after that is the drain's (`drain`), one at a
time under the outbox's consumer lock: the helper process while training runs, and this process,
with the same code, while it waits at a stop or at close.

    submit  -> the entry is queued; the helper is started if none follows the outbox
    flush   -> waits until each of this process's entries is settled, draining here when the lock is free
    close   -> stops the helper (so a starved or hung one cannot decide how close ends), queues the
               run's end (a run the callback created), drains here within the budget, and says in
               one warning what is left, where, and the `sync` command

Settled has one meaning: the entry is no longer in the queue (`entries.where`). The counts the
callback shows (`delivered`, `stored`, `rejected`) are read from the outbox itself. Where the outbox
refuses a cycle (a full disk), the cycle moves to the fallback outbox (`outbox.fallback_folder`),
said once; this process drains that one too, and the closing warning names both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from . import closing, entries, node_parts
from .closing import HeldUnreachable
from . import outbox as _outbox
from .drain import BUSY, DELIVERED, SETTLED, Drain, Pass
from .entries import END, FILES, JOB, Held
from .helper_process import STOP_WAIT_S, HelperLauncher
from .._record.job import CycleJob
from .._record.model import RunRef
from .report import one_line

PROGRESS_AFTER_S = 2.0  # a wait longer than this prints one progress line on stderr
class Producer:
    def __init__(self, run: RunRef, reporter, *, preparer: dict, outbox: str | os.PathLike, helper: bool,
                 background: bool = True, retries: int = 2, retry_wait_s: float = 0.5,
                 command: tuple[str, ...] | None = None, first: bool = True) -> None:  # fmt: skip
        self.run = run  # with its credentials: in memory only
        self.reporter = reporter
        self.unreachable = HeldUnreachable(reporter)  # what the drains and the helper report through
        self.preparer = preparer  # the Preparer's settings, written into each job
        self.background = background
        self.outbox = self._writable(Path(outbox).absolute())
        credentials = {_outbox.without_credentials(run.tracking_uri): run.tracking_uri}
        self._drain_settings = dict(credentials=credentials, retries=retries, retry_wait_s=retry_wait_s)
        self.drains: dict[Path, Drain] = {}  # one per outbox folder this process wrote to
        self.drain = self._drain_for(self.outbox)
        self.helper = HelperLauncher(self.outbox, {"credentials": credentials, "retries": retries,
                                                   "retry_wait_s": retry_wait_s}, self.unreachable, command) if helper and background else None  # fmt: skip
        self.mine: list[tuple[Path, int | None]] = []  # (entry, step) of this process; None: the run's end, or metrics
        self._refusals_said: set[Path] = set()
        self._final: dict[Path, str] = {}  # settled entries: delivered, rejected or damaged
        self.lost: list[tuple[int, str]] = []  # (step, why) of cycles neither queued nor delivered
        self.errors: list[BaseException] = []  # strict mode: raised on the training thread
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self._last: Pass | None = None  # the latest pass this process made
        # While it lives, its node's files wait for this rank's part of each cycle (`node_parts`).
        self.parts_area = node_parts.area_name(run)  # named now: every rank of the job names the same
        self.presence = node_parts.Presence(self.outbox, self.parts_area, int(preparer.get("rank") or 0))
        self._closing: float | None = None  # when close() began: it also waits for its node's files
        # Its node's first local rank: its drain sends every rank's entries, where the others' send
        # only their own while a helper follows the outbox (an extra rank costs no requests of its own).
        self.first = first
        if self.helper is not None:
            self.helper.ensure()  # now: its imports take a second or two, before the first cycle

    # -- the training thread ------------------------------------------------------------------------

    def new_entry(self) -> Held:
        """A new entry, held until `submit`; Kineto saves the cycle's trace into its `files/`."""
        return entries.create(self.outbox)

    @property
    def drains_here(self) -> bool:
        """Whether this process's drain takes its cycles first (no helper process)."""
        return self.helper is None or not self.helper.usable

    def submit(self, job: CycleJob, held: Held, memory_source=None) -> None:
        """Queues the cycle: `job.json` renamed into its entry (a job holding this process's objects
        is prepared here and now instead). Never waits on a server or another process.
        `memory_source`: the cycle's numbers as this process holds them, read by its own drain
        instead of the saved trace."""
        try:
            entry = self._write(job, held)
        except Exception as error:  # noqa: BLE001 - counted and said once; training goes on
            self.lose(job.step, "could not be written to the outbox", error)
            return
        self.mine.append((entry, job.step))
        if self.unreachable.due():  # the job went on profiling: it is told now, not only at its end
            self.unreachable.release(say=True)
        if memory_source is not None:
            self._drain_for(entry.parent).memory[entry] = memory_source
        with contextlib.suppress(OSError):
            os.utime(entry.parent)  # a consumer waiting on the folder's time looks now
        self._after_submit()

    def lose(self, step, what: str, error: BaseException | None = None) -> None:
        self.lost.append((step, what))
        self.reporter.problem("lost", f"profiler step {step} {what}; its data is lost", error)

    def _write(self, job: CycleJob, held: Held) -> Path:
        """Writes the job into its entry and lets it go; where the disk refuses (full, read-only),
        the cycle moves to the fallback outbox first. Returns the entry; raises when neither took it."""
        try:
            try:
                self._write_in(job, held)
                return held.path
            except OSError as refused:
                fallback = _outbox.fallback_folder()
                if held.path.parent == fallback:
                    raise
                moved = entries.create(fallback)
                try:
                    shutil.copytree(held.path / FILES, moved.path / FILES, dirs_exist_ok=True)
                    _move_paths(job, held.path, moved.path)
                    self.reporter.problem("outbox_unwritable", f"outbox {held.path.parent} refused a cycle "
                                          f"({one_line(refused)}); using {fallback} instead")  # fmt: skip
                    self._write_in(job, moved)
                except BaseException:
                    entries.remove(moved.path)
                    raise
                finally:
                    moved.release()
                entries.remove(held.path)
                return moved.path
        except BaseException:
            entries.remove(held.path)
            raise
        finally:
            held.release()

    def _write_in(self, job: CycleJob, held: Held) -> None:
        run = _outbox.plain_run(self.run)
        if job.portable:
            entries.write_json(held.path / JOB, {"format": entries.FORMAT, "run": run, "preparer": self.preparer,
                                                 "job": job.to_entry(held.path), "problems": job.problems,
                                                 "parts": self.parts_area})  # fmt: skip
        else:
            self._drain_for(held.path.parent).prepare(held.path, job, RunRef(**run), self.preparer,
                                                      parts=self.parts_area)  # fmt: skip

    def _drain_for(self, folder: Path) -> Drain:
        if folder not in self.drains:
            self.drains[folder] = Drain(folder, self.unreachable, **self._drain_settings)
        return self.drains[folder]

    def _after_submit(self) -> None:
        if not self.background:
            self._drain_here(None)
        elif self.helper is not None and self.helper.usable:
            self.helper.ensure()
        else:
            self._kick()

    # -- what became of this process's cycles --------------------------------------------------------

    def _states(self) -> list[tuple[Path, int | None, str]]:
        """Each entry of this process with its state; a settled one is looked up once (a long run
        makes thousands, and a flush asks every 50 ms)."""
        states = []
        for entry, step in self.mine:
            state = self._final.get(entry) or entries.where(entry)
            if state not in _QUEUE:
                self._final[entry] = state
            states.append((entry, step, state))
        return states

    @property
    def delivered(self) -> int:
        return sum(state == DELIVERED for _, step, state in self._states() if step is not None)

    @property
    def stored(self) -> list[Path]:
        """This process's cycles still in the queue (kept for the helper, a later flush, or sync)."""
        return [entry for entry, step, state in self._states() if step is not None and state in _QUEUE]

    @property
    def rejected(self) -> list[Path]:
        return [entry.parent / _outbox.REJECTED / entry.name for entry, _, state in self._states()
                if state == _outbox.REJECTED]  # fmt: skip

    @property
    def pending(self) -> int:
        return len(self._unsettled())

    @property
    def run_id(self) -> str | None:
        self._learn_run_id()
        return self.run.run_id

    def _learn_run_id(self) -> None:
        """The id of the run the drain created for this callback (kept in the outbox by its key)."""
        if self.run.run_id is None and self.run.run_key:
            found = entries.read_run_id(self.outbox, self.run.run_key)
            if found:
                self.run = RunRef(**{**asdict(self.run), "run_id": found})

    def _unsettled(self) -> list[tuple[Path, int | None]]:
        return [(entry, step) for entry, step, state in self._states() if state in _QUEUE]

    def node_files_left(self) -> list[int]:
        """At close: the cycles of this run whose node files it waits for (`node_parts.left_at_close`)."""
        if self._closing is None:
            return []
        return node_parts.left_at_close(self.outbox, self.parts_area, self.first, self._closing)

    def _sends(self, folder: Path):
        """Which entries this process's drain sends: all, or (not its node's first local rank,
        beside a helper) its own."""
        if self.first or not entries.helper_running(folder):
            return None
        mine = {entry.name for entry, _ in self.mine}
        return lambda entry: entry.name in mine

    def waited_for(self) -> list[tuple[Path, int | None]]:
        """Its entries in the queue that close() waits for and names (`node_parts.waited_at_close`)."""
        unsettled = self._unsettled()
        if self._closing is None:
            return unsettled
        return node_parts.waited_at_close(self.outbox, self.parts_area, unsettled, self.first, self._closing)

    def _outstanding(self) -> bool:
        return bool(self.waited_for() or self.node_files_left())

    # -- waiting ----------------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None, *, progress: bool = False) -> bool:
        """Waits until each of this process's cycles is settled, draining here when no other drains; False when
        `timeout` ran out or the server did not answer (what is left stays queued)."""
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        said = not progress
        self._last = None
        while self._outstanding() and not self._stop.is_set():  # once closed, nothing here drains: no wait
            if self._unreachable():
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if not self.background:
                done = self._drain_here(deadline)
                if done is None:
                    break
                if not _progress(done):  # a training thread writes an entry, or another consumer drains
                    self._stop.wait(0.05 if left is None else min(left, 0.05))
                continue
            self._kick(deadline)
            if not said and time.monotonic() - started >= PROGRESS_AFTER_S:
                said = closing.progress(self, left)
            with self._cond:
                self._cond.wait(0.05 if left is None else min(left, 0.05))
        closing.refusals(self)
        self.raise_errors()
        return not self._outstanding()

    def close(self, timeout: float | None, *, end_run: bool) -> None:
        """Stops the helper, queues the run's end (`end_run`: a run the callback created, ended once
        its cycles are in), drains here within `timeout`, and says once what is left and how to send it."""
        started = time.monotonic()
        if self.helper is not None:  # it leaves the entry in hand whole; killed past the wait
            self.helper.stop(STOP_WAIT_S if timeout is None else min(max(timeout, 0.1), STOP_WAIT_S))
        if end_run and (self.mine or self.run.run_id):
            self._queue_end()
        self.presence.leave()  # every cycle of this rank is queued: its node's files stop waiting for it
        self._closing = time.monotonic()
        self.flush(None if timeout is None else max(timeout - (time.monotonic() - started), 0.0), progress=True)
        self._stop.set()
        if self._worker is not None:  # its pass ends at the next entry: the process's exit never cuts a write (pyarrow's)
            self._worker.join(STOP_WAIT_S if timeout is None else min(STOP_WAIT_S, max(timeout - (time.monotonic() - started), 0)))
        for drain in self.drains.values():
            drain.memory.clear()  # what is left is read from its entry by whoever drains it next
        closing.left(self)  # names the server found dead, where it was, as the reason: one warning
        self.unreachable.release(say=False)
        self.say_refused()
        self._learn_run_id()  # before the run's id file goes with the outbox
        if not self._outstanding():
            node_parts.tidy(self.outbox, self.parts_area)
            for folder in self.drains:
                entries.remove_if_idle(folder)
        self.raise_errors()

    def raise_errors(self) -> None:
        if self.helper is not None:
            self.errors += self.helper.take_errors()
        if self.errors:
            raise self.errors.pop(0)

    def helper_pids(self) -> tuple[int, ...]:
        return self.helper.pids() if self.helper is not None else ()

    # -- draining here ------------------------------------------------------------------------------------

    def _kick(self, deadline: float | None = None) -> None:
        """Runs passes in a thread of this process until its cycles are settled or a pass gets nowhere."""
        with self._cond:
            if self._worker is not None and self._worker.is_alive():
                return
            self._worker = threading.Thread(target=self._work, args=(deadline,), name="mlflow-neuron-drain",
                                            daemon=True)  # fmt: skip
            self._worker.start()

    def _work(self, deadline: float | None) -> None:
        while self._outstanding() and not self._stop.is_set():
            done = self._drain_here(deadline)
            if done is None or not (_progress(done) or done.busy or done.other or done.waiting):
                return
            if not _progress(done):
                time.sleep(0.05)  # a training thread writes an entry, or another consumer drains: look again shortly

    def _drain_here(self, deadline: float | None) -> Pass | None:
        """One pass over each folder that holds a cycle of this process (their outcomes together),
        each under that folder's consumer lock."""
        done = Pass()
        try:
            for folder in {entry.parent for entry, _ in self._unsettled()} or {self.outbox}:
                _merge(done, self._drain_for(folder).once(stop=self._stop, deadline=deadline, sends=self._sends(folder)))
        except BaseException as error:  # noqa: BLE001 - strict mode: raised on the training thread
            self.errors.append(error)
            return None
        with self._cond:
            self._last = done
            self._cond.notify_all()
        return done

    def _unreachable(self) -> bool:
        """The latest pass found this run's server not answering, and no entry was still being written."""
        done = self._last
        return done is not None and bool(done.unreachable) and not any(o.state == BUSY for o in done.outcomes)

    # -- the end ------------------------------------------------------------------------------------------

    def _queue_end(self) -> None:
        """Queues the run's end: whoever drains ends the run once its cycles are in (here, or `sync`)."""
        try:
            held = entries.create(self.outbox)
        except OSError as error:
            self.reporter.problem("end_run", f"run {self.run_id} could not be queued to end", error)
            return
        try:
            run = _outbox.plain_run(self.run)
            entries.write_json(held.path / END, {"format": entries.FORMAT, "run": run, "parts": self.parts_area})
        except BaseException:
            entries.remove(held.path)
            raise
        finally:
            held.release()
        self.mine.append((held.path, None))

    def say_refused(self) -> None:
        closing.summaries(self)

    def _writable(self, outbox: Path) -> Path:
        """`outbox`, or where it cannot be written, the fallback folder (said once)."""
        try:
            _outbox.private_folder(outbox)
            return outbox
        except OSError as unwritable:
            fallback = _outbox.fallback_folder()
            self.reporter.problem("outbox_unwritable", f"outbox {outbox} is not writable "
                                  f"({one_line(unwritable)}); using {fallback} instead")  # fmt: skip
            return fallback


_QUEUE = (entries.QUEUED, entries.PREPARED, entries.ENDING, entries.WRITING)


def _move_paths(job: CycleJob, old: Path, new: Path) -> None:
    """The job's paths inside entry `old`, made to point into entry `new`."""

    def moved(path):
        text = os.fspath(path) if path is not None else None
        return text if text is None or not text.startswith(f"{old}{os.sep}") else f"{new}{text[len(str(old)):]}"

    job.staged_dir = Path(moved(job.staged_dir))
    job.raw_trace = Path(moved(job.raw_trace)) if job.raw_trace is not None else None
    if hasattr(job.source, "path") and hasattr(job.source, "fallback"):
        job.source = replace(job.source, path=moved(job.source.path), fallback=moved(job.source.fallback))


def _merge(into: Pass, one: Pass) -> None:
    into.outcomes += one.outcomes
    into.busy += one.busy
    into.waiting += one.waiting
    into.other = into.other or one.other
    into.unreachable.update(one.unreachable)


def _progress(done: Pass) -> bool:
    return any(o.state in SETTLED for o in done.outcomes)
