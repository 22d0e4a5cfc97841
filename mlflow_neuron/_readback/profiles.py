"""Loading found runs back from MLflow as `RunProfile`s (read only).

`comparison.compare_runs` is the whole path: find the runs (`runs`), load each one's per-step
samples over all its cycles (here, several runs at once, each through one handle on its artifact
store), compare them (`frame.compare`). Loading falls back, run by run, to what is
still there: steps.json and step_totals.json, else the `profiler/step/...` metrics, else one
sample per cycle. `load_timelines` downloads one representative step's timeline per compared run
for the HTML report.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pandas as pd
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from .._analysis.weather import HOST_METRICS, run_host
from .._analysis.model import (
    CPU_METRIC,
    DEVICE_METRIC,
    MEMORY_METRIC,
    SAMPLE_COLUMNS,
    SAMPLES_FROM_CYCLES,
    SAMPLES_FROM_METRICS,
    SAMPLES_FROM_STEPS,
    STEP_TOTAL_COLUMNS,
    TOTAL,
    RunProfile,
)
from .._analysis.region import REGION_COLUMNS, REGION_OP_COLUMNS
from .runs import RunNotFound, labels
from .._analysis.timeline_step import StepTimeline, representative_step, step_durations_us
from .._record.keys import NEURON_SUMMARY_PREFIX, PREFIX, readable_key
from .._record.model import (
    DEVICE_TAG,
    DEVICE_TIME_TAG,
    HOST_COLUMN_PREFIX,
    HOST_METRIC_PREFIX,
    PROFILER_FOLDER,
    OPS_TABLE,
    PER_OP_METRICS,
    ROTATION_TAG,
    REGION,
    REGION_OPS_TABLE,
    STEP_METRICS,
    STEP_TOTALS_TABLE,
    STEPS_TABLE,
    TIMELINE,
    capture_reasons,
    cycle_dir,
    cycle_of_dir,
)
from .._trace.neuron_fields import VERSION_TAG_PREFIX
from .._trace.timeline import Timeline

LOADERS = 4  # runs loaded at once: each waits on the server most of its time
_PARSING = threading.Lock()
TOTAL_KEYS = (DEVICE_METRIC, CPU_METRIC, "aten_calls", "active_steps", "unattributed_device_time_us")


def load_profiles(client: MlflowClient, runs: list[Run], step: int | None = None) -> list[RunProfile]:
    return named_alike(load_many(client, runs, labels(runs), step))


def named_alike(profiles: list[RunProfile]) -> list[RunProfile]:
    """The profiles with their ops named one way: a run whose ops.json expired names its ops by
    metric key, and then every run's ops are named that way."""
    if any(p.extra.get("names") == _KEY_NAMES for p in profiles):
        profiles = [p if p.extra.get("names") == _KEY_NAMES else _named_by_key(p) for p in profiles]
    return profiles


def load_many(client: MlflowClient, runs: list[Run], names: list[str | None] | None = None, step: int | None = None,
              on_loaded: Callable[[int], None] | None = None) -> list[RunProfile]:  # fmt: skip
    """`load_profile` of each run, `LOADERS` at a time (a run's requests wait on the server, one
    after another); `on_loaded(count)` after each."""
    names = names or [None] * len(runs)
    if len(runs) <= 1:
        return [load_profile(client, run, label, step) for run, label in zip(runs, names)]
    profiles = []
    with ThreadPoolExecutor(min(LOADERS, len(runs))) as pool:
        for profile in pool.map(lambda pair: load_profile(client, pair[0], pair[1], step), zip(runs, names)):
            profiles.append(profile)
            if on_loaded is not None:
                on_loaded(len(profiles))
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
    files = _Artifacts(client, run)
    cycles = sorted(
        {found for a in files.list(PROFILER_FOLDER) if (found := cycle_of_dir(a.path)) is not None}
        | {point.step for point in histories.get(f"{PREFIX}/total/active_steps")}
    )
    if not cycles:
        raise RunNotFound(f"{name} has no profiler cycles (no {cycle_dir('<N>')}/ and no profiler/total/ metrics)")
    if step is not None and step not in cycles:
        raise RunNotFound(f"{name} has no profiler cycle at step {step}; it has steps {cycles}")
    chosen = cycles if step is None else [step]
    tables = {cycle: _cycle_tables(files, cycle) for cycle in chosen}
    loaded = [_load_cycle(run, cycle, histories, tables[cycle]) for cycle in chosen]
    ops, totals, _, _, source = loaded[-1]
    regions, region_ops = _regions(tables)
    names = _KEY_NAMES if any(c[0].attrs.get("names") == _KEY_NAMES for c in loaded) else None
    return RunProfile(
        label=label or run.info.run_name or run_id,
        run_id=run_id,
        step=chosen[-1],
        ops=ops,
        totals=totals,
        device=run.data.tags.get(DEVICE_TAG, ""),
        device_time=run.data.tags.get(DEVICE_TIME_TAG, ""),
        extra={"torch_version": run.data.params.get("versions.torch", ""), "cycles": chosen, "names": names,
               "rotation": run.data.tags.get(ROTATION_TAG),
               "capture_reasons": {c: why for c, why in capture_reasons(run.data.tags).items() if c in chosen},
               "neuron_summary": {k: v for k, v in run.data.metrics.items() if k.startswith(NEURON_SUMMARY_PREFIX)},
               "neuron_versions": {k: v for k, v in run.data.tags.items() if k.startswith(VERSION_TAG_PREFIX)}},
        samples=pd.concat([c[2] for c in loaded], ignore_index=True),
        step_totals=pd.concat([c[3] for c in loaded], ignore_index=True),
        source=min((c[4] for c in loaded), key=_SOURCES.index),  # the weakest source used
        host=_host(run, chosen, histories, tables),
        regions=regions,
        region_ops=region_ops,
    )


