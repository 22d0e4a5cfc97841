"""An experiment's runs as a series, and where it changed (`changes`), read back from MLflow.

Example::

    frame = history_runs("nightly", run_name="llama-step")
    frame[["run_name", "commit", "median", "low", "high", "segment"]], frame.attrs["changes"]

The runs are the experiment's profiled runs (those with the `mlflow_neuron.device` tag), in start
order, optionally those named `run_name` or matching an MLflow `filter_string`. Each run gives the
samples `compare` would: its per-step TOTAL (or the `region`'s time, or one `op`'s), over all its
cycles, falling back to its metrics. A change is described by the last run before it and the
first after it: names, ids, start times, `mlflow.source.git.commit`, and the versions or instance
type that differ between the two, and by `compare`'s sentence on the two segments' pooled steps,
which names the op that accounts for most of it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from .._compare.changes import Change, search_changes
from .._compare.frame import compare
from .._compare.model import CPU_METRIC, DEFAULT_NOISE_PCT, DEVICE_METRIC, TOTAL, RunProfile
from .._compare.profiles import load_profile
from .._compare.region import in_region
from .._compare.runs import RunNotFound, _experiment_id
from .._compare.samples import step_samples
from .._delivery.model import DEVICE_TAG

COMMIT_TAG = "mlflow.source.git.commit"
ENV_TAG_PREFIX = "mlflow_neuron.env."
VERSION_PARAMS = ("versions.torch", "versions.torch_neuronx", "versions.neuronx_cc", "versions.mlflow")
ENV_TAGS = ("torch_version", "torch_neuronx_version", "neuronx_cc_version", "libneuronxla_version",
            "ec2_instance_type", "cuda_device")  # fmt: skip


def history_runs(experiment: str, *, run_name: str | None = None, filter_string: str | None = None,
                 metric: str = DEVICE_METRIC, region: str | None = None, op: str | None = None,
                 tracking_uri: str | None = None, noise_pct: float = DEFAULT_NOISE_PCT) -> pd.DataFrame:  # fmt: skip
    """One row per run (start order): `run_id`, `run_name`, `start_time`, `commit`, `n`, `median`,
    and its 95% interval `low`/`high`, `segment`. `attrs`: `changes` (dicts, see `describe`),
    `metric`, `subject` (TOTAL, `region NAME` or the op), `fallback`, `suggested` (change points
    PELT suggested, confirmed or not), `not_searched` (why there was no search, or None)."""
    if noise_pct < 0:
        raise ValueError(f"noise_pct must be >= 0; got {noise_pct}")
    if region is not None and op is not None:
        raise ValueError("give --region or --op, not both")
    client = MlflowClient(tracking_uri)
    runs = _series_runs(client, experiment, run_name, filter_string)
    profiles = [load_profile(client, run) for run in runs]
    used = CPU_METRIC if metric == DEVICE_METRIC and any(p.device_time != "present" for p in profiles) else metric
    samples = [_values(p, used, region, op) for p in profiles]
    found = search_changes(samples, noise_pct)
    changes = found.changes
    segment = np.searchsorted([c.at for c in changes], np.arange(len(runs)), side="right")
    frame = pd.DataFrame([_row(run, values, int(s)) for run, values, s in zip(runs, samples, segment)])
    frame.attrs.update(
        experiment=experiment, metric=used, requested_metric=metric, noise_pct=noise_pct,
        subject=TOTAL if region is None and op is None else (f"region {region}" if region else op),
        fallback=None if used == metric else "compared on self CPU time: a run has no device time",
        suggested=found.suggested, not_searched=found.skipped,
        changes=[describe(c, runs, profiles, used, region) for c in changes],
    )  # fmt: skip
    return frame


def _series_runs(client: MlflowClient, experiment: str, run_name: str | None, filter_string: str | None) -> list:
    experiment_id = _experiment_id(client, experiment)
    runs = client.search_runs([experiment_id], filter_string=filter_string or "",
                              order_by=["attributes.start_time ASC"], max_results=5000)  # fmt: skip
    chosen = [r for r in runs if DEVICE_TAG in r.data.tags and (run_name is None or r.info.run_name == run_name)]
    if len(chosen) < 2:
        what = f" named {run_name!r}" if run_name else ""
        raise RunNotFound(f"experiment {experiment!r} has {len(chosen)} profiled run(s){what}: a history needs 2 or more")
    return sorted(chosen, key=lambda r: r.info.start_time)


def _values(profile: RunProfile, metric: str, region: str | None, op: str | None) -> np.ndarray:
    if region is not None:
        profile = in_region(profile, region)
    samples = step_samples(profile, metric)
    if op is None:
        return samples.total
    if op not in samples.ops:
        raise ValueError(f"run {profile.label} has no op {op!r}")
    return samples.ops[op].to_numpy(float)


def _row(run, values: np.ndarray, segment: int) -> dict:
    median = float(np.median(values))
    low, high = median_interval(values)
    return {"run_id": run.info.run_id, "run_name": run.info.run_name, "start_time": run.info.start_time,
            "commit": run.data.tags.get(COMMIT_TAG, ""), "n": len(values), "median": median, "low": low,
            "high": high, "segment": segment}  # fmt: skip


def median_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """The distribution-free interval of a median: order statistics k and n + 1 - k, k from the
    binomial (n, 1/2) (at least `confidence`); (None, None) below 6 samples."""
    from scipy.stats import binom

    ordered, n = np.sort(values), len(values)
    k = int(binom.ppf((1 - confidence) / 2, n, 0.5))
    return (float(ordered[k - 1]), float(ordered[n - k])) if k >= 1 and n >= 6 else (None, None)


def describe(change: Change, runs: list, profiles: list[RunProfile], metric: str, region: str | None) -> dict:
    """A change in words and numbers: the runs on each side, what differs between them, and
    compare's sentence on the two segments' pooled steps."""
    before, after = runs[change.at - 1], runs[change.at]
    names = [_span(runs[slice(*part)]) for part in (change.before, change.after)]
    if names[0] == names[1]:  # one commit on both sides (every run of the series has it): name them by place
        names = [f"series runs {part[0] + 1}..{part[1]}" for part in (change.before, change.after)]
    pooled = [_pooled(profiles[slice(*part)], name) for part, name in zip((change.before, change.after), names)]
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
                      {**last.extra, "neuron_summary": {}, "rotation": None}, source=last.source, host={}, **joined)  # fmt: skip
