"""The aggregator: a cycle's `RawEvents` summed into the `CycleProfile` that
`extract_cycle(prof.events())` gives for the same cycle.

Example::

    profile = aggregate(raw, device="neuron", device_profiled=True)

The events are linked and timed per event by `event_tree` (torch 2.13's rules); here they are
grouped by (name, kind), totalled and split by step. Sums run in torch's order, so on Python
3.10/3.11 the numbers match `extract_cycle(prof.events())` to the last bit (from 3.12 torch's
builtin `sum()` is compensated: last-bit differences; the tests allow 1e-6 relative). Pure: no
MLflow, no files.
"""

from __future__ import annotations

import numpy as np

from .event_tree import EventTree, event_tree, first_op_with_id
from .events import RawEvents
from .names import STEP_NAME
from .memory import allocated_by_event, private_use1_name, step_peaks
from .regions import region_rows
from .traffic import traffic_by_name, traffic_coverage
from .profile import ATEN_PREFIX, KINDS, CycleProfile, OpStats, cycle_profile
from .steps import split_by_step, step_numbers


def aggregate(raw: RawEvents, *, device: str, device_profiled: bool, default_step: int = 0,
              tree: EventTree | None = None, traffic: tuple[np.ndarray, ...] | None = None) -> CycleProfile:  # fmt: skip
    """The CycleProfile `extract_cycle(prof.events(), device=..., device_profiled=...,
    default_step=...)` gives for the same cycle: same rows, numbers, totals, aten_calls,
    active_steps, event_count, order and per-step samples.

    `tree`: `event_tree(raw)`, when the caller has it already (it draws the timeline from it too).
    `traffic`: `traffic.event_traffic(raw, tree, ...)`, bytes and FLOPs per call (record_shapes=True).
    """
    if tree is not None and tree.raw is not raw:
        raise ValueError("tree is not the tree of these events: pass event_tree(raw)")
    if len(raw) == 0:
        return cycle_profile(device, device_profiled, (), total_device_us=0.0, total_cpu_us=0.0, attributed_us=0.0,
                             aten_calls=0, steps_seen=0, event_count=0)
    if tree is None:
        tree = event_tree(raw)
    order, names, name = tree.order, tree.names, tree.name
    survivor, parent, sync_host, is_legacy = tree.survivor, tree.parent, tree.sync_host, tree.is_legacy
    self_cpu, self_device, device_rows = tree.self_cpu_us, tree.self_device_us, tree.device
    is_async, annotation = raw.is_async[order], raw.is_user_annotation[order]

    kind = np.where(device_rows, np.where(annotation, 2, 1), 0)
    counted = np.flatnonzero(survivor & ~is_async)  # extract_cycle skips async events
    group = name[counted] * 3 + kind[counted]
    groups, slot = np.unique(group, return_inverse=True)
    sums = [np.bincount(slot, weights=col[counted], minlength=len(groups))
            for col in (self_device, tree.device_total_us, self_cpu, tree.cpu_total_us)]  # fmt: skip
    calls = np.bincount(slot, minlength=len(groups))
    ck, cd = kind[counted], self_device[counted]
    total_device = _sequential_sum(cd[(ck == 1) | ((ck == 0) & is_legacy[counted])])
    total_cpu = _sequential_sum(self_cpu[counted])
    attributed = _sequential_sum(cd[ck == 0])
    is_step = np.isin(name[counted], [i for i, s in enumerate(names) if s == STEP_NAME])
    steps = int(is_step.sum())

    ops = [OpStats(names[g // 3], KINDS[g % 3], int(calls[i]), *(float(s[i]) for s in sums))
           for i, g in enumerate(groups.tolist())]
    aten = np.array([s.startswith(ATEN_PREFIX) for s in names], bool)[name]
    top_level = _top_level_aten(aten & survivor & ~device_rows, aten, parent)

    step_at = counted[is_step]
    step_starts = tree.start_ns[step_at]
    numbers = step_numbers([raw.names[i] for i in raw.name_id[tree.order][step_at]], len(step_at), default_step)
    per_step, step_totals = _per_step(raw, tree, counted, step_starts, numbers, ck, cd, top_level, default_step)
    extras = _ranges_memory_traffic(raw, tree, device, (step_at, step_starts, numbers, default_step),
                                    counted[(ck == 0) & ~annotation[counted]], counted, traffic)  # fmt: skip
    return cycle_profile(
        device, device_profiled, ops,
        total_device_us=total_device,
        total_cpu_us=total_cpu,
        attributed_us=attributed,
        aten_calls=int(top_level.sum()),
        steps_seen=steps,
        event_count=int(survivor.sum()),
        steps=per_step,
        step_totals=step_totals,
        annotations=frozenset(names[i] for i in np.unique(name[survivor & sync_host & annotation]).tolist()),
        **extras,
    )


def _ranges_memory_traffic(raw: RawEvents, tree: EventTree, device: str, steps: tuple, op_rows: np.ndarray,
                           counted: np.ndarray, traffic: tuple[np.ndarray, ...] | None) -> dict:  # fmt: skip
    """The profile's regions (`regions`), memory (`memory`) and bytes and FLOPs (`traffic`)."""
    step_at, step_starts, numbers, default_step = steps
    name, names = tree.name, tree.names
    allocated = allocated_by_event(raw, tree)
    regions, inside = region_rows(raw, tree, step_starts, numbers, default_step, allocated,
                                  traffic[:2] if traffic is not None else None)  # fmt: skip
    return {
        "regions": regions,
        "region_ops": inside,
        "step_memory": step_peaks(raw.memory, step_starts, tree.end_ns[step_at], numbers, private_use1_name(device)),
        "allocated": _allocated_by_name(allocated[counted], name[counted], names) if raw.memory is not None else None,
        "traffic": traffic_by_name(traffic, op_rows, name, names) if traffic is not None else None,
        "traffic_coverage": traffic_coverage(traffic, tree.self_device_us, op_rows, name, names)
        if traffic is not None else None,
    }


def _per_step(raw: RawEvents, tree: EventTree, counted: np.ndarray, step_starts: np.ndarray, numbers: list[int],
              kind: np.ndarray, self_device: np.ndarray, top_level: np.ndarray, default_step: int):  # fmt: skip
    """The counted events split by the ProfilerStep range each belongs to (see `steps`)."""
    order, start = tree.order, tree.start_ns
    linked, own_id = raw.linked_correlation_id[order], raw.correlation_id[order]
    frontend = tree.survivor & tree.sync_host & (linked == 0)
    return split_by_step(
        step_starts=step_starts,
        step_numbers=numbers,
        default_step=default_step,
        placed_at=_placed_at(start, linked, own_id, frontend, tree.device)[counted],
        name_id=tree.name[counted], names=tree.names, kind_id=kind, kinds=KINDS,
        self_device_us=self_device, self_cpu_us=tree.self_cpu_us[counted],
        in_device_total=(kind == 1) | ((kind == 0) & tree.is_legacy[counted]),
        aten_starts=start[top_level],
    )  # fmt: skip


def _placed_at(start: np.ndarray, linked: np.ndarray, own_id: np.ndarray, frontend: np.ndarray,
               device_rows: np.ndarray) -> np.ndarray:  # fmt: skip
    """When each event counts as happening, for per-step samples: its start, or for a device
    event linked to an op, that op's start (the first op with the id, in list order)."""
    placed = start.copy()
    ops = np.flatnonzero(frontend)
    launched = np.flatnonzero(device_rows & (linked > 0))
    found, by = first_op_with_id(ops, own_id[ops], linked[launched])
    placed[launched[found]] = start[by]
    return placed


def _top_level_aten(candidates: np.ndarray, aten: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Which candidate events have no `aten::` event among their ancestors."""
    jump = parent.copy()
    above = np.zeros(len(parent), bool)
    has = jump >= 0
    above[has] = aten[jump[has]]
    while has.any():
        at = np.flatnonzero(has)
        above[at] |= above[jump[at]]
        jump[at] = jump[jump[at]]
        has = jump >= 0
    return candidates & ~above


def _allocated_by_name(allocated: np.ndarray, name: np.ndarray, names: list[str]) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of each op that allocated memory itself (`memory.allocated_by_event`)."""
    return tuple((names[k], int(allocated[name == k].sum())) for k in np.unique(name[allocated > 0]).tolist())


def _sequential_sum(values: np.ndarray) -> float:
    """Left-to-right float sum, as Python's loop adds (numpy's sum is pairwise)."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0
