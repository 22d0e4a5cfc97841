"""Comparing profiled runs (pure: DataFrames in, DataFrames out).

One row per op (original names) and a TOTAL row; one column group per run: time, calls, share of
the run's total, delta and speedup against the baseline. Device time is compared when every run
has some; otherwise all runs are compared on self CPU time and the frame says so in `attrs`:
device and CPU microseconds are never mixed in one table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

DEVICE_METRIC, CPU_METRIC = "self_device_time_us", "self_cpu_time_us"
METRICS = (DEVICE_METRIC, CPU_METRIC)
FIELDS = ("time_us", "calls", "share", "delta_us", "speedup")
TOTAL = "TOTAL"


@dataclass(frozen=True)
class RunProfile:
    """What a comparison needs from one run: its last cycle's op table and totals, and the
    per-step samples of every cycle.

    `samples`: one row per (profiler step, host op): columns `cycle` (the cycle's logged step),
    `step` (the ProfilerStep number), `name`, `self_device_time_us`, `self_cpu_time_us`, `calls`.
    `step_totals`: one row per profiler step: `cycle`, `step`, `self_device_time_us`,
    `self_cpu_time_us`, `aten_calls`. `source` says where they came from: SAMPLES_FROM_STEPS (the
    cycles' steps.json), SAMPLES_FROM_METRICS (step totals from `profiler/step/...` metrics; per-op
    samples are cycle sums / active steps), SAMPLES_FROM_CYCLES (runs logged before per-step
    samples: one sample per cycle, its sums / active steps). None: derived from `ops`/`totals`.
    """

    label: str
    run_id: str
    step: int
    ops: pd.DataFrame  # the rows of ops.json (columns name, kind, calls, self_*_time_us, ...)
    totals: dict[str, float]  # self_device_time_us, self_cpu_time_us, aten_calls, ...
    device: str = ""
    device_time: str = ""  # the run's mlflow_neuron.device_time tag
    extra: dict = field(default_factory=dict)
    samples: pd.DataFrame | None = None
    step_totals: pd.DataFrame | None = None
    source: str | None = None


SAMPLES_FROM_STEPS, SAMPLES_FROM_METRICS, SAMPLES_FROM_CYCLES = "steps", "metrics", "cycles"
SAMPLE_COLUMNS = ("cycle", "step", "name", "self_device_time_us", "self_cpu_time_us", "calls")
STEP_TOTAL_COLUMNS = ("cycle", "step", "self_device_time_us", "self_cpu_time_us", "aten_calls")


@dataclass(frozen=True)
class Regression:
    run: str
    op: str
    baseline_us: float
    run_us: float

    @property
    def percent(self) -> float:
        return (self.run_us / self.baseline_us - 1) * 100


def compare(profiles: list[RunProfile], baseline: str | None = None, metric: str = DEVICE_METRIC) -> pd.DataFrame:
    """The comparison frame; `baseline` is a label or run id (default: the first run)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    if not profiles:
        raise ValueError("nothing to compare: no runs")
    base = _find(profiles, baseline) if baseline else profiles[0]
    without_device = [p.label for p in profiles if p.device_time != "present"]
    used = CPU_METRIC if metric == DEVICE_METRIC and without_device else metric

    times = pd.DataFrame({p.label: _op_series(p.ops, used) for p in profiles})
    calls = pd.DataFrame({p.label: _op_series(p.ops, "calls") for p in profiles})
    totals = pd.Series({p.label: float(p.totals.get(used, np.nan)) for p in profiles})
    # Costliest first in any run, so an op that only one variant has (a compiled graph) shows too.
    order = times.max(axis=1).sort_values(ascending=False, kind="stable").index
    times, calls = times.loc[order], calls.loc[order]
    times.loc[TOTAL], calls.loc[TOTAL] = totals, np.nan

    columns = {}
    for p in profiles:
        run_times, base_times = times[p.label], times[base.label]
        columns[(p.label, "time_us")] = run_times
        columns[(p.label, "calls")] = calls[p.label]
        columns[(p.label, "share")] = run_times / totals[p.label] if totals[p.label] else np.nan
        columns[(p.label, "delta_us")] = run_times - base_times
        with np.errstate(divide="ignore", invalid="ignore"):
            columns[(p.label, "speedup")] = base_times / run_times.replace(0, np.nan)
    frame = pd.DataFrame(columns)
    frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["run", "field"])
    frame.index.name = "op"
    frame.attrs.update(
        metric=used,
        requested_metric=metric,
        fallback=(
            f"compared on self CPU time: no device time in {', '.join(without_device)}" if used != metric else None
        ),
        baseline=base.label,
        runs={p.label: p.run_id for p in profiles},
        steps={p.label: p.step for p in profiles},
        devices={p.label: p.device for p in profiles},
        aten_calls={p.label: p.totals.get("aten_calls") for p in profiles},
    )
    return frame


def regressions(frame: pd.DataFrame, percent: float, min_us: float = 0.0) -> list[Regression]:
    """Ops (and the TOTAL) slower than the baseline by more than `percent`, in every other run.

    Ops under `min_us` in both runs are left out: a few microseconds of host time swing by more
    than any sensible percentage from run to run. The TOTAL is always checked.
    """
    base = frame.attrs["baseline"]
    found = []
    for run in frame.columns.get_level_values("run").unique():
        if run == base:
            continue
        for op, base_us, run_us in zip(frame.index, frame[(base, "time_us")], frame[(run, "time_us")]):
            if op != TOTAL and max(base_us, run_us) < min_us:
                continue
            if base_us > 0 and run_us > base_us * (1 + percent / 100):
                found.append(Regression(run, op, float(base_us), float(run_us)))
    return found


def summary(frame: pd.DataFrame, top: int | None = None) -> pd.DataFrame:
    """Times side by side (one column per run) with TOTAL, ATen calls and speedup rows."""
    times = frame.xs("time_us", axis=1, level="field")
    ops = times.drop(index=TOTAL)
    if top is not None:
        ops = ops.iloc[:top]
    base = frame.attrs["baseline"]
    rows = {
        f"{TOTAL} {frame.attrs['metric']}": times.loc[TOTAL],
        "ATen calls": pd.Series(frame.attrs["aten_calls"]),
        f"speedup vs {base}": frame.xs("speedup", axis=1, level="field").loc[TOTAL],
    }
    return pd.concat([ops, pd.DataFrame(rows).T[times.columns]])


def flat(frame: pd.DataFrame) -> pd.DataFrame:
    """One level of columns (`<run>/<field>`) and the op as a column: for tables, CSV and JSON."""
    out = frame.copy()
    out.columns = [f"{run}/{field}" for run, field in frame.columns]
    return out.reset_index()


def _op_series(ops: pd.DataFrame, column: str) -> pd.Series:
    host = ops[ops["kind"] == "op"] if "kind" in ops else ops
    return host.groupby("name")[column].sum().astype(float)


def _find(profiles: list[RunProfile], key: str) -> RunProfile:
    for p in profiles:
        if key in (p.label, p.run_id):
            return p
    raise ValueError(f"baseline {key!r} is not among the compared runs ({', '.join(p.label for p in profiles)})")
