"""Each collective instance matched within its process group, and every member's wait at it (pure).

A rank summary's collective carries its group as the global ranks in it (`members`). An instance
is keyed within its group by `Seq` where the trace has one, else by its place among the group's
collectives in the step (every rank numbers its `ProfilerStep`s alike), else in the cycle. It is
matched when every member of the group that took part in the group in that cycle has it under
one name; a member that reported the cycle but ran none of the group's collectives is absent from
the group, and said so. Point-to-point transfers are matched as pairs (the sender's send and the
receiver's receive, in order, per direction), where the trace names the peer.

A summary of format version 1 (no members) or a collective whose group the trace does not give on
a rank with one group: its group is the rank's only one, every rank that reported. A collective
whose group cannot be told on a rank with several groups (gloo writes none) is left unmatched,
with the reason; it is never paired by guesswork. So is one whose summary says why it has no group
(`unplaced`: a `replica_group` that does not fit), with the summary's reason.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

POINT_TO_POINT = re.compile(r"send|recv", re.IGNORECASE)
COLLECTIVE, SEND, RECV = 0, 1, 2
RECORD_COLUMNS = ["rank", "host", "cycle", "name", "gid", "seq", "step", "start_us", "end_us", "kind", "peer"]
INSTANCE_COLUMNS = ["instance", "name", "group", "desc", "step", "rank", "start_us", "end_us", "spent_us", "wait_us",
                    "arrived_last"]  # fmt: skip


class Groups:
    """Process groups by their members: an id for each, its members and description."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.members: list[tuple] = []
        self.desc: list[str | None] = []

    def id(self, members: tuple, desc: str | None) -> int:
        gid = self.ids.get(members)
        if gid is None:
            gid = self.ids[members] = len(self.members)
            self.members.append(members)
            self.desc.append(desc)
        elif desc and not self.desc[gid]:
            self.desc[gid] = desc
        return gid

    def label(self, gid: int) -> str:
        """`tp group 8-15`, `dp group 0,32,64`, `group 0-3`."""
        members, desc = self.members[gid], self.desc[gid]
        if members and members[0] == "legacy":
            return f"group {members[1]}" if members[1] is not None else "the default group"
        return f"{desc + ' ' if desc else ''}group {ranks_text(list(members))}"


