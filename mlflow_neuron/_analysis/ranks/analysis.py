"""Every rank's step side by side, the wait in collectives, and the straggler: from rank summaries.

Example::

    report = analyze([summary_rank0, summary_rank1, summary_rank2, summary_rank3])
    report.table        # one row per rank: step time (median, 95% interval), collective, wait, bubble, ...
    report.straggler    # {"rank": 2, "group": "tp group 2,3", "late_by_us": 30120.0, ...} or None
    report.sentence     # "rank 2 (tp group 2,3) was late by its own time in 6 of 6 steps: ..."

A summary is `_trace.collectives`' rank summary (one per rank per cycle; a rank's cycles are read
together).

**Matching** (`matching`): a collective instance is matched within its process group, known by
its members (gloo's placed by `lanes`); point-to-point transfers as send/receive pairs.

**The wait** (`clocks`, `waits`): on one clock, TraceLens's: the latest start among the members
minus the rank's own. The ranks' clocks are used as they are where no synchronizing collective ends
on one member before another started; else aligned from the collectives' ends; else none, and the
wait is the rank's time in the collective beyond the shortest member's. A receive's wait for its
send is the pipeline's bubble, kept apart (`bubble_us`).

**The straggler** is the rank whose own time made others wait, not one that arrived late because
it waited earlier. Ranks with the same role (the same collectives a step, in groups of the same
kind: one pipeline stage's ranks) do the same work, so they wait alike unless one of them is late
by its own time. In each step a rank's lateness is its role's median wait (collectives and
receives) minus its own. The candidate is the rank with the largest median lateness; it is named
when
- it is measurably late: its median lateness is at least `STRAGGLER_MIN_WAIT_SHARE` of the median
  step and at least `STRAGGLER_MIN_WAIT_US`, and
- consistently: late in so many of the n steps that chance would give as many at most
  `STRAGGLER_P_VALUE` of the time (a one-sided sign test: 6 of 6 pass, 5 of 6 do not); or, where
  there are fewer than `SIGN_TEST_STEPS` steps, it arrived last at so many of its groups'
  collectives that kept others waiting that chance (1 in the group's size) would give as many at
  most `STRAGGLER_INSTANCE_P_VALUE` of the time (a one-step trace of 8 collectives can name one).
Its group is the one whose collectives it arrived last at most; the sentence says how long that
group's other members waited, and the ranks outside it in turn. An instance kept ranks waiting
when the others' median wait reached `STRAGGLER_MIN_WAIT_US` and `INSTANCE_WAIT_TO_TRANSFER` times
its transfer. The constants are in `straggler`; `benchmarks/rank_calibration.py` measures how often
the rule names the right rank, and a rank when none was slowed.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..._trace.collectives import FORMAT
from .clocks import TOLERANCE_US, Clock, align
from .frames import collectives_frame, needs_placing, with_collectives
from . import straggler as rule
from .lanes import place
from .table import rank_table
from .matching import INSTANCE_COLUMNS, match, pairs, records
from .waits import BUBBLE, instance_rows as instance_rows_of, per_step as per_step_of, roles as roles_of
from .waits import bubbles as bubbles_of, waited_for as waited_for_of, waits
from .matching import is_number as _number
from .matching import median_of as _median
from .words import duration, ranks_phrase as _ranks_phrase

STEP_COLUMNS = ["rank", "host", "cycle", "step", "step_us", "window_us", "compute_us", "collective_us", "wait_us",
                "exposed_comm_us", "idle_us", "memcpy_us", "memcpy_bytes", "peak_memory_bytes", "bubble_us"]  # fmt: skip


@dataclass
class RankReport:
    """What `analyze` found: see the module docstring."""

    world_size: int
    table: pd.DataFrame
    straggler: dict | None
    missing: list[int]
    unmatched: list[dict]
    matched: int
    sentence: str
    notes: list[str] = field(default_factory=list)
    waits_by_name: dict = field(default_factory=dict)  # rank -> name -> median wait a step (µs)
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))  # one row per rank and step
    instances: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=INSTANCE_COLUMNS))  # per instance and rank
    clock: str = "one clock"  # how the wait was measured: "one clock", "aligned" or "clock-free" (`clocks`)

    def to_json(self) -> dict:
        ranks = []
        for row in self.table.to_dict("records"):
            ranks.append({"rank": int(row["rank"]), "host": row["host"], "steps": int(row["steps"]),
                          "step_time_us": {"median": row["step_us_median"], "low": row["step_us_low"],
                                           "high": row["step_us_high"]},
                          **{k: row[k] for k in ("collective_us", "wait_us", "bubble_us", "exposed_comm_pct", "idle_pct",
                                                 "compute_us", "arrived_last_pct", "device_cc_op_time", "compute_pct",
                                                 "non_compute_pct", "overlap_pct")}})  # fmt: skip
        return _clean({"world_size": self.world_size, "ranks": ranks, "straggler": self.straggler,
                       "missing": self.missing, "unmatched": self.unmatched, "matched_collectives": self.matched,
                       "sentence": self.sentence, "notes": self.notes, "clock": self.clock})  # fmt: skip


def analyze(summaries: list[dict], *, expected_world_size: int | None = None,
            collectives: pd.DataFrame | None = None) -> RankReport:
    """The report over rank summaries (any number of cycles per rank). Never raises for a bad or
    partial set: a summary it cannot read is left out and said in `notes`. `collectives`: the
    summaries' collectives as one table (`frames.FRAME_COLUMNS`, as a per-node columnar file holds
    them), in place of each summary's `collectives` list."""
    by_rank, notes = _by_rank(summaries)
    sizes = [s.get("world_size") for group in by_rank.values() for s in group if isinstance(s.get("world_size"), int)]
    world_size = expected_world_size or max(sizes + [max(by_rank, default=-1) + 1, 0])
    ranks = sorted(by_rank)
    missing = [r for r in range(world_size) if r not in by_rank]
    outside = [r for r in ranks if r >= world_size]
    if outside:
        notes.append(f"rank{'s' if len(outside) > 1 else ''} {_ranks_phrase(outside).removeprefix('ranks ').removeprefix('rank ')} "
                     f"outside the world of {world_size} ranks: read as they are")  # fmt: skip
    hosts = {r: _host(by_rank[r]) for r in ranks}
    table = collectives
    if table is None or needs_placing(table):
        if table is not None:  # a gloo job's columns: placed as records, then a table again
            by_rank = with_collectives(by_rank, table)
        by_rank = place(by_rank)  # gloo's collectives into their groups, where the ranks' summaries agree
        table = collectives_frame([s for group in by_rank.values() for s in group])
    group_counts = {r: _group_count(by_rank[r]) for r in ranks}
    frame, groups, unmatched, more_notes = records(table, group_counts, hosts)
    notes += more_notes
    kept, more_unmatched, group_notes = match(frame, groups, ranks) if len(ranks) > 1 else (frame.iloc[:0].assign(instance=[]), [], [])
    unmatched += more_unmatched
    notes += group_notes
    too_large = sorted({len(m) for m in groups.members if m and m[0] != "legacy" and len(m) > world_size})
    if too_large:
        notes.append(f"a group of {too_large[-1]} ranks in a world of {world_size}: its collectives matched among "
                     "the ranks that reported")  # fmt: skip
    clock = align(kept) if len(ranks) > 1 else Clock("one clock")
    kept = waits(kept, clock)
    transfers, unpaired = pairs(frame) if len(ranks) > 1 else (pd.DataFrame(), 0)
    bubbles = bubbles_of(transfers, clock)
    if unpaired:
        notes.append(f"{unpaired} point-to-point transfers (send/recv) without their partner: left out")
    per_step = per_step_of(kept, bubbles)
    waited_for = waited_for_of(kept, rule.STRAGGLER_MIN_WAIT_US, rule.INSTANCE_WAIT_TO_TRANSFER)
    last_counts = Counter(waited_for["rank"].tolist()) if len(waited_for) else Counter()
    step_rows = []
    matched = int(kept["instance"].nunique()) if len(kept) else 0
    for r in ranks:
        step_rows += _step_rows(r, by_rank[r])
    step_frame = _with_waits(pd.DataFrame(step_rows, columns=STEP_COLUMNS), per_step, bool(matched or len(bubbles)))
    waits_by_name = _median_wait_by_name(per_step, ranks)
    device = {r: _median(_device(s, "cc_op_time") for s in by_rank[r]) for r in ranks}
    table = rank_table(step_frame, ranks, last_counts, len(waited_for), device)
    roles = roles_of(frame, groups, ranks)
    straggler, why = rule.find(table, step_frame, kept, waited_for, matched, roles, groups)
    instance_rows = instance_rows_of(kept, groups)
    if clock.method == "clock-free" or (clock.method == "aligned" and clock.offsets.abs().max() > TOLERANCE_US):
        notes.append(f"clock: {clock.words}")
    report = RankReport(world_size, table, straggler, missing, unmatched, matched, "", notes, waits_by_name,
                        step_frame, instance_rows, clock.method)
    report.sentence = _sentence(report, why)
    return report


