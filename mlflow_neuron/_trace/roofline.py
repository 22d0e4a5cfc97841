"""Each op's (and region's) bytes and FLOPs in ops.json, and what they say against the device's peak.

Example::

    frame = with_roofline(ops_frame, profile, peak)   # peak: `_trace.peaks.Peak.to_dict()`, or None

Columns (record_shapes=True; empty where the op's formula is unknown, `_trace.traffic`):
- `bytes`, `flops`: summed over the op's calls in the cycle;
- `achieved_gbps`, `achieved_gflops`: per second of the op's inclusive device time (its host time
  when the cycle has no device time);
- where the peak is known: `pct_of_peak_bandwidth`, `pct_of_peak_flops` (the flops peak of the
  op's precision), and `bound`: `memory` when its FLOPs per byte lie below the device's ridge
  point (peak FLOPs / peak bytes per second), else `compute`;
- `comm_bytes`: a collective's message size summed over its calls (`record_param_comms`), kept
  apart from `bytes`: link traffic, not HBM traffic, so it enters no GB/s or % of peak;
- `pct_device_time_without_bytes`: the share of the cycle's op device time (each kernel on the
  innermost op that launched it) spent in this op's calls that have no bytes; 0 for an op whose
  calls all have them (or a message size), empty without device time. Sorted, it names the largest ops the formulas
  miss; 100 minus its sum is the share that has bytes.
"""

from __future__ import annotations

import math

import pandas as pd

from .peaks import precision_of
from .profile import PRESENT, CycleProfile

ROOFLINE_COLUMNS = ("bytes", "flops", "achieved_gbps", "achieved_gflops", "bound", "pct_of_peak_bandwidth",
                    "pct_of_peak_flops")  # fmt: skip
COMM_COLUMN = "comm_bytes"
UNCOVERED_COLUMN = "pct_device_time_without_bytes"


def with_roofline(frame: pd.DataFrame, profile: CycleProfile, peak: dict | None, region_kind: str) -> pd.DataFrame:
    """`frame` (ops.json's rows) with the roofline columns; unchanged without recorded shapes."""
    if profile.traffic is None:
        return frame
    by_op = {name: (nbytes, flops, dtype) for name, nbytes, flops, dtype, _ in profile.traffic}
    messages = {name: message for name, *_, message in profile.traffic}
    regions = {}
    for r in profile.regions:
        total = regions.setdefault(r.name, [0.0, 0.0])
        total[0], total[1] = total[0] + r.bytes, total[1] + r.flops
    time_column = "device_time_us" if profile.device_time == PRESENT else "cpu_time_us"
    rows = []
    for name, kind, time_us in zip(frame["name"], frame["kind"], frame[time_column]):
        if kind == region_kind:
            nbytes, flops, dtype = *regions.get(name, (math.nan, math.nan)), ""
        elif kind == "op" and name in by_op:
            nbytes, flops, dtype = by_op[name]
        else:
            nbytes, flops, dtype = math.nan, math.nan, ""
        rows.append(_row(nbytes, flops, dtype, float(time_us), peak))
    columns = pd.DataFrame(rows, columns=list(ROOFLINE_COLUMNS))
    columns[COMM_COLUMN] = [messages.get(name, math.nan) if kind == "op" else math.nan
                            for name, kind in zip(frame["name"], frame["kind"])]  # fmt: skip
    columns[UNCOVERED_COLUMN] = _uncovered(frame, profile)
    return pd.concat([frame.reset_index(drop=True), columns], axis=1)


def _uncovered(frame: pd.DataFrame, profile: CycleProfile) -> list[float]:
    coverage = profile.traffic_coverage
    if coverage is None or not coverage.total_us > 0:
        return [math.nan] * len(frame)
    missing = dict(coverage.uncovered)
    return [_round(100.0 * missing.get(name, 0.0) / coverage.total_us) if kind == "op" else math.nan
            for name, kind in zip(frame["name"], frame["kind"])]  # fmt: skip


def _row(nbytes: float, flops: float, dtype: str, time_us: float, peak: dict | None) -> tuple:
    seconds = time_us / 1e6 if time_us > 0 else math.nan
    gbps, gflops = nbytes / seconds / 1e9, flops / seconds / 1e9
    bound, pct_bw, pct_flops = None, math.nan, math.nan
    if peak:
        bandwidth = peak["memory_bytes_per_s"]
        flops_peak = peak["flops_per_s"].get(precision_of(dtype) or "", math.nan)
        pct_bw = gbps * 1e9 / bandwidth * 100
        pct_flops = gflops * 1e9 / flops_peak * 100
        if nbytes > 0 and not math.isnan(flops) and not math.isnan(flops_peak):
            bound = "memory" if flops / nbytes < flops_peak / bandwidth else "compute"
    return (nbytes, flops, _round(gbps), _round(gflops), bound, _round(pct_bw), _round(pct_flops))


def _round(value: float) -> float:
    """Six significant digits: rates span 0.001 GB/s (a host op) to thousands."""
    return float(f"{value:.6g}") if math.isfinite(value) else math.nan
