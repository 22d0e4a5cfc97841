"""mlflow-neuron: PyTorch profiler results on AWS Trainium (and CUDA, and CPU) as MLflow data.

Every public name loads on first use: MLflow imports this package's run-context plugin during
`import mlflow`, which must not pay for importing torch. The extraction layer (`extract_cycle`,
`CycleProfile`, device helpers) works without MLflow.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_HOME = {
    "MLflowProfilerCallback": "_capture.callback",
    "DEFAULT_MAX_FILE_BYTES": "_capture.callback",
    "interleaved": "_capture.interleave",
    "InterleavedRuns": "_capture.interleave",
    "compare_runs": "_report.comparison",
    "history_runs": "_report.history",
    "rank_summary": "_report.ranks.summary",
    "attach_comparison": "_report.publish",
    "load_timelines": "_readback.profiles",
    "annotate_model_version": "_report.publish",
    "RunProfile": "_analysis.model",
    "compare": "_analysis.frame",
    "regressions": "_analysis.gate",
    "ProfilingSetup": "_device.devices",
    "compile_backend": "_device.devices",
    "pick_device": "_device.devices",
    "profiling_setup": "_device.devices",
    "synchronize": "_device.devices",
    "CycleProfile": "_trace.profile",
    "OpStats": "_trace.profile",
    "extract_cycle": "_trace.function_events",
    "readable_key": "_record.keys",
    "STRICT_ENV": "exceptions",
    "MLflowNeuronWarning": "exceptions",
}
_MODULES = {"render": "_report.render"}

__all__ = sorted([*_HOME, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return import_module(f".{_MODULES[name]}", __name__)
    if name in _HOME:
        return getattr(import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module 'mlflow_neuron' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
