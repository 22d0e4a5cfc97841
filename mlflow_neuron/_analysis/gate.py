"""The CI gate on a comparison frame (pure): which rows are proven slower, and what it says.

A row fails only when the whole interval of run / baseline lies above +`percent` (95%; host time
over cycles at 1 − 0.05/m, `cycles.family_intervals`): a point estimate over the line is not
enough, since per-step noise and stalls move it. Rows with too few samples or cycles for an
interval can never fail; the gate names them instead of passing in silence, and so it does for
host-time rows whose stalls, left out as outliers, took whole cycles and with them the gate's
interval (`short_of_cycles`). Nor can the rows of a
run whose verdicts are `inconclusive` (host time, and the host's load differed from the
baseline's): the gate prints why, and `inconclusive_runs` lets the command line exit 4 for a CI job
that wants to retry on a quieter host. Nor can the rows of a run whose host-time intervals do not
cover the variation between profiled windows (runs profiled apart, or in rotation with too few
cycles for the gate's distribution-free interval: `cycles.window_rule`): the gate prints a NOT
GATED line with the rows that would have failed, and exits 0 on them. A comparison of many runs
(`overview`) holds only the runs shown in detail: the gate judges those, on their per-step samples,
and names them (JUDGED IN DETAIL) and the runs it did not judge (NOT JUDGED IN DETAIL); summaries
never fail it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .cycles import CYCLES, MIN_CYCLES
from .frame import bare
from .model import INCONCLUSIVE, TOTAL, UNJUDGED, Regression
from .overview import names
from .stats import CONFIDENCE


def gate_lines(frame: pd.DataFrame, percent: float, min_us: float = 0.0) -> tuple[bool, list[str]]:
    """(failed, the lines to print): a REGRESSION line per proven regression with its interval,
    a NOT CHECKED line per run with rows too short of samples, and the all-clear when none failed.

    Example::

        failed, lines = gate_lines(frame, 5.0)   # fail when a row is proven more than 5% slower
    """
    base, slower = frame.attrs["baseline"], regressions(frame, percent, min_us)
    if frame.attrs.get("region"):  # the TOTAL row is the region's
        slower = [replace(r, op=f"region {frame.attrs['region']}") if r.op == TOTAL else r for r in slower]
    lines = [f"REGRESSION {r.run}: {r.op} median {r.baseline_us:,.2f} -> {r.run_us:,.2f} us, ratio {r.ratio:.2f} "
             f"({_level(frame, r)}) > +{percent:g}% vs {base}" for r in slower]  # fmt: skip
    not_checked: dict[str, list[Regression]] = {}
    for r in unchecked(frame, min_us):
        not_checked.setdefault(r.run, []).append(r)
    for run, rows in not_checked.items():  # one line per run: single-sample runs have a row per op
        n, total = frame.attrs["n"], next((r for r in rows if r.op == TOTAL), rows[0])
        lines.append(f"NOT CHECKED {run}: {len(rows)} row(s), {_too_few(frame, run, n[run], n[base])} for a 95% "
                     f"interval ({total.op} point ratio {total.ratio:.2f})")  # fmt: skip
    for run, rows in short_of_cycles(frame, min_us).items():
        rows, family = sorted(rows, key=lambda r: r.op != TOTAL), frame.attrs["gate_intervals"][run]
        lines.append(f"NOT CHECKED {run}: {len(rows)} row(s) ({names([r.op for r in rows])}), too few cycles left "
                     f"after outliers for the gate's {100 * family['level']:.4g}% interval over cycles (needs "
                     f"{family['needs']} a run)")  # fmt: skip
    inconclusive = inconclusive_runs(frame)
    for run, why in inconclusive.items():
        lines.append(f"INCONCLUSIVE {run}: {why}; host time not gated (--fail-if-inconclusive: exit 4)")
    for run, why in not_gated_runs(frame).items():
        if run not in inconclusive:
            lines.append(f"NOT GATED {run}: host time, {why}{_would_fail(frame, run, percent, min_us)}")
    lines += _detail_lines(frame, percent)
    if not slower:
        lines.append(f"no op or total is proven more than {percent:g}% slower than {base} ({_levels(frame)})"
                     + (" among the runs judged in detail" if frame.attrs.get("many") else ""))  # fmt: skip
    return bool(slower), lines


def _detail_lines(frame: pd.DataFrame, percent: float) -> list[str]:
    """With many runs: which the gate judged (their per-step samples), and that the others were not gated."""
    many = frame.attrs.get("many")
    if not many:
        return []
    judged = list(frame.attrs["runs"])
    others = [r["run"] for r in many["rows"] if r["run"] not in frame.attrs["runs"]]
    lines = [f"JUDGED IN DETAIL {len(judged)} of {len(many['rows'])} runs (per-step samples): {names(judged)}"]
    if others:
        why = (f"their run-level numbers put the step total's ratio of medians wholly at or below +{percent:g}%"
               if many.get("gate_pct") == percent else "not shown in detail")  # fmt: skip
        lines.append(f"NOT JUDGED IN DETAIL {len(others)} run(s), not gated ({why}; their ops not checked; "
                     f"--tables judges every run): {names(others)}")  # fmt: skip
    return lines


def regressions(frame: pd.DataFrame, percent: float, min_us: float = 0.0) -> list[Regression]:
    """Ops (and the TOTAL) whose whole interval of run / baseline lies above +`percent` (95%, or
    for host time the run's family-wise interval over cycles).

    A point estimate over the line is not enough: per-step noise and stalls move it, and the
    interval says by how much. Ops under `min_us` (median) in both runs, and wrapper ranges, are
    left out; the TOTAL is always checked. Rows with too few samples for an interval never fail (see `unchecked`).
    """
    not_gated = not_gated_runs(frame)
    return [r for r in _above(frame, percent, min_us) if r.run not in not_gated]


def not_gated_runs(frame: pd.DataFrame) -> dict[str, str]:
    """{run: why} for the runs whose host-time intervals the gate may not act on (`cycles.window_rule`)."""
    return dict(frame.attrs.get("not_gated") or {})


def _above(frame: pd.DataFrame, percent: float, min_us: float, family_wise: bool = True) -> list[Regression]:
    """Judged rows whose whole interval lies above +`percent`, whether or not the gate may act on them.
    Host time is judged on the run's family-wise intervals (`cycles.family_intervals`): a row
    without one (judged on its steps) is never above. `family_wise=False`: on the 95% intervals."""
    found, family = [], (frame.attrs.get("gate_intervals") or {}) if family_wise else {}
    for run, op, row in _gated_rows(frame, min_us):
        numbers = _row_numbers(frame, run, op)
        if run in family:
            if op not in family[run]["rows"]:
                continue
            numbers = (*numbers[:3], *family[run]["rows"][op])
        if row["verdict"] != INCONCLUSIVE and numbers[3] > 1 + percent / 100:
            found.append(Regression(run, op, *numbers))
    return found


def _level(frame: pd.DataFrame, r: Regression) -> str:
    """`95% CI 1.2–1.4`, or for host time `99.6% CI 1.1–1.5 over cycles, for 12 rows`: the
    interval a REGRESSION line gives."""
    interval = f"{r.ratio_low:.2f}\u2013{r.ratio_high:.2f}"
    family = (frame.attrs.get("gate_intervals") or {}).get(r.run)
    if family is None:
        return f"95% CI {interval}"
    rows = round((1 - CONFIDENCE) / (1 - family["level"]))  # the m of its level 1 - 0.05/m, rows with no interval too
    return f"{100 * family['level']:.4g}% CI {interval} over cycles, for {rows} rows"


def _levels(frame: pd.DataFrame) -> str:
    """`95% interval`, or `95% interval; host time 99.6% over cycles` when a gated run's host time
    was judged on its family-wise intervals: the level the all-clear line stands on."""
    levels = sorted({f"{100 * f['level']:.4g}%" for f in _gated_families(frame).values()})
    return "95% interval" + (f"; host time {', '.join(levels)} over cycles" if levels else "")


def _would_fail(frame: pd.DataFrame, run: str, percent: float, min_us: float) -> str:
    """`` (aten::mul ratio 3.34, 95% CI over steps 1.19–5.25, above +10%)``: what the gate leaves alone."""
    rows = [r for r in _above(frame, percent, min_us, family_wise=False) if r.run == run]
    if not rows:
        return ""
    unit = bare(frame)[(run, "unit")]
    shown = "; ".join(f"{r.op} ratio {r.ratio:.2f}, 95% CI over {unit[r.op]} {r.ratio_low:.2f}\u2013{r.ratio_high:.2f}"
                      for r in rows[:3])  # fmt: skip
    more = f" and {len(rows) - 3} more" if len(rows) > 3 else ""
    return f" ({shown}{more}: above +{percent:g}% but not proven)"


def unchecked(frame: pd.DataFrame, min_us: float = 0.0) -> list[Regression]:
    """The rows the gate could not check: too few samples (or cycles) for a 95% interval."""
    return [Regression(run, op, *_row_numbers(frame, run, op))
            for run, op, row in _gated_rows(frame, min_us) if row["verdict"] in UNJUDGED]  # fmt: skip


def short_of_cycles(frame: pd.DataFrame, min_us: float = 0.0) -> dict[str, list[Regression]]:
    """{run: rows} of the gated host-time runs: rows with a 95% interval over cycles but none at the
    gate's level, because outliers (stalls) took whole cycles. The gate cannot act on them, and says so."""
    family = _gated_families(frame)
    short: dict[str, list[Regression]] = {}
    for run, op, row in _gated_rows(frame, min_us):
        if (run in family and op not in family[run]["rows"] and row["unit"] == CYCLES
                and np.isfinite(row["ratio_low"]) and row["verdict"] not in UNJUDGED):  # fmt: skip
            short.setdefault(run, []).append(Regression(run, op, *_row_numbers(frame, run, op)))
    return short


def _gated_families(frame: pd.DataFrame) -> dict[str, dict]:
    """{run: its family-wise intervals} of the runs whose host time the gate acts on: neither not
    gated (`cycles.window_rule`) nor inconclusive (the weather)."""
    left = {**not_gated_runs(frame), **inconclusive_runs(frame)}
    return {run: f for run, f in (frame.attrs.get("gate_intervals") or {}).items() if run not in left}


def inconclusive_runs(frame: pd.DataFrame) -> dict[str, str]:
    """{run: why} for the runs whose host time was not judged: they saw a different host load."""
    return dict(frame.attrs.get("inconclusive") or {})


def _too_few(frame: pd.DataFrame, run: str, n_run: int, n_base: int) -> str:
    noise = frame.attrs.get("cycle_noise", {}).get(run, {})
    if noise.get("too_few_cycles"):
        base_cycles, run_cycles = noise["cycles"]
        return (f"{run_cycles} vs {base_cycles} cycles that differ beyond the noise between steps, too few "
                f"(needs {MIN_CYCLES} per run)")  # fmt: skip
    return f"{n_run} vs {n_base} samples, too few"


def _gated_rows(frame: pd.DataFrame, min_us: float):
    """Rows the gate checks: real ops and the TOTAL. Wrapper ranges (ProfilerStep*, compiled
    regions, user annotations) are left out: their own time is bookkeeping, and the TOTAL has it."""
    base, wrappers = frame.attrs["baseline"], set(frame.attrs.get("wrappers", []))
    frame = bare(frame)
    for run in frame.columns.get_level_values("run").unique():
        if run == base:
            continue
        for op in frame.index:
            if op in wrappers:
                continue
            row = frame[run].loc[op]
            largest = np.fmax(row["time_us"], frame.loc[op, (base, "time_us")])  # NaN: not in that run
            if op != TOTAL and not largest >= min_us:
                continue
            yield run, op, row


def _row_numbers(frame: pd.DataFrame, run: str, op: str) -> tuple[float, ...]:
    base = frame.attrs["baseline"]
    frame = bare(frame)
    return tuple(float(frame.loc[op, key]) for key in
                 [(base, "time_us"), (run, "time_us"), (run, "ratio"), (run, "ratio_low"), (run, "ratio_high")])  # fmt: skip
