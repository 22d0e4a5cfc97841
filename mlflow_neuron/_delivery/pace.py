"""Whether cycles arrive faster than a sender can deliver them, and what to change if so.

A queue that only grows ends in the profiler's exit waiting for it (up to the shutdown budget)
and in cycles going to the outbox. `Pace` keeps the times cycles arrived and how long recent
deliveries took, and turns that into one sentence: the rate in, the rate out, what the exit
would wait, and how much less often to profile.
"""

from __future__ import annotations

import math
import time
from collections import deque

BEHIND_AT = 4  # cycles waiting (queued or being sent) before the rates are compared
ARRIVALS = 8  # the rate in: over this many latest arrivals
DELIVERIES = 8  # the rate out: over this many latest deliveries (the first, which creates the run, not counted)
HEADROOM = 1.25  # the advice leaves this much room: a sender at 80% of its rate still keeps up


class Pace:
    """Not thread-safe: the sender calls it under its lock."""

    def __init__(self) -> None:
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=ARRIVALS)  # (monotonic time, step)
        self._deliveries: deque[tuple[int, float]] = deque(maxlen=DELIVERIES)  # (cycles, seconds)
        self._first = True
        self.busy_s = 0.0  # all the time spent delivering (cycles/s = delivered / busy_s)
        self.after_exit = False  # the helper delivers after the exit (`deliver_after_exit`): nothing waits

    def arrived(self, step: int) -> None:
        self._arrivals.append((time.monotonic(), step))

    def delivered(self, cycles: int, seconds: float) -> None:
        self.busy_s += seconds
        if self._first:  # it also created or found the run and loaded its state: not the usual cost
            self._first = False
            return
        self._deliveries.append((cycles, seconds))

    def rates(self) -> tuple[float, float] | None:
        """(cycles/s arriving, cycles/s a sender delivers while busy), once both are known."""
        if len(self._arrivals) < BEHIND_AT or not self._deliveries:
            return None
        (first, _), (last, _) = self._arrivals[0], self._arrivals[-1]
        rate_in = (len(self._arrivals) - 1) / max(last - first, 1e-6)
        rate_out = sum(c for c, _ in self._deliveries) / max(sum(s for _, s in self._deliveries), 1e-6)
        return rate_in, rate_out

    def behind(self, waiting: int) -> str | None:
        """A sentence when `waiting` cycles piled up and they arrive faster than they leave; else None."""
        rates = self.rates() if waiting >= BEHIND_AT else None
        if rates is None or rates[0] <= rates[1]:
            return None
        rate_in, rate_out = rates
        (_, first), (_, last) = self._arrivals[0], self._arrivals[-1]
        every = max((last - first) / (len(self._arrivals) - 1), 1.0)  # steps from one cycle to the next
        needed = math.ceil(every * rate_in / rate_out * HEADROOM)
        later = (f"the helper would go on delivering them for about {waiting / rate_out:.1f} s after training "
                 "ends (the exit does not wait; wait_delivered() does)") if self.after_exit else (
                 f"the profiler's exit would wait about {waiting / rate_out:.1f} s for them (at most "
                 "flush_timeout_s; the rest goes to the outbox)")  # fmt: skip
        return (
            f"profiler cycles arrive faster than they are delivered: {rate_in:.1f} cycles/s in, "
            f"{rate_out:.1f} out; {waiting} are waiting, so {later}. "
            f"Profile less often: a cycle comes every {every:g} steps; with schedule(wait=...) "
            f"{needed - every:g} steps longer (a cycle every {needed} steps) delivery keeps up"
        )