def _regions(tables: dict[int, dict[str, pd.DataFrame]]) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The cycles' region rows (steps.json, kind region) and the ops inside them (region_ops.json)."""
    regions, inside = [], []
    for cycle, files in tables.items():
        steps = files.get(STEPS_TABLE)
        if steps is not None and "kind" in steps and (steps["kind"] == REGION).any():
            regions.append(steps[steps["kind"] == REGION].assign(cycle=cycle)[list(REGION_COLUMNS)])
        if REGION_OPS_TABLE in files:
            inside.append(files[REGION_OPS_TABLE].assign(cycle=cycle)[list(REGION_OP_COLUMNS)])
    joined = [pd.concat(found, ignore_index=True) if found else None for found in (regions, inside)]
    return joined[0], joined[1]


def _host(run: Run, cycles: list[int], histories: _Histories, tables: dict[int, dict[str, pd.DataFrame]]) -> dict[str, float]:
    """The run's `system/profile/...` figures over the chosen cycles (none: the run predates them),
    read from each cycle's step_totals.json `host_<name>` columns where it has them (the same
    numbers, without a request per metric), else from the metrics."""
    logged = [name for name in HOST_METRICS if f"{HOST_METRIC_PREFIX}{name}" in run.data.metrics]
    if not logged:
        return {}
    rows = [_host_row(tables[cycle].get(STEP_TOTALS_TABLE), logged) or
            {name: histories.at(f"{HOST_METRIC_PREFIX}{name}", cycle) for name in logged} for cycle in cycles]  # fmt: skip
    return run_host(pd.DataFrame(rows, dtype=float))


def _host_row(step_totals: pd.DataFrame | None, logged: list[str]) -> dict[str, float] | None:
    columns = [HOST_COLUMN_PREFIX + name for name in logged]
    if step_totals is None or not len(step_totals) or any(c not in step_totals for c in columns):
        return None
    return {name: float(step_totals[column].iloc[0]) for name, column in zip(logged, columns)}


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


