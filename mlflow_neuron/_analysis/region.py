"""One `record_function` region of each run, compared as a whole step is (pure).

Example::

    frame = compare([in_region(p, "rmsnorm") for p in profiles], baseline="naive")

`in_region` turns a run's profile into the profile of one region: each step's total becomes the
region's inclusive time in that step (device time, and CPU time: the range's wall time), and the
ops become the ops that ran inside it. Statistics, verdicts, outliers and the gate then read the
region exactly as they read the TOTAL. A step in which the region did not run counts 0.

`inside_change` words what the region runs differently, for the sentence: "aten::pow,
aten::mean (6 launches) replaced by aten::rms_norm (1 launch)".
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .model import (
    CPU_METRIC,
    DEVICE_METRIC,
    GONE,
    MEMORY_METRIC,
    NEW,
    SAMPLE_COLUMNS,
    SAMPLES_FROM_STEPS,
    STEP_TOTAL_COLUMNS,
    RunProfile,
)

REGION_COLUMNS = ("cycle", "step", "name", "calls", "device_time_us", "cpu_time_us", "launches")
REGION_OP_COLUMNS = ("cycle", "step", "region", "name", "kind", "calls", DEVICE_METRIC, CPU_METRIC)
SHOWN_OPS = 6  # ops named on each side of a change


class RegionNotFound(ValueError):
    """A run has no region of that name (it never ran, or the run was logged before regions)."""


def region_names(profiles: list[RunProfile]) -> list[str]:
    """The regions every one of `profiles` has, in the order of the first run's costliest first."""
    if not profiles or any(p.regions is None or not len(p.regions) for p in profiles):
        return []
    shared = set.intersection(*(set(p.regions["name"]) for p in profiles))
    first = profiles[0].regions
    ranked = first[first["name"].isin(shared)].groupby("name")["cpu_time_us"].sum().sort_values(ascending=False)
    return list(ranked.index)


def in_region(profile: RunProfile, name: str) -> RunProfile:
    """The profile of region `name` of this run (see the module docstring); RegionNotFound if it has none."""
    regions = profile.regions if profile.regions is not None else pd.DataFrame(columns=REGION_COLUMNS)
    if name not in set(regions["name"]):
        known = sorted(set(regions["name"]))
        why = f"its regions: {', '.join(known)}" if known else (
            "it has no regions (no record_function ranges besides ProfilerStep, or logged before regions)")
        raise RegionNotFound(f"run {profile.label} has no region {name!r}; {why}")
    steps = _step_keys(profile)
    mine = regions[regions["name"] == name].groupby(["cycle", "step"])[
        ["device_time_us", "cpu_time_us", "launches", "calls"]].sum().reindex(steps, fill_value=0.0)  # fmt: skip
    step_totals = pd.DataFrame({
        "cycle": [c for c, _ in steps], "step": [s for _, s in steps],
        DEVICE_METRIC: mine["device_time_us"].to_numpy(float), CPU_METRIC: mine["cpu_time_us"].to_numpy(float),
        "aten_calls": np.nan,  # launches are not ATen calls: see extra["launches"]
        MEMORY_METRIC: np.nan,  # a region's memory is its allocated bytes (ops.json), not a peak
    })[list(STEP_TOTAL_COLUMNS)]  # fmt: skip
    inside = _inside(profile, name)
    # ops and the kernels they launched: a kernel's row is its device time, its op's row the same time again
    samples = inside[list(SAMPLE_COLUMNS)].reset_index(drop=True)
    last = inside[inside["cycle"] == profile.step]
    ops = last.groupby(["name", "kind"], as_index=False)[["calls", DEVICE_METRIC, CPU_METRIC]].sum()
    active = max(len([s for s in steps if s[0] == profile.step]), 1)
    totals = {DEVICE_METRIC: float(mine.loc[[k for k in steps if k[0] == profile.step], "device_time_us"].sum()),
              CPU_METRIC: float(mine.loc[[k for k in steps if k[0] == profile.step], "cpu_time_us"].sum()),
              "active_steps": active}  # fmt: skip
    extra = {**profile.extra, "region": name, "launches": float(np.median(mine["launches"])) if len(mine) else 0.0,
             "kernels": sorted(set(inside.loc[inside["kind"] == "kernel", "name"]))}  # fmt: skip
    return replace(profile, ops=ops, totals=totals, samples=samples, step_totals=step_totals,
                   source=SAMPLES_FROM_STEPS, extra=extra)  # fmt: skip


def inside_change(frame: pd.DataFrame, run: str, launches: dict[str, float], shorten=str) -> str:
    """What the region of `run` runs instead of the baseline's: the ops (not kernels) one has and the
    other has not, costliest first, with launches per step where there are any. "" when both run the same ops."""
    base = frame.attrs["baseline"]
    verdicts = frame[(run, "verdict")]
    kernels = set(frame.attrs.get("kernels", ()))
    gone = [op for op, v in verdicts.items() if v == GONE and op not in kernels]
    new = [op for op, v in verdicts.items() if v == NEW and op not in kernels]
    if not gone and not new:
        return ""
    counted = any(launches.get(label) for label in (run, base))

    def side(ops: list[str], label: str) -> str:
        shown = ", ".join(map(shorten, ops[:SHOWN_OPS])) + (f" and {len(ops) - SHOWN_OPS} more" if len(ops) > SHOWN_OPS else "")
        count = launches.get(label, 0.0)
        return (shown or "nothing") + (f" ({count:g} launch{'' if count == 1 else 'es'})" if counted else "")

    return f"{side(gone, base)} replaced by {side(new, run)}"


def _step_keys(profile: RunProfile) -> list[tuple[int, int]]:
    table = profile.step_totals if profile.step_totals is not None and len(profile.step_totals) else profile.samples
    return sorted({(int(c), int(s)) for c, s in zip(table["cycle"], table["step"])})


def _inside(profile: RunProfile, name: str) -> pd.DataFrame:
    table = profile.region_ops if profile.region_ops is not None else pd.DataFrame(columns=REGION_OP_COLUMNS)
    inside = table[table["region"] == name]
    return inside.assign(cycle=inside["cycle"].astype(int), step=inside["step"].astype(int))
