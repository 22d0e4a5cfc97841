"""What `RawEvents` does not carry and a timeline needs, read from the same source: the epoch
origin of the events' times, the device stream of each device row, and input shapes.

Example::

    raw, inputs = read_kineto_cycle(prof)          # one read of the Kineto events for both
    raw = raw_events_from_chrome_trace(trace)
    inputs = timeline_inputs_from_chrome_trace(trace, raw)

Rows find their events through `RawEvents.source_index` (checked on a sample of names and times
for Kineto), so only the device rows and the drawn spans' shapes are read again. Chrome traces:
the device rows are already split by (pid, tid); the names come from the trace's metadata events.
Pure: no MLflow.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .._trace import chrome as _chrome
from .._trace import kineto as _kineto
from .._trace.events import HOST, RawEvents
from .._trace.timeline import DeviceLanes, TimelineInputs


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
    rows = raw.source_index
    try:
        if rows is None or not _rows_match(events, rows, raw, origin):
            return TimelineInputs(origin)
        lanes = _kineto_lanes(events, rows, raw)
    except Exception:  # noqa: BLE001 - another torch's events: no streams, no shapes
        return TimelineInputs(origin)

    def read_shapes(raw_rows: np.ndarray) -> list:
        out = []
        for r in raw_rows.tolist():
            shapes = events[rows[r]].shapes()
            out.append([list(s) for s in shapes] if any(shapes) else None)
        return out

    return TimelineInputs(origin, lanes, read_shapes)


def _kineto_lanes(events: list, rows: np.ndarray, raw: RawEvents) -> DeviceLanes:
    """Each device row's (device index, stream), as lanes in first-seen order."""
    lane = np.full(len(raw), -1, np.int64)
    dev = np.flatnonzero(raw.device_class != HOST)
    if len(dev) == 0:
        return DeviceLanes(lane, ())
    dev_events = list(map(events.__getitem__, rows[dev].tolist()))
    kind = type(dev_events[0])
    index = pd.factorize(np.fromiter(map(kind.device_index, dev_events), np.int64, len(dev)))
    stream = pd.factorize(np.fromiter(map(kind.device_resource_id, dev_events), np.int64, len(dev)))
    _, first, slot = np.unique(index[0] * len(stream[1]) + stream[0], return_index=True, return_inverse=True)
    lane[dev] = slot
    # One profile's device events come from one backend: the device type is read once per stream.
    names = tuple(f"{_device_label(kind.device_type(dev_events[f]))} {index[1][index[0][f]]} "
                  f"stream {stream[1][stream[0][f]]}" for f in first.tolist())  # fmt: skip
    return DeviceLanes(lane, names)


def _device_label(device_type: Any) -> str:
    return str(getattr(device_type, "name", device_type)).split(".")[-1].upper()


def _rows_match(events: list, rows: np.ndarray, raw: RawEvents, origin: int) -> bool:
    """Whether raw's rows are these events: ~256 evenly spread rows (and the last) have their
    events' names and times."""
    if len(rows) == 0 or not _indexes_into(rows, len(events)):
        return len(rows) == 0
    sample = np.unique(np.append(np.linspace(0, len(rows) - 1, min(len(rows), 256)).astype(np.int64), len(rows) - 1))
    for r in sample.tolist():
        e = events[rows[r]]
        if (e.start_ns() - origin != raw.start_ns[r] or e.end_ns() - origin != raw.end_ns[r]
                or e.name() != raw.names[raw.name_id[r]]):  # fmt: skip
            return False
    return True


def _indexes_into(rows: np.ndarray, count: int) -> bool:
    return len(rows) == 0 or (int(rows.min()) >= 0 and int(rows.max()) < count)


def timeline_inputs_from_chrome_trace(trace: dict, raw: RawEvents) -> TimelineInputs:
    """Origin, stream names and input shapes (`args["Input Dims"]`) for
    `raw = raw_events_from_chrome_trace(trace)`. Its device rows are split by (pid, tid) already;
    the names come from the trace's `process_name`/`thread_name` metadata. Without `raw`'s
    `source_index` (or one that does not fit the trace), the origin only."""
    events = trace.get("traceEvents", ())
    origin = chrome_origin_ns(trace)
    rows = raw.source_index
    if rows is None or not _indexes_into(rows, len(events)):
        return TimelineInputs(origin)
    dev = np.flatnonzero(raw.device_class != HOST)
    lane = np.full(len(raw), -1, np.int64)
    lane[dev] = raw.thread[dev]
    names = [""] * (int(lane.max(initial=-1)) + 1)
    if len(dev):
        pid_names, tid_names = _thread_names(events)
        used, first = np.unique(raw.thread[dev], return_index=True)
        for k, f in zip(used.tolist(), first.tolist()):
            event = events[rows[dev[f]]]
            pid, tid = event.get("pid"), event.get("tid")
            names[k] = f"{pid_names.get(pid, pid)} {tid_names.get((pid, tid), f'stream {tid}')}".strip()

    def read_shapes(raw_rows: np.ndarray) -> list:
        out = []
        for r in raw_rows.tolist():
            args = events[rows[r]].get("args")
            dims = args.get("Input Dims") if isinstance(args, dict) else None
            out.append(dims if dims and any(dims) else None)
        return out

    return TimelineInputs(origin, DeviceLanes(lane, tuple(names)), read_shapes)


def chrome_origin_ns(trace: dict) -> int | None:
    """Epoch nanoseconds of `raw_events_from_chrome_trace(trace)`'s time zero: the profiler
    span's start (the last one, as the reader takes it), shifted by `baseTimeNanoseconds` when
    the trace has one. None: no profiler span (the Python exporter's traces), whose zero is their
    first event."""
    base = trace.get("baseTimeNanoseconds", 0)
    for event in reversed(trace.get("traceEvents", ())):  # Kineto writes it near the end
        if (isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") == "Trace"
                and str(event.get("name", "")).startswith("PyTorch Profiler")):  # fmt: skip
            ts = event.get("ts")
            if isinstance(ts, (int, float)) and isinstance(base, int):
                return base + int(_chrome._ns(np.array([float(ts)]))[0])
    return None


def _thread_names(events: list) -> tuple[dict, dict]:
    """{pid: process name} and {(pid, tid): thread name}, from the trace's metadata events."""
    pid_names, tid_names = {}, {}
    for event in [e for e in events if e.get("ph") == "M"]:
        args = event.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if event.get("name") == "process_name":
            pid_names[event.get("pid")] = str(name if name is not None else event.get("pid"))
        elif event.get("name") == "thread_name":
            tid_names[(event.get("pid"), event.get("tid"))] = str(name if name is not None else event.get("tid"))
    return pid_names, tid_names