def ranks_text(ranks: list[int]) -> str:
    """0-7, or 0,32,64 (a stride), or 0,1,5."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    if len(ranks) > 3:
        stride = ranks[1] - ranks[0]
        if all(b - a == stride for a, b in zip(ranks, ranks[1:])):
            return f"{ranks[0]},{ranks[1]},...,{ranks[-1]} (every {stride})"
    return ",".join(str(r) for r in ranks)


def records(table: pd.DataFrame, group_counts: dict[int, int | None], hosts: dict[int, str | None]
            ) -> tuple[pd.DataFrame, Groups, list[dict], list[str]]:
    """Every rank's collectives (`frames.collectives_frame`'s table) as the frame matching reads
    (RECORD_COLUMNS), their groups, the collectives that could not be placed in a group (as
    unmatched entries), and notes. `group_counts`: rank -> how many process groups its trace lists
    (None for a format 1 summary)."""
    groups = Groups()
    t = table.copy()
    t["start_us"] = pd.to_numeric(t["start_us"], errors="coerce")
    t["end_us"] = pd.to_numeric(t["end_us"], errors="coerce")
    names, unique_names = pd.factorize(t["name"])
    is_text = np.append(np.array([isinstance(u, str) for u in unique_names], bool), False)  # code -1: no name
    timed = np.isfinite(t["start_us"]) & np.isfinite(t["end_us"]) & (t["end_us"] >= t["start_us"])
    ok = (is_text[names] & timed).to_numpy()
    t, names = t[ok], names[ok]
    if t.empty:
        return pd.DataFrame(columns=RECORD_COLUMNS), groups, [], []
    kind = np.array([_kind(str(u)) for u in unique_names] + [COLLECTIVE], np.int64)[names]
    p2p = kind != COLLECTIVE
    peer = pd.to_numeric(t["peer"], errors="coerce").to_numpy(float)
    unnamed = int((p2p & np.isnan(peer)).sum())
    codes, sets = intern_members(t["members"].to_numpy(object))
    has_members = codes >= 0
    gid = np.full(len(t), -2, dtype=np.int64)  # -2: not placed; -1: point to point
    gid[p2p & ~np.isnan(peer)] = -1
    coll = ~p2p & has_members
    if coll.any():
        first_desc = pd.Series(t["desc"].to_numpy(object)[coll]).groupby(codes[coll]).first()
        ids = np.full(len(sets), -2, np.int64)
        for code in np.unique(codes[coll]):
            ids[code] = groups.id(sets[code], first_desc.get(code))
        gid[coll] = ids[codes[coll]]
    ranks = t["rank"].to_numpy(np.int64)
    few_groups = {r for r in np.unique(ranks).tolist() if group_counts.get(r) is None or group_counts.get(r) <= 1}
    legacy_rank = np.isin(ranks, list(few_groups))
    loose = ~p2p & ~has_members
    said = loose & _says_why(t)  # never given a group by the rules below
    loose &= ~said
    legacy = loose & legacy_rank
    if legacy.any():
        group_names = t["group"].to_numpy(object)[legacy]
        legacy_codes, legacy_names = pd.factorize(pd.Series(group_names, dtype=object), use_na_sentinel=False)
        legacy_ids = np.array([groups.id(("legacy", None if pd.isna(n) else n), None) for n in legacy_names], np.int64)
        gid[legacy] = legacy_ids[legacy_codes]
    bad = _outside(gid, ranks, coll, groups)
    unplaced = _unplaced(t, bad, loose & ~legacy_rank, group_counts, said)
    keep = (gid != -2) & ~bad
    kept_ranks = ranks[keep]
    frame = pd.DataFrame({"rank": kept_ranks, "host": pd.Series(kept_ranks).map(hosts).to_numpy(object),
                          "cycle": t["cycle"].to_numpy()[keep], "name": t["name"].to_numpy()[keep], "gid": gid[keep],
                          "seq": pd.to_numeric(t["seq"], errors="coerce").to_numpy()[keep],
                          "step": pd.to_numeric(t["step"], errors="coerce").to_numpy()[keep],
                          "start_us": t["start_us"].to_numpy(float)[keep], "end_us": t["end_us"].to_numpy(float)[keep],
                          "kind": kind[keep], "peer": np.nan_to_num(peer[keep], nan=-1).astype(np.int64)},
                         columns=RECORD_COLUMNS)  # fmt: skip
    return frame, groups, unplaced, [f"{unnamed} point-to-point transfers (send/recv) left out of the wait: the "
                                     "trace does not name their peer"] if unnamed else []  # fmt: skip


def _kind(name: str) -> int:
    """COLLECTIVE, or SEND / RECV for a point-to-point transfer, by the collective's name."""
    lowered = name.lower()
    return SEND if "send" in lowered else RECV if "recv" in lowered else COLLECTIVE


def _outside(gid: np.ndarray, ranks: np.ndarray, coll: np.ndarray, groups: Groups) -> np.ndarray:
    """Which records name a group (by members) that does not hold their rank."""
    pairs_ = pd.DataFrame({"gid": gid[coll], "rank": ranks[coll]}).drop_duplicates()
    holds = {g: set(groups.members[g]) for g in pd.unique(pairs_["gid"])}  # each group's members once
    bad = np.zeros(len(gid), bool)
    for g, r in zip(pairs_["gid"], pairs_["rank"]):
        if r not in holds[g]:
            bad |= (gid == g) & (ranks == r)
    return bad


def _says_why(t: pd.DataFrame) -> np.ndarray:
    """Which records' summaries say why they have no group (`unplaced`; a table may lack the column)."""
    if "unplaced" not in t.columns:
        return np.zeros(len(t), bool)
    return np.array([isinstance(why, str) and bool(why) for why in t["unplaced"].to_numpy(object)], bool)


def _unplaced(t: pd.DataFrame, outside: np.ndarray, ungrouped: np.ndarray, group_counts: dict,
              said: np.ndarray) -> list[dict]:
    """Unmatched entries for records whose group does not hold their rank, for records without
    a group on a rank with several, and for records whose summary says why they have none."""
    entries = [_entry(row.rank, row._asdict(), f"its group {ranks_text(list(row.members))} does not hold this rank")
               for row in t[outside].itertuples(index=False)]  # fmt: skip
    entries += [_entry(row.rank, row._asdict(), "its process group is not in the trace (the backend writes none) "
                       f"and the rank has {group_counts.get(row.rank)} groups")
                for row in t[ungrouped].itertuples(index=False)]  # fmt: skip
    entries += [_entry(row.rank, row._asdict(), row.unplaced) for row in t[said].itertuples(index=False)]
    return entries


