"""`MLflowProfilerCallback`: every torch.profiler cycle becomes MLflow metrics and artifacts."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _devices, _files, _record, _settings
from ._extract import MISSING, PRESENT, CycleProfile, extract_cycle
from ._keys import OpKeys
from ._mlflow_io import RunLogger
from ._report import Reporter

DEFAULT_MAX_FILE_BYTES = 512 * 1024**2  # NTFFs reach gigabytes: those are listed, not uploaded
_TABLE_NAME_WIDTH = 120


class MLflowProfilerCallback:
    """An `on_trace_ready` handler that logs each profiler cycle into an MLflow run.

    Example::

        from torch.profiler import ProfilerActivity, profile, schedule
        from mlflow_neuron import MLflowProfilerCallback

        with mlflow.start_run(), MLflowProfilerCallback() as callback:
            with profile(
                activities=[ProfilerActivity.CPU],
                schedule=schedule(wait=2, warmup=1, active=1),
                on_trace_ready=callback,
            ) as prof:
                for _ in range(4):
                    train_step()
                    prof.step()

    On Trainium, pass the Neuron exporter first: ``MLflowProfilerCallback(exporter.export_trace)``.

    Args:
        *handlers: other ``on_trace_ready`` handlers (``NeuronProfiler.export_trace``,
            ``tensorboard_trace_handler(...)``), called first, in order, each guarded.
        run_id: the run to log into. Default: the run active now, else a new run that
            ``close()`` ends.
        tracking_uri: default: MLflow's own default (``MLFLOW_TRACKING_URI`` or ``./mlflow.db``).
        profile_output_dir: where Neuron session files appear. Default: the
            ``profile_output_dir`` of the profiler's ``experimental_config``, if any.
        top_k: how many ops get per-op metrics; ``ops.json`` always holds every op.
        experiment_id, run_name: for a run this callback creates.
        max_file_bytes: larger profile files are listed in ``manifest.json``, not uploaded.
        export_trace: export the framework trace when no handler or Neuron session provides one.
        strict: re-raise errors instead of warning (default: env ``MLFLOW_NEURON_STRICT``).
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
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        export_trace: bool = True,
        strict: bool | None = None,
    ) -> None:
        _validate(handlers, top_k, max_file_bytes, profile_output_dir)
        self.handlers = handlers
        self.top_k = top_k
        self.max_file_bytes = max_file_bytes
        self.export_trace = export_trace
        self.profile_output_dir = os.fspath(profile_output_dir) if profile_output_dir else None
        self.reporter = Reporter(strict)
        self.last_profile: CycleProfile | None = None
        self.cycles_logged = 0
        self._logger = RunLogger(
            run_id=run_id, tracking_uri=tracking_uri, experiment_id=experiment_id, run_name=run_name
        )
        self._keys = OpKeys()
        self._created_ns = time.time_ns()
        self._watcher: _files.OutputFolderWatcher | None = None
        self._params_logged = False
        self._device_time_seen = False
        self._events_seen = 0  # for acc_events profiles, whose event list keeps earlier cycles

    @property
    def run_id(self) -> str | None:
        return self._logger.run_id

    @property
    def tracking_uri(self) -> str:
        return self._logger.tracking_uri

    def __call__(self, prof: Any) -> None:
        exported = self._run_handlers(prof)
        staged = Path(tempfile.mkdtemp(prefix="mlflow-neuron-"))
        try:
            record, params = self._read_cycle(prof, exported, staged)
            self._log(record, params)
        except Exception as error:  # noqa: BLE001 - nothing may escape into prof.step()
            self.reporter.problem("cycle", f"could not log profiler step {getattr(prof, 'step_num', '?')}", error)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        """End the run if this callback created it."""
        try:
            self._logger.end_run()
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("close", f"could not end run {self.run_id}", error)

    def __enter__(self) -> MLflowProfilerCallback:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- training-thread side: handlers and reading the cycle ------------------------------------

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

    def _read_cycle(self, prof: Any, exported: list[str], staged: Path) -> tuple[_record.CycleRecord, dict]:
        device = _devices.profiled_device(prof)
        output_dir = self.profile_output_dir or _devices.neuron_settings(
            getattr(prof, "experimental_config", None)
        ).get("profile_output_dir")
        profile, table = self._profile(prof, device)
        found = self._new_output_files(output_dir)
        trace_source = self._stage_trace(prof, found, exported, staged)
        (staged / "key_averages.txt").write_text(table, encoding="utf-8")
        manifest = _record.manifest(
            found, output_dir=output_dir, trace_source=trace_source, max_file_bytes=self.max_file_bytes
        )
        (staged / "manifest.json").write_text(manifest, encoding="utf-8")

        # The table first: it keys every op, so no key depends on which ops made the top k.
        _record.write_ops_table(_record.ops_table(profile, self._keys), staged / _record.OPS_TABLE)
        metrics = _record.cycle_metrics(profile, self._keys, self.top_k)
        self._device_time_seen |= profile.device_time == PRESENT
        tags = {
            _record.DEVICE_TAG: device,
            _record.DEVICE_TIME_TAG: PRESENT if self._device_time_seen else profile.device_time,
        }
        uploads = tuple(
            (f.path, posix_dirname(f"neuron/{f.relative_path}"))
            for f in found
            if f.decision == _files.UPLOAD
        )
        record = _record.CycleRecord(
            step=int(getattr(prof, "step_num", 0)),
            timestamp_ms=int(time.time() * 1000),
            artifact_dir=f"profiler/step_{int(getattr(prof, 'step_num', 0))}",
            metrics=metrics,
            tags=tags,
            staged_dir=staged,
            uploads=uploads,
        )
        params = {} if self._params_logged else _settings.profiling_params(prof, device=device, output_dir=output_dir)
        return record, params

    def _profile(self, prof: Any, device: str) -> tuple[CycleProfile, str]:
        events = prof.events()
        if getattr(prof, "acc_events", False):
            # torch puts a cycle's new events first and appends the earlier cycles' after them.
            total = len(events)
            events = _event_list(events[: total - self._events_seen], events)
            self._events_seen = total
        profile = extract_cycle(events, device=device, device_profiled=device != _devices.CPU)
        self.last_profile = profile
        if profile.device_time == MISSING:
            self.reporter.problem(
                "device_time_missing", _devices.MISSING_DEVICE_TIME_HINT.format(device=device)
            )
        sort_by = "self_device_time_total" if profile.device_time == PRESENT else "self_cpu_time_total"
        table = events.key_averages().table(
            sort_by=sort_by, row_limit=-1, max_name_column_width=_TABLE_NAME_WIDTH
        )
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

    def _stage_trace(self, prof: Any, found: list, exported: list[str], staged: Path) -> str | None:
        """Puts the cycle's framework trace in `staged` unless a Neuron session folder has one."""
        neuron_trace = next((f for f in found if f.is_framework_trace), None)
        if neuron_trace is not None:
            return f"neuron/{neuron_trace.relative_path}"
        target = staged / "trace.json.gz"
        for path in reversed(exported):
            if os.path.isfile(path):
                _gzip_copy(Path(path), target)
                return path
        if not self.export_trace:
            return None
        try:
            try:
                prof.export_chrome_trace(str(target))
            except RuntimeError:
                # Kineto saves a cycle's trace once; a handler may have used that save already.
                plain = staged / "trace.json"
                prof.export_chrome_trace(str(plain), use_python_export=True)
                _gzip_copy(plain, target)
                plain.unlink()
        except Exception as error:  # noqa: BLE001
            self.reporter.problem("trace_export", "could not export the framework trace", error)
            return None
        return "export_chrome_trace"

    # -- MLflow side ----------------------------------------------------------------------------

    def _log(self, record: _record.CycleRecord, params: dict[str, str]) -> None:
        if params:
            clashes = self._logger.log_params_once(params)
            self._params_logged = True
            if clashes:
                listed = ", ".join(f"{k}: kept {old!r}, not {new!r}" for k, (old, new) in clashes.items())
                self.reporter.problem("params_clash", f"run {self.run_id} already has other profiler params ({listed})")
        self._logger.log_cycle(record)
        self.cycles_logged += 1


def posix_dirname(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _gzip_copy(source: Path, target: Path) -> None:
    if source.suffix == ".gz":
        shutil.copyfile(source, target)
        return
    with open(source, "rb") as fin, gzip.open(target, "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1024 * 1024)


def _event_list(events: list, like: Any) -> Any:
    """An EventList of some of `like`'s events, usable for key_averages()."""
    from torch.autograd.profiler_util import EventList

    subset = EventList(events, use_device=getattr(like, "_use_device", None))
    subset._tree_built = True  # the events keep the parent/child links of the full list
    return subset


def _validate(handlers: tuple, top_k: Any, max_file_bytes: Any, output_dir: Any) -> None:
    for handler in handlers:
        if not callable(handler):
            raise TypeError(
                f"handlers must be callables taking the profiler (such as NeuronProfiler(nc).export_trace "
                f"or torch.profiler.tensorboard_trace_handler(dir)); got {handler!r}"
            )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 logs totals only); got {top_k!r}")
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 0:
        raise ValueError(f"max_file_bytes must be an int >= 0; got {max_file_bytes!r}")
    if output_dir is not None and not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"profile_output_dir must be a path or None; got {output_dir!r}")
