"""`compare_runs`: profiled runs found in MLflow, compared (read only); many runs by their
run-level numbers first.

A few runs (`overview.BULK_ABOVE` or fewer, or `tables=True`) are compared in full: every run's
tables are loaded (`profiles`) and compared (`frame.compare`), one column group per run. More runs
take the bulk path: each run's summary metrics, which came with the search that found it
(`series.summary_of`), give every run a row of the overview (`overview`), and only the runs that
it prints in detail have their tables downloaded: the baseline, those named in `detail`, those
whose summaries say they differ beyond the noise band (the largest changes), and, with
`fail_if_slower`, those whose summaries cannot rule out the gate's line. Runs without summary
metrics (logged before them; `step`, `skip_steps` and peak memory, which summaries do not
describe; a region past the 20 that get summaries) are read from their tables, the slow path,
and counted. A run whose summary its tables contradict is named and its tables' numbers win.
"""

from __future__ import annotations

import pandas as pd
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from .._analysis import overview as _overview
from .._analysis.frame import compare
from .._analysis.model import CPU_METRIC, DEVICE_METRIC, RunProfile
from .._readback.profiles import load_many, load_profiles, named_alike
from .ranks.summary import rank_changes
from .._analysis.region import in_region
from .._readback.runs import labels, resolve_runs
from .._analysis.samples import step_samples
from .._readback.series import contradiction, summaries_agree, summary_of
from .._analysis.weather import HOST_BUSY_SHARE, HOST_LOAD_THRESHOLD_CORES
from .._record.model import DEVICE_TIME_TAG
from .._trace.profile import PRESENT
from .._trace.step_summary import StepSummary, summarize


def compare_runs(
    runs: str | list[str],
    baseline: str | None = None,
    metric: str = DEVICE_METRIC,
    step: int | None = None,
    *,
    experiment: str | None = None,
    tracking_uri: str | None = None,
    skip_steps: int = 0,
    noise_pct: float = 2.0,
    host_load_threshold: float = HOST_LOAD_THRESHOLD_CORES,
    region: str | None = None,
    host_busy_share: float = HOST_BUSY_SHARE,
    detail: list[str] | None = None,
    fail_if_slower: float | None = None,
    tables: bool = False,
) -> pd.DataFrame:
    """Per-op comparison of profiled runs as a DataFrame (see `frame.compare`).

    Example::

        frame = compare_runs("rmsnorm-variants", baseline="naive")   # an experiment's latest variants
        frame.attrs["metric"], frame.attrs["fallback"]              # what was compared, and why

    `runs` is an experiment name, or a list of run ids / run names (within `experiment`) /
    parent runs / `models:/NAME/VERSION`. A run's samples are its profiler steps, over all its
    cycles; `step` keeps one cycle only, `skip_steps` leaves out each run's first steps. Host
    time of runs whose hosts' load differed by more than `host_load_threshold` cores, or whose
    host (or the baseline's) had more than `host_busy_share` of its CPUs busy elsewhere, is
    `inconclusive` (see `weather`). `region` compares one `record_function` range: its inclusive
    time per step, and the ops inside it as the rows.

    More than `overview.BULK_ABOVE` runs (unless `tables`): the frame holds the runs shown in
    detail (the module docstring says which; `detail` names runs to add, `fail_if_slower` adds
    those the gate could fail on), and `attrs["many"]` every run's row of the overview, what
    was shown and why, `tables_read` (runs whose tables were downloaded), `slow_path_runs` and
    `contradicting`.
    """
    client = MlflowClient(tracking_uri)
    if isinstance(runs, str):
        experiment, runs = runs, []
    resolved = resolve_runs(client, runs, experiment)
    options = dict(skip_steps=skip_steps, noise_pct=noise_pct, host_load_threshold=host_load_threshold, region=region,
                   host_busy_share=host_busy_share)  # fmt: skip
    if tables or len(resolved) <= _overview.BULK_ABOVE:  # every run is shown in detail
        return _with_ranks(client, resolved, compare(load_profiles(client, resolved, step), baseline, metric, **options),
                           step)  # fmt: skip
    names = labels(resolved)
    named = {names[_index(resolved, names, name, "--detail")] for name in detail or []}
    base = _index(resolved, names, baseline, "baseline") if baseline else 0
    return _Many(client, resolved, names, metric, step, region, skip_steps).compare(base, named, fail_if_slower, options)


def _with_ranks(client: MlflowClient, runs: list[Run], frame: pd.DataFrame, step: int | None) -> pd.DataFrame:
    """Where the runs and the baseline have rank summaries, each verdict also says where the step-time
    change came from across ranks (the wait, the straggler); `attrs["ranks"]` holds their reports."""
    explained, reports = rank_changes(client, runs, frame.attrs["baseline"], step)
    for name, text in explained.items():
        frame.attrs["sentences"][name] = f"{frame.attrs['sentences'][name]} Across ranks: {text}"
    if reports:
        frame.attrs["ranks"] = reports
    return frame


