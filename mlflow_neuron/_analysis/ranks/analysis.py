"""Every rank's step side by side, the wait in collectives, and the straggler: from rank summaries.

Example::

    report = analyze([summary_rank0, summary_rank1, summary_rank2, summary_rank3])
    report.table        # one row per rank: step time (median, 95% interval), collective, wait, ...
    report.straggler    # {"rank": 2, "arrived_last_pct": 94.0, "others_wait_us": 31020.0, ...} or None
    report.sentence     # "rank 2 arrived last at 94% of all_reduces; the other 3 ranks waited 31 ms ..."
    explain_change(report_a, report_b)   # "the wait in all_reduce grew from 2 to 31 ms a step on ..."

A summary is `_trace.collectives`' rank summary (one per rank per cycle; a rank's cycles are read
together).

**Matching.** A collective instance is the same on every rank when its process group and sequence
number agree (`Seq`, where the trace has it); else when its group, step and place among that
group's collectives in the step agree (every rank numbers its `ProfilerStep`s alike, so a window
that opens a little earlier on one rank shifts nothing); else its group, cycle and place in the
cycle. An instance that is not on every rank that reported, or whose name differs between ranks,
is left out and named (`unmatched`). Point-to-point transfers (send/recv) are left out of the wait:
two ranks take part in each, not all (TraceLens's straggler summary leaves them out too).

**The wait.** At each instance, the rank that arrived last waits for nobody; the others sat in the
collective until it came. TraceLens (`NcclAnalyser`) measures a rank's wait as the latest start
minus its own start, which needs one clock. Here it is the rank's time in the collective minus
the shortest time any rank spent in it (the transfer, TraceLens's "latency"): a collective ends on
every rank when the last rank's data has arrived, so `end − start` is wait + transfer on each rank,
and durations do not change when a host's clock is off by milliseconds. Where every rank ends at
once the two definitions are equal. The rank that arrived last is the one with the shortest time
in it (TraceLens: the smallest wait).

**The straggler** is the rank that arrived last most often while the others waited measurably,
named only when it stands out. A step is the unit (one late rank holds every collective of its
step; a sleep before one all_reduce and three quick collectives after it are one late arrival, not
one in four). In each step where every rank's collectives were matched, a rank's lateness is the
other ranks' median wait minus its own wait (how much longer they sat in that step's collectives
than it did; no clock needed). The candidate is the rank with the largest median lateness; it is
named when
- it arrived measurably late: its median lateness is at least `STRAGGLER_MIN_WAIT_SHARE` of the
  median step and at least `STRAGGLER_MIN_WAIT_US`, and
- consistently: it was late (lateness > 0) in so many of the n steps that chance would give as
  many at most `STRAGGLER_P_VALUE` of the time (a one-sided sign test: with no slow rank, a rank
  is late in about half the steps). Six steps out of six pass; five of six do not; 16 of 20 pass.
Otherwise no rank is named and the sentence says why. `arrived_last_pct` is the share of the
instances that kept ranks waiting at which the rank arrived last (of the straggler: among the
collectives it was last at); an instance kept ranks waiting when the others' median wait there
reached `STRAGGLER_MIN_WAIT_US` and `INSTANCE_WAIT_TO_TRANSFER` times its transfer (the jitter of
a duration grows with the duration; below that, who came last is chance).
`benchmarks/rank_calibration.py` measures how often the rule names the right rank, and a rank
when none was slowed.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import binom

from ..._trace.collectives import FORMAT
from ..._trace.step_summary import summarize
from .matching import INSTANCE_COLUMNS, keyed_collectives, match, waits
from .matching import is_number as _number
from .words import duration, pair as _pair, ranks_phrase as _ranks_phrase

STRAGGLER_P_VALUE = 0.02
INSTANCE_WAIT_TO_TRANSFER = 0.5
STRAGGLER_MIN_WAIT_SHARE = 0.02
STRAGGLER_MIN_WAIT_US = 100.0
STEP_COLUMNS = ["rank", "host", "cycle", "step", "step_us", "window_us", "compute_us", "collective_us", "wait_us",
                "exposed_comm_us", "idle_us", "memcpy_us", "memcpy_bytes", "peak_memory_bytes"]  # fmt: skip
TABLE_COLUMNS = ["rank", "host", "steps", "step_us_median", "step_us_low", "step_us_high", "collective_us", "wait_us",
                 "exposed_comm_pct", "idle_pct", "compute_us", "arrived_last_pct", "device_cc_op_time", "compute_pct",
                 "non_compute_pct", "overlap_pct"]  # fmt: skip


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

    def to_json(self) -> dict:
        ranks = []
        for row in self.table.to_dict("records"):
            ranks.append({"rank": int(row["rank"]), "host": row["host"], "steps": int(row["steps"]),
                          "step_time_us": {"median": row["step_us_median"], "low": row["step_us_low"],
                                           "high": row["step_us_high"]},
                          **{k: row[k] for k in ("collective_us", "wait_us", "exposed_comm_pct", "idle_pct",
                                                 "compute_us", "arrived_last_pct", "device_cc_op_time", "compute_pct",
                                                 "non_compute_pct", "overlap_pct")}})  # fmt: skip
        return _clean({"world_size": self.world_size, "ranks": ranks, "straggler": self.straggler,
                       "missing": self.missing, "unmatched": self.unmatched, "matched_collectives": self.matched,
                       "sentence": self.sentence, "notes": self.notes})  # fmt: skip


def analyze(summaries: list[dict], *, expected_world_size: int | None = None) -> RankReport:
    """The report over rank summaries (any number of cycles per rank). Never raises for a bad or
    partial set: a summary it cannot read is left out and said in `notes`."""
    by_rank, notes = _by_rank(summaries)
    sizes = [s.get("world_size") for group in by_rank.values() for s in group if isinstance(s.get("world_size"), int)]
    world_size = expected_world_size or max(sizes + [max(by_rank, default=-1) + 1, 0])
    missing = [r for r in range(world_size) if r not in by_rank]
    ranks = sorted(by_rank)
    keyed = {r: keyed_collectives(by_rank[r]) for r in ranks}
    point_to_point = sum(1 for r in ranks for key in keyed[r] if key[0] == "p2p")
    if point_to_point:
        notes.append(f"{point_to_point} point-to-point transfers (send/recv) left out of the wait: two ranks take "
                     "part in each, not all")  # fmt: skip
    keyed = {r: {k: c for k, c in keyed[r].items() if k[0] != "p2p"} for r in ranks}
    instances, unmatched = match(keyed) if len(ranks) > 1 else ({}, [])
    per_step, waited_for, instance_rows = waits(instances, ranks, min_wait_us=STRAGGLER_MIN_WAIT_US,
                                                wait_to_transfer=INSTANCE_WAIT_TO_TRANSFER)
    last_counts = Counter(r for r, *_ in waited_for)
    rows, step_rows, waits_by_name = [], [], {}
    for r in ranks:
        steps = _step_rows(r, by_rank[r], per_step.get(r, {}) if instances else None)
        rows.append({**_row(r, steps, last_counts.get(r, 0), len(waited_for)),
                     "device_cc_op_time": _median(_device(s, "cc_op_time") for s in by_rank[r])})
        step_rows += steps
        waits_by_name[r] = _median_wait_by_name(per_step.get(r, {}))
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    step_frame = pd.DataFrame(step_rows, columns=STEP_COLUMNS)
    straggler, why = _straggler(table, step_frame, waited_for, len(instances))
    report = RankReport(world_size, table, straggler, missing, unmatched, len(instances), "", notes, waits_by_name,
                        step_frame, instance_rows)
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


def _step_rows(rank: int, summaries: list[dict], waits: dict | None) -> list[dict]:
    """The rank's steps over all its cycles (a step read twice counts once), each with its wait
    (None where no collective was matched across ranks)."""
    rows, host = {}, _host(summaries)
    for summary in sorted(summaries, key=lambda s: (s.get("cycle_step") is None, s.get("cycle_step") or 0)):
        for step in summary["steps"]:
            number = step.get("step") if isinstance(step, dict) else None
            key = number if number is not None else (summary.get("cycle_step"), id(step))
            if isinstance(step, dict) and _number(step.get("step_us")) and key not in rows:
                row = {k: step.get(k) for k in STEP_COLUMNS if k in step}
                wait = None if waits is None else sum(waits.get(step.get("step"), {}).values())
                rows[key] = {**row, "rank": rank, "host": host, "cycle": summary.get("cycle_step"), "wait_us": wait}
    return list(rows.values())


def _host(summaries: list[dict]) -> str | None:
    hosts = [s.get("host") for s in summaries if s.get("host")]
    return Counter(hosts).most_common(1)[0][0] if hosts else None


def _row(rank: int, steps: list[dict], last: int, waited: int) -> dict:
    stats = summarize([s["step_us"] for s in steps]) if steps else None
    column = lambda key: [s.get(key) for s in steps]  # noqa: E731
    return {"rank": rank, "host": steps[0]["host"] if steps else None, "steps": len(steps),
            "step_us_median": stats.median if stats else None, "step_us_low": stats.low if stats else None,
            "step_us_high": stats.high if stats else None, "collective_us": _median(column("collective_us")),
            "wait_us": _median(column("wait_us")), "exposed_comm_pct": _share(steps, "exposed_comm_us"),
            "idle_pct": _share(steps, "idle_us"), "compute_us": _median(column("compute_us")),
            **_breakdown(steps),
            "arrived_last_pct": 100.0 * last / waited if waited else None}  # fmt: skip


def _device(summary: dict, field: str):
    """A field of the rank's Neuron Explorer summary (`device`), as Explorer gives it, or None."""
    device = summary.get("device")
    return device.get(field) if isinstance(device, dict) else None


