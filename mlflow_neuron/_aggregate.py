"""The aggregator: a cycle's `RawEvents` linked and summed into the `CycleProfile` that
`extract_cycle(prof.events())` gives, with the same rules (torch 2.13,
`torch/autograd/profiler.py` `_parse_kineto_results` and `profiler_util.py` `EventList._build_tree`):

- names are demangled and `ProfilerStep#N` becomes `ProfilerStep*`;
- async events have no parent, no children and no self or device time;
- a host event with a link takes the thread of the unlinked host op whose correlation id it links
  to; DEVICE_KERNEL rows become kernels of that op; device rows whose link matches no op stay
  device rows that no op carries;
- parents come from per-thread interval nesting in `(start, -end)` order, as torch's stack does,
  then a child named like its parent and its only child is merged into it (the parent takes the
  child's children and kernels, dropping its own);
- device time of a host event is its kernels plus its children's device time (legacy fallback
  events: their own kernel only), and counts only when the profiler had a `use_device`.

Sums run in torch's order, so on Python 3.10/3.11 the numbers match `extract_cycle(prof.events())`
to the last bit (from 3.12 torch's builtin `sum()` is compensated: last-bit differences; the tests
allow 1e-6 relative). Pure: no MLflow, no files.
"""

from __future__ import annotations

import numpy as np
import torch

from ._extract import DEVICE_ANNOTATION, KERNEL, OP, CycleProfile, OpStats, device_time_state, ranked
from ._raw_events import DEVICE_KERNEL, DEVICE_OTHER, HOST, RawEvents, factorize
from ._steps import split_by_step, step_numbers

_KINDS = (OP, KERNEL, DEVICE_ANNOTATION)
_STEP_PREFIX, _STEP_NAME, _ATEN_PREFIX = "ProfilerStep#", "ProfilerStep*", "aten::"


