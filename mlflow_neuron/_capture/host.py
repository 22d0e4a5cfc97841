"""The host during a profiled window: load, CPU used outside the training process, frequency, threads.

A profiled step's host time depends on what else the machine was doing. `HostSampler` takes a
sample where a window starts (`begin`) and one where its cycle is handed over (`end`), and gives
the window's values, named as `_record.model.HOST_VALUES`:

    other_cpu_cores       CPU seconds the rest of the host used, per wall second: the system's busy
                          time (psutil's `cpu_percent` rule) less the job's (this process's, its
                          helper's, and its child processes' and theirs), within [0, CPUs]
    other_cpu_s           the same CPU seconds, not clamped (compare divides a run's sum by its spans)
    child_processes_cpu_cores   CPU seconds the job's own child processes used (compile workers,
                          compilers, DataLoader workers; `child_processes`), per wall second, within
                          [0, CPUs]; the helper is not among them. Left out where the kernel does
                          not list a task's children: there `other_cpu_*` hold them too
    child_processes_cpu_s the same CPU seconds, not clamped
    span_s                the wall seconds those figures cover: the window itself, or, for a window
                          under `MIN_SPAN_S`, from up to `MIN_SPAN_S` before its end (as far back as
                          the samples kept go, and never into an earlier window): the system's
                          counters tick every 10 ms, so over a window of 2 ms, as a small step's
                          cycle takes, they say nothing, and over the second around it they do
    reach_back_s          how far before the window's start `span_s` begins: 0 where the figures
                          are the window's own
    load_average_1m       `os.getloadavg()` at the window's end
    cpu_count             logical CPUs
    cpu_frequency_mhz     `psutil.cpu_freq()`, where readable
    torch_threads         `torch.get_num_threads()` (passed in: this module imports no torch)
    window_s              the window's wall seconds
    neuron_utilization_percentage   neuron-monitor's mean NeuronCore utilisation over the reports
                          that arrived in the window, when the monitor runs

It runs on the training thread: no scan of all processes, only /proc/stat, the helper's
/proc/<pid>/stat and the files of the tree under this process. Each source is guarded: one that
fails leaves its value out, with one warning (`Reporter`); strict mode re-raises.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from .._record.model import NEURON_UTILIZATION
from . import child_processes

MIN_SPAN_S = 1.0  # windows shorter than this read other processes' CPU over the span around them
KEPT_SAMPLES = 128  # the samples a short window may reach back to (a few a window)
SLOW_FREQUENCY_READ_S = 1e-3  # psutil reads a file per CPU (or /proc/cpuinfo): slow on large hosts
FREQUENCY_REFRESH_S = 60.0  # where it is slow, the last value stands in for this long


def system_busy_seconds() -> float:
    """Busy CPU seconds of the whole host since boot, as psutil's `cpu_percent` counts them: total
    less idle and iowait, guest time not counted twice (Linux counts it in user time too)."""
    times = psutil.cpu_times()
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0)


def own_cpu_seconds() -> float:
    """This process's CPU seconds, every thread, to the nanosecond: /proc/stat ticks every 10 ms,
    and subtracting an exact figure from it adds no second rounding error."""
    return time.process_time()


def cpu_frequency_mhz() -> float | None:
    frequency = psutil.cpu_freq()
    return float(frequency.current) if frequency is not None and frequency.current else None


class _History:
    """The samples of every `HostSampler` in this process, newest last: what they read is the
    process's and the host's, not one callback's, so a short window reaches back to the nearest
    sample of any of them (variants profiled in rotation have a callback each, and a variant's
    previous window is a whole rotation away)."""

    def __init__(self) -> None:
        self._samples: collections.deque[_Sample] = collections.deque(maxlen=KEPT_SAMPLES)
        self._lock = threading.Lock()

    def keep(self, sample: _Sample) -> None:
        with self._lock:
            self._samples.append(sample)

    def newest_first(self) -> list[_Sample]:
        with self._lock:
            return list(reversed(self._samples))


@dataclass(frozen=True)
class _Sample:
    wall_s: float  # time.monotonic()
    epoch_s: float  # time.time(), to tell a helper started inside the window
    busy_s: float | None
    own_s: float | None
    helpers: dict[int, float]  # helper pid -> its CPU seconds
    children: tuple[float, frozenset[int]] | None  # the descendants' CPU seconds, and the helpers among them
    neuron: tuple[int, float] | None  # monitor reports so far, and their summed utilisation
    ends_window: bool = False  # a window's end: no later window's span reaches back past it


_HISTORY = _History()


class HostSampler:
    """`begin()` where a window starts, `end()` where it ends; a window started at construction."""

    def __init__(self, reporter: Any, *, torch_threads: Callable[[], int],
                 helper_pids: Callable[[], Iterable[int]] = tuple,
                 neuron_totals: Callable[[], tuple[int, float] | None] = lambda: None) -> None:  # fmt: skip
        self.reporter = reporter
        self._torch_threads = torch_threads
        self._helper_pids = helper_pids
        self._neuron_totals = neuron_totals
        self._helpers: dict[int, psutil.Process] = {}
        self._cpu_count = os.cpu_count()
        self._frequency: tuple[float, float | None] | None = None  # (monotonic time read, MHz) of a slow read
        self._frequency_read = False
        self._children = child_processes.supported()
        self.begin()

    def begin(self) -> None:
        self._start = self._sample()
        _HISTORY.keep(self._start)

    def end(self) -> dict[str, float]:
        """The window since the last `begin()` (or construction); values that could not be read are left out."""
        start, end = self._start, self._sample(ends_window=True)
        window = end.wall_s - start.wall_s
        base = start if window >= MIN_SPAN_S else self._reach_back(start, end.wall_s - MIN_SPAN_S)
        _HISTORY.keep(end)
        span = end.wall_s - base.wall_s
        values: dict[str, float | None] = {
            "window_s": window,
            "cpu_count": self._cpu_count,
            "load_average_1m": self._guarded(lambda: os.getloadavg()[0]),
            "cpu_frequency_mhz": self._guarded(self._frequency_mhz),
            "torch_threads": self._guarded(self._torch_threads),
        }
        if span > 0 and None not in (base.busy_s, end.busy_s, base.own_s, end.own_s):
            helpers = _helpers_delta(base, end, self._helpers)
            children = _children_delta(base, end, self._helpers)
            other_s = end.busy_s - base.busy_s - (end.own_s - base.own_s) - helpers - (children or 0.0)
            values.update(other_cpu_s=other_s, other_cpu_cores=self._cores(other_s, span), span_s=span,
                          reach_back_s=start.wall_s - base.wall_s)  # fmt: skip
            if children is not None:
                values.update(child_processes_cpu_s=children, child_processes_cpu_cores=self._cores(children, span))
        if start.neuron is not None and end.neuron is not None and end.neuron[0] > start.neuron[0]:
            reports, total = end.neuron[0] - start.neuron[0], end.neuron[1] - start.neuron[1]
            values[NEURON_UTILIZATION] = total / reports
        # Three decimals, as every metric of a cycle (no float noise in the store): milliseconds of
        # window, where the CPU counters tick every 10 ms anyway.
        return {name: round(float(value), 3) for name, value in values.items() if value is not None}

    def _cores(self, seconds: float, span: float) -> float:
        """CPU seconds per wall second within [0, CPUs]: the counters tick at 100 Hz, so over a
        short span a difference can leave that range."""
        return min(max(seconds / span, 0.0), float(self._cpu_count or seconds / span))

    def _reach_back(self, start: _Sample, since: float) -> _Sample:
        """The latest kept sample at or before `since` that no earlier window's end follows (a
        compile in the window before must not be this window's weather), else the earliest such;
        one that lacks the child processes' reading the window has is passed over."""
        found = start
        for sample in _HISTORY.newest_first():
            if sample.wall_s > start.wall_s:
                continue
            usable = sample.children is not None or start.children is None
            found = sample if usable else found
            if sample.ends_window or (usable and sample.wall_s <= since):
                break
        return found

    def _sample(self, ends_window: bool = False) -> _Sample:
        helpers = self._guarded(self._helper_seconds) or {}
        children = self._guarded(lambda: child_processes.descendants_cpu_seconds(helpers)) if self._children else None
        return _Sample(
            wall_s=time.monotonic(), epoch_s=time.time(), busy_s=self._guarded(system_busy_seconds),
            own_s=self._guarded(own_cpu_seconds), helpers=helpers, children=children,
            neuron=self._guarded(self._neuron_totals), ends_window=ends_window,
        )  # fmt: skip

    def _helper_seconds(self) -> dict[int, float]:
        """CPU seconds of each live helper process (it works for this process: not the host's load)."""
        for pid in self._helper_pids():
            if pid not in self._helpers:
                try:
                    self._helpers[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    pass
        seconds = {}
        for pid, process in list(self._helpers.items()):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:  # gone: what it used since the last sample counts as other
                del self._helpers[pid]
                continue
            seconds[pid] = times.user + times.system
        return seconds

    def _frequency_mhz(self) -> float | None:
        now = time.monotonic()
        if self._frequency is not None and now - self._frequency[0] < FREQUENCY_REFRESH_S:
            return self._frequency[1]
        mhz = cpu_frequency_mhz()
        slow = time.monotonic() - now > SLOW_FREQUENCY_READ_S and self._frequency_read  # the first read runs cold
        self._frequency, self._frequency_read = (now, mhz) if slow else None, True
        return mhz

    def _guarded(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception as error:  # noqa: BLE001 - a value left out; the cycle goes on (strict: raised)
            self.reporter.problem("host_sample", "could not sample the host for the profiled window "
                                  "(system/profile/... metrics are incomplete)", error)  # fmt: skip
            return None


def _children_delta(start: _Sample, end: _Sample, processes: dict[int, psutil.Process]) -> float | None:
    """The job's child processes' CPU seconds within the window, less its helpers' (read on their
    own, where they are children too), or None where unknown. A tree whose sum fell (a process that
    left it unwaited for) counts as none."""
    if start.children is None or end.children is None:
        return None
    helpers = _helpers_delta(start, end, processes, among=start.children[1] | end.children[1])
    return max(end.children[0] - start.children[0] - helpers, 0.0)


def _helpers_delta(start: _Sample, end: _Sample, processes: dict[int, psutil.Process],
                   among: frozenset[int] | None = None) -> float:  # fmt: skip
    """The helpers' (those `among`, if given) CPU seconds within the window; one started inside it counts whole."""
    total = 0.0
    for pid, seconds in end.helpers.items():
        if among is not None and pid not in among:
            continue
        if pid in start.helpers:
            total += seconds - start.helpers[pid]
        elif pid in processes:
            try:
                started_inside = processes[pid].create_time() >= start.epoch_s - 0.01  # 10 ms ticks
            except psutil.Error:
                continue
            total += seconds if started_inside else 0.0
    return total
