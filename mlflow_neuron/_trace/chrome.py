"""The chrome-trace reader: Kineto's JSON (any dialect, any accelerator) as `RawEvents` columns.

Example::

    trace = json.load(open("worker0.pt.trace.json"))
    raw, links = read_chrome_trace(trace)
    profile = aggregate(raw, device="cuda", device_profiled=True)
    links.unattributed_device_time_us  # device time that no host op launched, as far as the trace says

How device events are linked to their ops, in each dialect, is `chrome_links`'s.

Device classes (`_CHROME_CLASSES`) follow torch's `deviceTypeFromActivity`, with one choice of our
own: MTIA device events (`mtia_ccp_events`) are attached to the op that launched them, as CUDA,
ROCm, XPU and PrivateUse1 kernels are. torch 2.13's `_parse_kineto_results` attaches only CUDA,
PrivateUse1 and XPU, so on MTIA its own table shows device rows that no op carries; an MTIA
trace read here shows per-op device time instead.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .chrome_links import (
    DEVICE_ROLE,
    EXTERNAL_ID,
    LAUNCH_ROLE,
    OP_ROLE,
    OTHER_HOST_ROLE,
    Linking,
    link_devices,
    linking_summary,
)
from .events import (
    DEVICE_KERNEL,
    DEVICE_OTHER,
    HOST,
    MEMORY_EVENT_NAME,
    OUT_OF_MEMORY_EVENT_NAME,
    DeviceLanes,
    RawEvents,
    TimelineInputs,
    empty_events,
    factorize,
    uncovered_memory,
)

try:  # a fast parser is a dependency; the standard one keeps a broken install working
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

# Kineto activity categories as torch 2.13's deviceTypeFromActivity files them (MTIA: see above).
_TORCH_OP_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"})
_ANNOTATION_CATEGORIES = frozenset({"user_annotation", "gpu_user_annotation"})
_LAUNCH_TARGET = "cpu_op"  # what a runtime launch is attributed to when ids don't say
_CHROME_CLASSES = {
    **{c: HOST for c in _TORCH_OP_CATEGORIES},
    **{c: HOST for c in ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "xpu_runtime", "xpu_driver",
                         "mtia_runtime", "privateuse1_runtime", "privateuse1_driver", "glow_runtime", "overhead",
                         "external_correlation")},
    **{c: DEVICE_KERNEL for c in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation",
                                  "cuda_profiler_range", "mtia_ccp_events")},
    **{c: DEVICE_OTHER for c in ("mtia_insight", "mtia_counters", "hpu_op")},
}  # fmt: skip
# Host calls that launch device work and carry its correlation id: the bridge to the op.
_LAUNCH_CATEGORIES = frozenset(
    c for c, k in _CHROME_CLASSES.items() if k == HOST and c.endswith(("_runtime", "_driver"))
)

_NUMBERS = frozenset({int, float})  # bool is neither: `_checked` refuses it
_NO_ARGS: Mapping = {}


def raw_events_from_chrome_trace(trace: Mapping[str, Any]) -> RawEvents:
    """The events of a chrome trace (Kineto's `export_chrome_trace` JSON, a tensorboard_trace_handler
    file, or `use_python_export=True` output), loaded with `json.load`.

    Read: `ph: "X"` events whose `cat` torch turns into host rows (`cpu_op`, `user_annotation`,
    `python_function`, the `*_runtime`/`*_driver` families, `overhead`, ...) or device rows
    (`kernel`, `gpu_memcpy`, `gpu_memset`, `gpu_user_annotation`, `cuda_sync`, `mtia_ccp_events`,
    ...), and `[memory]` / `[OutOfMemory]` instant events. Other categories and phases (metadata,
    flows, the `Trace` spans) are ignored. Host ops carry their own id in `args["External id"]`;
    device events are linked to their op as the module docstring describes.
    `ts`/`dur` are microseconds with three decimals, i.e. whole nanoseconds, so times are exact.

    What a chrome trace cannot say: which events were async (none are treated so); the profiler's
    `use_device` (taken as set when the trace has device rows; device time is 0 otherwise, as in
    torch); legacy fallback device time. Per-op numbers agree with `extract_cycle(prof.events())`
    of the same cycle to 1e-9 relative (Kineto JSON: exactly).

    Raises:
        ValueError: `trace` is not a chrome trace, or an event lacks a usable ts/dur/name.
    """
    return read_chrome_trace(trace)[0]


def read_chrome_trace(trace: Mapping[str, Any], *, dialect: str | None = None) -> tuple[RawEvents, Linking]:
    """`raw_events_from_chrome_trace`, and how its device events were linked.

    `dialect` forces a linking (EXTERNAL_ID or CORRELATION) instead of detecting it; for tests.
    """
    if not isinstance(trace, Mapping) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a chrome trace: expected a JSON object with a 'traceEvents' list")
    rows, memory, trace_start_us = [], [], None
    threads: dict[Any, int] = {}
    events = trace["traceEvents"]
    for index, event in enumerate(events):
        if type(event) is not dict and not isinstance(event, Mapping):
            raise ValueError(f"traceEvents[{index}] is {type(event).__name__}, not an object")
        get = event.get
        phase, cat, name = get("ph"), get("cat"), get("name")
        if (name == MEMORY_EVENT_NAME or name == OUT_OF_MEMORY_EVENT_NAME) and phase in ("i", "I", "X"):
            ts, _, name = _checked(event, index, "ts")  # Kineto writes instants, the Python exporter X
            thread = threads.setdefault((get("pid"), get("tid")), len(threads))
            memory.append((name, ts, thread, index))
            continue
        if phase != "X":
            continue
        kind = _KINDS.get(cat)
        if kind is not None:
            # The common case is checked inline (this loop is most of a helper's cycle); finiteness
            # and negative durations are checked on the columns, in `_checked_numbers`.
            ts, dur = get("ts"), get("dur")
            if type(name) is not str or type(ts) not in _NUMBERS or type(dur) not in _NUMBERS:
                ts, dur, name = _checked(event, index, "ts", "dur")
            args = get("args") or _NO_ARGS
            if type(args) is not dict and not isinstance(args, Mapping):
                args = _NO_ARGS
            hidden = args.get("hidden")
            if hidden is not None and str(hidden) == "1":
                continue  # Kineto's "hidden" metadata: torch drops these events
            external, correlation = args.get("External id", 0), args.get("correlation", 0)
            if type(external) is not int:
                external = _int_arg(args, "External id", index)
            if type(correlation) is not int:
                correlation = _int_arg(args, "correlation", index)
            key = (get("pid"), get("tid"))
            thread = threads.get(key)
            if thread is None:
                thread = threads[key] = len(threads)
            rows.append((name, ts, dur, thread, *kind, external, correlation, index))
        elif cat == "Trace" and str(name or "").startswith("PyTorch Profiler"):
            trace_start_us = _checked(event, index, "ts")[0]  # Kineto's span starts at trace_start_ns
    _checked_numbers(rows, events)
    return _chrome_columns(rows, memory, trace_start_us, dialect)


def _kinds() -> dict[str, tuple]:
    """Per category: (device class, role, is the launch target, is an annotation) of its rows."""
    kinds = {}
    for cat, device_class in _CHROME_CLASSES.items():
        if device_class != HOST:
            role = DEVICE_ROLE
        elif cat in _TORCH_OP_CATEGORIES:
            role = OP_ROLE
        else:
            role = LAUNCH_ROLE if cat in _LAUNCH_CATEGORIES else OTHER_HOST_ROLE
        kinds[cat] = (device_class, role, cat == _LAUNCH_TARGET, cat in _ANNOTATION_CATEGORIES)
    return kinds


_KINDS = _kinds()


def _checked_numbers(rows: list, events: list) -> None:
    """The ValueError `_checked` gives for the first row whose ts or dur is not finite, or whose
    dur is negative (the row loop only checked their types)."""
    if not rows:
        return
    ts = np.fromiter((r[1] for r in rows), np.float64, len(rows))
    dur = np.fromiter((r[2] for r in rows), np.float64, len(rows))
    bad = ~(np.isfinite(ts) & np.isfinite(dur) & (dur >= 0))
    if bad.any():
        index = rows[int(np.argmax(bad))][-1]
        _checked(events[index], index, "ts", "dur")


def _checked(event: Mapping, index: int, *keys: str) -> tuple:
    """(ts, dur or None, name) of an event that has them, else a ValueError saying which is wrong."""
    name = event.get("name")
    if not isinstance(name, str):
        raise ValueError(f"traceEvents[{index}] ({event.get('cat')}) has no string 'name': {name!r}")
    values = []
    for key in keys:
        value = event.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"traceEvents[{index}] ({event.get('cat')} {name!r}) has no numeric {key!r}: {value!r}")
        values.append(float(value))
    if len(values) > 1 and values[1] < 0:
        raise ValueError(f"traceEvents[{index}] ({event.get('cat')} {name!r}) has a negative 'dur': {values[1]}")
    return values[0], values[1] if len(values) > 1 else None, name


def _int_arg(args: Any, key: str, index: int) -> int:
    value = args.get(key, 0) if isinstance(args, Mapping) else 0
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"traceEvents[{index}] args[{key!r}] is not an integer: {value!r}")
    return value


def _ns(us: np.ndarray) -> np.ndarray:
    """Whole nanoseconds from microsecond floats written with three decimals (exact below 2**43 µs)."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _chrome_columns(rows: list, memory: list, trace_start_us: float | None, dialect: str | None) -> tuple:
    if not rows and not memory:
        return empty_events(None), Linking(EXTERNAL_ID, 0, 0, 0, 0, 0.0, 0.0)
    names, ts, dur, thread, device_class, role, target, annotation, external, correlation, source = (
        zip(*rows) if rows else [()] * 11
    )
    start = _ns(np.array(ts, np.float64))
    end = start + np.rint(np.array(dur, np.float64) * 1000).astype(np.int64)
    mem_start = _ns(np.array([r[1] for r in memory], np.float64))
    if trace_start_us is not None:
        origin = _ns(np.array([trace_start_us]))[0]
    else:  # the Python exporter writes no trace start: the first event stands in (floats differ in the last bits)
        origin = min(a.min() for a in (start, mem_start) if len(a))
    raw_names, name_id = factorize(list(names) + [r[0] for r in memory])
    m = len(rows)
    device_class = np.array(device_class, np.int8)
    own, linked, how, dialect = link_devices(start.tolist(), end.tolist(), thread, role, target, external, correlation,
                                      dialect)  # fmt: skip
    columns = [name_id[:m], start - origin, end - origin, np.array(thread, np.int64), device_class,
               np.array(own, np.int64), np.array(linked, np.int64), np.zeros(m, bool),
               np.array(annotation, bool), np.zeros(m), np.array(source, np.int64)]  # fmt: skip
    if memory:
        oom = np.array([r[0] == OUT_OF_MEMORY_EVENT_NAME for r in memory], bool)
        records = (name_id[m:], mem_start - origin, np.array([r[2] for r in memory], np.int64), oom,
                   np.array([r[3] for r in memory], np.int64))  # fmt: skip
        extra = uncovered_memory(records, columns[1], columns[2], device_class == HOST)
        columns = [np.concatenate([c, x]) for c, x in zip(columns, extra)]
    use_device = "device" if (device_class != HOST).any() else None
    linking = linking_summary(dialect, how, device_class.tolist(), annotation, dur)
    return RawEvents(tuple(raw_names), *columns[:-1], use_device=use_device, source_index=columns[-1]), linking