def aggregate(raw: RawEvents, *, device: str, device_profiled: bool, default_step: int = 0) -> CycleProfile:
    """The CycleProfile `extract_cycle(prof.events(), device=..., device_profiled=...,
    default_step=...)` gives for the same cycle: same rows, numbers, totals, aten_calls,
    active_steps, event_count, order and per-step samples."""
    n = len(raw)
    if n == 0:
        return CycleProfile(device, device_time_state(device_profiled, 0.0), (), 0.0, 0.0, 0.0, 0, 0, 0)
    names, name_of = _display_names(raw.names)
    cls, is_async = raw.device_class, raw.is_async
    host = cls == HOST
    sync_host = host & ~is_async
    thread = _linked_threads(raw, sync_host)
    kernels = _kernel_sums(raw, sync_host)
    is_legacy = sync_host & (raw.legacy_device_us > 0)

    # torch's list order: (start, -end), ties in recording order
    order = np.lexsort((np.arange(n), -raw.end_ns, raw.start_ns))
    start, end = raw.start_ns[order], raw.end_ns[order]
    start_us, end_us = start / 1000.0, end / 1000.0  # relative ns / 1000, as torch computes them
    name = name_of[raw.name_id[order]]
    cls, is_async, sync_host, host = cls[order], is_async[order], sync_host[order], host[order]
    kernels, is_legacy, annotation = kernels[order], is_legacy[order], raw.is_user_annotation[order]

    tree = np.flatnonzero(sync_host)
    parent_local, depth_local = _cpu_parents(thread[order][tree], start[tree], end[tree])
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    parent[tree] = np.where(parent_local >= 0, tree[np.maximum(parent_local, 0)], -1)
    depth[tree] = depth_local
    survivor, parent, kernel_owner = _remove_dup_nodes(name, parent)

    duration = end_us - start_us
    cpu_total = np.where(host, duration, 0.0)
    has_parent = survivor & (parent >= 0)
    child_cpu = np.bincount(parent[has_parent], weights=cpu_total[has_parent], minlength=n)
    self_cpu = np.where(sync_host, cpu_total - child_cpu, 0.0)
    device_rows = (cls == DEVICE_KERNEL) | (cls == DEVICE_OTHER)
    device_total = np.zeros(n)
    self_device = np.zeros(n)
    if raw.use_device:
        device_total = np.where(device_rows & ~is_async, duration, 0.0)
        self_device = device_total.copy()
        own = kernels[kernel_owner]
        if (own != 0).any():
            _host_device_time(own, is_legacy, parent, depth, survivor & sync_host, device_total, self_device)

    kind = np.where(device_rows, np.where(annotation, 2, 1), 0)
    counted = np.flatnonzero(survivor & ~is_async)  # extract_cycle skips async events
    group = name[counted] * 3 + kind[counted]
    groups, slot = np.unique(group, return_inverse=True)
    sums = [np.bincount(slot, weights=col[counted], minlength=len(groups))
            for col in (self_device, device_total, self_cpu, cpu_total)]  # fmt: skip
    calls = np.bincount(slot, minlength=len(groups))
    ck, cd = kind[counted], self_device[counted]
    total_device = _sequential_sum(cd[(ck == 1) | ((ck == 0) & is_legacy[counted])])
    total_cpu = _sequential_sum(self_cpu[counted])
    attributed = _sequential_sum(cd[ck == 0])
    is_step = np.isin(name[counted], [i for i, s in enumerate(names) if s == _STEP_NAME])
    steps = int(is_step.sum())

    device_time = device_time_state(device_profiled, total_device)
    ops = ranked((OpStats(names[g // 3], _KINDS[g % 3], int(calls[i]), *(float(s[i]) for s in sums))
                  for i, g in enumerate(groups.tolist())), device_time)  # fmt: skip
    aten = np.array([s.startswith(_ATEN_PREFIX) for s in names], bool)[name]
    top_level = _top_level_aten(aten & survivor & ~device_rows, aten, parent)

    step_at = counted[is_step]
    linked, own_id = raw.linked_correlation_id[order], raw.correlation_id[order]
    per_step, step_totals = split_by_step(
        step_starts=start[step_at],
        step_numbers=step_numbers([raw.names[i] for i in raw.name_id[order][step_at]], len(step_at), default_step),
        default_step=default_step,
        placed_at=_placed_at(start, linked, own_id, survivor & sync_host & (linked == 0), device_rows)[counted],
        name_id=name[counted], names=names, kind_id=ck, kinds=_KINDS,
        self_device_us=cd, self_cpu_us=self_cpu[counted],
        in_device_total=(ck == 1) | ((ck == 0) & is_legacy[counted]),
        aten_starts=start[top_level],
    )  # fmt: skip
    return CycleProfile(
        device=device,
        device_time=device_time,
        ops=ops,
        total_self_device_time_us=total_device,
        total_self_cpu_time_us=total_cpu,
        attributed_device_time_us=attributed,
        aten_calls=int(top_level.sum()),
        active_steps=steps if steps or not len(groups) else 1,
        event_count=int(survivor.sum()),
        steps=per_step,
        step_totals=step_totals,
        annotations=frozenset(names[i] for i in np.unique(name[survivor & sync_host & annotation]).tolist()),
    )


def _placed_at(start: np.ndarray, linked: np.ndarray, own_id: np.ndarray, frontend: np.ndarray,
               device_rows: np.ndarray) -> np.ndarray:  # fmt: skip
    """When each event counts as happening, for per-step samples: its start, or for a device
    event linked to an op, that op's start (the first op with the id, in list order)."""
    placed = start.copy()
    ops = np.flatnonzero(frontend)
    launched = np.flatnonzero(device_rows & (linked > 0))
    if len(ops) and len(launched):
        ids, first = np.unique(own_id[ops], return_index=True)
        at = np.minimum(np.searchsorted(ids, linked[launched]), len(ids) - 1)
        found = ids[at] == linked[launched]
        placed[launched[found]] = start[ops[first[at[found]]]]
    return placed


def _display_names(raw_names: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    """Names as FunctionEvent.name has them (demangled, ProfilerStep#N -> ProfilerStep*), as ids."""
    demangle = getattr(torch._C, "_demangle", None)
    shown = []
    for s in raw_names:
        s = demangle(s) if demangle is not None and len(s) > 1 else s
        shown.append(_STEP_NAME if s.startswith(_STEP_PREFIX) else s)
    names, of_raw = factorize(shown)
    return names, of_raw


def _linked_threads(raw: RawEvents, sync_host: np.ndarray) -> np.ndarray:
    """Host events linked to an op move to the op's thread (the last such op, as torch's loop)."""
    thread = raw.thread.copy()
    frontend = np.flatnonzero(sync_host & (raw.linked_correlation_id == 0))
    follower = np.flatnonzero((raw.device_class == HOST) & (raw.linked_correlation_id > 0))
    if len(frontend) and len(follower):
        ids, first = np.unique(raw.correlation_id[frontend][::-1], return_index=True)
        op_thread = raw.thread[frontend][::-1][first]
        at = np.minimum(np.searchsorted(ids, raw.linked_correlation_id[follower]), len(ids) - 1)
        found = ids[at] == raw.linked_correlation_id[follower]
        thread[follower[found]] = op_thread[at[found]]
    return thread


def _kernel_sums(raw: RawEvents, sync_host: np.ndarray) -> np.ndarray:
    """Per event, its kernels' summed durations (µs): the legacy one first, then linked ones in
    recording order, added left to right as torch's `sum()` over `kernels` does."""
    legacy = raw.legacy_device_us
    kernels = legacy.copy()
    launched = np.flatnonzero((raw.device_class == DEVICE_KERNEL) & (raw.linked_correlation_id > 0))
    frontend = np.flatnonzero(sync_host & (raw.linked_correlation_id == 0))
    if len(launched) and len(frontend):
        ids, slot = np.unique(raw.linked_correlation_id[launched], return_inverse=True)
        durations = raw.end_ns[launched] / 1000.0 - raw.start_ns[launched] / 1000.0
        by_id = np.bincount(slot, weights=durations, minlength=len(ids))
        at = np.minimum(np.searchsorted(ids, raw.correlation_id[frontend]), len(ids) - 1)
        found = ids[at] == raw.correlation_id[frontend]
        takers, at = frontend[found], at[found]
        kernels[takers] = by_id[at]
        for event, which in zip(takers.tolist(), at.tolist()):
            if legacy[event] > 0:  # rare: a legacy kernel and linked ones on one event
                kernels[event] = sum(durations[slot == which].tolist(), float(legacy[event]))
    return kernels


def _cpu_parents(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent (index, -1 for none) and depth of events in torch's list order, as
    `EventList._populate_cpu_children` nests them per thread.

    Vectorised for well-nested threads: an event's depth is the number of earlier events still open
    when it starts, its parent the last earlier event one level up. That equals torch's stack when
    every event sits inside its parent; threads where that check fails get torch's loop.
    """
    m = len(start)
    parent, depth = np.full(m, -1, np.int64), np.zeros(m, np.int64)
    if m == 0:
        return parent, depth
    by_thread = np.argsort(thread, kind="stable")
    th_ids, th = np.unique(thread[by_thread], return_inverse=True)
    s, e = start[by_thread], end[by_thread]
    pos = np.arange(m)
    first = np.searchsorted(th, th)  # start of each event's thread block
    lo = min(s.min(), e.min())
    span = int(max(s.max(), e.max()) - lo) + 2
    if len(th_ids) * span < 2**62 and (e >= s).all():
        base = th * span
        key_s, key_e = base + (s - lo), np.sort(base + (e - lo))
        ended = np.searchsorted(key_e, key_s, side="right") - np.searchsorted(key_e, base, side="left")
        group_end = np.searchsorted(key_s, key_s, side="right")
        zero = np.concatenate([[0], np.cumsum(s == e)])
        group_start = np.searchsorted(key_s, key_s, side="left")
        zeros_in_group = zero[group_end] - zero[group_start]
        later_zeros = group_end - np.maximum(pos, group_end - zeros_in_group)  # zero-length at s, not before
        d = (pos - first) - (ended - later_zeros)
        p = _last_at_level(th, d, pos)
        ok = np.where(d > 0, (p >= 0) & (s < e[np.maximum(p, 0)]) & (e <= e[np.maximum(p, 0)]), True)
        bad_threads = np.unique(th[~ok])
    else:
        d, p, bad_threads = np.zeros(m, np.int64), np.full(m, -1, np.int64), np.arange(len(th_ids))
    for t in bad_threads.tolist():
        lo_i, hi_i = np.searchsorted(th, t), np.searchsorted(th, t, side="right")
        p[lo_i:hi_i], d[lo_i:hi_i] = _stack_parents(s[lo_i:hi_i].tolist(), e[lo_i:hi_i].tolist(), lo_i)
    parent[by_thread] = np.where(p >= 0, by_thread[np.maximum(p, 0)], -1)
    depth[by_thread] = d
    return parent, depth


def _last_at_level(th: np.ndarray, d: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """For each event, the last earlier event of its thread at depth d - 1 (-1 if none)."""
    m = len(pos)
    if d.max(initial=0) >= 2**20 or m >= 2**31 or th.max(initial=0) >= 2**12:
        return np.full(m, -1, np.int64)  # sends every thread through the loop
    key = (th << 51) | (np.maximum(d, 0) << 31) | pos
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    query = (th << 51) | (np.maximum(d - 1, 0) << 31) | pos
    at = np.searchsorted(sorted_key, query, side="left") - 1
    cand = order[np.maximum(at, 0)]
    found = (at >= 0) & (d > 0) & (th[cand] == th) & (d[cand] == d - 1)
    return np.where(found, cand, -1)


def _stack_parents(s: list, e: list, offset: int) -> tuple[list, list]:
    """torch's stack, for one thread: parents (offset indices) and depths."""
    parent, depth, stack = [-1] * len(s), [0] * len(s), []
    for j, (sj, ej) in enumerate(zip(s, e)):
        while stack:
            top = stack[-1]
            if sj >= e[top] or ej > e[top]:
                stack.pop()
            else:
                parent[j], depth[j] = top + offset, depth[top] + 1
                break
        stack.append(j)
    return parent, depth


def _remove_dup_nodes(name: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EventList._remove_dup_nodes: an only child named like its parent merges into the parent.

    Returns which events survive, parents after merging, and whose kernel list each event ends with
    (the merged child's: torch replaces the parent's kernels, it does not add them).
    """
    n = len(name)
    survivor, kernel_owner = np.ones(n, bool), np.arange(n)
    child = np.flatnonzero(parent >= 0)
    if len(child) == 0:
        return survivor, parent, kernel_owner
    children = np.bincount(parent[child], minlength=n)
    p = parent[child]
    merged = child[(name[p] == name[child]) & (children[p] == 1)]
    if len(merged) == 0:
        return survivor, parent, kernel_owner
    parent = parent.copy()
    for c in merged.tolist():  # list order: a chain merges top-down, as in torch's single pass
        up = parent[c]
        while not survivor[up]:
            up = parent[up]
        kernel_owner[up] = kernel_owner[c]
        survivor[c] = False
    while True:  # children of merged events now hang from the surviving ancestor
        hop = (parent >= 0) & ~survivor[np.maximum(parent, 0)]
        if not hop.any():
            return survivor, parent, kernel_owner
        parent[hop] = parent[parent[hop]]


def _host_device_time(
    own: np.ndarray, is_legacy: np.ndarray, parent: np.ndarray, depth: np.ndarray,
    tree: np.ndarray, device_total: np.ndarray, self_device: np.ndarray,
) -> None:  # fmt: skip
    """device_time_total bottom-up: own kernels plus children's (legacy events: own kernels only).

    A surviving event's children all share one depth, so per level the children's sums run in list
    order, as torch's `sum()` over `cpu_children` does.
    """
    n = len(own)
    children_sum = np.zeros(n)
    for level in range(int(depth[tree].max(initial=0)), -1, -1):
        at = np.flatnonzero(tree & (depth == level))
        total = np.where(is_legacy[at], own[at], own[at] + children_sum[at])
        device_total[at] = total
        self_device[at] = total - children_sum[at]
        up = parent[at] >= 0
        children_sum += np.bincount(parent[at][up], weights=total[up], minlength=n)


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


def _sequential_sum(values: np.ndarray) -> float:
    """Left-to-right float sum, as Python's loop adds (numpy's sum is pairwise)."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0
