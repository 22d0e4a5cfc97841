"""One profiler step of a `Timeline` as an inline SVG Gantt, for the HTML report. Pure.

Example::

    step = representative_step(step_durations_us(timeline))   # `_analysis.timeline_step`
    html_fragment = timeline_svg(timeline, step)

Rows: one band per host thread (nested ops one row per depth), then one per device stream.
Each box has a `<title>` (name, duration, self times), so hovering shows it without scripts.
No scripts, no links, no external fonts or styles: the page stays self-contained and renders in
MLflow's sandboxed artifact viewer.
"""

from __future__ import annotations

import hashlib
import math
from html import escape

from .._trace.timeline import STEP, STREAM, SUMMARY, Timeline

_LABEL_W, _AXIS_H, _PAD = 150, 24, 6
_CHAR_W = 6.2  # px per character of the 11px sans-serif labels, for clipping


def timeline_svg(timeline: Timeline, step: int | None = None, *, width: int = 960, row_height: int = 16) -> str:
    """The step's ops (its span subtree) and the kernels they launched, as an `<svg>` string.
    `step=None` draws the whole cycle."""
    spans = timeline.spans
    top, host, device = _drawn(timeline, step)
    drawn = host + device
    t0 = min(spans[i].start_ns for i in drawn)
    t1 = max(spans[i].end_ns for i in drawn)
    scale = (width - _LABEL_W - _PAD) / max(t1 - t0, 1)
    parts, y = [], _AXIS_H
    for label, items in _rows(spans, top, host, device):
        band = max(r for _, r in items) + 1
        parts.append(f'<text x="4" y="{y + 12}" class="l">{escape(_clip(label, _LABEL_W - 8))}</text>')
        for i, r in sorted(items, key=lambda item: spans[item[0]].kind != SUMMARY):  # summaries beneath
            x = _LABEL_W + (spans[i].start_ns - t0) * scale
            w = max((spans[i].end_ns - spans[i].start_ns) * scale, 0.5)
            parts.append(_box(spans[i], x, w, y + r * row_height, row_height))
        y += band * row_height + _PAD
        parts.append(f'<line x1="0" x2="{width}" y1="{y - _PAD / 2:.1f}" y2="{y - _PAD / 2:.1f}" class="g"/>')
    height = y + 4
    title = spans[top].name if step is None else f"{spans[top].name} ({(t1 - t0) / 1000:,.1f} \u00b5s)"
    axis = _axis(t1 - t0, scale, height)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        "<style>text{font:11px sans-serif;fill:#222}.l{font-weight:bold}.t{fill:#555}"
        ".g{stroke:#ddd}.a{stroke:#bbb}rect{stroke:#fff;stroke-width:.5}</style>"
        f"<title>{escape(title)}</title>{axis}{''.join(parts)}</svg>"
    )


def _drawn(timeline: Timeline, step: int | None) -> tuple[int, list[int], list[int]]:
    """(the step's span, or 0 for the whole cycle; its host spans; the device spans to draw)."""
    spans = timeline.spans
    if step is None:
        top = 0
    else:
        matches = [i for i, s in enumerate(spans) if s.kind == STEP and s.attributes.get("step") == step]
        if not matches:
            raise ValueError(f"step {step} is not in this timeline")
        top = matches[0]
    host = [i for i in _subtree(spans, timeline.children(), top) if i != 0]
    # Device work: kernels the drawn ops launched, and device spans starting within the range
    # (kernels whose launching op was summarized away; the stream's own summaries).
    ids = {spans[i].attributes.get("correlation_id") for i in host} - {None}
    lo, hi = spans[top].start_ns, spans[top].end_ns
    device = [i for i, s in enumerate(spans) if s.parent >= 0 and spans[s.parent].kind == STREAM
              and (top == 0 or s.attributes.get("correlation_id") in ids or lo <= s.start_ns < hi)]  # fmt: skip
    return top, host, device


