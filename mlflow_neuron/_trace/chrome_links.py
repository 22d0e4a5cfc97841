"""How a chrome trace's device events are linked to the ops that launched them. Pure.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .events import DEVICE_KERNEL, HOST

EXTERNAL_ID, CORRELATION = "external_id", "correlation"
# Roles of a row for linking: a torch op, a runtime launch, a device event, another host event.
OP_ROLE, LAUNCH_ROLE, DEVICE_ROLE, OTHER_HOST_ROLE = 0, 1, 2, 3


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


def link_devices(start: np.ndarray, end: np.ndarray, thread: np.ndarray, role: np.ndarray, target: np.ndarray,
                 external: np.ndarray, correlation: np.ndarray,
                 dialect: str | None) -> tuple[np.ndarray, np.ndarray, dict[int, str], str]:  # fmt: skip
    """(own ids, linked ids, how each device row was linked, dialect) of the rows (columns in).

    How: per device row, "id", "runtime" or "" (no op found). Only launches and device rows need
    more than their own columns; a trace without either (a CPU profile) is linked in numpy alone.
    """
    own = np.where(role == OP_ROLE, external, 0).astype(np.int64)
    linked = np.where(role == OTHER_HOST_ROLE, external, 0).astype(np.int64)
    launches, devices = np.flatnonzero(role == LAUNCH_ROLE).tolist(), np.flatnonzero(role == DEVICE_ROLE).tolist()
    if not launches and not devices:
        return own, linked, {}, dialect or EXTERNAL_ID
    start, end, thread, external, correlation = (c.tolist() for c in (start, end, thread, external, correlation))
    op_rows = np.flatnonzero((role == OP_ROLE) & (np.asarray(external) > 0)).tolist()
    ops = {external[i]: i for i in op_rows}
    launch_of: dict[int, int] = {}
    for i in launches:
        if correlation[i] > 0:
            launch_of.setdefault(correlation[i], i)
    enclosing = _innermost_enclosing(start, end, thread, np.flatnonzero(target).tolist(), launches)
    enclosing = {call: op for call, op in enclosing.items() if external[op] > 0}  # no id: nothing links to it
    if dialect is None:
        dialect = _detect(start, end, thread, external, correlation, ops, launches, devices)
    for i in launches:
        # A launch is no op: with an id of its own it would take the kernels of any op whose
        # External id happens to equal its correlation id (MTIA traces have such pairs).
        op = enclosing.get(i)
        if dialect == EXTERNAL_ID and external[i] > 0:
            linked[i] = external[i]
        else:  # no External id, or it is the call's own correlation: the enclosing op is the link
            linked[i] = external[op] if op is not None else 0
    how: dict[int, str] = {}
    for i in devices:
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


def _detect(start: list, end: list, thread: list, external: list, correlation: list, ops: dict, launches: list,
            devices: list) -> str:  # fmt: skip
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
    device = [i for i in devices if correlation[i] > 0]
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
    if not queries:
        return found
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


def linking_summary(dialect: str, how: dict[int, str], device_class: np.ndarray, annotation: np.ndarray,
                    dur: np.ndarray) -> Linking:  # fmt: skip
    """Counts over device rows that are not annotations; rows of a class torch never attaches
    (DEVICE_OTHER) count as unattributed whatever their ids say."""
    rows = np.flatnonzero((device_class != HOST) & ~annotation.astype(bool))
    kernel = (device_class[rows] == DEVICE_KERNEL).tolist()  # lists: numpy scalars one at a time are slow
    hows = [how.get(i, "") if k else "" for i, k in zip(rows.tolist(), kernel)]
    durations = [float(d) for d in dur[rows].tolist()]
    return Linking(
        dialect=dialect,
        device_events=len(hows),
        by_external_id=hows.count("id"),
        through_runtime=hows.count("runtime"),
        unlinked=hows.count(""),
        device_time_us=math.fsum(durations),
        unattributed_device_time_us=math.fsum(d for h, d in zip(hows, durations) if h == ""),
    )
