"""`mlflow-neuron ranks` as text: one row per rank, then the sentence and what was left out (pure).

Example::

    print(text(read.report_json, run_id, closing_lines_of(read)))

Everything printed comes from the report's JSON (`_analysis.ranks.analysis.RankReport.to_json()`, the shape
`--format json` prints), so the three formats can never disagree. Times are medians per step, in
microseconds, as in `compare`.
"""

from __future__ import annotations

import math

from ..._record.model import cycle_dir

SHOWN_UNMATCHED = 5
COLUMNS = ["rank", "host", "step time (us)", "95% interval", "collectives (us)", "wait (us)", "exposed comm %",
           "idle %"]  # fmt: skip


BUBBLE = "recv bubble (us)"  # a column only where a rank received from a pipeline stage


def columns(report: dict) -> list[str]:
    """The table's columns: `COLUMNS`, with the receives' wait after the wait where a rank has one."""
    if any(r.get("bubble_us") is not None for r in report["ranks"]):
        return COLUMNS[:6] + [BUBBLE] + COLUMNS[6:]
    return COLUMNS


def rows(report: dict) -> list[list[str]]:
    """The table's cells, one row per rank, in rank order."""
    found, bubble = [], BUBBLE in columns(report)
    for r in sorted(report["ranks"], key=lambda r: r["rank"]):
        step = r["step_time_us"]
        found.append([str(r["rank"]), r.get("host") or "-", _us(step.get("median")), _interval(step),
                      _us(r.get("collective_us")), _us(r.get("wait_us")),
                      *([_us(r.get("bubble_us"))] if bubble else []), _pct(r.get("exposed_comm_pct")),
                      _pct(r.get("idle_pct"))])  # fmt: skip
    return found


def heading(report: dict, run_id: str) -> str:
    size = report["world_size"]
    ranks = "one rank (a single process: no other rank to wait for)" if size == 1 else f"{size} ranks"
    return f"run {run_id}: {ranks}; medians per step"


def closing_lines(sentence: str | None, unmatched: list[dict], notes: list[str]) -> list[str]:
    """The sentence (it names the ranks that sent nothing), then the collectives not matched across
    ranks and what else was left out."""
    lines = [sentence] if sentence else []
    for item in unmatched[:SHOWN_UNMATCHED]:
        lines.append(f"not matched across ranks: {_unmatched(item)}")
    if len(unmatched) > SHOWN_UNMATCHED:
        lines.append(f"... and {len(unmatched) - SHOWN_UNMATCHED} more collectives not matched (all in the JSON output)")
    return lines + list(notes)


def _unmatched(item: dict) -> str:
    where = ", ".join(f"{k} {item[k]}" for k in ("group", "step", "seq") if item.get(k) is not None)
    ranks = item.get("on_ranks")
    on = f" on rank{'s' if ranks and len(ranks) > 1 else ''} {_list(ranks)}" if ranks else ""
    why = f": {item['why']}" if item.get("why") else ""
    return f"{item.get('name') or 'a collective'}{f' ({where})' if where else ''}{on}{why}"


def text(report: dict, run_id: str, closing: list[str] = ()) -> str:
    cells = [columns(report), *rows(report)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.rjust(w) if i not in (1,) else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]  # fmt: skip
    return "\n".join([heading(report, run_id), *lines, "", *closing])


def markdown(report: dict, run_id: str, closing: list[str] = ()) -> str:
    body = ["| " + " | ".join(row) + " |" for row in rows(report)]
    return "\n".join([f"_{heading(report, run_id)}_", "", "| " + " | ".join(columns(report)) + " |",
                      "|" + "---:|" * len(columns(report)), *body, "",
                      *(f"- {line}" for line in closing)])  # fmt: skip


def _list(items: list) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _us(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.0f}"


def _pct(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def _interval(step: dict) -> str:
    low, high = step.get("low"), step.get("high")
    if low is None or high is None:
        return "-"
    return f"{low:,.0f}\u2013{high:,.0f}"


def closing_lines_of(read) -> list[str]:
    """What `ranks` prints under its table for a `RankRead`: the sentence (it names ranks that sent
    nothing), the collectives not matched across ranks, what was left out, and why each cycle read
    was captured (where `callback.schedule()` said)."""
    report = read.report
    captured = [f"{cycle_dir(cycle)} captured: {why}" for cycle, why in read.capture_reasons.items()]
    return closing_lines(report.sentence, list(report.unmatched), [*report.notes, *read.notes, *captured])
