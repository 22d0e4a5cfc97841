"""What both readers of a cycle produce (`kineto` from torch's Kineto results, `chrome` from a
chrome trace), and the aggregator and the timeline read: `RawEvents`, the events in numpy columns,
and `TimelineInputs`, what a timeline needs besides them. Pure: no torch, no MLflow, no files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

# Device classes of RawEvents.device_class.
HOST, DEVICE_KERNEL, DEVICE_OTHER, OTHER = 0, 1, 2, 3

MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME = "[memory]", "[OutOfMemory]"


@dataclass(frozen=True, eq=False)
class MemoryRecords:
    """A cycle's `[memory]` records (`profile_memory=True`), in recording order: when (ns, the events'
    zero), how many bytes (negative: a free), and on which device (c10 `DeviceType` numbers)."""

    start_ns: np.ndarray
    nbytes: np.ndarray
    device_type: np.ndarray
    thread: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    def __eq__(self, other: object) -> bool:  # the same records, read by either reader
        return isinstance(other, MemoryRecords) and all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))


@dataclass(frozen=True, eq=False)
class RawEvents:
    """One cycle's events as torch turns them into `FunctionEvent`s, before linking, in columns.

    Row order is the recording order (torch's tie-break). Times are nanoseconds from the trace
    start. `device_class`: HOST (CPU), DEVICE_KERNEL (CUDA/PrivateUse1/XPU: attached to the op
    they link to), DEVICE_OTHER (MTIA/HPU device rows), OTHER (any other device type).
    `use_device`: the profiler's device; without one torch reports no device time at all.
    `source_index`: where each row came from, for readers of more of the same events (the
    timeline's streams and shapes): its index in Kineto's `events()` list or in a chrome trace's
    `traceEvents`; None when unknown.
    """

    names: tuple[str, ...]  # distinct names as recorded
    name_id: np.ndarray  # index into names
    start_ns: np.ndarray
    end_ns: np.ndarray
    thread: np.ndarray
    device_class: np.ndarray
    correlation_id: np.ndarray
    linked_correlation_id: np.ndarray  # 0: not linked
    is_async: np.ndarray
    is_user_annotation: np.ndarray
    legacy_device_us: np.ndarray  # device time from legacy fallback stubs, 0 where none
    use_device: str | None
    source_index: np.ndarray | None = None
    memory: MemoryRecords | None = None  # the `[memory]` records, with their bytes (None: none recorded)

    def __post_init__(self) -> None:
        n = len(self.name_id)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray) and len(value) != n:
                raise ValueError(f"RawEvents.{f.name} has {len(value)} rows, name_id has {n}")

    def __len__(self) -> int:
        return len(self.name_id)

    def sources_within(self, count: int) -> bool:
        """Whether `source_index` is known and every entry indexes a list of `count` events."""
        rows = self.source_index
        return rows is not None and (len(rows) == 0 or (int(rows.min()) >= 0 and int(rows.max()) < count))


def empty_events(use_device: str | None) -> RawEvents:
    i, b = np.zeros(0, np.int64), np.zeros(0, bool)
    return RawEvents((), i, i, i, i, np.zeros(0, np.int8), i, i, b, b, np.zeros(0), use_device=use_device, source_index=i)


def uncovered_memory(memory: tuple, start: np.ndarray, end: np.ndarray, host: np.ndarray) -> tuple:
    """Columns of the memory events torch adds: OOM records, and `[memory]` records outside every
    host event (torch matches them to any host event, on any thread, whose span holds them).

    `memory`: the records as (name ids, start, thread, is_oom, source index); both readers append
    the result (RawEvents' columns, `source_index` last) after their rows."""
    ids, at, thread, oom, source = memory
    covered = np.zeros(len(at), bool)
    if host.any():
        s, e = start[host], end[host]
        order = np.argsort(s, kind="stable")
        reach = np.maximum.accumulate(e[order])
        last = np.searchsorted(s[order], at, side="right") - 1
        covered = (last >= 0) & (reach[np.maximum(last, 0)] >= at)
    emit = oom | ~covered
    order = np.concatenate([np.flatnonzero(emit & ~oom), np.flatnonzero(oom)])  # torch: memory, then OOM
    k = len(order)
    zeros = np.zeros(k, np.int64)
    return (ids[order], at[order], at[order], thread[order], np.full(k, HOST, np.int8), zeros, zeros,
            np.zeros(k, bool), np.zeros(k, bool), np.zeros(k), source[order])  # fmt: skip


def memory_records(is_memory: np.ndarray, start_ns: np.ndarray, nbytes: np.ndarray, device_type: np.ndarray,
                   thread: np.ndarray) -> MemoryRecords | None:  # fmt: skip
    """The `[memory]` rows among a reader's memory and OOM records; None when there are none."""
    if not is_memory.any():
        return None
    return MemoryRecords(*(np.asarray(c, np.int64)[is_memory] for c in (start_ns, nbytes, device_type, thread)))


def factorize(values: list) -> tuple[list, np.ndarray]:
    """(distinct values in first-seen order, each value's index into them)."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    return list(uniques), codes.astype(np.int64)


@dataclass(frozen=True, eq=False)
class DeviceLanes:
    """Which stream each `RawEvents` row ran on: `lane[row]` indexes `names` (-1: not a device
    row, or unknown)."""

    lane: np.ndarray
    names: tuple[str, ...]


ShapesReader = Callable[[np.ndarray], Sequence[Any]]  # raw rows -> each row's input shapes (or None)


@dataclass(frozen=True, eq=False)
class TimelineInputs:
    """What `build_timeline` needs besides `RawEvents`, read from the same cycle's source: the epoch
    time of the events' zero, each device row's stream, and input shapes (`record_shapes=True`)."""

    origin_ns: int | None = None
    lanes: DeviceLanes | None = None
    input_shapes: ShapesReader | None = None
    op_inputs: Callable[[np.ndarray], Sequence[Any]] | None = None  # raw rows -> `traffic.OpInputs` (or None)
