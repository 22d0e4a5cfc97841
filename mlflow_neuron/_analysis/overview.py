"""Many runs at a glance (pure): each run's run-level numbers against the baseline's, and which
runs a comparison loads and prints in detail.

Example::

    rows = overview_rows(numbers, labels, run_ids, sources, base=0)
    chosen = choose(rows, noise_pct=2.0, named={"v07"}, gate_pct=10.0)
    chosen.detailed          # labels whose per-step samples are loaded and compared in detail

`compare` of more than `BULK_ABOVE` runs reads each run's summary metrics first (`StepSummary`:
the median per step over all its cycles, its 95% interval, n; `_record.run_summary`), from the
search that found the runs. A row's `ratio` is its median over the baseline's median, and its
interval joins the two medians' 95% intervals (run low / baseline high, run high / baseline low):
wider than the per-step interval of the detailed table, and labelled as a ratio of medians.

In detail: the baseline; runs named with `--detail`; runs whose summary their tables contradict
(their tables win); the runs whose ratio interval lies wholly
beyond the noise band (the `DETAIL_AT_MOST` largest changes; the rest are named, not shown), and
where fewer differ, the runs whose ratio of medians moved most beyond the noise band, up to
`DETAIL_AT_MOST` in all (summaries of few, noisy steps are too coarse to tell; steps may); and,
with the gate (`--fail-if-slower PCT`), every run whose summaries cannot rule out +PCT (no
interval, or its upper end above the line). The gate judges only runs shown in detail, on their
per-step samples: summaries never decide a gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from .._trace.step_summary import StepSummary
from .model import CPU_METRIC, DEVICE_METRIC

BULK_ABOVE = 8  # compare of more runs than this reads run-level summaries first
DETAIL_AT_MOST = 5  # runs that differ by their summaries, shown in detail (the largest changes)
FROM_SUMMARY, FROM_TABLES = "summary metrics", "tables"
SHOWN_NAMES = 12  # names listed in a line before "and N more"


@dataclass(frozen=True)
class Chosen:
    """What a comparison of many runs loads: labels in run order, and why."""

    detailed: list[str]  # baseline first
    why: dict[str, str]  # label -> "baseline" | "named" | "contradicted" | "differs" | "largest" | "gate"
    differing: list[str]  # every run whose summary interval is beyond the noise band, largest change first
    not_shown: list[str]  # of those, the ones past DETAIL_AT_MOST (and not in detail for another reason)


def overview_rows(numbers: list[StepSummary], labels: list[str], run_ids: list[str], sources: list[str],
                  base: int) -> list[dict]:  # fmt: skip
    """One row per run (JSON-ready: None where a number does not exist)."""
    rows = []
    for summary, label, run_id, source in zip(numbers, labels, run_ids, sources):
        ratio, low, high = _ratio(summary, numbers[base])
        rows.append({
            "run": label, "run_id": run_id, "from": source, "n": summary.n, "median": summary.median,
            "low": summary.low, "high": summary.high, "ratio": ratio, "ratio_low": low, "ratio_high": high,
            "baseline": label == labels[base],
        })  # fmt: skip
    return rows


def _ratio(run: StepSummary, base: StepSummary) -> tuple[float | None, float | None, float | None]:
    if not base.median > 0:
        return None, None, None
    ratio = run.median / base.median
    if None in (run.low, run.high, base.low, base.high) or not base.low > 0:
        return ratio, None, None
    return ratio, run.low / base.high, run.high / base.low


def differs(row: dict, noise_pct: float) -> bool:
    """The whole ratio interval lies beyond the noise band (±noise_pct)."""
    low, high = row["ratio_low"], row["ratio_high"]
    return low is not None and (low > 1 + noise_pct / 100 or high < 1 - noise_pct / 100)


def could_fail(row: dict, gate_pct: float) -> bool:
    """The summaries cannot rule out a ratio above +gate_pct: no interval, or its upper end above."""
    return row["ratio_high"] is None or row["ratio_high"] > 1 + gate_pct / 100


def choose(rows: list[dict], noise_pct: float, named: set[str], gate_pct: float | None,
           contradicted: set[str] = frozenset()) -> Chosen:  # fmt: skip
    """The runs to load and print in detail (see the module docstring); runs whose summary their
    tables `contradicted` are shown too (their tables are loaded already)."""
    why = {r["run"]: "baseline" for r in rows if r["baseline"]}
    for r in rows:
        if r["run"] in named:
            why.setdefault(r["run"], "named")
        elif r["run"] in contradicted:
            why.setdefault(r["run"], "contradicted")
    found = sorted((r for r in rows if not r["baseline"] and differs(r, noise_pct)),
                   key=lambda r: -abs(math.log(r["ratio"])) if r["ratio"] and r["ratio"] > 0 else -math.inf)  # fmt: skip
    differing = [r["run"] for r in found]
    for label in differing[:DETAIL_AT_MOST]:
        why.setdefault(label, "differs")
    moved = sorted((r for r in rows if r["run"] not in why and r["ratio"] and abs(r["ratio"] - 1) * 100 >= noise_pct),
                   key=lambda r: -abs(math.log(r["ratio"])))  # fmt: skip
    for r in moved[: max(DETAIL_AT_MOST - len(differing), 0)]:
        why[r["run"]] = "largest"  # summaries too coarse to tell: the per-step samples may
    if gate_pct is not None:
        for r in rows:
            if could_fail(r, gate_pct):
                why.setdefault(r["run"], "gate")
    order = [r["run"] for r in rows]
    detailed = sorted(why, key=lambda label: (why[label] != "baseline", order.index(label)))
    return Chosen(detailed, why, differing, [label for label in differing if label not in why])


def what(metric: str, region: str | None) -> str:
    """`median self device time per step (us)`, and the like, for the overview's heading."""
    unit = "bytes" if metric == "peak_memory_bytes" else "us"
    name = {DEVICE_METRIC: "self device time", CPU_METRIC: "self CPU time"}.get(metric, "peak memory")
    if region is not None:
        name = f"region {region} {'CPU' if metric == 'self_cpu_time_us' else 'device'} time"
    return f"median {name} per step ({unit})"


