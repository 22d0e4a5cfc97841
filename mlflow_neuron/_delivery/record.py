"""What one cycle sends to MLflow, decided without talking to MLflow.

The training thread produces a `CycleRecord`: numbers, tables and paths, nothing written yet.
`materialize` (run by the background sender) writes the generated files and gzips the trace,
giving a `Delivery`: plain data whose files all lie on disk. A delivery can be sent now, retried,
or stored in the outbox and replayed later; sending it twice leaves the same data once.
"""

from __future__ import annotations

import gzip
import json
import math
import shlex
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .._neuron import devices as _devices
from .._neuron import output_files as _files
from .._neuron import summary as _neuron_summary
from .._trace.function_events import KERNEL, NOT_PROFILED, OP, PRESENT, CycleProfile
from .._delivery.keys import PREFIX, OpKeys, metric_key, readable_key, total_key

DEVICE_TAG = "mlflow_neuron.device"
DEVICE_TIME_TAG = "mlflow_neuron.device_time"

OPS_TABLE = "ops.json"
KEY_AVERAGES = "key_averages.txt"
MANIFEST = "manifest.json"
TRACE = "trace.json.gz"
STEPS_TABLE = "steps.json"  # per-step samples: one row per (profiler step, op), log_table layout
STEP_TOTALS_TABLE = "step_totals.json"  # one row per profiler step: its totals and top-level ATen calls
STEP_METRICS = ("self_device_time_us", "self_cpu_time_us")  # profiler/step/<metric>, one point per step
TIMELINE = "timeline.json"  # the cycle's span tree (`_timeline.Timeline`): the MLflow trace, the HTML report's SVG

PER_OP_METRICS = ("self_device_time_us", "self_cpu_time_us", "calls")


@dataclass(frozen=True)
class RunRef:
    """Which run a delivery belongs to. A run the callback creates itself is known, until it
    exists, by `run_key` (a tag), so that replaying from the outbox creates it only once."""

    tracking_uri: str
    run_id: str | None = None
    experiment_id: str | None = None
    run_name: str | None = None
    run_key: str | None = None


@dataclass(frozen=True)
class Delivery:
    """A cycle ready to send: its files lie on disk, the rest is in these fields."""

    step: int
    timestamp_ms: int
    artifact_dir: str  # "profiler/step_<N>" (rank 0) or "profiler/step_<N>/rank_<r>"
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    files_dir: str | None = None  # generated files, uploaded as they lie under artifact_dir
    uploads: tuple[tuple[str, str], ...] = ()  # (local file, artifact folder relative to the run)
    table: str | None = None  # artifact path of an ops table to register for the UI
    series: tuple[tuple[str, float, int], ...] = ()  # (key, value, step): points at steps of their own
    timeline: str | None = None  # a file in files_dir holding the cycle's Timeline, logged as a trace


