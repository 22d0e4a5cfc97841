"""A comparison frame for people: text, markdown, CSV, JSON, a PNG chart, a self-contained HTML page.

Tables show medians per step, the ratio to the baseline with its 95% interval, the verdict, n and
outliers; below them every outlier by name and the verdict in words. Displays shorten generated
names (`CompiledFxGraph f7xp…`); CSV and JSON keep the full names. The HTML page inlines its data,
styles and chart (a data URI), with no scripts or links: the MLflow UI shows HTML artifacts in a
sandboxed iframe where links to other artifacts do not resolve.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from .._analysis.explorer import summary_lines
from .._analysis.frame import bare, flat
from .._analysis.model import CPU_METRIC, DEVICE_METRIC, FASTER, INCONCLUSIVE, NO_CHANGE, SLOWER, TOO_FEW, TOO_FEW_CYCLES, TOTAL
from .._analysis.overview import overview_lines, overview_table
from .._analysis.throughput import coverage_lines, throughput_lines
from .._analysis.verdict import short_names
from .._analysis.weather import host_note
from .._record.model import cycle_dir

SHOWN_OUTLIERS = 20
METHOD_NOTE = (
    "Each run's samples are its profiled steps, over all cycles. Times are medians per step. "
    "The ratio is run / baseline (Hodges–Lehmann: the median of all pairwise ratios), with a "
    "distribution-free 95% interval (Moses, from the exact Mann–Whitney distribution). "
    "Verdict: faster or slower when the whole interval is on one side of 1.0 and the change is at "
    "least the noise threshold; no change otherwise; too few samples when no 95% interval exists "
    "(fewer than 4 steps per run, or single samples from runs logged before per-step samples). "
    "Cycles are checked first: when a run's cycles differ beyond the noise between its steps (a "
    "nested F test on log times, p < 0.2), each cycle is one sample and the interval is Welch's on "
    "the cycles' medians; with fewer than 3 cycles per run the verdict is too few cycles. Host time "
    "is inconclusive when either run's host had more than a quarter of its CPUs busy with other "
    "processes (the job's own child processes, such as compile or DataLoader workers, count as the job), "
    "or when the runs' loads differ by more than 0.5 cores; device time is judged on its "
    "own, with the host's load shown. The gate (--fail-if-slower PCT) fails only when the whole "
    "interval lies above +PCT, and, for host time, only for runs profiled in rotation by "
    "interleaved(), on a distribution-free interval over their cycles (5-7 or more each). "
    "A range's own time (ProfilerStep, a record_function region, a compiled graph) is the time "
    "inside it that no op took; its region with everything it runs is compared under regions. "
    "Outliers: steps more than 5 robust standard deviations (1.4826 · MAD, at least 1% of the "
    "median; more below 24 steps) from their run's median. They are named here and drawn in the "
    "chart; the medians keep them, the ratio and its interval leave them out, so one stall cannot "
    "decide a verdict."
)


def _number(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.2f}"


def _count(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def heading(frame: pd.DataFrame) -> str:
    what = {DEVICE_METRIC: "self device time", CPU_METRIC: "self CPU time"}.get(frame.attrs["metric"])
    text = (f"median {what} per step (us) per op" if what else "median peak memory per step (bytes above the "
            "step's starting level)") + f", baseline {frame.attrs['baseline']}"  # fmt: skip
    if frame.attrs.get("region"):
        kind = "device" if frame.attrs["metric"] == DEVICE_METRIC else "CPU"
        text = (f"region {frame.attrs['region']} (with all it runs) and the ops inside it: median {kind} time per "
                f"step (us), baseline {frame.attrs['baseline']}")  # fmt: skip
    if frame.attrs.get("skip_steps"):
        text += f", first {frame.attrs['skip_steps']} step(s) of each run left out"
    return f"{text}; {frame.attrs['fallback']}" if frame.attrs.get("fallback") else text


def table(frame: pd.DataFrame, top: int | None = 15) -> pd.DataFrame:
    """The display table (strings): per op the baseline's median, and per run its median, ratio
    with its 95% interval and verdict; then TOTAL, n, outliers and ATen calls per step."""
    base = frame.attrs["baseline"]
    runs = list(frame.columns.get_level_values("run").unique())
    ops = [op for op in frame.index if op != TOTAL][:top]
    region = frame.attrs.get("region")
    counts = frame.attrs["launches"] if region is not None else frame.attrs["aten_calls"]
    columns: dict[str, list[str]] = {}
    cells = bare(frame)
    for run in runs:
        columns[run] = [_number(cells.loc[op, (run, "time_us")]) for op in [*ops, TOTAL]]
        columns[run] += [_count(frame.attrs["n"][run]), _count(cells.loc[TOTAL, (run, "outliers")]), _count(counts[run])]
        if run == base:
            continue
        not_gated = run in (frame.attrs.get("not_gated") or {})
        columns[f"{run} ratio (95% CI)"] = [_ratio_cell(cells.loc[op, run]) for op in [*ops, TOTAL]] + ["", "", ""]
        columns[f"{run} verdict"] = [_verdict_cell(cells.loc[op, (run, "verdict")], not_gated)
                                     for op in [*ops, TOTAL]] + ["", "", ""]  # fmt: skip
    last = ("region " + region, "launches per step") if region is not None else (TOTAL, "ATen calls per step")
    wrappers = set(frame.attrs.get("wrappers", []))
    names = [f"{name} (range's own time)" if op in wrappers else name for op, name in zip(ops, short_names(ops))]
    index = [*names, last[0], "n (steps)", f"outlier steps ({last[0]})", last[1]]
    return pd.DataFrame(columns, index=index)


def _verdict_cell(verdict: str, not_gated: bool) -> str:
    return f"{verdict} (not gated)" if not_gated and verdict in (FASTER, SLOWER) else str(verdict)


def text(frame: pd.DataFrame, top: int | None = 15) -> str:
    return "\n".join([*_overview(frame), heading(frame), table(frame, top).to_string(), *_notes(frame)])


def _overview(frame: pd.DataFrame) -> list[str]:
    """Every run's row from its summary metrics, before the detailed table (a comparison of many runs)."""
    return overview_lines(frame.attrs["many"]) if frame.attrs.get("many") else []


