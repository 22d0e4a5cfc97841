"""Regions: what each `record_function` range cost, everything inside it included. Pure.

Example::

    tree = event_tree(raw)
    regions, inside = region_rows(raw, tree, step_starts, step_numbers, default_step=9)

A region is every host `record_function` range other than `ProfilerStep#N` (Kineto's
`user_annotation`). Its op row in the op table has only *self* time, the range's own overhead:
a user who wraps a norm in `record_function("rmsnorm")` wants what the norm cost. Per instance:
- device time: the kernels launched inside it (by an op in it, or by the range itself), each
  counted once, and the time of legacy device stubs inside it; the range's own device row (a
  CUDA `gpu_user_annotation` spanning its kernels) is not a kernel. Without a profiled device, 0;
- CPU time: its wall time on the host (torch's `cpu_time_total` of the range);
- launches: those kernels (a legacy stub counts as one);
- calls: 1.

A range nested in a range of the same name counts once, as part of the outermost one. An
instance belongs to the profiler step it starts in (the rules of `steps`), and so does
everything inside it. `inside` lists, per step and region, the ops and kernels that ran in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .event_tree import EventTree, first_op_with_id
from .events import DEVICE_KERNEL, RawEvents
from .names import STEP_NAME
from .steps import step_slots, whole_ns


@dataclass(frozen=True)
class RegionStep:
    """One region within one profiler step. Inclusive times in microseconds (whole nanoseconds)."""

    step: int
    name: str
    calls: int
    device_time_us: float
    cpu_time_us: float
    launches: int
    allocated_bytes: int = 0  # allocations inside it (profile_memory=True)
    bytes: float = float("nan")  # least traffic of its outermost ops (record_shapes=True; NaN: unknown)
    flops: float = float("nan")


@dataclass(frozen=True)
class RegionOp:
    """An op (kind "op") or kernel (kind "kernel") that ran inside a region within one step."""

    step: int
    region: str
    name: str
    kind: str
    calls: int
    self_device_time_us: float
    self_cpu_time_us: float


def region_rows(raw: RawEvents, tree: EventTree, step_starts: np.ndarray, step_numbers: list[int], default_step: int,
                allocated: np.ndarray | None = None,
                op_traffic: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[tuple[RegionStep, ...], tuple[RegionOp, ...]]:  # fmt: skip
    """The cycle's regions per step, and what ran inside each (see the module docstring)."""
    order = tree.order
    annotation = raw.is_user_annotation[order]
    steps = np.isin(tree.name, [i for i, s in enumerate(tree.names) if s == STEP_NAME])
    host = tree.sync_host & ~raw.is_async[order]
    is_region = host & tree.survivor & annotation & ~steps
    if not is_region.any():
        return (), ()
    above = _nearest_region_above(tree.parent, is_region)
    counted = _outermost_of_name(np.flatnonzero(is_region), above, tree.name)
    kernels, launched_by = _launches(raw, tree, host)
    hosts = np.flatnonzero(host)
    members, regions = _inside(hosts, above, counted)  # (event, enclosing region) pairs
    members = hosts[members]
    kernel_at, kernel_regions = _inside(launched_by, above, counted, include_self=True)  # launched in a region too
    kernel_at = kernels[kernel_at]
    step_of = np.zeros(len(tree), np.int64)
    step_of[counted] = step_slots(step_starts, step_numbers, default_step)(tree.start_ns[counted])

    n = len(tree)
    device_ns, cpu_ns = whole_ns(tree.self_device_us), whole_ns(tree.self_cpu_us)
    live = tree.survivor[members]  # merged events' time is their parent's; their launches count
    legacy = tree.is_legacy[members]
    legacy_ns = whole_ns(raw.legacy_device_us[order]) if raw.use_device else np.zeros(n, np.int64)
    device = (np.bincount(kernel_regions, weights=device_ns[kernel_at], minlength=n)
              + np.bincount(regions[legacy], weights=legacy_ns[members[legacy]], minlength=n))  # fmt: skip
    launches = np.bincount(kernel_regions, minlength=n) + np.bincount(regions[legacy], minlength=n)
    own = np.zeros(n, np.int64) if allocated is None else allocated  # bytes each op allocated itself
    memory = own + np.bincount(regions[live], weights=own[members[live]], minlength=n).astype(np.int64)
    traffic = [np.full(n, np.nan), np.full(n, np.nan)]
    if op_traffic is not None:  # the ops right under a range: their children's traffic is theirs
        top = live & annotation[np.maximum(tree.parent[members], 0)] & (tree.parent[members] >= 0)
        traffic = [np.bincount(regions[top], weights=column[members[top]], minlength=n) for column in op_traffic]
    rows = [(int(step_of[r]), tree.names[tree.name[r]], int(round(device[r])), int(whole_ns(tree.cpu_total_us[r])),
             int(launches[r]), int(memory[r]), float(traffic[0][r]), float(traffic[1][r])) for r in counted.tolist()]  # fmt: skip
    live_members, live_regions = members[live], regions[live]
    inside = [
        (step_of[live_regions], tree.name[live_regions], tree.name[live_members], 0, device_ns[live_members],
         cpu_ns[live_members]),
        (step_of[kernel_regions], tree.name[kernel_regions], tree.name[kernel_at], 1, device_ns[kernel_at],
         np.zeros(len(kernel_at), np.int64)),
    ]  # fmt: skip
    return _by_step_and_name(rows), _inside_rows(inside, tree.names)