def _rows(spans, top: int, host: list[int], device: list[int]) -> list[tuple[str, list[tuple[int, int]]]]:
    """(label, [(span, row within the band)]) per band: host threads (one row per depth), then streams."""
    by_thread: dict[str, list[tuple[int, int]]] = {}
    depth = {top: 0 if top else -1}
    for i in host:  # parents come first
        if i != top:
            depth[i] = depth[spans[i].parent] + 1
    for i in host:
        thread = _thread(spans, i)
        by_thread.setdefault(f"thread {thread}" if thread is not None else "host", []).append((i, max(depth[i], 0)))
    by_stream: dict[str, list[int]] = {}
    for i in device:
        by_stream.setdefault(spans[spans[i].parent].name, []).append(i)
    return [*by_thread.items(), *((label, _pack(spans, items)) for label, items in by_stream.items())]


def _subtree(spans, kids: list[list[int]], top: int) -> list[int]:
    """`top` and its descendants, parents first, leaving out the stream spans' subtrees."""
    out, stack = [], [top]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(k for k in reversed(kids[i]) if spans[k].kind != STREAM)
    return out


def _thread(spans, i: int):
    """A span's thread: its own, else its nearest ancestor's (summaries, steps of other threads)."""
    while i >= 0:
        if "thread" in spans[i].attributes:
            return spans[i].attributes["thread"]
        i = spans[i].parent
    return None


def _pack(spans, items: list[int]) -> list[tuple[int, int]]:
    """Device spans into rows, greedily, so boxes on one row never overlap."""
    ends: list[int] = []
    out = []
    for i in sorted(items, key=lambda i: (spans[i].start_ns, -spans[i].end_ns)):
        row = next((r for r, e in enumerate(ends) if e <= spans[i].start_ns), len(ends))
        if row == len(ends):
            ends.append(0)
        ends[row] = spans[i].end_ns
        out.append((i, row))
    return out


def _box(span, x: float, w: float, y: float, h: int) -> str:
    duration_us = (span.end_ns - span.start_ns) / 1000
    tip = [span.name, f"{duration_us:,.3f} \u00b5s"]
    for key in ("self_cpu_us", "self_device_us", "device_us", "launched_by", "calls"):
        if key in span.attributes:
            tip.append(f"{key}: {span.attributes[key]}")
    fill = "#d4d4d4" if span.kind == SUMMARY else _color(span.attributes.get("op_name", span.name))
    label = _clip(span.name, w - 4)
    text = f'<text x="{x + 2:.1f}" y="{y + h - 4}">{escape(label)}</text>' if label else ""
    return (f'<g><title>{escape(" | ".join(tip))}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
            f'height="{h - 1}" fill="{fill}"/>{text}</g>')  # fmt: skip


def _axis(span_ns: int, scale: float, height: int) -> str:
    """Ticks at a 1-2-5 step of µs, labelled from the drawn window's start."""
    span_us = max(span_ns / 1000, 1e-3)
    raw = span_us / 8
    magnitude = 10.0 ** math.floor(math.log10(raw))
    tick = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    out, k = [], 0
    while k * tick <= span_us + 1e-9:
        x = _LABEL_W + k * tick * 1000 * scale
        value = k * tick
        label = f"{value / 1000:g} ms" if tick >= 1000 else f"{value:g} \u00b5s"
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS_H - 6}" y2="{height}" class="a"/>'
                   f'<text x="{x + 2:.1f}" y="{_AXIS_H - 10}" class="t">{label}</text>')  # fmt: skip
        k += 1
    return "".join(out)


def _clip(text: str, width_px: float) -> str:
    fits = int(width_px / _CHAR_W)
    if fits >= len(text):
        return text
    return text[: fits - 1] + "\u2026" if fits >= 4 else ""


def _color(name: str) -> str:
    """A stable pastel per op name."""
    hue = int(hashlib.md5(name.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue},55%,72%)"
