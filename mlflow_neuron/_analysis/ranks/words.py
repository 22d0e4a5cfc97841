"""Times and rank lists as the rank report's sentences say them: "31 ms", "2 to 31 ms", "ranks 2-127".

Pure string formatting for `analysis` (its sentence and `explain_change`) and for `history`'s straggler line.
"""

from __future__ import annotations

from collections import Counter

STRAGGLER_MIN_RUNS = 3  # fewer runs with rank summaries than this say nothing of a straggler across runs


def duration(us: float) -> str:
    """A wait or a step as people say it: 31 ms, 2.4 ms, 450 µs, 1.2 s."""
    if us >= 1e6:
        return f"{us / 1e6:.1f} s"
    if us >= 1e4:
        return f"{us / 1e3:.0f} ms"
    if us >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} µs"


def pair(before: float, after: float) -> str:
    """"2 to 31 ms": one unit for both where both are in milliseconds."""
    if before >= 1e3 and after >= 1e3 and max(before, after) < 1e6:
        digits = 0 if min(before, after) >= 1e4 or max(before, after) >= 1e4 else 1
        return f"{before / 1e3:.{digits}f} to {after / 1e3:.{digits}f} ms"
    return f"{duration(before)} to {duration(after)}"


def ranks_phrase(ranks: list[int]) -> str:
    """"rank 3", "ranks 0, 1 and 3", "ranks 2-127": runs of three or more written as a range."""
    ranks = sorted(int(r) for r in ranks)
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)) for run in runs]
    words = ", ".join(parts).split(", ")
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" and {words[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def straggler_line(found: list[dict] | None) -> str | None:
    """The line `history` prints when one rank, else one host, was the straggler in most of the runs
    `_readback.rank_history.stragglers` read; None otherwise."""
    if not found or len(found) < STRAGGLER_MIN_RUNS:
        return None
    named = [s for s in found if s["rank"] is not None]
    several_hosts = all(s["hosts"] > 1 for s in found)  # on one host, the host says nothing
    for key in ("rank", "host") if several_hosts else ("rank",):
        counts = Counter(s[key] for s in named if s.get(key) is not None)
        if not counts:
            continue
        value, count = counts.most_common(1)[0]
        if count * 2 > len(found):
            if key == "rank":
                hosts = {s.get("host") for s in named if s["rank"] == value} - {None}
                where = f" (host {', '.join(sorted(hosts))})" if hosts else ""
                return f"rank {value}{where} was the straggler in {count} of the last {len(found)} runs with rank summaries"
            ranks = sorted({s["rank"] for s in named if s.get("host") == value})
            return (f"host {value} held the straggler in {count} of the last {len(found)} runs with rank summaries "
                    f"(rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})")  # fmt: skip
    return None
