"""The fallback reader: a cycle's `FunctionEvent`s (`prof.events()`, torch's own parse) in, a
`CycleProfile` out. Used where the Kineto reader cannot read a profile (other torch versions).

No MLflow, no files. Device time is attributed to the CPU op that launched it (the op's kernels,
as torch links them); totals count every kernel once, from the device rows, the way torch's own
table does. Reading both sides into one sum would double every kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from torch.autograd import DeviceType

from .names import STEP_NAME, STEP_PREFIX
from .profile import ATEN_PREFIX, KERNEL, KINDS, OP, DEVICE_ANNOTATION, CycleProfile, OpStats, cycle_profile
from .steps import split_by_step, step_numbers

# Device rows of key_averages(); compared as enum members because a PrivateUse1 rename changes
# their printed names ("NEURON") but not their identity.
DEVICE_ROW_TYPES = frozenset(
    getattr(DeviceType, name) for name in ("CUDA", "PrivateUse1", "MTIA", "HPU", "XPU") if hasattr(DeviceType, name)
)


def extract_cycle(
    events: Sequence[Any], *, device: str, device_profiled: bool, default_step: int = 0
) -> CycleProfile:
    """Aggregate a cycle's `FunctionEvent`s (as `prof.events()` returns them, tree built).

    `default_step`: the number of the cycle's last active step (`prof.step_num - 1`): it numbers
    steps whose names lost theirs, and a cycle without step ranges."""
    rows: dict[tuple[str, str], list[float]] = {}
    total_device = total_cpu = attributed = 0.0
    steps = 0
    counted, step_events, annotations = [], [], set()
    for event in events:
        if getattr(event, "is_async", False):
            continue
        name = event.name
        if name == STEP_NAME or name.startswith(STEP_PREFIX):
            steps += 1
            name = STEP_NAME
            step_events.append(event)
        kind = _kind(event)
        self_device = self_device_time_us(event)
        self_cpu = float(event.self_cpu_time_total)
        counted.append((event, name, kind, self_device, self_cpu))
        if kind == OP and getattr(event, "is_user_annotation", False):
            annotations.add(name)
        row = rows.setdefault((name, kind), [0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += self_device
        row[2] += device_time_us(event)
        row[3] += self_cpu
        row[4] += float(event.cpu_time_total)
        total_cpu += self_cpu
        if kind == KERNEL or (kind == OP and getattr(event, "is_legacy", False)):
            total_device += self_device  # legacy rows carry their kernel on the CPU event
        if kind == OP:
            attributed += self_device

    ops = [OpStats(name, kind, int(r[0]), r[1], r[2], r[3], r[4]) for (name, kind), r in rows.items()]
    top_level = top_level_aten_events(events)
    per_step, step_totals = _split_by_step(counted, step_events, top_level, default_step)
    return cycle_profile(
        device, device_profiled, ops,
        total_device_us=total_device,
        total_cpu_us=total_cpu,
        attributed_us=attributed,
        aten_calls=len(top_level),
        steps_seen=steps,
        event_count=len(events),
        steps=per_step,
        step_totals=step_totals,
        annotations=frozenset(annotations),
    )


def _split_by_step(counted: list, step_events: list, top_level: list, default_step: int):
    """`split_by_step` over FunctionEvents: kernels go with the op whose id they link to."""
    by_start = sorted(step_events, key=lambda e: e.time_range.start)
    numbers = step_numbers([getattr(e, "trace_name", None) or e.name for e in by_start], len(by_start), default_step)
    op_start: dict[int, float] = {}  # a kernel's op: the first unlinked host event with its id, as torch links
    for event, *_ in counted:
        if not is_device_row(event) and not getattr(event, "linked_correlation_id", 0):
            op_start.setdefault(event.id, event.time_range.start)
    placed, name_ids, kind_ids, device, cpu, in_total = [], [], [], [], [], []
    names: dict[str, int] = {}
    for event, name, kind, self_device, self_cpu in counted:
        link = getattr(event, "linked_correlation_id", 0) if kind != OP else 0
        placed.append(op_start.get(link, event.time_range.start) if link else event.time_range.start)
        name_ids.append(names.setdefault(name, len(names)))
        kind_ids.append(KINDS.index(kind))
        device.append(self_device)
        cpu.append(self_cpu)
        in_total.append(kind == KERNEL or (kind == OP and getattr(event, "is_legacy", False)))
    return split_by_step(
        step_starts=np.array([e.time_range.start for e in by_start], np.float64), step_numbers=numbers,
        default_step=default_step, placed_at=np.array(placed, np.float64), name_id=np.array(name_ids, np.int64),
        names=list(names), kind_id=np.array(kind_ids, np.int64), kinds=KINDS, self_device_us=np.array(device),
        self_cpu_us=np.array(cpu), in_device_total=np.array(in_total, bool),
        aten_starts=np.array([e.time_range.start for e in top_level], np.float64),
    )  # fmt: skip


def count_top_level_aten_calls(events: Iterable[Any]) -> int:
    """ATen ops the user's code dispatched: `aten::` ops with no `aten::` op above them.

    Nested ops (`aten::mul` inside `aten::rms_norm`) are implementation detail: counting them
    makes a fused op look busier than the naive ops it replaces.
    """
    return len(top_level_aten_events(events))


def top_level_aten_events(events: Iterable[Any]) -> list[Any]:
    """The events `count_top_level_aten_calls` counts."""
    found = []
    for event in events:
        if is_device_row(event) or not event.name.startswith(ATEN_PREFIX):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith(ATEN_PREFIX):
            parent = parent.cpu_parent
        if parent is None:
            found.append(event)
    return found


def _kind(event: Any) -> str:
    if not is_device_row(event):
        return OP
    return DEVICE_ANNOTATION if getattr(event, "is_user_annotation", False) else KERNEL




def is_device_row(event: Any) -> bool:
    return event.device_type in DEVICE_ROW_TYPES


def self_device_time_us(event: Any) -> float:
    """Self device time of a torch event; very old torch only had the CUDA-named attribute."""
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0)
    return float(value or 0)


def device_time_us(event: Any) -> float:
    value = getattr(event, "device_time_total", None)
    if value is None:
        value = getattr(event, "cuda_time_total", 0)
    return float(value or 0)