def markdown(frame: pd.DataFrame, top: int | None = 15) -> str:
    shown = table(frame, top)
    lines = [
        *(["```", *_overview(frame)[:-1], "```", ""] if frame.attrs.get("many") else []),
        f"_{heading(frame)}_",
        "",
        "| op | " + " | ".join(map(str, shown.columns)) + " |",
        "|---|" + "---:|" * len(shown.columns),
    ]
    for op, row in shown.iterrows():
        lines.append(f"| `{op}` | " + " | ".join(row) + " |")
    return "\n".join([*lines, *_notes(frame)])


def csv(frame: pd.DataFrame) -> str:
    return flat(frame).to_csv(index=False)


def as_json(frame: pd.DataFrame) -> str:
    rows = json.loads(flat(frame).to_json(orient="records"))
    return json.dumps({**frame.attrs, "rows": rows}, indent=1, default=str)


def outlier_lines(frame: pd.DataFrame, limit: int = SHOWN_OUTLIERS) -> list[str]:
    """Every outlier by run, step and op, with its size against its run's median; the ones that
    cost the most time first (a 6 ms stall before a 40x blip of a 0.04 us op)."""
    found = sorted(frame.attrs.get("outliers", []), key=lambda o: -abs(o["value_us"] - o["median_us"]))
    names = dict(zip(frame.index, short_names(list(frame.index))))
    if frame.attrs.get("region"):
        names[TOTAL] = f"region {frame.attrs['region']}"
    unit = "bytes" if frame.attrs.get("metric") == "peak_memory_bytes" else "us"
    lines = [
        f"{o['run']} step {o['step']} ({_cycle(o, frame)}) {names.get(o['op'], o['op'])}: {o['value_us']:,.3f} {unit}, "
        + (f"{o['times_median']:g}x its median {o['median_us']:,.3f} {unit}" if o["times_median"] else "median 0")
        for o in found[:limit]
    ]
    if len(found) > limit:
        lines.append(f"... and {len(found) - limit} more (all in the JSON output)")
    return lines


def _cycle(outlier: dict, frame: pd.DataFrame) -> str:
    """`cycle 4 of 4, profiler/step_32`: its place among the run's cycles, and where its files are;
    `, captured: baseline` where the run says why that cycle was captured."""
    why = capture_reason(frame, outlier["run"], outlier["cycle"])
    captured = f", captured: {why}" if why else ""
    if outlier.get("cycle_index") is None:
        return f"cycle at step {outlier['cycle']}{captured}"
    return f"cycle {outlier['cycle_index']} of {outlier['cycles']}, {cycle_dir(outlier['cycle'])}{captured}"


def capture_reason(frame: pd.DataFrame, run: str, cycle: int | None) -> str | None:
    """Why the run's cycle (the step it was logged at) was captured, where `callback.schedule()` said."""
    reasons = (frame.attrs.get("capture_reasons") or {}).get(run) or {}
    return reasons.get(cycle, reasons.get(str(cycle)))  # int keys; str once the attrs went through JSON


