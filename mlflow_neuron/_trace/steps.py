"""Per-step samples: what each op cost within each `ProfilerStep#N` range of a cycle. Pure.

A cycle's sums hide noise: one stalled call in one step looks like a slow op. Splitting the same
events by step gives one sample per step, which comparisons need (median, spread, outliers).

The rules:
- an event belongs to the step range it starts in; events before the first step go to the first
  step, and events in a gap after a step (between `prof.step()` calls) to the step before it, so
  every event lands in exactly one step;
- a device event belongs to the op that launched it (its step is that op's step), or, when no op
  launched it, to the step it starts in;
- a cycle without `ProfilerStep` ranges is one step, numbered by the caller.

Values are summed in whole nanoseconds (profiler times are whole nanoseconds), so a cycle's steps
add up to its totals exactly at that resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .names import STEP_PREFIX


@dataclass(frozen=True)
class StepOp:
    """One op (or kernel) within one profiler step. Times in microseconds (whole nanoseconds)."""

    step: int
    name: str
    kind: str
    calls: int
    self_device_time_us: float
    self_cpu_time_us: float


@dataclass(frozen=True)
class StepTotal:
    """One profiler step's totals, counted the way the cycle's totals are."""

    step: int
    self_device_time_us: float
    self_cpu_time_us: float
    aten_calls: int


def step_numbers(trace_names: list[str], count: int, last_step: int) -> list[int]:
    """The numbers of a cycle's step ranges, in start order: `ProfilerStep#N` gives N; where a
    name lost its number (torch's `ProfilerStep*`), the steps count up to `last_step`."""
    numbers = []
    for index, name in enumerate(trace_names):
        suffix = name[len(STEP_PREFIX):] if name.startswith(STEP_PREFIX) else ""
        numbers.append(int(suffix) if suffix.isdigit() else last_step - (count - 1 - index))
    return numbers


def split_by_step(
    *,
    step_starts: np.ndarray,
    step_numbers: list[int],
    default_step: int,
    placed_at: np.ndarray,
    name_id: np.ndarray,
    names: list[str],
    kind_id: np.ndarray,
    kinds: tuple[str, ...],
    self_device_us: np.ndarray,
    self_cpu_us: np.ndarray,
    in_device_total: np.ndarray,
    aten_starts: np.ndarray,
) -> tuple[tuple[StepOp, ...], tuple[StepTotal, ...]]:
    """Per-step rows and totals of a cycle's counted events (one array entry per event).

    `step_starts` are the start times of the step ranges (any unit shared with `placed_at`);
    `placed_at` is when each event counts as happening: its own start, or its launching op's
    start for a device event. An event's name is `names[name_id]`, its kind `kinds[kind_id]`.
    `in_device_total`: the event counts in the cycle's device total (device rows, and legacy host
    rows that carry their own kernel). `aten_starts`: start times of the top-level ATen calls.
    """
    starts, numbers = _ordered(step_starts, step_numbers, default_step)

    def slot_of(times: np.ndarray) -> np.ndarray:
        return _slots(starts, times)

    slot = slot_of(placed_at)
    device_us = np.asarray(self_device_us, np.float64)
    cpu_us = np.asarray(self_cpu_us, np.float64)

    width = len(kinds) * max(len(names), 1)
    group = slot * width + np.asarray(name_id, np.int64) * len(kinds) + np.asarray(kind_id, np.int64)
    groups, member = np.unique(group, return_inverse=True)
    calls = np.bincount(member, minlength=len(groups))
    device_sum = _sums(member, device_us, len(groups))
    cpu_sum = _sums(member, cpu_us, len(groups))
    rows = [
        StepOp(int(numbers[g // width]), names[(g % width) // len(kinds)], kinds[g % len(kinds)], int(calls[i]),
               device_sum[i], cpu_sum[i])
        for i, g in enumerate(groups.tolist())
    ]  # fmt: skip

    steps = len(numbers)
    device_total = _sums(slot, np.where(in_device_total, device_us, 0.0), steps)
    cpu_total = _sums(slot, cpu_us, steps)
    aten = np.bincount(slot_of(aten_starts), minlength=steps).tolist()
    totals = tuple(
        StepTotal(int(numbers[i]), device_total[i], cpu_total[i], aten[i]) for i in range(steps)
    )
    return tuple(sorted(rows, key=lambda r: (r.step, r.kind, r.name))), totals


def step_slots(step_starts: np.ndarray, step_numbers: list[int], default_step: int):
    """A function from event start times to the numbers of the steps they belong to (the rules above)."""
    starts, numbers = _ordered(step_starts, step_numbers, default_step)
    return lambda times: numbers[_slots(starts, times)]


def _ordered(step_starts, step_numbers, default_step: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(step_starts, kind="stable")
    starts = np.asarray(step_starts, dtype=np.float64)[order]
    numbers = np.asarray(step_numbers, dtype=np.int64)[order] if len(order) else np.array([default_step])
    return starts, numbers


def _slots(starts: np.ndarray, times: np.ndarray) -> np.ndarray:
    if not len(starts):
        return np.zeros(len(times), np.int64)
    return np.maximum(np.searchsorted(starts, np.asarray(times, np.float64), side="right") - 1, 0)


def whole_ns(us: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(us, dtype=np.float64) * 1000).astype(np.int64)


def _sums(slot: np.ndarray, values_us: np.ndarray, size: int) -> list[float]:
    """Sums per slot in microseconds, added in whole nanoseconds (float64 adds whole numbers exactly
    below 2**53, 104 days in ns). A slot with a NaN or infinite time (a broken event; the cycle's
    own total is NaN too, and neither is logged) sums to NaN instead of a cast's garbage."""
    finite = np.isfinite(values_us)
    ns = np.bincount(slot, weights=whole_ns(np.where(finite, values_us, 0.0)), minlength=size)
    broken = np.bincount(slot, weights=~finite, minlength=size) > 0
    return np.where(broken, np.nan, np.rint(ns).astype(np.int64) / 1000).tolist()
