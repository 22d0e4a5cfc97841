"""The one consumer of the outbox: entries in order -> prepare -> deliver (batched) -> settled.

    writing --(job.json renamed in)--> queued --prepare--> prepared --deliver--> delivered (removed)
                                                                     \\--refused for good--> rejected/
    unreadable or failing its seal --> damaged/
    writing, left by a process that died before it was queued (a kill, a container's end) --> cut short (removed)
    end.json: once no earlier entry of its run is left, the run is ended (FINISHED): here only.

A rank's summary of a cycle goes to its node's parts (`node_parts`); a cycle's parts become its
node's file, in the entry that completed them or in one more entry, once every local rank is
accounted for. The helper process runs it (`follow`), the training process while it waits at a
stop or at close, `mlflow-neuron sync` once: the same code. Each pass holds the outbox's consumer
lock (`entries`), a lock the kernel releases: one drain of an outbox at a time, and one that dies
leaves its entry whole for the next. Sending an entry twice leaves its data once.
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

from . import entries, node_parts
from . import outbox as _outbox
from .courier import Courier
from .entries import FILES, Held
from .failures import is_permanent, is_unreachable, reason
from .outbox import nothing_to_send, sent_files
from .._record.model import MANIFEST, Delivery, RunRef
from .report import WAIT_IN_OUTBOX, report_delivery
from .preparing import Preparing, batch_key as _key
from .run_end import end_when_due
from .seal import DamagedRecord

BATCH = 16  # prepared entries of one run sent together at most (one log_batch, one artifact pass)
WAITING_POLL_S = 0.5  # `follow` looks again this often while a node's file waits for a rank (which may go)
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
    waiting: int = 0  # cycles whose node's file waits for a local rank's part (`node_parts.due`)
    other: bool = False  # another consumer held the outbox: nothing was done
    unreachable: dict[str, str] = field(default_factory=dict)  # tracking URI -> why

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)


@dataclass
class _Ready:
    held: Held
    delivery: Delivery
    run: RunRef


class Drain(Preparing):
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
        self._parts: list[tuple[Path, int]] = []  # (run's parts area, cycle) of parts taken since last looked at
        self._lock = threading.Lock()  # one pass at a time in this process (the consumer lock is per open file)

    # -- a pass --------------------------------------------------------------------------------------

    def once(self, *, stop: threading.Event | None = None, deadline: float | None = None,
             on_outcome: Callable[[Outcome], None] | None = None, wait_s: float = 0.0,
             before: Callable[[], object] = lambda: None, sends: Callable[[Path], bool] | None = None) -> Pass:  # fmt: skip
        """Works through every entry there is now, in order, holding the outbox's consumer lock
        (`before` runs first, under it); stops early at `stop` or `deadline`. Another consumer
        holding the lock past `wait_s`: nothing done, `Pass.other`. `sends`: the entries this pass
        may send (None: all); it prepares the others and leaves them prepared."""
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
                return self._pass(stop, deadline, on_outcome, sends)
            finally:
                held.release()

    def _pass(self, stop, deadline, on_outcome, sends=None) -> Pass:
        done = Pass()
        ready: list[_Ready] = []
        send = partial(self._add, done=done, on_outcome=on_outcome, stop=stop, deadline=deadline, sends=sends)
        try:
            self._node_files(done, on_outcome)  # node files that can be made now: listed below, sent in order
            for entry in entries.listed(self.folder):
                if _over(stop, deadline):
                    break
                if sends is not None and not sends(entry) and entries.state(entry) in (entries.PREPARED, entries.ENDING):
                    continue  # another process sends it
                held = entries.try_claim(entry)
                if held is None:
                    if entry.exists():
                        done.busy += 1
                        self._outcome(done, on_outcome, Outcome(entry, BUSY, "a training process is writing it"))
                    continue
                if ready and entries.state(entry) == entries.ENDING:  # the cycles before it go first
                    self._send(ready, done, on_outcome, stop, deadline)
                    ready = []
                self._parts = []
                item = self._take(held, done, on_outcome)
                if item is None:
                    held.release()
                ready = send(ready, ([item] if item else []) + self._node_files(done, on_outcome, self._parts)[0])
            made = []
            if not _over(stop, deadline):  # every queued entry prepared: a gone rank's cycles may go now
                made, done.waiting = self._node_files(done, on_outcome, [(None, None)])
                ready = send(ready, made)
            if ready:
                self._send(ready, done, on_outcome, stop, deadline)
                ready = []
            if made:  # a run's end this pass met before them waited for them: it may be due now
                self._ends(done, on_outcome, stop, deadline, sends)
        finally:
            for item in ready:
                item.held.release()
        return done

    def _add(self, ready: list[_Ready], items: list[_Ready], done, on_outcome, stop, deadline, sends) -> list[_Ready]:
        """`items` added to the batch `ready` (sent first where full or of another run); an item
        this pass does not send (`sends`) is left prepared."""
        for item in items:
            if sends is not None and not sends(item.held.path):
                item.held.release()  # another process sends it
                continue
            if ready and (len(ready) >= BATCH or _key(ready[0].run) != _key(item.run)):
                self._send(ready, done, on_outcome, stop, deadline)
                ready = []
            ready.append(item)
        return ready

    def _node_files(self, done: Pass, on_outcome, parts: list | None = None) -> tuple[list[_Ready], int]:
        """Makes the node entries of the cycles whose files can be made now; with `parts`, (run
        folder, cycle) pairs to look at ((None, None): all), returns them held, to go with the
        entries before them. Also how many cycles wait for a local rank. A file that cannot be made
        keeps its parts (said)."""
        made, waiting = [], 0
        for folder, cycle in parts if parts is not None else [(None, None)]:
            ready, waits = node_parts.due(self.folder, folder, cycle)
            waiting += waits
            for run_folder, step in ready:
                try:
                    entry = node_parts.make_entry(self.folder, run_folder, step, self.copy_max_bytes)
                except node_parts.UNWRITABLE as error:
                    self.reporter.problem("node_file", f"the rank summaries of step {step} could not be put in their "
                                          f"node's file ({type(error).__name__}: {error}); they stay in {run_folder}")
                    continue
                held = entries.try_claim(entry) if entry is not None and parts is not None else None
                item = self._take(held, done, on_outcome) if held is not None else None
                made += [item] if item else []
                if held is not None and not item:
                    held.release()
        return made, waiting

    def _ends(self, done: Pass, on_outcome, stop, deadline, sends) -> None:
        """The runs' ends in the queue (those this pass may send), looked at again (`run_end`)."""
        for entry in entries.listed(self.folder):
            if not _over(stop, deadline) and entries.state(entry) == entries.ENDING and (sends is None or sends(entry)):
                held = entries.try_claim(entry)
                if held is not None:
                    self._take(held, done, on_outcome)
                    held.release()

    def follow(self, stop: threading.Event, poll_s: float = 0.05,
               on_pass: Callable[[Pass], object] = lambda done: None) -> None:  # fmt: skip
        """Drains until `stop`: a pass at each change of the folder (looked at every `poll_s`), or
        while another consumer has it; kept entries again with a growing wait (to 30 s)."""
        backoff = 0.0
        while not stop.is_set():
            mtime, looked = _mtime(self.folder), time.monotonic()
            done = self.once(stop=stop)
            on_pass(done)
            if done.count(KEPT) or done.unreachable:
                backoff = min(max(backoff * 2, self.retry_wait_s), 30.0)
                stop.wait(max(backoff, self.courier.quiet_s()))
                continue
            backoff = 0.0
            while not stop.wait(poll_s) and not (done.busy or done.other) and _mtime(self.folder) == mtime:
                if done.waiting and time.monotonic() - looked >= WAITING_POLL_S:  # a rank may have gone
                    break

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
            ended = end_when_due(self, held.path, done, on_outcome)
            if ended is not None:
                self._outcome(done, on_outcome, Outcome(held.path, ENDED, run=ended))
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
        if nothing_to_send(delivery):  # a rank's cycle whose summary went to its node's file: no request
            entries.remove(held.path)
            self._outcome(done, on_outcome, Outcome(held.path, DELIVERED, "", delivery, run))
            return None
        if self.courier.server(run) in done.unreachable:
            self._outcome(done, on_outcome, Outcome(held.path, KEPT, done.unreachable[self.courier.server(run)], delivery,
                                                    run, unreachable=True))  # fmt: skip
            return None
        return _Ready(held, delivery, run)

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


def _unreachable_why(error: BaseException, uri: str) -> str:
    return str(error) if isinstance(error, ConnectionError) else f"tracking server {uri} did not answer ({reason(error)})"


def _over(stop, deadline, wait: float = 0.0) -> bool:
    return (stop is not None and stop.is_set()) or (deadline is not None and time.monotonic() + wait >= deadline)


def _mtime(folder: Path) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(folder).st_mtime_ns
    return None
