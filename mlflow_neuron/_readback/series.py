"""A series of runs for `history`, read in bulk: one paged search, each run's summary metrics, and
tables only where they are needed (read only).

Example::

    runs = search_series(client, experiment_id, None, "llama-step", progress=print)
    series = Series(client, runs, "self_device_time_us", region=None, op=None)
    series.levels(), series.numbers(0), series.profile(7)     # tables of run 7, loaded once

Each run's numbers (n, median and its interval, the level that change points are placed on) come
from its `profiler/summary/...` metrics (`_record.run_summary`), which `search_runs` returns with
the run. A run without them (logged before they existed, or `--op`, or peak memory, which have
none) is read from its tables, the slow path, and counted (`slow`). Tables are also read for the
runs next to a change-point candidate, to confirm it (`changes.confirmed`): where a run's summary
disagrees with its tables (its n, median or geometric mean), the run is named (`contradicting`) and its
tables win.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from .._analysis.model import MEMORY_METRIC, RunProfile
from .profiles import load_many, load_profile
from .._analysis.region import in_region
from .runs import _quote
from .._analysis.samples import step_samples
from .._record.model import DEVICE_TAG, REGION_METRICS, STEP_METRICS
from .._record.run_summary import STATS, summary_key
from .._trace.step_summary import StepSummary, summarize

PAGE_SIZE = 1000  # runs per search request; a progress line per page after the first
SLOW_PROGRESS_EVERY = 25  # a progress line per this many runs read from their tables
_SAME = 1e-6  # relative: a summary and the tables agree to JSON's rounding of the tables
_ROUNDED_US = 0.001  # and to the nanosecond the summary's times are rounded to


def search_series(client: MlflowClient, experiment_id: str, filter_string: str | None, run_name: str | None,
                  progress: Callable[[str], None] | None = None) -> list[Run]:  # fmt: skip
    """The experiment's profiled runs (optionally those named `run_name`, or matching
    `filter_string`), in start order: one `search_runs` page after another."""
    clauses = [c for c in (filter_string, run_name and f"attributes.run_name = '{_quote(run_name)}'") if c]
    found, token, read = [], None, 0
    while True:
        page = client.search_runs([experiment_id], filter_string=" and ".join(clauses),
                                  order_by=["attributes.start_time ASC"], max_results=PAGE_SIZE, page_token=token)  # fmt: skip
        read += len(page)
        found += [r for r in page if DEVICE_TAG in r.data.tags and (run_name is None or r.info.run_name == run_name)]
        token = page.token
        if not token:
            return sorted(found, key=lambda r: r.info.start_time)
        if progress is not None:
            progress(f"history: {read:,} runs read, {len(found):,} of them profiled; reading more")


class Series:
    """The numbers of each run of a series for one metric and subject (see the module docstring)."""

    def __init__(self, client: MlflowClient, runs: list[Run], metric: str, region: str | None, op: str | None, *,
                 summaries: bool = True, progress: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.client, self.runs, self.metric, self.region, self.op = client, runs, metric, region, op
        self.progress = progress
        usable = summaries and op is None and metric != MEMORY_METRIC
        self.summaries: list[StepSummary | None] = [summary_of(r, metric, region) if usable else None for r in runs]
        self.from_metrics = [s is not None for s in self.summaries]
        self.contradicting: list[dict] = []
        self._profiles: dict[int, RunProfile] = {}
        self._samples: dict[int, np.ndarray] = {}
        slow = [i for i, s in enumerate(self.summaries) if s is None]
        self.slow = len(slow)
        self.prefetch(slow, announce=True)

    @property
    def bulk(self) -> bool:
        """Whether some run's numbers came from its summary metrics (candidates are then confirmed
        on the runs next to them only)."""
        return any(self.from_metrics)

    @property
    def tables_read(self) -> int:
        return len(self._profiles)

    def levels(self) -> list[float | None]:
        return [s.level for s in self.summaries]

    def numbers(self, i: int) -> StepSummary:
        summary = self.summaries[i]
        return summary if summary is not None else summarize(self.samples(i))

    def profile(self, i: int) -> RunProfile:
        if i not in self._profiles:
            self._profiles[i] = load_profile(self.client, self.runs[i])
        return self._profiles[i]

    def samples(self, i: int) -> np.ndarray:
        """Run i's per-step samples from its tables; its summary checked against them."""
        if i not in self._samples:
            values = subject_values(self.profile(i), self.metric, self.region, self.op)
            self._samples[i] = values
            self._check(i, summarize(values))
        return self._samples[i]

    def prefetch(self, indices: list[int], announce: bool = False) -> None:
        """Reads the tables of these runs (several at once: `profiles.load_many`)."""
        todo = [i for i in indices if i not in self._profiles]
        if not todo:
            return
        if announce and self.progress is not None and len(todo) >= SLOW_PROGRESS_EVERY:
            self.progress(f"history: {len(todo):,} of {len(self.runs):,} runs have no summary metrics; reading "
                          "their tables (the slow path)")  # fmt: skip
        def loaded(count: int) -> None:
            if announce and self.progress is not None and count % SLOW_PROGRESS_EVERY == 0 and count < len(todo):
                self.progress(f"history: tables of {count:,} of {len(todo):,} runs read")

        for i, profile in zip(todo, load_many(self.client, [self.runs[i] for i in todo], on_loaded=loaded)):
            self._profiles[i] = profile
        for i in todo:
            self.samples(i)

    def _check(self, i: int, tables: StepSummary) -> None:
        summary = self.summaries[i]
        if summary is None:
            self.summaries[i] = tables
            return
        if summaries_agree(summary, tables):
            return
        self.contradicting.append(contradiction(self.runs[i], summary, tables))
        self.summaries[i] = tables


