"""mlflow-neuron: PyTorch profiler results on AWS Trainium (and CUDA, and CPU) as MLflow data.

Every public name loads on first use: MLflow imports this package's run-context plugin during
`import mlflow`, which must not pay for importing torch. The extraction layer (`extract_cycle`,
`CycleProfile`, device helpers) works without MLflow.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_HOME = {
    "MLflowProfilerCallback": "_callback",
    "DEFAULT_MAX_FILE_BYTES": "_callback",
    "compare_runs": "_mlflow_runs",
    "attach_comparison": "_mlflow_runs",
    "load_timelines": "_mlflow_runs",
    "annotate_model_version": "_registry",
    "RunProfile": "_compare",
    "compare": "_compare",
    "regressions": "_compare",
    "ProfilingSetup": "_devices",
    "compile_backend": "_devices",
    "pick_device": "_devices",
    "profiling_setup": "_devices",
    "synchronize": "_devices",
    "CycleProfile": "_extract",
    "OpStats": "_extract",
    "extract_cycle": "_extract",
    "readable_key": "_keys",
    "STRICT_ENV": "_report",
    "MLflowNeuronWarning": "_report",
}
_MODULES = {"render": "_render"}

__all__ = sorted([*_HOME, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return import_module(f".{_MODULES[name]}", __name__)
    if name in _HOME:
        return getattr(import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module 'mlflow_neuron' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
