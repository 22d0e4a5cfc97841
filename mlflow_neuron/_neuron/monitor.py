"""Neuron system metrics beside the profile: `neuron-monitor`'s JSON stream as `system/neuron/...`.

MLflow's own system-metrics monitor knows CPUs, disks, networks and NVIDIA/AMD GPUs, not Neuron
devices. While a profiled run is active, this reads the reports that `neuron-monitor` writes to
stdout (one JSON document per period, Neuron Monitor User Guide) and logs, on the run's System
metrics tab:

    system/neuron/neuroncore_<i>_utilization_percentage   per NeuronCore in use (percent, 0-100)
    system/neuron/device_memory_used_megabytes            Neuron device memory used by runtimes
    system/neuron/host_memory_used_megabytes              host memory used by Neuron runtimes

Like MLflow's GPU metrics, these cover the whole host: every Neuron runtime that neuron-monitor
sees (`tag_filter: ".*"`), memory summed over runtimes. Only rank 0 runs the monitor.

It follows MLflow's conventions: on with `MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING` (or
`system_metrics=True`), sampled every `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL` seconds (10),
averaged over `MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING` samples (1), steps counting from 0,
`MLFLOW_SYSTEM_METRICS_NODE_ID` as `system/<node>/neuron/...`.

It never blocks training: the tool is a subprocess (not a fork of this process), read by one
thread and logged by another, with a bounded sample buffer. It stops at `stop()`, when the run
ends, or at exit; a tool that fails or is missing costs one warning at most.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from .._neuron import devices as _devices
from .._delivery.report import Reporter, logger

MONITOR_TOOL = "neuron-monitor"
DEFAULT_INTERVAL_S = 10.0
MAX_SAMPLES = 1000  # reports kept while the run id is unknown or logging lags; older ones are dropped
_STOP_WAIT_S = 2.0


def find_monitor_tool() -> str | None:
    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), _devices.NEURON_TOOLS_DIR) if p)
    return shutil.which(MONITOR_TOOL, path=search)


def enabled(flag: bool | None) -> bool:
    """`flag` if given, else MLflow's `MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`."""
    if flag is not None:
        return bool(flag)
    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING

    return bool(MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get())


def sample_of(report: dict) -> dict[str, float]:
    """One neuron-monitor report as metric values (names without the `system/neuron/` prefix).

    Utilization is per NeuronCore index (the highest where two runtimes report a core); memory is
    summed over the Neuron runtimes. Runtimes that report an error, and missing groups, add nothing.
    """
    utilization: dict[str, float] = {}
    device_bytes = host_bytes = None
    for runtime in report.get("neuron_runtime_data") or []:
        body = (runtime or {}).get("report") or {}
        cores = (body.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
        for core, counters in cores.items():
            value = (counters or {}).get("neuroncore_utilization")
            if _is_number(value):
                utilization[str(core)] = max(utilization.get(str(core), 0.0), float(value))
        used = (body.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}
        if _is_number(used.get("neuron_device")):
            device_bytes = (device_bytes or 0.0) + float(used["neuron_device"])
        if _is_number(used.get("host")):
            host_bytes = (host_bytes or 0.0) + float(used["host"])
    sample = {f"neuroncore_{core}_utilization_percentage": value for core, value in utilization.items()}
    if device_bytes is not None:
        sample["device_memory_used_megabytes"] = device_bytes / 1e6
    if host_bytes is not None:
        sample["host_memory_used_megabytes"] = host_bytes / 1e6
    return sample


def monitor_config(interval_s: float) -> dict:
    """A neuron-monitor configuration for the two metric groups logged, every runtime on the host."""
    return {
        "period": f"{interval_s:g}s",
        "neuron_runtimes": [
            {"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used"}]}
        ],
    }


