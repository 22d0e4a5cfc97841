"""Comparing profiled runs (pure: DataFrames in, DataFrames out).

One row per op (original names) and a TOTAL row; one column group per run. Every number is per
profiler step, over all of a run's active steps (see `samples`):

- `time_us`: the median per step; `calls`: median calls per step; `share`: of the run's median
  total; `delta_us`: median minus the baseline's median; `speedup`: baseline median / median;
- `n`: samples (steps) of the run; `outliers`: how many of this op's samples are outliers;
- `ratio`, `ratio_low`, `ratio_high`: run / baseline with its 95% interval (NaN where no interval
  exists), from the samples that are not outliers: Hodges–Lehmann with Moses' interval over steps
  (`stats`), or Welch's over cycles where they differ, and for host time from 3 cycles a run
  (`cycles`); `unit` says which;
- `verdict`: `faster`, `slower`, `no change` (the interval contains 1.0, or the change is under
  `noise_pct`), `too few samples` (no 95% interval), `too few cycles` (the cycles differ and a
  run has fewer than `cycles.MIN_CYCLES`), `inconclusive` (host time of runs that saw different
  host load, or a busy host, see `weather`), `new` / `gone` (the op is in one run only), `baseline`.

`frame.attrs` (JSON-serializable) adds: the metric and any fallback, the baseline, runs, n, samples
sources, ATen calls per step, `host` (each run's host while profiled) and `inconclusive` (the
reason, per run whose verdicts it made inconclusive), `not_gated` (per run whose host-time
intervals do not cover the variation between windows: why, `cycles.window_rule`; the gate never
fails on them), `gate_intervals` (host time: per run, the intervals the gate acts on, their level
and the cycles a run `needs`, `cycles.family_intervals`), `cycle_noise` (the TOTAL's between-cycle
test per run), `outliers` (each one named: run, op, cycle, step, value, times the median),
`sentences` (the verdict in words, per run), `verdicts` (the TOTAL's), and `samples` (of the TOTAL
and the top ops, for plots) with their (cycle, step) in `sample_steps` (the TOTAL's) and
`op_sample_steps` (the ops'; they differ only where per-op samples are cycle averages), and, only where
a run has them, `capture_reasons` ({run: {cycle: why it was captured}}, `callback.schedule()`'s tags).

Device time is compared when every run has some; otherwise all runs are compared on self CPU time
and the frame says so in `attrs`: device and CPU microseconds are never mixed in one table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import cycles as _cycles
from . import stats as _stats
from . import weather as _weather
from .explorer import neuron_explanations
from .model import (
    ABSENT,
    BASELINE,
    CPU_METRIC,
    DEFAULT_NOISE_PCT,
    DEVICE_METRIC,
    FASTER,
    FIELDS,
    GONE,
    INCONCLUSIVE,
    MEMORY_METRIC,
    METRICS,
    NEW,
    NO_CHANGE,
    SLOWER,
    TOO_FEW,
    TOO_FEW_CYCLES,
    TOTAL,
    RunProfile,
)
from .region import in_region, region_names
from .samples import StepSamples, step_samples, wrapper_names
from .throughput import bytes_coverage, throughput, throughput_missing
from .verdict import sentence

PLOTTED_OPS = 12  # ops whose samples travel in attrs for the charts (plus the TOTAL)
METHOD = ("Hodges-Lehmann ratio of per-step samples with Moses' distribution-free 95% interval; Welch's interval on "
          f"per-cycle medians where the cycles differ (nested F test, p < {_cycles.CYCLE_ALPHA:g}) and for host time, "
          f"from {_cycles.MIN_CYCLES} cycles per run")  # fmt: skip
SHOWN_REGIONS = 8  # regions whose sentence a whole-step comparison carries


def compare(
    profiles: list[RunProfile],
    baseline: str | None = None,
    metric: str = DEVICE_METRIC,
    *,
    skip_steps: int = 0,
    noise_pct: float = DEFAULT_NOISE_PCT,
    host_load_threshold: float = _weather.HOST_LOAD_THRESHOLD_CORES,
    region: str | None = None,
    host_busy_share: float = _weather.HOST_BUSY_SHARE,
) -> pd.DataFrame:
    """The comparison frame; `baseline` is a label or run id (default: the first run).

    Example::

        frame = compare([naive, fused], baseline="naive")
        frame.loc["TOTAL", ("fused", "verdict")], frame.attrs["sentences"]["fused"]

    With `region`, the TOTAL row is that `record_function` region's inclusive time per step, the
    op rows the ops inside it (`region.in_region`); else `attrs["regions"]` has each region's sentences."""
    _check(profiles, metric, skip_steps, noise_pct, (host_load_threshold, host_busy_share), region)
    whole, profiles = profiles, profiles if region is None else [in_region(p, region) for p in profiles]
    base = _find(profiles, baseline) if baseline else profiles[0]
    without_device = [p.label for p in profiles if p.device_time != "present"]
    used = CPU_METRIC if metric == DEVICE_METRIC and without_device else metric
    samples = {p.label: step_samples(p, used, skip_steps) for p in profiles}
    medians = pd.DataFrame({label: s.ops.median() for label, s in samples.items()})
    # Costliest first in any run, so an op that only one variant has (a compiled graph) shows too.
    order = list(medians.max(axis=1).sort_values(ascending=False, kind="stable").index)
    frame, noise, family = _table(samples, base.label, order, noise_pct, host_time=used == CPU_METRIC)
    hosts, weather = {p.label: dict(p.host) for p in profiles}, (host_load_threshold, host_busy_share)
    frame.attrs.update(
        **_evidence(frame, samples, profiles, base.label, used == CPU_METRIC, weather, family),
        metric=used,
        requested_metric=metric,
        fallback=f"compared on self CPU time: no device time in {', '.join(without_device)}" if used != metric else None,
        baseline=base.label,
        **_per_run(profiles, samples),
        skip_steps=skip_steps, noise_pct=noise_pct, confidence=_stats.CONFIDENCE, method=METHOD,
        wrappers=sorted(_wrappers(profiles) & set(order)),
        host=hosts,
        host_load_threshold_cores=host_load_threshold, host_busy_share=host_busy_share,
        cycle_noise=noise, gate_intervals=family,
    )
    if reasons := {p.label: p.extra["capture_reasons"] for p in profiles if p.extra.get("capture_reasons")}:
        frame.attrs["capture_reasons"] = reasons  # why each cycle was captured; runs without: as before
    others = [label for label in samples if label != base.label]
    frame.attrs.update(_explanations(whole, profiles, region, order))
    frame.attrs["verdicts"] = {label: frame.loc[TOTAL, (label, "verdict")] for label in others}
    frame.attrs["sentences"] = {label: sentence(frame, label) for label in others}
    if region is None and used != MEMORY_METRIC:
        frame.attrs["regions"] = _region_sentences(whole, base.label, metric, skip_steps, noise_pct, weather)
    # Added last: pandas deep-copies attrs on every operation, so the bulky ones come after.
    frame.attrs.update(
        outliers=_outliers(samples, order),
        samples={label: _plotted(s, order[:PLOTTED_OPS], region) for label, s in samples.items()},
        sample_steps={label: [list(key) for key in s.steps] for label, s in samples.items()},
        op_sample_steps={label: [list(key) for key in s.op_keys] for label, s in samples.items()},
    )
    return frame


