"""The cycle as the unit of replication (pure: numpy arrays in, numbers out).

Every step of one profiled window shares the machine's state during that window, so the steps
of a run are not independent draws: a run whose cycles sit at different levels (the host got
busier, the clock changed) has fewer independent samples than steps. A comparison therefore asks
first whether the cycles differ beyond the noise between steps, and only then which interval is
honest:

1. **Between-cycle variance.** A nested one-way analysis of variance on log times (cycles nested
   in runs, the named outliers left out), pooled over both runs: F = mean square between the
   cycles of a run / mean square between the steps of a cycle. `share` is the between-cycle
   component's share of the variance (the intraclass correlation, method of moments). The
   cycles differ when the F test's p-value is below `CYCLE_ALPHA` (0.2: a test with few cycles
   has little power, and a missed shift makes the step-level interval too narrow; the
   simulation in `benchmarks/stats_calibration.py` chose it) and the between-cycle component's
   standard deviation is at least `NEGLIGIBLE_SHIFT` (0.5%): device time that barely jitters
   makes any cycle-to-cycle wobble significant, but a wobble that small cannot carry a change
   past the 2% noise threshold a verdict must clear.
2. **The interval.** Cycles that do not differ: the step-level Hodges–Lehmann ratio with Moses'
   interval (`stats.ratio_interval`). Cycles that differ: a cluster-level interval, Welch's
   t-interval with Satterthwaite's degrees of freedom on each cycle's median log time (the
   "summary measures" analysis of cluster-randomized trials; Donner & Klar 2000). Each cycle is
   then one sample.
3. **Too few cycles.** The cluster-level interval needs `MIN_CYCLES` (3) cycles in each run; with
   fewer, there is no honest interval and the verdict says how many cycles are needed.

   For host time with `MIN_CYCLES` cycles a run, the interval is always the cycle-level one:
   the F test on three or four cycles has little power, and on a quiet host a window's steps
   jump together between levels about 2x apart (the calibration matrix's quiet A/A pairs: a
   cycle's median step 46–160 us for one and the same code), in rotation too.
4. **Which evidence the gate may act on.** A step-level interval from one or two windows a run
   covers the noise between steps, not the variation between windows: under host load, two
   windows can sit far apart and take every step with them, and on a quiet host a whole run
   can shift (quiet A/A pairs profiled one after the other: every cycle of one run 1.3–1.9x
   the other's). Host time is therefore gated (`window_rule`) only for runs of one
   `interleaved()` call (their windows alternate, so a shift of the time moves both), and on a
   distribution-free interval over cycles only, at 1 − 0.05/m for a run of m rows
   (`family_intervals`): 4 cycles each for one row, 6 for 7–23 rows (`gate_cycles`). Welch's
   interval at that level fired on 1 of 20 quiet A/A pairs in rotation with 4 cycles each: one
   run's four windows sat at one level, and its variance read near zero. Device time, which
   the host's load does not move, is gated on its own evidence. Rows that fail this keep their
   numbers and verdict, say why they are not gated, and never fail the gate.

Rows whose samples are not all positive (an op absent from some steps) and runs with one sample
per cycle are judged on steps alone: the first have no log scale, the second are cycle-level
already.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import fdtrc, stdtrit

from .stats import CONFIDENCE, RatioEstimate, moses_rank, outlier_mask, ratio_interval

CYCLE_ALPHA = 0.2
NEGLIGIBLE_SHIFT = 0.005  # standard deviation of the cycles' shifts, on the log scale
MIN_CYCLES = 3
STEPS, CYCLES = "steps", "cycles"  # the unit an interval was computed on


@dataclass(frozen=True)
class CycleNoise:
    """Whether the cycles of two runs differ beyond the noise between their steps."""

    p_value: float  # NaN: not testable (one cycle per run, one step per cycle, zeros)
    share: float  # the between-cycle share of the variance, 0..1 (NaN when not testable)
    cycles: tuple[int, int]  # cycles of the baseline and of the run
    spread: float = math.nan  # the between-cycle component's standard deviation (log scale)

    @property
    def differ(self) -> bool:
        return self.p_value < CYCLE_ALPHA and self.spread >= NEGLIGIBLE_SHIFT  # False for NaN


@dataclass(frozen=True)
class Judged:
    """A row's estimate, the unit it was computed on, and the cycles test behind that choice."""

    estimate: RatioEstimate
    unit: str  # STEPS or CYCLES
    noise: CycleNoise
    too_few_cycles: bool = False  # the cycles differ but a run has fewer than MIN_CYCLES


