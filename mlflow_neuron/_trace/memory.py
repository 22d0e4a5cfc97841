"""Memory per step and per op, from the `[memory]` records of `profile_memory=True`. Pure.

Example::

    peaks = step_peaks(raw.memory, step_starts, step_ends, step_numbers, private_use1="neuron")
    allocated = allocated_by_event(raw, tree)   # bytes each op allocated itself, per tree row

A step's peak is the highest total allocated inside its `ProfilerStep#N` range minus the level
when the step began (just before its first record), per device: what the step needed on top of
what it found. Each record carries its size (negative: a free), so the total after record i is
the level plus the running sum of sizes: the peak is the largest running sum. Records between
steps belong to none. Memory that the step held when it began is the level, not the peak.

An op's allocated bytes are the bytes of the allocations (not frees) whose record falls inside
it and inside none of its children on the same thread, as torch charges memory to ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .event_tree import EventTree
from .events import MemoryRecords, RawEvents

# c10::DeviceType numbers (torch/_C/_autograd DeviceType) -> the names metrics carry.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 19: "mtia"}
PRIVATE_USE1 = 20  # TorchNeuron's "neuron" (torch.utils.rename_privateuse1_backend)


@dataclass(frozen=True)
class StepMemory:
    """One device's peak in one profiler step (bytes above the step's starting level)."""

    step: int
    device: str
    peak_bytes: int


def private_use1_name(profile_device: str) -> str:
    """What PrivateUse1 memory is called: the profile's device when that is PrivateUse1's ("neuron")."""
    return profile_device if profile_device not in (*DEVICE_TYPES.values(), "rocm") else "privateuse1"


def device_name(device_type: int, private_use1: str) -> str:
    if device_type == PRIVATE_USE1:
        return private_use1
    return DEVICE_TYPES.get(int(device_type), f"device_type_{int(device_type)}")


def step_peaks(memory: MemoryRecords | None, step_starts: np.ndarray, step_ends: np.ndarray, step_numbers: list[int],
               private_use1: str) -> tuple[StepMemory, ...]:  # fmt: skip
    """Each (step, device)'s peak bytes; none without records or step ranges."""
    if memory is None or not len(memory) or not len(step_starts):
        return ()
    order = np.argsort(memory.start_ns, kind="stable")
    at, size, device = memory.start_ns[order], memory.nbytes[order], memory.device_type[order]
    found = []
    for start, end, number in sorted(zip(np.asarray(step_starts).tolist(), np.asarray(step_ends).tolist(), step_numbers)):
        inside = (at >= start) & (at <= end)
        for dev in np.unique(device[inside]).tolist():
            sizes = size[inside & (device == dev)]
            found.append(StepMemory(int(number), device_name(dev, private_use1), int(np.cumsum(sizes).max())))
    return tuple(found)


def allocated_by_event(raw: RawEvents, tree: EventTree) -> np.ndarray:
    """Per tree row, the bytes allocated by records inside it and in none of its children on its thread."""
    allocated = np.zeros(len(tree), np.int64)
    memory = raw.memory
    if memory is None or not len(memory):
        return allocated
    live = np.flatnonzero(tree.sync_host & tree.survivor)
    if not len(live):
        return allocated
    thread = raw.thread[tree.order][live]
    keys = np.lexsort((tree.start_ns[live], thread))  # by thread, then start
    live, thread, starts = live[keys], thread[keys], tree.start_ns[live][keys]
    positive = memory.nbytes > 0
    at, rec_thread, size = memory.start_ns[positive], memory.thread[positive], memory.nbytes[positive]
    if not len(at):  # only frees (or zero-byte records): nothing was allocated
        return allocated
    # the last op on the record's thread that started at or before it, then up to one that holds it
    ranks = np.unique(np.concatenate([thread, rec_thread]), return_inverse=True)[1].ravel()
    op_rank, rec_rank = ranks[: len(thread)], ranks[len(thread):]
    low = min(int(starts.min()), int(at.min()))
    span = max(int(starts.max()), int(at.max())) - low + 1
    index = np.searchsorted(op_rank * span + (starts - low), rec_rank * span + (at - low), side="right") - 1
    found = (index >= 0) & (op_rank[np.maximum(index, 0)] == rec_rank)
    owner = np.where(found, live[np.maximum(index, 0)], -1)
    while True:
        open_ = owner >= 0
        ended = open_ & (tree.end_ns[np.maximum(owner, 0)] < at)
        if not ended.any():
            break
        owner[ended] = tree.parent[owner[ended]]
    held = owner >= 0
    np.add.at(allocated, owner[held], size[held])
    return allocated