def _explanations(whole: list[RunProfile], profiles: list[RunProfile], region: str | None, order: list[str]) -> dict:
    """What says why: the region and its launches, achieved bandwidth, Neuron Explorer's summary fields."""
    return {
        "region": region,
        "launches": {p.label: p.extra["launches"] for p in profiles} if region else {},
        "kernels": sorted(set().union(*(p.extra.get("kernels", ()) for p in profiles))) if region else [],
        "throughput": throughput(whole, region, order),
        "throughput_missing": throughput_missing(whole, region),
        "bytes_coverage": bytes_coverage(whole),
        **neuron_explanations({p.label: p.extra for p in whole}),  # neuron_summary, neuron_versions
    }


def _region_sentences(profiles: list[RunProfile], base: str, metric: str, skip_steps: int, noise_pct: float,
                      weather: tuple[float, float]) -> dict[str, dict[str, str]]:  # fmt: skip
    """The sentence of each region the runs share, per run: {region: {run: sentence}}."""
    return {name: compare(profiles, base, metric, skip_steps=skip_steps, noise_pct=noise_pct,
                          host_load_threshold=weather[0], host_busy_share=weather[1], region=name).attrs["sentences"]
            for name in region_names(profiles)[:SHOWN_REGIONS]}  # fmt: skip


