"""CPU seconds of the job's own processes: this process's child processes and theirs.

A training job's work does not all run in its training process. torch.compile starts a pool of
compile workers and runs `cc1plus` on the kernels it generates; a DataLoader starts worker
processes. Their CPU is the job's, not the host's weather, and `HostSampler` must tell the two
apart without a scan of every process on the host (it runs on the training thread). Linux lists a
task's children in `/proc/<pid>/task/<tid>/children`, so the tree under this process is read
from there alone:

    reaped    what the children this process has waited for used in all, and theirs
              (`os.times()`: the kernel adds a child's CPU, with what its own reaped children
              used, to its parent's when the parent reaps it)
    live      for each live descendant, `/proc/<pid>/stat`'s utime + stime + cutime + cstime

Their sum only grows while children come and go: a child that ends inside a window moves from
`live` to `reaped` whole, with what it used before the window, which the window's first sample
had counted as live. A process that leaves the tree without being waited for (a daemon that
forks twice, a parent that ignores SIGCHLD) takes its CPU out of the sum; a window where the
sum falls is counted as no child CPU.

The cost grows with the threads of the processes in the tree, a file read each (about 5 µs):
`python benchmarks/host_cost.py --children 3` measures it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc/<pid>/stat's times (100 a second)


def _read(path: str) -> bytes:
    """A small /proc file at once (os.open: a third of open()'s cost, which this pays per thread)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def children_of(pid: int) -> list[int]:
    """The live children of every thread of `pid` (a thread's children file lists only the
    processes it started)."""
    found: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found += [int(child) for child in _read(f"/proc/{pid}/task/{tid}/children").split()]
        except (FileNotFoundError, ProcessLookupError):  # the thread ended since the listing
            continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """A process's CPU seconds with its reaped children's: utime, stime, cutime and cstime."""
    text = _read(f"/proc/{pid}/stat")
    fields = text[text.rindex(b")") + 2 :].split()  # the command name may hold spaces and parentheses
    return sum(int(ticks) for ticks in fields[11:15]) / CLOCK_TICKS  # fields 14 to 17 of proc(5)


def supported() -> bool:
    """Whether this kernel lists children (CONFIG_PROC_CHILDREN, on in the common distributions)."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendants_cpu_seconds(watched: Iterable[int] = ()) -> tuple[float, frozenset[int]]:
    """This process's descendants' CPU seconds so far (reaped and live, as above), and which of
    the `watched` pids are among the live ones."""
    times = os.times()
    total = times.children_user + times.children_system
    seen: set[int] = set()
    pending = children_of(os.getpid())
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        try:
            total += tree_cpu_seconds(pid)
            pending += children_of(pid)
        except (FileNotFoundError, ProcessLookupError):  # ended and reaped since its parent listed it
            continue
        seen.add(pid)
    return total, frozenset(seen.intersection(watched))