def _by_rank(summaries: list[dict]) -> tuple[dict[int, list[dict]], list[str]]:
    usable, notes = [], []
    for i, summary in enumerate(summaries):
        if not isinstance(summary, dict) or summary.get("format") != FORMAT or not isinstance(summary.get("steps"), list):
            notes.append(f"summary {i} is not a rank summary: left out")
        else:
            usable.append(summary)
    ranked = [s for s in usable if isinstance(s.get("rank"), int)]
    if not ranked and usable:  # a single process: no distributedInfo, no rank
        return {0: usable}, notes
    if len(ranked) < len(usable):
        notes.append(f"{len(usable) - len(ranked)} summaries without a rank: left out")
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for s in ranked:
        by_rank[s["rank"]].append(s)
    return dict(by_rank), notes


def _step_rows(rank: int, summaries: list[dict]) -> list[dict]:
    """The rank's steps over all its cycles (a step read twice counts once)."""
    rows, host = {}, _host(summaries)
    for summary in sorted(summaries, key=lambda s: (s.get("cycle_step") is None, s.get("cycle_step") or 0)):
        for step in summary["steps"]:
            number = step.get("step") if isinstance(step, dict) else None
            key = number if number is not None else (summary.get("cycle_step"), id(step))
            if isinstance(step, dict) and _number(step.get("step_us")) and key not in rows:
                row = {k: step.get(k) for k in STEP_COLUMNS if k in step}
                rows[key] = {**row, "rank": rank, "host": host, "cycle": summary.get("cycle_step")}
    return list(rows.values())