def _median_wait_by_name(waits: dict) -> dict[str, float]:
    names = {name for per_name in waits.values() for name in per_name}
    return {name: _median([per_name.get(name, 0.0) for per_name in waits.values()]) for name in names}


def _straggler(table: pd.DataFrame, steps: pd.DataFrame, waited_for: list, matched: int) -> tuple[dict | None, str]:
    """The straggler by the rule of the module docstring, or None and why not."""
    if len(table) < 2:
        return None, "one rank"
    if matched == 0:
        return None, "no collective matched across ranks"
    waits = steps.dropna(subset=["wait_us"]).pivot_table(index=["cycle", "step"], columns="rank", values="wait_us",
                                                          aggfunc="first", dropna=False).dropna()  # fmt: skip
    if waits.empty:
        return None, "no step has its collectives matched on every rank"
    # how much later than the others a rank arrived in each step: the others' median wait minus its own
    lateness = {r: waits.drop(columns=r).median(axis=1) - waits[r] for r in waits.columns}
    rank = max(lateness, key=lambda r: (float(lateness[r].median()), -r))
    late, n = int((lateness[rank] > 0).sum()), len(waits)
    p_value = float(binom.sf(late - 1, n, 0.5))  # P(this many steps or more | late in half the steps by chance)
    step_us = _median([s for s in table["step_us_median"] if _number(s)]) or 0.0
    floor = max(STRAGGLER_MIN_WAIT_US, STRAGGLER_MIN_WAIT_SHARE * step_us)
    by_how_much = float(lateness[rank].median())
    if by_how_much < floor:
        return None, (f"no rank arrived measurably later than the others: the latest, rank {rank}, by "
                      f"{duration(max(by_how_much, 0.0))} a step (median), under {duration(floor)}")
    if p_value > STRAGGLER_P_VALUE:
        return None, (f"rank {rank} arrived {duration(by_how_much)} a step later than the others (median), but only "
                      f"in {late} of {n} steps: not consistently")
    others = table[table["rank"] != rank]
    others_wait = _median([w for w in others["wait_us"] if _number(w)]) or 0.0
    names = Counter(name for r, name, *_ in waited_for if r == rank)
    alike = [r for r, name, *_ in waited_for if name in names]  # the instances of the collectives it was last at
    return {"rank": int(rank), "host": table.loc[table["rank"] == rank, "host"].iloc[0],
            "arrived_last_pct": 100.0 * sum(names.values()) / len(alike) if alike else None,
            "late_steps": late, "steps": n, "p_value": p_value, "late_by_us": by_how_much,
            "others_wait_us": others_wait, "others_wait_pct_of_step": 100.0 * others_wait / step_us if step_us else None,
            "collective": names.most_common(1)[0][0] if len(names) == 1 else None,
            "waited_instances": len(waited_for), "matched_instances": matched}, ""  # fmt: skip


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
        return (f"rank {s['rank']}{host} arrived last {at}later than the others in {s['late_steps']} of {s['steps']} "
                f"steps; the {others} waited {duration(s['others_wait_us'])} a step{share}, "
                f"{duration(s['late_by_us'])} longer than it did" + tail)
    return f"no rank stands out across {n} ranks: {why}" + tail


