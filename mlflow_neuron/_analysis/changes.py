"""Change points in a series of runs: where a nightly profile got slower or faster (pure).

Example::

    found = change_points([run1_steps, run2_steps, ...])   # one array of per-step samples per run
    [(c.at, c.ratio, c.low, c.high, c.verdict) for c in found]
    search_changes(runs).suggested   # PELT's candidates, confirmed or not

Two stages, as Apache Otava and asv do it (candidates, then a test), with one statistic shared
with `compare`:

1. **Candidates.** PELT (Killick et al. 2012; `pelt_l2`, the search `ruptures.Pelt` makes) splits the series of the runs' log
   medians where its mean shifts, with the L2 cost and the penalty `PENALTY` × σ² × log(n): σ
   is the run-to-run noise, estimated robustly from successive differences (MAD / √2), so a
   stall or an outlier run does not widen it. PELT is exact for its cost, and fast.
2. **Confirmation.** Each candidate is judged by the two segments it separates: their runs'
   steps pooled, each run one cluster, with `cycles.judge` (the ratio and 95% interval that
   `compare` uses: Hodges–Lehmann over steps, or Welch's interval over the runs where the runs
   differ beyond their steps' noise). It stays only when the whole interval lies outside
   ±`noise_pct`; otherwise it is dropped, the two segments merge, and the rest are judged again.
   Where the runs' levels come from their summary metrics (`history` over many runs), only the
   runs next to a candidate are loaded, and judged: `window` of each segment, widened (twice, then
   four times) while that does not confirm it; `benchmarks/history_calibration.py` counts how
   often this agrees with judging the whole segments.

A change is named by the first run after it (`at`, an index into the series).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .cycles import judge
from .model import DEFAULT_NOISE_PCT, FASTER, SLOWER
from .._trace.step_summary import level

# × σ² log(n). `python benchmarks/history_calibration.py --penalty P` (400 series a kind): 2 let 6.5%
# of flat series report a change, 2.5 3.0%, 3.5 1.5% while finding fewer +10% steps (65% -> 55%).
PENALTY = 2.5
MIN_RUNS = 3  # a segment holds at least this many runs: two-run segments at the ends were chosen by noise
WIDEST = 4  # a candidate the runs next to it do not confirm is judged again on up to 4 × the window
_SIGMA_FLOOR = 0.002  # log-scale noise below this (0.2%) is the profiler's resolution, not the runs'


@dataclass(frozen=True)
class Change:
    """A confirmed change between run `at - 1` and run `at` (indices into the series)."""

    at: int
    ratio: float  # the segment after / the segment before
    low: float
    high: float
    unit: str  # "steps" or "cycles" (here: runs), as in compare
    before: tuple[int, int]  # the runs judged on each side, [start, end): the segments, or the runs next to `at`
    after: tuple[int, int]

    @property
    def verdict(self) -> str:
        return SLOWER if self.ratio > 1 else FASTER

    @property
    def percent(self) -> float:
        return (self.ratio - 1) * 100


@dataclass(frozen=True)
class Search:
    """What a search of a series found: the confirmed `changes`, how many change points PELT
    `suggested` before confirmation (none kept: all stayed within the noise band), and why no
    search was made (`skipped`), if none was."""

    changes: list[Change]
    suggested: int = 0
    skipped: str | None = None


def change_points(runs: list[np.ndarray], noise_pct: float = DEFAULT_NOISE_PCT,
                  penalty: float = PENALTY) -> list[Change]:  # fmt: skip
    """The confirmed changes of a series of runs (each an array of per-step samples, in run order)."""
    return search_changes(runs, noise_pct, penalty).changes


def search_changes(runs: list[np.ndarray], noise_pct: float = DEFAULT_NOISE_PCT, penalty: float = PENALTY) -> Search:
    """`change_points`, with how many candidates there were, or why there was no search."""
    runs = [np.asarray(r, float) for r in runs]
    if len(runs) < 2 * MIN_RUNS:
        return too_few(len(runs))
    levels = [level(r) for r in runs]
    if any(v is None for v in levels):  # a step that took no time has no log
        return Search([], skipped=NO_LEVEL)
    return confirmed(np.array(levels), runs.__getitem__, noise_pct, penalty)


def too_few(runs: int) -> Search:
    return Search([], skipped=f"{runs} runs are too few to look for a change ({MIN_RUNS} a side, {2 * MIN_RUNS} in all)")


NO_LEVEL = "a run has no samples, or a time of zero or less"


def confirmed(levels: np.ndarray, samples_of: Callable[[int], np.ndarray], noise_pct: float = DEFAULT_NOISE_PCT,
              penalty: float = PENALTY, window: int | None = None,
              prefetch: Callable[[list[int]], None] | None = None) -> Search:  # fmt: skip
    """Candidates from the runs' `levels` (`_trace.step_summary.level`), each confirmed on per-step
    samples: `samples_of(i)` gives run i's. Each candidate is judged on the runs of the two segments
    it separates, or with `window` on at most that many runs of each segment next to it (the runs
    whose samples `history` loads); `prefetch(indices)` is told which runs a round will ask for."""
    breaks = candidates(levels, penalty)
    suggested = len(breaks)
    while True:
        judged = [_judge_near(samples_of, start, at, end, noise_pct, window, prefetch)
                  for start, at, end in _segments(breaks, len(levels))]  # fmt: skip
        kept = [change for change in judged if change is not None]
        if len(kept) == len(judged):
            return Search(kept, suggested)
        dropped = next(i for i, change in enumerate(judged) if change is None)
        breaks = breaks[:dropped] + breaks[dropped + 1:]


def candidates(levels: np.ndarray, penalty: float = PENALTY) -> list[int]:
    """Indices where PELT starts a new segment of `levels` (one value per run; none for a flat series)."""
    n = len(levels)
    sigma = max(float(np.median(np.abs(np.diff(levels))) / 0.6745 / math.sqrt(2)), _SIGMA_FLOOR)
    return pelt_l2(levels, penalty * sigma**2 * math.log(n), MIN_RUNS)[:-1]


def pelt_l2(signal: np.ndarray, penalty: float, min_size: int) -> list[int]:
    """The ends of the segments of `signal` (one value per run; the last end is its length) that
    minimize the L2 cost (each segment's sum of squared deviations from its mean) plus `penalty`
    per segment, each segment at least `min_size` long: PELT (Killick et al. 2012), the search
    `ruptures.Pelt(model="l2", min_size=min_size, jump=1)` makes, with each step's candidates
    costed at once from cumulative sums. Without importing ruptures and SciPy's statistics (about
    0.9 s of every `history`), and 1,000 runs in milliseconds where ruptures took seconds.
    ValueError when `signal` is shorter than `min_size`."""
    x = np.asarray(signal, float).ravel()
    n = len(x)
    if min_size > n or min_size < 1:
        raise ValueError(f"a series of {n} values has no segment of at least {min_size}")
    x = x - x.mean()  # sums of squares of values near 0: no cancellation against a large mean
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])
    cost = np.full(n + 1, np.inf)  # cost[t]: the best partition of signal[:t] (inf: none yet)
    cost[0] = 0.0
    last = np.zeros(n + 1, dtype=int)  # and where its last segment starts
    admissible = np.zeros(0, dtype=int)
    for end in [*range(min_size, n), n]:
        admissible = np.append(admissible, end - min_size)
        admissible = admissible[np.isfinite(cost[admissible])]
        length = end - admissible
        error = np.maximum((s2[end] - s2[admissible]) - (s1[end] - s1[admissible]) ** 2 / length, 0.0)
        totals = cost[admissible] + (error + penalty)
        best = int(np.argmin(totals))  # the first of equals
        cost[end], last[end] = totals[best], admissible[best]
        # PELT's pruning, with room for rounding: a start whose cost ties the best's is kept
        admissible = admissible[totals <= totals[best] + penalty + 1e-9 * (1.0 + abs(totals[best]))]
    ends = [n]
    while last[ends[-1]] > 0:
        ends.append(int(last[ends[-1]]))
    return ends[::-1]


def _segments(breaks: list[int], n: int) -> list[tuple[int, int, int]]:
    bounds = [0, *breaks, n]
    return [(bounds[i - 1], bounds[i], bounds[i + 1]) for i in range(1, len(bounds) - 1)]


def _judge_near(samples_of: Callable[[int], np.ndarray], start: int, at: int, end: int, noise_pct: float,
                window: int | None, prefetch: Callable[[list[int]], None] | None) -> Change | None:  # fmt: skip
    """The candidate judged on the runs next to it: `window` of each side, then twice as many while
    that does not confirm it (up to `WIDEST` × window), or on the whole segments (`window` None)."""
    width = window
    while True:
        before, after = (start, at), (at, end)
        if width is not None:
            before, after = (max(start, at - width), at), (at, min(end, at + width))
        if prefetch is not None:
            prefetch([*range(*before), *range(*after)])
        change = _judge(samples_of, before, after, noise_pct)
        if change is not None or width is None or (before, after) == ((start, at), (at, end)) or width >= WIDEST * window:
            return change
        width *= 2


def _judge(samples_of: Callable[[int], np.ndarray], before_runs: tuple[int, int], after_runs: tuple[int, int],
           noise_pct: float) -> Change | None:  # fmt: skip
    before, after = [samples_of(i) for i in range(*before_runs)], [samples_of(i) for i in range(*after_runs)]
    judged = judge(np.concatenate(before), _labels(before), np.concatenate(after), _labels(after))
    estimate = judged.estimate
    if not estimate.has_interval:
        return None
    margin = noise_pct / 100
    if estimate.low <= 1 + margin and estimate.high >= 1 - margin:
        return None
    return Change(after_runs[0], estimate.ratio, estimate.low, estimate.high, judged.unit, before_runs, after_runs)


def _labels(runs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.full(len(r), i) for i, r in enumerate(runs)])