@dataclass
class CycleRecord:
    """What the training thread read from one cycle; files are written later, off that thread."""

    step: int
    timestamp_ms: int
    artifact_dir: str
    staged_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    ops_table: pd.DataFrame | None = None
    step_tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # file name -> table
    series: tuple[tuple[str, float, int], ...] = ()
    key_averages: str | None = None
    timeline: object | None = None  # a `_timeline.Timeline` (rank 0, `log_timeline=True`)
    manifest: dict = field(default_factory=dict)
    raw_trace: Path | None = None  # uncompressed framework trace to gzip into the staged folder
    trace_export: Callable[[Path], None] | None = None  # writes raw_trace first, off the training thread
    uploads: tuple[tuple[str, str], ...] = ()
    register_table: bool = False
    complete: Callable[[CycleRecord], None] | None = None  # fills numbers, tables and tags in
    summary_tool: str | None = None  # neuron-explorer, to summarize the cycle's capture sessions
    summary_sessions: tuple[str, ...] = ()
    summary_prefix: str = _devices.NEURON_SUMMARY_PREFIX
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, message) for the sender to report
    _delivery: Delivery | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def materialize(self) -> Delivery:
        """Writes the generated files (once, whichever thread asks first)."""
        with self._lock:
            if self._delivery is None:
                self._delivery = self._write()
            return self._delivery

    def _write(self) -> Delivery:
        if self.complete is not None:
            self.complete(self)
            self.complete = None
        staged = self.staged_dir
        staged.mkdir(parents=True, exist_ok=True)
        table = None
        if self.ops_table is not None:
            write_table(self.ops_table, staged / OPS_TABLE)
            table = f"{self.artifact_dir}/{OPS_TABLE}" if self.register_table else None
        for name, frame in self.step_tables.items():
            write_table(frame, staged / name)
        if self.key_averages is not None:
            (staged / KEY_AVERAGES).write_text(self.key_averages, encoding="utf-8")
        if self.timeline is not None:
            (staged / TIMELINE).write_text(self.timeline.to_json(), encoding="utf-8")
        if self.trace_export is not None and self.raw_trace is not None:
            try:
                self.trace_export(self.raw_trace)
            except Exception as error:  # noqa: BLE001 - the rest of the cycle still goes
                self.problems.append(("trace_export", f"could not export the framework trace: {type(error).__name__}: {error}"))
            self.trace_export = None  # the Kineto results it holds are not needed any more
        if self.raw_trace is not None and self.raw_trace.exists():
            gzip_file(self.raw_trace, staged / TRACE)
            self.raw_trace.unlink()
        (staged / MANIFEST).write_text(json.dumps(self.manifest, indent=2), encoding="utf-8")
        return Delivery(
            step=self.step,
            timestamp_ms=self.timestamp_ms,
            artifact_dir=self.artifact_dir,
            metrics={**self.metrics, **self._summary_metrics()},
            tags=self.tags,
            params=self.params,
            files_dir=str(staged),
            uploads=self.uploads,
            table=table,
            series=self.series,
            timeline=TIMELINE if self.timeline is not None else None,
        )


    def _summary_metrics(self) -> dict[str, float]:
        """Neuron Explorer's summary of each capture session: the tool's JSON where it runs,
        else the session's `Summary.parquet` tables (see `_neuron_summary`). The models of all
        the cycle's sessions are logged together; the flat keys only when there is one model."""
        everything: dict[str, dict[str, float]] = {}
        for session in self.summary_sessions:
            models = {}
            if self.summary_tool:
                try:
                    models = _neuron_summary.run_summary_tool(self.summary_tool, session)
                except _neuron_summary.SummaryError as error:
                    self.problems.append(("neuron_summary", f"Neuron Explorer summary of {session} failed: {error}"))
            if not models:
                try:
                    models = _neuron_summary.parquet_summaries(session)
                except _neuron_summary.SummaryError as error:
                    self.problems.append(("neuron_summary", f"Summary.parquet of {session}: {error}"))
            repeated = sorted(set(models) & set(everything))
            if repeated:
                self.problems.append(("neuron_summary_repeated", f"model(s) {', '.join(repeated)} were summarized "
                                      f"in several sessions of step {self.step}; the last one's numbers are logged"))
            everything.update(models)
        try:
            metrics = _neuron_summary.summary_metrics(everything, self.summary_prefix)
        except ValueError as error:  # a bad MLFLOW_NEURON_PERCENT_SCALE
            self.problems.append(("neuron_summary", str(error)))
            return {}
        return split_non_finite(metrics)[0]


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """The layout `MlflowClient.log_table` writes, so the UI shows the file as a table."""
    frame.to_json(path, orient="split", index=False, date_format="iso")


