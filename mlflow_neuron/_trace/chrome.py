"""The chrome-trace reader: Kineto's JSON (any dialect, any accelerator) as `RawEvents` columns,
and what a timeline needs, in one pass over the events.

Example::

    cycle = read_chrome_file("worker0.pt.trace.json.gz")   # read in pieces: bounded memory
    profile = aggregate(cycle.raw, device=cycle.device, device_profiled=cycle.device_profiled)
    cycle.linking.unattributed_device_time_us  # device time no host op launched, as far as the trace says

    raw, links = read_chrome_trace(json.load(open("trace.json")))   # a trace already in memory

How device events are linked to their ops, in each dialect, is `chrome_links`'s; how a file is
read in pieces, `chrome_file`'s; which device made the trace, `device_names`'.

Device classes (`_CHROME_CLASSES`) follow torch's `deviceTypeFromActivity`, with one choice of our
own: MTIA device events (`mtia_ccp_events`) are attached to the op that launched them, as CUDA,
ROCm, XPU and PrivateUse1 kernels are. torch 2.13's `_parse_kineto_results` attaches only CUDA,
PrivateUse1 and XPU, so on MTIA its own table shows device rows that no op carries; an MTIA
trace read here shows per-op device time instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .chrome_checks import checked, checked_numbers, int_arg, wrong_field
from .chrome_file import ReadPiece, read_pieces
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
from .device_names import device_of
from .traffic import OpInputs, message_bytes
from .events import (
    DEVICE_KERNEL,
    DEVICE_OTHER,
    HOST,
    MEMORY_EVENT_NAME,
    OUT_OF_MEMORY_EVENT_NAME,
    DeviceLanes,
    RawEvents,
    memory_records,
    TimelineInputs,
    empty_events,
    uncovered_memory,
)

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

_NUMBERS = frozenset({int, float})  # bool is neither: `checked` refuses it
_NO_ARGS: Mapping = {}
_COLUMNS = ("name", "ts", "dur", "thread", "kind", "external", "correlation", "source")  # one piece's rows, as arrays
_STEP_EVENT = re.compile(r"^ProfilerStep#(\d+)$")
_HIP_CALL_CATEGORIES = ("cuda_runtime", "cuda_driver")  # ROCm's HIP calls, as torch's Kineto build files them


@dataclass(frozen=True, eq=False)
class ChromeCycle:
    """What one pass over a chrome trace gives."""

    raw: RawEvents
    linking: Linking  # how device events were linked to their ops
    inputs: TimelineInputs  # the epoch origin, device streams and input shapes, for a timeline
    device: str  # which device made the trace (`device_names.device_of`)
    device_profiled: bool
    last_step: int | None  # the highest `ProfilerStep#N`; None without step ranges


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
    cycle = read_chrome_cycle(trace, dialect=dialect, shapes=False)
    return cycle.raw, cycle.linking


def read_chrome_cycle(trace: Mapping[str, Any], *, dialect: str | None = None, shapes: bool = True) -> ChromeCycle:
    """Everything `ChromeCycle` holds, from a trace in memory (`json.load`ed)."""
    if not isinstance(trace, Mapping) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a chrome trace: expected a JSON object with a 'traceEvents' list")
    reader = ChromeReader(shapes)
    reader.feed(trace["traceEvents"])
    return reader.finish(trace, dialect)


def read_chrome_file(path: str | Path, *, shapes: bool = True, also: Any = None) -> ChromeCycle:
    """Everything `ChromeCycle` holds, from a trace file (`.gz` or not), read in pieces so that
    parsed events never pile up; ValueError, saying why, for a file that is not a trace.

    `also`: another reader fed the same pieces in the same pass (`feed(events)`, `restart()`,
    `finish(header)`), such as `collectives.RankEvents`: the file is read and parsed once. One
    with `feed_read(piece)` is handed each `ReadPiece` instead: the rows this reader made of the
    events, as columns, so that it need not walk every event again."""
    reader = ChromeReader(shapes)
    if also is None:
        return reader.finish(read_pieces(path, reader.feed, reader.reset))
    columns = hasattr(also, "feed_read")

    def feed(events: list) -> None:
        piece = reader.feed(events)
        if columns:
            also.feed_read(piece)
        else:
            also.feed(events)

    def restart() -> None:
        reader.reset()
        also.restart()

    header = read_pieces(path, feed, restart)
    also.finish(header)
    return reader.finish(header)


class ChromeReader:
    """One pass over a chrome trace's events, fed a list at a time; each list's rows become
    numpy columns at once, so only the columns stay. `shapes`: keep `args["Input Dims"]` for a
    timeline's spans (the trace must have been recorded with `record_shapes=True`)."""

    def __init__(self, shapes: bool = True) -> None:
        self.shapes = shapes
        self.reset()

    def reset(self) -> None:
        """Forgets every event fed so far."""
        self.events = 0  # fed so far: the next event's index in traceEvents
        self.names: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}  # (pid, tid) -> thread index
        self.pieces: list[dict[str, np.ndarray]] = []
        self.memory: list[tuple] = []  # [memory] / [OutOfMemory] records: (name, ts, thread, index, bytes, device)
        self.dims: dict[int, Any] = {}  # row -> its Input Dims, Input type and Concrete Inputs
        self.rows = 0
        self.trace_start_us: float | None = None  # Kineto's profiler span starts at trace_start_ns
        self.categories: set = set()
        self.hip_calls = False
        self.process_names: dict = {}
        self.thread_names: dict = {}

    def feed(self, events: list) -> ReadPiece:
        """Reads a list of events; returns it as read (`ReadPiece`), for a reader fed in the same pass."""
        try:
            return self._feed(events)
        except (TypeError, OverflowError) as error:  # a list where a name goes (unhashable), an id past 64 bits
            raise ValueError(f"{wrong_field(events, self.events)} has a field of the wrong type ({error})") from None

    def _feed(self, events: list) -> ReadPiece:
        rows: list[tuple] = []
        names, threads, categories = self.names, self.threads, self.categories
        aside: list[int] = []  # the events that make no row, for `ReadPiece` (a few: memory, hidden, others)
        for index, event in enumerate(events, self.events):
            if type(event) is not dict and not isinstance(event, Mapping):
                raise ValueError(f"traceEvents[{index}] is {type(event).__name__}, not an object")
            get = event.get
            phase, cat, name = get("ph"), get("cat"), get("name")
            categories.add(cat)
            if (name == MEMORY_EVENT_NAME or name == OUT_OF_MEMORY_EVENT_NAME) and phase in ("i", "I", "X"):
                ts, _, name = checked(event, index, "ts")  # Kineto writes instants, the Python exporter X
                args = get("args") if isinstance(get("args"), Mapping) else {}
                self.memory.append((name, ts, threads.setdefault((get("pid"), get("tid")), len(threads)), index,
                                    _int(args.get("Bytes")), _int(args.get("Device Type"))))  # fmt: skip
                aside.append(index)
                continue
            if phase != "X":
                if phase == "M":
                    self._metadata(event)
                continue
            kind = _KINDS.get(cat)
            if kind is not None:
                # The common case is checked inline (this loop is most of a helper's cycle); finiteness
                # and ranges are checked on the columns, in `checked_numbers`.
                ts, dur = get("ts"), get("dur")
                if type(name) is not str or type(ts) not in _NUMBERS or type(dur) not in _NUMBERS:
                    ts, dur, name = checked(event, index, "ts", "dur")
                args = get("args") or _NO_ARGS
                if type(args) is not dict and not isinstance(args, Mapping):
                    args = _NO_ARGS
                hidden = args.get("hidden")
                if hidden is not None and str(hidden) == "1":
                    aside.append(index)
                    continue  # Kineto's "hidden" metadata: torch drops these events
                external, correlation = args.get("External id", 0), args.get("correlation", 0)
                if type(external) is not int:
                    external = int_arg(args, "External id", index)
                if type(correlation) is not int:
                    correlation = int_arg(args, "correlation", index)
                key = (get("pid"), get("tid"))
                thread = threads.get(key)
                if thread is None:
                    thread = threads[key] = len(threads)
                name_id = names.get(name)
                if name_id is None:
                    name_id = names[name] = len(names)
                if self.shapes and kind[0] == HOST and (args.get("Input Dims") or "In msg nelems" in args):
                    self.dims[self.rows + len(rows)] = (_list(args.get("Input Dims")), _list(args.get("Input type")),
                                                        _list(args.get("Concrete Inputs")),
                                                        message_bytes(args) if "In msg nelems" in args else None)  # fmt: skip
                if cat in _HIP_CALL_CATEGORIES and name.startswith("hip"):
                    self.hip_calls = True
                rows.append((name_id, ts, dur, thread, kind[4], external, correlation, index))
            else:
                if cat == "Trace" and str(name or "").startswith("PyTorch Profiler"):
                    self.trace_start_us = checked(event, index, "ts")[0]
                aside.append(index)
        return self._keep(events, rows, aside)

    def _keep(self, events: list, rows: list[tuple], aside: list[int]) -> ReadPiece:
        """A list's rows kept as columns, once their numbers are checked; returns its `ReadPiece`."""
        checked_numbers(rows, events, self.events)
        piece = dict(zip(_COLUMNS, map(np.array, zip(*rows))))
        if rows and (piece["external"].dtype.kind != "i" or piece["correlation"].dtype.kind != "i"):
            raise OverflowError("an id does not fit 64 bits")  # numpy made an object or uint64 column
        read = ReadPiece(events, self.events, piece if rows else None, aside, self.names, KIND_CATEGORIES)
        self.events += len(events)
        if rows:
            self.rows += len(rows)
            self.pieces.append(piece)
        return read

    def finish(self, header: Mapping, dialect: str | None = None) -> ChromeCycle:
        """The cycle, once every event was fed; `header` is the trace's other keys."""
        raw, linking = self._columns(dialect)
        device, profiled = device_of(self.categories, header, self.hip_calls)
        steps = [int(m.group(1)) for name in self.names if (m := _STEP_EVENT.match(name))]
        return ChromeCycle(raw, linking, self._inputs(raw, header), device, profiled, max(steps, default=None))

    def _metadata(self, event: Mapping) -> None:
        """Process and thread names (`process_name` / `thread_name` metadata): the streams' names."""
        args = event.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if event.get("name") == "process_name":
            self.process_names[event.get("pid")] = str(name if name is not None else event.get("pid"))
        elif event.get("name") == "thread_name":
            key = (event.get("pid"), event.get("tid"))
            self.thread_names[key] = str(name if name is not None else event.get("tid"))

    def _columns(self, dialect: str | None) -> tuple[RawEvents, Linking]:
        memory = self.memory
        if not self.rows and not memory:
            return empty_events(None), Linking(EXTERNAL_ID, 0, 0, 0, 0, 0.0, 0.0)
        c = {k: np.concatenate([p[k] for p in self.pieces]) if self.pieces else np.zeros(0) for k in _COLUMNS}
        kind = c["kind"].astype(np.int64, copy=False)  # each row's kind: its four columns from the table
        c.update({column: values[kind] for column, values in _KIND_COLUMNS.items()})
        start = _ns(c["ts"].astype(np.float64))
        end = start + np.rint(c["dur"].astype(np.float64) * 1000).astype(np.int64)
        mem_start = _ns(np.array([r[1] for r in memory], np.float64))
        if self.trace_start_us is not None:
            origin = _ns(np.array([self.trace_start_us]))[0]
        else:  # the Python exporter writes no trace start: the first event stands in (floats differ in the last bits)
            origin = min(a.min() for a in (start, mem_start) if len(a))
        m = self.rows
        for record in memory:
            self.names.setdefault(record[0], len(self.names))
        raw_names = list(self.names)
        device_class = c["device_class"].astype(np.int8)
        own, linked, how, dialect = link_devices(start, end, c["thread"], c["role"], c["target"], c["external"],
                                                 c["correlation"], dialect)  # fmt: skip
        columns = [c["name"].astype(np.int64), start - origin, end - origin, c["thread"].astype(np.int64), device_class,
                   own, linked, np.zeros(m, bool),
                   c["annotation"].astype(bool), np.zeros(m), c["source"].astype(np.int64)]  # fmt: skip
        if memory:
            ids = np.array([self.names[r[0]] for r in memory], np.int64)
            oom = np.array([r[0] == OUT_OF_MEMORY_EVENT_NAME for r in memory], bool)
            records = (ids, mem_start - origin, np.array([r[2] for r in memory], np.int64), oom,
                       np.array([r[3] for r in memory], np.int64))  # fmt: skip
            extra = uncovered_memory(records, columns[1], columns[2], device_class == HOST)
            columns = [np.concatenate([col, x]) for col, x in zip(columns, extra)]
        use_device = "device" if (device_class != HOST).any() else None
        linking = linking_summary(dialect, how, device_class, c["annotation"], c["dur"])
        return RawEvents(tuple(raw_names), *columns[:-1], use_device=use_device, source_index=columns[-1],
                         memory=_memory(memory, mem_start - origin)), linking

    def _inputs(self, raw: RawEvents, header: Mapping) -> TimelineInputs:
        """Origin, stream names and input shapes for the timeline. The device rows are split by
        (pid, tid) already; the names come from the trace's `process_name`/`thread_name` metadata."""
        base = header.get("baseTimeNanoseconds", 0)
        origin = None
        if self.trace_start_us is not None and isinstance(base, int) and not isinstance(base, bool):
            origin = base + int(_ns(np.array([self.trace_start_us]))[0])
        dev = np.flatnonzero(raw.device_class != HOST)
        lane = np.full(len(raw), -1, np.int64)
        lane[dev] = raw.thread[dev]
        names = [""] * (int(lane.max(initial=-1)) + 1)
        key_of = {index: key for key, index in self.threads.items()}
        for k in np.unique(raw.thread[dev]).tolist():
            pid, tid = key_of[k]
            names[k] = f"{self.process_names.get(pid, pid)} {self.thread_names.get((pid, tid), f'stream {tid}')}".strip()
        dims = self.dims

        def read_shapes(raw_rows: np.ndarray) -> list:
            return [d[0] if (d := dims.get(r)) and any(d[0]) else None for r in raw_rows.tolist()]

        def read_inputs(raw_rows: np.ndarray) -> list:
            return [OpInputs(*d) if (d := dims.get(r)) else None for r in raw_rows.tolist()]

        return TimelineInputs(origin, DeviceLanes(lane, tuple(names)), read_shapes if self.shapes else None,
                              read_inputs if self.shapes else None)  # fmt: skip


