"""The one pipeline from a cycle's events to its numbers, table and timeline. Pure: no MLflow.

    read  ->  link (event_tree)  ->  aggregate  ->  timeline  ->  table

Every way into a cycle ends here. A reader gives `RawEvents` (and, for a timeline, `TimelineInputs`):
`kineto.read_kineto_cycle` in the training process, `chrome.read_chrome_trace` for a saved trace in
the helper process and for `mlflow-neuron ingest`. The events are linked once, into the tree that
both the aggregate and the timeline read. A source object (`KinetoCycle`, `ChromeTraceFile`,
`Summarized`) says where a cycle's events are and `summarize()`s them when the sender gets to it,
off the training thread.

Example::

    settings = CycleSettings(device="cuda", device_profiled=True, default_step=9, timeline_step=10)
    summary = ChromeTraceFile("/tmp/cycle.json", settings).summarize()
    summary.profile.total_self_device_time_us, summary.table, summary.timeline
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .aggregate import aggregate
from .chrome import read_chrome_file
from .event_tree import event_tree
from .events import RawEvents, TimelineInputs, empty_events
from .json_text import cycle_collector_paused
from .profile import CycleProfile
from .span_tree import build_timeline
from .table import cycle_table
from .timeline import DEFAULT_MAX_SPANS, Timeline
from .traffic import event_traffic


@dataclass(frozen=True)
class CycleSettings:
    """How a cycle is summarized, whatever its source. Plain data (it travels to the helper)."""

    device: str  # "neuron", "cuda", "cpu", ...: the profile's device tag
    device_profiled: bool  # device activity was recorded (else device time is "not_profiled")
    default_step: int = 0  # the cycle's last active step: numbers steps whose ranges lost theirs
    timeline_step: int | None = None  # the step the cycle is logged at, when its timeline is wanted
    timeline_root: str | None = None  # the timeline's root span's name (`build_timeline`'s root_name)
    max_spans: int = DEFAULT_MAX_SPANS


@dataclass(frozen=True)
class CycleSummary:
    """A cycle's numbers, its op table as text, and its timeline (None when not wanted, or when it
    could not be built: `timeline_error` says why; the numbers stand either way)."""

    profile: CycleProfile
    table: str
    timeline: Timeline | None = None
    timeline_error: Exception | None = None


def summarize(raw: RawEvents, settings: CycleSettings, inputs: TimelineInputs | None = None) -> CycleSummary:
    """Links, aggregates and (with `settings.timeline_step`) draws one cycle's events."""
    tree = event_tree(raw)  # linked once, for the numbers and the timeline
    traffic = event_traffic(raw, tree, inputs.op_inputs if inputs is not None else None)
    profile = aggregate(raw, device=settings.device, device_profiled=settings.device_profiled,
                        default_step=settings.default_step, tree=tree, traffic=traffic)  # fmt: skip
    timeline, error = None, None
    if settings.timeline_step is not None:
        try:
            timeline = build_timeline(raw, cycle_step=settings.timeline_step, max_spans=settings.max_spans,
                                      inputs=inputs, tree=tree, root_name=settings.timeline_root)  # fmt: skip
        except Exception as problem:  # noqa: BLE001 - the cycle's numbers and files still go
            error = problem
    return CycleSummary(profile, cycle_table(profile), timeline, error)


def empty_summary(settings: CycleSettings) -> CycleSummary:
    """What a cycle whose events could not be read is logged as: no ops, its files still go."""
    return summarize(empty_events(None), CycleSettings(settings.device, settings.device_profiled))


@dataclass(frozen=True)
class ChromeTraceFile:
    """A cycle saved as a chrome trace (Kineto's JSON, `.gz` or not): what the helper process
    reads. `fallback` is the gzipped copy staged beside the cycle, read when `path` is gone (a
    job handed back after the first attempt already staged it)."""

    path: str
    settings: CycleSettings
    fallback: str | None = None

    def summarize(self) -> CycleSummary:
        path = Path(self.path)
        if not path.exists() and self.fallback and Path(self.fallback).exists():
            path = Path(self.fallback)
        with cycle_collector_paused():  # shapes: for the timeline's spans, and each op's bytes and FLOPs
            cycle = read_chrome_file(path, shapes=True)
            return summarize(cycle.raw, self.settings, cycle.inputs)


@dataclass(frozen=True)
class Summarized:
    """A cycle summarized already (torch's own `prof.events()` parse, on the training thread)."""

    summary: CycleSummary

    def summarize(self) -> CycleSummary:
        return self.summary