def gzip_file(source: Path, target: Path) -> None:
    """Streams `source` into gzip `target` (constant memory); copies a file already gzipped."""
    if source.suffix == ".gz":
        shutil.copyfile(source, target)
        return
    with open(source, "rb") as fin, gzip.open(target, "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1024 * 1024)


def cycle_metrics(profile: CycleProfile, keys: OpKeys, top_k: int, rank_prefix: str = "") -> dict[str, float]:
    """Per-op metrics for the `top_k` costliest host ops, plus the cycle's totals."""
    # Every host op is keyed, not just the top ones, so which name wins a clash never depends on k.
    op_keys = keys.keys([op.name for op in profile.ops if op.kind == OP])
    top = profile.top_ops(top_k)
    # Without device activity there is no per-op device time to chart, only zeros (the total stays).
    kinds = PER_OP_METRICS if profile.device_time != NOT_PROFILED else PER_OP_METRICS[1:]
    metrics = {}
    for op in top:
        for kind in kinds:
            metrics[metric_key(kind, op_keys[op.name], rank_prefix)] = float(getattr(op, kind))
    totals = {
        "self_device_time_us": profile.total_self_device_time_us,
        "self_cpu_time_us": profile.total_self_cpu_time_us,
        "unattributed_device_time_us": max(
            profile.total_self_device_time_us - profile.attributed_device_time_us, 0.0
        ),
        "aten_calls": profile.aten_calls,
        "active_steps": profile.active_steps,
    }
    metrics.update({total_key(kind, rank_prefix): float(v) for kind, v in totals.items()})
    return metrics


def split_non_finite(metrics: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Finite metrics, and the keys left out: MLflow stores NaN but turns inf into 1.8e308."""
    finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
    return finite, sorted(set(metrics) - set(finite))


def ops_table(profile: CycleProfile, keys: OpKeys) -> pd.DataFrame:
    """Every op of the cycle with the metric key it has (or would have) under `profiler/...`.

    `annotation` marks ranges (`record_function`, `ProfilerStep*`) rather than ops. Without device
    time, the CPU columns come first: the UI shows a table's first columns without scrolling."""
    frame = profile.to_frame()
    host_ops = [op.name for op in profile.ops if op.kind == OP]
    key_of = keys.keys(host_ops)
    frame.insert(2, "metric_key", [key_of.get(n, "") if k == OP else "" for n, k in zip(frame.name, frame.kind)])
    total = profile.total_self_device_time_us
    frame["share_of_device_time"] = frame.self_device_time_us / total if total else 0.0
    # Kernel rows repeat time their op rows already carry; the share column is only for op rows.
    frame.loc[frame.kind == KERNEL, "share_of_device_time"] = 0.0
    frame["annotation"] = [k == OP and n in profile.annotations for n, k in zip(frame.name, frame.kind)]
    if profile.device_time != PRESENT:
        cpu, device = ["self_cpu_time_us", "cpu_time_us"], ["self_device_time_us", "device_time_us"]
        first = ["name", "metric_key", "kind", "calls"]
        frame = frame[first + cpu + device + [c for c in frame.columns if c not in first + cpu + device]]
    return frame


def step_tables(profile: CycleProfile) -> dict[str, pd.DataFrame]:
    """The cycle's per-step samples: every op and kernel per step, and each step's totals."""
    totals = pd.DataFrame(
        [(t.step, t.self_device_time_us, t.self_cpu_time_us, t.aten_calls) for t in profile.step_totals],
        columns=["step", "self_device_time_us", "self_cpu_time_us", "aten_calls"],
    )
    return {STEPS_TABLE: profile.steps_frame(), STEP_TOTALS_TABLE: totals}


def step_series(profile: CycleProfile, rank_prefix: str = "") -> tuple[tuple[str, float, int], ...]:
    """`profiler/step/<metric>`: each active step's total at that step's own number, so MLflow
    draws one point per step (noise and outliers show) next to the per-cycle sums."""
    kinds = STEP_METRICS if profile.device_time != NOT_PROFILED else STEP_METRICS[1:]
    return tuple(
        (f"{PREFIX}/{rank_prefix}step/{kind}", float(getattr(total, kind)), total.step)
        for total in profile.step_totals
        for kind in kinds
    )


def manifest(
    found: list[_files.FoundFile],
    *,
    neuron_dir: str,
    output_dir: str | None,
    trace_source: str | None,
    max_file_bytes: int | None,
    rank: int,
    attribution: dict | None = None,
) -> dict:
    """manifest.json: where the cycle's files went, each NTFF with its NEFF; with `attribution`
    (ingest: how device events were linked to ops, and how much device time no op carries)."""
    views = neuron_explorer_views(found, neuron_dir)
    neff_of = {pair["ntff"]: pair["neff"] for pair in views["neuron_pairs"]}
    files = []
    for f in found:
        entry = {
            "artifact_path": f"{neuron_dir}/{f.relative_path}",
            "source": str(f.path),
            "size_bytes": f.size_bytes,
            "uploaded": f.decision == _files.UPLOAD,
            "reason": None if f.decision == _files.UPLOAD else f.decision,
            "sha256": None,  # of the bytes uploaded, filled in by the uploader (_uploads.record_checksums)
        }
        if entry["artifact_path"] in neff_of:  # a device trace names the NEFF it can be read with
            entry["neff"] = neff_of[entry["artifact_path"]]
        files.append(entry)
    document = {
        "rank": rank,
        "profile_output_dir": output_dir,
        "max_file_bytes": max_file_bytes,
        "framework_trace": trace_source,
        "files": files,
        **views,
    }
    if attribution is not None:
        document["attribution"] = attribution
    return document


def neuron_explorer_views(found: list[_files.FoundFile], neuron_dir: str) -> dict:
    """Each NTFF with its NEFF, and the `neuron-explorer view` command lines that open a pair or
    a session once `neuron_dir` is downloaded (`mlflow-neuron open`): paths are relative to it."""
    relative = [f.relative_path for f in found if not f.path.is_symlink()]
    pairs = _devices.ntff_pairs(relative)
    sessions = sorted({p.rpartition("/")[0] for p in relative if p.endswith((".ntff", ".neff"))})
    return {
        "neuron_views_relative_to": neuron_dir if pairs or sessions else None,
        "neuron_pairs": [
            {
                "ntff": f"{neuron_dir}/{ntff}",
                "neff": f"{neuron_dir}/{neff}" if neff else None,
                "view_command": shlex.join(_devices.view_pair_command(neff, ntff)) if neff else None,
            }
            for ntff, neff in sorted(pairs.items())
        ],
        "neuron_sessions": [
            {
                "artifact_path": f"{neuron_dir}/{session}" if session else neuron_dir,
                "view_command": shlex.join(_devices.view_session_command(session or ".")),
            }
            for session in sessions
        ],
    }
