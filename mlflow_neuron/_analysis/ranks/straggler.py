"""The straggler: the rank whose own time made the others wait (pure). The rule is in
`analysis`'s docstring; its constants are here (`benchmarks/rank_calibration.py` measures them).
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pandas as pd

from .matching import is_number as _number
from .matching import median_of as _median
from .words import duration

STRAGGLER_P_VALUE = 0.02
INSTANCE_WAIT_TO_TRANSFER = 0.5
STRAGGLER_MIN_WAIT_SHARE = 0.05
STRAGGLER_MIN_WAIT_US = 100.0
STRAGGLER_INSTANCE_P_VALUE = 0.002
SIGN_TEST_STEPS = 6  # the fewest steps in which the sign test can pass (6 of 6: p = 0.016)


def find(table, steps, kept, waited_for, matched, roles, groups) -> tuple[dict | None, str]:
    """The straggler by the rule of the module docstring, or None and why not."""
    if len(table) < 2:
        return None, "one rank"
    if matched == 0 and steps["bubble_us"].isna().all():
        return None, "no collective matched across ranks"
    lateness = _lateness(steps, kept, roles)
    lateness = {r: v for r, v in lateness.items() if len(v)}
    if not lateness:
        return None, "no step has its collectives matched on every rank"
    medians = {r: m for r, m in zip(lateness, (float(np.median(v.to_numpy())) for v in lateness.values()))}
    rank = max(medians, key=lambda r: (medians[r], -r))
    late, n = int((lateness[rank] > 0).sum()), len(lateness[rank])
    p_steps = float(binomial_sf(late - 1, n, 0.5))  # P(this many steps or more | late in half the steps by chance)
    mine = kept[kept["rank"] == rank]
    its = waited_for[waited_for["instance"].isin(mine["instance"])]  # instances of its groups that kept someone waiting
    last_at = its[its["rank"] == rank]
    size = float(np.median([len(groups.members[g]) if groups.members[g][0] != "legacy" else len(table)
                            for g in its["gid"]])) if len(its) else 2.0  # fmt: skip
    p_instances = float(binomial_sf(len(last_at) - 1, len(its), 1.0 / max(size, 2.0))) if len(its) else 1.0
    if n >= SIGN_TEST_STEPS:  # enough steps for the sign test: the instances do not add to it
        p_instances = 1.0
    step_us = _median([s for s in table["step_us_median"] if _number(s)]) or 0.0
    floor = max(STRAGGLER_MIN_WAIT_US, STRAGGLER_MIN_WAIT_SHARE * step_us)
    by_how_much = float(lateness[rank].median())
    if by_how_much < floor:
        return None, (f"no rank arrived measurably later than the others: the latest, rank {rank}, by "
                      f"{duration(max(by_how_much, 0.0))} a step (median), under {duration(floor)}")
    if (p_steps > STRAGGLER_P_VALUE and p_instances > STRAGGLER_INSTANCE_P_VALUE) or last_at.empty:
        return None, (f"rank {rank} arrived {duration(by_how_much)} a step later than the others (median), but only "
                      f"in {late} of {n} steps: not consistently")
    others = table[table["rank"] != rank]
    others_wait = _median([w for w in others["wait_us"] if _number(w)]) or 0.0
    names = Counter(last_at["name"])
    alike = waited_for[waited_for["name"].isin(names)]  # the instances of the collectives it was last at
    gid = int(Counter(last_at["gid"]).most_common(1)[0][0])
    members = groups.members[gid]
    world = members[0] == "legacy" or len(members) >= len(table)
    in_group = kept[(kept["gid"] == gid) & (kept["rank"] != rank)]
    peers_wait = _median(in_group.groupby(["cycle", "step"], dropna=False)["wait_us"].sum()
                         / max(in_group["rank"].nunique(), 1)) if len(in_group) else None  # fmt: skip
    return {"rank": int(rank), "host": table.loc[table["rank"] == rank, "host"].iloc[0],
            "arrived_last_pct": 100.0 * sum(names.values()) / len(alike) if len(alike) else None,
            "late_steps": late, "steps": n, "p_value": min(p_steps, p_instances), "late_by_us": by_how_much,
            "evidence": "steps" if p_steps <= STRAGGLER_P_VALUE else "instances",
            "last_instances": len(last_at), "group_instances": len(its),
            "others_wait_us": others_wait, "others_wait_pct_of_step": 100.0 * others_wait / step_us if step_us else None,
            "collective": names.most_common(1)[0][0] if len(names) == 1 else None,
            "group": None if world else groups.label(gid), "group_desc": groups.desc[gid],
            "group_ranks": None if world else list(members), "peers_wait_us": peers_wait,
            "downstream": None if world else _downstream(kept, steps, members, groups),
            "waited_instances": len(waited_for), "matched_instances": matched}, ""  # fmt: skip


def _lateness(steps: pd.DataFrame, kept: pd.DataFrame, roles: dict) -> dict:
    """rank -> its lateness in each step: how much longer the ranks doing the same work (its role's)
    waited, in collectives and receives, than it did (no clock needed)."""
    matched_steps = steps.dropna(subset=["wait_us"])
    total = matched_steps["wait_us"] + matched_steps["bubble_us"].fillna(0.0)
    waits = matched_steps.assign(total_us=total).pivot_table(index=["cycle", "step"], columns="rank", values="total_us",
                                                             aggfunc="first", dropna=False).dropna()  # fmt: skip
    # ranks that do the same work (one pipeline stage's) wait alike unless one of them is late by its own time
    # a rank with fewer matched collectives than ranks of its role (one its trace placed elsewhere)
    # would look as if it waited less: it is compared with nobody
    counts = kept.groupby("rank")["instance"].nunique().reindex(waits.columns).fillna(0)
    role = pd.Series([str(roles.get(r)) for r in waits.columns], index=waits.columns)
    role_count = counts.groupby(role).transform("median")
    alike = (counts == role_count).to_numpy()
    waits, role = waits.loc[:, alike], role[alike]
    if role.empty:
        return {}
    if role.value_counts().max() < 2:  # no two ranks do the same work: all the others
        role[:] = ""
    lateness = {}
    for _, members in role.groupby(role):
        if len(members) > 1:
            values = waits[list(members.index)].to_numpy(float)
            late = median_of_others(values) - values
            for i, r in enumerate(members.index):
                lateness[r] = pd.Series(late[:, i], index=waits.index)
    return lateness


def median_of_others(values: np.ndarray) -> np.ndarray:
    """For each cell of a (rows x n) array, the median of its row without it (n >= 2)."""
    n = values.shape[1]
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.arange(n)[None, :].repeat(len(values), 0), axis=1)

    def other(i):  # the i-th smallest of the others: skip the cell's own place
        index = np.where(i < position, i, i + 1)
        return np.take_along_axis(ordered, np.minimum(index, n - 1), axis=1)

    m = n - 1
    return other(m // 2) if m % 2 else (other(m // 2 - 1) + other(m // 2)) / 2


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X > k) for X ~ binomial(n, p), exactly (scipy's `binom.sf`; scipy.stats takes half a
    second to import, more than `ranks` takes to read 64 ranks)."""
    if k < 0:
        return 1.0
    if k >= n:
        return 0.0
    if p == 0.5:  # the sign test: exactly, in integers
        return float(Fraction(sum(math.comb(n, i) for i in range(k + 1, n + 1)), 2**n))
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k + 1, n + 1)]  # fmt: skip
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def _downstream(kept, steps, members, groups) -> dict | None:
    """The ranks outside the straggler's group: how long they waited a step (median over them of
    their median; collectives and receives), and in which group's collectives the most."""
    outside = steps[~steps["rank"].isin(members)]
    if outside.empty:
        return None
    total = (outside["wait_us"].astype(float).fillna(0.0) + outside["bubble_us"].astype(float).fillna(0.0)
             ).groupby(outside["rank"]).median()  # floats: a median per rank at once, not a group at a time
    theirs = kept[~kept["rank"].isin(members)]
    where = theirs.groupby("gid")["wait_us"].sum() if len(theirs) else pd.Series(dtype=float)
    bubble = outside["bubble_us"].fillna(0.0).sum()
    if len(where) and where.max() >= bubble:
        desc = groups.desc[int(where.idxmax())]
        name = Counter(theirs.loc[theirs["gid"] == where.idxmax(), "name"]).most_common(1)[0][0]
        what = f"{desc + ' ' if desc else ''}{name}"
    else:
        what = "the pipeline's receives"
    return {"ranks": int(len(total)), "wait_us": float(total.median()), "where": what}
