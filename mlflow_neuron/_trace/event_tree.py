"""A cycle's events linked as torch's parse links its `FunctionEvent`s, one row per event: the
tree that `aggregate` sums into the op table and `span_tree` draws. Pure: no MLflow, no files.

Example::

    tree = event_tree(raw)
    profile = aggregate(raw, device="neuron", device_profiled=True, tree=tree)
    timeline = build_timeline(raw, cycle_step=4, tree=tree)  # the same tree: computed once

Rules (torch 2.13, `torch/autograd/profiler.py` `_parse_kineto_results` and `profiler_util.py`
`EventList._build_tree`):

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .events import DEVICE_KERNEL, DEVICE_OTHER, HOST, RawEvents, factorize
from .names import display_name


@dataclass(frozen=True, eq=False)
class EventTree:
    """Per event, in torch's list order: `(start, -end)`, ties in recording order. `order[i]` is
    event i's row in `raw`. Times: ns from the trace start (`start_ns`, `end_ns`), µs as torch
    computes them (the rest)."""

    raw: RawEvents
    order: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    names: list[str]  # display names (demangled, ProfilerStep*)
    name: np.ndarray  # index into names
    host: np.ndarray
    sync_host: np.ndarray  # host and not async: the events that nest
    device: np.ndarray  # DEVICE_KERNEL or DEVICE_OTHER rows
    is_legacy: np.ndarray  # sync host events with legacy fallback device time
    survivor: np.ndarray  # False: merged into its parent
    parent: np.ndarray  # after merging; -1: none (every event that is not sync host)
    cpu_total_us: np.ndarray
    self_cpu_us: np.ndarray
    device_total_us: np.ndarray  # 0 everywhere without a `use_device`
    self_device_us: np.ndarray

    def __len__(self) -> int:
        return len(self.order)


def event_tree(raw: RawEvents) -> EventTree:
    """The events of `raw` linked and timed as torch's parse does (see the module docstring)."""
    n = len(raw)
    names, name_of = _display_names(raw.names)
    host = raw.device_class == HOST
    sync_host = host & ~raw.is_async
    thread = _linked_threads(raw, sync_host)
    kernels = _kernel_sums(raw, sync_host)
    is_legacy = sync_host & (raw.legacy_device_us > 0)

    order = np.lexsort((np.arange(n), -raw.end_ns, raw.start_ns))
    start, end = raw.start_ns[order], raw.end_ns[order]
    name = name_of[raw.name_id[order]]
    cls, is_async, sync_host, host = raw.device_class[order], raw.is_async[order], sync_host[order], host[order]
    kernels, is_legacy = kernels[order], is_legacy[order]

    nesting = np.flatnonzero(sync_host)
    parent_local, depth_local = _cpu_parents(thread[order][nesting], start[nesting], end[nesting])
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    parent[nesting] = np.where(parent_local >= 0, nesting[np.maximum(parent_local, 0)], -1)
    depth[nesting] = depth_local
    survivor, parent, kernel_owner = _remove_dup_nodes(name, parent)

    duration = end / 1000.0 - start / 1000.0  # relative ns / 1000, as torch computes them
    cpu_total = np.where(host, duration, 0.0)
    has_parent = survivor & (parent >= 0)
    child_cpu = np.bincount(parent[has_parent], weights=cpu_total[has_parent], minlength=n)
    self_cpu = np.where(sync_host, cpu_total - child_cpu, 0.0)
    device = (cls == DEVICE_KERNEL) | (cls == DEVICE_OTHER)
    device_total = np.zeros(n)
    self_device = np.zeros(n)
    if raw.use_device:
        device_total = np.where(device & ~is_async, duration, 0.0)
        self_device = device_total.copy()
        own = kernels[kernel_owner]
        if (own != 0).any():
            _host_device_time(own, is_legacy, parent, depth, survivor & sync_host, device_total, self_device)
    return EventTree(raw, order, start, end, names, name, host, sync_host, device, is_legacy, survivor, parent,
                     cpu_total, self_cpu, device_total, self_device)  # fmt: skip


def first_op_with_id(op_rows: np.ndarray, op_ids: np.ndarray, linked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each linked id, the first of `op_rows` (in their order) whose own id it is, as torch
    attaches a device event to its launching op: (which linked ids were found, their op rows)."""
    if not len(op_rows) or not len(linked):
        return np.zeros(len(linked), bool), np.zeros(0, np.int64)
    ids, first = np.unique(op_ids, return_index=True)
    at = np.minimum(np.searchsorted(ids, linked), len(ids) - 1)
    found = ids[at] == linked
    return found, op_rows[first[at[found]]]


def _display_names(raw_names: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    """Names as FunctionEvent.name has them (demangled, ProfilerStep#N -> ProfilerStep*), as ids."""
    return factorize([display_name(s) for s in raw_names])


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
        both = legacy[takers] > 0  # rare: a legacy kernel and linked ones on one event
        for event, which in zip(takers[both].tolist(), at[both].tolist()):
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