def explain_change(base: RankReport, run: RankReport) -> str | None:
    """Where a change between two runs' rank reports came from, in one sentence (A = base, B = run);
    None when neither the wait nor the straggler changed."""
    if len(base.table) < 2 or len(run.table) < 2:
        return None
    a, b = base.table.set_index("rank"), run.table.set_index("rank")
    common = [r for r in b.index if r in a.index and _number(a.loc[r, "wait_us"]) and _number(b.loc[r, "wait_us"])]
    step = _median([s for s in a["step_us_median"] if _number(s)]) or 0.0
    floor = max(STRAGGLER_MIN_WAIT_US, STRAGGLER_MIN_WAIT_SHARE * step)
    grew = [r for r in common if b.loc[r, "wait_us"] - a.loc[r, "wait_us"] >= floor]
    fell = [r for r in common if a.loc[r, "wait_us"] - b.loc[r, "wait_us"] >= floor]
    parts = []
    for ranks, verb in ((grew, "grew"), ([] if grew else fell, "fell")):  # a new straggler's own wait falls: left unsaid
        if ranks:
            name = _dominant_name(run if verb == "grew" else base, ranks)
            before = _median([a.loc[r, "wait_us"] for r in ranks])
            after = _median([b.loc[r, "wait_us"] for r in ranks])
            parts.append(f"the wait{f' in {name}' if name else ''} {verb} from {_pair(before, after)} a step on "
                         f"{_ranks_phrase(ranks)}")  # fmt: skip
    who = lambda report: f"rank {report.straggler['rank']}" if report.straggler else "none"  # noqa: E731
    if (base.straggler or {}).get("rank") != (run.straggler or {}).get("rank"):
        if run.straggler:
            parts.append(f"rank {run.straggler['rank']} is the straggler in B, {who(base)} in A")
        else:
            parts.append(f"{who(base)} was the straggler in A, none is in B")
    if not parts:  # neither the wait nor the straggler changed: say which part of the step did, if one did
        grown = {part: (_part(base, column), _part(run, column)) for part, column in _PARTS.items()}
        part, (before, after) = max(grown.items(), key=lambda item: abs((item[1][1] or 0.0) - (item[1][0] or 0.0)))
        if before is not None and after is not None and abs(after - before) >= floor:
            parts.append(f"{part} {'grew' if after > before else 'fell'} from {_pair(before, after)} a step (the "
                         f"ranks' median); the wait did not change")  # fmt: skip
    return "; ".join(parts) or None


