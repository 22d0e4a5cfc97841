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
    "compare_runs": "_compare.comparison",
    "history_runs": "_compare.history",
    "rank_summary": "_compare.rank_runs",
    "attach_comparison": "_compare.publish",
    "load_timelines": "_compare.profiles",
    "annotate_model_version": "_compare.publish",
    "RunProfile": "_compare.model",
    "compare": "_compare.frame",
    "regressions": "_compare.gate",
    "ProfilingSetup": "_neuron.devices",
    "compile_backend": "_neuron.devices",
    "pick_device": "_neuron.devices",
    "profiling_setup": "_neuron.devices",
    "synchronize": "_neuron.devices",
    "CycleProfile": "_trace.profile",
    "OpStats": "_trace.profile",
    "extract_cycle": "_trace.function_events",
    "readable_key": "_record.keys",
    "STRICT_ENV": "_delivery.report",
    "MLflowNeuronWarning": "_delivery.report",
}
_MODULES = {"render": "_compare.render"}

__all__ = sorted([*_HOME, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return import_module(f".{_MODULES[name]}", __name__)
    if name in _HOME:
        return getattr(import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module 'mlflow_neuron' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
