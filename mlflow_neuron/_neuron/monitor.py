"""`neuron-monitor`, run and read: its JSON report stream as samples of Neuron device metrics.

`neuron-monitor` writes one JSON document per period on stdout (Neuron Monitor User Guide). A
`MonitorTool` runs it as a subprocess (never a fork of the training process) and one thread
reads each report into a sample, named without a prefix:

    neuroncore_<i>_utilization_percentage   per NeuronCore in use (percent, 0-100)
    device_memory_used_megabytes            Neuron device memory used by runtimes
    host_memory_used_megabytes              host memory used by Neuron runtimes

These cover the whole host: every Neuron runtime the tool sees (`tag_filter: ".*"`), memory
summed over runtimes. Samples wait in a bounded buffer until `drain()`; logging them is
`_delivery.system_metrics`'. No MLflow here.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import tempfile
import threading
import time

from .layout import find_neuron_tool

MONITOR_TOOL = "neuron-monitor"
MAX_SAMPLES = 1000  # reports kept while nobody drains them; older ones are dropped
_STOP_WAIT_S = 2.0


def find_monitor_tool() -> str | None:
    return find_neuron_tool(MONITOR_TOOL)


def sample_of(report: dict) -> dict[str, float]:
    """One neuron-monitor report as metric values (names without a prefix).

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
    """A neuron-monitor configuration for the two metric groups read, every runtime on the host."""
    return {
        "period": f"{interval_s:g}s",
        "neuron_runtimes": [
            {"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used"}]}
        ],
    }


class MonitorTool:
    """One running neuron-monitor: `start()`, then `drain()` the (epoch ms, sample) pairs it read.

    `on_exit(message)` is called once if the tool ends by itself (not through `stop()`)."""

    def __init__(self, tool: str, interval_s: float, on_exit=None) -> None:
        self.tool = tool
        self.interval_s = interval_s
        self._on_exit = on_exit
        self._samples: collections.deque[tuple[int, dict[str, float]]] = collections.deque(maxlen=MAX_SAMPLES)
        self._utilization = (0, 0.0)  # reports with NeuronCore utilisation, and the sum of their means
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._config_path: str | None = None
        self._stderr = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None and not self._stopping.is_set()

    def start(self) -> None:
        """Starts the tool; raises what starting it raised (the caller reports it)."""
        try:
            fd, self._config_path = tempfile.mkstemp(prefix="mlflow-neuron-monitor-", suffix=".json")
            with os.fdopen(fd, "w") as handle:
                json.dump(monitor_config(self.interval_s), handle)
            self._stderr = tempfile.TemporaryFile()
            self._process = subprocess.Popen(
                [self.tool, "-c", self._config_path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=self._stderr, text=True, bufsize=1,
            )  # fmt: skip
        except BaseException:
            self._cleanup()
            raise
        self._reader = threading.Thread(target=self._read, name="mlflow-neuron-monitor-reader", daemon=True)
        self._reader.start()

    def utilization_totals(self) -> tuple[int, float]:
        """Reports read so far that carry NeuronCore utilisation, and the sum of each one's mean over
        its cores: two calls give the mean utilisation of the reports read between them, whoever
        drains the samples."""
        with self._lock:
            return self._utilization

    def drain(self) -> list[tuple[int, dict[str, float]]]:
        with self._lock:
            samples, self._samples = list(self._samples), collections.deque(maxlen=MAX_SAMPLES)
        return samples

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the tool (terminate, then kill); returns within about `timeout` seconds."""
        self._stopping.set()
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_WAIT_S)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout)
        self._cleanup()

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
                    cores = [v for k, v in sample.items() if k.startswith("neuroncore_")]
                    with self._lock:
                        self._samples.append((int(time.time() * 1000), sample))
                        if cores:
                            reports, total = self._utilization
                            self._utilization = (reports + 1, total + sum(cores) / len(cores))
        except (OSError, ValueError):  # the pipe closed under us at stop()
            return
        if not self._stopping.is_set() and self._on_exit is not None:
            self._on_exit(f"{self.tool} exited with code {process.wait()}: {self._stderr_tail()}")

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


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