_PARTS = {"compute": "compute_us", "idle time": "idle_us", "time in collectives": "collective_us"}


def _part(report: RankReport, column: str) -> float | None:
    """The median over ranks of each rank's median a step of one part of the step."""
    per_rank = report.steps.groupby("rank")[column].median() if len(report.steps) else []
    return _median(list(per_rank))


def _dominant_name(report: RankReport, ranks: list[int]) -> str | None:
    totals = Counter()
    for r in ranks:
        for name, wait in report.waits_by_name.get(r, {}).items():
            totals[name] += wait or 0.0
    return totals.most_common(1)[0][0] if totals else None


def _breakdown(steps: list[dict]) -> dict:
    """HTA's temporal breakdown and overlap over the rank's steps: compute and non-compute (neither
    idle nor compute) as % of the windows, and the share of collective time that compute overlaps."""
    idle, compute = _share(steps, "idle_us"), _share(steps, "compute_us")
    pairs = [(s["collective_us"], s["exposed_comm_us"]) for s in steps
             if _number(s.get("collective_us")) and _number(s.get("exposed_comm_us"))]  # fmt: skip
    comm = sum(c for c, _ in pairs)
    return {"compute_pct": compute, "non_compute_pct": None if idle is None or compute is None else 100.0 - idle - compute,
            "overlap_pct": 100.0 * (comm - sum(e for _, e in pairs)) / comm if comm > 0 else None}  # fmt: skip


def _share(steps, key: str) -> float | None:
    pairs = [(s[key], s["window_us"]) for s in steps if _number(s.get(key)) and _number(s.get("window_us"))]
    total = sum(w for _, w in pairs)
    return 100.0 * sum(v for v, _ in pairs) / total if total > 0 else None


def _median(values) -> float | None:
    values = [v for v in values if _number(v)]
    return float(np.median(values)) if values else None


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