def judge(base: np.ndarray, base_cycles: np.ndarray, run: np.ndarray, run_cycles: np.ndarray,
          confidence: float = CONFIDENCE, *, by_cycles: bool = False) -> Judged:  # fmt: skip
    """run / baseline with the interval its cycles allow; named outliers are left out first.
    `by_cycles`: host time, whose windows jump between levels together, in rotation or not, more
    than an F test on a few cycles can tell: from `MIN_CYCLES` cycles a run the interval is always
    the cycle-level one, whatever the test says.

    Example::

        judged = judge(base_values, base_cycle_ids, run_values, run_cycle_ids)
        judged.unit, judged.estimate.low, judged.estimate.high, judged.too_few_cycles
    """
    x, cx = _kept(base, base_cycles)
    y, cy = _kept(run, run_cycles)
    noise = cycle_noise(x, cx, y, cy)
    if by_cycles and min(noise.cycles) >= MIN_CYCLES:
        if (x > 0).all() and (y > 0).all():
            return Judged(cluster_interval(x, cx, y, cy, confidence), CYCLES, noise)
        # an op absent from some steps: no log scale, so no cycle-level interval to judge or gate on
        return Judged(RatioEstimate(ratio_interval(x, y, confidence).ratio, None, None), CYCLES, noise)
    if not noise.differ:
        return Judged(ratio_interval(x, y, confidence), STEPS, noise)
    if min(noise.cycles) < MIN_CYCLES:
        point = ratio_interval(x, y, confidence).ratio
        return Judged(RatioEstimate(point, None, None), CYCLES, noise, too_few_cycles=True)
    return Judged(cluster_interval(x, cx, y, cy, confidence), CYCLES, noise)


def window_rule(cycles: tuple[int, int], host_time: bool, rotation: bool, needs: int) -> str | None:
    """None when a comparison's intervals cover the variation between profiled windows and runs,
    so the gate may act on them; else why not, in words (`profiled apart: not gated; ...`).
    `cycles`: the baseline's and the run's; `rotation`: both come from one `interleaved()` call;
    `needs`: the cycles each run needs for the gate's interval (`family_intervals`)."""
    if not host_time or (rotation and min(cycles) >= needs):
        return None
    if not rotation:
        return (f"runs profiled apart: not gated (a whole run can shift); profile them in rotation with "
                f"interleaved(), \u2265 {needs} cycles each")  # fmt: skip
    base, run = cycles
    count = f"{base} window{'s' if base != 1 else ''} a run" if base == run else f"{base} vs {run} windows a run"
    return f"{count}: not gated; profile \u2265 {needs} cycles each in rotation"


def family_intervals(rows: dict[str, tuple], judged: int = 0, alpha: float = 1 - CONFIDENCE) -> dict:
    """{"level", "rows": {row: [low, high]}, "needs"}: each row's distribution-free interval over
    cycles at 1 - alpha/m, m the rows judged on their cycles (Bonferroni; else the `judged`
    rows, as runs of too few cycles have), and the cycles each run needs for them
    (`gate_cycles`). The gate asks whether *any* row of a run is slower: m rows at 95% each
    fire on an A/A pair far more often than 5% of the time. The interval is Moses' on the
    cycles' medians (`stats.ratio_interval`), not Welch's: a window's level is not normal (it
    jumps between levels about 2x apart), and four cycles of one run that all sat at one level
    gave Welch a near-zero variance and a quiet A/A pair in rotation an alarm (1 of 20, the
    calibration matrix). Rows without an interval at this level (too few cycles, `gate_cycles`)
    are left out, and the gate does not act on them. `rows`: {row: (base, base_cycles, run,
    run_cycles)} of the rows judged on their cycles; named outliers are left out first, as in
    `judge`."""
    level = 1 - alpha / max(len(rows), 1)
    found = {}
    for row, (base, base_cycles, run, run_cycles) in rows.items():
        x, y = np.exp(_cycle_medians(*_kept(base, base_cycles))), np.exp(_cycle_medians(*_kept(run, run_cycles)))
        if len(x) and len(y):
            estimate = ratio_interval(x, y, level)
            if estimate.has_interval:
                found[row] = [float(estimate.low), float(estimate.high)]
    return {"level": level, "rows": found, "needs": gate_cycles(len(rows) or judged, alpha)}