def _nearest_region_above(parent: np.ndarray, is_region: np.ndarray) -> np.ndarray:
    """Per event, its nearest region among its strict ancestors (-1: none)."""
    nearest = np.full(len(parent), -1, np.int64)
    todo = np.flatnonzero(parent >= 0)
    up = parent[todo]
    while len(todo):
        hit = is_region[up]
        nearest[todo[hit]] = up[hit]
        todo, up = todo[~hit], parent[up[~hit]]
        keep = up >= 0
        todo, up = todo[keep], up[keep]
    return nearest


def _outermost_of_name(regions: np.ndarray, above: np.ndarray, name: np.ndarray) -> np.ndarray:
    """The region instances with no enclosing region of the same name: those are counted."""
    keep = []
    for r in regions.tolist():
        a = above[r]
        while a >= 0 and name[a] != name[r]:
            a = above[a]
        if a < 0:
            keep.append(r)
    return np.array(keep, np.int64)


def _launches(raw: RawEvents, tree: EventTree, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device kernels linked to a host op (not annotation rows), and for each, that op (tree
    rows): the first op with the linked id in list order, as torch's parse attaches it."""
    order = tree.order
    linked, own = raw.linked_correlation_id[order], raw.correlation_id[order]
    kernel = (raw.device_class[order] == DEVICE_KERNEL) & ~raw.is_user_annotation[order] & (linked > 0)
    kernel &= ~raw.is_async[order]
    ops, kernels = np.flatnonzero(host & (linked == 0)), np.flatnonzero(kernel)
    found, by = first_op_with_id(ops, own[ops], linked[kernels])
    return kernels[found], by


def _inside(events: np.ndarray, above: np.ndarray, counted: np.ndarray,
            include_self: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(position in `events`, region) pairs: each event with every counted region enclosing it
    (and, with `include_self`, the counted region it is)."""
    is_counted = np.zeros(len(above), bool)
    is_counted[counted] = True
    which, regions = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    index, current = np.arange(len(events)), above[events]
    if include_self:
        current = np.where(is_counted[events], events, current)
    while True:
        keep = current >= 0
        index, current = index[keep], current[keep]
        if not len(index):
            return np.concatenate(which), np.concatenate(regions)
        hit = is_counted[current]
        which.append(index[hit])
        regions.append(current[hit])
        current = above[current]


def _by_step_and_name(rows: list[tuple]) -> tuple[RegionStep, ...]:
    sums: dict[tuple[int, str], list[int]] = {}
    for step, name, *values in rows:
        total = sums.setdefault((step, name), [0] * (len(values) + 1))
        for i, value in enumerate((1, *values)):
            total[i] += value
    return tuple(RegionStep(step, name, calls, device / 1000, cpu / 1000, launches, memory, nbytes, flops)
                 for (step, name), (calls, device, cpu, launches, memory, nbytes, flops) in sorted(sums.items()))  # fmt: skip


def _inside_rows(parts: list[tuple], names: list[str]) -> tuple[RegionOp, ...]:
    """RegionOp rows from column groups (step, region name id, op name id, kind, device ns, cpu ns)."""
    step, region, name, device, cpu = (np.concatenate([np.asarray(p[i], np.int64) for p in parts])
                                       for i in (0, 1, 2, 4, 5))  # fmt: skip
    kind = np.concatenate([np.full(len(p[0]), p[3], np.int64) for p in parts])
    keys = np.stack([step, region, name, kind], axis=1)
    if not len(keys):
        return ()
    groups, member = np.unique(keys, axis=0, return_inverse=True)
    member = member.ravel()
    calls = np.bincount(member, minlength=len(groups))
    device_sum = np.bincount(member, weights=device, minlength=len(groups))
    cpu_sum = np.bincount(member, weights=cpu, minlength=len(groups))
    rows = [RegionOp(int(s), names[r], names[n], ("op", "kernel")[k], int(calls[i]), round(device_sum[i]) / 1000,
                     round(cpu_sum[i]) / 1000) for i, (s, r, n, k) in enumerate(groups.tolist())]  # fmt: skip
    return tuple(sorted(rows, key=lambda row: (row.step, row.region, row.kind, row.name)))
