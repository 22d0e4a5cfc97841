"""The step time between captures: when it changed (`ShiftRule`), and its line in MLflow (`StepTimeLine`).

Pure arithmetic on step times in nanoseconds, fed one step at a time by the callback's schedule
(`adaptive`); no torch, no MLflow, no clock of its own where a test can give one.

The rule, in full (the constants are below):

- the **reference** is the `REFERENCE_STEPS` steps before the window (while the window is off
  the level, the steps before it went off), and its **level** their median; its noise is their
  spread (1.4826 x their median absolute deviation, which a few slow steps do not move);
- the **window** is the last `window` steps, and the recent step time their median;
- a step is **off the level** when the window's median differs from the level by more than
  `min_change` of the level, and by more than `NOISE_Z` standard errors of a median of `window`
  steps of that noise (1.2533 x spread / sqrt(window));
- the step time **changed** when `persist` steps in a row, and `PERSIST_MIN_S` of them at least,
  are off the level on the same side. A single slow step moves a median of 20 by one place at
  most: a checkpoint save of 10x is named a **spike** (above `SPIKE_FACTOR` x the level) and
  changes nothing. On a loop of microsecond steps, a hiccup of a few hundred of them is not a
  change either.

The reference rolls with the steps, so a level measured while the machine was busy (a helper's
start, the cycle just captured being read) gives way to the quiet one without a capture, where the
change comes slowly. After a change is captured (or let go: the hour's captures are spent), both
are measured again from the next step, so one change is one capture; the rule then decides again
after `REFERENCE_STEPS + window` steps.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .._record.model import SPIKE_METRIC, STEP_TIME_METRIC

REFERENCE_STEPS = 50  # the steps before the window: the level and its noise
NOISE_Z = 5.0  # a shift must exceed this many standard errors of the window's median (iid noise)
PERSIST_MIN_S = 0.2  # a change holds for `persist` steps and this long: on a fast loop, 5 steps are a hiccup
SPIKE_FACTOR = 3.0  # a step above this many times the level is named a spike
MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma from its median absolute deviation
MEDIAN_SE = 1.2533  # a median of n normal samples varies sqrt(pi/2) times as much as their mean
POINT_MIN_S = 1.0  # a point of the step-time line covers at least this long (a fast loop: more steps)
POINT_MAX_STEPS = 65536  # ...and at most this many steps (bounded memory however fast the loop)


@dataclass(frozen=True)
class Shift:
    """A sustained change of the step time: from `before_ns` to `after_ns`, first seen at `from_step`."""

    before_ns: float
    after_ns: float
    from_step: int

    def reason(self) -> str:
        """The reason a capture records: "step time 21.0 → 35.2 ms from step 300"."""
        return f"step time {_ms(self.before_ns)} → {_ms(self.after_ns)} ms from step {self.from_step}"


class ShiftRule:
    """Decides, one step at a time, whether the step time changed (the module's rule)."""

    def __init__(self, *, window: int, persist: int, min_change: float) -> None:
        self.window_steps, self.persist, self.min_change = window, persist, min_change
        self.reset()

    def reset(self) -> None:
        """Forgets every step: the reference is measured again from the next one."""
        self.window: deque[tuple[int, int]] = deque()  # (step, ns) of the window's steps
        self.recent: list[int] = []  # their times, sorted
        self.past: deque[int] = deque()  # the reference's times, in order
        self.reference: list[int] = []  # the same, sorted
        self.held: list[int] = []  # times that left the window while it was off: the reference waits
        self.streak = 0  # steps in a row off the level: + above it, - below it
        self.streak_ns = 0  # their time
        self.streak_window: list[tuple[int, int]] = []  # the window when the streak began: it dates the change
        self.level: float | None = None  # the reference's median, once it holds `REFERENCE_STEPS` steps

    def add(self, step: int, ns: int) -> Shift | None:
        """Takes the time of `step`; a `Shift` when this step makes a change sustained."""
        window, recent = self.window, self.recent
        window.append((step, ns))
        insort(recent, ns)
        if len(window) > self.window_steps:  # its oldest step joins the reference, or waits
            gone = window.popleft()[1]
            del recent[bisect_left(recent, gone)]
            if self.streak:
                self.held.append(gone)
            else:
                self._join(gone)
        if len(self.reference) < REFERENCE_STEPS:
            return None
        self.level = level = _median(self.reference)
        off = _median(recent) - level
        if abs(off) <= self.min_change * level or abs(off) <= self._noise(level):
            if self.streak:
                self._end_streak()
            return None
        side = 1 if off > 0 else -1
        if self.streak * side <= 0:
            self._end_streak()
            self.streak_window = list(self.window)
        self.streak, self.streak_ns = self.streak + side, self.streak_ns + ns
        held = abs(self.streak) >= self.persist and self.streak_ns >= PERSIST_MIN_S * 1e9
        return self._shift(level) if held else None

    def is_spike(self, ns: int) -> bool:
        """Whether a step of `ns` is a spike against the level of the latest step."""
        return self.level is not None and ns > SPIKE_FACTOR * self.level

    def _join(self, ns: int) -> None:
        self.past.append(ns)
        insort(self.reference, ns)
        if len(self.past) > REFERENCE_STEPS:
            del self.reference[bisect_left(self.reference, self.past.popleft())]

    def _end_streak(self) -> None:
        """The window is back on the level (or off on the other side): the steps that waited join
        the reference, which is again the steps just before the window."""
        for ns in self.held[-REFERENCE_STEPS:]:
            self._join(ns)
        self.held, self.streak, self.streak_ns = [], 0, 0

    def _noise(self, level: float) -> float:
        """`NOISE_Z` standard errors of a median of the window, from the reference's spread (asked
        only when the window is off by `min_change`: a sort of its 50 steps)."""
        spread = MAD_TO_SIGMA * _median(sorted(abs(t - level) for t in self.reference))
        return NOISE_Z * MEDIAN_SE * spread / math.sqrt(self.window_steps)

    def _shift(self, level: float) -> Shift:
        """The change: from the level to the median of the window's steps since it began, dated by
        the window when the streak began, at the split that leaves fewest of its steps on the wrong
        side of the midway (the earliest such split)."""
        steps, now = self.streak_window, _median(self.recent)
        midway = (level + now) / 2
        new_side = [(t > midway) == (now > level) for _, t in steps]
        misfits = [sum(new_side[:i]) + (len(steps) - i - sum(new_side[i:])) for i in range(len(steps))]
        start = steps[misfits.index(min(misfits))][0]
        after = sorted(t for step, t in self.window if step >= start) or self.recent  # the window's steps since
        return Shift(level, _median(after), start)


class StepTimeLine:
    """The step time between captures as points: the median of each `every` steps (of at least
    `POINT_MIN_S`), and every spike at its step; handed to `send` at most every `flush_s`."""

    def __init__(self, send: Callable[[list[tuple[str, float, int]]], None], *, every: int, flush_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.send, self.every, self.flush_s, self.clock = send, every, flush_s, clock
        self.times: list[int] = []
        self.pending: list[tuple[str, float, int]] = []
        self.started = self.flushed = clock()
        self.last_step = 0

    def add(self, step: int, ns: int, spike: bool) -> None:
        self.times.append(ns)
        self.last_step = step
        if spike:
            self.pending.append((SPIKE_METRIC, round(ns / 1e6, 3), step))
        waited = len(self.times) - self.every
        if waited >= 0 and waited % 10 == 0:  # the clock is read at `every` steps, then every 10 more
            now = self.clock()
            if now - self.started >= POINT_MIN_S or len(self.times) >= POINT_MAX_STEPS:
                self.close_point(now)
            if self.pending and now - self.flushed >= self.flush_s:
                self.flush(now)

    def close_point(self, now: float | None = None) -> None:
        """The steps so far as one point (at the last of them)."""
        if self.times:
            self.pending.append((STEP_TIME_METRIC, round(_median(sorted(self.times)) / 1e6, 3), self.last_step))
        self.times = []
        self.started = self.clock() if now is None else now

    def flush(self, now: float | None = None) -> None:
        """Hands the pending points on (the partial point too, with `close_point` first)."""
        points, self.pending = self.pending, []
        self.flushed = self.clock() if now is None else now
        if points:
            self.send(points)


def _median(ordered: list) -> float:
    n = len(ordered)
    return float(ordered[n // 2]) if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _ms(ns: float) -> str:
    ms = ns / 1e6
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 1 else f"{ms:.3f}"
