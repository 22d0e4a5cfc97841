"""Helpers that deliver after the exit: the training process lets them go at once.

With `deliver_after_exit`, a profile's stop leaves the helper running (the next profile's cycles go
to it too), and the callback's `close()` tells it to `detach`: it delivers what it holds with no
shutdown budget of the training process's, whatever the training process does next, and exits.
Each of its cycles is staged with its job in the outbox (`staging`): a helper killed meanwhile
leaves them to `mlflow-neuron sync`. So the exit waits only until the pipe carried the
last messages to the helper (milliseconds: the helper reads its pipe from its first moment).
"""

from __future__ import annotations

import threading
import time

from .helper_process import HelperProcess


class HandedOver:
    """The helpers that were let go, until the callback closes (then their input ends too)."""

    def __init__(self) -> None:
        self._procs: list[HelperProcess] = []
        self._finished: list[HelperProcess] = []  # their input ended
        self._lock = threading.Lock()
        self.cycles = 0  # cycles they had not settled when they were let go

    def add(self, proc: HelperProcess, unsettled: int) -> None:
        proc.send({"op": "detach"})
        with self._lock:
            self._procs.append(proc)
            self.cycles += unsettled

    def finish(self, *, end_run: bool) -> bool:
        """Asks each to close once it delivered everything (a forked child of training, such as a
        DataLoader worker, may hold the pipe open: EOF alone might not come) and ends its input; with
        `end_run`, it ends the run (FINISHED) after its last cycle. True when one was told to."""
        with self._lock:
            procs, self._procs = list(self._procs), []
            self._finished.extend(procs)
        running = [p for p in procs if p.alive]
        for proc in running:
            if end_run:
                proc.send({"op": "end_run"})
            proc.send({"op": "close", "seq": 0, "timeout": None})
            proc.end_input()
        return end_run and bool(running)

    def wait_written(self, deadline: float | None) -> bool:
        """Waits until every message reached their pipes (the training process may exit then)."""
        with self._lock:
            procs = self._procs + self._finished
        return all(p.wait_written(seconds_left(deadline)) for p in procs)

    def wait_exited(self, timeout: float | None = None) -> bool:
        """Waits until they delivered what they held and exited; False if `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            procs = self._procs + self._finished
        for proc in procs:
            try:
                proc.proc.wait(seconds_left(deadline))
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
                return False
        return True

    def pids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(p.proc.pid for p in self._procs + self._finished if p.alive)


def seconds_left(deadline: float | None) -> float | None:
    """Seconds until a monotonic `deadline` (never below 0); None without one."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)
