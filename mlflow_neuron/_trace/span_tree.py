"""A profiler cycle as a bounded span tree: what the MLflow trace and the HTML timeline draw. Pure.

Example::

    raw, inputs = read_kineto_cycle(results)   # or read_chrome_trace(trace) + chrome_timeline_inputs
    tree = event_tree(raw)                     # shared with aggregate(raw, ..., tree=tree)
    timeline = build_timeline(raw, cycle_step=prof.step_num, inputs=inputs, tree=tree)
    Path("timeline.json").write_text(timeline.to_json())   # replayable: Timeline.from_json(text)

The tree, top down:

- the cycle, `profiler/step_<N>`;
- its `ProfilerStep#N` ranges;
- inside each step the host ops, nested as torch nests them (`event_tree`'s rules: per-thread
  interval nesting in `(start, -end)` order, an only child named like its parent merged into it). A
  top-level op of another thread (autograd, dataloader) goes under the step its start falls in,
  else under the cycle; async events are leaves there too;
- one span per device stream (NeuronCore, CUDA stream), under the cycle, holding that stream's
  device events with their own names and times.

Times are whole nanoseconds since the epoch: `RawEvents` times plus `origin_ns` (Kineto's
`trace_start_ns()`, or a chrome trace's `baseTimeNanoseconds` plus its profiler span's start).

Bounded: at most `max_spans` spans. The cycle, every step and every stream span always stay (so
a cycle with more steps than `max_spans` goes over); of the rest the longest stay, and each kept
span's dropped descendants become one "… N more ops, X µs" span under it (X: the time of the
dropped spans that are not inside other dropped spans). Nested spans never outlast their parent,
so the kept set is closed under parents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .event_tree import EventTree, event_tree
from .events import HOST, DeviceLanes, RawEvents, ShapesReader, TimelineInputs
from .names import STEP_NAME, demangle
from .steps import step_numbers
from .timeline import CYCLE, DEFAULT_MAX_SPANS, ELLIPSIS, KERNEL, OP, STEP, STREAM, SUMMARY, Timeline, TimelineSpan


def build_timeline(
    raw: RawEvents,
    *,
    cycle_step: int,
    max_spans: int = DEFAULT_MAX_SPANS,
    inputs: TimelineInputs | None = None,
    tree: EventTree | None = None,
    root_name: str | None = None,
) -> Timeline:
    """The span tree of one cycle (see the module docstring).

    Args:
        raw: the cycle's events (`raw_events_from_kineto` or `read_chrome_file(...).raw`).
        cycle_step: the step the cycle is logged at.
        root_name: the root span's name (the product names it after the cycle's artifact folder,
            `_record.model.cycle_dir`); default "cycle <cycle_step>".
        max_spans: the cap (at least 1).
        inputs: from `read_kineto_cycle` / `read_chrome_file` (`.inputs`): the
            epoch origin (without one, times stay trace-relative), the device streams (without
            them a chrome trace's device rows split by (pid, tid), Kineto's all go to one "device"
            stream), and input shapes (recorded with `record_shapes=True`).
        tree: `event_tree(raw)`, when the caller has it already (from aggregating the cycle).

    Raises:
        ValueError: max_spans < 1, `lanes` does not fit `raw`, or `tree` is another's.
    """
    if max_spans < 1:
        raise ValueError(f"max_spans must be at least 1, got {max_spans}")
    inputs = inputs or TimelineInputs()
    origin_ns, lanes, input_shapes = inputs.origin_ns or 0, inputs.lanes, inputs.input_shapes
    root_name = root_name or f"cycle {cycle_step}"
    n = len(raw)
    if n == 0:
        root = TimelineSpan(root_name, CYCLE, origin_ns, origin_ns, -1, {"step": cycle_step})
        return Timeline(root_name, cycle_step, origin_ns, (root,), 1, 0)
    if lanes is not None and len(lanes.lane) != n:
        raise ValueError(f"lanes has {len(lanes.lane)} rows, the events {n}")
    if tree is not None and tree.raw is not raw:
        raise ValueError("tree is not the tree of these events: pass event_tree(raw)")
    t = _tree(tree if tree is not None else event_tree(raw))
    return _select(raw, t, root_name, cycle_step, origin_ns, max_spans, lanes, input_shapes)


@dataclass
class _Tree:
    """Per event, in torch's list order (`order` maps back to raw rows): the `EventTree`'s columns
    the timeline reads, and which events become spans."""

    order: np.ndarray
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray  # display name ids (ProfilerStep* merged), for calls
    names: list[str]
    present: np.ndarray  # becomes a span (surviving sync host, async host, device rows)
    device: np.ndarray
    parent: np.ndarray  # torch's parent (after merging), -1 none
    self_cpu_us: np.ndarray
    self_device_us: np.ndarray
    is_step: np.ndarray
    calls: np.ndarray  # calls of the event's (name, host/device) in the cycle

    def names_of(self, ids: np.ndarray) -> list[str]:
        return [self.names[k] for k in self.name[ids].tolist()]


def _tree(tree: EventTree) -> _Tree:
    """What the timeline draws of the event tree: which events become spans, and their calls."""
    async_host = tree.host & ~tree.sync_host
    present = (tree.survivor & tree.sync_host) | async_host | tree.device
    step_id = [i for i, s in enumerate(tree.names) if s == STEP_NAME]
    is_step = present & tree.sync_host & np.isin(tree.name, step_id)
    key = tree.name * 2 + tree.device
    calls = np.bincount(key[present & ~async_host], minlength=2 * len(tree.names))[key]
    return _Tree(tree.order, tree.start_ns, tree.end_ns, tree.name, tree.names, present, tree.device,
                 np.where(present, tree.parent, -1), tree.self_cpu_us, tree.self_device_us, is_step, calls)  # fmt: skip


def _select(raw, t: _Tree, root_name: str, cycle_step: int, origin_ns: int, max_spans: int,
            lanes: DeviceLanes | None, input_shapes: ShapesReader | None) -> Timeline:  # fmt: skip
    n = len(t.order)
    steps = np.flatnonzero(t.is_step)  # already in start order
    lane_key, lane_names = _lanes(raw, t, lanes)
    parent = _hang(t, steps, lane_key, len(lane_names))
    kept, anchor, summarized = _keep(t, parent, steps, len(lane_names), max_spans)

    # Spans: parents before children: root, streams, steps, then the other events in tree order
    # (a parent starts no later than its child; an op of another thread may start with its step).
    ids = np.flatnonzero(kept[:n])
    ids = np.concatenate([ids[t.is_step[ids]], ids[~t.is_step[ids]]])
    index = np.full(len(parent), -1, np.int64)
    present_rows = np.flatnonzero(t.present)
    dropped = int(len(present_rows) - kept[:n].sum())
    lo = int(t.start[present_rows].min()) if len(present_rows) else 0
    hi = int(t.end[present_rows].max()) if len(present_rows) else 0
    spans = [TimelineSpan(root_name, CYCLE, origin_ns + lo, origin_ns + hi, -1, {
        "step": cycle_step, "spans_total": int(len(present_rows) + 1 + len(lane_names)),
        "spans_dropped": dropped, "steps": len(steps)})]  # fmt: skip
    index[n] = 0
    spans += _stream_spans(t, lane_key, lane_names, index, n, origin_ns, lo)
    raw_names = [demangle(s) for s in raw.names]
    ev_name = raw.name_id[t.order]
    step_of = dict(zip(steps.tolist(), step_numbers([raw_names[i] for i in ev_name[steps]], len(steps), cycle_step)))
    shapes = _shapes(input_shapes, t.order, ids, t.device)
    launcher = _launchers(raw, t, ids)
    up = _nearest_kept(parent, kept)  # the parent itself, unless ties broke the closure
    index[ids] = len(spans) + np.arange(len(ids))  # parents come first: their index is set already
    spans += _event_spans(raw, t, ids, index[up[ids]], origin_ns, [raw_names[k] for k in ev_name[ids].tolist()],
                          step_of, shapes, launcher, lane_names, lane_key)  # fmt: skip
    spans.extend(_summary_spans(t, anchor, summarized, index, parent, origin_ns, n))
    return Timeline(root_name, cycle_step, origin_ns, tuple(spans), int(len(present_rows) + 1 + len(lane_names)),
                    dropped)  # fmt: skip


def _hang(t: _Tree, steps: np.ndarray, lane_key: np.ndarray, n_lanes: int) -> np.ndarray:
    """Where each present event hangs: its torch parent; else the step its start falls in; device
    rows under their stream. Synthetic nodes follow the events: the root at n (the steps' parent),
    streams at n+1+k (under the root)."""
    n = len(t.order)
    root = n
    parent = t.parent.copy()
    loose = t.present & (parent < 0) & ~t.device & ~t.is_step
    parent[loose] = _step_holding(t.start[loose], t.start[steps], t.end[steps], steps, root)
    parent[t.is_step] = root
    parent[t.device] = n + 1 + lane_key[t.device]
    full_parent = np.concatenate([parent, np.full(1 + n_lanes, -1, np.int64)])
    full_parent[n + 1:] = root
    return full_parent


def _keep(t: _Tree, parent: np.ndarray, steps: np.ndarray, n_lanes: int, max_spans: int):
    """Which nodes become spans: root, streams, steps; then the longest of the rest, ties to the
    shallower (earlier), as many as fit with the summary spans they need. Returns (kept, each
    dropped event's kept ancestor, the kept nodes that get a summary)."""
    n = len(t.order)
    mandatory = 1 + n_lanes + len(steps)
    budget = max(max_spans - mandatory, 0)
    ranked = _longest(np.flatnonzero(t.present & ~t.is_step), t.end - t.start, budget)
    kept = np.zeros(len(parent), bool)
    kept[n:] = True
    kept[steps] = True
    take = min(budget, len(ranked))
    while True:  # summaries count against the cap: a few rounds until they fit
        kept_now = kept.copy()
        kept_now[ranked[:take]] = True
        anchor, summarized = _summaries(parent, kept_now, t.present)
        if take == 0 or take + len(summarized) <= budget:
            return kept_now, anchor, summarized
        take = max(0, min(take - 1, budget - len(summarized)))


def _stream_spans(t: _Tree, lane_key: np.ndarray, lane_names, index: np.ndarray, n: int, origin_ns: int,
                  lo: int) -> list[TimelineSpan]:  # fmt: skip
    """One span per device stream, under the root, spanning its kernels."""
    spans = []
    dev = np.flatnonzero(t.device & t.present)
    for k, lane_name in enumerate(lane_names):
        rows = dev[lane_key[dev] == k]
        s, e = (int(t.start[rows].min()), int(t.end[rows].max())) if len(rows) else (lo, lo)
        index[n + 1 + k] = 1 + k
        spans.append(TimelineSpan(lane_name, STREAM, origin_ns + s, origin_ns + e, 0, {
            "stream": lane_name, "kernels": int(len(rows)),
            "device_us": _us(int((t.end[rows] - t.start[rows]).sum()))}))  # fmt: skip
    return spans


def _longest(candidates: np.ndarray, duration: np.ndarray, k: int) -> np.ndarray:
    """The k longest candidates, longest first, ties in tree order (a parent before its child)."""
    key = -duration[candidates] * (len(duration) + 1) + candidates  # exact: ns * events < 2**63
    if k < len(candidates):
        top = np.argpartition(key, k)[:k] if k else np.zeros(0, np.int64)
        candidates, key = candidates[top], key[top]
    return candidates[np.argsort(key, kind="stable")]


def _summaries(parent: np.ndarray, kept: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every dropped present event, its nearest kept ancestor; and the kept nodes that get a
    summary span (those with dropped descendants)."""
    n = len(present)
    up = _nearest_kept(parent, kept)
    dropped = np.flatnonzero(present & ~kept[:n])
    anchor = np.full(len(parent), -1, np.int64)
    anchor[dropped] = up[dropped]
    return anchor, np.flatnonzero(np.bincount(anchor[dropped], minlength=len(parent)))  # sorted, unique


def _nearest_kept(parent: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Per node, its nearest kept strict ancestor (-1: none), by pointer doubling."""
    jump = parent.copy()  # invariant: every node strictly between i and jump[i] is dropped
    while True:
        hop = (jump >= 0) & ~kept[np.maximum(jump, 0)]
        if not hop.any():
            return jump
        jump[hop] = jump[jump[hop]]


def _summary_spans(t: _Tree, anchor, summarized, index, parent, origin_ns: int, n: int) -> list[TimelineSpan]:
    """One "… N more ops, X µs" span per kept node with dropped descendants. X counts only the
    dropped spans whose own parent was kept (the others lie inside those)."""
    if len(summarized) == 0:
        return []
    rows = np.flatnonzero(anchor[:n] >= 0)
    slot_of = np.zeros(len(anchor), np.int64)
    slot_of[summarized] = np.arange(len(summarized))
    slot = slot_of[anchor[rows]]
    count = np.bincount(slot, minlength=len(summarized))
    outer = parent[rows] == anchor[rows]
    duration = (t.end - t.start)[rows]
    time_ns = np.bincount(slot[outer], weights=duration[outer], minlength=len(summarized))
    first = np.full(len(summarized), np.iinfo(np.int64).max)
    last = np.full(len(summarized), np.iinfo(np.int64).min)
    np.minimum.at(first, slot, t.start[rows])
    np.maximum.at(last, slot, t.end[rows])
    kernels = np.bincount(slot, weights=t.device[rows], minlength=len(summarized))
    spans = []
    for k, node in enumerate(summarized.tolist()):
        what = ("kernel" if kernels[k] == count[k] else "op") + ("s" if count[k] > 1 else "")
        us = _us(int(time_ns[k]))
        spans.append(TimelineSpan(f"{ELLIPSIS} {int(count[k])} more {what}, {us:g} \u00b5s", SUMMARY,
                                  origin_ns + int(first[k]), origin_ns + int(last[k]), int(index[node]),
                                  {"dropped_spans": int(count[k]), "dropped_time_us": us}))  # fmt: skip
    return spans


def _event_spans(raw, t: _Tree, ids: np.ndarray, parents: np.ndarray, origin_ns: int, names: list[str],
                 step_of: dict, shapes: dict, launcher: dict, lane_names, lane_key) -> list[TimelineSpan]:  # fmt: skip
    """The kept events' spans. Columns become lists first: reading numpy scalars one at a time was
    most of the cost of 2,000 spans."""
    rows = t.order[ids]
    columns = zip(ids.tolist(), parents.tolist(), names, t.start[ids].tolist(), t.end[ids].tolist(),
                  t.names_of(ids), t.calls[ids].tolist(), t.device[ids].tolist(), lane_key[ids].tolist(),
                  raw.linked_correlation_id[rows].tolist(), raw.correlation_id[rows].tolist(),
                  raw.thread[rows].tolist(), raw.is_async[rows].tolist(), t.self_cpu_us[ids].tolist(),
                  t.self_device_us[ids].tolist())  # fmt: skip
    spans = []
    for i, parent, name, s, e, op_name, calls, device, lane, linked, own, thread, is_async, self_cpu, self_device in columns:
        attrs: dict[str, Any]
        if device:
            kind = KERNEL
            attrs = {"op_name": op_name, "calls": calls, "device_us": (e - s) / 1000.0, "stream": lane_names[lane]}
            if linked:
                attrs["correlation_id"] = linked
                if linked in launcher:
                    attrs["launched_by"] = launcher[linked]
        else:
            step = step_of.get(i)
            kind = STEP if step is not None else OP
            attrs = {"op_name": op_name, "calls": calls, "self_cpu_us": round(self_cpu, 3),
                     "total_cpu_us": (e - s) / 1000.0, "self_device_us": round(self_device, 3), "thread": thread}  # fmt: skip
            if own:
                attrs["correlation_id"] = own
            if is_async:
                attrs["async"] = True
            if step is not None:
                attrs["step"] = step
            if (shape := shapes.get(i)) is not None:
                attrs["input_shapes"] = shape
        spans.append(TimelineSpan(name, kind, origin_ns + s, origin_ns + e, parent, attrs))
    return spans


def _launchers(raw, t: _Tree, ids: np.ndarray) -> dict[int, str]:
    """Correlation id -> name of the host op that carries it, for the kept kernels."""
    wanted = raw.linked_correlation_id[t.order[ids[t.device[ids]]]]
    wanted = np.unique(wanted[wanted > 0])
    if len(wanted) == 0:
        return {}
    host = np.flatnonzero((raw.device_class == HOST) & (raw.linked_correlation_id == 0)
                          & np.isin(raw.correlation_id, wanted))  # fmt: skip
    names = {k: demangle(raw.names[k]) for k in np.unique(raw.name_id[host]).tolist()}
    return {int(c): names[k] for c, k in zip(raw.correlation_id[host].tolist(), raw.name_id[host].tolist())}


def _lanes(raw, t: _Tree, lanes: DeviceLanes | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Per event (tree order), its stream index; and the streams' names, in first-use order."""
    n = len(t.order)
    dev_rows = np.flatnonzero(t.device)
    if lanes is not None:
        key = lanes.lane[t.order]
        names_of = list(lanes.names)
    else:
        key = raw.thread[t.order]
        names_of = None
    key = np.where(t.device, key, -1)
    if len(dev_rows) == 0:
        return np.full(n, -1, np.int64), ()
    used, first = np.unique(key[dev_rows], return_index=True)
    used = used[np.argsort(first)]
    remap = np.full(n, -1, np.int64)
    slot = {int(k): j for j, k in enumerate(used.tolist())}
    remap[dev_rows] = [slot[int(k)] for k in key[dev_rows].tolist()] if len(used) > 1 else 0
    if names_of is not None:
        names = tuple(names_of[k] if 0 <= k < len(names_of) else "device" for k in used.tolist())
    else:
        names = ("device",) if len(used) == 1 else tuple(f"device stream {j}" for j in range(len(used)))
    return remap, names


def _step_holding(at: np.ndarray, step_start: np.ndarray, step_end: np.ndarray, steps: np.ndarray,
                  root: int) -> np.ndarray:  # fmt: skip
    """The step event whose range holds each time, else root."""
    if len(steps) == 0:
        return np.full(len(at), root, np.int64)
    k = np.searchsorted(step_start, at, side="right") - 1
    inside = (k >= 0) & (at < step_end[np.maximum(k, 0)])
    return np.where(inside, steps[np.maximum(k, 0)], root)


def _shapes(reader: ShapesReader | None, order: np.ndarray, ids: np.ndarray, device: np.ndarray) -> dict:
    if reader is None:
        return {}
    host = ids[~device[ids]]
    values = reader(order[host])
    return {int(i): v for i, v in zip(host.tolist(), values) if v}


def _us(ns: int) -> float:
    return ns / 1000.0
