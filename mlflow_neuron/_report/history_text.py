"""A history in words, tables and one chart (`history_runs`' frame in, text or files out).

Example::

    print(text(frame)); path = png(frame, Path("history.png")); page = html_page(frame, path)
"""

from __future__ import annotations

import base64
import html
import json
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .._analysis.model import CPU_METRIC, DEVICE_METRIC
from .._analysis.verdict import MINUS
from .._record.model import cycle_dir

SHOWN_CAPTURES = 20  # cycles whose reason the text names, the latest runs' (the JSON has every one)
CAPTURES_TITLE = "why each cycle was captured (callback.schedule())"
_COLUMNS = ["run_name", "start", "commit", "n", "median", "95% interval", "segment"]


def heading(frame: pd.DataFrame) -> str:
    what = {DEVICE_METRIC: "self device time", CPU_METRIC: "self CPU time",
            "wait_us": "wait in collectives (the median over the ranks, from the rank summaries)"}.get(frame.attrs["metric"], "peak memory")
    unit = "bytes" if frame.attrs["metric"] == "peak_memory_bytes" else "us"
    text = (f"history of {frame.attrs['experiment']}: {len(frame)} runs, {frame.attrs['subject']}, median "
            f"{what} per step ({unit}), in start order")  # fmt: skip
    if frame.attrs.get("without_rank_summaries"):
        text += f"; {frame.attrs['without_rank_summaries']} runs without rank summaries left out"
    return f"{text}; {frame.attrs['fallback']}" if frame.attrs.get("fallback") else text


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "run_name": frame["run_name"], "start": [_when(t) for t in frame["start_time"]],
        "commit": [c[:12] or "-" for c in frame["commit"]], "n": frame["n"],
        "median": [f"{v:,.2f}" for v in frame["median"]],
        "95% interval": [f"{lo:,.2f}\u2013{hi:,.2f}" if pd.notna(lo) and lo is not None else "-"
                         for lo, hi in zip(frame["low"], frame["high"])],
        "segment": frame["segment"],
    })[_COLUMNS]  # fmt: skip


def change_lines(frame: pd.DataFrame) -> list[str]:
    """One paragraph per change: where, by how much, what else changed, what accounts for it."""
    if not frame.attrs["changes"]:
        return [no_change_line(frame)]
    lines = []
    for c in frame.attrs["changes"]:
        low, high = (_pct(c["ratio_low"]), _pct(c["ratio_high"]))
        lines.append(
            f"{c['verdict'].upper()} {_pct(c['ratio'])}% (95% CI {low}\u2026{high}%, {c['runs_before']} runs before vs "
            f"{c['runs_after']} after) between {c['before_run_name']} ({c['before_run_id'][:8]}, "
            f"{_when(c['before_start_time'])}, commit {c['before_commit'][:12] or '?'}) and {c['after_run_name']} "
            f"({c['after_run_id'][:8]}, {_when(c['after_start_time'])}, commit {c['after_commit'][:12] or '?'})"
            + (f"; {', '.join(c['environment'])}" if c["environment"] else "") + f". {c['sentence']}"
        )  # fmt: skip
    return lines


def straggler_lines(frame: pd.DataFrame) -> list[str]:
    """The straggler line, where one rank or host was the straggler in most of the latest runs."""
    line = frame.attrs.get("straggler_line")
    return [f"STRAGGLER {line}"] if line else []


def capture_lines(frame: pd.DataFrame, limit: int | None = SHOWN_CAPTURES) -> list[str]:
    """`nightly-7 (3f2a9c1e) profiler/step_320: step time 21.0 → 35.2 ms from step 300`, for each
    cycle of the series' runs that says why it was captured, in run order (the latest `limit`); []
    where no run does."""
    reasons = frame.attrs.get("capture_reasons") or {}
    names = dict(zip(frame["run_id"], frame["run_name"])) if reasons else {}
    lines = [f"{names.get(run_id, run_id)} ({run_id[:8]}) {cycle_dir(int(cycle))}: {why}"
             for run_id in frame["run_id"] if run_id in reasons for cycle, why in reasons[run_id].items()]  # fmt: skip
    if limit is None or len(lines) <= limit:
        return lines
    return [f"... {len(lines) - limit} earlier (all in the JSON output)", *lines[-limit:]]


def no_change_line(frame: pd.DataFrame) -> str:
    """Which of the three it was: no search (too few runs), no change point suggested, or every one
    suggested inside the noise band."""
    suggested, band = frame.attrs.get("suggested", 0), f"\u00b1{frame.attrs['noise_pct']:g}%"
    if frame.attrs.get("not_searched"):
        return f"no change looked for: {frame.attrs['not_searched']}"
    if not suggested:
        return "no change: the series suggested no change point (the runs' levels stay within their run-to-run noise)"
    return (f"no change: the series suggested {suggested} change point{'s' if suggested > 1 else ''}, and "
            f"{'each' if suggested > 1 else 'it'} stayed within {band} (95% interval)")


