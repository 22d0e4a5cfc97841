"""Reading profiled runs back from MLflow: finding them, and loading one cycle of each.

Runs are named the way people name them: run ids, run names within an experiment (the latest run
of that name), a parent run (its profiled children), an experiment (the children of its latest
profiled parent, or its profiled runs), or `models:/NAME/VERSION` (the run behind a version).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .._compare.frame import compare, flat
from .._compare.model import (
    SAMPLE_COLUMNS,
    SAMPLES_FROM_CYCLES,
    SAMPLES_FROM_METRICS,
    SAMPLES_FROM_STEPS,
    STEP_TOTAL_COLUMNS,
    TOTAL,
    RunProfile,
)
from .._delivery.keys import PREFIX, readable_key
from .._delivery.mlflow_io import RunLogger
from .._delivery.model import (
    DEVICE_TAG,
    DEVICE_TIME_TAG,
    MANIFEST,
    OPS_TABLE,
    PER_OP_METRICS,
    STEP_METRICS,
    STEP_TOTALS_TABLE,
    STEPS_TABLE,
    TIMELINE,
    Delivery,
    RunRef,
)
from .._delivery.record import write_table

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_DEST = "mlflow-neuron-open"
_STEP_DIR = re.compile(r"^profiler/step_(\d+)$")
_STEP_NAME = re.compile(r"^step_(\d+)$")
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
    skip_steps: int = 0,
    noise_pct: float = 2.0,
) -> pd.DataFrame:
    """Per-op comparison of profiled runs as a DataFrame (see `mlflow_neuron._compare`).

    Example::

        frame = compare_runs("rmsnorm-variants", baseline="naive")   # an experiment's latest variants
        frame.attrs["metric"], frame.attrs["fallback"]              # what was compared, and why

    `runs` is an experiment name, or a list of run ids / run names (within `experiment`) /
    parent runs / `models:/NAME/VERSION`. A run's samples are its profiler steps, over all its
    cycles; `step` keeps one cycle only, `skip_steps` leaves out each run's first steps.
    """
    client = MlflowClient(tracking_uri)
    if isinstance(runs, str):
        experiment, runs = runs, []
    resolved = resolve_runs(client, runs, experiment)
    return compare(load_profiles(client, resolved, step), baseline, metric, skip_steps=skip_steps, noise_pct=noise_pct)


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
    profiles = [load_profile(client, run, label, step) for run, label in zip(runs, labels)]
    if any(p.extra.get("names") == _KEY_NAMES for p in profiles):
        # a run whose ops.json expired names its ops by metric key: name every run's ops that way
        profiles = [p if p.extra.get("names") == _KEY_NAMES else _named_by_key(p) for p in profiles]
    return profiles


def load_profile(client: MlflowClient, run: Run, label: str | None = None, step: int | None = None) -> RunProfile:
    """A run's per-step samples (every cycle, or cycle `step`) and its last cycle's table and totals.

    Samples come from each cycle's steps.json and step_totals.json. Where those are gone (artifact
    stores expire files) or predate them, they come from the `profiler/step/...` metrics, else one
    sample per cycle: its sums divided by its active steps. Without ops.json, per-op numbers come
    from the per-op metrics, named by metric key.
    """
    run_id = run.info.run_id
    name = f"run {run.info.run_name} ({run_id})"
    histories = _Histories(client, run_id)
    cycles = sorted(
        {int(m.group(1)) for a in client.list_artifacts(run_id, "profiler") if (m := _STEP_DIR.match(a.path))}
        | {point.step for point in histories.get(f"{PREFIX}/total/active_steps")}
    )
    if not cycles:
        raise RunNotFound(f"{name} has no profiler cycles (no profiler/step_<N>/ and no profiler/total/ metrics)")
    if step is not None and step not in cycles:
        raise RunNotFound(f"{name} has no profiler cycle at step {step}; it has steps {cycles}")
    chosen = cycles if step is None else [step]
    loaded = [_load_cycle(client, run, cycle, histories) for cycle in chosen]
    ops, totals, _, _, source = loaded[-1]
    names = _KEY_NAMES if any(c[0].attrs.get("names") == _KEY_NAMES for c in loaded) else None
    return RunProfile(
        label=label or run.info.run_name or run_id,
        run_id=run_id,
        step=chosen[-1],
        ops=ops,
        totals=totals,
        device=run.data.tags.get(DEVICE_TAG, ""),
        device_time=run.data.tags.get(DEVICE_TIME_TAG, ""),
        extra={"torch_version": run.data.params.get("versions.torch", ""), "cycles": chosen, "names": names},
        samples=pd.concat([c[2] for c in loaded], ignore_index=True),
        step_totals=pd.concat([c[3] for c in loaded], ignore_index=True),
        source=min((c[4] for c in loaded), key=_SOURCES.index),  # the weakest source used
    )


_KEY_NAMES = "metric keys"
_SOURCES = (SAMPLES_FROM_CYCLES, SAMPLES_FROM_METRICS, SAMPLES_FROM_STEPS)


class _Histories:
    """Metric histories of one run, each fetched once."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client, self.run_id, self._seen = client, run_id, {}

    def get(self, key: str) -> list:
        if key not in self._seen:
            self._seen[key] = self.client.get_metric_history(self.run_id, key)
        return self._seen[key]

    def at(self, key: str, step: int) -> float | None:
        points = [m.value for m in self.get(key) if m.step == step]
        return points[-1] if points else None