def _load_cycle(run: Run, cycle: int, histories: _Histories, files: dict[str, pd.DataFrame]):
    """(ops, totals, samples, step totals, source) of one cycle, from its tables that still exist."""
    totals = {k: v for k in TOTAL_KEYS if (v := histories.at(f"{PREFIX}/total/{k}", cycle)) is not None}
    ops = files.get(OPS_TABLE)
    if ops is None:
        ops = _ops_from_metrics(run, cycle, histories)
    if STEPS_TABLE in files and STEP_TOTALS_TABLE in files:
        steps = files[STEPS_TABLE]
        samples = steps[steps["kind"] == "op"].assign(cycle=cycle)[list(SAMPLE_COLUMNS)]
        table = files[STEP_TOTALS_TABLE]
        step_totals = table.assign(cycle=cycle, **{MEMORY_METRIC: _peak_memory(table, run)})[list(STEP_TOTAL_COLUMNS)]
        return ops, totals, samples.reset_index(drop=True), step_totals, SAMPLES_FROM_STEPS
    active = max(int(totals.get("active_steps") or 1), 1)
    host = ops[ops["kind"] == "op"] if "kind" in ops else ops
    per_step = host.groupby("name", sort=False)[[DEVICE_METRIC, CPU_METRIC, "calls"]].sum() / active
    samples = per_step.reset_index().assign(cycle=cycle, step=cycle - 1)[list(SAMPLE_COLUMNS)]
    logged = {
        m: {p.step: p.value for p in histories.get(f"{PREFIX}/step/{m}") if cycle - active <= p.step < cycle}
        for m in STEP_METRICS
    }
    aten = totals.get("aten_calls", 0.0) / active
    if logged[CPU_METRIC]:
        steps = sorted(logged[CPU_METRIC])
        step_totals = pd.DataFrame({
            "cycle": cycle, "step": steps, CPU_METRIC: [logged[CPU_METRIC][s] for s in steps],
            DEVICE_METRIC: [logged[DEVICE_METRIC].get(s, 0.0) for s in steps], "aten_calls": aten,
            MEMORY_METRIC: float("nan"),
        })[list(STEP_TOTAL_COLUMNS)]  # fmt: skip
        return ops, totals, samples, step_totals, SAMPLES_FROM_METRICS
    step_totals = pd.DataFrame([{
        "cycle": cycle, "step": cycle - 1, "aten_calls": aten, MEMORY_METRIC: float("nan"),
        **{m: totals.get(m, 0.0) / active for m in STEP_METRICS},
    }])[list(STEP_TOTAL_COLUMNS)]  # fmt: skip
    return ops, totals, samples, step_totals, SAMPLES_FROM_CYCLES


def _peak_memory(step_totals: pd.DataFrame, run: Run) -> pd.Series | float:
    """Each step's peak memory on the run's device (its `peak_memory_bytes_<device>` column), else
    on the host; NaN without memory records (profiled without profile_memory=True)."""
    for device in (run.data.tags.get(DEVICE_TAG, ""), "cpu"):
        if f"{MEMORY_METRIC}_{device}" in step_totals:
            return step_totals[f"{MEMORY_METRIC}_{device}"]
    return float("nan")


def _cycle_tables(files: _Artifacts, cycle: int) -> dict[str, pd.DataFrame]:
    """The cycle's ops.json, steps.json and step_totals.json that still exist."""
    folder = cycle_dir(cycle)
    present = {a.path.rsplit("/", 1)[-1] for a in files.list(folder)}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for file in (OPS_TABLE, STEPS_TABLE, STEP_TOTALS_TABLE, REGION_OPS_TABLE):
            if file in present:
                path = files.download(f"{folder}/{file}", Path(tmp))
                with _PARSING:  # pandas hides its own date-guessing warnings with catch_warnings: one thread at a time
                    tables[file] = pd.read_json(path, orient="split")
    return tables


class _Artifacts:
    """One run's artifact store, opened once: `client.list_artifacts` and `download_artifacts` look
    the run up again on every call, and a download lists its path first (three requests a file
    through a server, where one does)."""

    def __init__(self, client: MlflowClient, run: Run) -> None:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        self.repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=client.tracking_uri)

    def list(self, path: str) -> list:
        return self.repo.list_artifacts(path)

    def download(self, path: str, folder: Path) -> Path:
        """A file known to exist (listed), fetched by one request where the store allows."""
        local = folder / path.rsplit("/", 1)[-1]
        fetch = getattr(self.repo, "_download_file", None)  # every MLflow store has it; public is list + fetch
        if fetch is None:
            return Path(self.repo.download_artifacts(path, str(folder)))
        fetch(path, str(local))
        return local


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
        [{"name": k, "kind": "op", "calls": v.get("calls", 0.0), DEVICE_METRIC: v.get(DEVICE_METRIC, 0.0),
          CPU_METRIC: v.get(CPU_METRIC, 0.0)} for k, v in sorted(rows.items())],
        columns=["name", "kind", "calls", DEVICE_METRIC, CPU_METRIC],
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
    client = MlflowClient(tracking_uri)
    what = "self device time" if frame.attrs["metric"] == DEVICE_METRIC else "self CPU time"
    found = {}
    for label, run_id in frame.attrs["runs"].items():
        keys = [tuple(k) for k in frame.attrs["sample_steps"][label]]
        totals = dict(zip(keys, frame.attrs["samples"][label][TOTAL]))
        if not totals:
            found[label] = StepTimeline(label, None, note="no step samples")
            continue
        cycle, step = representative_step(totals)  # (cycle, step) keys: ties go to the earlier
        folder = cycle_dir(cycle)
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
