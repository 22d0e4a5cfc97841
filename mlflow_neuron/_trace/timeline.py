"""A profiler cycle's timeline as plain data: `Timeline`, a tree of `TimelineSpan`s. No numpy.

What the MLflow trace and the HTML report draw; `span_tree.build_timeline` makes one from a cycle's
events. Times are whole nanoseconds since the epoch. `to_json` / `from_json` round-trip it
exactly (the outbox keeps it as `timeline.json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .json_text import compact, parse

CYCLE, STEP, OP, STREAM, KERNEL, SUMMARY = "cycle", "step", "op", "stream", "kernel", "summary"
DEFAULT_MAX_SPANS = 2000
ELLIPSIS = "\u2026"


@dataclass(slots=True)
class TimelineSpan:
    """One span. `parent` is the index of the parent span in `Timeline.spans` (-1: the root).
    Times are epoch nanoseconds. `attributes` hold JSON values only. Not frozen: a frozen
    dataclass's `__init__` sets each field through `object.__setattr__`, three times the cost of
    making the 2,000 spans of a cycle; nothing changes a span once made."""

    name: str
    kind: str
    start_ns: int
    end_ns: int
    parent: int
    attributes: dict[str, Any] = field(default_factory=dict)



@dataclass(frozen=True)
class Timeline:
    """A cycle's span tree; parents come before their children. Plain data: `to_json` /
    `from_json` round-trip it exactly (the outbox stores it as `timeline.json`)."""

    name: str
    cycle_step: int
    origin_ns: int
    spans: tuple[TimelineSpan, ...]
    events: int  # spans the cycle would have without the cap (cycle, steps, streams included)
    dropped: int  # of those, left out (summarized)

    def to_json(self, span_dicts: list[dict] | None = None) -> str:
        """`span_dicts`: this timeline's `span_dicts()`, when the caller made them already."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["spans"] = self.span_dicts() if span_dicts is None else span_dicts
        return compact(data)

    def span_dicts(self) -> list[dict]:
        """The spans as plain dicts, fields in order (`asdict` would deep-copy every span's
        attributes first: most of the time at 2,000 spans; a dict display is 3x a comprehension)."""
        return [{"name": s.name, "kind": s.kind, "start_ns": s.start_ns, "end_ns": s.end_ns, "parent": s.parent,
                 "attributes": s.attributes} for s in self.spans]  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        data = parse(text)
        spans = tuple(TimelineSpan(**s) for s in data.pop("spans"))
        return cls(spans=spans, **data)

    def children(self) -> list[list[int]]:
        """Per span, its children's indices in order."""
        kids: list[list[int]] = [[] for _ in self.spans]
        for i, span in enumerate(self.spans):
            if span.parent >= 0:
                kids[span.parent].append(i)
        return kids