def gate_cycles(rows: int, alpha: float = 1 - CONFIDENCE) -> int:
    """The fewest cycles each run needs for `family_intervals` to give `rows` rows an interval:
    4 for one row, 5 for 2–6, 6 for 7–23, 7 for 24–85 (two-sided, exact)."""
    return next(n for n in range(2, 64) if moses_rank(n, n, 1 - alpha / max(rows, 1)) >= 1)


def cycle_noise(x: np.ndarray, cx: np.ndarray, y: np.ndarray, cy: np.ndarray) -> CycleNoise:
    """The nested F test of between-cycle variance on log times (see the module docstring)."""
    cycles = (len(np.unique(cx)), len(np.unique(cy)))
    if min(len(x), len(y)) == 0 or (x <= 0).any() or (y <= 0).any():
        return CycleNoise(math.nan, math.nan, cycles)
    between = within = 0.0
    groups = sizes = 0
    for values, labels in ((x, cx), (y, cy)):
        logs = np.log(values)
        grand = logs.mean()
        for label in np.unique(labels):
            group = logs[labels == label]
            between += len(group) * (group.mean() - grand) ** 2
            within += float(((group - group.mean()) ** 2).sum())
            groups += 1
        sizes += len(values)
    df_between, df_within = groups - 2, sizes - groups
    if df_between < 1 or df_within < 1:
        return CycleNoise(math.nan, math.nan, cycles)
    ms_between, ms_within = between / df_between, within / df_within
    # n0: the mean cycle size, corrected for unequal sizes (the usual method-of-moments estimate)
    sizes_by_cycle = np.array([np.sum(lab == c) for lab in (cx, cy) for c in np.unique(lab)], float)
    n0 = (sizes_by_cycle.sum() - (sizes_by_cycle**2).sum() / sizes_by_cycle.sum()) / df_between
    component = max((ms_between - ms_within) / n0, 0.0)
    if ms_within == 0:
        return CycleNoise(1.0 if ms_between == 0 else 0.0, 1.0 if ms_between else 0.0, cycles, math.sqrt(component))
    p_value = float(fdtrc(df_between, df_within, ms_between / ms_within))
    return CycleNoise(p_value, component / (component + ms_within), cycles, math.sqrt(component))


def cluster_interval(x: np.ndarray, cx: np.ndarray, y: np.ndarray, cy: np.ndarray,
                     confidence: float = CONFIDENCE) -> RatioEstimate:  # fmt: skip
    """Welch's t-interval on the cycles' median log times, as a ratio run / baseline."""
    base, run = _cycle_medians(x, cx), _cycle_medians(y, cy)
    difference = run.mean() - base.mean()
    base_var, run_var = base.var(ddof=1) / len(base), run.var(ddof=1) / len(run)
    spread = base_var + run_var
    if spread == 0:
        point = math.exp(difference)
        return RatioEstimate(point, point, point, exact=True)
    df = spread**2 / (base_var**2 / (len(base) - 1) + run_var**2 / (len(run) - 1))
    half = float(stdtrit(df, 0.5 + confidence / 2)) * math.sqrt(spread)
    return RatioEstimate(math.exp(difference), math.exp(difference - half), math.exp(difference + half))


def _cycle_medians(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.array([np.median(np.log(values[labels == label])) for label in np.unique(labels)])


def _kept(values: np.ndarray, cycles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples that are not named outliers, with their cycles (stalls are separate events)."""
    values, cycles = np.asarray(values, float), np.asarray(cycles)
    keep = ~outlier_mask(values)
    return values[keep], cycles[keep]
