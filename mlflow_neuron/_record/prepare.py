"""Preparing a cycle: a `CycleJob` in, a `Delivery` out, its files written. Off the training thread.

    summarize (the job's source)  ->  numbers (metrics, tables, tags)  ->  files  ->  Delivery

One `Preparer` per run and process. It keeps the op-key registry (an op keeps its key across
cycles), whether device time was seen, and the run's steps so far (`run_summary`), and reports what looks wrong through its reporter.
The training process (in-process path, and jobs handed back by a failed helper) and the helper
process each hold one; `export` / `absorb` carry that state from one to the other.
"""

from __future__ import annotations

import gzip
import json
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from .._neuron import session_summary
from .._trace.device_names import MISSING_DEVICE_TIME_HINT
from .._trace.profile import MISSING, PRESENT, CycleProfile
from .._trace.summarize import CycleSettings, CycleSummary, empty_summary
from .job import CycleJob
from .keys import OpKeys
from .model import (
    DEVICE_TAG,
    DEVICE_TIME_TAG,
    KEY_AVERAGES,
    MANIFEST,
    OPS_TABLE,
    RANK_MANIFEST_FILE,
    TIMELINE,
    TRACE,
    TRACE_SPANS,
    Delivery,
)
from .record import (
    cycle_metrics,
    host_metrics,
    ops_table,
    split_non_finite,
    step_series,
    step_tables,
    summary_metrics,
    write_table,
)
from .rank_summary import one_pass, write_rank_summary
from .run_summary import RunSteps
from .trace_text import TraceDraft, TraceText


