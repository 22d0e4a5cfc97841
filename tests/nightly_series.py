"""Nightly series of profiled runs, made fast: one run profiled through `MLflowProfilerCallback` on
the fake device (the template), then cloned into as many runs as a series needs.

    template = make_template(tmp_path / "template", so)           # ~15 s: one real profiled run
    series = Cloner(template, "sqlite:///x/mlflow.db", tmp_path / "artifacts")
    series.make("nightly", 200, slower_from=120)                  # ~40 ms a run, straight into the store

A clone carries everything the callback logged for the template (params, tags, every metric point,
every file under `profiler/`), with its times scaled: by the run's level (1.0, or `slower` from run
`slower_from` on) times a seeded per-step jitter (±10%, 2% stalls of 3x). Its tables
(steps.json, step_totals.json, ops.json, region_ops.json) are rewritten with those times and its
summary metrics computed from them by the delivery's own code (`_record.run_summary`). Runs are
written straight into the store and the artifact folder that a server started later serves
(`artifact_root` is the experiment's artifact location, e.g. `mlflow-artifacts:/nightly`), so
hundreds of runs take seconds. `summaries=False` makes runs as earlier versions logged them (no
summary metrics); `lie=k` logs run k's summary median doubled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
_TABLES = ("ops.json", "steps.json", "step_totals.json", "region_ops.json")
_TIME_COLUMNS = ("self_device_time_us", "self_cpu_time_us", "device_time_us", "cpu_time_us")

TEMPLATE = """
import os, pathlib, torch
import fake_device
fake_device.activate(pathlib.Path({so!r}))
import mlflow
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from mlflow_neuron import MLflowProfilerCallback

mlflow.set_tracking_uri({uri!r})
mlflow.set_experiment("template")
os.environ.update(FAKE_NEURON_KERNELS="aten::mul=100,aten::add=20", FAKE_NEURON_SEED="1", FAKE_NEURON_JITTER="0.1")
x = torch.randn(8, 64)
with mlflow.start_run(run_name="nightly") as run:
    callback = MLflowProfilerCallback(process="inline", background=False, log_timeline=False)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], on_trace_ready=callback,
                 schedule=schedule(wait=1, warmup=1, active=10, repeat=2)) as prof:
        for _ in range(24):
            with record_function("block"):
                (x * 2) + 1
            prof.step()
    callback.close()