def capture_lines(frame: pd.DataFrame) -> list[str]:
    """`fused profiler/step_320: step time 21.0 → 35.2 ms from step 300`: each compared cycle that
    has a reason, by run; [] where no run has one (a schedule of the user's own)."""
    return [f"{run} {cycle_dir(int(cycle))}: {why}"
            for run, reasons in (frame.attrs.get("capture_reasons") or {}).items() for cycle, why in reasons.items()]


def outlier_counts(frame: pd.DataFrame) -> str:
    """`naive 35, fused 46`: each run's outlier samples over every row (op samples and total steps)."""
    counts = {run: 0 for run in frame.attrs.get("runs", {})}
    for o in frame.attrs.get("outliers", []):
        counts[o["run"]] = counts.get(o["run"], 0) + 1
    return ", ".join(f"{run} {count}" for run, count in counts.items())


def _notes(frame: pd.DataFrame) -> list[str]:
    notes = []
    outliers = outlier_lines(frame)
    if outliers:
        notes += ["", f"outliers, samples of any row ({outlier_counts(frame)}; in the medians and the charts, left out "
                  "of the ratios):", *(f"  {line}" for line in outliers)]  # fmt: skip
    host = host_note(frame.attrs.get("host") or {})
    if host:
        notes += ["", host]
    if frame.attrs.get("sentences"):
        notes += ["", *frame.attrs["sentences"].values()]
    for title, lines in explanations(frame):
        notes += ["", f"{title}:", *(f"  {line}" for line in lines)]
    return notes