def timeline_inputs_from_chrome_trace(trace: dict, raw: RawEvents) -> TimelineInputs:
    """Origin, stream names and input shapes (`args["Input Dims"]`) for
    `raw = raw_events_from_chrome_trace(trace)`. Its device rows are split by (pid, tid) already;
    the names come from the trace's `process_name`/`thread_name` metadata. Without `raw`'s
    `source_index` (or one that does not fit the trace), the origin only."""
    events = trace.get("traceEvents", ())
    origin = chrome_origin_ns(trace)
    rows = raw.source_index
    if not raw.sources_within(len(events)):
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
                return base + int(_ns(np.array([float(ts)]))[0])
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


def load_chrome_trace(path: str | Path) -> dict:
    """A chrome trace file (`.gz` or not) as JSON; ValueError, saying why, for anything else.

    orjson reads it (about three times as fast as `json`); Python's `json` takes what orjson
    refuses but Python writes, such as NaN."""
    path = Path(path)
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError) as error:
        raise ValueError(f"{path}: not a readable chrome trace ({type(error).__name__}: {error})") from error
    try:
        trace = _loads(data)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: not a readable chrome trace ({type(error).__name__}: {error})") from error
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a chrome trace (no traceEvents list)")
    return trace


def _loads(data: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


PARSER = "orjson" if orjson is not None else "json"
