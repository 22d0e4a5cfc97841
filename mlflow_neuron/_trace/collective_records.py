"""A collective's record in a rank summary, from its trace event's args (pure).

Used by `collectives`: name, process group (`groups`), sequence number, time, bytes, and for a
send or a receive its peer. A collective whose `replica_group` (Neuron Explorer's name for its
groups) gives no group says why in `unplaced`, a key only such records have.
"""

from __future__ import annotations

import bisect
import math
import re

from .dtypes import ELEMENT_BYTES
from .groups import description, members, replica_group_of, replica_members

# send/recv (gloo:send, c10d's recv_anysource, NCCL's SendRecv kernels): between two ranks, never all
POINT_TO_POINT = re.compile(r"send|recv", re.IGNORECASE)


def record(name: str, args: dict, start: float, end: float, anchor: float, groups: list[dict], lane=None,
           cache: dict | None = None, rank: int | None = None, world_size: int | None = None) -> dict:
    """A collective: its name, group (name as the trace wrote it, `members` as global ranks,
    `desc`), `Seq`, its place in time and bytes; for a point-to-point transfer its `peer` (global
    rank, where the trace names it). `lane` is the thread of a backend span (gloo runs each group's
    work on threads of its own). `rank` and `world_size` (the trace's) read a `replica_group`."""
    group, replica, why = args.get("Process Group Name"), replica_group_of(args), None
    if replica is not None:
        ranks, why = replica_members(replica, rank, world_size, cache)
    else:
        ranks = members(args, groups, cache)
    if ranks is None and why is None and len(groups) == 1 and not POINT_TO_POINT.search(str(name)):
        ranks = groups[0]["ranks"]  # the rank's only group: where every collective of the rank runs
    found = {"name": str(name), "group": None if group is None else str(group), "members": ranks,
             "desc": description(args, groups, ranks), "seq": _int_or_none(args.get("Seq")), "step": None,
             "start_us": _rounded(start), "end_us": _rounded(end), "bytes": _bytes(args),
             "peer": _peer(name, args, ranks), "peer_index": None, "lane": lane, "_anchor": anchor}  # fmt: skip
    if why is not None:
        found["unplaced"] = why
    return found


def _peer(name: str, args: dict, ranks: list[int] | None) -> int | None:
    """The other rank of a send or a receive, global: `Dst Rank` (a send) or `Src Rank` (a
    receive), a global rank where it is one of the group's, else the rank within the group."""
    if not POINT_TO_POINT.search(str(name)) or ranks is None:
        return None
    value = _int_or_none(args.get("Dst Rank" if "send" in str(name).lower() else "Src Rank"))
    if value is None or value < 0:
        return None
    if value in ranks:
        return value
    return ranks[value] if value < len(ranks) else None


def _bytes(args: dict) -> int | None:
    """The message's size: `In msg nelems` x the dtype's size, or the first input's dims x its type."""
    nelems, dtype = args.get("In msg nelems"), args.get("dtype")
    if isinstance(nelems, int) and isinstance(dtype, str):
        size = ELEMENT_BYTES.get(dtype) or ELEMENT_BYTES.get(dtype.lower()) or _PARAM_COMMS_DTYPES.get(dtype)
        return nelems * size if size else None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list) and dims and types and isinstance(dims[0], list):
        size = ELEMENT_BYTES.get(types[0]) if isinstance(types[0], str) else None
        if size and all(isinstance(d, int) for d in dims[0]):
            return math.prod(dims[0]) * size
    return None


# record_param_comms writes c10::ScalarType names
_PARAM_COMMS_DTYPES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
                       "Char": 1, "Byte": 1, "Bool": 1}  # fmt: skip


def number_text(value):
    """A number from a profiler's `Concrete Inputs` entry ("3"), else the value."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _rounded(value):
    return round(value, 3) if isinstance(value, float) else value


def peers_in_groups(p2p_calls: list):
    """(start, thread) of a gloo send/recv -> its peer's rank within the group: the last c10d
    send/recv that started on that thread before it (gloo runs them on the calling thread). Calls
    are sorted once and looked up by bisection per thread; of calls that start together, the
    later listed is the last."""
    starts: dict = {}
    peers: dict = {}
    for s, t, p in sorted(p2p_calls, key=lambda c: c[0]):
        starts.setdefault(t, []).append(s)
        peers.setdefault(t, []).append(p)

    def peer(start: float, tid) -> int | None:
        i = bisect.bisect_right(starts.get(tid, ()), start) - 1
        return peers[tid][i] if i >= 0 else None

    return peer


def launched_in(backend_spans: list):
    """launch time -> the name of the `nccl:` span it lies in (`all_to_all`), or None: a kernel
    without a `Collective name` is what the op that launched it says (older NCCL runs an
    all_to_all as SendRecv kernels)."""
    spans = sorted((start, end, name) for start, end, name, *_ in backend_spans if name.startswith("nccl:"))
    starts = [start for start, _, _ in spans]

    def name(t: float) -> str | None:
        i = bisect.bisect_right(starts, t) - 1
        while i >= 0:
            start, end, span = spans[i]
            if start <= t <= end:
                return span.split(":", 1)[1]
            i -= 1
            if i >= 0 and t - spans[i][0] > 1e6:  # spans do not nest a second apart
                break
        return None

    return name


def member_sets_of(collectives: list[dict]) -> list[list[int]]:
    """Each distinct group's members once: a record's `members` becomes its index in the list
    returned (a world group's 4,096 ranks are written once a cycle, not once a collective)."""
    sets: list[list[int]] = []
    index: dict[tuple, int] = {}
    for c in collectives:
        ranks = c.get("members")
        if isinstance(ranks, list):
            key = tuple(ranks)
            if key not in index:
                index[key] = len(sets)
                sets.append(ranks)
            c["members"] = index[key]
    return sets
