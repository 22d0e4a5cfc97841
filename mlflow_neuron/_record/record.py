"""A cycle's numbers as what MLflow stores: metric keys and values, tables, per-step series.

Pure functions of a `CycleProfile` and the run's `OpKeys`; `prepare` calls them and writes the
results. Times are microseconds rounded to the nanosecond, the profiler's resolution: the sums
carry no float noise into the store (452.369, not 452.36899999999986).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .._neuron.summary import FLAT, on_percent_scale
from .._trace.profile import KERNEL, NOT_PROFILED, OP, PRESENT, CycleProfile
from .keys import PREFIX, OpKeys, metric_key, readable_key, total_key
from .model import (
    HOST_COLUMN_PREFIX,
    HOST_METRIC_PREFIX,
    HOST_VALUES,
    NEURON_UTILIZATION,
    PEAK_MEMORY,
    PER_OP_METRICS,
    REGION,
    REGION_METRICS,
    REGION_OPS_TABLE,
    STEP_METRICS,
    STEP_TOTALS_TABLE,
    STEPS_TABLE,
)
from .._trace.roofline import with_roofline

TIME_DECIMALS = 3  # microseconds to the nanosecond


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """The layout `MlflowClient.log_table` writes, so the UI shows the file as a table."""
    frame.to_json(path, orient="split", index=False, date_format="iso")


def cycle_metrics(profile: CycleProfile, keys: OpKeys, top_k: int, rank_prefix: str = "") -> dict[str, float]:
    """Per-op metrics for the `top_k` costliest host ops, the cycle's totals, and the inclusive
    times of the `top_k` costliest regions."""
    # Every host op is keyed, not just the top ones, so which name wins a clash never depends on k.
    op_keys = keys.keys([op.name for op in profile.ops if op.kind == OP])
    top = profile.top_ops(top_k)
    # Without device activity there is no per-op device time to chart, only zeros (the total stays).
    kinds = PER_OP_METRICS if profile.device_time != NOT_PROFILED else PER_OP_METRICS[1:]
    metrics = {}
    for op in top:
        for kind in kinds:
            metrics[metric_key(kind, op_keys[op.name], rank_prefix)] = _us(getattr(op, kind))
    totals = {
        "self_device_time_us": profile.total_self_device_time_us,
        "self_cpu_time_us": profile.total_self_cpu_time_us,
        "unattributed_device_time_us": max(
            profile.total_self_device_time_us - profile.attributed_device_time_us, 0.0
        ),
        "aten_calls": profile.aten_calls,
        "active_steps": profile.active_steps,
    }
    metrics.update({total_key(kind, rank_prefix): _us(v) for kind, v in totals.items()})
    # The top_k costliest regions, as for ops: a range per layer (or per op name) must not flood the run.
    if not profile.regions:
        return metrics
    regions = region_sums(profile)
    rank_by = "device_time_us" if profile.device_time == PRESENT else "cpu_time_us"
    regions = regions.sort_values([rank_by, "cpu_time_us"], ascending=False, kind="stable").head(max(top_k, 0))
    region_keys = keys.keys(list(regions.index))
    for kind, column in zip(REGION_METRICS, ("device_time_us", "cpu_time_us")):
        if kind != REGION_METRICS[0] or profile.device_time != NOT_PROFILED:
            metrics.update({metric_key(kind, region_keys[name], rank_prefix): _us(v)
                            for name, v in regions[column].items()})  # fmt: skip
    return metrics


def region_sums(profile: CycleProfile) -> pd.DataFrame:
    """Each region's calls, inclusive times and launches over the cycle's steps, by name."""
    frame = profile.regions_frame()
    columns = ["calls", "device_time_us", "cpu_time_us", "launches"] + (["allocated_bytes"] if profile.allocated is not None else [])
    return frame.groupby("name", sort=True)[columns].sum()


def split_non_finite(metrics: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Finite metrics, and the keys left out: MLflow stores NaN but turns inf into 1.8e308."""
    finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
    return finite, sorted(set(metrics) - set(finite))