def _kinds() -> dict[str, tuple]:
    """Per category: (device class, role, is the launch target, is an annotation, the kind's index
    in `_KIND_COLUMNS`) of its rows."""
    kinds = {}
    for cat, device_class in _CHROME_CLASSES.items():
        if device_class != HOST:
            role = DEVICE_ROLE
        elif cat in _TORCH_OP_CATEGORIES:
            role = OP_ROLE
        else:
            role = LAUNCH_ROLE if cat in _LAUNCH_CATEGORIES else OTHER_HOST_ROLE
        kinds[cat] = (device_class, role, cat == _LAUNCH_TARGET, cat in _ANNOTATION_CATEGORIES, len(kinds))
    return kinds


_KINDS = _kinds()
KIND_CATEGORIES = tuple(_KINDS)  # the category of each kind's index
_KIND_COLUMNS = {  # a row keeps only its kind's index: four columns fewer to build from Python values
    "device_class": np.array([k[0] for k in _KINDS.values()], np.int64),
    "role": np.array([k[1] for k in _KINDS.values()], np.int64),
    "target": np.array([k[2] for k in _KINDS.values()], bool),
    "annotation": np.array([k[3] for k in _KINDS.values()], bool),
}


def _memory(records: list[tuple], start_ns: np.ndarray):
    """MemoryRecords of the `[memory]` instants (their args' Bytes and Device Type)."""
    if not records:
        return None
    is_memory = np.array([r[0] == MEMORY_EVENT_NAME for r in records], bool)
    return memory_records(is_memory, start_ns, *(np.array([r[k] for r in records], np.int64) for k in (4, 5, 2)))


def _list(value: Any) -> list | tuple:
    """A recorded argument list (Input Dims, Input type, Concrete Inputs); () for anything else."""
    return value if type(value) is list else ()


def _int(value: Any) -> int:
    """A memory event's Bytes or Device Type; 0 for what is not a 64-bit number (NaN compares false)."""
    return int(value) if isinstance(value, (int, float)) and -(2**63) < value < 2**63 else 0


def _ns(us: np.ndarray) -> np.ndarray:
    """Whole nanoseconds from microsecond floats written with three decimals (exact below 2**43 µs)."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
