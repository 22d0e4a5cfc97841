"""One writer at a time: a lock on the outbox for `sync`, and one on each record while it is sent.

Two syncs on one outbox would each create the run a record names and deliver every record twice;
the training process replaying its own records while a sync runs would race it record by record.
`fcntl.flock` locks belong to an open file: the kernel drops them when the process ends, however
it ends, so a killed sync never leaves the outbox locked. Where there is no `fcntl` (Windows) the
locks are not taken.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

SYNC_LOCK = ".sync.lock"  # in the outbox folder: holds the pid of the sync delivering it


class OutboxBusy(RuntimeError):
    """Another process holds the lock."""

    def __init__(self, folder: Path, pid: int | None) -> None:
        who = f"another sync (pid {pid})" if pid else "another sync"
        super().__init__(f"{who} is delivering the outbox {folder}; run sync again once it has ended")
        self.pid = pid


@contextlib.contextmanager
def sync_lock(folder: Path):
    """Holds the outbox's sync lock, or raises OutboxBusy at once when another process holds it."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder / SYNC_LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutboxBusy(folder, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, empty of meaning once unlocked


HELD, BUSY, GONE = "held", "busy", "gone"


@contextlib.contextmanager
def record_lock(record_dir: Path):
    """Yields HELD while this process holds `record_dir`'s lock, BUSY while another process does,
    GONE when the record was settled (delivered or set aside) by another process meanwhile."""
    if fcntl is None:
        yield HELD if record_dir.exists() else GONE
        return
    try:
        fd = os.open(record_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        yield GONE
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield BUSY
            return
        # Settled by another process between listing and locking: the path is gone or reused.
        yield HELD if record_dir.exists() and os.path.samestat(os.fstat(fd), os.stat(record_dir)) else GONE
    finally:
        os.close(fd)


def _holder(fd: int, wait_s: float = 1.0) -> int | None:
    """The holder's pid, which it writes just after taking the lock: read again for a moment."""
    deadline = time.monotonic() + wait_s
    while (pid := _pid_in(fd)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def _pid_in(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