def _check(profiles: list[RunProfile], metric: str, skip_steps: int, noise_pct: float,
           weather: tuple[float, float], region: str | None) -> None:  # fmt: skip
    if region is not None and metric == MEMORY_METRIC:
        raise ValueError("a region compares time; its memory is the allocated_bytes of its rows in ops.json")
    if not weather[0] >= 0:
        raise ValueError(f"host_load_threshold must be >= 0 cores; got {weather[0]}")
    if not weather[1] >= 0:
        raise ValueError(f"host_busy_share must be >= 0 (a share of the host's CPUs); got {weather[1]}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    if not profiles:
        raise ValueError("nothing to compare: no runs")
    if skip_steps < 0 or noise_pct < 0:
        raise ValueError(f"skip_steps and noise_pct must be >= 0; got {skip_steps} and {noise_pct}")


def _table(samples: dict[str, StepSamples], base: str, order: list[str], noise_pct: float,
           host_time: bool) -> tuple[pd.DataFrame, dict[str, dict], dict[str, dict]]:  # fmt: skip
    """The frame without attrs (a row per op in `order` and the TOTAL, a column group per run),
    the TOTAL's between-cycle test per run, and for host time the gate's intervals per run."""
    columns, noise, family = {}, {}, {}
    for label, run in samples.items():
        cols, total, on_cycles = _run_columns(run, samples[base], order, label == base, noise_pct, host_time)
        columns.update({(label, name): values for name, values in cols.items()})
        if label != base:
            noise[label] = _noise_attrs(total)
        if host_time and label != base:  # the rows with any interval count where none is over cycles
            family[label] = _cycles.family_intervals(on_cycles, int(np.isfinite(cols["ratio_low"]).sum()))
    frame = pd.DataFrame(columns, index=[*order, TOTAL])
    frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["run", "field"])
    frame.index.name = "op"
    return frame, noise, family


def _noise_attrs(judged: _cycles.Judged) -> dict:
    p_value, share = judged.noise.p_value, judged.noise.share
    return {"unit": judged.unit, "cycles": list(judged.noise.cycles), "too_few_cycles": judged.too_few_cycles,
            "p_value": None if np.isnan(p_value) else round(p_value, 4),
            "between_cycle_share": None if np.isnan(share) else round(share, 4)}  # fmt: skip


def _evidence(frame: pd.DataFrame, samples: dict[str, StepSamples], profiles: list[RunProfile], base: str,
              host_time: bool, weather: tuple[float, float], family: dict) -> dict[str, dict[str, str]]:  # fmt: skip
    """`not_gated` and `inconclusive`: per run, why the gate may not act on its host time, and why
    its host time is not judged at all (the second rewrites the run's verdicts)."""
    hosts = {p.label: dict(p.host) for p in profiles}
    return {"not_gated": _window_rules(frame, samples, profiles, base, host_time, family),
            "inconclusive": _weather_verdicts(frame, hosts, base, weather) if host_time else {}}


def _weather_verdicts(frame: pd.DataFrame, hosts: dict[str, dict], base: str,
                      weather: tuple[float, float]) -> dict[str, str]:  # fmt: skip
    """Host time of a run whose host, or the baseline's, was busy, or that saw a different host
    load than the baseline, is not judged: every verdict of that run that an interval decided
    reads `inconclusive` (rows with too few samples or cycles for one keep saying so: no weather
    makes them a claim). Returns the reason per run with such rows."""
    found = {}
    for label, host in hosts.items():
        why = None if label == base else _weather.verdict_weather(base, hosts[base], label, host, *weather)
        if why is None:
            continue
        judged = frame[(label, "verdict")].isin([FASTER, SLOWER, NO_CHANGE])
        if judged.any():
            frame.loc[judged, (label, "verdict")] = INCONCLUSIVE
            found[label] = why
    return found


def _window_rules(frame: pd.DataFrame, samples: dict[str, StepSamples], profiles: list[RunProfile], base: str,
                  host_time: bool, family: dict) -> dict[str, str]:  # fmt: skip
    """Why the gate may not act on a run's rows (`cycles.window_rule`; the TOTAL and every op alike)."""
    rotation = {p.label: p.extra.get("rotation") for p in profiles}
    windows = {label: len({cycle for cycle, _ in s.steps}) for label, s in samples.items()}
    found = {}
    for label in [label for label in samples if label != base]:
        together = bool(rotation[base]) and rotation[label] == rotation[base]
        needs = family.get(label, {}).get("needs", 0)  # host time has one per run; device time needs none
        why = _cycles.window_rule((windows[base], windows[label]), host_time, together, needs)
        if why and frame[(label, "verdict")].isin([FASTER, SLOWER, NO_CHANGE]).any():
            found[label] = why
    return found


