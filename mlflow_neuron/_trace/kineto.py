"""The Kineto reader: a profiler cycle read from torch's Kineto results, without `prof.events()`.

Every touch of torch's private profiler API for reading is in this module, checked on torch 2.13.0:
`profile.profiler.kineto_results` (`events()`, `trace_start_ns()`, `save()`) and its
`_KinetoEvent`s, `torch._C._get_privateuse1_backend_name`, `profiler_util._filter_name`, the
profiler's `profiler_kind` and `experimental_config.trace_only`, `_chrome_trace_export`, the
`EventList` fields `_use_device` and `_tree_built`, and the closure of `torch.profiler.schedule`.
Each is feature-detected: where one is missing, the callback falls back to `prof.events()`.

Example::

    raw = raw_events_from_kineto(prof)  # None: a profile this module does not read
    profile = aggregate(raw, device="neuron", device_profiled=True) if raw is not None else \
        extract_cycle(prof.events(), device="neuron", device_profiled=True)

`prof.events()` builds and links one Python `FunctionEvent` per event (tens of microseconds each,
seconds per cycle on the training thread). Here the same raw events become numpy columns
(`RawEvents`), read as torch 2.13's `_parse_kineto_results` reads them:

- filtered names (`aten::is_leaf`, `profiler::_record_function_*`, ...) and hidden events are
  dropped; `[memory]` records that no host event covers, and every `[OutOfMemory]` record, become
  zero-length host events;
- an event is async when Kineto says so or it ends on another thread;
- device events of the kinds torch attaches (CUDA, PrivateUse1, XPU) are DEVICE_KERNEL rows,
  MTIA/HPU device rows DEVICE_OTHER;
- legacy fallback device time is read where torch reads it (the fallback profiler states).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.autograd import DeviceType

from .events import (
    DEVICE_KERNEL,
    DEVICE_OTHER,
    HOST,
    MEMORY_EVENT_NAME,
    OTHER,
    OUT_OF_MEMORY_EVENT_NAME,
    DeviceLanes,
    RawEvents,
    TimelineInputs,
    empty_events,
    factorize,
    memory_records,
    uncovered_memory,
)
from .function_events import DEVICE_ROW_TYPES
from .summarize import CycleSettings, CycleSummary, summarize
from .traffic import OpInputs

_ATTACHED = frozenset(getattr(DeviceType, n) for n in ("CUDA", "PrivateUse1", "XPU") if hasattr(DeviceType, n))
_FILTERED_NAMES = frozenset({
    MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME, "profiler::_record_function_enter",
    "profiler::_record_function_enter_new", "profiler::_record_function_exit",
    "aten::is_leaf", "aten::output_nr", "aten::_version",
})  # fmt: skip  # torch.autograd.profiler_util._filter_name, used instead when present
_SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")


class KinetoCycle:
    """One cycle's Kineto results, held for reading later on another thread (`summarize()`).

    Each cycle's `kineto_results` is an object of its own (the next cycle's stop makes a new
    one), so holding it and the few settings the read needs lets the training thread go on at once.
    """

    def __init__(self, snapshot: Any, settings: CycleSettings) -> None:
        self.snapshot, self.settings = snapshot, settings

    def summarize(self) -> CycleSummary:
        read = read_kineto_cycle(self.snapshot)
        if read is None:
            raise RuntimeError(f"this torch's Kineto results could not be read ({torch.__version__})")
        raw, inputs = read
        return summarize(raw, self.settings, inputs)


def kineto_cycle(prof: Any, settings: CycleSettings) -> KinetoCycle | None:
    """This cycle, to read later; None when this profile can't be read that way (read it through
    `prof.events()` now). What can be checked without reading the events is checked here, while
    `prof.events()` is still there to fall back on."""
    inner, result = kineto_results_of(prof)
    if result is None or getattr(getattr(inner, "experimental_config", None), "trace_only", False):
        return None
    if not all(callable(getattr(result, m, None)) for m in ("events", "trace_start_ns")):
        return None
    event_class = getattr(torch._C._autograd, "_KinetoEvent", None)
    if event_class is None or not all(callable(getattr(event_class, m, None)) for m in _KINETO_METHODS):
        return None
    snapshot = SimpleNamespace(kineto_results=result, use_device=getattr(inner, "use_device", None))
    if hasattr(inner, "profiler_kind"):
        snapshot.profiler_kind = inner.profiler_kind
    return KinetoCycle(snapshot, settings)


def raw_events_from_kineto(prof: Any) -> RawEvents | None:
    """The current cycle of a `torch.profiler.profile` (or `torch.autograd.profiler.profile`),
    read from its `kineto_results`; None means: fall back to `prof.events()`.

    None when a private piece is missing or behaves unexpectedly (other torch versions), and for
    `trace_only` configs (torch keeps no events for them). With `acc_events=True` the result is the
    current cycle only, like the head of `prof.events()` the callback slices off: `kineto_results`
    always holds the last cycle. `record_shapes`, `with_stack` (python_function rows) and
    `profile_memory` (`[memory]` rows) are read as torch reads them. A `post_processing_timeout_s`
    is not applied: the whole cycle is read (torch's slower parse returns a partial list when it
    runs out of time).
    """
    read = read_kineto_events(prof)
    return None if read is None else read[0]


def read_kineto_events(prof: Any) -> tuple[RawEvents, list, int] | None:
    """`raw_events_from_kineto`'s result with the Kineto events it came from and the trace start
    (ns), for readers that need more of the same events (the timeline); None likewise."""
    inner, result = kineto_results_of(prof)
    if result is None or getattr(getattr(inner, "experimental_config", None), "trace_only", False):
        return None
    try:
        trace_start = int(result.trace_start_ns())
        events = result.events()
        kind = type(events[0]) if events else None
        if kind is not None and not all(callable(getattr(kind, m, None)) for m in _KINETO_METHODS):
            return None
        use_device = getattr(inner, "use_device", None)
        legacy = _legacy_reader(kind, inner, use_device) if kind is not None else None
        return _read_kineto(events, kind, trace_start, use_device, legacy), events, trace_start
    except Exception:  # noqa: BLE001 - whatever this reader does not know, torch's parse handles
        return None


def kineto_results_of(prof: Any) -> tuple[Any, Any]:
    """(the autograd profiler, its `kineto_results`) of a `torch.profiler.profile` or of a
    `torch.autograd.profiler.profile`; Nones where absent."""
    inner = prof if hasattr(prof, "kineto_results") else getattr(prof, "profiler", None)
    return inner, getattr(inner, "kineto_results", None)


_KINETO_METHODS = ("name", "start_ns", "end_ns", "device_type", "start_thread_id", "end_thread_id",
                   "is_async", "correlation_id", "linked_correlation_id", "is_user_annotation")  # fmt: skip


def _legacy_reader(kind: Any, inner: Any, use_device: str | None) -> Any:
    """Method giving legacy (fallback-stub) device time, or None when torch would find none."""
    name = str(getattr(getattr(inner, "profiler_kind", None), "name", "FALLBACK"))
    if "FALLBACK" not in name or not use_device:
        return None  # only the fallback profiler states record fallback device events
    if use_device == privateuse1_backend_name():
        return getattr(kind, "privateuse1_elapsed_us", None)
    return getattr(kind, "cuda_elapsed_us", None) if use_device == "cuda" else None


def _read_kineto(events: list, kind: Any, trace_start: int, use_device: str | None, legacy: Any) -> RawEvents:
    if not events:
        return empty_events(use_device)
    n = len(events)
    raw_names, name_id = factorize(list(map(kind.name, events)))
    hidden_of = getattr(kind, "is_hidden_event", None)
    filtered = np.array([_is_filtered(s) for s in raw_names], dtype=bool)[name_id]
    if hidden_of is not None:
        filtered |= np.fromiter(map(hidden_of, events), dtype=bool, count=n)
    keep = ~filtered
    source = np.flatnonzero(keep)
    memory = _memory_records(events, kind, raw_names, name_id, trace_start)
    kept = list(itertools.compress(events, keep)) if not keep.all() else events
    m = len(kept)

    def ints(method: Any, items: list = kept) -> np.ndarray:
        return np.fromiter(map(method, items), dtype=np.int64, count=len(items))

    def thread_ids(method: Any, items: list) -> np.ndarray:
        # Thread ids are unsigned 64-bit and can exceed int64: keep their bits, compare for equality only.
        return np.fromiter(map(method, items), dtype=np.uint64, count=len(items)).view(np.int64)

    device_class = _device_classes(map(kind.device_type, kept), m)
    start, end = ints(kind.start_ns) - trace_start, ints(kind.end_ns) - trace_start
    linked = ints(kind.linked_correlation_id)
    # Only host events need threads, their own id and the async flag: everything else comes from a
    # Kineto activity, which torch never marks async and whose end thread is its start thread
    # (is_async is TorchOp-only; Result::endTID). A device event's own id links nothing.
    host = device_class == HOST
    host_events = list(itertools.compress(kept, host))
    thread, correlation, is_async = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, bool)
    thread[host] = thread_ids(kind.start_thread_id, host_events)
    correlation[host] = ints(kind.correlation_id, host_events)
    is_async[host] = np.fromiter(map(kind.is_async, host_events), dtype=bool, count=len(host_events))
    is_async[host] |= thread[host] != thread_ids(kind.end_thread_id, host_events)
    annotation = np.fromiter(map(kind.is_user_annotation, kept), dtype=bool, count=m)
    legacy_us = np.zeros(m)
    if legacy is not None:
        values = np.fromiter(map(legacy, host_events), dtype=np.float64, count=len(host_events))
        legacy_us[host] = np.where(values > 0, values, 0.0)
    name_ids = name_id[keep]
    columns = [name_ids, start, end, thread, device_class, correlation, linked, is_async, annotation, legacy_us,
               source]  # fmt: skip
    if memory is not None:
        extra = uncovered_memory(memory, start, end, host)
        columns = [np.concatenate([c, x]) for c, x in zip(columns, extra)]
    return RawEvents(tuple(raw_names), *columns[:-1], use_device=use_device, source_index=columns[-1],
                     memory=_with_bytes(memory, events, kind, raw_names))


def _with_bytes(memory: tuple | None, events: list, kind: Any, raw_names: list):
    """MemoryRecords of the `[memory]` records: their bytes and device types."""
    if memory is None:
        return None
    ids, start, thread, _, rows = memory
    records = [events[i] for i in rows]
    return memory_records(np.array([raw_names[i] == MEMORY_EVENT_NAME for i in ids], bool), start,
                          [kind.nbytes(r) for r in records], [int(kind.device_type(r)) for r in records], thread)


def _memory_records(events: list, kind: Any, raw_names: list, name_id: np.ndarray, trace_start: int):
    """`[memory]` and `[OutOfMemory]` records as (name ids, start, thread, is_oom, index), or None."""
    special = [i for i, s in enumerate(raw_names) if s in (MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME)]
    if not special:
        return None
    rows = np.flatnonzero(np.isin(name_id, special))
    records = [events[i] for i in rows]
    ids = name_id[rows]
    start = np.fromiter(map(kind.start_ns, records), np.int64, len(records)) - trace_start
    thread = np.fromiter(map(kind.start_thread_id, records), np.int64, len(records))
    return ids, start, thread, np.array([raw_names[i] == OUT_OF_MEMORY_EVENT_NAME for i in ids], bool), rows


def _is_filtered(name: str) -> bool:
    check = getattr(torch.autograd.profiler_util, "_filter_name", None)
    return bool(check(name)) if callable(check) else name in _FILTERED_NAMES


def _device_classes(device_types: Any, count: int) -> np.ndarray:
    """Device classes of DeviceType members (compared as ints: cheaper than hashing the enum)."""
    values = np.fromiter(map(int, device_types), dtype=np.int64, count=count)
    lut = np.full(max(int(values.max(initial=0)), max(_CLASS_OF)) + 1, OTHER, np.int8)
    for value, device_class in _CLASS_OF.items():
        lut[value] = device_class
    return lut[values] if count else values.astype(np.int8)


_CLASS_OF = {int(DeviceType.CPU): HOST}
_CLASS_OF.update({int(t): DEVICE_OTHER for t in DEVICE_ROW_TYPES})
_CLASS_OF.update({int(t): DEVICE_KERNEL for t in _ATTACHED})


# -- what a timeline needs besides RawEvents, from the same Kineto events --------------------------


def read_kineto_cycle(prof: Any) -> tuple[RawEvents, TimelineInputs] | None:
    """`raw_events_from_kineto(prof)` and its `timeline_inputs_from_kineto`, from one read of
    the Kineto events (building that list is most of a second read's cost); None where
    `raw_events_from_kineto` gives None."""
    read = read_kineto_events(prof)
    if read is None:
        return None
    raw, events, origin = read
    return raw, _inputs_from_events(events, raw, origin)


def timeline_inputs_from_kineto(prof: Any, raw: RawEvents) -> TimelineInputs:
    """Origin, device streams (named `<DEVICE> <index> stream <id>`, e.g. `NEURON 0 stream 0`)
    and an input-shapes reader for `raw = raw_events_from_kineto(prof)`, from the same cycle's
    Kineto results (`prof` may be a `KinetoCycle`'s snapshot). Pieces that cannot be
    matched to `raw` are None. `read_kineto_cycle` gives both from one read."""
    _, result = kineto_results_of(prof)
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

    def read_inputs(raw_rows: np.ndarray) -> list:
        return [_op_inputs(events[rows[r]]) for r in raw_rows.tolist()]

    return TimelineInputs(origin, lanes, read_shapes, read_inputs)


def _op_inputs(event: Any) -> OpInputs | None:
    shapes = event.shapes()  # [] without record_shapes (a 0-d tensor's [] shape counts)
    concrete = getattr(event, "concrete_inputs", list)()  # a torch without them: reductions stay unknown
    return OpInputs([list(s) for s in shapes], list(event.dtypes()), ["" if v is None else str(v) for v in concrete]
                    ) if shapes else None  # fmt: skip


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
    if len(rows) == 0 or not raw.sources_within(len(events)):
        return len(rows) == 0
    sample = np.unique(np.append(np.linspace(0, len(rows) - 1, min(len(rows), 256)).astype(np.int64), len(rows) - 1))
    for r in sample.tolist():
        e = events[rows[r]]
        if (e.start_ns() - origin != raw.start_ns[r] or e.end_ns() - origin != raw.end_ns[r]
                or e.name() != raw.names[raw.name_id[r]]):  # fmt: skip
            return False
    return True


# -- other private pieces of torch's profiler ------------------------------------------------------


def privateuse1_backend_name() -> str:
    """The PrivateUse1 backend's name ("neuron" once TorchNeuron renamed it)."""
    return torch._C._get_privateuse1_backend_name()


def deferred_trace_save(prof: Any) -> Callable[[Path], None] | None:
    """Saving this cycle's Kineto trace later, from another thread; None where torch can't.

    `export_chrome_trace` is `kineto_results.save(path)`; the results object belongs to this cycle
    alone (the next cycle gets a new one), so the sender can write it while training goes on."""
    results = kineto_results_of(prof)[1]
    if results is None or not callable(getattr(results, "save", None)):
        return None

    def save(path: Path) -> None:
        try:
            results.save(str(path))
        except RuntimeError:
            # Kineto saves a trace once; a handler may have used that save already.
            from torch.profiler._chrome_trace_export import export_chrome_trace

            export_chrome_trace(results, str(path), None)

    return save


def event_list(events: list, like: Any) -> Any:
    """An EventList of some of `like`'s events (`prof.events()`), usable for key_averages()."""
    from torch.autograd.profiler_util import EventList

    subset = EventList(events, use_device=getattr(like, "_use_device", None))
    subset._tree_built = True  # the events keep the parent/child links of the full list
    return subset


def schedule_of(prof: Any) -> dict[str, int] | None:
    """wait/warmup/active/repeat of a `torch.profiler.schedule(...)`; None without a schedule.

    torch keeps them only as the closure of the schedule function, so they are read from there;
    a user-written schedule function yields None.
    """
    fn = getattr(prof, "schedule", None)
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None or len(code.co_freevars) != len(cells):
        return None
    values = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
    if not {"wait", "warmup", "active"} <= values.keys():
        return None
    return {field: int(values[field]) for field in _SCHEDULE_FIELDS if field in values}
