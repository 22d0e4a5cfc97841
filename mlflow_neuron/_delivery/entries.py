"""The outbox is the only queue: one folder per profiler cycle, held by a lock the kernel releases.

    <outbox>/<time_ns>-<pid>-<seq>/   an entry; names sort in the order the cycles were made
        job.json       queued: the cycle's job; its trace lies beside it, in files/
        record.json    prepared: what goes to MLflow (`outbox`'s record, sealed); job.json is gone
        end.json       the end of a run the callback created: it is ended here, after its cycles
    <outbox>/rejected/<name>/          refused for good by the server, with a `reason` file
    <outbox>/damaged/<name>/           unreadable, or its files fail their seal, with a `reason` file

An entry is in one of seven states: writing (the training thread holds it and none of the three
files is there yet), queued, prepared, end, gone (delivered, ended or cut short), rejected,
damaged. Settled: no longer in the queue (`where`). `docs/layout.md` has the table; `drain` makes
every transition after the first.

Whoever works on an entry holds `flock` on its folder: the training thread while it writes it, a
consumer while it prepares or delivers it. The kernel drops the lock when the process ends, however
it ends and in whatever PID namespace, so an entry whose holder died is taken by the next consumer
at once and one that a live process holds is never taken. An entry with none of the three files
that nobody holds was left by a process that died before the cycle was queued: it is removed, and
said to be cut short.
Ownership is never decided by pid liveness, which breaks across PID namespaces and pid reuse.

Lock files in the outbox (each taken with `lock_file`):
- `.consumer.lock`: whoever drains holds it, for one pass (`Drain.once`): the helper, the training
  process while it waits at a stop or at close(), or `sync`. One drain of an outbox at a time;
- `.helper.lock`: the helper process, for its life: one helper per outbox (the ranks of a node share it);
- `.mlflow-neuron-<uid>-<outbox's hash>.store.lock`, in the temp folder: one process at a time opens
  a store or creates a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .._trace.json_text import cycle_collector_paused, dumps, parse
from . import outbox as _outbox

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks, one process per outbox
    fcntl = None

JOB, RECORD, END = _outbox.JOB, _outbox.RECORD, _outbox.END
FILES = "files"  # the cycle's files: the trace Kineto saved, then the tables made from it
TRIED = ".tried"  # a delivery was attempted: the next one searches before writing the trace
CONSUMER_LOCK, HELPER_LOCK, STORE_LOCK = ".consumer.lock", ".helper.lock", ".store.lock"
QUIET = ".quiet-until"  # a refusal's Retry-After, as a wall-clock time: whoever drains next heeds it
# Lock files of earlier versions (a send lock, a request lock): an outbox holding only these is idle.
_RETIRED_LOCKS = {".send.lock", ".request.lock"}
FORMAT = 2
QUEUED, PREPARED, ENDING, WRITING = "queued", "prepared", "end", "writing"

_sequence = itertools.count()


@dataclass
class Held:
    """An entry (or lock file) this process holds; `release()` lets it go."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def name(self) -> str:
        return self.path.name


