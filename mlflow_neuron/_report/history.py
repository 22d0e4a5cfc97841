"""An experiment's runs as a series, and where it changed (`changes`), read back from MLflow.

Example::

    frame = history_runs("nightly", run_name="llama-step")
    frame[["run_name", "commit", "median", "low", "high", "segment"]], frame.attrs["changes"]

The runs are the experiment's profiled runs (those with the `mlflow_neuron.device` tag), in start
order, optionally those named `run_name` or matching an MLflow `filter_string`. Each run gives the
samples `compare` would: its per-step TOTAL (or the `region`'s time, or one `op`'s), over all its
cycles, falling back to its metrics. Those numbers come in bulk, with the runs from one paged
`search_runs`, from each run's summary metrics (`series`); tables are read only for runs without
them (the slow path, counted) and for the runs next to a change-point candidate, which confirm it
(at most `WINDOW` on each side). A change is described by the last run before it and the
first after it: names, ids, start times, `mlflow.source.git.commit`, and the versions or instance
type that differ between the two, and by `compare`'s sentence on the judged runs' pooled steps,
which names the op that accounts for most of it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from .._analysis.changes import MIN_RUNS, NO_LEVEL, Change, Search, confirmed, too_few
from .._analysis.frame import compare
from .._analysis.model import CPU_METRIC, DEFAULT_NOISE_PCT, DEVICE_METRIC, TOTAL, RunProfile
from .._analysis.ranks.words import straggler_line
from .._readback.rank_history import WAIT_METRIC, WaitSeries, stragglers
from .._readback.runs import RunNotFound, _experiment_id
from .._readback.series import Series, search_series
from .._record.model import DEVICE_TIME_TAG, capture_reasons
from .._trace.profile import PRESENT
from .._trace.step_summary import StepSummary, median_interval  # noqa: F401 - median_interval: callers' name

WINDOW = 8  # runs of each side of a candidate judged where the levels came from summary metrics

COMMIT_TAG = "mlflow.source.git.commit"
ENV_TAG_PREFIX = "mlflow_neuron.env."
VERSION_PARAMS = ("versions.torch", "versions.torch_neuronx", "versions.neuronx_cc", "versions.mlflow")
ENV_TAGS = ("torch_version", "torch_neuronx_version", "neuronx_cc_version", "libneuronxla_version",
            "ec2_instance_type", "cuda_device")  # fmt: skip


def history_runs(experiment: str, *, run_name: str | None = None, filter_string: str | None = None,
                 metric: str = DEVICE_METRIC, region: str | None = None, op: str | None = None,
                 tracking_uri: str | None = None, noise_pct: float = DEFAULT_NOISE_PCT, summaries: bool = True,
                 progress: Callable[[str], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per run (start order; with `metric="wait_us"`, the runs that have rank summaries: each
    step's wait in collectives, the median over the ranks): `run_id`, `run_name`, `start_time`, `commit`, `n`, `median`,
    and its 95% interval `low`/`high`, `segment`. `attrs`: `changes` (dicts, see `describe`),
    `metric`, `subject` (TOTAL, `region NAME` or the op), `fallback`, `suggested` (change points
    PELT suggested, confirmed or not), `not_searched` (why there was no search, or None),
    `slow_path_runs` (runs read from their tables: no summary metrics, or `summaries=False`),
    `tables_read` (runs whose tables were read, those included), `contradicting` (runs whose summary
    metrics disagreed with their tables, which won), `stragglers` (each of the latest runs with rank
    summaries: its straggler or None) and `straggler_line` (where one rank or host was the straggler
    in most of them); where a run has them, `capture_reasons` ({run_id: {cycle: why it was captured}},
    from `callback.schedule()`'s tags on the runs found). `progress` gets a line now and then over
    thousands of runs."""
    if noise_pct < 0:
        raise ValueError(f"noise_pct must be >= 0; got {noise_pct}")
    if region is not None and op is not None:
        raise ValueError("give --region or --op, not both")
    client = MlflowClient(tracking_uri)
    runs = _series_runs(client, experiment, run_name, filter_string, progress)
    missing = metric == DEVICE_METRIC and any(r.data.tags.get(DEVICE_TIME_TAG, "") != PRESENT for r in runs)
    used = CPU_METRIC if missing else metric
    if metric == WAIT_METRIC:
        if region is not None or op is not None:
            raise ValueError("--metric wait_us is the wait of the whole step: it takes no --region or --op")
        series = WaitSeries(client, runs, progress)
        runs = series.runs
    else:
        series = Series(client, runs, used, region, op, summaries=summaries, progress=progress)
    found = _changes(series, noise_pct)
    changes = found.changes
    segment = np.searchsorted([c.at for c in changes], np.arange(len(runs)), side="right")
    frame = pd.DataFrame([_row(run, series.numbers(i), int(s)) for i, (run, s) in enumerate(zip(runs, segment))])
    frame.attrs.update(
        experiment=experiment, metric=used, requested_metric=metric, noise_pct=noise_pct,
        subject=(TOTAL if metric != WAIT_METRIC else "every rank's step") if region is None and op is None else
        (f"region {region}" if region else op),
        fallback=None if used == metric else "compared on self CPU time: a run has no device time",
        suggested=found.suggested, not_searched=found.skipped,
        changes=[describe(c, runs, getattr(series, "profile", None), used, region, getattr(series, "words", None))
                 for c in changes],
        without_rank_summaries=getattr(series, "without", None),
        slow_path_runs=series.slow, tables_read=series.tables_read, contradicting=series.contradicting,
    )  # fmt: skip
    found_stragglers = stragglers(client, runs)
    frame.attrs.update(stragglers=found_stragglers, straggler_line=straggler_line(found_stragglers))
    if reasons := {r.info.run_id: found for r in runs if (found := capture_reasons(r.data.tags))}:
        frame.attrs["capture_reasons"] = reasons  # only where a run has them: other series print as before
    return frame


