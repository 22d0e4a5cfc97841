"""The comparison PNG: every sample per op and run on the left, run / baseline on the right.

Samples go on a log axis: a 10x stall then sits visibly apart instead of squashing every other
point into one pixel, and each outlier carries a label with its step and size. Zeros (an op
absent in a step) are drawn at the axis' left edge as open circles.

Rows: each op gets one row per run that has samples of it (an op only one variant has gets one
row, not an empty row per other run), its label in the middle of its rows, and an empty row
before the next op. Both panels share the rows (`sharey`), so they come from one `Layout`. Each
run's artists carry `gid` "<run>: <op>", so a test can find what was drawn where.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter

from .._analysis.model import FASTER, INCONCLUSIVE, SLOWER, TOO_FEW, TOO_FEW_CYCLES, TOTAL, UNJUDGED
from .._analysis.verdict import short_names

VERDICT_COLORS = {FASTER: "#1a7f37", SLOWER: "#b3261e", TOO_FEW: "#c77c00", TOO_FEW_CYCLES: "#c77c00",
                  INCONCLUSIVE: "#c77c00"}  # fmt: skip
_ROW_GAP = 1  # empty rows between ops
_HALF_ROW = 0.5  # an op's band reaches half a row beyond its first and last rows
_JITTER = 0.5  # points spread over this much of their row: +-0.25, well inside the band
_ROW_INCHES = 0.3


@dataclass(frozen=True)
class Layout:
    """The y of each (op, run) row, ops in order (the first, the TOTAL, at the top)."""

    rows: dict[str, dict[str, int]]  # op -> {run: y}, runs in the frame's order

    @classmethod
    def of(cls, frame: pd.DataFrame, ops: list[str], runs: list[str]) -> Layout:
        plotted, rows, y = frame.attrs["samples"], {}, 0
        for op in ops:
            having = [run for run in runs if plotted[run].get(op)]
            rows[op] = {run: y + k for k, run in enumerate(having)}
            y += len(having) + _ROW_GAP
        return cls(rows)

    def band(self, op: str) -> tuple[float, float]:
        """The y range that belongs to `op`: its rows, half a row beyond each end."""
        ys = self.rows[op].values()
        return min(ys) - _HALF_ROW, max(ys) + _HALF_ROW

    def center(self, op: str) -> float:
        low, high = self.band(op)
        return (low + high) / 2

    @property
    def bottom(self) -> float:
        """The last row's y (the axis runs downwards from the TOTAL)."""
        return max(max(ys.values(), default=0) for ys in self.rows.values())


