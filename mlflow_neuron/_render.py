"""A comparison frame for people: text, markdown, CSV, JSON, a PNG chart, a self-contained HTML page.

The HTML page inlines its data, styles and chart (a data URI), with no scripts or links: the MLflow
UI shows HTML artifacts in a sandboxed iframe where links to other artifacts do not resolve.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import pandas as pd

from ._compare import TOTAL, flat, summary


def _number(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.2f}"


def heading(frame: pd.DataFrame) -> str:
    text = f"self {'device' if frame.attrs['metric'] == 'self_device_time_us' else 'CPU'} time (us) per op, baseline {frame.attrs['baseline']}"
    return f"{text}; {frame.attrs['fallback']}" if frame.attrs.get("fallback") else text


def text(frame: pd.DataFrame, top: int | None = 15) -> str:
    return f"{heading(frame)}\n{summary(frame, top).to_string(float_format=_number, na_rep='-')}"


def markdown(frame: pd.DataFrame, top: int | None = 15) -> str:
    table = summary(frame, top)
    lines = [
        f"_{heading(frame)}_",
        "",
        "| op | " + " | ".join(map(str, table.columns)) + " |",
        "|---|" + "---:|" * len(table.columns),
    ]
    for op, row in table.iterrows():
        lines.append(f"| `{op}` | " + " | ".join(_number(v) for v in row) + " |")
    return "\n".join(lines)


def csv(frame: pd.DataFrame) -> str:
    return flat(frame).to_csv(index=False)


def as_json(frame: pd.DataFrame) -> str:
    rows = json.loads(flat(frame).to_json(orient="records"))
    return json.dumps({**frame.attrs, "rows": rows}, indent=1, default=str)


def png(frame: pd.DataFrame, path: Path, top: int = 12) -> Path:
    """Per-op time by run (grouped bars) and the runs' totals, rendered headless."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    times = frame.xs("time_us", axis=1, level="field")
    ops = times.drop(index=TOTAL).iloc[:top].iloc[::-1]
    runs = list(times.columns)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(ops) + 2.5), width_ratios=[3, 1])
    height = 0.8 / max(len(runs), 1)
    for index, run in enumerate(runs):
        positions = [i + index * height for i in range(len(ops))]
        left.barh(positions, ops[run].fillna(0), height=height, label=run)
    left.set_yticks([i + 0.4 - height / 2 for i in range(len(ops))], [_short(op) for op in ops.index], fontsize=8)
    left.set_xlabel(f"{frame.attrs['metric']} (us)")
    left.legend(fontsize=8)
    left.set_title(f"top {len(ops)} ops", fontsize=10)
    right.bar(runs, times.loc[TOTAL].fillna(0), color=[f"C{i}" for i in range(len(runs))])
    right.set_title(f"total {frame.attrs['metric']} (us)", fontsize=10)
    right.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(heading(frame), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def html_page(frame: pd.DataFrame, png_path: Path | None = None, top: int | None = 30) -> str:
    chart = ""
    if png_path is not None:
        data = base64.b64encode(Path(png_path).read_bytes()).decode()
        chart = f'<img alt="comparison chart" src="data:image/png;base64,{data}">'
    runs = "".join(
        f"<li><b>{html.escape(label)}</b>: run {html.escape(run_id)}, step {frame.attrs['steps'][label]}, "
        f"device {html.escape(str(frame.attrs['devices'][label]) or '?')}</li>"
        for label, run_id in frame.attrs["runs"].items()
    )
    table = summary(frame, top).to_html(float_format=_number, na_rep="-", border=0, classes="compact")
    full = flat(frame).to_html(index=False, float_format=_number, na_rep="-", border=0, classes="full")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>mlflow-neuron comparison</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 1em 0; }}
th, td {{ padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; font-family: monospace; }}
img {{ max-width: 100%; }}
.note {{ color: #8a4b00; }}
</style></head><body>
<h2>{html.escape(heading(frame))}</h2>
{f'<p class="note">{html.escape(frame.attrs["fallback"])}</p>' if frame.attrs.get("fallback") else ""}
<ul>{runs}</ul>
{chart}
{table}
<details><summary>every op, every field</summary>{full}</details>
</body></html>
"""


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def cycle_table(profile) -> str:
    """A cycle's op table in the layout of torch's `key_averages().table()`, from our numbers.

    torch's own table needs `prof.events()`, the full Python parse of the cycle (seconds on the
    training thread for 100k events); the fast path renders this one instead.
    """
    device = profile.device.upper()
    with_device = profile.device_time != "not_profiled"
    by_device = profile.device_time == "present"
    columns = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if with_device:
        columns += [f"Self {device}", f"Self {device} %", f"{device} total", f"{device} time avg"]
    columns.append("# of Calls")
    cpu_total, device_total = profile.total_self_cpu_time_us, profile.total_self_device_time_us
    rows = []
    for op in sorted(profile.ops, key=lambda o: -(o.self_device_time_us if by_device else o.self_cpu_time_us)):
        row = [op.name, _percent(op.self_cpu_time_us, cpu_total), _time(op.self_cpu_time_us),
               _percent(op.cpu_time_us, cpu_total), _time(op.cpu_time_us), _time(op.cpu_time_us / op.calls)]
        if with_device:
            row += [_time(op.self_device_time_us), _percent(op.self_device_time_us, device_total),
                    _time(op.device_time_us), _time(op.device_time_us / op.calls)]
        rows.append([*row, str(op.calls)])
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    widths[0] = min(widths[0], 120)
    line = "-" * (sum(widths) + 2 * (len(widths) - 1))

    def render(cells):
        name = str(cells[0])[: widths[0]]
        return "  ".join([name.ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:])])

    text = [line, render(columns), line, *map(render, rows), line, f"Self CPU time total: {_time(cpu_total)}"]
    if with_device:
        text.append(f"Self {device} time total: {_time(device_total)}")
    return "\n".join(text) + "\n"


def _time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _percent(part: float, whole: float) -> str:
    return f"{part / whole * 100:.2f}%" if whole else "0.00%"
