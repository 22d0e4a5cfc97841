"""Neuron system metrics on the run's System metrics tab: `neuron-monitor`'s samples, logged.

MLflow's own system-metrics monitor knows CPUs, disks, networks and NVIDIA/AMD GPUs, not Neuron
devices. While a profiled run is active, a `SystemMetricsLogger` logs the samples of a
`_neuron.monitor.MonitorTool` as `system/neuron/<name>` (see that module for the names).

It follows MLflow's conventions: on with `MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING` (or
`system_metrics=True`), sampled every `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL` seconds (10),
averaged over `MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING` samples (1), steps counting from 0,
`MLFLOW_SYSTEM_METRICS_NODE_ID` as `system/<node>/neuron/...`. Only rank 0 runs it.

It writes to MLflow directly (`MlflowClient.log_batch` on its own thread), past the outbox, as
MLflow's own system metrics do: samples are a live view, not a cycle, and one lost while the
server is down is not kept. It never blocks training: the tool is read by one thread and logged
by another. It stops at
`stop()`, when the run ends, or at exit; a tool that fails or is missing costs one warning at most.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .._neuron.monitor import MONITOR_TOOL, MonitorTool, find_monitor_tool

DEFAULT_INTERVAL_S = 10.0

_log = logging.getLogger("mlflow_neuron")


class SystemMetricsLogger:
    """Logs a monitor's samples into the run that `run_id()` names once it exists."""

    def __init__(self, tool: str, run_id: Callable[[], str | None], tracking_uri: str, reporter) -> None:
        from mlflow.environment_variables import (
            MLFLOW_SYSTEM_METRICS_NODE_ID,
            MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING,
            MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL,
        )

        interval_s = float(MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or DEFAULT_INTERVAL_S)
        self.samples_before_logging = int(MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING.get() or 1)
        node = MLFLOW_SYSTEM_METRICS_NODE_ID.get()
        self.prefix = f"system/{node}/neuron/" if node else "system/neuron/"
        self.tool = MonitorTool(tool, interval_s, on_exit=lambda why: self._problem(f"{why}; Neuron system metrics stop"))
        self.step = 0
        self._run_id = run_id
        self._tracking_uri = tracking_uri
        self._reporter = reporter
        self._stopping = threading.Event()
        self._logger: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.tool.running and not self._stopping.is_set()

    def start(self) -> bool:
        try:
            self.tool.start()
        except Exception as error:  # noqa: BLE001 - a monitor that cannot start is a warning, never an error
            self._problem(f"{self.tool.tool} could not start: {type(error).__name__}: {error}")
            return False
        self._logger = threading.Thread(target=self._log, name="mlflow-neuron-monitor-logger", daemon=True)
        self._logger.start()
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the tool and logs the samples still buffered; returns within about `timeout` seconds."""
        self._stopping.set()
        self.tool.stop(timeout)
        if self._logger is not None and self._logger is not threading.current_thread():
            self._logger.join(timeout)

    def _log(self) -> None:
        while not self._stopping.wait(self.tool.interval_s * self.samples_before_logging):
            if not self._flush():
                self._stopping.set()
                self.tool.stop()
                return
        self._flush()

    def _flush(self) -> bool:
        """Logs the mean of the buffered samples as one step; False once the run is over or failing."""
        run_id = self._run_id()
        if run_id is None:
            return True
        samples = self.tool.drain()
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

    def _problem(self, message: str) -> None:
        self._reporter.problem("neuron_monitor", message)  # no error object: never raised, even when strict


def start_if_enabled(flag: bool | None, run_id: Callable[[], str | None], tracking_uri: str,
                     reporter) -> SystemMetricsLogger | None:  # fmt: skip
    """A running logger when system metrics are on and neuron-monitor is installed, else None."""
    try:
        if not enabled(flag):
            return None
        tool = find_monitor_tool()
        if tool is None:
            _log.debug("system metrics are on but %s is not installed: no Neuron system metrics", MONITOR_TOOL)
            return None
        logger = SystemMetricsLogger(tool, run_id, tracking_uri, reporter)
        return logger if logger.start() else None
    except Exception as error:  # noqa: BLE001
        reporter.problem("neuron_monitor", f"Neuron system metrics are off: {type(error).__name__}: {error}")
        return None


def enabled(flag: bool | None) -> bool:
    """`flag` if given, else MLflow's `MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`."""
    if flag is not None:
        return bool(flag)
    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING

    return bool(MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get())