def _with_waits(steps: pd.DataFrame, per_step: pd.DataFrame, any_matched: bool) -> pd.DataFrame:
    """Each step with its wait in collectives (0 where it had none; None where nothing matched across
    ranks at all) and its receives' bubble (None without receives)."""
    if steps.empty:
        return steps
    steps = steps.drop(columns=["wait_us", "bubble_us"])
    key = pd.to_numeric(steps["step"], errors="coerce")
    bubble = per_step["name"] == BUBBLE
    wait = per_step[~bubble].groupby(["rank", "step"], dropna=False)["wait_us"].sum().rename("wait_us")
    bubbles = per_step[bubble].groupby(["rank", "step"], dropna=False)["wait_us"].sum().rename("bubble_us")
    joined = steps.assign(_step=key).join(wait, on=["rank", "_step"]).join(bubbles, on=["rank", "_step"])
    joined["wait_us"] = joined["wait_us"].fillna(0.0) if any_matched else None
    joined["bubble_us"] = joined["bubble_us"].astype(object).where(joined["bubble_us"].notna(), None)
    return joined.drop(columns=["_step"])[STEP_COLUMNS]


def _group_count(summaries: list[dict]) -> int | None:
    """How many process groups the rank's trace lists (None: a format 1 summary, which does not say)."""
    counts = [len(s["groups"]) for s in summaries if isinstance(s.get("groups"), list)]
    return max(counts) if counts else None


