"""Every rank's collectives as one table (pure): what `analyze` matches, from summaries or columns.

Example::

    table = collectives_frame(summaries)     # one row per collective record, FRAME_COLUMNS
    analyze(summaries_without_collectives, collectives=table)   # the same report

A per-node columnar file (Parquet) holds this table for its ranks; reading it needs no pass over
records in Python. `members` is a tuple of global ranks or None; `cycle` is -1 where unknown;
`unplaced`: why a record has no group, where its summary says (a table without the column is read).
"""

from __future__ import annotations

import pandas as pd

from ..._record.model import FRAME_COLUMNS  # a node file's columns: this table, as it is logged
_FIELDS = FRAME_COLUMNS[2:]


def collectives_frame(summaries: list[dict]) -> pd.DataFrame:
    """The collectives of rank summaries (those with an int rank) as one table."""
    columns: dict[str, list] = {name: [] for name in FRAME_COLUMNS}
    interned: dict[tuple, tuple] = {}  # one object a group, across summaries
    for summary in summaries:
        rank = summary.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            continue
        cycle = summary.get("cycle_step") if isinstance(summary.get("cycle_step"), int) else -1
        records = [c for c in summary.get("collectives") or [] if isinstance(c, dict)]
        columns["rank"] += [rank] * len(records)
        columns["cycle"] += [cycle] * len(records)
        sets = [interned.setdefault(tuple(m), tuple(m)) for m in summary.get("member_sets") or [] if isinstance(m, list)]
        for name in _FIELDS:
            if name == "members":
                columns[name] += [members_of(c, sets) for c in records]
            else:
                columns[name] += [c.get(name) for c in records]
    return pd.DataFrame(columns, columns=FRAME_COLUMNS)


def members_of(record: dict, sets: list[tuple]) -> tuple | None:
    """A record's group as a tuple of ranks: its `members`, an index into the summary's
    `member_sets` (as written) or a list (as placed or made by hand)."""
    members = record.get("members")
    if isinstance(members, int) and not isinstance(members, bool):
        return sets[members] if 0 <= members < len(sets) else None
    return tuple(members) if isinstance(members, list) and members else None


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def needs_placing(table: pd.DataFrame) -> bool:
    """Whether some collective has no group but a worker thread or a peer index (gloo's), which
    `lanes.place` may place."""
    loose = table["members"].isna()
    return bool((loose & (table["lane"].notna() | table["peer_index"].notna())).any())


def with_collectives(by_rank: dict[int, list[dict]], table: pd.DataFrame) -> dict[int, list[dict]]:
    """The summaries with their `collectives` lists made from the table's rows (by rank and cycle)."""
    columns = {name: [None if _missing(v) else v for v in table[name].tolist()] for name in table.columns}
    for name, values in columns.items():  # ints with gaps (or beside an all-null column) come as floats: ints again
        floats = [v for v in values if isinstance(v, float)]
        if floats and all(v.is_integer() for v in floats):
            columns[name] = [int(v) if isinstance(v, float) else v for v in values]
    lists: dict[tuple, list[dict]] = {}
    for values in zip(*columns.values()):
        record = dict(zip(columns, values))
        members = record["members"]
        record["members"] = list(members) if isinstance(members, tuple) else members
        lists.setdefault((record.pop("rank"), record.pop("cycle")), []).append(record)
    out = {}
    for rank, summaries in by_rank.items():
        out[rank] = [{**s, "collectives": lists.get((rank, s.get("cycle_step") if isinstance(s.get("cycle_step"), int)
                                                     else -1), [])} for s in summaries]  # fmt: skip
    return out