def _changes(series: Series, noise_pct: float) -> Search:
    """Change points from the runs' levels; again while confirming them found a summary that its
    tables contradict (the tables' level then stands in for it)."""
    while True:
        levels = series.levels()
        if len(levels) < 2 * MIN_RUNS:
            return too_few(len(levels))
        if any(v is None for v in levels):  # a step that took no time: no log
            return Search([], skipped=NO_LEVEL)
        seen = len(series.contradicting)
        found = confirmed(np.array(levels, float), series.samples, noise_pct, window=WINDOW if series.bulk else None,
                          prefetch=series.prefetch)  # fmt: skip
        if len(series.contradicting) == seen:
            return found


def _series_runs(client: MlflowClient, experiment: str, run_name: str | None, filter_string: str | None,
                 progress: Callable[[str], None] | None = None) -> list:  # fmt: skip
    chosen = search_series(client, _experiment_id(client, experiment), filter_string, run_name, progress)
    if len(chosen) < 2:
        what = f" named {run_name!r}" if run_name else ""
        raise RunNotFound(f"experiment {experiment!r} has {len(chosen)} profiled run(s){what}: a history needs 2 or more")
    return chosen


def _row(run, numbers: StepSummary, segment: int) -> dict:
    return {"run_id": run.info.run_id, "run_name": run.info.run_name, "start_time": run.info.start_time,
            "commit": run.data.tags.get(COMMIT_TAG, ""), "n": numbers.n, "median": numbers.median, "low": numbers.low,
            "high": numbers.high, "segment": segment}  # fmt: skip


def describe(change: Change, runs: list, profile_of: Callable[[int], RunProfile] | None, metric: str,
             region: str | None, words_of: Callable | None = None) -> dict:  # fmt: skip
    """A change in words and numbers: the runs on each side, what differs between them, and
    compare's sentence on the judged runs' pooled steps (`profile_of(i)`: run i's profile), or
    `words_of(before, after, names)` where the metric is not compare's (the wait)."""
    before, after = runs[change.at - 1], runs[change.at]
    names = [_span(runs[slice(*part)]) for part in (change.before, change.after)]
    if names[0] == names[1]:  # one commit on both sides (every run of the series has it): name them by place
        names = [f"series runs {part[0] + 1}..{part[1]}" for part in (change.before, change.after)]
    if words_of is not None:
        words = words_of(change.before, change.after, names)
    else:
        pooled = [_pooled([profile_of(i) for i in range(*part)], name)
                  for part, name in zip((change.before, change.after), names)]  # fmt: skip
        words = compare(pooled, names[0], metric, region=region).attrs["sentences"][names[1]]
    return {
        "before_run_id": before.info.run_id, "after_run_id": after.info.run_id,
        "before_run_name": before.info.run_name, "after_run_name": after.info.run_name,
        "before_start_time": before.info.start_time, "after_start_time": after.info.start_time,
        "before_commit": before.data.tags.get(COMMIT_TAG, ""), "after_commit": after.data.tags.get(COMMIT_TAG, ""),
        "ratio": change.ratio, "ratio_low": change.low, "ratio_high": change.high, "unit": change.unit,
        "verdict": change.verdict, "runs_before": change.before[1] - change.before[0],
        "runs_after": change.after[1] - change.after[0], "environment": environment_changes(before, after),
        "sentence": words,
    }  # fmt: skip


def environment_changes(before, after) -> list[str]:
    """"torch 2.13.0 → 2.14.0" for each version or machine fact that differs between two runs."""
    found = []
    for key in VERSION_PARAMS:
        a, b = before.data.params.get(key), after.data.params.get(key)
        if a != b and (a or b):
            found.append(f"{key.split('.', 1)[1]} {a or '?'} \u2192 {b or '?'}")
    for name in ENV_TAGS:
        a, b = before.data.tags.get(ENV_TAG_PREFIX + name), after.data.tags.get(ENV_TAG_PREFIX + name)
        label = name.removesuffix("_version")
        if a != b and (a or b) and not any(line.startswith(label + " ") for line in found):
            found.append(f"{label} {a or '?'} \u2192 {b or '?'}")
    return found


def _span(runs: list) -> str:
    """"c01..c08": the segment's first and last commits (else run ids)."""
    first, last = (r.data.tags.get(COMMIT_TAG, "")[:12] or r.info.run_id[:8] for r in (runs[0], runs[-1]))
    return f"runs {first}..{last}" if first != last else f"run {first}"


def _pooled(profiles: list[RunProfile], label: str) -> RunProfile:
    """One profile of several runs' samples, each run's cycles kept apart (so each run is a cluster)."""
    def tagged(table: pd.DataFrame | None, i: int) -> pd.DataFrame | None:
        return None if table is None else table.assign(cycle=i * 1_000_000 + table["cycle"].astype(int))

    last = profiles[-1]
    frames = {name: [tagged(getattr(p, name), i) for i, p in enumerate(profiles)]
              for name in ("samples", "step_totals", "regions", "region_ops")}  # fmt: skip
    joined = {name: pd.concat(parts, ignore_index=True) if all(x is not None for x in parts) else None
              for name, parts in frames.items()}  # fmt: skip
    return RunProfile(label, label, last.step, last.ops, last.totals, last.device, last.device_time,
                      {**last.extra, "neuron_summary": {}, "rotation": None, "capture_reasons": {}},
                      source=last.source, host={}, **joined)  # fmt: skip