def _host(summaries: list[dict]) -> str | None:
    hosts = [s.get("host") for s in summaries if s.get("host")]
    return Counter(hosts).most_common(1)[0][0] if hosts else None


def _device(summary: dict, field: str):
    """A field of the rank's Neuron Explorer summary (`device`), as Explorer gives it, or None."""
    device = summary.get("device")
    return device.get(field) if isinstance(device, dict) else None


def _median_wait_by_name(per_step: pd.DataFrame, ranks: list[int]) -> dict[int, dict[str, float]]:
    """rank -> name -> its median wait a step in that name's collectives (0 in a step without it),
    over the steps in which it waited anywhere."""
    if per_step.empty:
        return {r: {} for r in ranks}
    table = per_step.pivot_table(index=["rank", "step"], columns="name", values="wait_us", aggfunc="sum",
                                 fill_value=0.0, dropna=False)  # fmt: skip
    medians = table.groupby(level="rank").median().to_dict("index")
    present: dict[int, list[str]] = {}  # each rank's names, in the order they appear
    pairs = per_step[["rank", "name"]].drop_duplicates()
    for rank, name in zip(pairs["rank"].tolist(), pairs["name"].tolist()):
        present.setdefault(rank, []).append(name)
    return {r: {n: float(medians[r][n]) for n in present.get(r, [])} if r in medians else {} for r in ranks}


def _sentence(report: RankReport, why: str) -> str:
    n = len(report.table)
    tail = f"; {_ranks_phrase(report.missing)} sent no summary" if report.missing else ""
    if n == 0:
        return "no rank summary to read" + tail
    if n == 1:
        return f"one rank (rank {int(report.table['rank'].iloc[0])}): nothing to compare across ranks" + tail
    if report.straggler:
        s = report.straggler
        host = f" ({s['host']})" if s.get("host") else ""
        what = f"{s['collective']}s" if s.get("collective") else "collectives"
        share = f" ({s['others_wait_pct_of_step']:.0f}% of it)" if s.get("others_wait_pct_of_step") is not None else ""
        others = "other rank" if n == 2 else f"other {n - 1} ranks"
        at = f"at {s['arrived_last_pct']:.0f}% of the {what} that kept others waiting, " if s["arrived_last_pct"] else ""
        if s.get("group"):
            peers = f"its {s['group_desc']} peers" if s.get("group_desc") else "its group's other members"
            then = ""
            if s.get("downstream") and s["downstream"]["wait_us"] >= rule.STRAGGLER_MIN_WAIT_US:
                d = s["downstream"]
                then = (f", and in turn the {d['ranks']} ranks outside its group waited {duration(d['wait_us'])} a step "
                        f"(most in {d['where']})")  # fmt: skip
            when = (f"in {s['late_steps']} of {s['steps']} steps" if s.get("evidence") == "steps"
                    else f"at {s['last_instances']} of the {s['group_instances']} collectives that kept others waiting")
            where = f" on {s['host']}" if s.get("host") else ""
            return (f"rank {s['rank']}{where} ({s['group']}) was late by its own time {when}: it arrived last, "
                    f"{duration(s['late_by_us'])} a step later than ranks doing the same work (median); "
                    f"{peers} waited {duration(s['peers_wait_us'] or 0.0)} a step{then}" + tail)
        when = (f"in {s['late_steps']} of {s['steps']} steps" if s.get("evidence") == "steps"
                else f"at {s['last_instances']} of the {s['group_instances']} collectives that kept others waiting")
        if s.get("evidence") != "steps":
            at = ""
        return (f"rank {s['rank']}{host} arrived last {at}later than the others {when}; the {others} waited {duration(s['others_wait_us'])} a step{share}, "
                f"{duration(s['late_by_us'])} longer than it did" + tail)
    return f"no rank stands out across {n} ranks: {why}" + tail


def _clean(value):
    """numpy scalars and NaN out, so that the JSON is plain."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(value) else float(value)
    return value