def intern_members(values: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """Each row's group as a code into a list of distinct member tuples (-1: none). A table holds
    a few groups thousands of times, mostly as one object each: a group is hashed once an object,
    and the rows are told apart by their objects' ids, at once."""
    codes = np.full(len(values), -1, np.int64)
    if not len(values):
        return codes, []
    objects, first, inverse = np.unique(np.fromiter(map(id, values), np.int64, len(values)), return_index=True,
                                        return_inverse=True)  # fmt: skip
    by_value: dict[tuple, int] = {}
    sets: list[tuple] = []
    object_codes = np.full(len(objects), -1, np.int64)
    for k in np.argsort(first, kind="stable"):  # codes in the order the groups first appear, as rows go
        members = values[first[k]]
        if not isinstance(members, (tuple, list, np.ndarray)) or len(members) == 0:
            continue
        key = tuple(int(m) for m in members)
        code = by_value.get(key)
        if code is None:
            code = by_value[key] = len(sets)
            sets.append(key)
        object_codes[k] = code
    codes[:] = object_codes[inverse.reshape(-1)]
    return codes, sets


def match(frame: pd.DataFrame, groups: Groups, reported: list[int]) -> tuple[pd.DataFrame, list[dict], list[str]]:
    """The matched collectives, one row per instance and member (`instance` numbers them), and the
    unmatched ones (entries), and notes (members absent from their group)."""
    coll = frame[frame["kind"] == COLLECTIVE].copy()
    if coll.empty:
        return coll.assign(instance=[]), [], []
    coll = coll.sort_values(["rank", "start_us"], kind="stable")
    is_legacy = np.array([m[0] == "legacy" for m in groups.members], bool)
    legacy = is_legacy[coll["gid"].to_numpy()]
    scope_cycle = coll["cycle"].fillna(-1).astype(np.int64)
    has_step = coll["step"].notna()
    coll["scope"] = np.where(has_step, coll["step"].fillna(-1).astype(np.int64), scope_cycle)
    coll["scope_kind"] = np.where(coll["seq"].notna(), 2, np.where(has_step, 1, 0))
    coll["place"] = coll.groupby(["rank", "gid", "scope_kind", "scope"]).cumcount()
    coll["key"] = np.where(coll["seq"].notna(), coll["seq"].fillna(-1).astype(np.int64), coll["place"])
    coll = coll.drop_duplicates(["rank", "gid", "scope_kind", "scope", "key"])
    # who took part in each group in each cycle: a legacy group is every rank that reported the cycle
    takers = coll.groupby(["gid", "cycle"], dropna=False)["rank"].nunique().rename("takers")
    coll = coll.join(takers, on=["gid", "cycle"])
    in_cycle = frame.groupby("cycle", dropna=False)["rank"].nunique()
    coll.loc[legacy, "takers"] = coll.loc[legacy, "cycle"].map(in_cycle).fillna(len(reported)).to_numpy()
    keys = ["gid", "scope_kind", "scope", "key"]
    coll["instance"] = coll.groupby(keys, sort=True).ngroup()
    sizes = coll.groupby("instance")["rank"].transform("size")
    names = coll.groupby("instance")["name"].transform("nunique")
    matched = (sizes == coll["takers"]) & (names == 1) & (sizes > 1)
    unmatched, lone_notes = _unmatched(coll[~matched], groups, set(reported))
    kept = coll[matched].copy()
    kept["instance"] = kept.groupby(keys, sort=True).ngroup()
    notes = lone_notes + _absent_members(kept, groups, reported)
    return kept.drop(columns=["scope", "scope_kind", "place", "key", "takers"]), unmatched, notes


def _unmatched(bad: pd.DataFrame, groups: Groups, reported: set[int]) -> tuple[list[dict], list[str]]:
    """An entry for each record of an instance not matched, with why; a group whose other members
    all sent nothing is a note instead (its collectives had nobody to match with)."""
    entries, notes = [], []
    if bad.empty:
        return entries, notes
    on = bad.groupby("instance")["rank"].agg(lambda r: sorted(int(x) for x in r))
    lone: dict[int, int] = {}
    for row in bad.itertuples(index=False):
        members = groups.members[row.gid]
        legacy = members[0] == "legacy"
        ranks = on[row.instance]
        if not legacy and row.takers < 2 and not (set(members) - set(ranks)) & reported:
            lone[row.gid] = lone.get(row.gid, 0) + 1
            continue
        if legacy:
            why = "names differ across ranks" if len(ranks) == row.takers else "not on every rank"
        elif len(ranks) < row.takers:
            why = f"not on every member of its {groups.label(row.gid)}"
        elif row.takers < 2:
            why = (f"its trace says its group is {groups.label(row.gid)}; no other member's trace does "
                   "(they ran none of its collectives)")  # fmt: skip
        else:
            why = "names differ across the members of its group"
        entries.append({"rank": int(row.rank), "name": row.name, "group": members[1] if legacy else groups.label(row.gid),
                        "step": None if pd.isna(row.step) else int(row.step),
                        "seq": None if pd.isna(row.seq) else int(row.seq), "on_ranks": ranks, "why": why})  # fmt: skip
    for gid, count in lone.items():
        silent = sorted(set(groups.members[gid]) - reported)
        notes.append(f"{groups.label(gid)}: {count} collectives with nobody to match ({ranks_text(silent)} sent no "
                     "summary)")  # fmt: skip
    return entries, notes


def pairs(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Point-to-point transfers matched as pairs: one row per pair (`src`, `dst`, the send's and the
    receive's start and end); and how many transfers found no partner."""
    p2p = frame[frame["kind"] != COLLECTIVE].copy()
    if p2p.empty:
        return pd.DataFrame(columns=["src", "dst", "step", "send_start", "send_end", "recv_start", "recv_end",
                                     "recv_rank_host", "send_rank_host", "cycle"]), 0  # fmt: skip
    p2p["src"] = np.where(p2p["kind"] == SEND, p2p["rank"], p2p["peer"])
    p2p["dst"] = np.where(p2p["kind"] == SEND, p2p["peer"], p2p["rank"])
    p2p = p2p.sort_values(["rank", "start_us"], kind="stable")
    p2p["scope"] = p2p["step"].fillna(-1).astype(np.int64)
    p2p["order"] = p2p.groupby(["src", "dst", "kind", "cycle", "scope"], dropna=False).cumcount()
    on = ["src", "dst", "cycle", "scope", "order"]
    sends = p2p[p2p["kind"] == SEND].set_index(on)[["start_us", "end_us", "host", "step"]]
    recvs = p2p[p2p["kind"] == RECV].set_index(on)[["start_us", "end_us", "host"]]
    both = sends.join(recvs, how="inner", lsuffix="_send", rsuffix="_recv").reset_index()
    unpaired = len(sends) + len(recvs) - 2 * len(both)
    both = both.rename(columns={"start_us_send": "send_start", "end_us_send": "send_end", "start_us_recv": "recv_start",
                                "end_us_recv": "recv_end", "host_send": "send_rank_host", "host_recv": "recv_rank_host"})  # fmt: skip
    return both, unpaired


def _absent_members(kept: pd.DataFrame, groups: Groups, reported: list[int]) -> list[str]:
    """A note for each group matched among fewer than its members: who is absent."""
    notes, here = [], set(reported)
    present = kept.groupby("gid")["rank"].unique()
    for gid, ranks in present.items():
        members = groups.members[gid]
        if members and members[0] == "legacy":
            continue
        absent = sorted(set(members) - set(int(r) for r in ranks))
        if absent:
            silent = [r for r in absent if r not in here]
            other = [r for r in absent if r in here]
            why = []
            if silent:
                why.append(f"{ranks_text(silent)} sent no summary")
            if other:
                why.append(f"{ranks_text(other)} ran none of its collectives or the trace placed them elsewhere")
            notes.append(f"{groups.label(gid)} matched among {len(ranks)} of its {len(members)} members "
                         f"({'; '.join(why)})")  # fmt: skip
    return notes


def _entry(rank: int, c: dict, why: str) -> dict:
    step, seq = c.get("step"), c.get("seq")
    return {"rank": int(rank), "name": c.get("name"), "group": c.get("group"),
            "step": None if step is None or pd.isna(step) else int(step),
            "seq": None if seq is None or pd.isna(seq) else int(seq), "on_ranks": [int(rank)], "why": why}  # fmt: skip


def _seq(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def median_of(values) -> float | None:
    """The median of the finite numbers among `values`, or None without any."""
    values = [v for v in values if is_number(v)]
    return float(np.median(values)) if values else None


def is_number(value) -> bool:
    """A finite int or float (not a bool): what a time in a summary must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