def png(frame: pd.DataFrame, path: Path, title: str, top: int = 8) -> Path:
    """Writes the chart of the TOTAL and the `top` costliest plotted ops to `path`."""
    import matplotlib.pyplot as plt

    fig = figure(frame, title, top)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(frame: pd.DataFrame, title: str, top: int = 8):
    """The chart as a matplotlib Figure (Agg: no window). Left: every per-step sample (strip points)
    with the median, outliers marked and labelled, on a log axis so one stall cannot squash the
    rest. Right: run / baseline with its 95% interval per op, the noise band shaded."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    runs = list(frame.columns.get_level_values("run").unique())
    plotted = frame.attrs["samples"]
    ops = [TOTAL] + [op for op in frame.index if op != TOTAL and any(plotted[r].get(op) for r in runs)][:top]
    layout = Layout.of(frame, ops, runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, _ROW_INCHES * (layout.bottom + 2) + 2.5),
                                      width_ratios=[3, 2], sharey=True)  # fmt: skip
    labels = dict(zip(ops, short_names(ops)))
    if frame.attrs.get("region"):
        labels[TOTAL] = f"region {frame.attrs['region']}"
    draw_samples(left, frame, layout, labels)
    draw_ratios(right, frame, layout)
    fig.suptitle("\n".join(textwrap.wrap(title, 130)), fontsize=10)  # a long heading fits the figure
    fig.tight_layout()
    return fig


def draw_samples(ax, frame: pd.DataFrame, layout: Layout, labels: dict[str, str]) -> None:
    runs = list(frame.columns.get_level_values("run").unique())
    samples = frame.attrs["samples"]
    shown = [v for op, rows in layout.rows.items() for run in rows for v in samples[run][op] if v > 0]
    floor = min(shown) / 2 if shown else 1.0
    in_legend: set[str] = set()
    for op, rows in layout.rows.items():
        for run, y in rows.items():
            color = f"C{runs.index(run)}"
            values = samples[run][op]
            spread = [y + ((k * 0.618) % 1 - 0.5) * _JITTER for k in range(len(values))]  # fixed jitter
            xs = [max(v, floor) for v in values]
            ax.scatter(xs, spread, s=14, color=color, alpha=0.55, linewidths=0, gid=f"{run}: {op}",
                       label=None if run in in_legend else run)  # fmt: skip
            in_legend.add(run)
            zeros = [(x, yy) for x, yy, v in zip(xs, spread, values) if v <= 0]
            if zeros:
                ax.scatter(*zip(*zeros), s=20, facecolors="none", edgecolors=color, gid=f"{run}: {op}")
            ax.plot([max(_median(values), floor)] * 2, [y - 0.38, y + 0.38], color="black", linewidth=2,
                    gid=f"{run}: {op}")  # fmt: skip
            _mark_outliers(ax, frame, run, op, list(zip(values, spread)), floor)
    _op_ticks(ax, layout, labels)
    ax.set_xscale("log")
    ax.margins(x=0.12)  # room for the outlier labels
    ax.set_xlabel(f"{frame.attrs['metric']} per step (us, log scale); bar: median; x: outlier")
    ax.legend(fontsize=8, loc="best")
    ax.set_title("every profiled step", fontsize=10)


def _mark_outliers(ax, frame: pd.DataFrame, run: str, op: str, points: list[tuple[float, float]],
                   floor: float) -> None:  # fmt: skip
    """An x on each outlier of this row, and one label (its largest: the HTML lists all) beside it,
    centred on its y so it stays in the op's band."""
    outliers = {(o["cycle"], o["step"]): o for o in frame.attrs.get("outliers", []) if (o["run"], o["op"]) == (run, op)}
    steps = frame.attrs["sample_steps" if op == TOTAL else "op_sample_steps"][run]
    marked = [(value, y, outliers[tuple(key)]) for key, (value, y) in zip(steps, points) if tuple(key) in outliers]
    for value, y, _ in marked:
        ax.scatter([max(value, floor)], [y], marker="x", s=60, color="#b3261e", zorder=3, gid=f"{run}: {op}")
    if marked:
        value, y, found = max(marked, key=lambda m: m[0])
        size = f"{found['times_median']:g}x" if found["times_median"] else "median 0"
        more = f" (+{len(marked) - 1})" if len(marked) > 1 else ""
        ax.annotate(f"step {found['step']}: {size}{more}", (max(value, floor), y), fontsize=7, color="#b3261e",
                    xytext=(6, 0), textcoords="offset points", va="center", gid=f"{run}: {op}")  # fmt: skip


def draw_ratios(ax, frame: pd.DataFrame, layout: Layout) -> None:
    base, noise = frame.attrs["baseline"], frame.attrs.get("noise_pct", 0) / 100
    ax.axvspan(1 - noise, 1 + noise, color="#888", alpha=0.15, linewidth=0)
    ax.axvline(1.0, color="#444", linewidth=1)
    for op, rows in layout.rows.items():
        for run, y in rows.items():
            row = frame.loc[op, run]
            ratio = row["ratio"]
            if run == base or not (ratio > 0 and math.isfinite(ratio)):
                continue
            color = VERDICT_COLORS.get(row["verdict"], "#666")
            if row["ratio_low"] == row["ratio_low"]:  # not NaN: an interval exists
                low, high = max(row["ratio_low"], 1e-6), row["ratio_high"]
                ax.plot([low, high if math.isfinite(high) else ratio * 10], [y, y], color=color, linewidth=2)
            hollow = row["verdict"] in (*UNJUDGED, INCONCLUSIVE)  # no verdict the interval could carry
            ax.scatter([ratio], [y], s=30, color="white" if hollow else color, edgecolors=color, zorder=3,
                       gid=f"{run}: {op}")  # fmt: skip
            ax.annotate(f"{run} {ratio:.2f} {row['verdict']}", (ratio, y), fontsize=7, color=color,
                        xytext=(5, -9), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    plain = FuncFormatter(lambda x, _: f"{x:g}")  # "2", not "2x10^0"
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(f"run / {base} (95% interval; grey band: +-noise)")
    ax.set_title("ratio to the baseline", fontsize=10)


def _op_ticks(ax, layout: Layout, labels: dict[str, str]) -> None:
    """Each op's label in the middle of its own rows; the first op (the TOTAL) at the top."""
    ax.set_yticks([layout.center(op) for op in layout.rows], [labels[op] for op in layout.rows], fontsize=8)
    ax.set_ylim(layout.bottom + 1, -1)


def _median(values: list[float]) -> float:
    ordered, half = sorted(values), len(values) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
