"""The one consumer of the outbox: entries in order -> prepare -> deliver (batched) -> settled.

    writing --(job.json renamed in)--> queued --prepare--> prepared --deliver--> delivered (removed)
                                                                     \\--refused for good--> rejected/
    unreadable or failing its seal --> damaged/
    writing, left by a process that died before it was queued (a kill, a container's end) --> cut short (removed)
    end.json: once no earlier entry of its run is left, the run is ended (FINISHED): here only.

The helper process runs it (`follow`), the training process while it waits at a stop or at close,
`mlflow-neuron sync` once: the same code. Each pass holds the outbox's consumer lock (`entries`), a
lock the kernel releases: one drain of an outbox at a time, and one that dies leaves its entry
whole for the next. Sending an entry twice leaves its data once.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from . import entries
from . import outbox as _outbox
from .courier import Courier
from .entries import END, FILES, JOB, TRIED, Held
from .failures import is_permanent, is_unreachable, reason
from .outbox import sent_files
from .._record.job import CycleJob
from .._record.model import MANIFEST, Delivery, RunRef
from .report import WAIT_IN_OUTBOX, report_delivery
from .seal import DamagedRecord

BATCH = 16  # prepared entries of one run sent together at most (one log_batch, one artifact pass)
DELIVERED, REJECTED, DAMAGED, KEPT, ENDED = "delivered", "rejected", "damaged", "kept", "ended"
BUSY = "busy"  # the training thread of some process is writing it
CUT = "cut short"  # its writer died before it was queued: the one cycle a kill can take; removed
SETTLED = (DELIVERED, REJECTED, DAMAGED, ENDED, CUT)


@dataclass
class Outcome:
    """What became of one entry in a pass."""

    entry: Path
    state: str  # DELIVERED | REJECTED | DAMAGED | KEPT | ENDED | BUSY | CUT
    why: str = ""
    delivery: Delivery | None = None
    run: RunRef | None = None
    files: dict[str, int] = field(default_factory=dict)
    vanished: list[str] = field(default_factory=list)
    moved: Path | None = None  # a rejected or damaged entry's new place
    unreachable: bool = False  # KEPT because its server did not answer


@dataclass
class Pass:
    """One pass over the queue."""

    outcomes: list[Outcome] = field(default_factory=list)
    busy: int = 0  # entries a training thread is still writing, or an end waiting for its run's cycles
    other: bool = False  # another consumer held the outbox: nothing was done
    unreachable: dict[str, str] = field(default_factory=dict)  # tracking URI -> why

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)


@dataclass
class _Ready:
    held: Held
    delivery: Delivery
    run: RunRef


class Drain:
    """Drains one outbox folder (`rejected=True`: its `rejected/` records, for `sync --retry-rejected`)."""

    def __init__(self, outbox: str | os.PathLike, reporter, *, credentials: dict[str, str] | None = None,
                 tracking_uri: str | None = None, run_id: str | None = None, progress=None, retries: int = 2,
                 retry_wait_s: float = 0.5, rejected: bool = False,
                 copy_max_bytes: int = _outbox.DEFAULT_COPY_MAX_BYTES) -> None:  # fmt: skip
        self.outbox = Path(outbox).absolute()
        self.folder = self.outbox / _outbox.REJECTED if rejected else self.outbox
        self.reporter = reporter
        self.courier = Courier(self.outbox, credentials=credentials, tracking_uri=tracking_uri, run_id=run_id,
                               progress=progress)  # fmt: skip
        self.retries, self.retry_wait_s = retries, retry_wait_s
        self.copy_max_bytes = copy_max_bytes
        self.last_profile = None  # the latest cycle this process prepared
        self.memory: dict[Path, object] = {}  # entry -> its cycle's numbers held in this process (read first)
        self._preparers: dict[tuple, object] = {}
        self._state = entries.SharedState()  # each run's state in the outbox, as this drain last saw it
        self._lock = threading.Lock()  # one pass at a time in this process (the consumer lock is per open file)

    # -- a pass --------------------------------------------------------------------------------------

    def once(self, *, stop: threading.Event | None = None, deadline: float | None = None,
             on_outcome: Callable[[Outcome], None] | None = None, wait_s: float = 0.0,
             before: Callable[[], object] = lambda: None) -> Pass:  # fmt: skip
        """Works through every entry there is now, in order, holding the outbox's consumer lock
        (`before` runs first, under it); stops early at `stop` or `deadline`. Another consumer
        holding the lock past `wait_s`: nothing done, `Pass.other`."""
        with self._lock:
            try:
                held = entries.lock_file(self.outbox / entries.CONSUMER_LOCK, blocking=wait_s > 0, timeout=wait_s)
            except FileNotFoundError:  # the outbox is gone (a close() removed it): nothing to drain
                return Pass()
            if held is None:
                return Pass(other=True)
            try:
                entries.mark_holder(held)
                before()
                return self._pass(stop, deadline, on_outcome)
            finally:
                held.release()

    def _pass(self, stop, deadline, on_outcome) -> Pass:
        done = Pass()
        ready: list[_Ready] = []
        try:
            for entry in entries.listed(self.folder):
                if _over(stop, deadline):
                    break
                held = entries.try_claim(entry)
                if held is None:
                    if entry.exists():
                        done.busy += 1
                        self._outcome(done, on_outcome, Outcome(entry, BUSY, "a training process is writing it"))
                    continue
                if ready and entries.state(entry) == entries.ENDING:  # the cycles before it go first
                    self._send(ready, done, on_outcome, stop, deadline)
                    ready = []
                item = self._take(held, done, on_outcome)
                if item is None:
                    held.release()
                    continue
                if ready and (len(ready) >= BATCH or _key(ready[0].run) != _key(item.run)):
                    self._send(ready, done, on_outcome, stop, deadline)
                    ready = []
                ready.append(item)
            if ready:
                self._send(ready, done, on_outcome, stop, deadline)
                ready = []
        finally:
            for item in ready:
                item.held.release()
        return done

    def follow(self, stop: threading.Event, poll_s: float = 0.05,
               on_pass: Callable[[Pass], object] = lambda done: None) -> None:  # fmt: skip
        """Drains until `stop`: a pass at each change of the folder (looked at every `poll_s`), or
        while another consumer has it; kept entries again with a growing wait (to 30 s)."""
        backoff = 0.0
        while not stop.is_set():
            mtime = _mtime(self.folder)
            done = self.once(stop=stop)
            on_pass(done)
            if done.count(KEPT) or done.unreachable:
                backoff = min(max(backoff * 2, self.retry_wait_s), 30.0)
                stop.wait(max(backoff, self.courier.quiet_s()))
                continue
            backoff = 0.0
            while not stop.wait(poll_s) and not (done.busy or done.other) and _mtime(self.folder) == mtime:
                pass

    # -- one entry -------------------------------------------------------------------------------------

    def _take(self, held: Held, done: Pass, on_outcome) -> _Ready | None:
        """The held entry ready to send, prepared first if queued; None: settled, set aside, or waits."""
        state = entries.state(held.path)
        if state == entries.WRITING:  # nobody holds it, and it has none of the three files
            if (held.path / FILES / MANIFEST).exists():  # prepared, then its record lost: its files may be whole
                self._damaged(held.path, "it has no record.json (nor job.json), though its files were prepared", done,
                              on_outcome)  # fmt: skip
                return None
            why = ("cut short: the process reading this cycle ended before it was queued (a kill, or a container's "
                   "end); it holds no job nor record to send, and is removed")  # fmt: skip
            entries.remove(held.path)
            self.reporter.problem("cut", f"outbox entry {held.name} was {why}")
            self._outcome(done, on_outcome, Outcome(held.path, CUT, why))
            return None
        if state == entries.ENDING:
            self._end(held.path, done, on_outcome)
            return None
        if state == entries.QUEUED:
            try:
                if not self._prepare_entry(held.path, done, on_outcome):
                    return None
            except OSError as refused:  # a full disk: it stays queued, whole, for a later pass or sync
                self.reporter.problem("prepare", f"outbox entry {held.name} could not be prepared "
                                      f"({reason(refused)}); it stays queued")  # fmt: skip
                self._kept(held.path, refused, done, on_outcome)
                return None
        try:
            delivery, run = _outbox.load(held.path, check_seal=state != entries.QUEUED)
        except DamagedRecord as damage:
            self._damaged(held.path, str(damage), done, on_outcome)
            return None
        if self.courier.server(run) in done.unreachable:
            self._outcome(done, on_outcome, Outcome(held.path, KEPT, done.unreachable[self.courier.server(run)], delivery,
                                                    run, unreachable=True))  # fmt: skip
            return None
        return _Ready(held, delivery, run)

    def _prepare_entry(self, entry: Path, done: Pass, on_outcome) -> bool:
        try:
            data = entries.read_json(entry / JOB)
            job = CycleJob.from_entry(data["job"], entry)
            job.source = self.memory.pop(entry, None) or job.source
            run, settings = RunRef(**data["run"]), dict(data["preparer"])
            problems = [tuple(p) for p in data.get("problems", ())]
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._damaged(entry, f"its {JOB} cannot be read ({type(error).__name__}: {error})", done, on_outcome)
            return False
        self.prepare(entry, job, run, settings, problems)
        return True

    def prepare(self, entry: Path, job: CycleJob, run: RunRef, settings: dict, problems=()) -> None:
        """Turns a held entry's job into its record (queued -> prepared): the cycle read, its files
        written into `files/`, record.json sealed, job.json removed. The op keys of a run are shared
        by every process that prepares its cycles (`.keys-<run>.json` in the outbox)."""
        from .._record.prepare import Preparer

        key = (_key(run), tuple(sorted(settings.items())))
        preparer = self._preparers.get(key)
        if preparer is None:
            preparer = self._preparers[key] = Preparer(self.reporter, **settings)
        keys_file = self.outbox / f".keys-{run.run_key or run.run_id or 'none'}.json"
        with entries.store_lock(self.outbox), contextlib.suppress(OSError, ValueError):
            self._state.take(keys_file, preparer.absorb)
        job.tried = (entry / TRIED).exists()
        delivery = preparer.prepare(job)
        with entries.store_lock(self.outbox):  # the run's summary: after what others wrote, before they write again
            delivery = self._state.put(keys_file, preparer.absorb, preparer.export,
                                       partial(preparer.with_run_summary, delivery))  # fmt: skip
        self.last_profile = preparer.last_profile or self.last_profile
        _outbox.write_record(entry, delivery, run, copy_max_bytes=self.copy_max_bytes, files_dir=FILES, skip=(JOB, END))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry / JOB)
        for kind, message in [*problems, *job.problems]:
            self.reporter.problem(kind, message)

    def _end(self, entry: Path, done: Pass, on_outcome) -> None:
        """Ends the run an end entry names once no earlier cycle of it is left in the queue."""
        try:
            run = RunRef(**entries.read_json(entry / END)["run"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._damaged(entry, f"its {END} cannot be read ({error})", done, on_outcome)
            return
        earlier = [e for e in entries.listed(self.folder) if e.name < entry.name and _outbox.run_key_of(e) == run.run_key]
        if earlier:  # delivered, or kept, by this drain or another: ended on a later pass
            done.busy += 1
            return
        logger = None
        try:
            logger = self.courier.logger(run, create=False)
            if logger.run.run_id is not None:
                from mlflow.entities import RunStatus

                if logger.client.get_run(logger.run.run_id).info.status == RunStatus.to_string(RunStatus.RUNNING):
                    logger.end_run()
                    self.courier.wrote = True
        except Exception as error:  # noqa: BLE001 - classified: kept unless the run is gone for good
            if not is_permanent(error):
                self._kept(entry, error, done, on_outcome, run=run)
                return
        with contextlib.suppress(OSError):  # the run's id stays for its callback to read (`Producer.run_id`)
            os.unlink(self.outbox / f".keys-{run.run_key}.json")
        entries.remove(entry)
        self._outcome(done, on_outcome, Outcome(entry, ENDED, run=logger.run if logger is not None else run))

    # -- delivery and settling ------------------------------------------------------------------------

    def _deliver(self, ready: list[_Ready], stop, deadline) -> list[tuple[dict, list[str]]]:
        return self.courier.deliver([i.held.path for i in ready], [i.delivery for i in ready], ready[0].run, stop,
                                    deadline)  # fmt: skip

    def _send(self, ready: list[_Ready], done: Pass, on_outcome, stop, deadline) -> None:
        """Sends prepared entries of one run together; if that fails, each on its own."""
        try:
            if len(ready) > 1:
                try:
                    results = self._deliver(ready, stop, deadline)
                except Exception as error:  # noqa: BLE001 - split: each entry finds its own way
                    if is_unreachable(error):
                        for item in ready:
                            self._kept(item.held.path, error, done, on_outcome, item)
                        return
                    results = None
                if results is not None:
                    for item, result in zip(ready, results):
                        self._delivered(item, result, done, on_outcome)
                    return
            for item in ready:
                self._send_one(item, done, on_outcome, stop, deadline)
        finally:
            for item in ready:
                item.held.release()

    def _send_one(self, item: _Ready, done: Pass, on_outcome, stop, deadline) -> None:
        error: Exception | str | None = done.unreachable.get(self.courier.server(item.run))
        for attempt in range(0 if error else self.retries + 1):
            if attempt:
                wait = self.retry_wait_s * 2 ** (attempt - 1)
                if _over(stop, deadline, wait) or (stop.wait(wait) if stop is not None else time.sleep(wait)):
                    break
            try:
                result = self._deliver([item], stop, deadline)[0]
            except Exception as caught:  # noqa: BLE001 - server down, slow, 5xx, a refusal
                error = caught
                if is_unreachable(caught):
                    break
                if is_permanent(caught):
                    self._reject(item, caught, done, on_outcome)
                    return
                continue
            self._delivered(item, result, done, on_outcome)
            return
        self._kept(item.held.path, error, done, on_outcome, item)

    def _delivered(self, item: _Ready, result: tuple[dict, list[str]], done: Pass, on_outcome) -> None:
        clashes, vanished = result
        files = sent_files(item.delivery, vanished)
        entries.remove(item.held.path)
        report_delivery(self.reporter, item.run.run_id, item.delivery.step, [], clashes, vanished)
        self._outcome(done, on_outcome, Outcome(item.held.path, DELIVERED, "", item.delivery,
                                                self.courier.logger(item.run).run, files, vanished))  # fmt: skip

    def _reject(self, item: _Ready, error: Exception, done: Pass, on_outcome) -> None:
        why = reason(error)
        try:
            moved = _outbox.reject(item.held.path, why)
        except OSError as unmoved:
            return self._kept(item.held.path, unmoved, done, on_outcome, item)
        # Said by whoever waits for it, from its reason file (`Producer`, `sync`): on that thread, once.
        self._outcome(done, on_outcome, Outcome(item.held.path, REJECTED, why, item.delivery, item.run, moved=moved))

    def _damaged(self, entry: Path, why: str, done: Pass, on_outcome) -> None:
        try:
            moved = _outbox.set_aside(entry, why, into=_outbox.DAMAGED)
        except OSError:
            moved = None
        self.reporter.problem("damaged", f"outbox entry {entry.name} is damaged ({why}); it is not sent"
                              + (f", and is kept in {moved.parent}" if moved else ""))  # fmt: skip
        self._outcome(done, on_outcome, Outcome(entry, DAMAGED, why, moved=moved))

    def _kept(self, entry: Path, error, done: Pass, on_outcome, item: _Ready | None = None, run=None) -> None:
        """Left in the queue for a later pass: the server did not answer, or failed every retry."""
        run = item.run if item is not None else run
        why = reason(error) if isinstance(error, BaseException) else str(error or "not sent")
        unreachable = run is not None and (self.courier.server(run) in done.unreachable or (
            isinstance(error, BaseException) and is_unreachable(error)))  # fmt: skip
        if unreachable:
            why = done.unreachable.setdefault(self.courier.server(run), _unreachable_why(error, self.courier.server(run)))
            self.reporter.problem("unreachable", f"{why}{WAIT_IN_OUTBOX} {self.outbox} and are sent when it answers")
        self._outcome(done, on_outcome, Outcome(entry, KEPT, why, item.delivery if item else None, run,
                                                unreachable=unreachable))  # fmt: skip

    @staticmethod
    def _outcome(done: Pass, on_outcome, outcome: Outcome) -> None:
        done.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)


def _key(run: RunRef) -> str:
    """Runs are told apart for batching by server and run; a URI's credentials do not count."""
    return f"{_outbox.without_credentials(run.tracking_uri)}|{run.run_id}|{run.run_key}"


def _unreachable_why(error: BaseException, uri: str) -> str:
    return str(error) if isinstance(error, ConnectionError) else f"tracking server {uri} did not answer ({reason(error)})"


def _over(stop, deadline, wait: float = 0.0) -> bool:
    return (stop is not None and stop.is_set()) or (deadline is not None and time.monotonic() + wait >= deadline)


def _mtime(folder: Path) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(folder).st_mtime_ns
    return None
