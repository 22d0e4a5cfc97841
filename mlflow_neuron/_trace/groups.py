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
"""

from __future__ import annotations

import json
import math
import re

_INTS = re.compile(r"-?\d+")


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