def _per_run(profiles: list[RunProfile], samples: dict[str, StepSamples]) -> dict[str, dict]:
    """The attrs that say, per run label, which run it is and what its samples are."""
    aten_calls = {label: _count(np.median(s.aten_calls)) if s.aten_calls is not None else None
                  for label, s in samples.items()}  # fmt: skip
    return {
        "runs": {p.label: p.run_id for p in profiles}, "steps": {p.label: p.step for p in profiles},
        "devices": {p.label: p.device for p in profiles},
        "aten_calls": aten_calls,
        "n": {label: s.n for label, s in samples.items()},
        "sources": {label: s.source or "ops" for label, s in samples.items()},
    }


def flat(frame: pd.DataFrame) -> pd.DataFrame:
    """One level of columns (`<run>/<field>`) and the op as a column: for tables, CSV and JSON.

    Times are rounded to the nanosecond (what the profiler measures), counts are integers.
    """
    frame = bare(frame)
    out = frame.copy()
    for run, name in frame.columns:
        if name in ("time_us", "delta_us"):
            out[(run, name)] = frame[(run, name)].astype(float).round(3)
        elif name in ("share", "speedup", "ratio", "ratio_low", "ratio_high", "calls"):
            out[(run, name)] = frame[(run, name)].astype(float).round(4)
        if name == "calls" and out[(run, name)].dropna().map(float.is_integer).all() or name in ("n", "outliers"):
            out[(run, name)] = frame[(run, name)].astype("Int64")
    out.columns = [f"{run}/{name}" for run, name in frame.columns]
    return out.reset_index()


