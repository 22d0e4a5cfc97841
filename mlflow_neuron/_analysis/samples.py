"""One run's per-step samples as matrices (pure): a row per profiler step, a column per op.

A run's samples are all its active steps, over all its cycles, in (cycle, step) order;
`skip_steps=K` leaves out the first K (warm-up that the schedule did not already skip). An op
missing from a step took 0 in that step. A RunProfile without samples (runs logged before
per-step samples, API users who build one from an op table) gives one sample: its cycle's sums
divided by the cycle's active steps, so every number is "per step".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .model import MEMORY_METRIC, SAMPLES_FROM_METRICS, RunProfile

WRAPPER_PREFIXES = ("ProfilerStep", "Torch-Compiled Region", "## ")


@dataclass(frozen=True)
class StepSamples:
    """Per-step values of one metric for one run.

    `ops` and `calls` have one row per entry of `op_steps`; `total` and `aten_calls` one per entry
    of `steps`. The two differ only for runs whose per-op samples are cycle averages (samples
    from metrics: per-step totals, one per-op sample per cycle).
    """

    steps: list[tuple[int, int]]  # (cycle, ProfilerStep number) of each total
    ops: pd.DataFrame  # columns: op names; values: the metric in that step
    calls: pd.DataFrame  # columns: op names; values: calls in that step
    total: np.ndarray
    aten_calls: np.ndarray | None
    source: str | None
    op_steps: list[tuple[int, int]] | None = None  # None: the same as `steps`

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def op_keys(self) -> list[tuple[int, int]]:
        return self.steps if self.op_steps is None else self.op_steps


def step_samples(profile: RunProfile, metric: str, skip_steps: int = 0) -> StepSamples:
    if metric == MEMORY_METRIC and not _has_memory(profile):
        raise ValueError(f"run {profile.label} has no memory samples: profile it with profile_memory=True "
                         "(runs logged before peak memory per step have none)")  # fmt: skip
    if profile.samples is None:
        return _single_sample(profile, metric)
    table = profile.samples
    totals = profile.step_totals
    keyed = totals if totals is not None and len(totals) else table
    keys = _keys(keyed)
    if skip_steps >= len(keys):
        raise ValueError(
            f"skip_steps={skip_steps} leaves no samples of run {profile.label} (it has {len(keys)} steps)"
        )
    keys = keys[skip_steps:]
    op_keys = keys
    if profile.source == SAMPLES_FROM_METRICS:  # one per-op sample per cycle, with any kept step
        kept_cycles = {cycle for cycle, _ in keys}
        op_keys = [key for key in _keys(table) if key[0] in kept_cycles]
    index = pd.MultiIndex.from_tuples(op_keys, names=["cycle", "step"])

    columns = [metric, "calls"] if metric in table else ["calls"]  # memory: per step, not per op
    sums = table.groupby(["cycle", "step", "name"])[columns].sum()  # what pivot_table(aggfunc="sum") gives, faster
    sums.index = sums.index.set_levels([level.astype(int) for level in sums.index.levels[:2]], level=[0, 1])

    def per_step(column: str) -> pd.DataFrame:
        return sums[column].unstack("name").reindex(index).fillna(0.0)

    ops = per_step(metric) if metric in table else pd.DataFrame(index=index)
    calls = per_step("calls").reindex(columns=ops.columns, fill_value=0.0)
    total = ops.sum(axis=1).to_numpy(float)
    aten = None
    if totals is not None and len(totals):
        by_step = totals.assign(cycle=totals["cycle"].astype(int), step=totals["step"].astype(int))
        by_step = by_step.groupby(["cycle", "step"]).last().reindex(pd.MultiIndex.from_tuples(keys))
        if metric in by_step and by_step[metric].notna().all():
            total = by_step[metric].to_numpy(float)
        if "aten_calls" in by_step and by_step["aten_calls"].notna().all():
            aten = by_step["aten_calls"].to_numpy(float)
    return StepSamples(keys, ops, calls, total, aten, profile.source, None if op_keys is keys else op_keys)


def _has_memory(profile: RunProfile) -> bool:
    totals = profile.step_totals
    return totals is not None and MEMORY_METRIC in totals and bool(totals[MEMORY_METRIC].notna().any())


def _keys(table: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted({(int(c), int(s)) for c, s in zip(table["cycle"], table["step"])})


def is_wrapper(name: str, annotation: bool | None = None) -> bool:
    """A range that wraps real ops (a profiler step, a compiled region, a user annotation): never
    the answer to "which op took the time". ops.json's `annotation` flag, where it has one, adds
    to the name patterns; it does not replace them (torch.compile's `## Call CompiledFxGraph ##`
    ranges come through unflagged)."""
    flagged = annotation is not None and not pd.isna(annotation) and bool(annotation)
    return flagged or str(name).startswith(WRAPPER_PREFIXES)


def wrapper_names(ops: pd.DataFrame) -> set[str]:
    """The names in an ops.json table that are wrapper ranges (see `is_wrapper`)."""
    flags = ops["annotation"] if "annotation" in ops else [None] * len(ops)
    return {name for name, flag in zip(ops["name"], flags) if is_wrapper(name, flag)}


def _single_sample(profile: RunProfile, metric: str) -> StepSamples:
    ops = profile.ops[profile.ops["kind"] == "op"] if "kind" in profile.ops else profile.ops
    per_step = float(profile.totals.get("active_steps") or 1)
    sums = ops.groupby("name")[[metric, "calls"]].sum().astype(float) / per_step
    total = float(profile.totals.get(metric, np.nan)) / per_step
    aten = profile.totals.get("aten_calls")
    return StepSamples(
        [(int(profile.step), int(profile.step))],
        pd.DataFrame(sums[metric].to_numpy()[None, :], columns=sums.index),
        pd.DataFrame(sums["calls"].to_numpy()[None, :], columns=sums.index),
        np.array([total if not np.isnan(total) else sums[metric].sum()]),
        None if aten is None else np.array([float(aten) / per_step]),
        profile.source,
    )
