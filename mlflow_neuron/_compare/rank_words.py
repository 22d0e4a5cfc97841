"""Times and rank lists as the rank report's sentences say them: "31 ms", "2 to 31 ms", "ranks 2-127".

Pure string formatting for `_compare.ranks` (its sentence and `explain_change`).
"""

from __future__ import annotations


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
