"""`MLflowProfilerCallback`: every torch.profiler cycle becomes MLflow metrics and artifacts.

The callback ties the training side together: `hooks` (what it changes on the profiler), `reader`
(a cycle as a `CycleJob`), `host` (the machine during each profiled window), the sender or the
helper process (`_delivery`), and the shutdown budget.
"""

from __future__ import annotations

import atexit
import os
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .._delivery import entries
from .._delivery.mlflow_io import RunLogger, current_run_ref
from .._record.model import RunRef
from .._delivery.outbox import DEFAULT_OUTBOX
from .._delivery.producer import Producer
from .._delivery.report import Reporter
from .system_metrics import start_if_enabled
from .._trace.peaks import PEAKS_ENV, load_peak
from .._trace.profile import CycleProfile
from .._trace.timeline import DEFAULT_MAX_SPANS
from . import hooks, shutdown
from .adaptive import AdaptiveSchedule, attach
from .distributed import Rank, create_primary_run, current_rank, in_distributed_job, join_primary_run
from .host import HostSampler
from .reader import CycleReader

DEFAULT_MAX_FILE_BYTES = None  # no cap: NTFFs of gigabytes are streamed (see _delivery/uploads.py)
PROCESSES = ("helper", "inline")


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

    The training process only saves the cycle's trace into the outbox (Kineto's C++ writer, as
    ``tensorboard_trace_handler`` does); a helper process parses it, writes the files and talks to
    MLflow. ``close()`` (also called at interpreter exit) stops the helper and delivers the rest
    from the training process, within ``flush_timeout_s``; what is left stays in the outbox, and
    one warning gives the ``mlflow-neuron sync`` command that sends it.

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
        background: deliver off the training thread (False: on it, at each cycle, for debugging).
        outbox: the queue every cycle goes through, kept on disk (default ``./mlflow-neuron-outbox``);
            what is not delivered by the end stays there for ``mlflow-neuron sync``.
        max_pending: accepted for compatibility; cycles wait on disk, not in memory.
        retries, retry_wait_s: attempts after the first, and the first backoff (doubling).
        flush_timeout_s: one time budget, from the end of the loop to process exit, shared by
            profiler stop, ``close()`` and interpreter exit; what is not delivered within it stays in
            the outbox, named in one warning.
        strict: re-raise errors instead of warning (default: env ``MLFLOW_NEURON_STRICT``).
        system_metrics: log ``system/neuron/...`` metrics from ``neuron-monitor`` while the run is
            active, where the tool is installed (default: MLflow's ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``).
        log_timeline: log each cycle as an MLflow trace linked to the run (root ``profiler/step_<N>``,
            its ``ProfilerStep#N`` ranges, nested ops, one span per device stream), and keep it as
            ``profiler/step_<N>/timeline.json``. Rank 0 only.
        timeline_max_spans: at most this many spans per trace (an int >= 1); the shortest ops are
            summarized as "… N more ops" spans. The cycle, its steps and its streams always stay.
        process: ``"helper"``: parsing, aggregation and MLflow I/O run in a helper process, started
            with the callback (one per node and outbox: ranks share it; it imports no torch); if it
            fails twice, cycles go the inline way, with one warning. ``"inline"``: a background
            thread of the training process does that work (or, with ``background=False``, the
            training thread itself).
        deliver_after_exit: no longer has an effect (``close()`` delivers, or says what it kept);
            accepted so that scripts that pass it keep running. Only True, False or None.
        peaks: the device's limits for ops.json's % of peak (record_shapes=True): a JSON file or a
            dict ``{"name", "memory_gbps", "bf16_tflops", ..., "source"}``; default env
            ``MLFLOW_NEURON_PEAKS``, else the published figures of the instance type or GPU.
    """

    exit_wait_s: float | None = None  # seconds the last profiler stop waited for pending cycles

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
        outbox: str | os.PathLike = DEFAULT_OUTBOX,
        max_pending: int = 8,
        retries: int = 3,
        retry_wait_s: float = 0.5,
        flush_timeout_s: float = 10.0,
        strict: bool | None = None,
        system_metrics: bool | None = None,
        log_timeline: bool = True,
        timeline_max_spans: int = DEFAULT_MAX_SPANS,
        process: str = "helper",
        peaks: str | os.PathLike | dict | None = None,
        deliver_after_exit: bool | None = None,
    ) -> None:
        _validate(handlers, process, profile_output_dir, timeline_max_spans, deliver_after_exit,
                  {"flush_timeout_s": flush_timeout_s, "retry_wait_s": retry_wait_s}, top_k=top_k,
                  max_file_bytes=max_file_bytes, max_pending=max_pending, retries=retries)  # fmt: skip
        self.handlers = handlers
        self.flush_timeout_s = flush_timeout_s
        self.reporter = Reporter(strict)
        self.rank = current_rank()
        self.cycles_read = 0
        self._budget = shutdown.ShutdownBudget(flush_timeout_s)
        run, self._owns_run = _job_run(self.rank, self.reporter, Path(outbox), run_id, tracking_uri,
                                       experiment_id=experiment_id, run_name=run_name)  # fmt: skip
        preparer = {"top_k": top_k, "rank": self.rank.rank, "primary": self.rank.is_primary, "all_ranks": all_ranks}
        self._producer = Producer(run, self.reporter, preparer=preparer, outbox=outbox, background=background,
                                  helper=process == "helper", retries=retries, retry_wait_s=retry_wait_s,
                                  first=self.rank.first_on_node)  # fmt: skip
        # A callback dropped unclosed leaves no helper behind; at exit, close() does it all.
        if self._producer.helper is not None:
            weakref.finalize(self, self._producer.helper.release).atexit = False
        self._reader = CycleReader(
            self.reporter, self.rank, all_ranks=all_ranks, max_file_bytes=max_file_bytes, export_trace=export_trace,
            profile_output_dir=os.fspath(profile_output_dir) if profile_output_dir else None,
            log_timeline=bool(log_timeline), timeline_max_spans=timeline_max_spans, created_ns=time.time_ns(),
            peak=load_peak(peaks, "peaks").to_dict() if peaks is not None else None,
        )  # fmt: skip
        self._system_metrics = (start_if_enabled(system_metrics, lambda: self.run_id, self.tracking_uri, self.reporter)
                                if self.rank.is_primary else None)  # fmt: skip
        self._host = HostSampler(self.reporter, torch_threads=torch.get_num_threads, helper_pids=self._helper_pids,
                                 neuron_totals=self._neuron_totals)  # the first window starts now  # fmt: skip
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def last_profile(self) -> CycleProfile | None:
        """The latest cycle aggregated in this process (cycles the helper process reads stay there)."""
        return self._producer.drain.last_profile

    @property
    def run_id(self) -> str | None:
        """The run's id; None until a run this callback creates exists."""
        return self._producer.run_id

    @property
    def tracking_uri(self) -> str:
        return self._producer.run.tracking_uri

    @property
    def cycles_logged(self) -> int:
        """This process's cycles delivered so far (read from the outbox: an entry gone is delivered)."""
        return self._producer.delivered

    @property
    def outbox_records(self) -> list[Path]:
        """This process's cycles still in the outbox: not delivered yet (kept, after close)."""
        return self._producer.stored

    def __call__(self, prof: Any) -> None:
        try:
            host = self._host.end()  # the window ends with its last step: reading the cycle is not in it
            stopping = hooks.called_from_stop(prof)
            hooks.flush_after_stop(prof, self, self._flush_at_stop)
            hooks.mark_window_starts(prof, self, self._host.begin)
            exported = hooks.run_handlers(prof, self.handlers, self.reporter)
            self.cycles_read += 1
            held = self._producer.new_entry()
            try:
                job = self._reader.read(prof, exported, True, held.path / entries.FILES)
            except BaseException:
                entries.remove(held.path)  # a cycle that could not be read leaves nothing
                held.release()
                raise
            job.host = host
            self._budget.renew()  # training went on: a later stop gets a whole budget again
            memory = self._reader.memory_source(prof, job) if self._producer.drains_here else None
            self._producer.submit(job, held, memory)
        except Exception as error:  # noqa: BLE001 - nothing may escape into prof.step()
            self._producer.lose(getattr(prof, "step_num", "?"), "could not be read", error)  # counted, said once
            return
        finally:
            self._host.begin()  # the next window, unless the profiler marks a later start (hooks)
        if stopping:
            self._flush_at_stop()  # the hook may have come too late for this stop()

    def schedule(self, **options: Any) -> AdaptiveSchedule:
        """This callback's own ``torch.profiler`` schedule: a baseline, then a capture at each change of the step
        time and at each request (``mlflow-neuron capture``); options such as ``warmup_steps=20``: docs/contract.md."""
        return attach(self, options)

    def mark_window_start(self) -> None:
        """Starts the next profiled window now, for the host's numbers (``system/profile/...``).

        Call it just before entering a new ``torch.profiler.profile`` (one per cycle, say): the
        callback meets a profile at its first cycle, so without this call that cycle's window
        starts where the callback last read a cycle, or where it was created. Later cycles of the
        same profile start where the profiler leaves its NONE action."""
        self._host.begin()

    def start_helper(self, timeout: float = 60.0) -> bool:
        """Waits, at most `timeout` s, until a helper process drains the outbox (this callback's, or
        another rank's on the same node).

        Without this call it starts when the callback is created, and cycles that come before it is
        up wait in the outbox. False: there is no helper (``process="inline"``, ``background=False``)
        or it is not up yet."""
        helper = self._producer.helper
        return helper.wait_ready(timeout) if helper is not None else False

    def wait_delivered(self, timeout: float | None = None) -> bool:
        """Waits until this callback's cycles are delivered (or settled otherwise); the same as `flush`."""
        return self.flush(timeout)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until this callback's cycles are settled, delivering from this process when no other
        drains; False if `timeout` ran out or the server did not answer (they stay in the outbox)."""
        try:
            return self._producer.flush(timeout)
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("flush", "a pending cycle failed", error)
            return False

    def close(self, timeout: float | None = None) -> None:
        """Stops the helper, delivers what is left within `timeout` from this process, ends the run if
        this callback created it, and says in one warning what stays in the outbox and the
        ``mlflow-neuron sync`` command that sends it.

        Without `timeout`, it uses what is left of the shutdown budget (`flush_timeout_s`, shared
        with profiler stop and interpreter exit)."""
        with self._budget.spending():
            try:
                if self._system_metrics is not None:
                    self._system_metrics.stop()
                if self._reader.schedule is not None:  # its last step times, queued before the end
                    self._reader.schedule.close()
                ends_run = self._owns_run and self.rank.is_primary
                self._owns_run = False  # its end is queued once: a second close() does not queue another
                # An explicit timeout gets at least a second: ending the run is one request.
                self._producer.close(self._budget.left() if timeout is None else max(timeout, 1.0), end_run=ends_run)
            except Exception as error:  # noqa: BLE001
                self.reporter.problem("close", f"could not close run {self.run_id} cleanly", error)

    def __enter__(self) -> MLflowProfilerCallback:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _helper_pids(self) -> tuple[int, ...]:
        return self._producer.helper_pids()

    def _neuron_totals(self) -> tuple[int, float] | None:
        monitor = self._system_metrics
        return monitor.tool.utilization_totals() if monitor is not None and monitor.running else None

    def _flush_at_stop(self) -> None:
        self.exit_wait_s = shutdown.flush_at_stop(self._producer, self._budget, self.reporter)


def _job_run(rank: Rank, reporter: Reporter, outbox: Path, run_id: str | None, tracking_uri: str | None,
             **new_run: str | None) -> tuple[RunRef, bool]:  # fmt: skip
    """The run to log into, and whether this callback created it (rank 0 ends it). Under
    torch.distributed every rank takes rank 0's run, sent by one broadcast."""
    with entries.store_lock(outbox.absolute()):  # ranks on a fresh sqlite store: one creates its schema
        run = current_run_ref(run_id, tracking_uri, run_key=uuid.uuid4().hex, **new_run)
        run = run if run.run_id is None else replace(run, run_key=None)  # a given run: no key, never ended by us
        owns = run.run_id is None
        if owns and rank.is_primary and in_distributed_job():
            run = create_primary_run(RunLogger(run), reporter)
    # The broadcast waits for every rank: out of the lock, which the other ranks take before it.
    if owns and rank.world_size > 1:
        return join_primary_run(run, rank, reporter)
    return run, owns


def _close_at_exit(ref: weakref.ref) -> None:
    callback = ref()
    if callback is not None:
        callback.close()


def _validate(handlers: tuple, process: str, profile_output_dir: Any, timeline_max_spans: Any, after_exit: Any,
              seconds: dict[str, Any], **counts: Any) -> None:  # fmt: skip
    """Bad settings are refused at construction, with what is allowed: not at the loop's end."""
    if after_exit is not None and not isinstance(after_exit, bool):
        raise TypeError(f"deliver_after_exit must be True, False or None; got {after_exit!r}")
    for handler in handlers:
        if not callable(handler):
            raise TypeError(
                f"handlers must be callables taking the profiler (such as NeuronProfiler(nc).export_trace "
                f"or torch.profiler.tensorboard_trace_handler(dir)); got {handler!r}"
            )
    if process not in PROCESSES:
        raise ValueError(f"process must be one of {', '.join(map(repr, PROCESSES))}; got {process!r}")
    if isinstance(timeline_max_spans, bool) or not isinstance(timeline_max_spans, int) or timeline_max_spans < 1:
        raise ValueError(f"timeline_max_spans must be an int >= 1 (default {DEFAULT_MAX_SPANS}); "
                         f"got {timeline_max_spans!r}")  # fmt: skip
    if profile_output_dir is not None and not isinstance(profile_output_dir, (str, os.PathLike)):
        raise TypeError(f"profile_output_dir must be a path or None; got {profile_output_dir!r}")
    if os.environ.get(PEAKS_ENV, "").strip():
        load_peak(os.environ[PEAKS_ENV].strip())  # a ValueError that says what the file lacks
    for name, value in seconds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # NaN is not >= 0
            raise ValueError(f"{name} must be a number of seconds >= 0; got {value!r}")
    for name, value in counts.items():
        if name == "max_file_bytes" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0; got {value!r}")
