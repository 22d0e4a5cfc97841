"""One rank's cycle in a few numbers a step, and its collectives: the rank summary. Pure.

Example::

    summary = rank_summary_from_chrome("rank2.pt.trace.json.gz", cycle_step=9)
    summary["steps"][0]      # {"step": 7, "step_us": 81234.5, "collective_us": 31020.0, "idle_us": ...}
    summary["collectives"]   # [{"name": "all_reduce", "group": None, "seq": None, "step": 7, ...}, ...]

`_analysis.ranks` matches the collectives of every rank's summary to find the wait and the straggler;
this module reads one rank. The format (`FORMAT`, `VERSION`) is documented in `docs/ranks.md`.

**Which events are collectives** (feature-detected; a name is what the trace wrote):
1. device kernels that HolisticTraceAnalysis counts as communication (`COMM_KERNEL`: NCCL, RCCL,
   HCCL); name, process group and sequence number from their `Collective name`, `Process Group
   Name` and `Seq` arguments where the trace has them, else the kernel's name;
2. else the backends' own spans, `gloo:all_reduce`, `nccl:all_reduce` (name after the colon): gloo
   runs each collective in such a span on a worker thread, from its start to its last byte;
3. else `record_param_comms` ops with a `Collective name` (with `Process Group Name` and `Seq`).
`c10d::allreduce_` and friends only queue the work (100 µs where the collective takes ms): they are
neither compute nor collective time.

**The timeline a step is split on.** Where the trace has device events (HTA's categories:
`kernel`, `gpu_memcpy`, `gpu_memset`, `cuda_sync`, `mtia_ccp_events`), the device's, as HTA's
temporal breakdown splits it: compute = the union of compute kernels (HTA's kernel classes), idle =
the window minus the union of every device event. A step's device window runs from its first device
event (a device event belongs to the step its launch is in) to the next step's first, the last one
to its last event's end, so the windows tile the device's timeline. Without device events (a CPU
job, gloo), the host's: a step's window is its `ProfilerStep#N` span, compute the union of its
`cpu_op`s on every thread (collective ops left out), collective time the union of the collectives,
idle what neither covers (a `time.sleep`, a data loader's wait). Exposed communication = collective
time that no compute overlaps; memcpy = the union of host<->device copies with their `bytes`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from .chrome_file import read_pieces
from .collective_records import POINT_TO_POINT, launched_in, member_sets_of, number_text, peers_in_groups
from .collective_records import record as collective_record
from .groups import process_groups
from .intervals import IntervalUnion, pairs, step_indices
from .rank_columns import feed_columns
from .rank_roles import COMM, COMPUTE, CPU_OP, DEVICE, LAUNCH, MEMORY, SKIP, device_class, role_of

FORMAT = "mlflow-neuron/rank-summary"
VERSION = 2  # 2: each collective's group as its members (`members`, `desc`), `peer`, `lane`; `groups`
VERSIONS_READ = (1, 2)

BACKEND_SPAN = re.compile(r"^(gloo|nccl):(.+)")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NO_ARGS: dict = {}


def rank_summary_from_chrome(trace: dict | str | Path, *, rank: int | None = None, host: str | None = None,
                             world_size: int | None = None, cycle_step: int | None = None) -> dict:
    """The rank summary (format `FORMAT`, version `VERSION`) of one cycle's chrome trace, a dict or
    a file (`.json` or `.json.gz`). `rank` and `world_size` default to the trace's
    `distributedInfo`, `host` to its `host_name`; whatever is still unknown is None. ValueError
    for something that is not a chrome trace."""
    events = RankEvents()
    if isinstance(trace, dict):
        if not isinstance(trace.get("traceEvents"), list):
            raise ValueError("not a chrome trace (no traceEvents list)")
        events.feed(trace["traceEvents"])
        meta = trace
    else:
        meta = read_pieces(trace, events.feed, events.restart)
    return events.summary(meta, rank=rank, host=host, world_size=world_size, cycle_step=cycle_step)


class RankEvents:
    """The events a rank summary needs, kept as plain tuples while a trace is read: `feed` takes
    the `traceEvents` a list at a time (as `chrome_file.read_pieces` hands them, so one reading of
    a file can feed this and another reader), `restart` forgets them, `summary` makes the summary."""

    def __init__(self):
        self.restart()

    def summary(self, meta: dict, *, rank: int | None = None, host: str | None = None,
                world_size: int | None = None, cycle_step: int | None = None) -> dict:
        """The rank summary of what was fed; `meta` is the trace without its events."""
        info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
        groups = process_groups(meta)
        rank = rank if rank is not None else _int_or_none(info.get("rank"))
        world_size = world_size if world_size is not None else _int_or_none(info.get("world_size"))
        steps, collectives, source, timeline = self.summarize(groups, rank=rank, world_size=world_size)
        member_sets = member_sets_of(collectives)
        return {
            "format": FORMAT, "version": VERSION, "rank": rank, "world_size": world_size,
            "host": host if host is not None else (meta.get("host_name") or None),
            "cycle_step": cycle_step,
            "timeline": timeline, "collective_source": source, "pid": self.pid,
            "steps": steps, "collectives": collectives, "member_sets": member_sets, "groups": groups, "device": None,
            "skipped_events": self.skipped,
        }  # fmt: skip

    def finish(self, header: dict) -> None:
        """Keeps the trace's header (its other keys: `distributedInfo`, `host_name`) for `summary`."""
        self.meta = header

    def restart(self) -> None:
        self.meta: dict = {}
        self.steps: list[tuple[int, float, float]] = []  # (number, start, end)
        self.cpu_ops: list[tuple[float, float]] = []
        self.device: list[tuple[float, float, int, Any, dict]] = []  # (start, end, class, correlation, args)
        self._columns = None  # the device events as arrays, once summarized
        self.launches: dict[Any, float] = {}  # correlation id -> the launch's start
        self.spans: list[tuple[float, float, str, dict, Any]] = []  # gloo:/nccl: spans, with their thread
        self.param_comms: list[tuple[float, float, dict]] = []
        self.pid = None  # the process's id, as a backend span gives it (thread ids above it: not wrapped)
        self.callers: set = set()  # threads that call c10d ops (gloo's send/recv run on them)
        self.p2p_calls: list[tuple[float, Any, int | None]] = []  # c10d send/recv: (start, thread, peer in group)
        self.memory: list[tuple[float, float, bool]] = []  # (ts, total allocated, on a device)
        self.roles: dict[str, int] = {}
        self.skipped = 0  # complete events without a usable ts/dur
        self.classes: dict[tuple[str, str], tuple[int, bool]] = {}
        self.name_list: list[str] = []  # a `ReadPiece`'s name ids -> names
        self.name_flags = np.zeros(0, np.int8)  # per name id: `rank_roles.name_flag`

    def feed(self, chunk: list) -> None:
        """Keeps what a summary needs of a list of events; the role of a category and the class of a
        kernel name are worked out once each (a trace repeats a few of them 100,000 times)."""
        cpu_ops, device, launches, roles, classes = (self.cpu_ops, self.device, self.launches, self.roles,
                                                     self.classes)  # fmt: skip
        for event in chunk:
            if not isinstance(event, dict):
                continue
            phase = event.get("ph")
            if phase != "X":
                if phase == "i" and event.get("name") == "[memory]":
                    self._memory(event)
                continue
            category, name = event.get("cat") or "", event.get("name") or ""
            role = roles.get(category)
            if role is None:
                role = roles[category] = role_of(category)
            if role == SKIP:
                continue
            try:
                start = float(event["ts"])
                end = start + float(event.get("dur") or 0.0)
            except (KeyError, TypeError, ValueError):
                self.skipped += 1
                continue
            if not end - start >= 0.0:  # NaN, an infinity, a negative duration
                self.skipped += 1
                continue
            if role == CPU_OP:
                if name.startswith(("c10d::", "gloo:", "nccl:", "ProfilerStep#")):
                    if name.startswith("ProfilerStep#"):
                        self._step(name, start, end)
                    elif name.startswith("c10d::"):
                        self.callers.add(event.get("tid"))
                        if name in ("c10d::send", "c10d::recv_"):
                            self._p2p_call(start, event)
                elif name == "record_param_comms":
                    self.param_comms.append((start, end, event.get("args") or {}))
                else:
                    cpu_ops.append((start, end))
            elif role == DEVICE:
                args = event.get("args") or {}
                known = classes.get((category, name))
                if known is None:
                    known = classes[(category, name)] = device_class(category, name)
                kind, keep = known
                device.append((start, end, kind, args.get("correlation"), {**args, "_name": name} if keep else _NO_ARGS))
            elif role == LAUNCH:
                correlation = (event.get("args") or {}).get("correlation")
                if correlation is not None:
                    launches[correlation] = start
            elif name.startswith("ProfilerStep#"):  # ANNOTATION
                self._step(name, start, end)
            elif name.startswith(("gloo:", "nccl:")):
                self.spans.append((start, end, name, event.get("args") or {}, event.get("tid")))
                if self.pid is None and isinstance(event.get("pid"), int):
                    self.pid = event["pid"]

    def feed_read(self, piece) -> None:
        """`feed`, from the columns that the cycle's reader made of the same events
        (`chrome_file.ReadPiece`): `rank_columns.feed_columns`."""
        feed_columns(self, piece)

    def _p2p_call(self, start: float, event: dict) -> None:
        """A c10d send or receive on the calling thread: its peer (the rank within its group,
        `Concrete Inputs`[2] where shapes were recorded)."""
        inputs = (event.get("args") or {}).get("Concrete Inputs")
        peer = _int_or_none(number_text(inputs[2])) if isinstance(inputs, list) and len(inputs) > 2 else None
        self.p2p_calls.append((start, event.get("tid"), peer))

    def _step(self, name: str, start: float, end: float) -> None:
        step = _STEP.match(name)
        if step:
            self.steps.append((int(step.group(1)), start, end))

    def _memory(self, event: dict) -> None:
        args = event.get("args") or {}
        total = args.get("Total Allocated")
        ts = event.get("ts")
        if isinstance(total, (int, float)) and isinstance(ts, (int, float)):
            self.memory.append((float(ts), float(total), args.get("Device Type", 0) not in (0, None)))

    def summarize(self, groups: list[dict] | None = None, *, rank: int | None = None,
                  world_size: int | None = None) -> tuple[list[dict], list[dict], str | None, str]:
        steps = sorted({number: (number, start, end) for number, start, end in self.steps}.values(), key=lambda s: s[1])
        if not steps:  # no ProfilerStep: the whole trace is one step, numbered None
            spans = self.cpu_ops + [(s, e) for s, e, *_ in self.device] + [(s, e) for s, e, *_ in self.spans]
            if spans:
                steps = [(None, min(s for s, _ in spans), max(e for _, e in spans))]
        timeline = "device" if self.device else "cpu"
        collectives, source = self._collectives(groups or [], {"rank": rank, "world_size": world_size})
        anchors = np.fromiter((record.pop("_anchor") for record in collectives), float, len(collectives))
        for record, i in zip(collectives, step_indices(steps, anchors).tolist()):
            record["step"] = None if i < 0 else steps[i][0]
        windows = self._device_windows(steps) if timeline == "device" else [(s, e) for _, s, e in steps]
        return self._steps(steps, windows, collectives, timeline), collectives, source, timeline

    def _collectives(self, groups: list[dict], where: dict) -> tuple[list[dict], str | None]:
        """The collectives, from the first source the trace has; `where`: the trace's rank and world size."""
        kernels = [d for d in self.device if d[2] == COMM]
        cache: dict = {}  # a group's members, once per trace
        if kernels:
            named = launched_in(self.spans)
            records = []
            for start, end, _, correlation, args in kernels:
                launch = self.launches.get(correlation, start)
                name = args.get("Collective name") or named(launch) or args["_name"]
                records.append(collective_record(name, args, start, end, launch, groups, cache=cache, **where))
            return sorted(records, key=lambda r: r["start_us"]), "device_kernels"
        if self.spans:
            peer_index = peers_in_groups(self.p2p_calls)
            records = []
            for start, end, name, args, tid in self.spans:
                record = collective_record(BACKEND_SPAN.match(name).group(2), args, start, end, start, groups,
                                           lane=None if tid in self.callers else tid, cache=cache, **where)
                if record["peer"] is None and POINT_TO_POINT.search(record["name"]):
                    record["peer_index"] = peer_index(start, tid)
                records.append(record)
            return sorted(records, key=lambda r: r["start_us"]), "backend_spans"
        named = [(start, end, args) for start, end, args in self.param_comms if args.get("Collective name")]
        if named:
            records = [collective_record(args["Collective name"], args, start, end, start, groups, cache=cache, **where)
                       for start, end, args in named]
            return sorted(records, key=lambda r: r["start_us"]), "record_param_comms"
        return [], None

    def _device_windows(self, steps) -> list[tuple[float, float]]:
        """Each step's window on the device: its first device event (by launch) to the next one's."""
        if not steps:
            return []
        starts, ends, _ = self._device_columns()
        launches = self.launches
        anchors = np.fromiter((launches.get(d[3], d[0]) for d in self.device), float, len(self.device))
        index = step_indices(steps, anchors)
        inside = index >= 0
        firsts = np.full(len(steps), math.inf)
        lasts = np.full(len(steps), -math.inf)
        np.minimum.at(firsts, index[inside], starts[inside])
        np.maximum.at(lasts, index[inside], ends[inside])
        firsts, lasts = firsts.tolist(), lasts.tolist()
        windows = []
        for i in range(len(steps)):
            following = next((f for f in firsts[i + 1:] if f < math.inf), None)
            end = following if following is not None and following > firsts[i] else lasts[i]
            windows.append((firsts[i], end) if firsts[i] < math.inf else (math.nan, math.nan))
        return windows

    def _steps(self, steps, windows, collectives, timeline) -> list[dict]:
        device = timeline == "device"
        if device:
            starts, ends, kinds = self._device_columns()
            compute = IntervalUnion(np.column_stack([starts, ends])[kinds == COMPUTE])
            busy = IntervalUnion(np.column_stack([starts, ends]))
            copies = [(s, e, a.get("bytes")) for s, e, kind, _, a in self.device if kind == MEMORY and "_name" in a]
        else:
            compute = IntervalUnion(pairs(self.cpu_ops))
            busy = IntervalUnion(np.concatenate([pairs(self.cpu_ops), pairs([(r["start_us"], r["end_us"]) for r in collectives])]))
            copies = []
        comm = IntervalUnion(pairs([(r["start_us"], r["end_us"]) for r in collectives]))
        comm_or_compute = IntervalUnion(np.concatenate([compute.intervals, comm.intervals]))
        copy_union = IntervalUnion(pairs([(s, e) for s, e, _ in copies]))
        peak = self._peaks()
        rows = []
        for (number, cpu_start, cpu_end), (start, end) in zip(steps, windows):
            row = {"step": number, "start_us": cpu_start, "end_us": cpu_end, "step_us": cpu_end - cpu_start,
                   "window_us": None, "compute_us": None, "collective_us": None, "exposed_comm_us": None,
                   "idle_us": None, "memcpy_us": None, "memcpy_bytes": None, "peak_memory_bytes": None}  # fmt: skip
            if not math.isnan(start):
                in_compute, in_comm = compute.within(start, end), comm.within(start, end)
                row.update(window_us=end - start, compute_us=in_compute, collective_us=in_comm,
                           exposed_comm_us=comm_or_compute.within(start, end) - in_compute,
                           idle_us=(end - start) - busy.within(start, end))  # fmt: skip
                if device:
                    row["memcpy_us"] = copy_union.within(start, end)
                    row["memcpy_bytes"] = _copied_bytes([b for s, _, b in copies if start <= s < end])
            row["peak_memory_bytes"] = peak(cpu_start, cpu_end if not device or math.isnan(end) else max(cpu_end, end))
            rows.append({k: _rounded(v) for k, v in row.items()})
        return rows

    def _device_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The device events' starts, ends and kernel classes as arrays (made once; `restart` forgets them)."""
        if self._columns is None:
            n = len(self.device)
            self._columns = (np.fromiter((d[0] for d in self.device), float, n),
                             np.fromiter((d[1] for d in self.device), float, n),
                             np.fromiter((d[2] for d in self.device), np.int8, n))  # fmt: skip
        return self._columns

    def _peaks(self):
        """(start, end) -> the largest `Total Allocated` in [start, end): the device's where the
        trace has device memory events, else the host's; None without any."""
        on_device = any(d for _, _, d in self.memory)
        kept = sorted((ts, total) for ts, total, d in self.memory if d == on_device)
        times = np.asarray([ts for ts, _ in kept], float)
        totals = [total for _, total in kept]

        def peak(start: float, end: float) -> int | None:
            a, b = np.searchsorted(times, start, side="left"), np.searchsorted(times, end, side="left")
            return int(max(totals[a:b])) if b > a else None

        return peak


def _copied_bytes(sizes: list) -> int | None:
    """The bytes of a step's copies: 0 without copies, None where one copy's size is not recorded."""
    return int(sum(sizes)) if all(isinstance(b, (int, float)) for b in sizes) else None


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _rounded(value):
    return round(value, 3) if isinstance(value, float) else value
