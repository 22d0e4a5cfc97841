"""Which step of a run's timeline a report draws, and the run's timeline as a report gets it (pure).

Example::

    step = representative_step(step_durations_us(timeline))   # the step nearest the median
    StepTimeline("v1", timeline, step, cycle=8, note="the median step of cycle 8")
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from .._trace.timeline import STEP, Timeline


@dataclass(frozen=True)
class StepTimeline:
    """One run's step to draw in a report: its cycle's timeline, or None and `note` says why;
    otherwise `note` says how the step was chosen."""

    label: str
    timeline: Timeline | None
    step: int | None = None
    cycle: int | None = None
    note: str = ""


def step_durations_us(timeline: Timeline) -> dict[int, float]:
    """Each `ProfilerStep#N` span's length in µs, by N."""
    return {int(s.attributes["step"]): (s.end_ns - s.start_ns) / 1000 for s in timeline.spans if s.kind == STEP}


def representative_step(totals: Mapping[int, float]) -> int:
    """The step whose total is closest to the median of the steps' totals; ties: the lower step.

    Raises:
        ValueError: no steps.
    """
    if not totals:
        raise ValueError("no steps to choose from")
    median = statistics.median(totals.values())
    return min(totals, key=lambda step: (abs(totals[step] - median), step))
