"""The two panels of the comparison PNG (matplotlib axes in, nothing out).

Samples go on a log axis: a 10x stall then sits visibly apart instead of squashing every other
point into one pixel, and each outlier carries a label with its step and size. Zeros (an op
absent in a step) are drawn at the axis' left edge as open circles.
"""

from __future__ import annotations

import math

from matplotlib.ticker import FuncFormatter

from .._compare.model import FASTER, SLOWER, TOO_FEW, TOTAL

VERDICT_COLORS = {FASTER: "#1a7f37", SLOWER: "#b3261e", TOO_FEW: "#c77c00"}
_ROW_GAP = 1  # empty row between ops


def row_of(op_index: int, run_index: int, runs: int) -> float:
    return op_index * (runs + _ROW_GAP) + run_index


def draw_samples(ax, frame, ops: list[str], runs: list[str], labels: dict[str, str]) -> None:
    samples = frame.attrs["samples"]
    shown = [v for run in runs for op in ops for v in samples[run].get(op, []) if v > 0]
    floor = min(shown) / 2 if shown else 1.0
    outliers = {(o["run"], o["op"], o["cycle"], o["step"]): o for o in frame.attrs.get("outliers", [])}
    for i, op in enumerate(ops):
        for j, run in enumerate(runs):
            values = samples[run].get(op)
            if not values:
                continue
            y = row_of(i, j, len(runs))
            spread = [y + ((k * 0.618) % 1 - 0.5) * 0.5 for k in range(len(values))]  # fixed jitter
            xs = [max(v, floor) for v in values]
            ax.scatter(xs, spread, s=14, color=f"C{j}", alpha=0.55, linewidths=0,
                       label=run if i == 0 else None)  # fmt: skip
            zeros = [(x, yy) for x, yy, v in zip(xs, spread, values) if v <= 0]
            if zeros:
                ax.scatter(*zip(*zeros), s=20, facecolors="none", edgecolors=f"C{j}")
            median = sorted(values)[len(values) // 2] if len(values) % 2 else _mid(sorted(values))
            ax.plot([max(median, floor)] * 2, [y - 0.38, y + 0.38], color="black", linewidth=2)
            steps = frame.attrs["sample_steps" if op == TOTAL else "op_sample_steps"][run]
            marked = [(value, yy, outliers[(run, op, *key)]) for key, value, yy in zip(map(tuple, steps), values, spread)
                      if (run, op, *key) in outliers]  # fmt: skip
            for value, yy, _ in marked:
                ax.scatter([max(value, floor)], [yy], marker="x", s=60, color="#b3261e", zorder=3)
            if marked:  # one label per row (its largest outlier) stays readable; the HTML lists all
                value, yy, found = max(marked, key=lambda m: m[0])
                size = f"{found['times_median']:g}x" if found["times_median"] else "median 0"
                more = f" (+{len(marked) - 1})" if len(marked) > 1 else ""
                ax.annotate(f"step {found['step']}: {size}{more}", (max(value, floor), yy), fontsize=7,
                            color="#b3261e", xytext=(4, 3), textcoords="offset points")  # fmt: skip
    _op_ticks(ax, ops, runs, labels)
    ax.set_xscale("log")
    ax.margins(x=0.12)  # room for the outlier labels
    ax.set_xlabel(f"{frame.attrs['metric']} per step (us, log scale); bar: median; x: outlier")
    ax.legend(fontsize=8, loc="best")
    ax.set_title("every profiled step", fontsize=10)


def draw_ratios(ax, frame, ops: list[str], runs: list[str]) -> None:
    base, noise = frame.attrs["baseline"], frame.attrs.get("noise_pct", 0) / 100
    ax.axvspan(1 - noise, 1 + noise, color="#888", alpha=0.15, linewidth=0)
    ax.axvline(1.0, color="#444", linewidth=1)
    for i, op in enumerate(ops):
        for j, run in enumerate(runs):
            row = frame.loc[op, run]
            ratio = row["ratio"]
            if run == base or not (ratio > 0 and math.isfinite(ratio)):
                continue
            y = row_of(i, j, len(runs))
            color = VERDICT_COLORS.get(row["verdict"], "#666")
            if row["ratio_low"] == row["ratio_low"]:  # not NaN: an interval exists
                low, high = max(row["ratio_low"], 1e-6), row["ratio_high"]
                ax.plot([low, high if math.isfinite(high) else ratio * 10], [y, y], color=color, linewidth=2)
            hollow = row["verdict"] == TOO_FEW
            ax.scatter([ratio], [y], s=30, color="white" if hollow else color, edgecolors=color, zorder=3)
            ax.annotate(f"{run} {ratio:.2f} {row['verdict']}", (ratio, y), fontsize=7, color=color,
                        xytext=(5, -9), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    plain = FuncFormatter(lambda x, _: f"{x:g}")  # "2", not "2x10^0"
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(f"run / {base} (95% interval; grey band: +-noise)")
    ax.set_title("ratio to the baseline", fontsize=10)


def _op_ticks(ax, ops, runs, labels) -> None:
    centers = [row_of(i, 0, len(runs)) + (len(runs) - 1) / 2 for i in range(len(ops))]
    ax.set_yticks(centers, [labels[op] for op in ops], fontsize=8)
    ax.set_ylim(row_of(len(ops), 0, len(runs)) - 0.5, -1)  # first op (the TOTAL) at the top


def _mid(ordered: list[float]) -> float:
    half = len(ordered) // 2
    return (ordered[half - 1] + ordered[half]) / 2
