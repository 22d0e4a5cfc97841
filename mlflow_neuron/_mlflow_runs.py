"""Reading profiled runs back from MLflow: finding them, and loading one cycle of each.

Runs are named the way people name them: run ids, run names within an experiment (the latest run
of that name), a parent run (its profiled children), an experiment (the children of its latest
profiled parent, or its profiled runs), or `models:/NAME/VERSION` (the run behind a version).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ._compare import RunProfile, compare, flat
from ._mlflow_io import RunLogger
from ._record import DEVICE_TAG, DEVICE_TIME_TAG, OPS_TABLE, Delivery, RunRef, write_table

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_STEP_DIR = re.compile(r"^profiler/step_(\d+)$")
PARENT_TAG = "mlflow.parentRunId"
COMPARISON_DIR, COMPARISON_TABLE = "comparison", "ops.json"
TOTAL_KEYS = ("self_device_time_us", "self_cpu_time_us", "aten_calls", "active_steps", "unattributed_device_time_us")


class RunNotFound(LookupError):
    """A run, experiment or model version named on the command line does not exist."""


def compare_runs(
    runs: str | list[str],
    baseline: str | None = None,
    metric: str = "self_device_time_us",
    step: int | None = None,
    *,
    experiment: str | None = None,
    tracking_uri: str | None = None,
) -> pd.DataFrame:
    """Per-op comparison of profiled runs as a DataFrame (see `mlflow_neuron._compare`).

    Example::

        frame = compare_runs("rmsnorm-variants", baseline="naive")   # an experiment's latest variants
        frame.attrs["metric"], frame.attrs["fallback"]              # what was compared, and why

    `runs` is an experiment name, or a list of run ids / run names (within `experiment`) /
    parent runs / `models:/NAME/VERSION`. `step` picks the profiler cycle (default: each run's last).
    """
    client = MlflowClient(tracking_uri)
    if isinstance(runs, str):
        experiment, runs = runs, []
    resolved = resolve_runs(client, runs, experiment)
    return compare(load_profiles(client, resolved, step), baseline, metric)


def resolve_runs(client: MlflowClient, names: list[str], experiment: str | None) -> list[Run]:
    experiment_id = _experiment_id(client, experiment) if experiment else None
    if not names:
        if experiment_id is None:
            raise RunNotFound("name runs to compare, or an experiment")
        return _latest_profiled(client, experiment_id)
    runs: list[Run] = []
    for name in names:
        run = _resolve_one(client, name, experiment_id)
        runs.extend(_children(client, run) if _is_parent(client, run) else [run])
    return runs


def load_profiles(client: MlflowClient, runs: list[Run], step: int | None = None) -> list[RunProfile]:
    labels = _labels(runs)
    return [load_profile(client, run, label, step) for run, label in zip(runs, labels)]


def load_profile(client: MlflowClient, run: Run, label: str | None = None, step: int | None = None) -> RunProfile:
    """One cycle of a run: its ops.json and the totals logged at that step."""
    run_id = run.info.run_id
    steps = sorted(int(m.group(1)) for a in client.list_artifacts(run_id, "profiler") if (m := _STEP_DIR.match(a.path)))
    if not steps:
        raise RunNotFound(f"run {run.info.run_name} ({run_id}) has no profiler cycles (no profiler/step_<N>/)")
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise RunNotFound(f"run {run.info.run_name} ({run_id}) has no profiler/step_{chosen}; it has steps {steps}")
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, f"profiler/step_{chosen}/{OPS_TABLE}", tmp)
        ops = pd.read_json(Path(path), orient="split")
    totals = {}
    for key in TOTAL_KEYS:
        points = [m.value for m in client.get_metric_history(run_id, f"profiler/total/{key}") if m.step == chosen]
        if points:
            totals[key] = points[-1]
    return RunProfile(
        label=label or run.info.run_name or run_id,
        run_id=run_id,
        step=chosen,
        ops=ops,
        totals=totals,
        device=run.data.tags.get(DEVICE_TAG, ""),
        device_time=run.data.tags.get(DEVICE_TIME_TAG, ""),
        extra={"torch_version": run.data.params.get("versions.torch", "")},
    )


def attach_comparison(tracking_uri: str, run_id: str, frame: pd.DataFrame, files: list[Path]) -> None:
    """Logs the comparison table (shown as a table in the UI) and its rendered files under
    `comparison/`, replacing an earlier comparison there."""
    with tempfile.TemporaryDirectory() as tmp:
        write_table(flat(frame), Path(tmp, COMPARISON_TABLE))
        for path in files:
            shutil.copyfile(path, Path(tmp, Path(path).name))
        delivery = Delivery(step=0, timestamp_ms=0, artifact_dir=COMPARISON_DIR, files_dir=tmp,
                            table=f"{COMPARISON_DIR}/{COMPARISON_TABLE}")
        RunLogger(RunRef(tracking_uri, run_id)).deliver(delivery)


def _resolve_one(client: MlflowClient, name: str, experiment_id: str | None) -> Run:
    if name.startswith("models:/"):
        parts = name[len("models:/") :].split("/")
        if len(parts) != 2:
            raise RunNotFound(f"{name!r}: expected models:/NAME/VERSION")
        try:
            return client.get_run(client.get_model_version(parts[0], parts[1]).run_id)
        except MlflowException as error:
            raise RunNotFound(f"{name}: {error.message}") from error
    looks_like_id = bool(_RUN_ID.match(name))
    if looks_like_id:
        try:
            return client.get_run(name)
        except MlflowException:
            pass  # a run *named* like an id: look it up by name below
    if experiment_id is None:
        if looks_like_id:
            raise RunNotFound(f"no such run: {name}")
        raise RunNotFound(f"run {name!r} is not a run id; give --experiment to look it up by name")
    found = client.search_runs(
        [experiment_id], filter_string=f"attributes.run_name = '{_quote(name)}'", order_by=["attributes.start_time DESC"]
    )
    if not found:
        raise RunNotFound(f"no such run: {name}" if looks_like_id else f"no run named {name!r} in the experiment")
    return found[0]


def _latest_profiled(client: MlflowClient, experiment_id: str) -> list[Run]:
    runs = client.search_runs([experiment_id], order_by=["attributes.start_time DESC"])
    profiled = [r for r in runs if DEVICE_TAG in r.data.tags]
    if not profiled:
        raise RunNotFound("the experiment has no profiled runs (runs with the mlflow_neuron.device tag)")
    parents = [r.data.tags.get(PARENT_TAG) for r in profiled if r.data.tags.get(PARENT_TAG)]
    if parents:
        latest_parent = parents[0]  # runs come newest first
        chosen = [r for r in profiled if r.data.tags.get(PARENT_TAG) == latest_parent]
    else:
        chosen = list({r.info.run_name: r for r in reversed(profiled)}.values())  # the latest per name
    return sorted(chosen, key=lambda r: r.info.start_time)


def _is_parent(client: MlflowClient, run: Run) -> bool:
    return DEVICE_TAG not in run.data.tags and bool(_children(client, run))


def _children(client: MlflowClient, run: Run) -> list[Run]:
    children = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{run.info.run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    return [r for r in children if DEVICE_TAG in r.data.tags]


def _experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        raise RunNotFound(f"no experiment named {name!r} at {mlflow.get_tracking_uri()}")
    return experiment.experiment_id


def _labels(runs: list[Run]) -> list[str]:
    names = [r.info.run_name or r.info.run_id for r in runs]
    return [n if names.count(n) == 1 else f"{n}@{r.info.run_id[:7]}" for n, r in zip(names, runs)]


def _quote(text: str) -> str:
    return text.replace("'", "\\'")