class NeuronMonitor:
    """Runs neuron-monitor while a run is active and logs its reports into that run.

    `run_id` is asked for at each logging round, so a run that the callback creates later is
    found once it exists; until then samples wait in a bounded buffer.
    """

    def __init__(self, tool: str, run_id: Callable[[], str | None], tracking_uri: str, reporter: Reporter) -> None:
        from mlflow.environment_variables import (
            MLFLOW_SYSTEM_METRICS_NODE_ID,
            MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING,
            MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL,
        )

        self.tool = tool
        self.interval_s = float(MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or DEFAULT_INTERVAL_S)
        self.samples_before_logging = int(MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING.get() or 1)
        node = MLFLOW_SYSTEM_METRICS_NODE_ID.get()
        self.prefix = f"system/{node}/neuron/" if node else "system/neuron/"
        self._run_id = run_id
        self._tracking_uri = tracking_uri
        self._reporter = reporter
        self._samples: collections.deque[tuple[int, dict[str, float]]] = collections.deque(maxlen=MAX_SAMPLES)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._process: subprocess.Popen | None = None
        self._threads: list[threading.Thread] = []
        self._config_path: str | None = None
        self._stderr = None
        self.step = 0

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None and not self._stopping.is_set()

    def start(self) -> bool:
        try:
            fd, self._config_path = tempfile.mkstemp(prefix="mlflow-neuron-monitor-", suffix=".json")
            with os.fdopen(fd, "w") as handle:
                json.dump(monitor_config(self.interval_s), handle)
            self._stderr = tempfile.TemporaryFile()
            self._process = subprocess.Popen(
                [self.tool, "-c", self._config_path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=self._stderr, text=True, bufsize=1,
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - a monitor that cannot start is a warning, never an error
            self._problem(f"{self.tool} could not start: {type(error).__name__}: {error}")
            self._cleanup()
            return False
        for target, name in ((self._read, "mlflow-neuron-monitor-reader"), (self._log, "mlflow-neuron-monitor-logger")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the tool and logs the samples still buffered; returns within about `timeout` seconds."""
        if self._stopping.is_set() and self._process is None:
            return
        self._stopping.set()
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_WAIT_S)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(deadline - time.monotonic(), 0))
        self._cleanup()

    # -- threads ---------------------------------------------------------------------------------

    def _read(self) -> None:
        process = self._process
        if process is None or process.stdout is None:
            return
        try:
            for line in process.stdout:
                if not line.lstrip().startswith("{"):
                    continue
                try:
                    sample = sample_of(json.loads(line))
                except (ValueError, AttributeError, TypeError):
                    continue
                if sample:
                    with self._lock:
                        self._samples.append((int(time.time() * 1000), sample))
        except (OSError, ValueError):  # the pipe closed under us at stop()
            return
        if not self._stopping.is_set():
            code = process.wait()
            self._problem(f"{self.tool} exited with code {code}: {self._stderr_tail()}; Neuron system metrics stop")

    def _log(self) -> None:
        while not self._stopping.wait(self.interval_s * self.samples_before_logging):
            if not self._flush():
                self._stopping.set()
                process = self._process
                if process is not None and process.poll() is None:
                    process.terminate()
                return
        self._flush()

    def _flush(self) -> bool:
        """Logs the mean of the buffered samples as one step; False once the run is over or failing."""
        run_id = self._run_id()
        if run_id is None:
            return True
        with self._lock:
            samples, self._samples = list(self._samples), collections.deque(maxlen=MAX_SAMPLES)
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient

            client = MlflowClient(self._tracking_uri)
            if samples:
                totals: dict[str, list[float]] = {}
                for _, sample in samples:
                    for key, value in sample.items():
                        totals.setdefault(key, []).append(value)
                timestamp = samples[-1][0]
                metrics = [Metric(self.prefix + k, sum(v) / len(v), timestamp, self.step) for k, v in totals.items()]
                client.log_batch(run_id, metrics=metrics, synchronous=True)
                self.step += 1
            return self._stopping.is_set() or client.get_run(run_id).info.status == "RUNNING"
        except Exception as error:  # noqa: BLE001 - the monitor stops; training goes on
            self._problem(f"Neuron system metrics could not be logged to run {run_id}: {type(error).__name__}: {error}")
            return False

    # -- helpers ---------------------------------------------------------------------------------

    def _problem(self, message: str) -> None:
        self._reporter.problem("neuron_monitor", message)  # no error object: never raised, even when strict

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read()[-500:].decode("utf-8", "replace").strip()
        except (OSError, ValueError, AttributeError):
            text = ""
        return text or "no message"

    def _cleanup(self) -> None:
        if self._config_path:
            try:
                os.unlink(self._config_path)
            except OSError:
                pass
            self._config_path = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def start_if_enabled(flag: bool | None, run_id: Callable[[], str | None], tracking_uri: str,
                     reporter: Reporter) -> NeuronMonitor | None:  # fmt: skip
    """A running monitor when system metrics are on and neuron-monitor is installed, else None."""
    try:
        if not enabled(flag):
            return None
        tool = find_monitor_tool()
        if tool is None:
            logger.debug("system metrics are on but %s is not installed: no Neuron system metrics", MONITOR_TOOL)
            return None
        monitor = NeuronMonitor(tool, run_id, tracking_uri, reporter)
        return monitor if monitor.start() else None
    except Exception as error:  # noqa: BLE001
        reporter.problem("neuron_monitor", f"Neuron system metrics are off: {type(error).__name__}: {error}")
        return None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
