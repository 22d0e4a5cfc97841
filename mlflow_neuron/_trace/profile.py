"""What one profiler cycle measured, as plain data: `CycleProfile` and its `OpStats` rows.

Both ways to a profile produce it: `aggregate(raw)` from a reader's `RawEvents`, and
`extract_cycle(prof.events())` from torch's own parse. Pure: no torch, no MLflow, no files.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields

import pandas as pd

from .memory import StepMemory
from .regions import RegionOp, RegionStep
from .steps import StepOp, StepTotal
from .traffic import TrafficCoverage

PRESENT, MISSING, NOT_PROFILED = "present", "missing", "not_profiled"
OP, KERNEL, DEVICE_ANNOTATION = "op", "kernel", "device_annotation"
KINDS = (OP, KERNEL, DEVICE_ANNOTATION)
ATEN_PREFIX = "aten::"


@dataclass(frozen=True)
class OpStats:
    """One row of a cycle's op table. Times in microseconds, summed over the cycle."""

    name: str
    kind: str  # OP: host-side op or annotation; KERNEL: device activity; DEVICE_ANNOTATION
    calls: int
    self_device_time_us: float
    device_time_us: float
    self_cpu_time_us: float
    cpu_time_us: float


@dataclass(frozen=True)
class CycleProfile:
    """What one profiler cycle measured."""

    device: str
    device_time: str  # PRESENT | MISSING | NOT_PROFILED
    ops: tuple[OpStats, ...]  # ranked: self device time, else self CPU time, then name
    total_self_device_time_us: float
    total_self_cpu_time_us: float
    attributed_device_time_us: float  # the part of the total that op rows carry
    aten_calls: int
    active_steps: int
    event_count: int
    steps: tuple[StepOp, ...] = ()  # the same events split by profiler step (see `steps`)
    step_totals: tuple[StepTotal, ...] = ()
    annotations: frozenset[str] = frozenset()  # host rows that are ranges (record_function), not ops
    # Inclusive time of each record_function range per step, and what ran inside (see `regions`).
    # Left out of ==: torch's own parse (`extract_cycle`, the fallback without Kineto access) has none.
    regions: tuple[RegionStep, ...] = field(default=(), compare=False)
    region_ops: tuple[RegionOp, ...] = field(default=(), compare=False)
    # profile_memory=True: each step's peak per device, and (name, bytes) each op allocated itself;
    # None: no memory records.
    step_memory: tuple[StepMemory, ...] = field(default=(), compare=False)
    allocated: tuple[tuple[str, int], ...] | None = field(default=None, compare=False)
    # record_shapes=True: (name, bytes, FLOPs, dtype, message bytes) of each op over its calls (NaN: a
    # call's formula is unknown; message bytes: a collective's, see `traffic`); None: recorded without shapes.
    traffic: tuple[tuple[str, float, float, str, float], ...] | None = field(default=None, compare=False)
    # record_shapes=True: how much of the ops' device time has bytes (`traffic.TrafficCoverage`).
    traffic_coverage: TrafficCoverage | None = field(default=None, compare=False)

    @property
    def ranking_metric(self) -> str:
        return "self_device_time_us" if self.device_time == PRESENT else "self_cpu_time_us"

    def top_ops(self, k: int) -> list[OpStats]:
        """The `k` host-side ops that cost the most: device time when there is some."""
        return [op for op in self.ops if op.kind == OP][: max(k, 0)]

    def to_frame(self) -> pd.DataFrame:
        columns = [f.name for f in fields(OpStats)]
        return pd.DataFrame([[getattr(op, c) for c in columns] for op in self.ops], columns=columns)

    def steps_frame(self) -> pd.DataFrame:
        """One row per (profiler step, op or kernel): the per-step samples."""
        return _frame(StepOp, self.steps)

    def regions_frame(self) -> pd.DataFrame:
        """One row per (profiler step, region): inclusive times, launches, calls."""
        return _frame(RegionStep, self.regions)

    def region_ops_frame(self) -> pd.DataFrame:
        """One row per (profiler step, region, op or kernel inside it)."""
        return _frame(RegionOp, self.region_ops)


def cycle_profile(device: str, device_profiled: bool, ops: Iterable[OpStats], *, total_device_us: float,
                  total_cpu_us: float, attributed_us: float, aten_calls: int, steps_seen: int, event_count: int,
                  steps: tuple[StepOp, ...] = (), step_totals: tuple[StepTotal, ...] = (),
                  annotations: frozenset[str] = frozenset(), regions: tuple[RegionStep, ...] = (),
                  region_ops: tuple[RegionOp, ...] = (), step_memory: tuple[StepMemory, ...] = (),
                  allocated: tuple[tuple[str, int], ...] | None = None,
                  traffic: tuple[tuple[str, float, float, str, float], ...] | None = None,
                  traffic_coverage: TrafficCoverage | None = None) -> CycleProfile:
    """A `CycleProfile` from either reader's sums (`aggregate`, `function_events`): the device-time
    state, the ops ranked, and a cycle with ops but no step marker counted as one step."""
    device_time = _device_time_state(device_profiled, total_device_us)
    ops = _ranked(ops, device_time)
    return CycleProfile(
        device=device,
        device_time=device_time,
        ops=ops,
        total_self_device_time_us=total_device_us,
        total_self_cpu_time_us=total_cpu_us,
        attributed_device_time_us=attributed_us,
        aten_calls=aten_calls,
        active_steps=steps_seen if steps_seen or not ops else 1,
        event_count=event_count,
        steps=steps,
        step_totals=step_totals,
        annotations=annotations,
        regions=regions,
        region_ops=region_ops,
        step_memory=step_memory,
        allocated=allocated,
        traffic=traffic,
        traffic_coverage=traffic_coverage,
    )


def _frame(row_type: type, rows: tuple) -> pd.DataFrame:
    columns = [f.name for f in fields(row_type)]
    return pd.DataFrame([[getattr(row, c) for c in columns] for row in rows], columns=columns)


def _ranked(ops: Iterable[OpStats], device_time: str) -> tuple[OpStats, ...]:
    """Costliest first: by self device time when the cycle has some, else by self CPU time."""
    by_device = device_time == PRESENT
    return tuple(sorted(ops, key=lambda op: (
        -(op.self_device_time_us if by_device else op.self_cpu_time_us), -op.self_cpu_time_us, op.name, op.kind,
    )))  # fmt: skip


def _device_time_state(device_profiled: bool, total_device_us: float) -> str:
    if not device_profiled:
        return NOT_PROFILED
    return PRESENT if total_device_us > 0 else MISSING
