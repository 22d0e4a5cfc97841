"""A collective's process group as the global ranks in it, from what a trace holds. Pure.

Example::

    groups = process_groups(trace_meta)     # [{"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}, ...]
    members(kernel_args, groups)            # [0, 1] from "Process Group Ranks", start/stride or the pg_config

Where torch writes them (`saveNcclMeta`, on `record_param_comms` and copied by Kineto onto NCCL
kernels): `Process Group Name`, `Process Group Description`, `Process Group Ranks` (a list, cut
short for a large group), `Group size`, `Global rank start` and `Global rank stride`. The trace's
`distributedInfo.pg_config` lists the rank's own groups with their full rank lists. A group's
name is the creating process's counter and can differ across ranks (NxD creates groups only on
their members): a group is known by its members, never by its name.

Neuron Explorer's `CcOp` table names a collective's groups as `replica_group`
(`[[0,1,2,3],[4,5,6,7]]`: every group of the collective, one list each). Where a trace event
carries such an argument and none of torch's (`replica_group_of`), `replica_members` reads the
rank's group from it, or says why not.
"""

from __future__ import annotations

import json
import math
import re

_INTS = re.compile(r"-?\d+")
# torch's own process-group arguments (`saveNcclMeta`): where one is there, `replica_group` is not read
TORCH_GROUP_ARGS = ("Process Group Name", "Process Group Ranks", "Group size", "Global rank start",
                    "Global rank stride")  # fmt: skip


def process_groups(meta: dict) -> list[dict]:
    """The rank's process groups from `distributedInfo.pg_config` (creation order): name,
    description and the sorted global ranks; a group whose ranks cannot be read is left out."""
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    config = info.get("pg_config")
    if isinstance(config, dict):  # older torch: {name: {...}}
        config = [{"pg_name": name, **value} for name, value in config.items() if isinstance(value, dict)]
    groups = []
    for entry in config if isinstance(config, list) else []:
        if not isinstance(entry, dict):
            continue
        ranks = rank_list(entry.get("ranks"))
        if ranks is None and isinstance(entry.get("pg_size"), int) and entry.get("ranks") in ("all", None):
            ranks = list(range(entry["pg_size"]))  # older torch writes "all" for the default group
        if ranks:
            groups.append({"name": str(entry.get("pg_name")), "desc": _text(entry.get("pg_desc")), "ranks": ranks})
    return groups


def members(args: dict, groups: list[dict], cache: dict | None = None) -> list[int] | None:
    """The global ranks of a collective's group, sorted: its `Process Group Ranks` when whole, else
    `Global rank start`/`stride` with `Group size`, else its group's entry in `groups` by name;
    None when the trace does not say. A trace repeats a few groups thousands of times: with a
    `cache` (one per trace: it holds `groups`' answers) the same list is returned for the same
    arguments."""
    if cache is None:
        return _members(args, groups)
    key = (args.get("Group size"), str(args.get("Process Group Ranks")), args.get("Global rank start"),
           args.get("Global rank stride"), args.get("Process Group Name"))  # fmt: skip
    found = cache.get(key, _MISSING)
    if found is _MISSING:
        found = cache[key] = _members(args, groups)
    return found


_MISSING = object()


def _members(args: dict, groups: list[dict]) -> list[int] | None:
    size = _int(args.get("Group size"))
    listed = rank_list(args.get("Process Group Ranks"))
    if listed and (size is None or len(listed) == size):
        return listed
    start, stride = _int(args.get("Global rank start")), _int(args.get("Global rank stride"))
    if size and start is not None and stride:
        return sorted(start + i * stride for i in range(size))
    name = args.get("Process Group Name")
    if name is not None:
        for group in groups:
            if group["name"] == str(name) and (size is None or len(group["ranks"]) == size):
                return group["ranks"]
    return None


def description(args: dict, groups: list[dict], ranks: list[int] | None) -> str | None:
    """The group's description (`tp`, `dp`, `pp`, `default_pg`...): the kernel's own, else its
    pg_config entry's."""
    desc = _text(args.get("Process Group Description"))
    if desc:
        return desc
    for group in groups:
        if ranks is not None and (group["ranks"] is ranks or group["ranks"] == ranks) and group["desc"]:
            return group["desc"]
    return None


def replica_group_of(args: dict):
    """The `replica_group` argument of an event without torch's process-group arguments, else None."""
    if "replica_group" not in args or any(key in args for key in TORCH_GROUP_ARGS):
        return None
    return args["replica_group"]


def replica_members(value, rank: int | None, world_size: int | None,
                    cache: dict | None = None) -> tuple[list[int] | None, str | None]:
    """The sorted members of the sub-list of a `replica_group` (`"[[0,1,2,3],[4,5,6,7]]"` or the
    nested list) that holds `rank`, and None; or None and why there is no group (never a guess).

    Its members are replica ids. They are read as global ranks only where they cover the world
    consistently: the world size is known, every id is below it, each rank of the world is in
    exactly one sub-list, and one sub-list holds `rank`. Anything else (text that is not a list of
    lists of ids, an id >= the world size, a rank in no or two sub-lists) gives no group. With a
    `cache` (one per trace: its rank and world size are the trace's) a value is read once."""
    key = ("replica_group", str(value))
    if cache is not None and key in cache:
        return cache[key]
    found = _replica_members(value, rank, world_size)
    if cache is not None:
        cache[key] = found
    return found


def _replica_members(value, rank: int | None, world_size: int | None) -> tuple[list[int] | None, str | None]:
    lists = _nested_ids(value)
    shown = str(value) if len(str(value)) <= 80 else str(value)[:77] + "..."
    if lists is None:
        return None, f"its replica_group {shown!r} is not a list of replica id lists"
    if rank is None or world_size is None:
        unknown = "rank" if rank is None else "world size"
        return None, f"its replica_group cannot be read as global ranks: the trace's {unknown} is unknown"
    ids = [i for ids in lists for i in ids]
    if max(ids) >= world_size:
        return None, f"its replica_group holds replica id {max(ids)} in a world of {world_size}: not global ranks"
    holding = [ids for ids in lists if rank in ids]
    if len(holding) != 1:
        return None, f"{'no' if not holding else len(holding)} sub-lists of its replica_group {shown} hold rank {rank}"
    if len(ids) != world_size or len(set(ids)) != world_size:
        return None, f"its replica_group {shown} does not hold each of the {world_size} ranks once: not global ranks"
    return sorted(holding[0]), None


def _nested_ids(value) -> list[list[int]] | None:
    """A list of non-empty lists of non-negative ints without repeats, from the list or its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, list) or not value or not all(isinstance(ids, list) and ids for ids in value):
        return None
    for ids in value:
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids) or len(set(ids)) != len(ids):
            return None
    return value


def rank_list(value) -> list[int] | None:
    """Sorted unique global ranks from a list or its text ("[0, 1, 2]"); None for anything else,
    or for a list cut short ("[0, 1, ...]")."""
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("[") or "..." in text or not text.endswith("]"):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            value = [int(v) for v in _INTS.findall(text)]
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return sorted(set(value))


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value if isinstance(value, int) else None


def _text(value) -> str | None:
    return value if isinstance(value, str) and value and value != "undefined" else None