def _load_cycle(client: MlflowClient, run: Run, cycle: int, histories: _Histories):
    """(ops, totals, samples, step totals, source) of one cycle."""
    totals = {k: v for k in TOTAL_KEYS if (v := histories.at(f"{PREFIX}/total/{k}", cycle)) is not None}
    files = _cycle_tables(client, run.info.run_id, cycle)
    ops = files.get(OPS_TABLE)
    if ops is None:
        ops = _ops_from_metrics(run, cycle, histories)
    if STEPS_TABLE in files and STEP_TOTALS_TABLE in files:
        steps = files[STEPS_TABLE]
        samples = steps[steps["kind"] == "op"].assign(cycle=cycle)[list(SAMPLE_COLUMNS)]
        step_totals = files[STEP_TOTALS_TABLE].assign(cycle=cycle)[list(STEP_TOTAL_COLUMNS)]
        return ops, totals, samples.reset_index(drop=True), step_totals, SAMPLES_FROM_STEPS
    active = max(int(totals.get("active_steps") or 1), 1)
    host = ops[ops["kind"] == "op"] if "kind" in ops else ops
    per_step = host.groupby("name", sort=False)[["self_device_time_us", "self_cpu_time_us", "calls"]].sum() / active
    samples = per_step.reset_index().assign(cycle=cycle, step=cycle - 1)[list(SAMPLE_COLUMNS)]
    logged = {
        m: {p.step: p.value for p in histories.get(f"{PREFIX}/step/{m}") if cycle - active <= p.step < cycle}
        for m in STEP_METRICS
    }
    aten = totals.get("aten_calls", 0.0) / active
    if logged["self_cpu_time_us"]:
        steps = sorted(logged["self_cpu_time_us"])
        step_totals = pd.DataFrame({
            "cycle": cycle, "step": steps, "self_cpu_time_us": [logged["self_cpu_time_us"][s] for s in steps],
            "self_device_time_us": [logged["self_device_time_us"].get(s, 0.0) for s in steps], "aten_calls": aten,
        })[list(STEP_TOTAL_COLUMNS)]  # fmt: skip
        return ops, totals, samples, step_totals, SAMPLES_FROM_METRICS
    step_totals = pd.DataFrame([{
        "cycle": cycle, "step": cycle - 1, "aten_calls": aten,
        **{m: totals.get(m, 0.0) / active for m in STEP_METRICS},
    }])[list(STEP_TOTAL_COLUMNS)]  # fmt: skip
    return ops, totals, samples, step_totals, SAMPLES_FROM_CYCLES


def _cycle_tables(client: MlflowClient, run_id: str, cycle: int) -> dict[str, pd.DataFrame]:
    """The cycle's ops.json, steps.json and step_totals.json that still exist."""
    folder = f"profiler/step_{cycle}"
    present = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id, folder)}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for file in (OPS_TABLE, STEPS_TABLE, STEP_TOTALS_TABLE):
            if file in present:
                path = client.download_artifacts(run_id, f"{folder}/{file}", tmp)
                tables[file] = pd.read_json(Path(path), orient="split")
    return tables


def _ops_from_metrics(run: Run, cycle: int, histories: _Histories) -> pd.DataFrame:
    """A cycle's op table rebuilt from its per-op metrics (top-k ops, named by metric key)."""
    rows: dict[str, dict[str, float]] = {}
    for key in run.data.metrics:
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == PREFIX and parts[1] in PER_OP_METRICS:
            value = histories.at(key, cycle)
            if value is not None:
                rows.setdefault(parts[2], {})[parts[1]] = value
    frame = pd.DataFrame(
        [{"name": k, "kind": "op", "calls": v.get("calls", 0.0), "self_device_time_us": v.get("self_device_time_us", 0.0),
          "self_cpu_time_us": v.get("self_cpu_time_us", 0.0)} for k, v in sorted(rows.items())],
        columns=["name", "kind", "calls", "self_device_time_us", "self_cpu_time_us"],
    )  # fmt: skip
    frame.attrs["names"] = _KEY_NAMES
    return frame


