"""Finding profiled runs in MLflow by the names people give them (read only).

Runs are named the way people name them: run ids, run names within an experiment (the latest run
of that name), a parent run (its profiled children), an experiment (the children of its latest
profiled parent, or its profiled runs), or `models:/NAME/VERSION` (the run behind a version).
A name that finds nothing raises `RunNotFound`. `download_neuron_files` fetches one cycle's
Neuron session files for `mlflow-neuron open`.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .._record.model import DEVICE_TAG, MANIFEST, PROFILER_FOLDER, cycle_dir, cycle_of_dir, neuron_dir

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_DEST = "mlflow-neuron-open"
PARENT_TAG = "mlflow.parentRunId"


class RunNotFound(LookupError):
    """A run, experiment or model version named on the command line does not exist."""


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
        raise RunNotFound(f"no experiment named {name!r} at {client.tracking_uri}{_did_you_mean(client, name)}")
    return experiment.experiment_id


def _did_you_mean(client: MlflowClient, name: str) -> str:
    """The hint `; did you mean 'x' or 'y'?` naming the closest experiment names; "" when none is close."""
    try:
        names = [e.name for e in client.search_experiments()]
    except MlflowException:
        return ""  # the hint is a courtesy: never hide the real error behind a second one
    close = [repr(n) for n in difflib.get_close_matches(name, names, n=3)]
    if not close:
        return ""
    *others, last = close
    return f"; did you mean {', '.join(others) + ' or ' if others else ''}{last}?"


def labels(runs: list[Run]) -> list[str]:
    """Each run's label: its name, with its id's first 7 characters where two runs share the name."""
    names = [r.info.run_name or r.info.run_id for r in runs]
    return [n if names.count(n) == 1 else f"{n}@{r.info.run_id[:7]}" for n, r in zip(names, runs)]


def _quote(text: str) -> str:
    return text.replace("'", "\\'")


def download_neuron_files(run_id: str, step: int | None = None, dest: str | os.PathLike | None = None,
                          tracking_uri: str | None = None) -> tuple[int, Path]:  # fmt: skip
    """Downloads a cycle's Neuron files (`profiler/step_<N>/neuron/`, layout kept, to
    `<dest>/neuron/`) and its manifest; returns (the step, the local neuron folder). `step`
    defaults to the last cycle that has Neuron files.

    Raises RunNotFound for an unknown run, ValueError when the run (or that step) has no Neuron files.
    """
    client = MlflowClient(tracking_uri)
    try:
        client.get_run(run_id)
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunNotFound(f"run {run_id} does not exist") from error
        raise
    with_files = _steps_with_neuron_files(client, run_id)
    if not with_files:
        raise ValueError(f"run {run_id} has no Neuron session files (no {neuron_dir('<N>')}/ artifacts)")
    if step is None:
        step = with_files[-1]
    elif step not in with_files:
        raise ValueError(f"run {run_id} has no Neuron session files at step {step}; steps that have: "
                         f"{', '.join(map(str, with_files))}")  # fmt: skip
    target = Path(dest) if dest is not None else Path(DEFAULT_DEST) / run_id / f"step_{step}"
    target.mkdir(parents=True, exist_ok=True)
    step_dir = cycle_dir(step)
    neuron_folder = Path(client.download_artifacts(run_id, neuron_dir(step), str(target.resolve())))
    if any(item.path == f"{step_dir}/{MANIFEST}" for item in client.list_artifacts(run_id, step_dir)):
        client.download_artifacts(run_id, f"{step_dir}/{MANIFEST}", str(target.resolve()))
    return step, neuron_folder


def _steps_with_neuron_files(client: MlflowClient, run_id: str) -> list[int]:
    steps = []
    for item in client.list_artifacts(run_id, PROFILER_FOLDER):
        step = cycle_of_dir(item.path)
        if item.is_dir and step is not None and client.list_artifacts(run_id, neuron_dir(step)):
            steps.append(step)
    return sorted(steps)
