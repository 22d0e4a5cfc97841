"""Each member's wait at a matched instance, a receive's bubble, the waits a step, and each rank's
role (pure). Used by `analysis`, whose docstring says what the wait is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .clocks import Clock
from .matching import INSTANCE_COLUMNS, Groups

BUBBLE = "recv (pipeline bubble)"


def waits(kept: pd.DataFrame, clock: Clock) -> pd.DataFrame:
    """Each member's time in the instance (`spent_us`), its wait and whether it arrived last: on one
    clock the latest start minus its own (TraceLens's), else its time beyond the shortest member's."""
    kept = kept.copy()
    kept["spent_us"] = kept["end_us"] - kept["start_us"]
    if kept.empty:
        return kept.assign(wait_us=[], arrived_last=[], transfer_us=[])
    by = kept.groupby("instance")
    kept["transfer_us"] = by["spent_us"].transform("min")
    if clock.method == "clock-free":
        kept["wait_us"] = (kept["spent_us"] - kept["transfer_us"]).round(3)
        arrival = -kept["spent_us"]
    else:
        arrival = kept["start_us"] - clock.offsets.reindex(kept["rank"]).to_numpy()
        kept["wait_us"] = (arrival.groupby(kept["instance"]).transform("max") - arrival).round(3)
    latest = arrival.groupby(kept["instance"]).transform("max")
    alone = (arrival == latest).groupby(kept["instance"]).transform("sum") == 1
    kept["arrived_last"] = (arrival == latest) & alone
    return kept


def bubbles(transfers: pd.DataFrame, clock: Clock) -> pd.DataFrame:
    """A receive's wait for its send (the pipeline's bubble): on one clock the send's start minus
    the receive's (at least 0), else the receive's time beyond the pair's shortest receive."""
    if transfers.empty:
        return pd.DataFrame(columns=["rank", "step", "bubble_us"])
    if clock.method == "clock-free":
        spent = transfers["recv_end"] - transfers["recv_start"]
        bubble = spent - spent.groupby([transfers["src"], transfers["dst"]]).transform("min")
    else:
        o = clock.offsets
        send = transfers["send_start"] - o.reindex(transfers["src"]).fillna(0.0).to_numpy()
        recv = transfers["recv_start"] - o.reindex(transfers["dst"]).fillna(0.0).to_numpy()
        bubble = (send - recv).clip(lower=0.0)
    return pd.DataFrame({"rank": transfers["dst"].astype(int), "step": transfers["step"], "bubble_us": bubble.round(3)})


def per_step(kept: pd.DataFrame, bubbles: pd.DataFrame) -> pd.DataFrame:
    """The wait (µs) of each rank in each step in each collective's name (a receive's bubble
    under `BUBBLE`): columns rank, step (NaN: none), name, wait_us."""
    parts = []
    if len(kept):
        parts.append(kept.groupby(["rank", "step", "name"], dropna=False)["wait_us"].sum().reset_index())
    if len(bubbles):
        b = bubbles.groupby(["rank", "step"], dropna=False)["bubble_us"].sum().reset_index()
        parts.append(b.rename(columns={"bubble_us": "wait_us"}).assign(name=BUBBLE))
    if not parts:
        return pd.DataFrame(columns=["rank", "step", "name", "wait_us"])
    out = pd.concat(parts, ignore_index=True)
    out["step"] = pd.to_numeric(out["step"], errors="coerce")
    return out


def waited_for(kept: pd.DataFrame, min_wait_us: float, wait_to_transfer: float) -> pd.DataFrame:
    """The instances that kept ranks waiting: the rank that arrived last, the name, the others'
    median wait, the step and the group, where that wait reached `min_wait_us` and
    `wait_to_transfer` times the transfer."""
    if kept.empty:
        return pd.DataFrame(columns=["instance", "rank", "name", "others_wait_us", "step", "gid"])
    others = kept[~kept["arrived_last"]].groupby("instance")["wait_us"].median()
    last = kept[kept["arrived_last"]].set_index("instance")
    last = last.join(others.rename("others_wait_us"), how="inner")
    keep = last["others_wait_us"] >= np.maximum(min_wait_us, wait_to_transfer * last["transfer_us"])
    return last[keep].reset_index()[["instance", "rank", "name", "others_wait_us", "step", "gid"]]


def instance_rows(kept: pd.DataFrame, groups: Groups) -> pd.DataFrame:
    if kept.empty:
        return pd.DataFrame(columns=INSTANCE_COLUMNS)
    labels = {g: groups.label(g) for g in kept["gid"].unique()}
    out = kept.assign(group=kept["gid"].map(labels), desc=kept["gid"].map(lambda g: groups.desc[g]))
    return out[INSTANCE_COLUMNS].reset_index(drop=True)


def roles(frame: pd.DataFrame, groups: Groups, ranks: list[int]) -> dict[int, tuple]:
    """rank -> what it does in a step: its collectives' names, group descriptions (or sizes) and
    directions, with how many of each a step (the median over its steps). Ranks with the same role
    do the same work (a pipeline stage's ranks); a straggler is found among them."""
    if frame.empty:
        return {r: () for r in ranks}
    labels = np.array([f"{groups.desc[g] or len(groups.members[g])}" for g in range(len(groups.members))] + ["p2p"],
                      dtype=object)  # fmt: skip
    names, unique_names = pd.factorize(frame["name"])
    label_codes, unique_labels = pd.factorize(labels)
    # what a record is, as one integer: its name, direction and group kind (gid -1, a transfer: the last label)
    what = (names.astype(np.int64) * 3 + frame["kind"].to_numpy(np.int64)) * (len(unique_labels) + 1) \
        + label_codes[frame["gid"].to_numpy()]
    counts = frame.assign(what=what).groupby(["rank", "cycle", "step", "what"], dropna=False).size()
    per_rank = counts.groupby(["rank", "what"]).median()
    roles = {r: () for r in ranks}
    for (rank, item), n in per_rank.items():
        roles[int(rank)] += ((int(item), float(n)),)
    return {r: tuple(sorted(v, key=str)) for r, v in roles.items()}