print(run.info.run_id)
"""


@dataclass
class Template:
    """One real profiled run: its record in MLflow and its files."""

    params: dict
    tags: dict
    history: dict  # metric key -> [(value, step, timestamp)]
    files: Path  # a copy of its `profiler/` folder


def make_template(workdir: Path, so: Path) -> Template:
    """Profiles one run with the callback on the fake device (a subprocess) and reads it back."""
    from mlflow.tracking import MlflowClient

    workdir.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{workdir / 'template.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    done = subprocess.run([sys.executable, "-c", TEMPLATE.format(so=str(so), uri=uri)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the template run failed: {done.stderr[-3000:]}")
    run_id = done.stdout.strip().splitlines()[-1]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    history = {key: [(m.value, m.step, m.timestamp) for m in client.get_metric_history(run_id, key)]
               for key in run.data.metrics}  # fmt: skip
    files = Path(client.download_artifacts(run_id, "profiler", str(workdir / "files")))
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") or k == "mlflow.source.type"}
    return Template(dict(run.data.params), tags, history, files)


class Cloner:
    """Writes series of clones of a template into a store (see the module docstring)."""

    def __init__(self, template: Template, store_uri: str, artifact_dir: Path, artifact_uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.template, self.client = template, MlflowClient(store_uri)
        self.artifact_dir = Path(artifact_dir)  # the folder behind `artifact_uri`
        self.artifact_uri = artifact_uri or self.artifact_dir.as_uri()
        cycles = sorted(p.name for p in template.files.iterdir() if p.is_dir() and p.name.startswith("step_"))  # not ranks/
        self.tables = {c: {p.name: pd.read_json(p, orient="split") for p in (template.files / c).glob("*.json")
                           if p.name in _TABLES} for c in cycles}  # fmt: skip
        self.others = {c: [p.name for p in (template.files / c).iterdir() if p.name not in _TABLES] for c in cycles}

    def make(self, experiment: str, n: int, *, slower_from: int | None = None, slower: float = 1.3,
             summaries: bool = True, lie: int | None = None, seed: int = 0, start_ms: int = 1_700_000_000_000,
             run_name: str = "nightly") -> str:  # fmt: skip
        """An experiment of `n` nightly runs (a day apart, commits c0000, c0001, ...); its id.
        `run_name` may hold `{i}` (run i's number), as in "v{i:02d}"."""
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=f"{self.artifact_uri}/{experiment}")  # fmt: skip
        rng = np.random.default_rng(seed)
        for i in range(n):
            level = slower if slower_from is not None and i >= slower_from else 1.0
            self._run(experiment_id, run_name.format(i=i), i, level, rng, summaries, lie == i, start_ms + i * 86_400_000,
                      experiment)  # fmt: skip
        return experiment_id

    def _run(self, experiment_id: str, name: str, i: int, level: float, rng, summaries: bool, lie: bool, start_ms: int,
             experiment: str) -> None:  # fmt: skip
        from mlflow.entities import Metric, Param, RunTag

        t = self.template
        tags = {**t.tags, "mlflow.source.git.commit": f"c{i:04d}"}
        run = self.client.create_run(experiment_id, start_time=start_ms, tags=tags, run_name=name)
        run_id = run.info.run_id
        folder = self.artifact_dir / experiment / run_id / "artifacts" / "profiler"
        _, steps = self._files(folder, level, rng)
        metrics = [Metric(k, _scaled(k, v, level), start_ms + ts % 1000, s) for k, points in t.history.items()
                   for v, s, ts in points if not k.startswith("profiler/summary/") and not k.startswith("profiler/step/")]  # fmt: skip
        metrics += [Metric(f"profiler/step/{m}", float(v), start_ms, int(s)) for m in ("self_device_time_us", "self_cpu_time_us")
                    for s, v in zip(steps["step"], steps[m])]  # fmt: skip
        if summaries:
            last = max(s for points in t.history.values() for _, s, _ in points)
            numbers = _summary_metrics(self.last_tables)
            if lie:
                numbers = {k: v * 2 if k.endswith("/median") else v for k, v in numbers.items()}
            metrics += [Metric(k, v, start_ms, last) for k, v in numbers.items()]
        params = [Param(k, v) for k, v in t.params.items()]
        for at in range(0, max(len(metrics), len(params)), 1000):
            self.client.log_batch(run_id, metrics=metrics[at:at + 1000], params=params[at:at + 100] if at == 0 else [],
                                  tags=[RunTag("mlflow_neuron.clone_factor", f"{level:g}")] if at == 0 else [])  # fmt: skip
        self.client.set_terminated(run_id, end_time=start_ms + 60_000)

    def _files(self, folder: Path, level: float, rng) -> tuple[dict, pd.DataFrame]:
        """The template's files with every step's times scaled by level x the step's jitter."""
        all_totals = []
        self.last_tables = {}
        for cycle, tables in self.tables.items():
            (folder / cycle).mkdir(parents=True, exist_ok=True)
            for other in self.others[cycle]:
                os.link(self.template.files / cycle / other, folder / cycle / other)
            totals = tables["step_totals.json"]
            jitter = rng.uniform(0.9, 1.1, len(totals)) * np.where(rng.random(len(totals)) < 0.02, 3.0, 1.0)
            by_step = dict(zip(totals["step"].astype(int), level * jitter))
            written = {}
            for name, table in tables.items():
                table = table.copy()
                scale = table["step"].astype(int).map(by_step).to_numpy(float) if "step" in table else level
                for column in _TIME_COLUMNS:
                    if column in table:
                        table[column] = table[column].to_numpy(float) * scale
                table.to_json(folder / cycle / name, orient="split", index=False)
                written[name] = table
            self.last_tables[cycle] = written
            all_totals.append(written["step_totals.json"])
        return by_step, pd.concat(all_totals, ignore_index=True)


def _scaled(key: str, value: float, level: float) -> float:
    return value * level if "time_us" in key and not key.startswith("system/") else value


def _summary_metrics(tables: dict[str, dict[str, pd.DataFrame]]) -> dict[str, float]:
    """The run's summary metrics from its (rewritten) tables, by the delivery's own code."""
    from mlflow_neuron._record.run_summary import RunSteps

    steps = RunSteps()
    steps.device_profiled = True
    for cycle, files in tables.items():
        number = int(cycle.split("_")[1])
        rows = files["steps.json"]
        regions = rows[rows["kind"] == "region"] if "kind" in rows else rows.iloc[:0]
        by_step = {int(k): g.groupby("name")[["device_time_us", "cpu_time_us"]].sum() for k, g in regions.groupby("step")}
        for step, device, cpu in zip(files["step_totals.json"]["step"], files["step_totals.json"]["self_device_time_us"],
                                     files["step_totals.json"]["self_cpu_time_us"]):  # fmt: skip
            mine = by_step.get(int(step), pd.DataFrame(columns=["device_time_us", "cpu_time_us"]))
            steps.absorb({"steps": {f"{number}/{int(step)}": {
                "total": [float(device), float(cpu)],
                "regions": {name: [float(r["device_time_us"]), float(r["cpu_time_us"])] for name, r in mine.iterrows()},
            }}})  # fmt: skip
    return steps.metrics()