def create(outbox: Path, after: str | None = None) -> Held:
    """A new entry, held by this process until `release()`; raises OSError when the outbox
    cannot be written, OutboxRefused when it is not this user's private folder. `after`: an
    entry's name, which the new one follows in the queue's order (a node's file of the cycle
    that entry began).

    Made under a hidden name, locked, then renamed into the queue: a consumer that lists it finds
    it held already (an entry visible before its lock was taken would be taken for cut short by a
    consumer that came between; the lock follows the folder through the rename). A process that
    dies before the rename leaves an empty hidden folder, which `remove_if_idle` clears."""
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}"
    name = f"{after}.{name}" if after else name
    folder = _outbox.private_folder(outbox)
    new = folder / f".{name}{_NEW}"
    (new / FILES).mkdir(parents=True, mode=0o700)
    os.chmod(new, 0o700)
    fd = os.open(new, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else knows the name yet: never waits
    try:
        os.rename(new, folder / name)
    except OSError:
        os.close(fd)
        shutil.rmtree(new, ignore_errors=True)
        raise
    return Held(folder / name, fd)


_NEW = ".new"  # an entry being made, not in the queue yet


def listed(outbox: Path) -> list[Path]:
    """Every entry, oldest first (rejected and damaged ones are not in the queue)."""
    try:
        names = os.listdir(outbox)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [outbox / n for n in sorted(names) if not n.startswith(".") and n not in (_outbox.REJECTED, _outbox.DAMAGED)]


def state(entry: Path) -> str:
    """QUEUED, PREPARED, ENDING, or WRITING (none of the three files yet)."""
    if (entry / RECORD).is_file():
        return PREPARED
    if (entry / JOB).is_file():
        return QUEUED
    return ENDING if (entry / END).is_file() else WRITING


def try_claim(entry: Path) -> Held | None:
    """Holds `entry` until `release()`; None when another process holds it or it is settled."""
    try:
        fd = os.open(entry, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
    try:  # settled by another process between listing and locking: the path is gone or reused
        if os.path.samestat(os.fstat(fd), os.stat(entry)):
            return Held(entry, fd)
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def write_json(path: Path, data: dict) -> None:
    """`data` as `path`, whole or not at all (a 0600 file renamed into place). Two writers of one
    path at once (the ranks of a node, the helper's threads) each rename a partial file of its own."""
    partial = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with open(fd, "wb") as f:
        f.write(dumps(data))
    os.replace(partial, path)


T = TypeVar("T")


class SharedState:
    """A run's state, shared by the processes that prepare its cycles through one outbox
    (`.keys-<run>.json`: op keys, the run's steps so far). `take` absorbs what other processes
    wrote since this one last looked; `put` writes a union: what another process wrote meanwhile is
    taken first, so two processes preparing cycles at once lose neither's steps. Each write is
    headed by a token, so a process that looks again at what it wrote itself reads 100 bytes, not
    the whole state (in a long run, thousands of steps). Call both under the outbox's store lock."""

    def __init__(self) -> None:
        self._seen: dict[Path, str] = {}  # a state file -> the token this process last read or wrote

    def take(self, path: Path, absorb: Callable[[dict], None]) -> None:
        data, token = read_state(path, self._seen.get(path))
        if data is not None:
            absorb(data)
        if token is not None:
            self._seen[path] = token

    def put(self, path: Path, absorb: Callable[[dict], None], export: Callable[[], dict],
            then: Callable[[], T] = lambda: None) -> T:  # fmt: skip
        """Takes what others wrote, runs `then` (which sees it) and writes; returns what `then`
        returned. A state that cannot be written stays as it was: the next write carries it all."""
        with contextlib.suppress(OSError, ValueError):  # none yet, or damaged: this write replaces it
            self.take(path, absorb)
        made = then()
        token = f"{os.getpid()}-{time.time_ns()}-{next(_WRITES)}"
        with contextlib.suppress(OSError):
            write_json(path, {_TOKEN_KEY: token, **export()})
            self._seen[path] = token
        return made


def read_state(path: Path, seen: str | None) -> tuple[dict | None, str | None]:
    """(the state in `path` without its token, its token); the state is None when the token is
    `seen`: nothing new. An earlier version's file has no token."""
    with open(path, "rb") as f:
        head = f.read(100)
        found = _TOKEN.match(head)
        token = found.group(1).decode() if found is not None else None
        if token is not None and token == seen:
            return None, token
        text = head + f.read()
    with cycle_collector_paused():  # thousands of small dicts
        data = _loads(path, text)
    data.pop(_TOKEN_KEY, None)
    return data, token


_TOKEN_KEY = "written_by"
_TOKEN = re.compile(rb'\{"written_by":\s*"([0-9-]+)"')
_WRITES = itertools.count()


def read_json(path: Path) -> dict:
    with open(path, "rb") as f:
        return _loads(path, f.read())


def _loads(path: Path, text: bytes) -> dict:
    try:
        # orjson reads an int past 64 bits as a float: a file with 19 digits in a row goes to `json`
        data = json.loads(text) if _LONG_DIGITS.search(text) else parse(text)
    except RecursionError:  # nested past Python's limit: not a file we wrote, a damaged one
        raise ValueError(f"{path.name} is nested too deep to read") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} holds {type(data).__name__}, not an object")
    return data


def remove(entry: Path) -> None:
    """Delivered: the entry goes."""
    shutil.rmtree(entry, ignore_errors=True)


def where(entry: Path) -> str:
    """What became of an entry: QUEUED/PREPARED/ENDING/WRITING while it is in the queue, else
    "rejected", "damaged" or "delivered". One definition of settled: not in the queue any more."""
    if entry.exists():
        return state(entry)
    for kind in (_outbox.REJECTED, _outbox.DAMAGED):
        if (entry.parent / kind / entry.name).exists():
            return kind
    return "delivered"


def lock_file(path: Path, *, blocking: bool, timeout: float | None = None) -> Held | None:
    """Holds the lock file `path` (created 0600), or None when another process holds it (after
    `timeout` s when blocking). The lock is taken on the file the path names when it is held: a
    lock file removed and made again meanwhile is locked again."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        if fcntl is None:
            return Held(path, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking and deadline is None else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                return None
            time.sleep(0.02)
            continue
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return Held(path, fd)
        except FileNotFoundError:
            pass
        os.close(fd)


def holder_pid(path: Path) -> int | None:
    """The pid a lock file's holder wrote into it (in the holder's PID namespace)."""
    try:
        return int(path.read_text(encoding="ascii").strip() or 0) or None
    except (OSError, ValueError):
        return None


def mark_holder(held: Held) -> None:
    """Writes this process's pid into a held lock file (for messages only: a full disk skips it)."""
    with contextlib.suppress(OSError):
        os.ftruncate(held.fd, 0)
        os.pwrite(held.fd, f"{os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def store_lock(outbox: Path, timeout: float = 60.0) -> Iterator[None]:
    """One process of a node at a time opens a fresh store or creates a run (MLflow's sqlite schema
    creation is not safe against a second process doing the same). The lock file is in the temp
    folder, named after the outbox, so that taking it (in the callback's constructor, before any
    cycle) leaves no outbox folder behind. Where it cannot be made, or does not come within
    `timeout`, goes on without it."""
    held = None
    digest = hashlib.sha1(str(Path(outbox).absolute()).encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    with contextlib.suppress(OSError):
        path = Path(tempfile.gettempdir()) / f".mlflow-neuron-{uid}-{digest}{STORE_LOCK}"
        held = lock_file(path, blocking=True, timeout=timeout)
    try:
        yield
    finally:
        if held is not None:
            held.release()


def helper_running(outbox: Path) -> bool:
    """Whether a helper process follows the outbox now (it holds `.helper.lock`)."""
    path = outbox / HELPER_LOCK
    if fcntl is None or not path.exists():
        return False
    held = lock_file(path, blocking=False)
    if held is None:
        return True
    held.release()
    return False


def remove_if_idle(outbox: Path) -> None:
    """Removes an outbox that holds nothing but its lock files, when nobody drains it and no helper
    follows it."""
    held = []
    with contextlib.suppress(OSError):
        for name in (HELPER_LOCK, CONSUMER_LOCK):
            lock = lock_file(outbox / name, blocking=False)
            if lock is None:
                break
            held.append(lock)
    if len(held) < 2:
        for lock in held:
            lock.release()
        return
    try:
        names = set(os.listdir(outbox))
        locks = {CONSUMER_LOCK, HELPER_LOCK, STORE_LOCK, QUIET, *_RETIRED_LOCKS}
        if not names - locks - _run_files(names) - _unborn(outbox, names):
            for name in names:
                with contextlib.suppress(OSError):
                    if (outbox / name).is_dir():
                        shutil.rmtree(outbox / name)
                    else:
                        os.unlink(outbox / name)
            with contextlib.suppress(OSError):
                os.rmdir(outbox)
    except OSError:
        pass
    finally:
        for lock in held:
            lock.release()


def _unborn(outbox: Path, names: set[str]) -> set[str]:
    """Hidden entries whose maker died before renaming them into the queue (nobody holds them)."""
    unborn = set()
    for name in names:
        if name.startswith(".") and name.endswith(_NEW):
            with contextlib.suppress(OSError):
                if time.time() - os.stat(outbox / name).st_mtime < 60:
                    continue  # being made (its maker locks it right after making it)
            held = try_claim(outbox / name)
            if held is not None:
                held.release()
                unborn.add(name)
    return unborn


def run_id_file(outbox: Path, run_key: str) -> Path:
    """Where the id of the run created for `run_key` is kept, for the other processes and the callback."""
    return outbox / f".run-{run_key}.id"


def read_run_id(outbox: Path, run_key: str) -> str | None:
    try:
        return run_id_file(outbox, run_key).read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def _run_files(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith(".run-") or n.startswith(".keys-")}
