"""What the training thread makes of one profiler cycle: a `CycleJob`, and nothing slower.

The cycle's numbers are read later, off the training thread; here only their source is chosen:

- for the helper process: the cycle's chrome trace, saved now by Kineto's C++ writer (as
  `tensorboard_trace_handler` does), or the one a handler or the Neuron session wrote;
- in-process: the cycle's Kineto results, held for the sender to read (`KinetoCycle`);
- where this torch can't be read that way: torch's own `prof.events()` parse, now, since it
  needs the profiler.

It also finds the files the cycle wrote under `profile_output_dir` and stages the framework trace.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .._delivery.outbox import link_or_copy
from .._record.job import CycleJob
from .._record.keys import NEURON_SUMMARY_PREFIX
from .._neuron.manifest import manifest
from .._record.model import TRACE, cycle_dir, neuron_dir as neuron_dir_of
from .._neuron import layout
from .._device.devices import device_peak, profiled_device
from .._neuron.torch_neuronx import neuron_settings
from .._neuron.explorer_run import announce as announce_explorer
from .._neuron.output_files import UPLOAD, FoundFile, OutputFolderWatcher
from .._trace.device_names import CPU
from .._trace.function_events import extract_cycle
from .._trace.kineto import deferred_trace_save, event_list, kineto_cycle
from .._trace.profile import PRESENT
from .._trace.summarize import ChromeTraceFile, CycleSettings, CycleSummary, Summarized
from .._trace.table import NAME_WIDTH
from .adaptive import AdaptiveSchedule, describe_cycle
from .distributed import Rank
from .settings import profiling_params

_log = logging.getLogger("mlflow_neuron")


class CycleReader:
    """Turns each cycle of one callback's profiles into a `CycleJob`."""

    def __init__(self, reporter: Any, rank: Rank, *, all_ranks: bool, profile_output_dir: str | None,
                 max_file_bytes: int | None, export_trace: bool, log_timeline: bool, timeline_max_spans: int,
                 created_ns: int, peak: dict | None = None) -> None:  # fmt: skip
        self.reporter = reporter
        self.rank = rank
        self.all_ranks = all_ranks
        self.profile_output_dir = profile_output_dir
        self.max_file_bytes = max_file_bytes
        self.export_trace = export_trace
        self.log_timeline = log_timeline
        self.timeline_max_spans = timeline_max_spans
        self.summary_tool = layout.neuron_summary_tool()
        self._explorer_announced = False  # the user is told once that Explorer will run
        self.peak = peak  # the user's (the callback's `peaks`), else the device's (`device_peak`)
        self._created_ns = created_ns
        self._watcher: OutputFolderWatcher | None = None
        self._params_read = False
        self._events_seen = 0  # for acc_events profiles, whose event list keeps earlier cycles
        self.schedule: AdaptiveSchedule | None = None  # the callback's own schedule: why each cycle was captured

    def read(self, prof: Any, exported: list[str], hand_off: bool, staged_dir: Path | None = None) -> CycleJob:
        """The cycle as a job; `hand_off`: another process may read it, so save its trace now (into
        `staged_dir`, its entry's folder in the outbox; default: a temporary folder)."""
        step = int(getattr(prof, "step_num", 0))
        job = CycleJob(step=step, timestamp_ms=int(time.time() * 1000),
                       artifact_dir=cycle_dir(step) if self.rank.is_primary else cycle_dir(step, self.rank.rank),
                       staged_dir=staged_dir or Path(tempfile.mkdtemp(prefix="mlflow-neuron-")),
                       register_table=self.rank.is_primary)  # fmt: skip
        job = self._fill(job, prof, exported, hand_off)
        describe_cycle(job, prof, self.schedule, self.rank.is_primary)
        return job

    def _fill(self, job: CycleJob, prof: Any, exported: list[str], hand_off: bool) -> CycleJob:
        step = job.step
        device = profiled_device(prof)
        output_dir = self.profile_output_dir or neuron_settings(getattr(prof, "experimental_config", None)).get(
            "profile_output_dir")  # fmt: skip
        primary, logs_metrics = self.rank.is_primary, self.rank.is_primary or self.all_ranks
        neuron_dir = neuron_dir_of(step)  # every rank's files: the Neuron layout separates them by pid
        found = self._new_output_files(output_dir)
        job.uploads = tuple((str(f.path), _parent(f"{neuron_dir}/{f.relative_path}")) for f in found
                            if f.decision == UPLOAD)  # fmt: skip
        trace_source = None
        if logs_metrics:
            settings = CycleSettings(device, device != CPU, default_step=max(step - 1, 0), max_spans=self.timeline_max_spans,
                                     timeline_step=step if self.log_timeline and primary else None,
                                     timeline_root=cycle_dir(step))  # fmt: skip
            if hand_off:
                trace_source = self._stage_trace(prof, job, found, exported, neuron_dir)
                job.source = self._saved_trace(job, found, settings)
            if job.source is None:
                # Only reading needs the profiler; numbers, tables and tags are made by the sender.
                job.source = self._in_process_source(prof, settings)
            if not hand_off:
                trace_source = self._stage_trace(prof, job, found, exported, neuron_dir)
            if found:  # summarized by neuron-explorer, or read from the sessions' Summary.parquet
                job.summary_tool, job.summary_sessions = self.summary_tool, _sessions(found)
                if self.summary_tool and job.summary_sessions and not self._explorer_announced:
                    self._explorer_announced = announce_explorer(self.summary_tool)
                if not primary:
                    job.summary_prefix = f"{NEURON_SUMMARY_PREFIX}/rank_{self.rank.rank}"
        else:  # its trace serves the rank summary only: saved as rank 0's is, never uploaded
            job.upload_trace = False
            self._stage_trace(prof, job, found, exported, neuron_dir)
            if hand_off:
                self._export_now(job)
        job.rank_summary = {"rank": self.rank.rank, "world_size": self.rank.world_size, "host": self.rank.host,
                            "trace": _framework_trace(found)}  # fmt: skip
        if logs_metrics:
            job.peak = self._peak(device)
        if primary and not self._params_read:
            job.params = profiling_params(prof, device=device, output_dir=output_dir)
            self._params_read = True
        job.manifest = manifest(found, neuron_dir=neuron_dir, output_dir=output_dir, trace_source=trace_source,
                                max_file_bytes=self.max_file_bytes, rank=self.rank.rank)  # fmt: skip
        return job

    def _saved_trace(self, job: CycleJob, found: list[FoundFile], settings: CycleSettings) -> ChromeTraceFile | None:
        """The trace the helper process reads: a handler's or the Neuron session's, else the one
        saved now by Kineto's C++ writer. None: read in-process."""
        if not self._export_now(job):
            return None
        if job.raw_trace is not None and job.raw_trace.exists():
            return ChromeTraceFile(str(job.raw_trace), settings, fallback=str(job.staged_dir / TRACE))
        neuron_trace = _framework_trace(found)
        return ChromeTraceFile(neuron_trace, settings) if neuron_trace is not None else None

    def _export_now(self, job: CycleJob) -> bool:
        """Runs the job's deferred trace export now (Kineto's own JSON writer, as tensorboard's
        handler): another process reads the trace. False: it failed (said once; no trace then)."""
        if job.trace_export is None:
            return True
        try:
            job.trace_export(job.raw_trace)
            return True
        except Exception as error:  # noqa: BLE001 - read in-process, upload without a trace
            self.reporter.problem("trace_export", "could not export the framework trace", error)
            job.raw_trace = None
            return False
        finally:
            job.trace_export = None

    def memory_source(self, prof: Any, job: CycleJob) -> Any:
        """The cycle's Kineto results, for a drain in this process to read instead of the saved trace
        (Kineto's JSON writer turns a non-ASCII op name into "unknown"); None where this torch or
        this job does not allow it. The entry on disk stays the durable copy."""
        settings = getattr(job.source, "settings", None)
        return kineto_cycle(prof, settings) if isinstance(job.source, ChromeTraceFile) and settings else None

    def _in_process_source(self, prof: Any, settings: CycleSettings) -> Any:
        """The cycle's Kineto results, read later by the sender; where this torch does not allow
        that, torch's own `prof.events()` parse, now (it needs the profiler), without a timeline."""
        cycle = kineto_cycle(prof, settings)
        if cycle is not None:
            return cycle
        _log.debug("profiler step %s read through prof.events(): the fast path does not read this profile "
                   "(torch %s)%s", getattr(prof, "step_num", "?"), torch.__version__,
                   "; it gets no timeline" if settings.timeline_step is not None else "")  # fmt: skip
        try:
            events = prof.events()
        except Exception as error:  # noqa: BLE001 - e.g. trace_only configs have no events
            self.reporter.problem("events", "the profiler gave no events (per-op metrics are empty)", error)
            events = event_list([], None)
        if getattr(prof, "acc_events", False):
            # torch puts a cycle's new events first and appends the earlier cycles' after them.
            total = len(events)
            events = event_list(events[: total - self._events_seen], events)
            self._events_seen = total
        profile = extract_cycle(events, device=settings.device, device_profiled=settings.device_profiled,
                                default_step=settings.default_step)  # fmt: skip
        sort_by = "self_device_time_total" if profile.device_time == PRESENT else "self_cpu_time_total"
        table = events.key_averages().table(sort_by=sort_by, row_limit=-1, max_name_column_width=NAME_WIDTH)
        return Summarized(CycleSummary(profile, table))

    def _peak(self, device: str) -> dict | None:
        """The device's limits for ops.json's % of peak; a peaks file that cannot be read is reported once."""
        try:
            return self.peak or device_peak(device)
        except Exception as error:  # noqa: BLE001 - the cycle's numbers go without it
            self.reporter.problem("peaks", f"no % of peak in ops.json: {error}", error)
            return None

    def _new_output_files(self, output_dir: str | None) -> list[FoundFile]:
        if not output_dir:
            return []
        if self._watcher is None or str(self._watcher.root) != str(output_dir):
            self._watcher = OutputFolderWatcher(output_dir, max_file_bytes=self.max_file_bytes,
                                                since_ns=self._created_ns - 2_000_000_000)  # fmt: skip
        try:
            return self._watcher.new_files()
        except FileNotFoundError:
            self.reporter.problem(
                "output_dir_missing",
                f"profile_output_dir {output_dir} does not exist; no Neuron files were uploaded "
                "(metrics and the framework trace still were)",
            )
            return []

    def _stage_trace(self, prof: Any, job: CycleJob, found: list[FoundFile], exported: list[str],
                     neuron_dir: str) -> str | None:  # fmt: skip
        """Where the framework trace comes from. Sets the job's raw copy (gzipped into its staged
        folder later) unless a Neuron session has the trace, and its deferred export, if any.

        Export and gzip happen off the training thread where torch allows; here the trace is at
        most linked or, on old torch, exported."""
        neuron_trace = next((f for f in found if f.is_framework_trace), None)
        if neuron_trace is not None:
            return f"{neuron_dir}/{neuron_trace.relative_path}"
        for path in reversed(exported):
            if os.path.isfile(path):
                job.raw_trace = job.staged_dir / ("raw_trace.json.gz" if path.endswith(".gz") else "raw_trace.json")
                link_or_copy(path, job.raw_trace)
                return path
        if not self.export_trace:
            return None
        raw = job.staged_dir / "raw_trace.json"
        deferred = deferred_trace_save(prof)
        if deferred is not None:
            job.raw_trace, job.trace_export = raw, deferred
            return "export_chrome_trace"
        try:
            try:
                prof.export_chrome_trace(str(raw))
            except RuntimeError:
                # Kineto saves a cycle's trace once; a handler may have used that save already.
                prof.export_chrome_trace(str(raw), use_python_export=True)
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("trace_export", "could not export the framework trace", error)
            return None
        job.raw_trace = raw
        return "export_chrome_trace"


def _framework_trace(found: list[FoundFile]) -> str | None:
    """The framework trace a Neuron session wrote this cycle, if any."""
    trace = next((f for f in found if f.is_framework_trace), None)
    return str(trace.path) if trace is not None else None


def _sessions(found: list[FoundFile]) -> tuple[str, ...]:
    """The capture session folders among a cycle's new files (summarized by Neuron Explorer)."""
    by_folder: dict[str, list[str]] = {}
    for f in found:
        by_folder.setdefault(str(f.path.parent), []).append(f.path.name)
    return tuple(folder for folder, names in sorted(by_folder.items()) if layout.is_neuron_session(names))


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]
