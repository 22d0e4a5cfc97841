"""The chrome-trace reader: Kineto's JSON (any dialect, any accelerator) as `RawEvents` columns.

Example::

    trace = json.load(open("worker0.pt.trace.json"))
    raw, links = read_chrome_trace(trace)
    profile = aggregate(raw, device="cuda", device_profiled=True)
    links.unattributed_device_time_us  # device time that no host op launched, as far as the trace says

Every link between a device event and its op is made here, so that `aggregate` (torch 2.13's
rules) only matches ids: a device event's `RawEvents.linked_correlation_id` is the launching op's
own id. Kineto traces say who launched a device event in two ways:

- **External id** (modern traces): a device event's `args["External id"]` is the `External id` of
  the op on top of torch's correlation stack when it was launched (a `cpu_op`, or a
  `user_annotation` for a `record_function` range). Its `args["correlation"]` names the runtime
  launch (`cudaLaunchKernel`, `hipLaunchKernel`, ...), which carries the same External id.
- **Correlation** (older traces, such as 2022-2023 CUDA traces): every activity's External id is
  its own correlation id, an id space apart from the ops'. Taken literally it lands device time on
  unrelated ops. There the only link is the runtime launch: device `correlation` -> the runtime
  event with that `correlation` -> the innermost `cpu_op` enclosing it on its thread.

Which one a trace uses is read from its runtime events: in the External-id dialect their External
id names an op that encloses them. Traces whose events carry correlation ids only (MTIA) are
linked through the launch too. Within the External-id dialect, a device event whose id names no
op, or disagrees with its runtime launch's, is linked through the launch instead. An op that launched nothing never gets device time through a
coincidental id, and runtime calls get no id of their own to take kernels with.

The bridge ends at a `cpu_op`, not at a `record_function` range: a launch inside a range but in
no op (MTIA inference traces have many) stays unattributed, where torch's correlation stack would
have named the range. Ranges as targets would, for example, put the wait of a step's
`torch.cuda.synchronize()` (a `cuda_sync` event) on `ProfilerStep*`; it stays unattributed instead.

Device classes (`_CHROME_CLASSES`) follow torch's `deviceTypeFromActivity`, with one choice of our
own: MTIA device events (`mtia_ccp_events`) are attached to the op that launched them, as CUDA,
ROCm, XPU and PrivateUse1 kernels are. torch 2.13's `_parse_kineto_results` attaches only CUDA,
PrivateUse1 and XPU, so on MTIA its own table shows device rows that no op carries; an MTIA
trace read here shows per-op device time instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._trace.events import (
    DEVICE_KERNEL,
    DEVICE_OTHER,
    HOST,
    MEMORY_EVENT_NAME,
    OUT_OF_MEMORY_EVENT_NAME,
    RawEvents,
    empty_events,
    factorize,
    uncovered_memory,
)

EXTERNAL_ID, CORRELATION = "external_id", "correlation"

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

# Roles of a row for linking.
_OP, _LAUNCH, _DEVICE, _OTHER_HOST = 0, 1, 2, 3
_NUMBERS = frozenset({int, float})  # bool is neither: `_checked` refuses it
_NO_ARGS: Mapping = {}


@dataclass(frozen=True)
class Linking:
    """How a trace's device events were linked to their ops, and what stayed unlinked.

    `dialect`: EXTERNAL_ID or CORRELATION (see the module docstring). Counts are device events
    (annotations excluded); times are microseconds. `unattributed_device_time_us` is the device
    time of events that no host op carries: no launch found, a launch outside every op, or a device
    class torch does not attach.
    """

    dialect: str
    device_events: int
    by_external_id: int
    through_runtime: int
    unlinked: int
    device_time_us: float
    unattributed_device_time_us: float

    @property
    def unattributed_share(self) -> float:
        return self.unattributed_device_time_us / self.device_time_us if self.device_time_us > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "linking": self.dialect,
            "device_events": self.device_events,
            "linked_by_external_id": self.by_external_id,
            "linked_through_runtime": self.through_runtime,
            "unlinked": self.unlinked,
            "device_time_us": round(self.device_time_us, 3),
            "unattributed_device_time_us": round(self.unattributed_device_time_us, 3),
            "unattributed_share": round(self.unattributed_share, 6),
        }


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
            role = _DEVICE
        elif cat in _TORCH_OP_CATEGORIES:
            role = _OP
        else:
            role = _LAUNCH if cat in _LAUNCH_CATEGORIES else _OTHER_HOST
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
    own, linked, how, dialect = _link(start.tolist(), end.tolist(), thread, role, target, external, correlation,
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
    linking = _summary(dialect, how, device_class.tolist(), annotation, dur)
    return RawEvents(tuple(raw_names), *columns[:-1], use_device=use_device, source_index=columns[-1]), linking


def _link(start: list, end: list, thread: tuple, role: tuple, target: tuple, external: tuple, correlation: tuple,
          dialect: str | None) -> tuple[list, list, list, str]:  # fmt: skip
    """(own ids, linked ids, how each device row was linked, dialect) of the rows.

    How: None for rows that are not device rows, else "id", "runtime" or "" (no op found).
    """
    n = len(role)
    ops = {external[i]: i for i in range(n) if role[i] == _OP and external[i] > 0}
    launches = [i for i in range(n) if role[i] == _LAUNCH]
    launch_of: dict[int, int] = {}
    for i in launches:
        if correlation[i] > 0:
            launch_of.setdefault(correlation[i], i)
    enclosing = _innermost_enclosing(start, end, thread, [i for i in range(n) if target[i]], launches)
    enclosing = {call: op for call, op in enclosing.items() if external[op] > 0}  # no id: nothing links to it
    if dialect is None:
        dialect = _detect(start, end, thread, role, external, correlation, ops, launches)

    own, linked, how = [0] * n, [0] * n, [None] * n
    for i in range(n):
        if role[i] == _OP:
            own[i] = external[i]
        elif role[i] == _LAUNCH:
            # A launch is no op: with an id of its own it would take the kernels of any op whose
            # External id happens to equal its correlation id (MTIA traces have such pairs).
            op = enclosing.get(i)
            if dialect == EXTERNAL_ID and external[i] > 0:
                linked[i] = external[i]
            else:  # no External id, or it is the call's own correlation: the enclosing op is the link
                linked[i] = external[op] if op is not None else 0
        elif role[i] == _OTHER_HOST:
            linked[i] = external[i]
        else:
            launch = launch_of.get(correlation[i]) if correlation[i] > 0 else None
            bridged = enclosing.get(launch) if launch is not None else None
            by_id = dialect == EXTERNAL_ID and external[i] in ops
            if by_id and launch is not None and external[launch] not in (0, external[i]):
                by_id = False  # the launch says another op: ids don't line up
            if by_id:
                linked[i], how[i] = external[i], "id"
            elif bridged is not None:
                linked[i], how[i] = external[bridged], "runtime"
            else:
                linked[i], how[i] = (external[i] if dialect == EXTERNAL_ID else 0), ""
    return own, linked, how, dialect


def _detect(start: list, end: list, thread: tuple, role: tuple, external: tuple, correlation: tuple, ops: dict,
            launches: list) -> str:  # fmt: skip
    """EXTERNAL_ID when runtime launches name an op that encloses them (modern Kineto), else
    CORRELATION. With no launch that has both ids: CORRELATION when device events carry
    correlation ids and no External ids (MTIA) or External ids equal to them, else EXTERNAL_ID."""
    named = [i for i in launches if external[i] > 0 and correlation[i] > 0]
    if named:
        inside = 0
        for i in named:
            op = ops.get(external[i])
            inside += op is not None and thread[op] == thread[i] and start[op] <= start[i] and end[i] <= end[op]
        return EXTERNAL_ID if 2 * inside >= len(named) else CORRELATION
    device = [i for i in range(len(role)) if role[i] == _DEVICE and correlation[i] > 0]
    named = [i for i in device if external[i] > 0]
    if not named:
        return CORRELATION if device else EXTERNAL_ID
    same = sum(external[i] == correlation[i] for i in named)
    return CORRELATION if 2 * same > len(named) else EXTERNAL_ID


def _innermost_enclosing(start: list, end: list, thread: tuple, ops: list, queries: list) -> dict[int, int]:
    """For each query row, the op row that encloses it on its thread and started last (the shortest
    one among those starting together, the last recorded among equal ones); queries that no op
    encloses are left out.

    One sweep per thread in (start, -end) order, ops before queries at the same start: the stack
    holds every op that may still be open; the first one from the top that reaches the query's
    end encloses it.
    """
    found: dict[int, int] = {}
    # Ops that start and end together nest in recording order (torch's stack): the later is inner.
    items = sorted([(thread[i], start[i], 0, -end[i], i) for i in ops]
                   + [(thread[i], start[i], 1, -end[i], i) for i in queries])  # fmt: skip
    stack: list[int] = []
    current = None
    for th, s, kind, _, i in items:
        if th != current:
            stack, current = [], th
        while stack and end[stack[-1]] < s:
            stack.pop()
        if kind == 0:
            stack.append(i)
            continue
        for op in reversed(stack):
            if end[op] >= end[i]:
                found[i] = op
                break
    return found


def _summary(dialect: str, how: list, device_class: list, annotation: tuple, dur: tuple) -> Linking:
    """Counts over device rows that are not annotations; rows of a class torch never attaches
    (DEVICE_OTHER) count as unattributed whatever their ids say."""
    counted = [(h if c == DEVICE_KERNEL else "", d) for h, c, a, d in zip(how, device_class, annotation, dur)
               if c != HOST and not a]  # fmt: skip
    return Linking(
        dialect=dialect,
        device_events=len(counted),
        by_external_id=sum(h == "id" for h, _ in counted),
        through_runtime=sum(h == "runtime" for h, _ in counted),
        unlinked=sum(h == "" for h, _ in counted),
        device_time_us=math.fsum(d for _, d in counted),
        unattributed_device_time_us=math.fsum(d for h, d in counted if h == ""),
    )
