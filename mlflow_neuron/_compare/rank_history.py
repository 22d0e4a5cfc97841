"""Ranks across a series of runs, for `history`: the same straggler night after night, and the wait
as the series' metric (read only).

Example::

    line = straggler_line(client, runs)      # "rank 17 (host ip-10-0-3-7) was the straggler in 9 of the last 10 runs"
    waits = WaitSeries(client, runs)         # history's Series interface, on each run's wait per step

A straggler that moves from rank to rank is noise; one that stays on a rank, or on a host, points
at that machine. So the latest `LATEST` runs that have rank summaries are analysed (the runs' own
`profiler/ranks/straggler` metric is not trusted for this: it exists only where someone ran
`ranks --log-to`), and a line is printed when one rank, else one host, was the straggler in more
than half of them.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from mlflow.tracking import MlflowClient

from .._compare.rank_runs import NoRankSummaries, read_run

LATEST = 10  # runs looked at for a straggler line
MIN_RUNS = 3  # fewer runs with rank summaries than this say nothing
READERS = 4  # runs read at once: each waits on the server most of its time


def stragglers(client: MlflowClient, runs: list, latest: int = LATEST) -> list[dict] | None:
    """Of each of the latest `latest` runs that have rank summaries, oldest first: its straggler's
    `rank` and `host` (None where none was named) and its number of `hosts`; None when no run has any."""
    def straggler_of(run):
        try:
            read = read_run(client, run)
        except NoRankSummaries:
            return None
        straggler = read.report_json.get("straggler")
        hosts = len({s.get("host") for s in read.summaries})
        return {"rank": straggler["rank"], "host": straggler.get("host"), "hosts": hosts} if straggler else \
            {"rank": None, "host": None, "hosts": hosts}  # fmt: skip

    chosen = runs[-latest:]
    with ThreadPoolExecutor(READERS) as pool:
        found = [s for s in pool.map(straggler_of, chosen) if s is not None]
    return found or None


def straggler_line(found: list[dict] | None) -> str | None:
    """The line `history` prints when one rank, else one host, was the straggler in most of the runs
    `stragglers` read; None otherwise."""
    if not found or len(found) < MIN_RUNS:
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
