"""One clock for every rank, from the collectives themselves, or none (pure).

A synchronizing collective (all_reduce, all_gather, reduce_scatter, barrier) cannot end on any
member before the last member has started, and it ends on every member at nearly the same moment.
So:
- where no such instance ends on one rank before another member started (by more than
  `TOLERANCE_US`) and every rank is on one host, the ranks' own clocks are used as they are;
- else each rank's offset is estimated from the instances' ends (end = the instance's moment +
  the rank's offset, least squares by alternating means), a rank's offset taken as its host's where it
  agrees with the host's (ranks on one host share a clock), and the result is checked against the
  same rule: if it holds, the aligned clock is used;
- else no clock is used (`clock-free`): the wait is the time in the collective beyond the
  shortest member's.
`Clock.words` says which, and how well the ends agreed after alignment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

SYNCHRONIZING = re.compile(r"all_?reduce|all_?gather|reduce_?scatter|barrier", re.IGNORECASE)
TOLERANCE_US = 5.0
ITERATIONS = 200
CONVERGED_US = 0.5


@dataclass
class Clock:
    method: str  # "one clock" | "aligned" | "clock-free"
    offsets: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))  # rank -> µs to subtract
    residual_us: float | None = None  # median |end - the instance's moment - offset| after alignment
    violations: int = 0  # synchronizing instances that end on a member before another started (as used)
    checked: int = 0  # synchronizing instances checked

    @property
    def words(self) -> str:
        if self.method == "one clock":
            return f"one clock (the ranks' own; {self.checked} synchronizing collectives checked)"
        if self.method == "aligned":
            largest = self.offsets.abs().max() if len(self.offsets) else 0.0
            return (f"clocks aligned from {self.checked} synchronizing collectives (largest correction "
                    f"{largest / 1000:.3g} ms, ends agree within {self.residual_us:.0f} µs, median)")  # fmt: skip
        return ("no common clock: the wait is each rank's time in a collective beyond the shortest member's "
                f"({self.violations} of {self.checked} synchronizing collectives could not be aligned)")


def align(kept: pd.DataFrame) -> Clock:
    """The clock for the matched instances in `kept` (matching's frame: rank, host, instance,
    name, start_us, end_us)."""
    if kept.empty:
        return Clock("one clock")
    sync = kept[kept["name"].str.contains(SYNCHRONIZING)]
    ranks = np.sort(kept["rank"].unique())
    zero = pd.Series(0.0, index=ranks)
    raw = _violations(sync, zero)
    one_host = kept["host"].nunique(dropna=False) <= 1
    if raw == 0 and one_host:
        return Clock("one clock", zero, None, 0, sync["instance"].nunique())
    if sync.empty:
        return Clock("clock-free", zero, None, raw, 0)
    offsets, residual = _estimate(sync)
    hosts = kept.groupby("rank")["host"].first().reindex(ranks)
    offsets = _by_host(offsets.reindex(ranks), hosts, residual)
    if offsets.isna().any():
        return Clock("clock-free", zero, residual, raw, sync["instance"].nunique())
    left = _violations(sync, offsets)
    checked = sync["instance"].nunique()
    if left > max(0, 0.01 * checked):
        return Clock("clock-free", zero, residual, left, checked)
    return Clock("aligned", offsets, residual, left, checked)


def _estimate(sync: pd.DataFrame) -> tuple[pd.Series, float]:
    """Each rank's offset (median 0) and the median residual, from the ends of synchronizing
    instances: least squares of end = the instance's moment + the rank's offset, by alternating
    means (a rank's instances are mostly with ranks of its own host; a median would stay there)."""
    end = sync["end_us"].to_numpy(float)
    instance = np.unique(sync["instance"].to_numpy(), return_inverse=True)[1]
    ranks, rank = np.unique(sync["rank"].to_numpy(), return_inverse=True)
    per_instance = np.bincount(instance)
    per_rank = np.bincount(rank)
    offsets = np.zeros(len(ranks))
    for _ in range(ITERATIONS):
        moment = np.bincount(instance, end - offsets[rank]) / per_instance
        updated = np.bincount(rank, end - moment[instance], minlength=len(ranks)) / per_rank
        updated -= np.median(updated)
        done = np.max(np.abs(updated - offsets)) < CONVERGED_US
        offsets = updated
        if done:
            break
    moment = np.bincount(instance, end - offsets[rank]) / per_instance
    residual = float(np.median(np.abs(end - moment[instance] - offsets[rank])))
    return pd.Series(offsets, index=ranks), residual


def _by_host(offsets: pd.Series, hosts: pd.Series, residual: float) -> pd.Series:
    """A rank's offset is its host's (the median of the host's ranks) where it lies within a few
    residuals of it; a rank without an estimate takes its host's."""
    host_offset = offsets.groupby(hosts.fillna("")).transform("median")
    near = (offsets - host_offset).abs() <= max(4 * residual, 2 * TOLERANCE_US)
    snapped = offsets.where(~(near | offsets.isna()), host_offset)
    return snapped - snapped.median()


def _violations(sync: pd.DataFrame, offsets: pd.Series) -> int:
    """Synchronizing instances that end on a member before another member started (on these clocks)."""
    if sync.empty:
        return 0
    o = offsets.reindex(sync["rank"]).to_numpy()
    frame = pd.DataFrame({"instance": sync["instance"].to_numpy(), "start": sync["start_us"].to_numpy() - o,
                          "end": sync["end_us"].to_numpy() - o})  # fmt: skip
    spans = frame.groupby("instance").agg(last_start=("start", "max"), first_end=("end", "min"))
    return int((spans["first_end"] < spans["last_start"] - TOLERANCE_US).sum())