def _named_by_key(profile: RunProfile) -> RunProfile:
    """The same profile with op names replaced by their metric keys (as ops.json lists them)."""
    ops = profile.ops
    key_of = dict(zip(ops["name"], ops["metric_key"])) if "metric_key" in ops else {}

    def rename(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(name=[key_of.get(n) or readable_key(n) for n in frame["name"]])

    return replace(profile, ops=rename(ops), samples=rename(profile.samples),
                   extra={**profile.extra, "names": _KEY_NAMES})  # fmt: skip


NO_TIMELINE = "no timeline logged for this cycle (profiled with log_timeline=False, or before timelines were logged)"


def load_timelines(frame: pd.DataFrame, tracking_uri: str | None = None) -> dict:
    """Per run of a comparison frame, its representative step's timeline for `render.html_page`.

    Example::

        frame = compare_runs("rmsnorm-variants", baseline="naive")
        page = render.html_page(frame, chart, timelines=load_timelines(frame))

    The representative step is the run's sample whose total (the compared metric, over every
    cycle, `skip_steps` left out) is closest to the median; its cycle's
    `profiler/step_<N>/timeline.json` is downloaded. Returns {label: StepTimeline}; a run without
    a timeline gets one that says why. Only the report needs this: `compare` never downloads it.
    """
    from .._trace.timeline import Timeline
    from .._compare.timeline_svg import StepTimeline, representative_step, step_durations_us

    client = MlflowClient(tracking_uri)
    what = "self device time" if frame.attrs["metric"] == "self_device_time_us" else "self CPU time"
    found = {}
    for label, run_id in frame.attrs["runs"].items():
        keys = [tuple(k) for k in frame.attrs["sample_steps"][label]]
        totals = dict(zip(keys, frame.attrs["samples"][label][TOTAL]))
        if not totals:
            found[label] = StepTimeline(label, None, note="no step samples")
            continue
        cycle, step = representative_step(totals)  # (cycle, step) keys: ties go to the earlier
        folder = f"profiler/step_{cycle}"
        if TIMELINE not in {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id, folder)}:
            found[label] = StepTimeline(label, None, step, cycle, NO_TIMELINE)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(client.download_artifacts(run_id, f"{folder}/{TIMELINE}", tmp)).read_text(encoding="utf-8")
        timeline = Timeline.from_json(text)
        note = (f"{what} {totals[(cycle, step)]:,.1f} us; the median of its {len(totals)} steps is "
                f"{_median(totals):,.1f} us")  # fmt: skip
        durations = step_durations_us(timeline)
        if step not in durations:  # samples without step numbers (older runs): the cycle's own median step
            if not durations:
                found[label] = StepTimeline(label, None, step, cycle, "the cycle's timeline has no ProfilerStep ranges")
                continue
            step = representative_step(durations)
            note = f"the step of cycle {cycle} closest to its median length ({durations[step]:,.1f} us)"
        found[label] = StepTimeline(label, timeline, step, cycle, note)
    return found


def _median(totals: dict) -> float:
    return float(pd.Series(list(totals.values())).median())


def attach_comparison(tracking_uri: str, run_id: str, frame: pd.DataFrame, files: list[Path]) -> None:
    """Logs the comparison table (shown as a table in the UI) and its rendered files under
    `comparison/`, replacing an earlier comparison there, and puts the verdicts in words into
    the run's description (its page shows them)."""
    from .._compare.publish import describe_run  # _registry reads runs through this module

    with tempfile.TemporaryDirectory() as tmp:
        write_table(flat(frame), Path(tmp, COMPARISON_TABLE))
        for path in files:
            shutil.copyfile(path, Path(tmp, Path(path).name))
        delivery = Delivery(step=0, timestamp_ms=0, artifact_dir=COMPARISON_DIR, files_dir=tmp,
                            table=f"{COMPARISON_DIR}/{COMPARISON_TABLE}")
        RunLogger(RunRef(tracking_uri, run_id)).deliver(delivery)
    describe_run(tracking_uri, run_id, frame)


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
        raise RunNotFound(f"no experiment named {name!r} at {client.tracking_uri}")
    return experiment.experiment_id


def _labels(runs: list[Run]) -> list[str]:
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
        raise ValueError(f"run {run_id} has no Neuron session files (no profiler/step_<N>/neuron/ artifacts)")
    if step is None:
        step = with_files[-1]
    elif step not in with_files:
        raise ValueError(f"run {run_id} has no Neuron session files at step {step}; steps that have: "
                         f"{', '.join(map(str, with_files))}")  # fmt: skip
    target = Path(dest) if dest is not None else Path(DEFAULT_DEST) / run_id / f"step_{step}"
    target.mkdir(parents=True, exist_ok=True)
    step_dir = f"profiler/step_{step}"
    neuron_dir = Path(client.download_artifacts(run_id, f"{step_dir}/neuron", str(target.resolve())))
    if any(item.path == f"{step_dir}/{MANIFEST}" for item in client.list_artifacts(run_id, step_dir)):
        client.download_artifacts(run_id, f"{step_dir}/{MANIFEST}", str(target.resolve()))
    return step, neuron_dir




def _steps_with_neuron_files(client: MlflowClient, run_id: str) -> list[int]:
    steps = []
    for item in client.list_artifacts(run_id, "profiler"):
        match = _STEP_NAME.match(item.path.rsplit("/", 1)[-1])
        if item.is_dir and match and client.list_artifacts(run_id, f"{item.path}/neuron"):
            steps.append(int(match.group(1)))
    return sorted(steps)