def _index(runs: list[Run], names: list[str], key: str, what: str) -> int:
    for i, (run, label) in enumerate(zip(runs, names)):
        if key in (label, run.info.run_id):
            return i
    raise ValueError(f"{what} {key!r} is not among the compared runs ({_overview.names(names)})")


class _Many:
    """The bulk path (see the module docstring): each run's numbers, tables loaded as needed."""

    def __init__(self, client: MlflowClient, runs: list[Run], names: list[str], metric: str, step: int | None,
                 region: str | None, skip_steps: int) -> None:  # fmt: skip
        self.client, self.runs, self.names, self.step, self.region, self.skip = client, runs, names, step, region, skip_steps
        without = [n for n, r in zip(names, runs) if r.data.tags.get(DEVICE_TIME_TAG, "") != PRESENT]
        self.requested = metric
        self.metric = CPU_METRIC if metric == DEVICE_METRIC and without else metric
        self.fallback = None if self.metric == metric else \
            f"compared on self CPU time: no device time in {_overview.names(without)}"  # fmt: skip
        usable = step is None and skip_steps == 0
        self.summaries = [summary_of(r, self.metric, region) if usable else None for r in runs]
        self.numbers: list[StepSummary | None] = list(self.summaries)
        self.loaded: dict[int, RunProfile] = {}
        self.contradicting: list[dict] = []
        self.from_tables: set[int] = set()  # runs whose numbers are their tables' (no summary, or a contradicted one)

    def compare(self, base: int, named: set[str], gate_pct: float | None, options: dict) -> pd.DataFrame:
        slow = [i for i, s in enumerate(self.summaries) if s is None]
        self.load(slow)  # their numbers come from their tables
        while True:  # again when a run's tables contradicted its summary: its tables' numbers may choose others
            sources = [_overview.FROM_TABLES if i in self.from_tables else _overview.FROM_SUMMARY
                       for i in range(len(self.runs))]  # fmt: skip
            rows = _overview.overview_rows(self.numbers, self.names, [r.info.run_id for r in self.runs], sources, base)
            contradicted = {self.names[self._index(c["run_id"])] for c in self.contradicting}
            chosen = _overview.choose(rows, options["noise_pct"], named, gate_pct, contradicted)
            indices = [self.names.index(label) for label in chosen.detailed]
            seen = len(self.contradicting)
            self.load(indices)
            if len(self.contradicting) == seen:
                break
        frame = compare(named_alike([self.loaded[i] for i in indices]), self.names[base], self.metric, **options)
        if self.fallback:
            frame.attrs.update(fallback=self.fallback, requested_metric=self.requested)
        frame.attrs["many"] = {
            "rows": rows, "detailed": chosen.detailed, "why": chosen.why, "differing": chosen.differing,
            "not_shown": chosen.not_shown, "metric": self.metric, "region": self.region,
            "noise_pct": options["noise_pct"], "gate_pct": gate_pct, "bulk_above": _overview.BULK_ABOVE,
            "tables_read": len(self.loaded), "slow_path_runs": len(slow), "slow_path_why": self._slow_why(),
            "contradicting": self.contradicting,
        }  # fmt: skip
        return frame

    def load(self, indices: list[int]) -> None:
        """Downloads the tables of these runs (several at once) and checks their summaries."""
        todo = sorted(set(indices) - self.loaded.keys())
        for i, profile in zip(todo, load_many(self.client, [self.runs[i] for i in todo], [self.names[i] for i in todo],
                                              self.step)):  # fmt: skip
            self.loaded[i] = profile
            tables, summary = self._table_numbers(profile), self.summaries[i]
            if summary is not None and summaries_agree(summary, tables):
                continue
            if summary is not None:
                self.contradicting.append(contradiction(self.runs[i], summary, tables))
            self.numbers[i] = tables
            self.from_tables.add(i)

    def _index(self, run_id: str) -> int:
        return next(i for i, r in enumerate(self.runs) if r.info.run_id == run_id)

    def _table_numbers(self, profile: RunProfile) -> StepSummary:
        subject = profile if self.region is None else in_region(profile, self.region)
        return summarize(step_samples(subject, self.metric, self.skip).total)

    def _slow_why(self) -> str:
        if self.step is not None or self.skip:
            return "summary metrics cover every step of every cycle, not --step or --skip-steps"
        if self.metric not in (DEVICE_METRIC, CPU_METRIC):
            return "no summary metrics of peak memory are logged"
        if self.region:
            return f"no summary metrics of region {self.region} (runs logged before them, or past the 20 costliest regions)"
        return "no summary metrics (runs logged before them)"