def contradiction(run: Run, summary: StepSummary, tables: StepSummary) -> dict:
    """How a run whose summary metrics its tables contradict is named in the output."""
    return {
        "run_id": run.info.run_id, "run_name": run.info.run_name,
        "summary": {"n": summary.n, "median": summary.median}, "tables": {"n": tables.n, "median": tables.median},
    }  # fmt: skip


def summary_of(run: Run, metric: str, region: str | None) -> StepSummary | None:
    """A run's summary of `metric` (of the step's TOTAL, or of `region`) from its run metrics; None
    when it has none."""
    if region is not None:
        metric = REGION_METRICS[STEP_METRICS.index(metric)] if metric in STEP_METRICS else None
    if metric is None:
        return None
    logged = run.data.metrics
    number = {stat: logged.get(summary_key(metric, stat, region)) for stat in STATS}
    if number["median"] is None or not number["n_steps"]:
        return None
    level = math.log(number["geomean"]) if number["geomean"] else None
    return StepSummary(int(number["n_steps"]), number["median"], number["low"], number["high"], level)


def subject_values(profile: RunProfile, metric: str, region: str | None, op: str | None) -> np.ndarray:
    """A run's per-step samples of the TOTAL, of one region, or of one op."""
    if region is not None:
        profile = in_region(profile, region)
    samples = step_samples(profile, metric)
    if op is None:
        return samples.total
    if op not in samples.ops:
        raise ValueError(f"run {profile.label} has no op {op!r}")
    return samples.ops[op].to_numpy(float)


def summaries_agree(a: StepSummary, b: StepSummary) -> bool:
    """The same n, and the same median and geometric mean to the nanosecond the summary was rounded to."""
    if a.n != b.n or (a.level is None) != (b.level is None):
        return False
    same = [(a.median, b.median)] + ([] if a.level is None else [(math.exp(a.level), math.exp(b.level))])
    return all(math.isclose(x, y, rel_tol=_SAME, abs_tol=_ROUNDED_US) for x, y in same)
