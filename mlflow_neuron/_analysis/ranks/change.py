"""Where a change between two runs' rank reports came from, in one sentence (pure).

Example::

    explain_change(analyze(summaries_a), analyze(summaries_b))
    # "the wait in all_reduce grew from 8 µs to 3.0 ms a step on ranks 0, 1 and 3; rank 2 is the straggler in B, none in A"
"""

from __future__ import annotations

from collections import Counter

from .analysis import RankReport
from .matching import is_number as _number
from .matching import median_of as _median
from .straggler import STRAGGLER_MIN_WAIT_SHARE, STRAGGLER_MIN_WAIT_US
from .words import pair as _pair, ranks_phrase as _ranks_phrase


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
