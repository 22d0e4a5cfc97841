"""`MLflowProfilerCallback`: every torch.profiler cycle becomes MLflow metrics and artifacts."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._neuron import devices as _devices
from .._neuron import output_files as _files
from .._trace import kineto as _kineto
from .._neuron import monitor as _neuron_monitor
from .._delivery import outbox as _outbox
from .._delivery import record as _record
from .._capture import settings as _settings
from .._compare import render as render
from .._trace.aggregate import aggregate
from .._delivery.complete import Completer, guarded_timeline
from .._capture.distributed import broadcast_from_primary, current_rank
from .._trace.event_tree import event_tree
from .._trace.function_events import PRESENT, CycleProfile, extract_cycle
from .._delivery.handoff import Handoff
from .._delivery.mlflow_io import RunLogger, check_reachable, current_run_ref
from .._delivery.record import RunRef
from .._delivery.report import Reporter, logger
from .._delivery.sender import Sender
from .._trace.timeline import DEFAULT_MAX_SPANS, build_timeline

DEFAULT_MAX_FILE_BYTES = None  # no cap: NTFFs of gigabytes are streamed (see _uploads.py)
PROCESSES = ("helper", "inline")
_TABLE_NAME_WIDTH = 120


class MLflowProfilerCallback:
    """An `on_trace_ready` handler that logs each profiler cycle into an MLflow run.

    Example::

        from torch.profiler import ProfilerActivity, profile, schedule
        from mlflow_neuron import MLflowProfilerCallback

        with mlflow.start_run():
            with profile(
                activities=[ProfilerActivity.CPU],
                schedule=schedule(wait=2, warmup=1, active=1),
                on_trace_ready=MLflowProfilerCallback(),
            ) as prof:
                for _ in range(4):
                    train_step()
                    prof.step()

    On Trainium, pass the Neuron exporter first: ``MLflowProfilerCallback(exporter.export_trace)``.

    The training process only saves the cycle's trace (Kineto's C++ writer, as
    ``tensorboard_trace_handler`` does); a helper process parses it, writes the files and talks to
    MLflow. Cycles the server does not take are kept in a local outbox for ``mlflow-neuron sync``.
    Pending work is flushed when the profiler stops and at exit.

    Args:
        *handlers: other ``on_trace_ready`` handlers (``NeuronProfiler.export_trace``,
            ``tensorboard_trace_handler(...)``), called first, in order, each guarded.
        run_id: the run to log into. Default: the run active now, else ``MLFLOW_RUN_ID``, else
            rank 0's run (under torch.distributed), else a new run that ``close()`` ends.
        tracking_uri: default: MLflow's own default (``MLFLOW_TRACKING_URI`` or ``./mlflow.db``).
        profile_output_dir: where Neuron session files appear. Default: the
            ``profile_output_dir`` of the profiler's ``experimental_config``, if any.
        top_k: how many ops get per-op metrics; ``ops.json`` always holds every op.
        experiment_id, run_name: for a run this callback creates.
        max_file_bytes: larger profile files are listed in ``manifest.json``, not uploaded
            (default None: every file is uploaded, streamed, whatever its size).
        export_trace: export the framework trace when no handler or Neuron session provides one.
        all_ranks: also log every rank's metrics as ``profiler/rank_<r>/...`` (default: rank 0's).
        background: send from a background thread (False: on the training thread, for debugging).
        outbox: where unsent cycles are kept (default ``./mlflow-neuron-outbox``).
        max_pending: cycles that may wait in memory before the next goes to the outbox.
        retries, retry_wait_s: attempts after the first, and the first backoff (doubling).
        flush_timeout_s: one time budget, from the end of the loop to process exit, shared by
            profiler stop, ``close()`` and interpreter exit; what is not sent within it goes to the
            outbox.
        strict: re-raise errors instead of warning (default: env ``MLFLOW_NEURON_STRICT``).
        system_metrics: log ``system/neuron/...`` metrics from ``neuron-monitor`` while the run is
            active, where the tool is installed (default: MLflow's ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``).
        log_timeline: log each cycle as an MLflow trace linked to the run (root ``profiler/step_<N>``,
            its ``ProfilerStep#N`` ranges, nested ops, one span per device stream), and keep it as
            ``profiler/step_<N>/timeline.json``. Rank 0 only.
        timeline_max_spans: at most this many spans per trace (an int >= 1); the shortest ops are
            summarized as "… N more ops" spans. The cycle, its steps and its streams always stay.
        process: ``"helper"``: parsing, aggregation and MLflow I/O run in a helper process, started
            on the first cycle (one per callback); if it fails twice, cycles go the inline way, with
            one warning. ``"inline"``: a background thread of the training process does that work
            (or, with ``background=False``, the training thread itself).
    """

    def __init__(
        self,
        *handlers: Callable[[Any], Any],
        run_id: str | None = None,
        tracking_uri: str | None = None,
        profile_output_dir: str | os.PathLike | None = None,
        top_k: int = 50,
        experiment_id: str | None = None,
        run_name: str | None = None,
        max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
        export_trace: bool = True,
        all_ranks: bool = False,
        background: bool = True,
        outbox: str | os.PathLike = _outbox.DEFAULT_OUTBOX,
        max_pending: int = 8,
        retries: int = 3,
        retry_wait_s: float = 0.5,
        flush_timeout_s: float = 10.0,
        strict: bool | None = None,
        system_metrics: bool | None = None,
        log_timeline: bool = True,
        timeline_max_spans: int = DEFAULT_MAX_SPANS,
        process: str = "helper",
    ) -> None:
        _validate(handlers, top_k=top_k, max_file_bytes=max_file_bytes, max_pending=max_pending, retries=retries)
        if process not in PROCESSES:
            raise ValueError(f"process must be one of {', '.join(map(repr, PROCESSES))}; got {process!r}")
        if isinstance(timeline_max_spans, bool) or not isinstance(timeline_max_spans, int) or timeline_max_spans < 1:
            raise ValueError(f"timeline_max_spans must be an int >= 1 (default {DEFAULT_MAX_SPANS}); "
                             f"got {timeline_max_spans!r}")  # fmt: skip
        self.log_timeline = bool(log_timeline)
        self.timeline_max_spans = timeline_max_spans
        if profile_output_dir is not None and not isinstance(profile_output_dir, (str, os.PathLike)):
            raise TypeError(f"profile_output_dir must be a path or None; got {profile_output_dir!r}")
        self.handlers = handlers
        self.top_k = top_k
        self.max_file_bytes = max_file_bytes
        self.export_trace = export_trace
        self.all_ranks = all_ranks
        self.flush_timeout_s = flush_timeout_s
        self._waited_s = 0.0  # of the shutdown budget: time flush points have waited since the last cycle
        self.profile_output_dir = os.fspath(profile_output_dir) if profile_output_dir else None
        self.reporter = Reporter(strict)
        self.rank = current_rank()
        self.cycles_read = 0
        run = current_run_ref(
            run_id, tracking_uri, experiment_id=experiment_id, run_name=run_name, run_key=uuid.uuid4().hex
        )
        logger = RunLogger(run)
        self._owns_run = run.run_id is None
        if self._owns_run and self.rank.world_size > 1:
            logger.run = self._join_primary_run(logger)
        self._completer = Completer(
            self.reporter, top_k=top_k, rank=self.rank.rank, primary=self.rank.is_primary, all_ranks=all_ranks
        )
        self._sender = Sender(
            logger, self.reporter, background=background, max_pending=max_pending,
            retries=retries, retry_wait_s=retry_wait_s, outbox=outbox,
        )  # fmt: skip
        if process == "helper" and background:  # background=False: everything on the training thread
            self._sender = Handoff(self._sender, self.reporter, self._completer, exit_budget_s=flush_timeout_s)
            # A callback dropped unclosed leaves no helper behind; at exit, close() does it all.
            weakref.finalize(self, self._sender.release).atexit = False
        self._created_ns = time.time_ns()
        self._watcher: _files.OutputFolderWatcher | None = None
        self._params_read = False
        self._events_seen = 0  # for acc_events profiles, whose event list keeps earlier cycles
        self._summary_tool = _devices.neuron_summary_tool()
        self._neuron_monitor = _neuron_monitor.start_if_enabled(
            system_metrics, lambda: self.run_id, self.tracking_uri, self.reporter
        ) if self.rank.is_primary else None  # fmt: skip
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def last_profile(self) -> CycleProfile | None:
        """The latest cycle aggregated in this process (cycles the helper process reads stay there)."""
        return self._completer.last_profile

    @property
    def run_id(self) -> str | None:
        """The run's id; None until a run this callback creates exists."""
        return self._sender.logger.run.run_id

    @property
    def tracking_uri(self) -> str:
        return self._sender.logger.run.tracking_uri

    @property
    def cycles_logged(self) -> int:
        return self._sender.delivered

    @property
    def outbox_records(self) -> list[Path]:
        return list(self._sender.stored)

    def __call__(self, prof: Any) -> None:
        try:
            stopping = _called_from_stop(prof)
            self._hook_profiler_stop(prof)
            exported = self._run_handlers(prof)
            record = self._read_cycle(prof, exported)
            self._waited_s = 0.0  # training went on: a later stop gets a whole budget again
            self._sender.submit(record)
        except Exception as error:  # noqa: BLE001 - nothing may escape into prof.step()
            self.reporter.problem("cycle", f"could not log profiler step {getattr(prof, 'step_num', '?')}", error)
            return
        if stopping:
            self._flush_within_budget()  # the hook may have come too late for this stop()

    def start_helper(self, timeout: float = 60.0) -> bool:
        """Starts the helper process now and waits, at most `timeout` s, until it takes cycles.

        Without this call it starts on the first cycle, and cycles are processed in this process
        until it is up (it imports torch and MLflow: seconds). False: there is no helper
        (``process="inline"``, ``background=False``) or it is not up yet."""
        if not isinstance(self._sender, Handoff):
            return False
        self._sender.start()
        return self._sender.wait_ready(timeout)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits for pending cycles; False if `timeout` ran out first (they keep going)."""
        try:
            return self._sender.flush(timeout)
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("flush", "a pending cycle failed", error)
            return False

    def close(self, timeout: float | None = None) -> None:
        """Flushes, stores what is left in the outbox, and ends the run if this callback created it.

        Without `timeout`, it uses what is left of the shutdown budget (`flush_timeout_s`, shared
        with profiler stop and interpreter exit)."""
        started = time.monotonic()
        try:
            if self._neuron_monitor is not None:
                self._neuron_monitor.stop()
            self._sender.close(self._budget_left() if timeout is None else timeout)
            if self._owns_run and self.rank.is_primary and self.run_id is not None:
                self._end_run(self._budget_left(started) if timeout is None else max(timeout, 1.0))
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("close", f"could not close run {self.run_id} cleanly", error)
        finally:
            self._waited_s += time.monotonic() - started

    def _budget_left(self, since: float | None = None) -> float:
        """Seconds left of the shutdown budget: flush_timeout_s less what flush points waited
        (and, with `since`, what the current one has waited so far)."""
        current = time.monotonic() - since if since is not None else 0.0
        return max(self.flush_timeout_s - self._waited_s - current, 0.0)

    def _flush_within_budget(self) -> None:
        """Waits for pending cycles for what is left of the budget; the rest goes to the outbox.
        Then the helper process, if any, ends: its profile is over."""
        started = time.monotonic()
        try:
            flushed = self.flush(self._budget_left())
        finally:
            self._waited_s += time.monotonic() - started
        try:
            if not flushed:
                self._sender.spill(f"it was not sent within flush_timeout_s={self.flush_timeout_s:g} s")
            if isinstance(self._sender, Handoff):
                started = time.monotonic()
                try:
                    self._sender.retire(self._budget_left())
                finally:
                    self._waited_s += time.monotonic() - started
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("flush", "could not store pending cycles in the outbox", error)

    def _end_run(self, seconds: float) -> None:
        """Ends the run this callback created, waiting at most `seconds` for the server."""
        if seconds <= 0:
            self.reporter.problem("end_run", f"run {self.run_id} was left RUNNING: no time was left of "
                                  f"flush_timeout_s={self.flush_timeout_s:g} s to end it")  # fmt: skip
            return
        errors: list[BaseException] = []

        def end() -> None:
            try:
                check_reachable(self.tracking_uri, min(seconds, 3.0))
                self._sender.logger.end_run()
            except Exception as error:  # noqa: BLE001
                errors.append(error)

        ender = threading.Thread(target=end, name="mlflow-neuron-end-run", daemon=True)
        ender.start()
        ender.join(seconds)
        if ender.is_alive() or errors:
            why = errors[0] if errors else TimeoutError(f"no answer within {seconds:.1f} s")
            self.reporter.problem("end_run", f"run {self.run_id} was left RUNNING: it could not be ended", why)
            return
        self._owns_run = False

    def __enter__(self) -> MLflowProfilerCallback:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- training-thread side ----------------------------------------------------------------

    def _join_primary_run(self, logger: RunLogger) -> RunRef:
        """Under torch.distributed, every rank takes rank 0's run (created now, collectively)."""
        shared = broadcast_from_primary(logger.ensure_run)
        if shared is not None:
            self._owns_run = self.rank.is_primary
            return logger.run if self.rank.is_primary else RunRef(logger.run.tracking_uri, shared)
        if not self.rank.is_primary:
            self.reporter.problem(
                "no_shared_run",
                f"rank {self.rank.rank} has no run id (pass run_id=, set MLFLOW_RUN_ID, or initialize "
                "torch.distributed before creating the callback); it logs into a run of its own",
            )
        return logger.run

    def _hook_profiler_stop(self, prof: Any) -> None:
        """Flushes when the profiler stops (its `__exit__` calls `stop()` on the instance)."""
        if getattr(prof, "_mlflow_neuron_flush", None) is self:
            return
        original = prof.stop

        def stop_then_flush(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                self._flush_within_budget()

        prof.stop = stop_then_flush
        prof._mlflow_neuron_flush = self

    def _run_handlers(self, prof: Any) -> list[str]:
        """Calls the user's handlers; returns the chrome traces they exported, in order."""
        exported: list[str] = []
        original = prof.export_chrome_trace

        def recording_export(path: str, *args: Any, **kwargs: Any) -> Any:
            result = original(path, *args, **kwargs)
            exported.append(os.fspath(path))
            return result

        prof.export_chrome_trace = recording_export
        try:
            for handler in self.handlers:
                try:
                    handler(prof)
                except Exception as error:  # noqa: BLE001
                    name = getattr(handler, "__qualname__", repr(handler))
                    self.reporter.problem(f"handler:{name}", f"on_trace_ready handler {name} failed", error)
        finally:
            del prof.export_chrome_trace
        return exported

    def _read_cycle(self, prof: Any, exported: list[str]) -> _record.CycleRecord | dict:
        """The cycle as a record for the in-process sender, or as a job for the helper process."""
        self.cycles_read += 1
        hand_off = isinstance(self._sender, Handoff) and self._sender.accepts_jobs()
        step = int(getattr(prof, "step_num", 0))
        device = _devices.profiled_device(prof)
        output_dir = self.profile_output_dir or _devices.neuron_settings(
            getattr(prof, "experimental_config", None)
        ).get("profile_output_dir")
        primary, logs_metrics = self.rank.is_primary, self.rank.is_primary or self.all_ranks
        step_dir = f"profiler/step_{step}"
        neuron_dir = f"{step_dir}/neuron"  # every rank's files: the Neuron layout separates them by pid
        record = _record.CycleRecord(
            step=step,
            timestamp_ms=int(time.time() * 1000),
            artifact_dir=step_dir if primary else f"{step_dir}/rank_{self.rank.rank}",
            staged_dir=Path(tempfile.mkdtemp(prefix="mlflow-neuron-")),
            register_table=primary,
        )
        found = self._new_output_files(output_dir)
        record.uploads = tuple(
            (str(f.path), _parent(f"{neuron_dir}/{f.relative_path}"))
            for f in found
            if f.decision == _files.UPLOAD
        )
        trace_source, numbers = None, None
        if logs_metrics:
            if hand_off:
                trace_source, record.raw_trace, record.trace_export = self._stage_trace(
                    prof, found, exported, record.staged_dir, neuron_dir
                )
                numbers = self._trace_to_parse(prof, device, primary, found, record)
            if numbers is None:
                # Only reading needs the profiler; numbers, tables and tags are made by the sender.
                summarize = self._read_numbers(prof, device)
                record.complete = functools.partial(self._completer.complete, summarize, device)
            if not hand_off:
                trace_source, record.raw_trace, record.trace_export = self._stage_trace(
                    prof, found, exported, record.staged_dir, neuron_dir
                )
            if found:  # summarized by neuron-explorer, or read from the sessions' Summary.parquet
                record.summary_tool, record.summary_sessions = self._summary_tool, _sessions(found)
                if not primary:
                    record.summary_prefix = f"{_devices.NEURON_SUMMARY_PREFIX}/rank_{self.rank.rank}"
        if primary and not self._params_read:
            record.params = _settings.profiling_params(prof, device=device, output_dir=output_dir)
            self._params_read = True
        record.manifest = _record.manifest(
            found, neuron_dir=neuron_dir, output_dir=output_dir, trace_source=trace_source,
            max_file_bytes=self.max_file_bytes, rank=self.rank.rank,
        )  # fmt: skip
        if hand_off and (numbers is not None or not logs_metrics):
            return _job(record, numbers)
        return record

    def _trace_to_parse(
        self, prof: Any, device: str, primary: bool, found: list[_files.FoundFile], record: _record.CycleRecord
    ) -> dict | None:
        """What the helper process reads the cycle's numbers from: the trace a handler or Neuron
        session wrote, else the trace saved now by Kineto's C++ writer. None: read in-process."""
        if record.trace_export is not None:
            try:
                record.trace_export(record.raw_trace)  # Kineto's own JSON writer, as tensorboard's handler
            except Exception as error:  # noqa: BLE001 - read in-process, upload without a trace
                self.reporter.problem("trace_export", "could not export the framework trace", error)
                record.raw_trace = None
                return None
            finally:
                record.trace_export = None
        if record.raw_trace is not None and record.raw_trace.exists():
            trace = str(record.raw_trace)
        else:
            neuron_trace = next((f for f in found if f.is_framework_trace), None)
            if neuron_trace is None:
                return None
            trace = str(neuron_trace.path)
        step = int(getattr(prof, "step_num", 0))
        timeline = {"step": step, "max_spans": self.timeline_max_spans} if self.log_timeline and primary else None
        return {
            "trace": trace, "raw_trace": str(record.raw_trace) if record.raw_trace else None, "device": device,
            "device_profiled": device != _devices.CPU, "default_step": max(step - 1, 0),
            "timeline": timeline,
        }  # fmt: skip

    def _read_numbers(self, prof: Any, device: str) -> Callable[[], tuple[CycleProfile, str, Any]]:
        """What turns the cycle into per-op numbers, a table and (rank 0) its timeline, run later
        by the sender.

        The fast path holds on to the cycle's Kineto results and reads their raw events off the
        training thread; where this torch does not allow that, torch's own `prof.events()` parse
        does the work here, since it needs the profiler, and the cycle has no timeline."""
        device_profiled = device != _devices.CPU
        step = int(getattr(prof, "step_num", 0))
        last_step = max(step - 1, 0)  # the cycle's last active step
        with_timeline = self.log_timeline and self.rank.is_primary
        read_later = _kineto.kineto_reader(prof, with_timeline=with_timeline)
        if read_later is not None:
            def summarize() -> tuple[CycleProfile, str, Any]:
                read = read_later()
                if read is None:
                    raise RuntimeError(f"this torch's Kineto results could not be read ({torch.__version__})")
                raw, inputs = read if with_timeline else (read, None)
                tree = event_tree(raw)  # linked once, for the numbers and the timeline
                profile = aggregate(raw, device=device, device_profiled=device_profiled, default_step=last_step,
                                    tree=tree)  # fmt: skip
                timeline = None
                if with_timeline:
                    timeline = guarded_timeline(self.reporter, step, lambda: build_timeline(
                        raw, cycle_step=step, max_spans=self.timeline_max_spans, inputs=inputs, tree=tree
                    ))  # fmt: skip
                return profile, render.cycle_table(profile), timeline

            return summarize
        logger.debug("profiler step %s read through prof.events(): the fast path does not read this "
                     "profile (torch %s)%s", step, torch.__version__,
                     "; it gets no timeline" if with_timeline else "")  # fmt: skip
        profile, table = self._profile_from_events(prof, device, device_profiled, last_step)
        return lambda: (profile, table, None)

    def _profile_from_events(
        self, prof: Any, device: str, device_profiled: bool, last_step: int
    ) -> tuple[CycleProfile, str]:
        try:
            events = prof.events()
        except Exception as error:  # noqa: BLE001 - e.g. trace_only configs have no events
            self.reporter.problem("events", "the profiler gave no events (per-op metrics are empty)", error)
            events = _event_list([], None)
        if getattr(prof, "acc_events", False):
            # torch puts a cycle's new events first and appends the earlier cycles' after them.
            total = len(events)
            events = _event_list(events[: total - self._events_seen], events)
            self._events_seen = total
        profile = extract_cycle(events, device=device, device_profiled=device_profiled, default_step=last_step)
        sort_by = "self_device_time_total" if profile.device_time == PRESENT else "self_cpu_time_total"
        table = events.key_averages().table(sort_by=sort_by, row_limit=-1, max_name_column_width=_TABLE_NAME_WIDTH)
        return profile, table

    def _new_output_files(self, output_dir: str | None) -> list[_files.FoundFile]:
        if not output_dir:
            return []
        if self._watcher is None or str(self._watcher.root) != str(output_dir):
            self._watcher = _files.OutputFolderWatcher(
                output_dir, max_file_bytes=self.max_file_bytes, since_ns=self._created_ns - 2_000_000_000
            )
        try:
            return self._watcher.new_files()
        except FileNotFoundError:
            self.reporter.problem(
                "output_dir_missing",
                f"profile_output_dir {output_dir} does not exist; no Neuron files were uploaded "
                "(metrics and the framework trace still were)",
            )
            return []

    def _stage_trace(
        self, prof: Any, found: list[_files.FoundFile], exported: list[str], staged: Path, neuron_dir: str
    ) -> tuple[str | None, Path | None, Callable[[Path], None] | None]:
        """Where the framework trace comes from, the raw copy to gzip into `staged` (unless a
        Neuron session has the trace), and the export that writes that copy later, if deferred.

        Export and gzip happen off the training thread where torch allows; here the trace is at
        most linked or, on old torch, exported.
        """
        neuron_trace = next((f for f in found if f.is_framework_trace), None)
        if neuron_trace is not None:
            return f"{neuron_dir}/{neuron_trace.relative_path}", None, None
        for path in reversed(exported):
            if os.path.isfile(path):
                raw = staged / ("raw_trace.json.gz" if path.endswith(".gz") else "raw_trace.json")
                _files.link_or_copy(path, raw)
                return path, raw, None
        if not self.export_trace:
            return None, None, None
        raw = staged / "raw_trace.json"
        deferred = _deferred_export(prof)
        if deferred is not None:
            return "export_chrome_trace", raw, deferred
        try:
            try:
                prof.export_chrome_trace(str(raw))
            except RuntimeError:
                # Kineto saves a cycle's trace once; a handler may have used that save already.
                prof.export_chrome_trace(str(raw), use_python_export=True)
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("trace_export", "could not export the framework trace", error)
            return None, None, None
        return "export_chrome_trace", raw, None


def _called_from_stop(prof: Any) -> bool:
    """True when torch calls the handler from `prof.stop()` (the cycle that ends the profile)."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "stop" and frame.f_locals.get("self") is prof:
            return True
        frame = frame.f_back
    return False


def _deferred_export(prof: Any) -> Callable[[Path], None] | None:
    """Saving this cycle's Kineto trace later, from another thread; None where torch can't.

    `export_chrome_trace` is `kineto_results.save(path)`; the results object belongs to this cycle
    alone (the next cycle gets a new one), so the sender can write it while training goes on.
    """
    results = _kineto.kineto_results_of(prof)[1]
    if results is None or not callable(getattr(results, "save", None)):
        return None

    def save(path: Path) -> None:
        try:
            results.save(str(path))
        except RuntimeError:
            # Kineto saves a trace once; a handler may have used that save already.
            from torch.profiler._chrome_trace_export import export_chrome_trace

            export_chrome_trace(results, str(path), None)

    return save


def _job(record: _record.CycleRecord, numbers: dict | None) -> dict:
    """A cycle for the helper process, as plain data (`_helper.record_of` reads it)."""
    return {
        "step": record.step, "timestamp_ms": record.timestamp_ms, "artifact_dir": record.artifact_dir,
        "staged_dir": str(record.staged_dir), "params": record.params, "manifest": record.manifest,
        "uploads": [list(u) for u in record.uploads], "register_table": record.register_table,
        "summary_tool": record.summary_tool, "summary_sessions": list(record.summary_sessions),
        "summary_prefix": record.summary_prefix, "numbers": numbers,
    }  # fmt: skip


def _sessions(found: list[_files.FoundFile]) -> tuple[str, ...]:
    """The capture session folders among a cycle's new files (summarized by Neuron Explorer)."""
    by_folder: dict[str, list[str]] = {}
    for f in found:
        by_folder.setdefault(str(f.path.parent), []).append(f.path.name)
    return tuple(folder for folder, names in sorted(by_folder.items()) if _devices.is_neuron_session(names))


def _close_at_exit(ref: weakref.ref) -> None:
    callback = ref()
    if callback is not None:
        callback.close()


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _event_list(events: list, like: Any) -> Any:
    """An EventList of some of `like`'s events, usable for key_averages()."""
    from torch.autograd.profiler_util import EventList

    subset = EventList(events, use_device=getattr(like, "_use_device", None))
    subset._tree_built = True  # the events keep the parent/child links of the full list
    return subset


def _validate(handlers: tuple, **counts: Any) -> None:
    for handler in handlers:
        if not callable(handler):
            raise TypeError(
                f"handlers must be callables taking the profiler (such as NeuronProfiler(nc).export_trace "
                f"or torch.profiler.tensorboard_trace_handler(dir)); got {handler!r}"
            )
    for name, value in counts.items():
        if name == "max_file_bytes" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0; got {value!r}")