def explanations(frame: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(title, lines) of what says why: achieved bandwidth, Neuron Explorer's fields, each region's sentence."""
    found = []
    if frame.attrs.get("capture_reasons"):
        found.append(("why each cycle compared was captured (callback.schedule())", capture_lines(frame)))
    if frame.attrs.get("throughput"):
        found.append(("achieved bandwidth (the last cycle's ops.json, recorded shapes)",
                      throughput_lines(frame.attrs["throughput"], frame.attrs.get("region"),
                                       frame.attrs.get("throughput_missing"))))  # fmt: skip
    if frame.attrs.get("bytes_coverage"):
        found.append(("what those figures cover (the last cycle's op device time with bytes, and the largest ops without)",
                      coverage_lines(frame.attrs["bytes_coverage"])))  # fmt: skip
    if frame.attrs.get("neuron_summary"):
        found.append(("Neuron Explorer's summary, the last cycle (percent, bytes, seconds; [the field read])",
                      summary_lines(frame.attrs["neuron_summary"])))  # fmt: skip
    if frame.attrs.get("neuron_versions"):
        found.append(("the runs' Neuron tools differ (version tags from Explorer's Metadata)", frame.attrs["neuron_versions"]))
    if frame.attrs.get("regions"):
        found.append(("regions (each record_function range with all it runs; --region NAME lists the ops inside)",
                      [line for lines in frame.attrs["regions"].values() for line in lines.values()]))  # fmt: skip
    return found


def _ratio_cell(row: pd.Series) -> str:
    if pd.isna(row["ratio"]):
        return "-"
    if row["verdict"] in (TOO_FEW, TOO_FEW_CYCLES):
        return f"{row['ratio']:.2f} [no CI]"
    if row["ratio_low"] == row["ratio_high"]:
        return f"{row['ratio']:.2f} [exact]"
    return f"{row['ratio']:.2f} [{row['ratio_low']:.2f}–{row['ratio_high']:.2f}]"


def png(frame: pd.DataFrame, path: Path, top: int = 8) -> Path:
    """The chart (see `chart`): every per-step sample with medians and outliers, and run / baseline
    with its 95% interval, for the TOTAL and the `top` costliest ops. Returns `path`."""
    from . import chart  # matplotlib loads only when a chart is drawn

    return chart.png(frame, Path(path), heading(frame), top)


def html_page(frame: pd.DataFrame, png_path: Path | None = None, top: int | None = 30, *,
              timelines: Mapping | None = None) -> str:  # fmt: skip
    """The report page. `timelines` ({label: StepTimeline}, from `load_timelines`) adds one
    representative step per run as an inline SVG timeline."""
    chart = ""
    if png_path is not None:
        data = base64.b64encode(Path(png_path).read_bytes()).decode()
        chart = f'<img alt="comparison chart: samples per step and ratios with 95% intervals" src="data:image/png;base64,{data}">'
    runs = "".join(
        f"<li><b>{html.escape(label)}</b>: run {html.escape(run_id)}, step {frame.attrs['steps'][label]}"
        f"{html.escape(_captured(frame, label, frame.attrs['steps'][label]))}, "
        f"{frame.attrs['n'][label]} samples ({html.escape(str(frame.attrs['sources'][label]))}), "
        f"device {html.escape(str(frame.attrs['devices'][label]) or '?')}</li>"
        for label, run_id in frame.attrs["runs"].items()
    )
    sentences = "".join(f"<li>{html.escape(s)}</li>" for s in frame.attrs.get("sentences", {}).values())
    host = host_note(frame.attrs.get("host") or {})
    outliers = "".join(f"<li>{html.escape(line)}</li>" for line in outlier_lines(frame, limit=100))
    shown = table(frame, top)
    rows = "".join(
        f"<tr><td>{html.escape(str(op))}</td>" + "".join(f'<td class="{_css(v)}">{html.escape(v)}</td>' for v in row) + "</tr>"
        for op, row in shown.iterrows()
    )
    header = "<tr><th>op</th>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns) + "</tr>"
    full = flat(frame).to_html(index=False, float_format=lambda v: f"{v:,.3f}", na_rep="-", border=0, classes="full")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>mlflow-neuron comparison</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 1em 0; }}
th, td {{ padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; font-family: monospace; }}
img {{ max-width: 100%; }} .timeline {{ overflow-x: auto; }}
.note {{ color: #8a4b00; }} .faster {{ color: #1a7f37; }} .slower {{ color: #b3261e; font-weight: bold; }}
.nochange {{ color: #666; }} .toofew {{ color: #8a4b00; }}
</style></head><body>
<h2>{html.escape(heading(frame))}</h2>
{f'<p class="note">{html.escape(frame.attrs["fallback"])}</p>' if frame.attrs.get("fallback") else ""}
{_overview_html(frame)}
<ul class="verdicts">{sentences}</ul>
<ul>{runs}</ul>
{f'<p class="note">{html.escape(host)}</p>' if host else ""}
{chart}
<table class="compact">{header}{rows}</table>
{"".join(f"<h3>{html.escape(title)}</h3><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>"
         for title, lines in explanations(frame))}
<h3>Outliers{html.escape(": samples of any row, " + outlier_counts(frame)) if outliers else ""}</h3>
{f"<ul>{outliers}</ul>" if outliers else "<p>none</p>"}
<h3>How to read this</h3>
<p>{html.escape(METHOD_NOTE)}</p>
<details><summary>every op, every field (full names)</summary>{full}</details>
{_timelines_html(timelines, frame) if timelines is not None else ""}
</body></html>
"""


TIMELINE_NOTE = (
    "One step per run: the profiled step whose total is closest to the run's median. Rows: host "
    "threads (nested ops, one row per depth), then device streams with the kernels the step's ops "
    "launched. Hover a box for its name and times. Cycles with more spans than timeline_max_spans "
    "show the shortest ops as grey \u201c\u2026 N more ops\u201d boxes."
)


def _captured(frame: pd.DataFrame, run: str, cycle: int | None) -> str:
    why = capture_reason(frame, run, cycle)
    return f" (captured: {why})" if why else ""


def _timelines_html(timelines: Mapping, frame: pd.DataFrame) -> str:
    from .timeline_svg import timeline_svg

    parts = [f"<h3>Timelines</h3><p>{html.escape(TIMELINE_NOTE)}</p>"]
    for label, chosen in timelines.items():
        if chosen.timeline is None:
            parts.append(f'<h4>{html.escape(label)}</h4><p class="note">no timeline: {html.escape(chosen.note)}</p>')
            continue
        why = capture_reason(frame, label, chosen.cycle)
        cycle = f"cycle {chosen.cycle}" + (f", captured: {why}" if why else "")
        parts.append(f"<h4>{html.escape(label)}: step {chosen.step} ({html.escape(cycle)}): "
                     f"{html.escape(chosen.note)}</h4>")  # fmt: skip
        parts.append(f'<div class="timeline">{timeline_svg(chosen.timeline, chosen.step)}</div>')
    return "\n".join(parts)


def _overview_html(frame: pd.DataFrame) -> str:
    if not frame.attrs.get("many"):
        return ""
    lines = overview_lines(frame.attrs["many"])
    return (f"<h3>{html.escape(lines[0])}</h3>{overview_table(frame.attrs['many']).to_html(border=0)}"
            + "".join(f'<p class="note">{html.escape(line)}</p>' for line in lines[3:] if line))  # fmt: skip


def _css(cell: str) -> str:
    return {FASTER: "faster", SLOWER: "slower", NO_CHANGE: "nochange", TOO_FEW: "toofew", TOO_FEW_CYCLES: "toofew",
            INCONCLUSIVE: "toofew"}.get(cell, "toofew" if cell.endswith("(not gated)") else "")  # fmt: skip
