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
    summary = ChromeTraceFile("/tmp/cycle.json", settings).summarize(rank={"rank": 0, "cycle_step": 10})
    summary.profile.total_self_device_time_us, summary.table, summary.timeline, summary.rank_summary

A saved trace is read once: its rank summary (`collectives.RankEvents`) is fed the same pieces of
the file as the reader of the cycle's numbers, in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .aggregate import aggregate
from .chrome import read_chrome_file
from .collectives import RankEvents
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
    # The rank summary made in the same pass (`ChromeTraceFile.summarize(rank=...)`), or why not.
    rank_summary: dict | None = None
    rank_summary_error: Exception | None = None


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

    def summarize(self, rank: dict | None = None) -> CycleSummary:
        """The cycle's numbers; with `rank` (`RankEvents.summary`'s keywords: rank, host,
        world_size, cycle_step), its rank summary too, from the same read of the file. A rank
        summary that fails is `rank_summary_error`; the numbers stand either way."""
        with cycle_collector_paused():  # and resumed once what the read made is freed, not scanned first
            return self._summarize(rank)

    def _summarize(self, rank: dict | None) -> CycleSummary:
        ranks = RankPass() if rank is not None else None
        cycle = read_chrome_file(self.readable(), shapes=True, also=ranks)  # shapes: spans, bytes and FLOPs
        summary = summarize(cycle.raw, self.settings, cycle.inputs)
        return summary if ranks is None else ranks.into(summary, **rank)

    def readable(self) -> Path:
        """The file `summarize` reads: `path`, else the staged `fallback` where `path` is gone."""
        path = Path(self.path)
        if not path.exists() and self.fallback and Path(self.fallback).exists():
            return Path(self.fallback)
        return path


class RankPass:
    """A cycle's rank summary made in the pass that reads its numbers (`read_chrome_file(also=)`),
    whose failure costs only the rank summary: the first error stops its feeding and becomes the
    summary's `rank_summary_error`, and the cycle's numbers are read on."""

    def __init__(self) -> None:
        self.events, self.error = RankEvents(), None

    def feed(self, chunk: list) -> None:
        self._fed(self.events.feed, chunk)

    def feed_read(self, piece) -> None:
        """A `chrome_file.ReadPiece`: the rank summary made from the reader's columns."""
        self._fed(self.events.feed_read, piece)

    def _fed(self, feed, what) -> None:
        if self.error is None:
            try:
                feed(what)
            except Exception as error:  # noqa: BLE001 - the rank summary's own problem
                self.error = error

    def restart(self) -> None:
        self.error = None
        self.events.restart()

    def finish(self, header: dict) -> None:
        self.events.finish(header)

    def into(self, summary: CycleSummary, **rank) -> CycleSummary:
        """`summary` with the rank summary (`RankEvents.summary`'s keywords), or why there is none."""
        if self.error is not None:
            return replace(summary, rank_summary_error=self.error)
        try:
            return replace(summary, rank_summary=self.events.summary(self.events.meta, **rank))
        except Exception as error:  # noqa: BLE001 - the rank summary's own problem
            return replace(summary, rank_summary_error=error)


@dataclass(frozen=True)
class Summarized:
    """A cycle summarized already (torch's own `prof.events()` parse, on the training thread)."""

    summary: CycleSummary

    def summarize(self) -> CycleSummary:
        return self.summary