def bare(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame's cells without its attrs, for reading many of them: pandas deep-copies attrs into
    every Series and frame an operation makes, and a comparison's attrs hold every sample."""
    cells = pd.DataFrame(frame)
    cells.attrs = {}
    return cells


def _run_columns(run: StepSamples, base: StepSamples, order: list[str], is_base: bool, noise_pct: float,
                 by_cycles: bool = False) -> tuple[dict, _cycles.Judged | None, dict[str, tuple]]:  # fmt: skip
    """One run's column group (per op in `order`, then the TOTAL), how its TOTAL was judged, and
    the samples of the rows judged on an interval over cycles ({op: (base, cycles, run, cycles)})."""
    cols = {name: [] for name in FIELDS}
    total_median = _median(run.total)
    times, base_times, calls = _columns(run.ops), _columns(base.ops), _columns(run.calls)
    op_cycles = (_cycle_ids(base.op_keys), _cycle_ids(run.op_keys))
    rows = [(op, times.get(op), base_times.get(op), _median(calls[op]) if op in calls else np.nan, op_cycles)
            for op in order]  # fmt: skip
    rows.append((TOTAL, run.total, base.total, np.nan, (_cycle_ids(base.steps), _cycle_ids(run.steps))))
    total_judged, on_cycles = None, {}
    for op, values, base_values, op_calls, cycle_ids in rows:
        median = _median(values) if values is not None else np.nan
        base_median = _median(base_values) if base_values is not None else np.nan
        judged, verdict = _judge(base_values, values, cycle_ids, is_base, noise_pct, by_cycles)
        estimate = judged.estimate if judged else None
        if estimate is not None and estimate.has_interval and judged.unit == _cycles.CYCLES:
            on_cycles[op] = (base_values, cycle_ids[0], values, cycle_ids[1])
        if op == TOTAL:
            total_judged = judged
        cols["time_us"].append(median)
        cols["calls"].append(op_calls)
        cols["share"].append(median / total_median if total_median else np.nan)
        cols["delta_us"].append(median - base_median)
        cols["speedup"].append(base_median / median if median else np.nan)
        cols["n"].append(run.n if op == TOTAL else len(run.op_keys))
        cols["outliers"].append(int(_stats.outlier_mask(values).sum()) if values is not None else 0)
        cols["ratio"].append(estimate.ratio if estimate else np.nan)
        cols["ratio_low"].append(estimate.low if estimate and estimate.has_interval else np.nan)
        cols["ratio_high"].append(estimate.high if estimate and estimate.has_interval else np.nan)
        cols["unit"].append(judged.unit if judged else None)
        cols["verdict"].append(verdict)
    return cols, total_judged, on_cycles


_BASELINE = _cycles.Judged(_stats.RatioEstimate(1.0, 1.0, 1.0, exact=True), _cycles.STEPS,
                           _cycles.CycleNoise(float("nan"), float("nan"), (0, 0)))  # fmt: skip


def _cycle_ids(keys: list[tuple[int, int]]) -> np.ndarray:
    return np.fromiter((cycle for cycle, _ in keys), dtype=np.int64, count=len(keys))


def _columns(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """A frame's columns as arrays, read once (per-column pandas access dominates otherwise)."""
    values = table.to_numpy(float)
    return {name: values[:, i] for i, name in enumerate(table.columns)}


def _median(values: np.ndarray) -> float:
    ordered = np.sort(values)  # np.median costs ~10x more on a handful of samples
    half = len(ordered) // 2
    return float(ordered[half]) if len(ordered) % 2 else float(ordered[half - 1] + ordered[half]) / 2


def _judge(base_values, values, cycle_ids: tuple[np.ndarray, np.ndarray], is_base: bool,
           noise_pct: float, by_cycles: bool = False) -> tuple[_cycles.Judged | None, str]:  # fmt: skip
    if is_base:
        return _BASELINE, BASELINE
    if values is None:
        return None, GONE if base_values is not None else ABSENT
    if base_values is None:
        return None, NEW
    # named outliers (stalls) are left out of the estimate; the medians keep every sample
    judged = _cycles.judge(base_values, cycle_ids[0], values, cycle_ids[1], by_cycles=by_cycles)
    estimate = judged.estimate
    if judged.too_few_cycles:
        return judged, TOO_FEW_CYCLES
    if not estimate.has_interval:
        return judged, TOO_FEW
    if estimate.low <= 1 <= estimate.high or abs(estimate.ratio - 1) * 100 < noise_pct:
        return judged, NO_CHANGE
    return judged, SLOWER if estimate.ratio > 1 else FASTER


def _outliers(samples: dict[str, StepSamples], order: list[str]) -> list[dict]:
    """Each outlier named: run, op, `cycle` (the step the cycle was logged at, as in
    `profiler/step_<N>/`), `cycle_index` of `cycles` (its place among the run's cycles), step, sizes."""
    found = []
    for label, run in samples.items():
        times = _columns(run.ops)
        series = [*((op, times[op], run.op_keys) for op in order if op in times), (TOTAL, run.total, run.steps)]
        places = {cycle: i + 1 for i, cycle in enumerate(sorted({c for c, _ in run.steps}))}
        for op, values, keys in series:
            if len(values) < _stats.MIN_OUTLIER_SAMPLES:
                continue
            median = _median(values)
            for index in np.flatnonzero(_stats.outlier_mask(values)):
                cycle, step = keys[index]
                found.append({
                    "run": label, "op": op, "cycle": cycle, "cycle_index": places.get(cycle), "cycles": len(places),
                    "step": step,
                    "value_us": round(float(values[index]), 3), "median_us": round(median, 3),
                    "times_median": round(float(values[index]) / median, 2) if median else None,
                })  # fmt: skip
    return found


def _plotted(run: StepSamples, ops: list[str], region: str | None) -> dict[str, list[float]]:
    plotted = {op: [round(float(v), 3) for v in run.ops[op]] for op in ops if op in run.ops}
    plotted[TOTAL] = [round(float(v), 3) for v in run.total]
    if region is not None:  # the region's samples under its own name too (an op inside is never named so)
        plotted[region] = plotted[TOTAL]
    return plotted


def _wrappers(profiles: list[RunProfile]) -> set[str]:
    return set().union(*(wrapper_names(p.ops) for p in profiles))


def _count(value: float) -> int | float:
    """Counts per step stay integers when they are (a median of two can end in .5)."""
    return int(value) if float(value).is_integer() else float(value)


def _find(profiles: list[RunProfile], key: str) -> RunProfile:
    for p in profiles:
        if key in (p.label, p.run_id):
            return p
    raise ValueError(f"baseline {key!r} is not among the compared runs ({', '.join(p.label for p in profiles)})")
