"""Each collective instance found on every rank, and every rank's wait at it (pure).

Used by `analysis` (its docstring says how instances are matched and what the wait is). A
rank's collectives are keyed by process group and `Seq`, else by group, step and place among the
group's collectives in the step, else by group, cycle and place; an instance is matched when
every rank has its key under one name. Point-to-point transfers are keyed apart and never matched.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict

import numpy as np
import pandas as pd

# send/recv (gloo:send, c10d's recv_anysource, NCCL's SendRecv kernels): between two ranks, never all
POINT_TO_POINT = re.compile(r"send|recv", re.IGNORECASE)
INSTANCE_COLUMNS = ["instance", "name", "group", "step", "rank", "start_us", "end_us", "spent_us", "wait_us",
                    "arrived_last"]  # fmt: skip


def keyed_collectives(summaries: list[dict]) -> dict[tuple, dict]:
    """A rank's collectives by their matching key (module docstring)."""
    keyed, places = {}, Counter()
    records = [(s.get("cycle_step"), c) for s in summaries for c in s.get("collectives") or [] if _valid(c)]
    for cycle, c in sorted(records, key=lambda item: item[1]["start_us"]):
        if POINT_TO_POINT.search(str(c.get("name"))):
            key = ("p2p", cycle, c["start_us"])
        elif c.get("seq") is not None:
            key = ("seq", c.get("group"), c["seq"])
        else:
            scope = ("step", c["step"]) if c.get("step") is not None else ("cycle", cycle)
            place = places[(c.get("group"), scope)]
            places[(c.get("group"), scope)] += 1
            key = (scope[0], c.get("group"), scope[1], place)
        keyed.setdefault(key, c)
    return keyed


def _valid(c) -> bool:
    """A collective record with a name and a start no later than its end."""
    return isinstance(c, dict) and isinstance(c.get("name"), str) and is_number(c.get("start_us")) \
        and is_number(c.get("end_us")) and c["end_us"] >= c["start_us"]


def match(keyed: dict[int, dict[tuple, dict]]) -> tuple[dict[tuple, dict[int, dict]], list[dict]]:
    ranks = sorted(keyed)
    everywhere = set.intersection(*(set(k) for k in keyed.values()))
    instances, unmatched = {}, []
    for key in sorted(everywhere, key=str):
        records = {r: keyed[r][key] for r in ranks}
        if len({c["name"] for c in records.values()}) == 1:
            instances[key] = records
    for r in ranks:
        for key, c in keyed[r].items():
            if key not in instances:
                on = [q for q in ranks if key in keyed[q]]
                unmatched.append({"rank": r, "name": c["name"], "group": c.get("group"), "step": c.get("step"),
                                  "seq": c.get("seq"), "on_ranks": on,
                                  "why": "names differ across ranks" if len(on) == len(ranks) else "not on every rank"})  # fmt: skip
    return instances, unmatched


def waits(instances, ranks, *, min_wait_us: float, wait_to_transfer: float):
    """rank -> step -> name -> wait (µs), and the instances that kept ranks waiting: (the rank that
    arrived last, the collective's name, the others' median wait, the step) where that wait reached
    `min_wait_us` and `wait_to_transfer` times the transfer."""
    waits: dict[int, dict] = {r: defaultdict(lambda: defaultdict(float)) for r in ranks}
    waited_for: list[tuple[int, str, float]] = []
    rows = []
    for number, records in enumerate(instances.values()):
        spent = {r: c["end_us"] - c["start_us"] for r, c in records.items()}
        transfer = min(spent.values())
        last = [r for r, t in spent.items() if t == transfer]
        for r, c in records.items():
            wait = round(spent[r] - transfer, 3)
            waits[r][c.get("step")][c["name"]] += wait
            rows.append((number, c["name"], c.get("group"), c.get("step"), r, c["start_us"], c["end_us"], spent[r],
                         wait, len(last) == 1 and r == last[0]))  # fmt: skip
        others = float(np.median([t - transfer for r, t in spent.items() if r != last[0]]))
        if len(last) == 1 and others >= max(min_wait_us, wait_to_transfer * transfer):
            step = records[last[0]].get("step")
            waited_for.append((last[0], records[last[0]]["name"], others, ("instance", number) if step is None else step))
    return waits, waited_for, pd.DataFrame(rows, columns=INSTANCE_COLUMNS)


def is_number(value) -> bool:
    """A finite int or float (not a bool): what a time in a summary must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
