"""What `RawEvents` does not carry and a timeline needs, read from the same source: the epoch
origin of the events' times, the device stream of each device row, and input shapes.

Example::

    raw, inputs = read_kineto_cycle(prof)          # one read of the Kineto events for both
    raw = raw_events_from_chrome_trace(trace)
    inputs = timeline_inputs_from_chrome_trace(trace, raw)

Kineto: rows are matched to events by position (checked on a sample of names and times), or,
where `_read_kineto` filtered events, by replaying its filter. Chrome traces: the device rows are
already split by (pid, tid); the names come from the trace's metadata events. Pure: no MLflow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _chrome, _kineto
from ._raw_events import HOST, MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME, RawEvents, factorize
from ._timeline import DeviceLanes, TimelineInputs


def read_kineto_cycle(prof: Any) -> tuple[RawEvents, TimelineInputs] | None:
    """`raw_events_from_kineto(prof)` and its `timeline_inputs_from_kineto`, from one read of
    the Kineto events (building that list is most of a second read's cost); None where
    `raw_events_from_kineto` gives None."""
    read = _kineto.read_kineto_events(prof)
    if read is None:
        return None
    raw, events, origin = read
    return raw, _inputs_from_events(events, raw, origin)


def timeline_inputs_from_kineto(prof: Any, raw: RawEvents) -> TimelineInputs:
    """Origin, device streams (named `<DEVICE> <index> stream <id>`, e.g. `NEURON 0 stream 0`)
    and an input-shapes reader for `raw = raw_events_from_kineto(prof)`, from the same cycle's
    Kineto results (`prof` may be the snapshot `kineto_reader` holds). Pieces that cannot be
    matched to `raw` are None. `read_kineto_cycle` gives both from one read."""
    _, result = _kineto.kineto_results_of(prof)
    try:
        origin = int(result.trace_start_ns())
        events = result.events()
    except Exception:  # noqa: BLE001 - no results, or another torch's
        return TimelineInputs()
    return _inputs_from_events(events, raw, origin)


def _inputs_from_events(events: list, raw: RawEvents, origin: int) -> TimelineInputs:
    try:
        kept = _kineto_rows(events, raw, origin)
    except Exception:  # noqa: BLE001 - another torch's events: no streams, no shapes
        kept = None
    if kept is None:
        return TimelineInputs(origin)
    kind = type(events[0])
    dev = np.flatnonzero(raw.device_class[: len(kept)] != HOST)
    lane = np.full(len(raw), -1, np.int64)
    names: tuple[str, ...] = ()
    if len(dev):
        dev_events = [events[k] for k in kept[dev].tolist()]
        # (device index, stream): one profile's device events come from one backend, so the
        # device type is read once per stream, for its name.
        cols = [np.fromiter(map(kind.device_index, dev_events), np.int64, len(dev)),
                np.fromiter(map(kind.device_resource_id, dev_events), np.int64, len(dev))]  # fmt: skip
        keys, first, slot = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
        lane[dev] = slot.reshape(-1)
        names = tuple(f"{_device_label(kind.device_type(dev_events[f]))} {d} stream {r}"
                      for f, (d, r) in zip(first.tolist(), keys.tolist()))  # fmt: skip

    def read_shapes(raw_rows: np.ndarray) -> list:
        out = []
        for r in raw_rows.tolist():
            shapes = events[kept[r]].shapes() if r < len(kept) else []
            out.append([list(s) for s in shapes] if any(shapes) else None)
        return out

    return TimelineInputs(origin, DeviceLanes(lane, names), read_shapes)


def _device_label(device_type: Any) -> str:
    return str(getattr(device_type, "name", device_type)).split(".")[-1].upper()


def _kineto_rows(events: list, raw: RawEvents, origin: int) -> np.ndarray | None:
    """The index of the Kineto event behind each of raw's first rows, as `_read_kineto` keeps
    them; None when they do not line up (then raw came from somewhere else)."""
    if not events:
        return None
    kind = type(events[0])
    if len(events) <= len(raw):  # the usual case, nothing filtered: checked on a sample
        kept = np.arange(len(events))
        if _rows_match(events, kept, raw, origin):
            return kept
    names, name_id = factorize(list(map(kind.name, events)))
    keep = ~np.array([_kineto._is_filtered(s) for s in names], dtype=bool)[name_id]
    hidden = getattr(kind, "is_hidden_event", None)
    if hidden is not None:
        keep &= ~np.fromiter(map(hidden, events), dtype=bool, count=len(events))
    kept = np.flatnonzero(keep)
    return kept if len(kept) <= len(raw) and _rows_match(events, kept, raw, origin) else None


def _rows_match(events: list, kept: np.ndarray, raw: RawEvents, origin: int) -> bool:
    """Whether ~256 evenly spread rows (and the last) have the kept events' names and times."""
    sample = np.unique(np.append(np.linspace(0, len(kept) - 1, min(len(kept), 256)).astype(np.int64), len(kept) - 1))
    for r in sample.tolist():
        e = events[kept[r]]
        if (e.start_ns() - origin != raw.start_ns[r] or e.end_ns() - origin != raw.end_ns[r]
                or e.name() != raw.names[raw.name_id[r]]):  # fmt: skip
            return False
    return True


def chrome_origin_ns(trace: dict) -> int | None:
    """Epoch nanoseconds of `raw_events_from_chrome_trace(trace)`'s time zero: the profiler
    span's start, shifted by `baseTimeNanoseconds` when the trace has one. None: no profiler
    span (the Python exporter's traces), whose zero is their first event."""
    base = trace.get("baseTimeNanoseconds", 0)
    for event in trace.get("traceEvents", ()):
        if (isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") == "Trace"
                and str(event.get("name", "")).startswith("PyTorch Profiler")):  # fmt: skip
            ts = event.get("ts")
            if isinstance(ts, (int, float)) and isinstance(base, int):
                return base + int(_chrome._ns(np.array([float(ts)]))[0])
    return None


def timeline_inputs_from_chrome_trace(trace: dict, raw: RawEvents) -> TimelineInputs:
    """Origin, stream names and input shapes (`args["Input Dims"]`) for
    `raw = raw_events_from_chrome_trace(trace)`. Its device rows are split by (pid, tid) already;
    the names come from the trace's `process_name`/`thread_name` metadata."""
    pid_names, tid_names, order, dims = {}, {}, {}, []
    for event in trace.get("traceEvents", ()):
        if not isinstance(event, dict):
            continue
        pid, tid, args = event.get("pid"), event.get("tid"), event.get("args")
        args = args if isinstance(args, dict) else {}
        if event.get("ph") == "M":
            if event.get("name") == "process_name":
                pid_names[pid] = str(args.get("name", pid))
            elif event.get("name") == "thread_name":
                tid_names[(pid, tid)] = str(args.get("name", tid))
            continue
        row = _chrome_row(event, args)
        if row:
            order.setdefault((pid, tid), len(order))
        if row == "op":
            dims.append(args.get("Input Dims"))
    names = [""] * len(order)
    for (pid, tid), k in order.items():
        names[k] = f"{pid_names.get(pid, pid)} {tid_names.get((pid, tid), f'stream {tid}')}".strip()
    lane = np.where(raw.device_class != HOST, raw.thread, -1)

    def read_shapes(raw_rows: np.ndarray) -> list:
        return [dims[r] if r < len(dims) and dims[r] and any(dims[r]) else None for r in raw_rows.tolist()]

    return TimelineInputs(chrome_origin_ns(trace), DeviceLanes(lane, tuple(names)), read_shapes)


def _chrome_row(event: dict, args: dict) -> str | None:
    """"op" for an event `raw_events_from_chrome_trace` makes a row of (rows come first, in trace
    order), "memory" for a memory record (after them), None for anything else."""
    name, ph = event.get("name"), event.get("ph")
    if name in (MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME) and ph in ("i", "I", "X"):
        return "memory"
    if ph != "X" or event.get("cat") not in _chrome._CHROME_CLASSES or str(args.get("hidden", "")) == "1":
        return None
    return "op"
