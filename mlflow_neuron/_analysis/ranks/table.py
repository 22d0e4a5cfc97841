"""One row per rank from its steps (pure): the step time's median and interval, the medians of
its parts a step, and HTA's breakdown and overlap over its steps. Used by `analysis`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..._trace.step_summary import MIN_INTERVAL_SAMPLES, interval_order

TABLE_COLUMNS = ["rank", "host", "steps", "step_us_median", "step_us_low", "step_us_high", "collective_us", "wait_us",
                 "bubble_us", "exposed_comm_pct", "idle_pct", "compute_us", "arrived_last_pct", "device_cc_op_time",
                 "compute_pct", "non_compute_pct", "overlap_pct"]  # fmt: skip
_PARTS = ["step_us", "window_us", "compute_us", "collective_us", "wait_us", "bubble_us", "exposed_comm_us", "idle_us"]


def rank_table(steps: pd.DataFrame, ranks: list[int], last: dict, waited: int, device: dict) -> pd.DataFrame:
    """The table (TABLE_COLUMNS), a row per rank in `ranks` (a rank without steps has empty cells).
    `last`: rank -> instances it arrived last at, of `waited` that kept others waiting; `device`:
    rank -> Explorer's collective time."""
    s = steps.copy()
    for column in _PARTS:
        s[column] = pd.to_numeric(s[column], errors="coerce")
    by = s.groupby("rank")
    out = pd.DataFrame(index=pd.Index(ranks, name="rank"))
    out["host"] = by["host"].first()
    out["steps"] = by.size().reindex(out.index).fillna(0).astype(int)
    out["step_us_median"] = by["step_us"].median()
    out["step_us_low"], out["step_us_high"] = _intervals(s)
    for column in ("collective_us", "wait_us", "bubble_us", "compute_us"):
        out[column] = by[column].median()
    out["exposed_comm_pct"] = _share(s, "exposed_comm_us")
    out["idle_pct"] = _share(s, "idle_us")
    out["compute_pct"] = _share(s, "compute_us")
    out["non_compute_pct"] = 100.0 - out["idle_pct"] - out["compute_pct"]
    both = s.dropna(subset=["collective_us", "exposed_comm_us"])
    comm = both.groupby("rank")["collective_us"].sum()
    overlapped = comm - both.groupby("rank")["exposed_comm_us"].sum()
    out["overlap_pct"] = (100.0 * overlapped / comm).where(comm > 0)
    out["arrived_last_pct"] = [100.0 * last.get(r, 0) / waited if waited else None for r in ranks]
    out["device_cc_op_time"] = [device.get(r) for r in ranks]
    out = out.reset_index()
    return out.astype(object).where(out.notna(), None)[TABLE_COLUMNS]


def _share(s: pd.DataFrame, column: str) -> pd.Series:
    """Per rank, 100 x the sum of `column` over the sum of the windows, over steps with both."""
    both = s.dropna(subset=[column, "window_us"])
    total = both.groupby("rank")["window_us"].sum()
    return (100.0 * both.groupby("rank")[column].sum() / total).where(total > 0)


def _intervals(s: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per rank, the median's distribution-free 95% interval (`step_summary.median_interval`):
    order statistics k and n + 1 - k; none below MIN_INTERVAL_SAMPLES steps."""
    ordered = s.dropna(subset=["step_us"]).sort_values(["rank", "step_us"], kind="stable")
    place = ordered.groupby("rank").cumcount().to_numpy()
    n = ordered.groupby("rank")["step_us"].transform("size").to_numpy()
    k = np.array([interval_order(int(x)) for x in n], np.int64)
    usable = (k >= 1) & (n >= MIN_INTERVAL_SAMPLES)
    rank = ordered["rank"].to_numpy()
    value = ordered["step_us"].to_numpy(float)
    low = pd.Series(value[usable & (place == k - 1)], index=rank[usable & (place == k - 1)])
    high = pd.Series(value[usable & (place == n - k)], index=rank[usable & (place == n - k)])
    return low.groupby(level=0).first(), high.groupby(level=0).first()