class Preparer:
    """`node_parts`: the rank summary is staged for its node's file (`Delivery.rank_part`, taken by
    the drain: `_delivery.node_parts`, or by `ingest` for its node files), not placed at its own path."""

    def __init__(self, reporter: Any, *, top_k: int, rank: int = 0, primary: bool = True, all_ranks: bool = False,
                 node_parts: bool = False):  # fmt: skip
        self.reporter = reporter
        self.top_k = top_k
        self.rank = rank
        self.primary = primary
        self.all_ranks = all_ranks
        self.node_parts = node_parts
        self.keys = OpKeys()
        self.last_profile: CycleProfile | None = None
        self._device_time_seen = False
        self.run_steps = RunSteps()  # every step of the run so far: its summary metrics (`run_summary`)
        self._lock = threading.Lock()  # the sender, or close() storing a job, prepare jobs

    def prepare(self, job: CycleJob) -> Delivery:
        """The job's delivery, prepared once (whichever thread asks first)."""
        with job.lock:
            if job.delivery is None:
                job.delivery = self._prepare(job)
            return job.delivery

    def export(self) -> dict:
        """What a Preparer in another process must know to go on where this one is: the op keys
        handed out and whether device time was seen."""
        with self._lock:
            return {"keys": self.keys.known(), "device_time_seen": self._device_time_seen,
                    "run_steps": self.run_steps.export()}

    def absorb(self, known: dict) -> None:
        """Takes what another Preparer of the same run `export`ed."""
        with self._lock:
            self.keys.adopt(known.get("keys") or {})
            self._device_time_seen |= bool(known.get("device_time_seen"))
            self.run_steps.absorb(known.get("run_steps") or {})

    def _prepare(self, job: CycleJob) -> Delivery:
        numbers = self._numbers(job, one_pass(job, self._raw(job))) if job.source is not None else None
        made = None
        staged = job.staged_dir
        staged.mkdir(parents=True, exist_ok=True)
        metrics, series, tags, table, timeline, trace_spans = {}, (), dict(job.tags), None, None, None
        if numbers is not None:
            summary, ops, metrics, series, device_tags = numbers
            made = summary.rank_summary_error or summary.rank_summary  # None: not made in the cycle's read
            tags.update(device_tags)
            write_table(ops, staged / OPS_TABLE)
            table = f"{job.artifact_dir}/{OPS_TABLE}" if job.register_table else None
            for name, frame in step_tables(summary.profile, job.host).items():
                write_table(frame, staged / name)
            (staged / KEY_AVERAGES).write_text(job.table_note + summary.table, encoding="utf-8")
            if summary.timeline is not None:
                draft = TraceDraft.of(summary.timeline)
                (staged / TIMELINE).write_text(summary.timeline.to_json(draft.spans), encoding="utf-8")
                timeline = TIMELINE
                if draft.origin_ns:  # the trace's data too, so that sending it is only MLflow's requests
                    (staged / TRACE_SPANS).write_text(TraceText.of(draft).file_text(), encoding="utf-8")
                    trace_spans = TRACE_SPANS
        if self.primary:  # the keys carry no rank: one host's numbers per cycle
            metrics = {**metrics, **host_metrics(job.host)}
        placed = self._stage_trace(job, made)
        part = None
        if self.node_parts and placed:  # its node's file carries it; a rank sending nothing else, its manifest too
            quiet = job.source is None and not job.uploads and not job.summary_sessions
            part, placed = (placed[0][0], RANK_MANIFEST_FILE if quiet else None), ()
        (staged / (RANK_MANIFEST_FILE if part and part[1] else MANIFEST)).write_text(json.dumps(job.manifest, indent=2),
                                                                                     encoding="utf-8")  # fmt: skip
        explorer_metrics, version_tags = self._summary_metrics(job)
        return Delivery(
            step=job.step, timestamp_ms=job.timestamp_ms, artifact_dir=job.artifact_dir,
            metrics={**metrics, **explorer_metrics}, tags={**tags, **version_tags}, params=job.params, files_dir=str(staged),
            uploads=job.uploads, table=table, series=series, timeline=timeline, trace_spans=trace_spans, placed=placed,
            rank_part=part,
        )  # fmt: skip

    def _numbers(self, job: CycleJob, rank: dict | None = None) -> tuple[CycleSummary, pd.DataFrame, dict, tuple, dict]:
        """The cycle summarized (with `rank`, its rank summary in the same read), its op table,
        metrics, per-step series and device tags: one cycle at a time, since op keys are handed
        out in order."""
        with self._lock:
            summary = self._summary(job, rank)
            profile = summary.profile
            self.last_profile = profile
            if profile.device_time == MISSING:
                self.reporter.problem("device_time_missing", MISSING_DEVICE_TIME_HINT.format(device=profile.device))
            metrics, series, tags = self._metrics(profile), self._series(profile), {}
            if self.primary:  # its steps join the run's: `with_run_summary` summarizes them
                self.run_steps.add(job.step, profile)
                self._device_time_seen |= profile.device_time == PRESENT
                seen = PRESENT if self._device_time_seen else profile.device_time
                tags = {DEVICE_TAG: profile.device, DEVICE_TIME_TAG: seen}
            return summary, ops_table(profile, self.keys, job.peak), metrics, series, tags

    def with_run_summary(self, delivery: Delivery) -> Delivery:
        """`delivery` with the run's summary over every step known now, which `history` reads in
        bulk: made after this cycle's steps joined the run's and, where other processes prepare
        the run's cycles too, under the outbox's store lock, once what they wrote is taken
        (`drain.prepare`). It is logged at the run's highest cycle known, timed now, so that of
        two cycles prepared at once, the summary made last is the run's latest value."""
        if not self.primary:
            return delivery
        with self._lock:
            summary = tuple(self.run_steps.metrics().items())
            last = self.run_steps.last_cycle
            at = (max(delivery.step, last if last is not None else delivery.step), int(time.time() * 1000))
        return replace(delivery, summary=summary, summary_at=at) if summary else delivery

    def _summary(self, job: CycleJob, rank: dict | None = None) -> CycleSummary:
        try:
            summary = job.source.summarize(rank=rank) if rank is not None else job.source.summarize()
        except Exception as error:  # noqa: BLE001 - the cycle's files and trace still go
            self.reporter.problem("events", "the cycle's events could not be read (per-op metrics are empty)", error)
            settings = getattr(job.source, "settings", None) or CycleSettings("cpu", False)
            return empty_summary(settings)
        if summary.timeline_error is not None:
            self.reporter.problem("timeline", f"profiler step {job.step} has no timeline (its trace is not logged)",
                                  summary.timeline_error)  # fmt: skip
        return summary

    def _metrics(self, profile: CycleProfile) -> dict[str, float]:
        metrics = {}
        if self.primary:
            metrics.update(cycle_metrics(profile, self.keys, self.top_k))
        if self.all_ranks:
            metrics.update(cycle_metrics(profile, self.keys, self.top_k, f"rank_{self.rank}/"))
        finite, dropped = split_non_finite(metrics)
        if dropped:
            self.reporter.problem(
                "non_finite", f"{len(dropped)} metric(s) were NaN or infinite and not logged (first: {dropped[0]}); "
                "ops.json keeps the raw values",
            )  # fmt: skip
        return finite

    def _series(self, profile: CycleProfile) -> tuple[tuple[str, float, int], ...]:
        series = step_series(profile) if self.primary else ()
        if self.all_ranks:
            series += step_series(profile, f"rank_{self.rank}/")
        return series

    def _stage_trace(self, job: CycleJob, made=None) -> tuple[tuple[str, str], ...]:
        """The framework trace, gzipped into the staged folder (exported first, for in-process jobs),
        or only read for the rank summary (`job.upload_trace` False; `made`: the rank summary the
        cycle's own read gave). Returns the files placed outside the cycle's folder: its rank summary."""
        if job.trace_export is not None and job.raw_trace is not None:
            try:
                job.trace_export(job.raw_trace)
            except Exception as error:  # noqa: BLE001 - the rest of the cycle still goes
                job.problems.append(("trace_export", f"could not export the framework trace: {type(error).__name__}: {error}"))
            job.trace_export = None  # the Kineto results it holds are not needed any more
        raw = self._raw(job)
        placed = write_rank_summary(job, raw, made)
        if raw is not None:
            if job.upload_trace:
                gzip_file(raw, job.staged_dir / TRACE)
            raw.unlink()
        return placed

    @staticmethod
    def _raw(job: CycleJob) -> Path | None:
        return job.raw_trace if job.raw_trace is not None and job.raw_trace.exists() else None

    def _summary_metrics(self, job: CycleJob) -> tuple[dict[str, float], dict[str, str]]:
        """Neuron Explorer's summary of each capture session (`_neuron.session_summary`), and the
        tools' versions as tags. The models of all the cycle's sessions are logged together; the
        flat keys only when there is one model."""
        if not job.summary_sessions:
            return {}, {}
        found = session_summary.summarize_sessions(job.summary_sessions, job.summary_tool, job.step)
        job.problems.extend(found.problems)
        everything = found.models
        try:
            metrics = summary_metrics(everything, job.summary_prefix)
        except ValueError as error:  # a bad MLFLOW_NEURON_PERCENT_SCALE
            job.problems.append(("neuron_summary", str(error)))
            return {}, found.tags
        return split_non_finite(metrics)[0], found.tags


def gzip_file(source: Path, target: Path) -> None:
    """Streams `source` into gzip `target` (constant memory); copies a file already gzipped."""
    if source.suffix == ".gz":
        shutil.copyfile(source, target)
        return
    with open(source, "rb") as fin, gzip.open(target, "wb", compresslevel=1) as fout:
        shutil.copyfileobj(fin, fout, 1024 * 1024)
