"""Intervals on one timeline, merged once and asked how much of a window they cover, and which
step a time falls in: the arithmetic of a rank summary (`collectives`), on arrays. Pure.

Example::

    busy = IntervalUnion(pairs([(0.0, 5.0), (3.0, 8.0)]))
    busy.within(2.0, 10.0)                     # 6.0: [2, 8) is covered
    step_indices([(1, 0.0, 10.0), (2, 10.0, 20.0)], np.array([5.0, 25.0]))   # [0, -1]
"""

from __future__ import annotations

import numpy as np


def pairs(intervals: list[tuple[float, float]]) -> np.ndarray:
    """(start, end) pairs as an (n, 2) array; (0, 2) for none."""
    return np.asarray(intervals, float).reshape(-1, 2)


class IntervalUnion:
    """A set of intervals ((n, 2) array) merged once; `within(a, b)` is how much of [a, b) it
    covers, in O(log n)."""

    def __init__(self, intervals: np.ndarray):
        self.intervals = intervals
        if not len(intervals):
            self.starts = self.ends = self.before = np.zeros(0)
            return
        array = np.asarray(intervals, float)
        array = array[np.argsort(array[:, 0], kind="stable")]
        reach = np.maximum.accumulate(array[:, 1])
        new = np.ones(len(array), bool)
        new[1:] = array[1:, 0] > reach[:-1]
        self.starts = array[new, 0]
        self.ends = np.maximum.reduceat(reach, np.flatnonzero(new))
        self.before = np.concatenate([[0.0], np.cumsum(self.ends - self.starts)])  # covered before each

    def covered_to(self, t: float) -> float:
        i = int(np.searchsorted(self.starts, t, side="right")) - 1
        if i < 0:
            return 0.0
        return float(self.before[i] + min(t - self.starts[i], self.ends[i] - self.starts[i]))

    def within(self, start: float, end: float) -> float:
        return max(0.0, self.covered_to(end) - self.covered_to(start)) if len(self.starts) else 0.0


def step_indices(steps: list[tuple[int | None, float, float]], times: np.ndarray) -> np.ndarray:
    """Each time's step: the index of the step whose span [start, end) holds it; -1 where none does."""
    starts = np.asarray([s for _, s, _ in steps], float)
    ends = np.asarray([e for _, _, e in steps], float)
    index = np.searchsorted(starts, times, side="right") - 1
    inside = index >= 0
    inside[inside] = times[inside] < ends[index[inside]]
    return np.where(inside, index, -1)
