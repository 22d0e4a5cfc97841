"""Ranks across a series of runs, for `history`: the same straggler night after night, and the wait
as the series' metric (read only).

Example::

    line = straggler_line(stragglers(client, runs))   # `_analysis.ranks.words`: "rank 17 (host ip-10-0-3-7) was the straggler in 9 of the last 10 runs"
    waits = WaitSeries(client, runs)         # history's Series interface, on each run's wait per step
    waits.runs                               # the runs that have rank summaries (the others are left out)

A straggler that moves from rank to rank is noise; one that stays on a rank, or on a host, points
at that machine. So the latest `LATEST` runs that have rank summaries are analysed (the runs' own
`profiler/ranks/straggler` metric is not trusted for this: it exists only where someone ran
`ranks --log-to`), and a line is printed when one rank, else one host, was the straggler in more
than half of them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from mlflow.tracking import MlflowClient

from .ranks import NoRankSummaries, read_run
from .runs import RunNotFound
from .._trace.step_summary import StepSummary, summarize

LATEST = 10  # runs looked at for a straggler line
READERS = 4  # runs read at once: each waits on the server most of its time
WAIT_METRIC = "wait_us"  # history --metric: each step's wait in collectives, the median over the ranks
RESOLUTION_US = 1.0  # a trace's times are microseconds: a smaller wait counts as this much (the series needs logs)


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


class WaitSeries:
    """`history --metric wait_us`: each run's samples are its steps' waits in collectives (per step,
    the median over the ranks of each rank's wait summed over the step's collectives), read from
    its rank summaries. Runs without rank summaries are left out and counted (`without`)."""

    bulk = False  # every run's samples are read: candidates are judged on whole segments

    def __init__(self, client: MlflowClient, runs: list, progress=None) -> None:
        def waits_of(run):
            try:
                steps = read_run(client, run).report.steps
            except NoRankSummaries:
                return None
            per_step = steps.dropna(subset=["wait_us"]).groupby(["cycle", "step"])["wait_us"].median()
            return np.maximum(per_step.to_numpy(float), RESOLUTION_US) if len(per_step) else None

        if progress is not None and len(runs) > 25:
            progress(f"history: reading the rank summaries of {len(runs):,} runs")
        with ThreadPoolExecutor(READERS) as pool:
            found = list(pool.map(waits_of, runs))
        self.runs = [run for run, waits in zip(runs, found) if waits is not None]
        self._samples = [waits for waits in found if waits is not None]
        self.without = len(runs) - len(self.runs)
        if len(self.runs) < 2:
            raise RunNotFound(f"{len(self.runs)} of the {len(runs)} runs have rank summaries with matched collectives: "
                              "a history of the wait needs 2 or more")  # fmt: skip
        self.summaries = [summarize(values) for values in self._samples]
        self.slow, self.tables_read, self.contradicting = 0, 0, []  # no run's tables are read: its rank summaries are

    def levels(self) -> list[float | None]:
        return [s.level for s in self.summaries]

    def numbers(self, i: int) -> StepSummary:
        return self.summaries[i]

    def samples(self, i: int) -> np.ndarray:
        return self._samples[i]

    def prefetch(self, indices: list[int], announce: bool = False) -> None:
        """Every run's samples are read at the start."""

    def words(self, before: tuple[int, int], after: tuple[int, int], names: list[str]) -> str:
        """The change in words: the median wait a step on each side, and each side's straggler where
        one rank was the straggler in most of its runs."""
        from .._analysis.ranks.words import duration

        sides = [np.concatenate([self._samples[i] for i in range(*part)]) for part in (before, after)]
        return (f"{names[1]} vs {names[0]}: the median wait in collectives went from "
                f"{duration(float(np.median(sides[0])))} to {duration(float(np.median(sides[1])))} a step "
                f"(median over the ranks, every step of the runs judged).")  # fmt: skip