def read_lines(frame: pd.DataFrame) -> list[str]:
    """How the runs' numbers were read: the runs that took the slow path, and any run whose
    summary metrics its tables contradicted."""
    slow, lines = frame.attrs.get("slow_path_runs", 0), []
    if slow:
        lines.append(f"{slow} of {len(frame)} runs have no summary metrics (logged before them, or read with --tables, "
                     "--op or peak memory): read from their tables, the slow path")  # fmt: skip
    for run in frame.attrs.get("contradicting", []):
        lines.append(f"run {run['run_name']} ({run['run_id'][:8]}): its summary metrics (median {run['summary']['median']:,.2f}"
                     f", {run['summary']['n']} steps) disagree with its tables (median {run['tables']['median']:,.2f}, "
                     f"{run['tables']['n']} steps); its tables are used")  # fmt: skip
    return lines


def text(frame: pd.DataFrame) -> str:
    notes = read_lines(frame)
    captures = capture_lines(frame)
    captures = ["", f"{CAPTURES_TITLE}:", *(f"  {line}" for line in captures)] if captures else []
    return "\n".join([heading(frame), table(frame).to_string(index=False), "", *change_lines(frame),
                      *straggler_lines(frame), *captures, *([""] + notes if notes else [])])  # fmt: skip


def markdown(frame: pd.DataFrame) -> str:
    shown = table(frame)
    rows = ["| " + " | ".join(map(str, row)) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([f"_{heading(frame)}_", "", "| " + " | ".join(_COLUMNS) + " |", "|---" * len(_COLUMNS) + "|",
                      *rows, "", *(f"- {line}" for line in [*change_lines(frame), *straggler_lines(frame), *read_lines(frame)]),
                      *_titled(CAPTURES_TITLE, [f"- {line}" for line in capture_lines(frame)])])  # fmt: skip


def as_json(frame: pd.DataFrame) -> str:
    runs = json.loads(frame.to_json(orient="records"))
    return json.dumps({**{k: v for k, v in frame.attrs.items() if k != "changes"}, "changes": frame.attrs["changes"],
                       "runs": runs}, indent=1, default=str)  # fmt: skip


def png(frame: pd.DataFrame, path: Path) -> Path:
    """Each run's median with its interval, in run order; segments' medians as lines, change points as
    dashed lines, commits (else run names) on the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = range(len(frame))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(frame) + 2), 4.5))
    low = [m - lo if pd.notna(lo) else 0 for m, lo in zip(frame["median"], frame["low"])]
    high = [hi - m if pd.notna(hi) else 0 for m, hi in zip(frame["median"], frame["high"])]
    ax.errorbar(x, frame["median"], yerr=[low, high], fmt="o", color="#1f77b4", ecolor="#9ecae1", capsize=3,
                label="run median, 95% interval")  # fmt: skip
    for segment, rows in frame.reset_index(drop=True).groupby("segment"):
        ax.hlines(rows["median"].median(), rows.index.min() - 0.4, rows.index.max() + 0.4, colors="#555", linewidth=2,
                  label="segment's median of run medians" if segment == 0 else None)  # fmt: skip
    for c in frame.attrs["changes"]:
        at = frame.index[frame["run_id"] == c["after_run_id"]][0]
        ax.axvline(at - 0.5, color="#b3261e" if c["verdict"] == "slower" else "#1a7f37", linestyle="--")
        ax.text(at - 0.4, 0.98, f"{c['verdict']} {_pct(c['ratio'])}%", transform=ax.get_xaxis_transform(), fontsize=8,
                ha="left", va="top", color="#b3261e" if c["verdict"] == "slower" else "#1a7f37")  # fmt: skip
    labels = [c[:8] if c else str(n) for c, n in zip(frame["commit"], frame["run_name"])]
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(heading(frame).split("median ", 1)[1].split(", in")[0])
    ax.set_title("\n".join(textwrap.wrap(heading(frame), 100)), fontsize=9)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def html_page(frame: pd.DataFrame, png_path: Path | None) -> str:
    chart = ""
    if png_path is not None:
        data = base64.b64encode(Path(png_path).read_bytes()).decode()
        chart = f'<img alt="history chart" src="data:image/png;base64,{data}">'
    changes = "".join(f"<li>{html.escape(line)}</li>"
                      for line in [*change_lines(frame), *straggler_lines(frame), *read_lines(frame)])
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>mlflow-neuron history</title></head><body>'
            f"<h2>{html.escape(heading(frame))}</h2><ul>{changes}</ul>{chart}"
            f"{table(frame).to_html(index=False, border=0)}{_captures_html(frame)}</body></html>")  # fmt: skip


def _captures_html(frame: pd.DataFrame) -> str:
    lines = capture_lines(frame, limit=None)
    return (f"<h3>{html.escape(CAPTURES_TITLE)}</h3><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines)
            + "</ul>") if lines else ""


def _titled(title: str, lines: list[str]) -> list[str]:
    return ["", f"_{title}:_", "", *lines] if lines else []


def _pct(ratio: float) -> str:
    value = (ratio - 1) * 100
    return (f"{value:+.0f}" if abs(value) >= 10 else f"{value:+.1f}").replace("-", MINUS)


def _when(ms) -> str:
    return datetime.fromtimestamp(int(ms) / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M") if ms else "-"