def ops_table(profile: CycleProfile, keys: OpKeys, peak: dict | None = None) -> pd.DataFrame:
    """Every op of the cycle with the metric key it has (or would have) under `profiler/...`.

    `annotation` marks ranges (`record_function`, `ProfilerStep*`) rather than ops; rows of kind
    `region` give each range's inclusive time (`device_time_us`, `cpu_time_us`), its `launches`
    and calls, over the cycle (see `_trace.regions`). Without device
    time, the CPU columns come first: the UI shows a table's first columns without scrolling."""
    frame = profile.to_frame()
    host_ops = [op.name for op in profile.ops if op.kind == OP]
    key_of = keys.keys(host_ops)
    frame.insert(2, "metric_key", [key_of.get(n, "") if k == OP else "" for n, k in zip(frame.name, frame.kind)])
    total = profile.total_self_device_time_us
    frame["share_of_device_time"] = frame.self_device_time_us / total if total else 0.0
    # Kernel rows repeat time their op rows already carry; the share column is only for op rows.
    frame.loc[frame.kind == KERNEL, "share_of_device_time"] = 0.0
    frame["annotation"] = [k == OP and n in profile.annotations for n, k in zip(frame.name, frame.kind)]
    if profile.allocated is not None:  # profile_memory=True: what each op allocated itself
        allocated = dict(profile.allocated)
        frame["allocated_bytes"] = [allocated.get(n, 0) if k == OP else 0 for n, k in zip(frame.name, frame.kind)]
    if profile.regions:  # inclusive times only: a region's self time is its op row's
        regions = region_sums(profile).reset_index()
        regions.insert(1, "metric_key", [key_of.get(n, "") for n in regions.name])
        frame = pd.concat([frame, regions.assign(kind=REGION, annotation=False)], ignore_index=True)
    if profile.device_time != PRESENT:
        cpu, device = ["self_cpu_time_us", "cpu_time_us"], ["self_device_time_us", "device_time_us"]
        first = ["name", "metric_key", "kind", "calls"]
        frame = frame[first + cpu + device + [c for c in frame.columns if c not in first + cpu + device]]
    return with_roofline(frame, profile, peak, REGION)  # record_shapes=True: bytes, FLOPs, % of peak


def step_tables(profile: CycleProfile, host: dict[str, float] | None = None) -> dict[str, pd.DataFrame]:
    """The cycle's per-step samples: every op and kernel per step, and each step's totals.

    With the host's numbers of the cycle's window (`CycleJob.host`), every row of the totals also
    carries them as `host_<name>` columns, NaN where one is unknown (the Neuron utilisation only
    where it was measured), so a step's time can be read beside the machine's load."""
    totals = pd.DataFrame(
        [(t.step, t.self_device_time_us, t.self_cpu_time_us, t.aten_calls) for t in profile.step_totals],
        columns=["step", "self_device_time_us", "self_cpu_time_us", "aten_calls"],
    )
    for device in sorted({m.device for m in profile.step_memory}):
        peaks = {m.step: m.peak_bytes for m in profile.step_memory if m.device == device}
        totals[f"{PEAK_MEMORY}_{device}"] = [peaks.get(t.step, math.nan) for t in profile.step_totals]
    if host:
        names = [*HOST_VALUES, *([NEURON_UTILIZATION] if NEURON_UTILIZATION in host else [])]
        for name in names:
            totals[HOST_COLUMN_PREFIX + name] = float(host.get(name, math.nan))
    steps = profile.steps_frame()
    if not profile.regions:
        return {STEPS_TABLE: steps, STEP_TOTALS_TABLE: totals}
    regions = profile.regions_frame().assign(kind=REGION)  # inclusive times: their own columns
    return {STEPS_TABLE: pd.concat([steps, regions], ignore_index=True), STEP_TOTALS_TABLE: totals,
            REGION_OPS_TABLE: profile.region_ops_frame()}  # fmt: skip


def host_metrics(host: dict[str, float]) -> dict[str, float]:
    """`system/profile/<name>`: the host during the cycle's window, logged at the cycle's step."""
    return {HOST_METRIC_PREFIX + name: float(value) for name, value in host.items() if math.isfinite(value)}


def step_series(profile: CycleProfile, rank_prefix: str = "") -> tuple[tuple[str, float, int], ...]:
    """`profiler/step/<metric>`: each active step's total at that step's own number, so MLflow
    draws one point per step (noise and outliers show) next to the per-cycle sums. A step with a
    NaN or infinite time has no point (the cycle's total is left out too, with a warning)."""
    kinds = STEP_METRICS if profile.device_time != NOT_PROFILED else STEP_METRICS[1:]
    times = tuple(
        (f"{PREFIX}/{rank_prefix}step/{kind}", _us(getattr(total, kind)), total.step)
        for total in profile.step_totals
        for kind in kinds
        if math.isfinite(getattr(total, kind))
    )
    memory = tuple((f"{PREFIX}/{rank_prefix}step/{PEAK_MEMORY}/{m.device}", float(m.peak_bytes), m.step)
                   for m in profile.step_memory)  # fmt: skip
    return times + memory


def summary_metrics(models: dict[str, dict[str, float]], prefix: str) -> dict[str, float]:
    """Metric keys: `<prefix>/<model>/<field>` per model, plus `<prefix>/<field>` when there is
    only one model (the keys of a single-model session stay what they always were)."""
    metrics: dict[str, float] = {}
    named = {model: on_percent_scale(fields) for model, fields in models.items()}
    for model, fields in named.items():
        if model != FLAT:
            metrics.update({f"{prefix}/{readable_key(model)}/{readable_key(k)}": v for k, v in fields.items()})
    if len(named) == 1:
        metrics.update({f"{prefix}/{readable_key(k)}": v for k, v in next(iter(named.values())).items()})
    return metrics


def _us(value: float) -> float:
    """Microseconds to the nanosecond (calls and counts are whole numbers: unchanged)."""
    return round(float(value), TIME_DECIMALS)