def overview_table(many: dict) -> pd.DataFrame:
    """The display table (strings), one row per run in run order."""
    rows = many["rows"]
    why = many["why"]
    columns = {
        "n (steps)": [str(r["n"]) for r in rows],
        "median": [f"{r['median']:,.2f}" for r in rows],
        "95% CI of median": [_interval(r["low"], r["high"], ",.2f") for r in rows],
        "ratio of medians (summaries)": [_ratio_cell(r, many["noise_pct"]) for r in rows],
        "from": ["tables" if r["from"] == FROM_TABLES else "summary" for r in rows],
        "in detail": [why.get(r["run"], "") for r in rows],
    }
    return pd.DataFrame(columns, index=[r["run"] for r in rows])


def _ratio_cell(row: dict, noise_pct: float) -> str:
    if row["baseline"]:
        return "baseline"
    if row["ratio"] is None:
        return "-"
    interval = _interval(row["ratio_low"], row["ratio_high"], ".2f")
    return f"{row['ratio']:.2f} {interval}" + (" differs" if differs(row, noise_pct) else "")


def _interval(low: float | None, high: float | None, spec: str) -> str:
    return "[no CI]" if low is None or high is None else f"[{low:{spec}}\u2013{high:{spec}}]"


def overview_lines(many: dict) -> list[str]:
    """The overview as text: heading, table, and what was loaded and why (ends with a blank line)."""
    rows, detailed = many["rows"], many["detailed"]
    base = next(r["run"] for r in rows if r["baseline"])
    lines = [f"every run ({len(rows)}), from its run-level numbers: {what(many['metric'], many['region'])}, "
             f"95% interval of the median, baseline {base}", overview_table(many).to_string(), ""]  # fmt: skip
    lines.append(f"ratio of medians: a run's median / {base}'s, from the summary metrics logged with each run "
                 "(profiler/summary/...); its interval joins the two medians' 95% intervals and is wider than the "
                 f"per-step interval below. differs: the whole interval lies beyond \u00b1{many['noise_pct']:g}%.")  # fmt: skip
    lines.append(f"in detail below ({len(detailed)} of {len(rows)} runs; their per-step samples loaded, the only runs "
                 f"the gate judges): {', '.join(detailed)}")  # fmt: skip
    if many["differing"]:
        lines.append(f"{len(many['differing'])} run(s) differ from {base} by their summaries"
                     + (f"; not shown in detail (past the {DETAIL_AT_MOST} largest changes): {names(many['not_shown'])}; "
                        "--detail NAME shows a run" if many["not_shown"] else ""))  # fmt: skip
    largest = [label for label in detailed if many["why"].get(label) == "largest"]
    if largest:
        lines.append(f"also in detail, the largest changes that their summaries are too coarse to tell (ratio of medians "
                     f"beyond \u00b1{many['noise_pct']:g}%, its interval not): {names(largest)}")  # fmt: skip
    if many["slow_path_runs"]:
        lines.append(f"{many['slow_path_runs']} of {len(rows)} runs read from their tables (the slow path): "
                     f"{many['slow_path_why']}")  # fmt: skip
    for c in many["contradicting"]:
        lines.append(f"run {c['run_name']} ({c['run_id'][:8]}): its summary metrics (n {c['summary']['n']}, median "
                     f"{c['summary']['median']:,.3f}) contradict its tables (n {c['tables']['n']}, median "
                     f"{c['tables']['median']:,.3f}); its tables' numbers are shown")  # fmt: skip
    return [*lines, ""]


def names(labels: list[str], limit: int = SHOWN_NAMES) -> str:
    shown = ", ".join(labels[:limit])
    return shown + (f" and {len(labels) - limit} more" if len(labels) > limit else "")
